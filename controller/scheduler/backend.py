"""What the scheduler loop needs of a scheduler: a Protocol, so that a Kubernetes
backend (node conditions, cordon and taints, DRA device taints) can sit beside the
Slurm one. Every call raises :class:`SchedulerError` with one line on failure."""

from __future__ import annotations

from typing import Protocol

from controller.scheduler.types import Node


class SchedulerError(Exception):
    """The scheduler could not be read or refused an action: one line, no traceback."""


class SchedulerBackend(Protocol):
    async def nodes(self) -> tuple[Node, ...]: ...

    async def reservations(self) -> frozenset[str]: ...

    async def drain(self, node: str, reason: str) -> None: ...

    async def resume(self, node: str) -> None: ...

    async def reboot(self, node: str, reason: str) -> None: ...

    async def reserve(self, node: str, name: str, minutes: int) -> None: ...

    async def unreserve(self, name: str) -> None: ...
