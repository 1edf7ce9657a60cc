"""The energy loop's plain data: what it reads of a GPU and a job, what it asks the
shell to do, and what it keeps per GPU and per job between steps. Sans-I/O."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from agent.plugin.layout import StatsSlot
from harmonaize.messages import EnergyAllowance

WATT = 1000  # milliwatts
#: The longest gap between two looks counted toward energy (a stalled agent says nothing).
MAX_DT = 10.0
#: Rate limit window for lowerings, seconds.
MINUTE = 60.0
#: Seconds between retries of a restore that failed.
RESTORE_RETRY = 10.0
#: A hold grows to at most this many times ``hold`` after tries lower that failed.
MAX_HOLD_SCALE = 16.0
#: A step down that raises energy per unit of work by this share (or by probe_below of
#: the tolerance, if less) is undone.
WORSE = 0.02


@dataclass(frozen=True)
class PowerInfo:
    """A GPU's power-management range, and the limit every restore returns it to."""

    min_mw: int
    max_mw: int
    default_mw: int
    original_mw: int


@dataclass(frozen=True)
class RankProgress:
    """How far the ranks on one GPU got: their collectives, summed, and which processes'
    (``key``; another key is another set of processes, not progress)."""

    collectives: int
    key: int
    #: Ahead of the slowest local rank of each communicator they share (None: no
    #: communicator with another local rank to compare with).
    ahead: bool | None = None


@dataclass(frozen=True)
class EnergyGpu:
    index: int
    uuid: str
    job: str | None = None
    limit_mw: int | None = None
    draw_mw: int | None = None
    sm_clock_mhz: int | None = None
    util_gpu: int | None = None
    power: PowerInfo | None = None
    progress: RankProgress | None = None


@dataclass(frozen=True)
class EnergyObservation:
    gpus: tuple[EnergyGpu, ...] = ()
    #: Declared jobs' allowances, by job.
    jobs: Mapping[str, EnergyAllowance] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadPower:
    """Read the GPU's power range and current limit (the shell answers in the next
    observation's ``power``)."""

    index: int
    uuid: str


@dataclass(frozen=True)
class SetLimit:
    index: int
    uuid: str
    limit_mw: int
    original_mw: int
    #: Back to the original (the shell forgets the saved original once it is applied).
    restore: bool
    why: str


Action = ReadPower | SetLimit


class Phase(StrEnum):
    BASELINE = "baseline"  # progress at the GPUs' own limits
    SETTLE = "settle"      # a change was made: clocks and the job settle
    MEASURE = "measure"    # what the change costs
    HOLD = "hold"          # settled, still watched


@dataclass
class GpuPower:
    index: int
    uuid: str
    job: str
    power: PowerInfo | None = None
    lo_mw: int = 0
    #: The limit this loop set; None: the original (untouched or restored).
    limit_mw: int | None = None
    pending: SetLimit | None = None
    unmanaged: str = ""
    releasing: bool = False
    read_asked: bool = False
    retry_at: float | None = None
    lowered_at: deque[float] = field(default_factory=deque)
    used_j: float = 0.0
    saved_j: float = 0.0
    baseline_w: float | None = None
    draw_w: float | None = None
    observed_mw: int | None = None
    draw_sum: float = 0.0
    draw_n: int = 0
    ahead_n: int = 0
    looks_n: int = 0
    waiting: bool = False
    why: str = ""

    @property
    def original_mw(self) -> int:
        assert self.power is not None
        return self.power.original_mw

    @property
    def current_mw(self) -> int:
        return self.original_mw if self.limit_mw is None else self.limit_mw


@dataclass
class JobPower:
    allowance: EnergyAllowance
    gpus: tuple[str, ...] = ()
    phase: Phase = Phase.BASELINE
    since: float = 0.0
    window_start: float = 0.0
    start: dict[str, tuple[int, int]] = field(default_factory=dict)
    proxy_sum: float = 0.0
    proxy_n: int = 0
    baseline: float | None = None
    source: str = ""
    baseline_at: float = 0.0
    ratio: float | None = None
    slowdown: float | None = None
    settled: dict[str, bool] = field(default_factory=dict)
    #: The GPUs lowered last and their group ("waiting", "critical"): a back-off raises them.
    last: tuple[str, ...] = ()
    last_group: str = ""
    #: Limits held before a new baseline, to return to in one change.
    held: dict[str, int] = field(default_factory=dict)
    #: A step down after a hold is being tried; each failed try doubles the next hold.
    retrying: bool = False
    hold_scale: float = 1.0
    #: Watts per unit of progress (the job's GPUs' mean draw over its rate) in the last
    #: window, and before the last step down (None: the last change was no step down).
    efficiency: float | None = None
    before: float | None = None
    why: str = "measuring the job's progress at its GPUs' own limits"


def progress_of(slots: Iterable[StatsSlot], pids: Mapping[int, int]) -> dict[int, RankProgress]:
    """Per GPU index, its ranks' progress from the job's stats slots (``pids``: process ->
    GPU). A GPU's ranks are *ahead* when, in every communicator they share with another
    local rank, each has issued more collectives than the slowest local rank of it."""
    slots = [s for s in slots if s.pid in pids]
    lowest: dict[int, int] = {}
    members: dict[int, int] = {}
    for s in slots:
        lowest[s.comm_id] = min(lowest.get(s.comm_id, s.collectives), s.collectives)
        members[s.comm_id] = members.get(s.comm_id, 0) + 1
    out: dict[int, RankProgress] = {}
    by_gpu: dict[int, list[StatsSlot]] = {}
    for s in slots:
        by_gpu.setdefault(pids[s.pid], []).append(s)
    for gpu, own in by_gpu.items():
        shared = [s for s in own if members[s.comm_id] > 1]
        ahead = all(s.collectives > lowest[s.comm_id] for s in shared) if shared else None
        key = hash(tuple(sorted(s.key for s in own))) & 0x7FFFFFFFFFFFFFFF
        out[gpu] = RankProgress(sum(s.collectives for s in own), key, ahead)
    return out
