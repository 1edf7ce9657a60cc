"""A tenant's declaration of what the provider may do to one of its jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from harmonaize.messages.core import (
    Category,
    Message,
    message,
)
from harmonaize.messages.energy import EnergyAllowance
from harmonaize.messages.tuning import TuningRange
from harmonaize.schema import (
    Count,
    Ident,
    Len,
    Name,
    Num,
    Timestamp,
)

Port = Annotated[int, Num(1, 65535)]
Dscp = Annotated[int, Num(0, 63)]


@dataclass(frozen=True)
class BulkTraffic:
    """A job's bulk traffic (checkpoints, data loading) and the bandwidth it always keeps."""

    #: Megabits per second per host the bulk class keeps on a congested link.
    floor_mbps: Annotated[float, Num(0.0, 10_000_000.0)] = 0.0
    #: Remote TCP ports of bulk transfers (object store, NFS, ...).
    ports: Annotated[tuple[Port, ...], Len(32)] = ()
    #: DSCP values the job marks its bulk traffic with.
    dscp: Annotated[tuple[Dscp, ...], Len(64)] = ()


@message("job-declaration", Category.CONTROL)
@dataclass(frozen=True)
class JobDeclaration(Message):
    """What a tenant allows the provider to do to one job, declared ahead of time.

    Tenants send it to the controller, which checks that the job is theirs and
    forwards it to the agents hosting the job; an operator may set one on a
    single host with ``harmonctl declare``.
    """

    #: Your job, as your scheduler named it when it placed it.
    job: Ident
    #: Seconds a member of the job may pause for hardware validation; 0: never.
    max_validation_pause: Annotated[float, Num(0.0, 86400.0)] = 0.0
    #: Ranges the provider may retune NCCL within; none: NCCL's own choices.
    tuning: Annotated[tuple[TuningRange, ...], Len(32)] = ()
    #: Your bulk traffic and the bandwidth it keeps on a congested link; none: no classes.
    bulk: BulkTraffic | None = None
    #: Increases with each new declaration of the job (the newest wins).
    revision: Count = 0
    #: The job ended or the tenant withdrew it: undo everything done for it.
    withdrawn: bool = False
    #: The Unix group of the job's processes on the receiving host, from the
    #: provider's placement (never from the tenant): only its members may read
    #: and follow the job's tuner policy there. Empty: root's processes only.
    group: Name = ""
    #: Seconds by which the tenant may defer each validation notice, once; 0: never.
    max_validation_defer: Annotated[float, Num(0.0, 86400.0)] = 0.0
    #: The slowdown the job accepts for energy (GPU power limits); none: never.
    energy: EnergyAllowance | None = None
    #: How often the job checkpoints (seconds; 0: not said) and when it did once (Unix
    #: time): a negotiated maintenance window is proposed at its next checkpoint, and its
    #: hosts announce validations early enough to negotiate (the condition's least notice).
    checkpoint_every: Annotated[float, Num(0.0, 604_800.0)] = 0.0
    last_checkpoint: Timestamp = 0.0
