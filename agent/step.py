"""Sans-I/O host health: observations in, conditions, events and a summary out.

The host's own rules (:mod:`agent.host.rules`), the link engine's and the GPU
engine's turn each interval's observations into findings; the condition tracker
(:mod:`agent.conditions`) adds hysteresis and reports transitions as events.
Time is a parameter; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.conditions import ConditionTracker, Finding, health_of
from agent.config import ObserversSection
from agent.gpu.health import GpuHealthEngine, GpuState, GpuStep, GpuView
from agent.host.rules import host_findings
from agent.links.health import LinkHealthEngine, LinkLevels, LinkStep, views
from agent.observations import Observations
from harmonaize.messages import (
    Condition,
    Hold,
    HoldKind,
    HostEvent,
    HostSummary,
    JobAdvisory,
    Severity,
    Status,
)

#: While a host condition waits out its sustain, the step is evaluated again this
#: often (seconds) with unchanged inputs; otherwise only at the engines' deadlines.
FULL_STEP = 1.0

__all__ = ["ConditionTracker", "Finding", "HealthStep", "HostHealthEngine", "Republisher",
           "health_of"]


@dataclass(frozen=True)
class HealthStep:
    summary: HostSummary
    events: list[HostEvent]
    advisories: list[JobAdvisory]
    gpus: GpuStep
    #: The pass's link step: held levels for health, raw judgements for tuning.
    links: LinkStep


class HostHealthEngine:
    """Host rules (memory pressure, failing observers, drain), link and GPU rules."""

    def __init__(self, cfg: ObserversSection) -> None:
        self.cfg = cfg.host
        self.links = LinkHealthEngine(cfg.links)
        self.gpus = GpuHealthEngine(cfg.gpu)
        self.tracker = ConditionTracker()
        self.link_levels: tuple[LinkLevels, ...] = ()
        self._last: tuple[tuple[Any, ...], float, HealthStep] | None = None
        self._due = float("-inf")

    def configure(self, cfg: ObserversSection) -> None:
        """New rule settings (a reload): the engine keeps what it learnt (conditions,
        GPU states and quarantines, link levels) and judges by the new rules from
        the next step on."""
        self.cfg = cfg.host
        self.links.configure(cfg.links)
        self.gpus.configure(cfg.gpu)
        self._last = None  # the next step evaluates everything

    def step(
        self,
        observations: Observations,
        now: float,
        *,
        failing: Mapping[str, str] | None = None,
        drained: str | None = None,
        validation_failure: str | None = None,
        extra: Sequence[Finding] = (),
    ) -> HealthStep:
        """``extra``: findings of other engines (the tuning loop's), tracked alike."""
        # Equal inputs (the same observations: samples compare by value) before the
        # deadline give the same result: nothing is evaluated.
        inputs = (observations.host, observations.links, observations.rdma, observations.gpu,
                  tuple(sorted((failing or {}).items())), drained, validation_failure,
                  tuple(extra))
        # Inputs first: a pass with news (an XID) goes straight to the engines, each
        # called once, without asking them for their deadlines first.
        if self._last is not None and not self.gpus.changed \
                and all(a is b or a == b  # "is": only the fast path of ==
                        for a, b in zip(inputs, self._last[0], strict=True)) \
                and now < self.next_deadline():
            previous = self._last[2]
            # News (events, advice, a job's own XIDs) goes out once: only the state repeats.
            return HealthStep(previous.summary, [], [],
                              replace(previous.gpus, events=[], advisories=[],
                                      application_xids=[]), previous.links)
        step = self._step(observations, now, failing, drained, validation_failure,
                          extra=extra)
        self._last = (inputs, now, step)
        self._due = now + FULL_STEP if self.tracker.pending() else float("inf")
        return step

    def next_deadline(self) -> float:
        """When a step with unchanged inputs could change anything: a host condition
        waiting out its sustain, a link level's fall, a GPU's deadline."""
        return min(self._due, self.links.next_deadline(), self.gpus.next_deadline())

    def _step(
        self,
        observations: Observations,
        now: float,
        failing: Mapping[str, str] | None,
        drained: str | None,
        validation_failure: str | None,
        *,
        extra: Sequence[Finding] = (),
    ) -> HealthStep:
        findings = host_findings(self.cfg, observations.host, failing or {}, drained,
                                 validation_failure) + list(extra)
        link_step = self.links.step(views(observations.links, observations.rdma), now)
        self.link_levels = link_step.links
        gpu_step = self.gpus.step(observations.gpu, now)
        events = gpu_step.events + self.tracker.update(
            findings + link_step.findings + gpu_step.findings, now)
        conditions = self.tracker.conditions()
        summary = HostSummary(
            health=health_of(conditions),
            schedulable=drained is None,
            gpus=gpu_step.counts,
            conditions=conditions,
            links=link_step.health,
            holds=holds_of(drained, gpu_step.gpus, validation_failure, conditions),
        )
        return HealthStep(summary, events, gpu_step.advisories, gpu_step, link_step)


def holds_of(drained: str | None, gpus: Sequence[GpuView], validation_failure: str | None,
             conditions: Sequence[Condition]) -> tuple[Hold, ...]:
    """Why the host should get no new work, for the provider's scheduler: an operator's
    drain, each quarantined or lost GPU (with its recommended action), a failed host
    check, each critical condition that holds."""
    holds: list[Hold] = []
    if drained is not None:
        holds.append(Hold(HoldKind.DRAINED, -1, drained[:200]))
    for gpu in gpus:
        if gpu.state is GpuState.QUARANTINED:
            holds.append(Hold(HoldKind.GPU_QUARANTINED, gpu.index, gpu.action.value))
        elif gpu.state is GpuState.LOST:
            holds.append(Hold(HoldKind.GPU_LOST, gpu.index, gpu.action.value))
    if validation_failure is not None:
        holds.append(Hold(HoldKind.VALIDATION_FAILED, -1, validation_failure[:200]))
    holds.extend(Hold(HoldKind.CONDITION, -1, c.type) for c in conditions
                 if c.status is Status.TRUE and c.severity is Severity.CRITICAL)
    return tuple(holds[:64])


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
