"""Job health's settings (``[jobhealth]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from harmonaize.progress import ProgressSettings
from harmonaize.schema import Num

Seconds = Annotated[float, Num(0.1, 86_400.0)]


@dataclass(frozen=True)
class JobHealthSection:
    """Judging each job's communicators from its local ranks' collective counts."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Seconds with no local rank moving, at unequal counts, before a hang is named
    #: (ranks of one step are milliseconds apart; see harmonaize/progress.py).
    hang_after: Seconds = 3.0
    #: Seconds with every rank stopped at the same collective before a stall is named.
    stall_after: Seconds = 60.0
    #: How far behind its communicator's leaders (seconds of its pace) a straggler is ...
    straggler_margin: Seconds = 2.0
    #: ... for how long.
    straggler_window: Seconds = 30.0
    #: Seconds between two reports of a job's ranks to the controller while it has ranks
    #: here (a change is reported at once).
    report_interval: Annotated[float, Num(0.5, 3600.0)] = 10.0
    #: A moving communicator is judged (for stragglers) at most this often; a still one
    #: at its deadlines and when anything of it changes.
    judge_interval: Annotated[float, Num(0.05, 60.0)] = 1.0
    #: Ranks listed per communicator in a report (the ones furthest behind first).
    ranks_per_comm: Annotated[int, Num(1, 256)] = 256
    #: Communicators reported per job (those with a finding, then the stillest, first).
    comms_per_job: Annotated[int, Num(1, 64)] = 64
    #: Ranks kept per job at most (past it, further ranks are not counted: one line).
    ranks_per_job: Annotated[int, Num(1, 1_000_000)] = 16_384
    #: New processes whose job and rank are resolved from /proc per pass (the others
    #: wait for the next passes: a job's first thousands of ranks cost bounded time).
    resolves_per_pass: Annotated[int, Num(1, 100_000)] = 256
    #: /proc/PID/stat reads per pass for the process states of still ranks.
    proc_reads_per_pass: Annotated[int, Num(1, 100_000)] = 1024
    #: Seconds a data link must go on retransmitting, first to last, after a
    #: communicator went still, for its ranks' cause to be the network though the link
    #: is up and clean (agent/jobhealth/retransmits.py): TCP repairs a loss within a few
    #: round trips, while a dead path's flows back off 0.2, 0.4, 0.8, 1.6, 3.2 s ... and
    #: keep going; 5 s is past any burst and well before ``stall_after``. Under three of
    #: the links observer's one-second reads, a burst read twice could pass for sustained.
    retransmit_window: Annotated[float, Num(3.0, 3600.0)] = 5.0
    #: ... and at least this many segments retransmitted since it went still (one dead
    #: flow retransmits 5 times in its first 6 s; two stray losses far apart are not it).
    retransmit_segments: Annotated[int, Num(1, 1_000_000)] = 4

    def __post_init__(self) -> None:
        self.progress()  # the judge's own checks (stall_after >= hang_after, ...)

    def progress(self) -> ProgressSettings:
        return ProgressSettings(hang_after=self.hang_after, stall_after=self.stall_after,
                                straggler_margin=self.straggler_margin,
                                straggler_window=self.straggler_window)
