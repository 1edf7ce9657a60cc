"""Job health's plain data: one pass's reading of each job's local ranks (what the
service hands the engine) and what the engine keeps of each communicator. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from harmonaize.messages.jobhealth import Cause, ProcessState

#: A process as the kernel knows it: its pid and its start time (a reused pid differs).
ProcessKey = tuple[int, int]


@dataclass(frozen=True)
class RankReading:
    """One rank of a communicator here: a process the kernel ties to the job."""

    process: ProcessKey
    #: The launcher's name of the rank (``RANK``), or ``pid-N`` where it set none.
    rank: str
    collectives: int
    state: ProcessState = ProcessState.RUNNING
    #: The GPU its process uses has a fault condition, an XID held, or is out of service.
    gpu_fault: bool = False


@dataclass(frozen=True)
class CommReading:
    comm: int
    n_ranks: int
    ranks: tuple[RankReading, ...]


@dataclass(frozen=True)
class JobReading:
    job: str
    comms: tuple[CommReading, ...]
    #: The job's processes seen gone (their stats files' locks free, or /proc says so).
    exited: frozenset[ProcessKey] = frozenset()
    #: Any of the job's GPUs here has a fault (for stalls).
    gpu_fault: bool = False
    #: The share of the job's GPUs' time busy (0-100); None: unknown.
    gpu_busy: float | None = None


@dataclass(frozen=True)
class HostReading:
    jobs: tuple[JobReading, ...] = ()
    #: The host's data links are down or erroring (the links domain's judgement).
    network: bool = False
    #: Each data link that is up: its retransmitted segments per second this pass.
    retransmits: tuple[tuple[str, float], ...] = ()


@dataclass
class RankState:
    rank: str
    pid: int
    collectives: int
    state: ProcessState
    gpu_fault: bool
    cause: Cause = Cause.UNKNOWN


@dataclass
class CommState:
    job: str
    comm: int
    n_ranks: int
    ranks: dict[ProcessKey, RankState] = field(default_factory=dict)
    #: When a local rank's count last changed (or the communicator was first seen).
    moved_at: float = 0.0
    judged_at: float = float("-inf")
    #: A rank's process, cause or membership changed since the last judging.
    dirty: bool = True
    still: bool = False
    #: What the last report said of it that a change of must be reported at once.
    signature: tuple[object, ...] = ()
    #: The data links judged, at its last judging, to retransmit on a dead path since
    #: it went still (its ranks' cause is then the network).
    dead_paths: tuple[str, ...] = ()


@dataclass
class JobState:
    comms: dict[int, CommState] = field(default_factory=dict)
    report_at: float = float("-inf")
    gpu_busy: float | None = None
    gpu_fault: bool = False
