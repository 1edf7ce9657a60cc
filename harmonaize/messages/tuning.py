"""NCCL tuning across hosts: the ranges a tenant allows, what each host reports of its
communicators, and the controller's two-phase change (arm, then confirm or cancel).
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
from harmonaize.schema import (
    Count,
    Ident,
    Len,
    Name,
    Num,
    Text,
)


@dataclass(frozen=True)
class SwitchState:
    """Where a group of ranks' answers changed: the plugin's record of it.

    ``switches`` counts the changes, ``history`` is a hash chain over every
    (collective index, ruleset) change, ``prev_history`` the chain before the
    last one, ``last_switch`` the index of the last one, and ``collectives``
    the most collectives any rank of the group completed.
    """

    switches: Count = 0
    history: Count = 0
    prev_history: Count = 0
    last_switch: Count = 0
    collectives: Count = 0


@dataclass(frozen=True)
class CommReport:
    """One NCCL communicator as this host's ranks of it stand (no rank is named).

    ``comm`` is NCCL's communicator id (its low 62 bits), ``n_ranks`` and
    ``n_nodes`` NCCL's size of the whole communicator, ``ranks`` how many of
    its ranks run here. ``choice``, ``at`` and ``pending`` say what this
    host's policy holds for it; ``ahead`` and ``behind`` are the switch
    records of the local ranks furthest along and least far along.
    """

    comm: Count
    n_ranks: Count
    n_nodes: Count
    ranks: Count
    collectives_min: Count = 0
    collectives_max: Count = 0
    per_second: Annotated[float, Num(0.0, 1e9)] = 0.0
    choice: Name = ""
    at: Count = 0
    pending: bool = False
    ahead: SwitchState = SwitchState()
    behind: SwitchState = SwitchState()
    #: Local ranks waiting at an armed switch, and ranks that refused the newest copy.
    waiting: Count = 0
    refused: Count = 0
    #: The agent found its own ranks of this communicator in disagreement.
    diverged: bool = False


@message("tuning-report", Category.EVENT)
@dataclass(frozen=True)
class TuningReport(Message):
    """What one host of a multi-host job would choose, and where its ranks stand.

    Sent while the job runs here (at least every report interval, and at once
    when something changes): the controller sets switching points from the
    progress and compares every host's switch records.
    """

    job: Ident
    #: Digest of the rules the host derived from the declaration in force.
    fingerprint: Name
    want: Ident
    #: How strongly this host wants it (0: calm ... 2: heavily congested).
    severity: Annotated[int, Num(0, 2)]
    comms: Annotated[tuple[CommReport, ...], Len(32)] = ()


class AckPhase(StrEnum):
    ARMED = "armed"        # every local rank will wait for, or take, the armed change
    REFUSED = "refused"    # the change cannot be armed here (the reason says why)
    RESOLVED = "resolved"  # the confirmation or cancellation is in the policy


@message("tuning-ack", Category.EVENT)
@dataclass(frozen=True)
class TuningAck(Message):
    """A host's answer to a tuning-arm or tuning-resolve, with its ranks' state."""

    job: Ident
    decision: Count
    phase: AckPhase
    reason: Text = ""
    comms: Annotated[tuple[CommReport, ...], Len(32)] = ()


class Collective(StrEnum):
    """NCCL's collectives, as a tenant names them in a declaration."""

    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"


class Algorithm(StrEnum):
    TREE = "tree"
    RING = "ring"
    COLLNET_DIRECT = "collnet-direct"
    COLLNET_CHAIN = "collnet-chain"
    NVLS = "nvls"
    NVLS_TREE = "nvls-tree"
    PAT = "pat"


class Protocol(StrEnum):
    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"


Channels = Annotated[int, Num(1, 64)]
Bytes = Annotated[int, Num(0, 2**62)]


@dataclass(frozen=True)
class TuningRange:
    """For some collectives and a message-size band, what the provider may choose from.

    The provider only ever picks among entries NCCL itself enabled, and only
    lowers the channel count NCCL chose; this narrows that further.
    """

    #: The collectives this range is for.
    collectives: Annotated[tuple[Collective, ...], Len(5, min_len=1)]
    #: Algorithms the provider may choose (among those NCCL enabled).
    algorithms: Annotated[tuple[Algorithm, ...], Len(7, min_len=1)]
    #: Protocols the provider may choose (among those NCCL enabled).
    protocols: Annotated[tuple[Protocol, ...], Len(3, min_len=1)]
    #: Message sizes ``min_bytes <= n < max_bytes``.
    min_bytes: Bytes = 0
    max_bytes: Bytes = 2**62
    #: The channel range (the provider only ever lowers NCCL's own count).
    min_channels: Channels = 1
    max_channels: Channels = 64

    def __post_init__(self) -> None:
        if self.max_bytes <= self.min_bytes:
            raise ValueError("max_bytes must be above min_bytes")
        if self.max_channels < self.min_channels:
            raise ValueError("max_channels must be at least min_channels")
        for name in ("collectives", "algorithms", "protocols"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice")


@dataclass(frozen=True)
class Activation:
    #: NCCL's communicator id, low 62 bits (the same on every rank).
    comm: Count
    #: The collective index from which the change applies on that communicator.
    at: Count


@message("tuning-arm", Category.CONTROL)
@dataclass(frozen=True)
class TuningArm(Message):
    """Phase one of a multi-host change: every host arms it, none applies it yet.

    ``choice`` names one of the rulesets every host derives alike from the
    job's declaration (``fingerprint`` says which rules); each host writes the
    change as *pending* from ``at`` per communicator and answers with a
    :class:`TuningAck`. Its ranks that reach ``at`` before the outcome wait.
    """

    job: Ident
    decision: Count
    choice: Ident
    fingerprint: Name
    activations: Annotated[tuple[Activation, ...], Len(32, min_len=1)]


@message("tuning-resolve", Category.CONTROL)
@dataclass(frozen=True)
class TuningResolve(Message):
    """Phase two: the armed change is confirmed (``commit``) or cancelled, alike
    on every host. Resent until each host acknowledged it."""

    job: Ident
    decision: Count
    commit: bool
    activations: Annotated[tuple[Activation, ...], Len(32)] = ()
