"""The GPU domain's operator commands: ``gpus`` (telemetry, counters, state, jobs) and
``health`` (why each GPU and the host are in their state).

The daemon (composition) hands in the last pass's GPU step and host summary; this
module knows nothing of the agent's overall step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agent.gpu.health import GpuStep
from agent.gpu.views import gpu_row, health_row
from harmonaize.messages import HostSummary
from harmonaize.opsocket import Command
from harmonaize.schema import to_plain

if TYPE_CHECKING:
    from agent.observers.base import ObserverSet

#: The last pass as the GPU commands need it: the host summary and the GPU step.
LastPass = Callable[[], tuple[HostSummary | None, GpuStep | None]]


class Shell(Protocol):
    """What the commands read of the daemon."""

    observers: ObserverSet
    advisories_sent: int

    @property
    def gpu_class(self) -> str: ...


def commands(shell: Shell, last: LastPass) -> dict[str, Command]:
    return {
        "gpus": Command(lambda args: gpus_view(shell, last),
                        "GPU telemetry, counters, state and jobs"),
        "health": Command(lambda args: health_view(shell, last),
                          "why each GPU and the host are in their state"),
    }


def gpus_view(shell: Shell, last: LastPass) -> dict[str, Any]:
    record = shell.observers.records.get("gpu")
    _, gpus = last()
    return {
        "state": record.state.value if record else "disabled",
        "detail": (record.extra.get("detail") or record.detail) if record else "",
        "gpu_class": shell.gpu_class,
        "gpus": [gpu_row(view) for view in (gpus.gpus if gpus else ())],
    }


def health_view(shell: Shell, last: LastPass) -> dict[str, Any]:
    summary, gpus = last()
    return {
        "health": summary.health.value if summary else None,
        "schedulable": summary.schedulable if summary else None,
        "action": gpus.action.value if gpus else "none",
        "conditions": [to_plain(c) for c in summary.conditions] if summary else [],
        "gpu_counts": to_plain(summary.gpus) if summary else {},
        "gpus": [health_row(view) for view in (gpus.gpus if gpus else ())],
        "advisories_sent": shell.advisories_sent,
    }
