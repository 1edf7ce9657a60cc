"""Judging a communicator's progress from its ranks' collective counts: hang, stall,
straggler. Sans-I/O: samples and time in, verdict changes and a next deadline out.

One engine serves both sides. An agent judges its own ranks of each communicator (their
counts read at one instant from the tuner plugin's stats files); the controller judges a
communicator across hosts, from every host's latest report merged into one sample.

Why counts say who hangs a job: every rank of an NCCL communicator issues the same
collectives in the same order. Ranks run ahead of each other only until they need a
result (a stream synchronisation, ``loss.item()``); then they wait in a collective for the
ranks that have not issued it. So, once nothing moves, ranks with unequal counts split
into those that issued collective N and wait, and those that never issued it: the ones
at the minimum hold the job up (:attr:`Finding.HANG`). Ranks that all stopped at the same
index are doing something else together (evaluation, a checkpoint, input) or are all
stuck: that is a :attr:`Finding.STALL`, whose cause comes from the hardware (a GPU fault,
a network fault) or is ``paused``, never a hang on counts alone. A rank that stays last
by more than ``straggler_margin`` seconds of the communicator's pace for
``straggler_window`` is a :attr:`Finding.STRAGGLER`.

``hang_after`` defaults to 3 s: while ranks move, the skew between them is what a step's
imbalance makes (milliseconds to a few hundred); frozen *and* unequal for ten times that
means some rank withholds a collective the others wait in. A verdict is a notice, not an
action (nothing is killed or drained on it), and it is withdrawn as soon as the ranks move,
so seconds are the right scale, against the 10-30 minutes of PyTorch's watchdog.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from harmonaize.messages.jobhealth import Cause, Finding, ProcessState

#: Processes that cannot issue a collective (the kernel's word, not a count).
NOT_RUNNING = frozenset({ProcessState.STOPPED, ProcessState.ZOMBIE,
                         ProcessState.UNINTERRUPTIBLE})
#: Which cause names a hang best when the ranks at fault differ: the most specific first.
CAUSE_ORDER = (Cause.PROCESS_EXITED, Cause.PROCESS_NOT_RUNNING, Cause.GPU_FAULT,
               Cause.NETWORK, Cause.UNKNOWN, Cause.PAUSED)


@dataclass(frozen=True)
class ProgressSettings:
    #: Seconds with no rank moving, at unequal counts, before a hang is named.
    hang_after: float = 3.0
    #: Seconds with every rank stopped at the same index before a stall is named.
    stall_after: float = 60.0
    #: How far behind the communicator's leaders (in seconds of its pace) a straggler is.
    straggler_margin: float = 2.0
    #: For how long a rank must stay that far behind.
    straggler_window: float = 30.0

    def __post_init__(self) -> None:
        for name in ("hang_after", "stall_after", "straggler_margin", "straggler_window"):
            value = getattr(self, name)
            if not 0.0 < value <= 86_400.0:
                raise ValueError(f"{name} must be in (0, 86400] seconds, not {value!r}")
        if self.stall_after < self.hang_after:
            raise ValueError("stall_after must be at least hang_after")


@dataclass(frozen=True)
class RankSample:
    """One rank: its name, its count, its process and what its host found at fault."""

    rank: str
    collectives: int
    process: ProcessState = ProcessState.RUNNING
    cause: Cause = Cause.UNKNOWN
    #: Where it runs (the controller's host id; "" on an agent). Never shown to a tenant.
    place: str = ""


@dataclass(frozen=True)
class CommSample:
    """A communicator as seen now: its ranks' counts, and how long none has moved."""

    job: str
    comm: int
    n_ranks: int
    ranks: tuple[RankSample, ...]
    #: Seconds since any rank of it (in this view) issued a collective.
    still_for: float
    #: A fault on the hardware the job runs on (gpu-fault, network), for stalls.
    fault: Cause | None = None
    #: Whether the counts were read at one instant (one host's stats), so that a rank
    #: behind the others while they move is really behind: stragglers need it.
    simultaneous: bool = True

    @property
    def key(self) -> tuple[str, int]:
        return (self.job, self.comm)

    @property
    def complete(self) -> bool:
        return len({r.rank for r in self.ranks}) >= self.n_ranks > 0


@dataclass(frozen=True)
class Verdict:
    job: str
    comm: int
    finding: Finding
    cause: Cause
    #: The ranks holding the communicator up (hang, straggler) or, for a stall, the
    #: ranks on the faulty hardware (every rank when the job is paused).
    ranks: tuple[RankSample, ...]
    #: The collective the named ranks did not issue (hang), where all stopped (stall),
    #: or where the straggler stood when named.
    at_collective: int
    since: float

    @property
    def identity(self) -> tuple[object, ...]:
        return (self.finding, self.cause, tuple(sorted(r.rank for r in self.ranks)),
                self.at_collective)


@dataclass(frozen=True)
class Change:
    """A verdict that became true (``active``) or stopped being true."""

    verdict: Verdict
    active: bool


@dataclass
class _Comm:
    verdict: Verdict | None = None
    #: (time, the leaders' count) over the straggler window: the communicator's pace.
    pace: deque[tuple[float, int]] = field(default_factory=deque)
    #: The rank last seen furthest behind by the margin, and since when.
    behind: tuple[str, ...] = ()
    behind_since: float = 0.0
    deadline: float | None = None


def worst_cause(ranks: Iterable[RankSample]) -> Cause:
    causes = {r.cause for r in ranks}
    return next((c for c in CAUSE_ORDER if c in causes), Cause.UNKNOWN)


class ProgressJudge:
    """Verdicts per (job, communicator), changed only by :meth:`step` and :meth:`drop`."""

    def __init__(self, settings: ProgressSettings = ProgressSettings()) -> None:
        self.settings = settings
        self._comms: dict[tuple[str, int], _Comm] = {}

    def verdicts(self) -> dict[tuple[str, int], Verdict]:
        return {k: c.verdict for k, c in self._comms.items() if c.verdict is not None}

    def verdict(self, job: str, comm: int) -> Verdict | None:
        state = self._comms.get((job, comm))
        return state.verdict if state else None

    def step(self, samples: Iterable[CommSample], now: float) -> list[Change]:
        """Judge the communicators sampled; the others keep their verdicts."""
        changes: list[Change] = []
        for sample in samples:
            state = self._comms.setdefault(sample.key, _Comm())
            verdict = self._judge(state, sample, now)
            changes.extend(self._settle(state, verdict))
        return changes

    def drop(self, keys: Iterable[tuple[str, int]]) -> list[Change]:
        """Forget communicators (destroyed, or their job ended): their verdicts end."""
        changes: list[Change] = []
        for key in keys:
            state = self._comms.pop(key, None)
            if state is not None and state.verdict is not None:
                changes.append(Change(state.verdict, False))
        return changes

    def keys(self) -> set[tuple[str, int]]:
        return set(self._comms)

    def next_deadline(self) -> float | None:
        """When a communicator sampled still will cross a threshold if it stays still."""
        deadlines = [c.deadline for c in self._comms.values() if c.deadline is not None]
        return min(deadlines, default=None)

    def _settle(self, state: _Comm, verdict: Verdict | None) -> list[Change]:
        old = state.verdict
        if old is not None and verdict is not None and old.identity == verdict.identity:
            return []  # the same finding: it keeps its first time
        state.verdict = verdict
        changes = [Change(old, False)] if old is not None else []
        if verdict is not None:
            changes.append(Change(verdict, True))
        return changes

    def _judge(self, state: _Comm, sample: CommSample, now: float) -> Verdict | None:
        cfg = self.settings
        state.deadline = None
        if not sample.ranks:
            return None
        high = max(r.collectives for r in sample.ranks)
        low = min(r.collectives for r in sample.ranks)
        still = sample.still_for
        if still < cfg.hang_after:
            state.deadline = now + (cfg.hang_after - still)
            return self._straggler(state, sample, low, high, now)
        state.pace.clear()
        state.behind = ()
        if low < high:
            lagging = tuple(r for r in sample.ranks if r.collectives == low)
            return self._verdict(sample, Finding.HANG, worst_cause(lagging), lagging, low, now=now)
        stuck = tuple(r for r in sample.ranks if r.process in NOT_RUNNING)
        if stuck:
            return self._verdict(sample, Finding.HANG, worst_cause(stuck), stuck, low, now=now)
        if not sample.complete:
            return None  # part of the communicator: the controller judges across hosts
        if still < cfg.stall_after:
            state.deadline = now + (cfg.stall_after - still)
            return None
        cause = sample.fault if sample.fault in (Cause.GPU_FAULT, Cause.NETWORK) else None
        if cause is None:
            return self._verdict(sample, Finding.STALL, Cause.PAUSED, sample.ranks, low, now=now)
        affected = tuple(r for r in sample.ranks if r.cause == cause) or sample.ranks
        return self._verdict(sample, Finding.STALL, cause, affected, low, now=now)

    def _straggler(self, state: _Comm, sample: CommSample, low: int, high: int,
                   now: float) -> Verdict | None:
        cfg = self.settings
        if not sample.simultaneous:
            state.pace.clear()
            state.behind = ()
            return None
        state.pace.append((now, high))
        while len(state.pace) > 2 and state.pace[1][0] <= now - cfg.straggler_window:
            state.pace.popleft()
        first_at, first_high = state.pace[0]
        rate = (high - first_high) / (now - first_at) if now > first_at else 0.0
        behind: tuple[str, ...] = ()
        if rate > 0 and low < high and (high - low) / rate >= cfg.straggler_margin:
            lagging = [r for r in sample.ranks if r.collectives == low]
            if len(lagging) < len(sample.ranks):
                behind = tuple(sorted(r.rank for r in lagging))
        if behind != state.behind:
            state.behind, state.behind_since = behind, now
        if not behind or now - state.behind_since < cfg.straggler_window:
            if behind:
                state.deadline = state.behind_since + cfg.straggler_window
            return None
        named = tuple(r for r in sample.ranks if r.rank in behind)
        if state.verdict is not None and state.verdict.finding is Finding.STRAGGLER:
            at = state.verdict.at_collective  # the same straggler: not a new finding
        else:
            at = low
        return self._verdict(sample, Finding.STRAGGLER, worst_cause(named), named, at, now=now)

    @staticmethod
    def _verdict(sample: CommSample, finding: Finding, cause: Cause,
                 ranks: tuple[RankSample, ...], at: int, *, now: float) -> Verdict:
        return Verdict(sample.job, sample.comm, finding, cause,
                       tuple(sorted(ranks, key=lambda r: (r.collectives, r.rank))), at, now)
