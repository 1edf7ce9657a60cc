"""The tuning loop's per-job and per-communicator state, and the base every part of the
loop shares: the jobs, the settings, the history, the phase moves.

A communicator's phase (:mod:`agent.tuning.phases`) is moved only by
:meth:`LoopBase.move`, which sends the table an event and keeps its answer. Sans-I/O.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agent.plugin.layout import StatsSlot
from agent.tuning.entries import Entry
from agent.tuning.phases import PHASES, Event, Phase
from agent.tuning.policies import DEFAULT, Derivation
from agent.tuning.settings import TuningSection
from harmonaize.hysteresis import LevelHold
from harmonaize.messages import AckPhase, JobDeclaration, Level
from harmonaize.switches import Record, disagreement

RATE_WINDOW = 8
HISTORY = 64
#: A rank fewer than this many collectives below a switching point is too close to
#: arm it: its next call may already have read the policy's sequence number.
GUARD = 2
#: The label of rules no current choice has (a previous agent's, or an older revision's).
PREVIOUS = "previous"


@dataclass(frozen=True)
class LoopSettings:
    max_changes_per_minute: int = 6
    #: Seconds a calmer link level must last before the choice steps down.
    hold: float = 5.0
    #: Seconds of a communicator's collectives between arming and its switching point ...
    activation_lead: float = 0.5
    #: ... and at least this many collectives.
    activation_margin: int = 64
    #: Seconds between reports to the controller for a job spanning hosts.
    report_interval: float = 1.0
    #: A communicator none of whose ranks is seen for this long is forgotten.
    stall: float = 10.0
    #: Link classes whose congestion counts for the job's choice.
    link_classes: tuple[str, ...] = ("data",)

    @classmethod
    def of(cls, cfg: TuningSection) -> LoopSettings:
        """The loop's part of the tuning section."""
        return cls(max_changes_per_minute=cfg.max_changes_per_minute, hold=cfg.hold,
                   activation_lead=cfg.activation_lead,
                   activation_margin=cfg.activation_margin,
                   report_interval=cfg.report_interval, stall=cfg.stall,
                   link_classes=tuple(cfg.link_classes))



@dataclass(frozen=True)
class Change:
    """One entry of a job's history, for operators."""

    time: float
    step: int
    kind: str  # declared, adopted, local, armed, confirmed, cancelled, refused, ...
    before: str
    after: str
    reason: str
    #: The step at which the link level that caused it was first seen.
    onset_step: int | None = None
    activations: tuple[tuple[int, int], ...] = ()


def by_comm(slots: Iterable[StatsSlot]) -> defaultdict[int, list[StatsSlot]]:
    """The slots grouped by communicator (a communicator with none maps to [])."""
    groups: defaultdict[int, list[StatsSlot]] = defaultdict(list)
    for slot in slots:
        groups[slot.comm_id].append(slot)
    return groups


def record_of(slot: StatsSlot) -> Record:
    return Record(slot.switches, slot.history, slot.prev_history, slot.last_switch,
                  slot.collectives)


@dataclass
class CommState:
    comm_id: int
    n_ranks: int = 0
    n_nodes: int = 0
    #: The live ranks' records, as of the last step.
    slots: tuple[StatsSlot, ...] = ()
    seen_at: float = 0.0
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    _last: tuple[int, float] | None = None
    #: Why this communicator's local ranks disagree ("" when they do not).
    divergence: str = ""
    #: Why a change of it waits ("" when nothing waits).
    waiting: str = ""
    #: Where a change of its rules stands; moved only by :meth:`LoopBase.move`.
    phase: Phase = Phase.IDLE

    @property
    def rate(self) -> float:
        return max(self.rates, default=0.0)

    @property
    def collectives(self) -> int:
        """The furthest local rank's next collective."""
        return max((s.collectives for s in self.slots), default=0)

    @property
    def least(self) -> int:
        return min((s.collectives for s in self.slots), default=0)

    def update(self, slots: Sequence[StatsSlot], now: float) -> None:
        self.slots = tuple(sorted(slots, key=lambda s: s.key))
        for slot in slots:
            self.n_ranks, self.n_nodes = slot.n_ranks, max(self.n_nodes, slot.n_nodes)
        count = self.collectives
        if self._last is not None and now > self._last[1]:
            self.rates.append(max(0, count - self._last[0]) / (now - self._last[1]))
        self._last = (count, now)
        self.seen_at = now
        self.divergence = disagreement(record_of(s) for s in self.slots)

    def passed(self, at: int) -> bool:
        """Every live rank completed collective ``at``."""
        return all(s.collectives > at for s in self.slots)


@dataclass
class JobState:
    declaration: JobDeclaration
    derivation: Derivation
    level: LevelHold
    since: float
    #: What new communicators get, and what the job follows.
    choice: str = DEFAULT
    reason: str = "declared"
    waiting: str = ""
    multi: bool = False
    retiring: bool = False
    comms: dict[int, CommState] = field(default_factory=dict)
    entries: dict[int, Entry] = field(default_factory=dict)
    changes: deque[float] = field(default_factory=deque)
    history: deque[Change] = field(default_factory=lambda: deque(maxlen=HISTORY))
    #: The controller's decision being armed here, to acknowledge once written.
    acking: int = 0
    #: The newest decision acknowledged, and how.
    acked: tuple[int, AckPhase | None] = (0, None)
    #: Communicators left to NCCL because the policy was full when they appeared.
    unlisted: set[int] = field(default_factory=set)
    #: Communicators whose ranks follow an entry this agent could not rebuild.
    orphaned: set[int] = field(default_factory=set)
    #: The policy file the ranks must map (device, inode), as the shell reports it.
    file: tuple[int, int] | None = None
    report_at: float = float("-inf")
    last_report: tuple[object, ...] | None = None
    aborted: int = 0
    observed: float = 0.0
    congested: float = 0.0
    retransmitting: bool = False
    last_step: float | None = None
    dirty: bool = True

    @property
    def desired_severity(self) -> int:
        if self.retiring:
            return 0
        return self.level.level.rank if self.derivation.tunable else 0

    @property
    def arming(self) -> dict[int, int]:
        """Communicators armed by this host alone, to verify once the policy is written,
        with their switching points."""
        return {c.comm_id: self.entries[c.comm_id].at for c in self.comms.values()
                if c.phase is Phase.ARMED}

    @property
    def diverged(self) -> list[str]:
        return [f"{c.comm_id:#x}: {c.divergence}" for c in self.comms.values() if c.divergence]


class LoopBase:
    """What every part of the loop shares: the jobs, the history, the phase moves."""

    def __init__(self, settings: LoopSettings) -> None:
        self.settings = settings
        self.jobs: dict[str, JobState] = {}
        self.steps = 0
        #: Raw link level of the last step, the link that set it and the step it rose.
        self.raw = Level.NONE
        self.evidence = "no congestion on the job's links"
        self._rise_step: dict[int, int] = {}

    @staticmethod
    def move(job: JobState, comm_id: int, event: Event) -> Phase:
        """Send ``event`` to a communicator's phase; the table's answer is its phase
        (an illegal move raises under test, and leaves it as it was in production)."""
        comm = job.comms[comm_id]
        comm.phase = PHASES.move(comm.phase, event)
        return comm.phase

    def _record(self, job: JobState, now: float, kind: str, change: tuple[str, str],
                reason: str, *, onset_step: int | None = None,
                activations: tuple[tuple[int, int], ...] = ()) -> None:
        job.history.append(Change(now, self.steps, kind, change[0], change[1], reason,
                                  onset_step, activations))

    def _observe_comms(self, job: JobState, slots: Sequence[StatsSlot], now: float) -> None:
        groups = by_comm(slots)
        for comm_id, group in groups.items():
            comm = job.comms.get(comm_id)
            if comm is None:
                comm = job.comms[comm_id] = CommState(comm_id)
            was = comm.divergence
            comm.update(group, now)
            if comm.divergence and not was:
                self._record(job, now, "diverged", (job.choice, job.choice),
                             f"communicator {comm_id:#x}: {comm.divergence}")
            if comm.n_nodes > 1 and not job.multi:
                job.multi = True
                job.reason = "communicator spans hosts: changes are agreed through the controller"
        # A communicator whose ranks all left is forgotten, with its entry, only after
        # ``stall`` seconds: one unreadable listing must not drop a live one's entry
        # (its ranks would keep what they hold anyway: a missing entry is refused).
        for comm_id, comm in list(job.comms.items()):
            if comm_id in groups:
                continue
            comm.slots = ()
            if now - comm.seen_at >= self.settings.stall:
                del job.comms[comm_id]
                job.unlisted.discard(comm_id)
                job.orphaned.discard(comm_id)
                if job.entries.pop(comm_id, None) is not None:
                    job.dirty = True
