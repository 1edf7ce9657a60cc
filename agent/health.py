"""Sans-I/O host health: observations in, conditions and events out.

Rules turn each interval's observations into *findings* (does a problem hold
now, how bad). :class:`ConditionTracker` turns findings into conditions with
hysteresis: a problem must hold for its ``sustain`` time before the condition
is set and be gone as long before it clears, so one blip does not flap it.
Every transition is also reported as a transient event. Time is a parameter;
nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config import HostObserverSection
from agent.observers.host import HostSample
from harmonaize.messages import Condition, Health, HostEvent, HostSummary, Severity, Status


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

    def holding(self) -> list[Condition]:
        return [c for c in self.conditions() if c.status is Status.TRUE]


def health_of(conditions: Iterable[Condition]) -> Health:
    severities = {c.severity for c in conditions if c.status is Status.TRUE}
    if Severity.CRITICAL in severities:
        return Health.UNHEALTHY
    if Severity.WARNING in severities:
        return Health.DEGRADED
    return Health.HEALTHY


@dataclass(frozen=True)
class HealthStep:
    summary: HostSummary
    events: list[HostEvent]


class HostHealthEngine:
    """Host-level rules: memory pressure, failing observers, operator drain."""

    def __init__(self, cfg: HostObserverSection) -> None:
        self.cfg = cfg
        self.tracker = ConditionTracker()

    def findings(
        self,
        observations: Mapping[str, Any],
        failing: Mapping[str, str],
        drained: str | None,
    ) -> list[Finding]:
        found = [
            Finding(
                "ObserverFailure",
                bool(failing),
                Severity.WARNING,
                "ObserverFailing" if failing else "",
                "; ".join(f"{name}: {err}" for name, err in sorted(failing.items()))[:1000],
                sustain=0.0,
            ),
            Finding(
                "Drained",
                drained is not None,
                Severity.INFO,
                "OperatorDrain" if drained is not None else "",
                drained or "",
            ),
        ]
        host = observations.get("host")
        if isinstance(host, HostSample):
            fraction = host.memory_available_fraction
            found.append(
                Finding(
                    "MemoryPressure",
                    fraction < self.cfg.memory_available_min,
                    Severity.WARNING,
                    "LowAvailableMemory",
                    f"{fraction:.1%} of memory available",
                    sustain=self.cfg.sustain,
                )
            )
        return found

    def step(
        self,
        observations: Mapping[str, Any],
        now: float,
        *,
        failing: Mapping[str, str] | None = None,
        drained: str | None = None,
        gpus_total: int = 0,
        gpus_healthy: int = 0,
    ) -> HealthStep:
        events = self.tracker.update(self.findings(observations, failing or {}, drained), now)
        conditions = self.tracker.conditions()
        summary = HostSummary(
            health=health_of(conditions),
            schedulable=drained is None,
            gpus_total=gpus_total,
            gpus_healthy=gpus_healthy,
            conditions=conditions,
        )
        return HealthStep(summary, events)


class Republisher:
    """Decides when a condition message goes out: on change, or when it is due again."""

    def __init__(self, refresh: float) -> None:
        self.refresh = refresh
        self._last: Any = None
        self._last_at = float("-inf")

    def due(self, message: Any, now: float) -> bool:
        if message != self._last or now - self._last_at >= self.refresh:
            self._last, self._last_at = message, now
            return True
        return False

    def force(self) -> None:
        """Send the next message regardless (after a controller resync)."""
        self._last = None
