"""A job's health as its collectives and its GPUs' faults show it: where each rank of a
communicator stands (agent to controller), which ranks hold a job up (controller to the
job's owner), and faults a job's own process caused on its GPU.

What an agent sends names ranks as the job's launcher named them (``RANK``) and process
states; what a tenant receives is rebuilt by the controller from its own state: the
job's members by their placement names, coarse cause classes, never a host, a GPU, a
process id or a raw counter of the provider's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from harmonaize.messages.core import Category, Message, message
from harmonaize.schema import Count, Ident, Len, Num, Timestamp


class Finding(StrEnum):
    """What a communicator's progress shows."""

    MOVING = "moving"        # its ranks issue collectives
    HANG = "hang"            # some ranks passed collective N and wait; others never issued N
    STALL = "stall"          # every rank stopped at the same collective for long
    STRAGGLER = "straggler"  # one rank is the last to issue collectives, by a margin, for long


class Cause(StrEnum):
    """Why ranks stopped, as coarse as a tenant may learn it."""

    PROCESS_EXITED = "process-exited"            # the rank's process is gone
    PROCESS_NOT_RUNNING = "process-not-running"  # stopped, a zombie, or stuck in the kernel
    GPU_FAULT = "gpu-fault"                      # the rank's GPU has a fault condition or XID
    NETWORK = "network"                          # the rank's host's data links have errors
    PAUSED = "paused"                            # (stalls) the job does something else
    UNKNOWN = "unknown"                          # its process runs; nothing found at fault


class ProcessState(StrEnum):
    """A rank's process as the kernel shows it (``/proc/PID/stat``'s state letter)."""

    RUNNING = "running"                  # R
    SLEEPING = "sleeping"                # S, I
    UNINTERRUPTIBLE = "uninterruptible"  # D
    STOPPED = "stopped"                  # T, t
    ZOMBIE = "zombie"                    # Z, X
    EXITED = "exited"                    # no such process (its stats file's lock is free)
    UNKNOWN = "unknown"                  # unreadable


@dataclass(frozen=True)
class RankProgress:
    """One rank of a communicator on the reporting host."""

    #: The rank as the job's launcher named it (``RANK``); the controller keeps only
    #: names of the job's members placed on the reporting host.
    rank: Ident
    #: Collectives it issued (the index of its next one).
    collectives: Count
    process: ProcessState
    #: What the host found at fault for this rank, were it holding the others up.
    cause: Cause


@dataclass(frozen=True)
class CommProgress:
    """One communicator as this host's ranks of it stand."""

    #: NCCL's communicator id (its low 62 bits).
    comm: Count
    #: NCCL's size of the whole communicator, and how many of its ranks run here.
    n_ranks: Count
    ranks_here: Count
    collectives_min: Count
    collectives_max: Count
    #: Seconds since any rank of it here issued a collective (0: they are moving).
    still_for: Annotated[float, Num(0.0, 1e9)]
    #: What this host alone concludes (the controller judges across hosts).
    finding: Finding
    cause: Cause
    #: Every rank here (up to the cap: the ones furthest behind first).
    ranks: Annotated[tuple[RankProgress, ...], Len(256)] = ()
    #: For a stall: the share of this host's job GPUs busy (0-100), None: unknown.
    gpu_busy: Annotated[float, Num(0.0, 100.0)] | None = None


@message("rank-progress", Category.EVENT)
@dataclass(frozen=True)
class JobRankProgress(Message):
    """Agent to controller: where a job's ranks on this host stand, per communicator.

    Sent when a communicator's finding, its still ranks' counts or causes change, and
    every report interval while the job has ranks here (so a silent host is known to be
    silent, not still)."""

    job: Ident
    comms: Annotated[tuple[CommProgress, ...], Len(64)] = ()
    #: The report interval the agent keeps (seconds): past twice this without a report,
    #: the controller stops counting on this host's word.
    interval: Annotated[float, Num(0.1, 3600.0)] = 10.0


class ProgressState(StrEnum):
    ACTIVE = "active"
    WITHDRAWN = "withdrawn"  # the ranks moved again, or the job ended


@message("job-progress", Category.EVENT)
@dataclass(frozen=True)
class JobProgress(Message):
    """Controller to a job's owner: ranks holding the job up, in the job's own terms.

    ``finding`` is a hang (``ranks`` did not issue collective ``at_collective`` that the
    job's other ranks issued and wait in), a stall with a fault found (every rank stopped
    at ``at_collective``), or a straggler. ``withdrawn`` follows when the ranks move."""

    job: Ident
    #: The communicator (NCCL's id of it, which the job itself made).
    comm: Count
    finding: Finding
    state: ProgressState
    #: The job's members holding it up (placement names), or for a stall all of them
    #: on the faulty hardware.
    ranks: Annotated[tuple[Ident, ...], Len(1024)] = ()
    cause: Cause = Cause.UNKNOWN
    #: The collective index the named ranks did not issue (hang), or where every rank
    #: stopped (stall).
    at_collective: Count = 0
    #: When the controller first saw it (its clock).
    since: Timestamp = 0.0


class Fault(StrEnum):
    """Faults a job's own process causes on its GPU (after NVIDIA's XID catalog)."""

    GRAPHICS_EXCEPTION = "graphics-exception"          # XID 13
    MEMORY_MANAGEMENT = "memory-management"            # XID 31: an illegal address
    STOPPED_PROCESSING = "stopped-processing"          # XID 43: the context was stopped
    CLEANUP_AFTER_ERROR = "cleanup-after-error"        # XID 45: teardown of a context
    CONTAINED_MEMORY_ERROR = "contained-memory-error"  # XID 94: the app must restart


@message("application-xid", Category.EVENT)
@dataclass(frozen=True)
class ApplicationXid(Message):
    """Agent to controller, and rebuilt by the controller for the job's owner: a fault
    judged the job's own (its process, on its GPU), which quarantines nothing.

    ``ranks`` are the job's ranks whose process held the GPU (the launcher's names from
    the agent; the controller keeps only the job's members placed on that host)."""

    job: Ident
    xid: Annotated[int, Num(0, 2**31)]
    fault: Fault
    ranks: Annotated[tuple[Ident, ...], Len(1024)] = ()
    #: The job's process was exiting or had just been killed: a teardown's fault.
    teardown: bool = False
    #: When the agent saw it (its clock; the controller restamps it for a tenant).
    at: Timestamp = 0.0
