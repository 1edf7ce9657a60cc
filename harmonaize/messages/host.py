"""A host's connection and its state: hello, heartbeat and goodbye, the summary of its
health and holds (for the provider's scheduler), its events, and the controller's
acknowledgements and resync requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from harmonaize.messages.core import (
    Category,
    Message,
    message,
)
from harmonaize.messages.energy import JobEnergy
from harmonaize.messages.values import (
    Conditions,
    Health,
    LinkHealth,
    Severity,
)
from harmonaize.schema import (
    Count,
    Ident,
    Len,
    Name,
    Num,
    Seconds,
    Str,
    Text,
)


@message("hello", Category.CONTROL)
@dataclass(frozen=True)
class Hello(Message):
    """First message on every connection; binds the connection to a host."""

    pool: Ident
    gpu_class: Ident
    gpus: Count
    version: Name
    #: Changes each time the agent starts; sequence numbers restart with it.
    epoch: Count
    #: Highest sequence number the agent has seen acknowledged in this epoch.
    acked: Count
    heartbeat: Annotated[float, Num(0.01, 3600.0)]


@message("heartbeat", Category.CONTROL)
@dataclass(frozen=True)
class Heartbeat(Message):
    uptime: Seconds
    #: Highest sequence number the agent has sent, so the controller sees loss.
    last_seq: Count


@dataclass(frozen=True)
class GpuCounts:
    """How many of a host's GPUs are in each health state, and how many are busy."""

    healthy: Count = 0
    suspect: Count = 0
    validating: Count = 0
    quarantined: Count = 0
    lost: Count = 0
    #: GPUs running a tenant's processes (any state).
    in_use: Count = 0

    @property
    def total(self) -> int:
        return self.healthy + self.suspect + self.validating + self.quarantined + self.lost

    @property
    def available(self) -> int:
        """GPUs that could take new work: in service (healthy or suspect) and idle."""
        return max(0, self.healthy + self.suspect - self.in_use)


class HoldKind(StrEnum):
    """Why a host should get no new work, for the provider's scheduler."""

    #: An operator drained the host (``harmonctl drain``).
    DRAINED = "drained"
    #: A GPU is quarantined (validation failed, an uncorrectable error, no answer).
    GPU_QUARANTINED = "gpu-quarantined"
    #: A GPU the driver no longer shows.
    GPU_LOST = "gpu-lost"
    #: A host-level validation check failed.
    VALIDATION_FAILED = "validation-failed"
    #: A condition of critical severity holds.
    CONDITION = "condition"
    #: Remediation asks the scheduler to reboot the host (resets did not help).
    REBOOT = "reboot"
    #: A GPU waits for return to the vendor; only an operator clears it.
    RMA = "rma"


@dataclass(frozen=True)
class Hold:
    """One reason a host should get no new work. For the provider's scheduler only:
    the controller turns it into a drain reason there and never shows it to a tenant."""

    kind: HoldKind
    #: The GPU's index on the host; -1: the whole host.
    gpu: Annotated[int, Num(-1, 4096)] = -1
    #: In the agent's words: the recommended action, an operator's reason, a condition.
    detail: Annotated[str, Str(max_len=200)] = ""


@message("host-summary", Category.CONDITION)
@dataclass(frozen=True)
class HostSummary(Message):
    """A host's aggregated state; raw telemetry stays on the host."""

    health: Health
    schedulable: bool
    gpus: GpuCounts = GpuCounts()
    conditions: Conditions = ()
    links: Annotated[tuple[LinkHealth, ...], Len(16)] = ()
    #: Jobs here that declared a slowdown for energy (agent/energy/engine.py).
    energy: Annotated[tuple[JobEnergy, ...], Len(64)] = ()
    #: Why the host should get no new work (empty: it may), for the scheduler.
    holds: Annotated[tuple[Hold, ...], Len(64)] = ()
    #: A validation waits for the host's jobs to end (the controller may ask the
    #: scheduler for a maintenance reservation, so no new job lands meanwhile).
    idle_wanted: bool = False


@message("host-event", Category.EVENT)
@dataclass(frozen=True)
class HostEvent(Message):
    reason: Ident
    severity: Severity
    message: Text = ""


@message("goodbye", Category.CONTROL)
@dataclass(frozen=True)
class Goodbye(Message):
    reason: Text = ""


@message("ack", Category.CONTROL)
@dataclass(frozen=True)
class Ack(Message):
    """Everything up to and including ``seq`` is stored durably."""

    seq: Count


@message("resync", Category.CONTROL)
@dataclass(frozen=True)
class Resync(Message):
    """The controller does not know this connection: say hello and resend."""

    reason: Text = ""
