"""Conditions with hysteresis, in node-problem-detector's shape (sans-I/O).

Rules report *findings* each interval (does a problem hold now, how bad);
:class:`ConditionTracker` turns them into level conditions: a problem must
hold for its ``sustain`` time before the condition is set and be gone as long
before it clears. Every transition is also a transient event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from harmonaize.messages import Condition, Health, HostEvent, Severity, Status

# --- what an operator should do about a problem, from least to most disruptive ------
# (shared: the GPU rules recommend these, validation's checks and remediation act on them)


class Action(StrEnum):
    NONE = "none"
    RESTART_APP = "restart-application"
    RESET_GPU = "reset-gpu"
    DRAIN = "drain"
    REBOOT_NODE = "reboot-node"
    RMA = "rma"

    @property
    def rank(self) -> int:
        return _ORDER.index(self)


_ORDER = list(Action)


def worst(actions: list[Action] | tuple[Action, ...]) -> Action:
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


#: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (driver r570+).
RECOVERY_ACTIONS = {
    0: Action.NONE,
    1: Action.RESET_GPU,     # GPU reset
    2: Action.REBOOT_NODE,   # node reboot
    3: Action.DRAIN,         # drain peer-to-peer traffic, then re-query
    4: Action.RESET_GPU,     # drain and reset (running at reduced capacity)
    5: Action.RESET_GPU,     # recover the IMEX domain
    6: Action.REBOOT_NODE,   # bus reset
    7: Action.REBOOT_NODE,   # system reboot
}


@dataclass(frozen=True)
class Finding:
    """One rule's verdict for this interval."""

    type: str
    holds: bool
    severity: Severity = Severity.WARNING
    reason: str = ""
    message: str = ""
    #: Seconds the verdict must persist before the condition changes.
    sustain: float = 0.0


@dataclass
class _Tracked:
    condition: Condition
    pending_since: float | None = None  # when the verdict first disagreed with the state


@dataclass
class ConditionTracker:
    """Level conditions with set/clear hysteresis; emits an event per transition."""

    _tracked: dict[str, _Tracked] = field(default_factory=dict)

    def update(self, findings: Iterable[Finding], now: float) -> list[HostEvent]:
        events: list[HostEvent] = []
        for finding in findings:
            tracked = self._tracked.get(finding.type)
            if tracked is None:
                tracked = self._tracked[finding.type] = _Tracked(
                    Condition(finding.type, Status.FALSE, since=now)
                )
            current = tracked.condition
            holds_now = current.status is Status.TRUE
            if finding.holds == holds_now:
                tracked.pending_since = None
                if holds_now and (finding.reason, finding.message, finding.severity) != (
                    current.reason,
                    current.message,
                    current.severity,
                ):
                    # Same state, new explanation: keep `since`, refresh the words.
                    tracked.condition = Condition(
                        finding.type, Status.TRUE, finding.reason, finding.message,
                        finding.severity, current.since,
                    )
                continue
            if tracked.pending_since is None:
                tracked.pending_since = now
            if now - tracked.pending_since < finding.sustain:
                continue
            tracked.pending_since = None
            if finding.holds:
                tracked.condition = Condition(
                    finding.type, Status.TRUE, finding.reason, finding.message,
                    finding.severity, now,
                )
                events.append(HostEvent(f"{finding.type}Started", finding.severity,
                                        finding.message))
            else:
                tracked.condition = Condition(finding.type, Status.FALSE, since=now)
                events.append(HostEvent(f"{finding.type}Ended", Severity.INFO, ""))
        return events

    def conditions(self) -> tuple[Condition, ...]:
        return tuple(t.condition for _, t in sorted(self._tracked.items()))

    def pending(self) -> bool:
        """Whether a verdict disagrees with its condition and waits out its sustain."""
        return any(t.pending_since is not None for t in self._tracked.values())

    def holding(self) -> list[Condition]:
        return [c for c in self.conditions() if c.status is Status.TRUE]


def health_of(conditions: Iterable[Condition]) -> Health:
    severities = {c.severity for c in conditions if c.status is Status.TRUE}
    if Severity.CRITICAL in severities:
        return Health.UNHEALTHY
    if Severity.WARNING in severities:
        return Health.DEGRADED
    return Health.HEALTHY
