"""The GPU domain's operator commands: ``gpus`` (telemetry, counters, state, jobs),
``health`` (why each GPU and the host are in their state) and ``energy`` (power limits
the energy loop set, what they saved, and why)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from agent.gpu.health import GpuView
from agent.gpu.views import gpu_row, health_row
from harmonaize.opsocket import Command
from harmonaize.schema import to_plain

if TYPE_CHECKING:
    from agent.energy.service import EnergyService
    from agent.observers.base import ObserverSet
    from agent.step import HealthStep


class Shell(Protocol):
    """What the commands read of the daemon."""

    observers: ObserverSet
    last_step: HealthStep | None
    advisories_sent: int
    energy: EnergyService | None

    @property
    def gpu_class(self) -> str: ...


def gpu_views(step: HealthStep | None) -> tuple[GpuView, ...]:
    return step.gpus.gpus if step else ()


def commands(shell: Shell) -> dict[str, Command]:
    return {
        "gpus": Command(lambda args: gpus_view(shell), "GPU telemetry, counters, state and jobs"),
        "health": Command(lambda args: health_view(shell),
                          "why each GPU and the host are in their state"),
        "energy": Command(lambda args: energy_view(shell),
                          "power limits per GPU: set, original, draw, energy saved, why"),
    }


def energy_view(shell: Shell) -> dict[str, Any]:
    if shell.energy is None:
        return {"enabled": False, "gpus": [], "jobs": [], "changes": {}, "left_lowered": []}
    return shell.energy.view()


def gpus_view(shell: Shell) -> dict[str, Any]:
    record = shell.observers.records.get("gpu")
    return {
        "state": record.state.value if record else "disabled",
        "detail": (record.extra.get("detail") or record.detail) if record else "",
        "gpu_class": shell.gpu_class,
        "gpus": [gpu_row(view) for view in gpu_views(shell.last_step)],
    }


def health_view(shell: Shell) -> dict[str, Any]:
    step = shell.last_step
    summary = step.summary if step else None
    return {
        "health": summary.health.value if summary else None,
        "schedulable": summary.schedulable if summary else None,
        "action": step.gpus.action.value if step else "none",
        "conditions": [to_plain(c) for c in summary.conditions] if summary else [],
        "gpu_counts": to_plain(summary.gpus) if summary else {},
        "gpus": [health_row(view) for view in gpu_views(step)],
        "advisories_sent": shell.advisories_sent,
    }
