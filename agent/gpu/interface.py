"""What the GPU domain offers the other domains: its types, its states and events, and
the hooks by which validation and operators send a GPU events.

Job health resolves a stats file's process to its job and rank as the GPU domain does
its GPUs' processes (:class:`JobResolver`: the kernel backs the job's identity).

Other domains import from here and nowhere else in ``agent.gpu`` (the architecture
test checks it); the composition layer (``agent/step.py``, ``agent/daemon.py``) wires
the engine itself.
"""

from __future__ import annotations

from typing import Protocol

from agent.conditions import Action
from agent.gpu.jobs import JobResolver
from agent.gpu.record import GpuView
from agent.gpu.rules import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL
from agent.gpu.states import GpuEvent, GpuState
from agent.gpu.types import GpuSample, GpuSnapshot, JobRef
from harmonaize.messages import HostEvent

__all__ = ["HW_POWER_BRAKE", "HW_SLOWDOWN", "HW_THERMAL", "GpuEvent", "GpuSample",
           "GpuSnapshot", "GpuState", "GpuStates", "GpuView", "JobRef", "JobResolver"]


class GpuStates(Protocol):
    """The GPU health engine's hooks: each sends one event through the GPU's table
    (:mod:`agent.gpu.states`); the host event says what moved, if anything did."""

    def begin_validation(self, index: int, now: float) -> HostEvent | None: ...

    def abort_validation(self, index: int, why: str, now: float) -> HostEvent | None: ...

    def end_validation(self, index: int, passed: bool, why: str, now: float,
                       action: Action = Action.NONE) -> HostEvent | None: ...

    def quarantine(self, index: int, why: str, now: float, action: Action = Action.DRAIN,
                   event: GpuEvent = GpuEvent.OPERATOR_DRAIN) -> HostEvent | None: ...

    def release(self, index: int, why: str, now: float) -> HostEvent | None: ...

    def reset_seen(self, index: int) -> float:
        """When the GPU was last seen reset (-inf: never since the agent started)."""
        ...
