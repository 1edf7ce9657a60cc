"""Sans-I/O host health: observations in, conditions, events and a summary out.

Rules turn each interval's observations into findings; the condition tracker
(:mod:`agent.conditions`) adds hysteresis and reports transitions as events.
Time is a parameter; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.conditions import ConditionTracker, Finding, health_of
from agent.config import ObserversSection
from agent.linkhealth import LinkHealthEngine, LinkLevels, views
from agent.observers.host import HostSample
from agent.observers.links import LinkSample
from agent.observers.rdma import RdmaSample
from harmonaize.messages import HostEvent, HostSummary, Severity

__all__ = ["ConditionTracker", "Finding", "HealthStep", "HostHealthEngine", "Republisher",
           "health_of"]


@dataclass(frozen=True)
class HealthStep:
    summary: HostSummary
    events: list[HostEvent]


class HostHealthEngine:
    """Host rules (memory pressure, failing observers, drain) and link rules."""

    def __init__(self, cfg: ObserversSection) -> None:
        self.cfg = cfg.host
        self.links = LinkHealthEngine(cfg.links)
        self.tracker = ConditionTracker()
        self.link_levels: tuple[LinkLevels, ...] = ()

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
        findings = self.findings(observations, failing or {}, drained)
        links = observations.get("links")
        rdma = observations.get("rdma")
        link_step = self.links.step(
            views(links if isinstance(links, LinkSample) else None,
                  rdma if isinstance(rdma, RdmaSample) else None),
            now,
        )
        self.link_levels = link_step.links
        events = self.tracker.update(findings + link_step.findings, now)
        conditions = self.tracker.conditions()
        summary = HostSummary(
            health=health_of(conditions),
            schedulable=drained is None,
            gpus_total=gpus_total,
            gpus_healthy=gpus_healthy,
            conditions=conditions,
            links=link_step.health,
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
