"""The controller's plain data types: what the provider knows and what tenants may get.

No behaviour and no I/O here, so every part of the controller (the sans-I/O core,
the redaction shared with the simulator, the SQLite store) and the simulator can
use them without depending on one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harmonaize.messages import GpuCounts, Health, JobEnergy, LinkHealth, Message


@dataclass(frozen=True)
class HostState:
    """The provider's view of one host (the controller's, or the simulator's)."""

    host_id: str
    pool: str
    gpu_class: str
    alive: bool
    schedulable: bool = True
    health: Health = Health.HEALTHY
    gpus: GpuCounts = field(default_factory=GpuCounts)
    links: tuple[LinkHealth, ...] = ()
    #: Per job, the energy its GPUs here used and saved (the host's summary).
    energy: tuple[JobEnergy, ...] = ()

    @property
    def available(self) -> bool:
        return self.alive and self.schedulable and self.health is not Health.UNHEALTHY


@dataclass(frozen=True)
class Member:
    """One member of a job (a rank or an instance) and where the provider put it."""

    name: str
    host_id: str


@dataclass(frozen=True)
class Placement:
    job: str
    tenant: str
    members: tuple[Member, ...]
    #: The Unix group of the job's processes on its hosts (for its tuner files there).
    group: str = ""
    #: Which placement of the job this is (the controller counts them: 1, 2, ...). What
    #: was issued for one placement (a validation notice) is void for the next.
    generation: int = 0

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(m.host_id for m in self.members)


@dataclass(frozen=True)
class Publication:
    topic: str
    body: Message
    #: The only tenant that may receive it; None for pool-level messages.
    tenant: str | None
    #: The earliest time it may be published.
    at: float
