"""Sans-I/O micro-level loop: which named choice each job's NCCL follows, and when.

Inputs, each with an explicit ``now``: the link step's judgement of each link
(:class:`agent.links.health.LinkJudgement`, the same pass health holds its levels
from) and the plugin's per-rank records (:meth:`TuningLoop.step`), declarations (:meth:`declare`,
:meth:`withdraw`), a restarted agent's files (:meth:`adopt`), and, for jobs
spanning hosts, the controller's :class:`TuningArm` and
:class:`TuningResolve`. Outputs are actions for the I/O shell: write a job's
policy, publish a message, retire a job's files. Nothing here reads a clock
or does I/O.

Per job, the congestion level of the host's data links (the worst link as the
link step judged it, by link health's thresholds) is held with hysteresis: a rise counts at
once, a fall only after the calmer level lasted ``hold`` seconds. The level
names a choice (:mod:`agent.tuning.policies`); changes are limited to
``max_changes_per_minute``.

No change may make two ranks of a communicator answer differently at any
collective index, whatever fails. So every change goes in two steps:

1. **Arm**: the communicator's entry gets the new rules from an index ``at``
   that every rank is still below, marked *pending*. A rank that reaches
   ``at`` before the next step waits there (the plugin polls).
2. **Verify, then confirm or cancel**: the shell writes the armed entry and
   reads the ranks' records again (:meth:`confirm`). If every rank maps the
   file, is below ``at`` and refused nothing, the change is confirmed;
   otherwise cancelled (the entry keeps its old rules past ``at``). Either
   way every rank answers alike: those that took the armed copy wait for the
   outcome, the rest are below ``at`` and take the outcome directly.

A job whose communicators all live on this host does both steps in one pass.
For a job with a communicator spanning hosts the controller runs them across
every host (:meth:`arm`, :meth:`resolve`): each host arms and acknowledges,
the controller confirms only when every host armed and every rank of every
communicator is accounted for. This loop reports its ranks' progress and
switch records (:class:`TuningReport`) and compares its own ranks' records.

Nothing is changed for a communicator that has not finished its previous
switch on every rank, nor while a rank waits, defers or refused a copy, nor
where the agent cannot see every rank (a single-host communicator with fewer
visible ranks than NCCL says it has), nor above a rank's own revision.
"""

# Over 400 lines because the two-step switch (arm, then confirm or cancel) must be read as one
# state machine; the single-host path, the multi-host path and the retirement of a job
# share JobState and CommState and every invariant in the docstring spans them.

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.links.interface import LevelHold, LinkJudgement
from agent.plugin.layout import (
    MAX_COMMS,
    MAX_RULESETS,
    CommEntry,
    Policy,
    Rule,
    StatsSlot,
    ruleset_hash,
)
from agent.tuning.policies import (
    CHOICE_NAMES,
    DEFAULT,
    Choice,
    Derivation,
    derive,
    severity_of,
)
from harmonaize.messages import (
    AckPhase,
    CommReport,
    JobDeclaration,
    Level,
    Message,
    SwitchState,
    TuningAck,
    TuningArm,
    TuningReport,
    TuningResolve,
)
from harmonaize.switches import WIRE_MASK, Record, disagreement, merge

RATE_WINDOW = 8
HISTORY = 64
MAX_STEP_GAP = 10.0  # seconds of one step that count towards a job's experience
#: A rank fewer than this many collectives below a switching point is too close to
#: arm it: its next call may already have read the policy's sequence number.
GUARD = 2
#: The label of rules no current choice has (a previous agent's, or an older revision's).
PREVIOUS = "previous"


def wire_comm(comm_id: int) -> int:
    """NCCL's communicator ids are random 64-bit values; the wire carries 62 bits."""
    return comm_id & WIRE_MASK


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


# --- actions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One communicator under policy: ``before`` rules for collectives below ``at``,
    ``after`` rules from it on (empty rules: NCCL's own choice). ``pending``: armed,
    not yet confirmed. ``decision``: the controller's decision that armed it (0: this
    agent's own, or unknown after a restart)."""

    comm_id: int
    at: int
    before: str
    after: str
    before_rules: tuple[Rule, ...] = ()
    after_rules: tuple[Rule, ...] = ()
    revision: int = 1
    pending: bool = False
    decision: int = 0

    @property
    def switches(self) -> bool:
        """Whether the answer changes at ``at`` (or may, while pending)."""
        return self.before_rules != self.after_rules


@dataclass(frozen=True)
class WritePolicy:
    job: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Publish:
    message: Message


@dataclass(frozen=True)
class Retire:
    """The job's declaration is gone and its communicators are settled: remove its files."""

    job: str


Action = WritePolicy | Publish | Retire


def build_policy(entries: Iterable[Entry], policy_id: int) -> Policy:
    """The plugin's view of ``entries``: distinct rule sets, each stored once."""
    sets: list[tuple[Rule, ...]] = []
    comms = []
    entries = sorted(entries, key=lambda e: e.comm_id)
    if len(entries) > MAX_COMMS:
        raise ValueError(f"{len(entries)} communicators exceed the {MAX_COMMS} a policy holds")
    for entry in entries:
        indexes = []
        for rules in (entry.before_rules, entry.after_rules):
            if not rules:
                indexes.append(None)  # NCCL's own choice: no ruleset needed
                continue
            if rules not in sets:
                if len(sets) == MAX_RULESETS:
                    raise ValueError(f"more than {MAX_RULESETS} distinct rule sets: more "
                                     "than a policy holds")
                sets.append(rules)
            indexes.append(sets.index(rules))
        comms.append(CommEntry(entry.comm_id, entry.at, indexes[0], indexes[1],
                               entry.revision, entry.pending))
    return Policy(policy_id, tuple(comms), tuple(sets))


def resolved_policy(policy: Policy, message: TuningResolve) -> Policy | None:
    """``policy`` with what ``message`` resolves confirmed or cancelled, without a
    declaration (None if it resolves nothing in it). A restarted agent may hear the
    outcome of a change its predecessor armed before it has the job's declaration
    again; the outcome needs no rules: confirming clears ``pending``, cancelling
    makes the rules after ``at`` those before it."""
    points = {a.comm: a.at for a in message.activations}
    comms, changed = [], False
    for entry in policy.comms:
        ours = entry.pending and points.get(wire_comm(entry.comm_id)) == entry.at
        comms.append(dataclasses.replace(
            entry, revision=entry.revision + 1, pending=False,
            after=entry.after if message.commit else entry.before) if ours else entry)
        changed = changed or ours
    return Policy(policy.policy_id, tuple(comms), policy.rulesets) if changed else None


# --- state ---------------------------------------------------------------------------


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
    #: Communicators armed this pass, to verify once the policy is written (one host).
    arming: dict[int, int] = field(default_factory=dict)
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
    def diverged(self) -> list[str]:
        return [f"{c.comm_id:#x}: {c.divergence}" for c in self.comms.values() if c.divergence]


# --- the loop ------------------------------------------------------------------------


class TuningLoop:
    def __init__(self, settings: LoopSettings) -> None:
        self.settings = settings
        self.jobs: dict[str, JobState] = {}
        self.steps = 0
        #: Raw link level of the last step, the link that set it and the step it rose.
        self.raw = Level.NONE
        self.evidence = "no congestion on the job's links"
        self._rise_step: dict[int, int] = {}

    # --- declarations ----------------------------------------------------------------

    def declare(self, declaration: JobDeclaration, now: float) -> list[Action]:
        """A new or updated declaration. Raises ValueError for an outdated revision."""
        job = self.jobs.get(declaration.job)
        if job is not None and declaration.revision < job.declaration.revision:
            raise ValueError(f"job {declaration.job}: revision {declaration.revision} is older "
                             f"than the declared {job.declaration.revision}")
        derivation = derive(declaration)
        if job is None:
            job = self.jobs[declaration.job] = JobState(
                declaration, derivation, LevelHold(self.settings.hold), now)
            self._record(job, now, "declared", (DEFAULT, DEFAULT),
                         f"revision {declaration.revision}")
            job.dirty = False
            return [WritePolicy(declaration.job, ())]
        if declaration == job.declaration and not job.retiring:
            return []
        job.retiring = False
        outdated = derivation.fingerprint != job.derivation.fingerprint
        job.declaration, job.derivation = declaration, derivation
        self._record(job, now, "declared", (job.choice, job.choice),
                     f"revision {declaration.revision}"
                     + ("; rules change at the next switch" if outdated else ""))
        return []

    def file(self, job_name: str, identity: tuple[int, int] | None) -> None:
        """The shell's policy file for the job (what every rank must map)."""
        job = self.jobs.get(job_name)
        if job is not None:
            job.file = identity

    def adopt(self, job_name: str, policy: Policy | None, slots: Sequence[StatsSlot],
              now: float) -> list[Action]:
        """Take over what a previous agent published for a declared job, so a restart
        changes nothing mid-stream. From its policy file if it could be read, else
        rebuilt from what the ranks say they follow; a communicator whose rules
        cannot be rebuilt is left alone (its ranks keep what they hold)."""
        job = self.jobs[job_name]
        job.entries = {}
        rebuilt = 0
        if policy is not None:
            for comm in policy.comms:
                before, after = policy.rules(comm.before), policy.rules(comm.after)
                job.entries[comm.comm_id] = Entry(
                    comm.comm_id, comm.at, self._label(job, before), self._label(job, after),
                    before, after, comm.revision, comm.pending)
        groups = by_comm(slots)
        known = {ruleset_hash(c.rules): c.rules for c in job.derivation.choices}
        if policy is not None:
            known |= {ruleset_hash(rules): rules for rules in policy.rulesets}
        for comm_id, group in list(groups.items()):
            newest = max(group, key=lambda s: s.revision)
            entry = job.entries.get(comm_id)
            if entry is not None and entry.revision >= newest.revision:
                continue
            if newest.revision == 0:
                continue  # its ranks follow nothing yet
            held = newest.held
            if held.before not in known or held.after not in known:
                job.orphaned.add(comm_id)
                job.entries.pop(comm_id, None)
                continue
            before, after = known[held.before], known[held.after]
            job.entries[comm_id] = Entry(comm_id, held.at, self._label(job, before),
                                         self._label(job, after), before, after,
                                         held.revision, held.pending)
            rebuilt += 1
        # Orphans too: a communicator gone before the next pass is forgotten after
        # ``stall`` like any other, not remembered as an orphan for ever.
        for comm_id in (*job.entries, *job.orphaned):
            job.comms.setdefault(comm_id, CommState(comm_id, seen_at=now))
        labels = {e.after for e in job.entries.values()}
        if len(labels) == 1 and (label := labels.pop()) in CHOICE_NAMES:
            job.choice = label
            job.level.level = Level(("none", "low", "high")[severity_of(label)])
        self._record(job, now, "adopted", (job.choice, job.choice),
                     f"{len(job.entries)} communicator(s) from the previous agent"
                     + (f"; {rebuilt} rebuilt from the ranks' records" if rebuilt else "")
                     + (f"; {len(job.orphaned)} left as their ranks hold them"
                        if job.orphaned else ""))
        # A change a previous agent armed on this host alone is cancelled: its ranks
        # wait at (or before) the switching point, and nobody else will confirm it.
        for comm_id, entry in list(job.entries.items()):
            nodes = max((s.n_nodes for s in groups[comm_id]), default=None)
            if entry.pending and nodes is not None and nodes <= 1:
                job.entries[comm_id] = self._cancelled(entry)
                job.aborted += 1
        job.dirty = False
        return [WritePolicy(job_name, tuple(job.entries.values()))]

    @staticmethod
    def _label(job: JobState, rules: tuple[Rule, ...]) -> str:
        for choice in job.derivation.choices:
            if choice.rules == rules:
                return choice.name
        return PREVIOUS  # never NCCL's own (empty) rules: every derivation has a default

    def withdraw(self, job_name: str, now: float) -> list[Action]:
        job = self.jobs.get(job_name)
        if job is None:
            raise ValueError(f"no declaration for job {job_name}")
        job.retiring = True
        self._record(job, now, "withdrawn", (job.choice, DEFAULT), "declaration withdrawn")
        return self._retire_step(job_name, job)

    # --- the controller's two phases -------------------------------------------------

    def arm(self, message: TuningArm, now: float) -> list[Action]:
        """Phase one of a multi-host change. Returns the armed policy to write (then
        :meth:`confirm` acknowledges it), or at once a refusal."""
        job = self.jobs.get(message.job)
        if job is None:
            return [self._ack(message.job, message.decision, AckPhase.REFUSED,
                              "no declaration for the job on this host")]
        if message.decision <= job.acked[0]:
            if message.decision == job.acked[0] and job.acked[1] is not None:
                return [self._ack(job, message.decision, job.acked[1], "repeated")]
            return []  # an old decision, superseded
        if message.fingerprint != job.derivation.fingerprint:
            return [self._refuse(job, message.decision,
                                 "this host derived other rules from its declaration "
                                 f"({job.derivation.fingerprint}, not {message.fingerprint})")]
        try:
            choice = job.derivation.get(message.choice)
        except ValueError as exc:
            return [self._refuse(job, message.decision, str(exc))]
        if job.retiring and choice.name != DEFAULT:
            return [self._refuse(job, message.decision, "declaration withdrawn here")]
        points = {a.comm: a.at for a in message.activations}
        pending = [e for e in job.entries.values()
                   if e.pending and not self._armed_by(e, message.decision, points)]
        if pending:
            return [self._refuse(job, message.decision,
                                 f"communicator {pending[0].comm_id:#x} has a change pending")]
        armed: dict[int, Entry] = {}
        for activation in message.activations:
            comm = self._by_wire(job, activation.comm)
            if comm is None:
                continue  # no rank of it here
            entry = job.entries.get(comm.comm_id)
            if entry is not None and entry.pending and entry.at == activation.at:
                armed[comm.comm_id] = dataclasses.replace(entry, decision=message.decision)
                continue  # armed already (a resent arm, or before a restart)
            why = self._not_ready(job, comm, activation.at)
            if why:
                return [self._refuse(job, message.decision, f"{comm.comm_id:#x}: {why}")]
            armed[comm.comm_id] = self._armed(job, comm, activation.at, choice,
                                              decision=message.decision)
        job.multi = True
        job.entries.update(armed)
        job.acking = message.decision
        self._record(job, now, "armed", (job.choice, choice.name),
                     f"decision {message.decision}",
                     activations=tuple((a.comm, a.at) for a in message.activations))
        return [WritePolicy(job.declaration.job, tuple(job.entries.values()))]

    def resolve(self, message: TuningResolve, now: float) -> list[Action]:
        """Phase two: confirm or cancel what a decision armed here."""
        job = self.jobs.get(message.job)
        if job is None:
            return [self._ack(message.job, message.decision, AckPhase.RESOLVED,
                              "no declaration for the job on this host")]
        if message.decision < job.acked[0]:
            return []
        points = {a.comm: a.at for a in message.activations}
        ours = [e for e in job.entries.values()
                if e.pending and self._armed_by(e, message.decision, points)]
        name = job.choice
        for entry in ours:
            job.entries[entry.comm_id] = (
                dataclasses.replace(entry, revision=entry.revision + 1, pending=False)
                if message.commit else self._cancelled(entry))
            name = entry.after
        if message.commit:
            if name != job.choice:
                job.changes.append(now)
                job.reason = f"agreed with the job's other hosts (decision {message.decision})"
            previous, job.choice = job.choice, name
        else:
            previous = job.choice
            job.aborted += 1
        job.acking = 0
        self._record(job, now, "confirmed" if message.commit else "cancelled",
                     (previous, job.choice), f"decision {message.decision}")
        actions: list[Action] = []
        if ours:
            actions.append(WritePolicy(job.declaration.job, tuple(job.entries.values())))
        actions.append(self._ack(job, message.decision, AckPhase.RESOLVED, ""))
        return actions

    @staticmethod
    def _armed_by(entry: Entry, decision: int, points: Mapping[int, int]) -> bool:
        """Whether a pending entry is ``decision``'s (an entry a restarted agent adopted
        knows no decision: its communicator and switching point say)."""
        if entry.decision:
            return entry.decision == decision
        return points.get(wire_comm(entry.comm_id)) == entry.at

    def confirm(self, stats: Mapping[str, Sequence[StatsSlot]], now: float) -> list[Action]:
        """After the shell wrote armed entries: check the ranks' fresh records, then
        confirm or cancel (one host), or acknowledge (several hosts)."""
        actions: list[Action] = []
        for name, job in self.jobs.items():
            if not (job.arming or job.acking):
                continue
            slots = stats.get(name, ())
            groups = by_comm(slots)
            if job.arming:
                actions += self._confirm_local(name, job, groups, now)
            if job.acking:
                armed = [e for e in job.entries.values()
                         if e.pending and e.decision == job.acking]
                why = ""
                for entry in armed:
                    why = self._unverified(job, entry, groups[entry.comm_id])
                    if why:
                        why = f"{entry.comm_id:#x}: {why}"
                        break
                self._observe_comms(job, slots, now)
                actions.append(self._refuse(job, job.acking, why) if why else
                               self._ack(job, job.acking, AckPhase.ARMED, ""))
                job.acking = 0
        return actions

    def _confirm_local(self, name: str, job: JobState,
                       groups: Mapping[int, Sequence[StatsSlot]], now: float) -> list[Action]:
        confirmed, cancelled = [], []
        for comm_id in job.arming:
            entry = job.entries[comm_id]
            why = self._unverified(job, entry, groups[comm_id])
            if why:
                job.entries[comm_id] = self._cancelled(entry)
                cancelled.append(f"{comm_id:#x}: {why}")
            else:
                job.entries[comm_id] = dataclasses.replace(entry, revision=entry.revision + 1,
                                                           pending=False)
                confirmed.append((comm_id, entry.at))
        job.arming = {}
        if cancelled:
            job.aborted += len(cancelled)
            self._record(job, now, "cancelled", (job.choice, job.choice), "; ".join(cancelled))
        if confirmed:
            self._record(job, now, "confirmed", (job.choice, job.choice),
                         f"{len(confirmed)} communicator(s)", activations=tuple(confirmed))
        return [WritePolicy(name, tuple(job.entries.values()))]

    def _unverified(self, job: JobState, entry: Entry, slots: Sequence[StatsSlot]) -> str:
        """Why an armed entry cannot be confirmed, from the ranks' fresh records."""
        if not slots:
            return "its ranks are gone"
        n_ranks, nodes = slots[0].n_ranks, max(s.n_nodes for s in slots)
        if nodes <= 1 and len(slots) != n_ranks:
            return f"{len(slots)} of its {n_ranks} ranks visible"
        for slot in slots:
            if job.file is not None and slot.policy_file != job.file:
                return "a rank does not map the current policy file"
            if slot.refused and slot.refused_revision >= entry.revision:
                return f"a rank refused revision {slot.refused_revision}"
            if slot.collectives + GUARD > entry.at:
                return f"a rank reached collective {slot.collectives} (switch at {entry.at})"
            if slot.revision > entry.revision:
                return f"a rank follows revision {slot.revision}, newer than this agent's"
        return ""

    # --- each pass -------------------------------------------------------------------

    def step(self, links: Sequence[LinkJudgement], stats: Mapping[str, Sequence[StatsSlot]],
             now: float) -> list[Action]:
        self.steps += 1
        raw, evidence, retransmitting = self._links(links)
        for severity in range(self.raw.rank + 1, raw.rank + 1):  # none unless it rose
            self._rise_step[severity] = self.steps
        self.raw, self.evidence = raw, evidence
        actions: list[Action] = []
        for name in list(self.jobs):
            job = self.jobs[name]
            self._observe(job, stats.get(name, ()), raw, retransmitting, now)
            if job.retiring and not job.multi:
                actions += self._retire_step(name, job)
                continue
            if job.multi:
                actions += self._multi_step(job, now)
                if job.retiring:
                    actions += self._retire_step(name, job)
                    continue
            elif job.derivation.tunable or any(e.switches for e in job.entries.values()):
                self._single_step(job, now)
            if job.dirty:
                job.dirty = False
                actions.append(WritePolicy(name, tuple(job.entries.values())))
        return actions

    def shutdown(self, stats: Mapping[str, Sequence[StatsSlot]], now: float) -> list[Action]:
        """The agent stops: communicators on this host alone go back to NCCL's own
        choices (armed now, confirmed by :meth:`confirm`), where their ranks' fresh
        records allow it. Those spanning hosts keep the agreed choice: no host may
        change it alone."""
        actions: list[Action] = []
        for name, job in self.jobs.items():
            self._observe_comms(job, stats.get(name, ()), now)
            if job.multi:
                continue
            job.choice = DEFAULT
            self._converge(job)
            if job.arming:
                actions.append(WritePolicy(name, tuple(job.entries.values())))
        return actions

    def _links(self, links: Sequence[LinkJudgement]) -> tuple[Level, str, bool]:
        worst, evidence, retransmitting = Level.NONE, "no congestion on the job's links", False
        for link in links:
            if link.link_class not in self.settings.link_classes or not link.up:
                continue
            retransmitting = retransmitting or link.retransmitting
            if link.congestion.rank > worst.rank:
                worst, evidence = link.congestion, link.evidence
        return worst, evidence, retransmitting

    def _observe(self, job: JobState, slots: Sequence[StatsSlot], raw: Level,
                 retransmitting: bool, now: float) -> None:
        held = job.level.update(raw, now)
        if job.last_step is not None:
            dt = min(MAX_STEP_GAP, max(0.0, now - job.last_step))
            job.observed += dt
            if held.rank >= 1:
                job.congested += dt
        job.last_step = now
        job.retransmitting = job.retransmitting or retransmitting
        self._observe_comms(job, slots, now)

    def refresh(self, job_name: str, slots: Sequence[StatsSlot], now: float) -> None:
        """Fresh records of a job's ranks between passes (before judging an arm)."""
        job = self.jobs.get(job_name)
        if job is not None:
            self._observe_comms(job, slots, now)

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
                job.arming.pop(comm_id, None)
                if job.entries.pop(comm_id, None) is not None:
                    job.dirty = True

    def _by_wire(self, job: JobState, wire: int) -> CommState | None:
        return next((c for c in job.comms.values() if wire_comm(c.comm_id) == wire and c.slots),
                    None)

    def _margin(self, comm: CommState) -> int:
        return max(self.settings.activation_margin,
                   math.ceil(comm.rate * self.settings.activation_lead))

    def _rate_limited(self, job: JobState, now: float) -> bool:
        while job.changes and now - job.changes[0] >= 60.0:
            job.changes.popleft()
        return len(job.changes) >= self.settings.max_changes_per_minute

    def _not_ready(self, job: JobState, comm: CommState, at: int) -> str:
        """Why ``comm`` cannot be armed to switch at ``at`` now ("" if it can)."""
        slots = comm.slots
        if not slots:
            return "no live rank"
        if comm.comm_id in job.orphaned:
            return "its ranks follow rules this agent could not rebuild"
        if len(slots) > comm.n_ranks:
            return (f"{len(slots)} ranks share its id, more than its {comm.n_ranks}: "
                    "ambiguous (NCCL before 2.28 gives no communicator id)")
        if comm.n_nodes <= 1 and len(slots) < comm.n_ranks:
            return f"{len(slots)} of its {comm.n_ranks} ranks visible"
        if comm.divergence:
            return f"its ranks disagree: {comm.divergence}"
        entry = job.entries.get(comm.comm_id)
        if entry is not None and entry.pending:
            return f"a change at {entry.at} is still pending"
        if entry is not None and entry.switches and not comm.passed(entry.at):
            return f"a rank has not passed the previous switch at {entry.at}"
        revision = entry.revision if entry is not None else 0
        for slot in slots:
            if job.file is not None and slot.policy_file != job.file:
                return "a rank does not map the current policy file yet"
            if slot.waiting:
                return f"a rank waits at collective {slot.wait_at}"
            if slot.deferred:
                return "a rank defers a copy until it passes its own switch"
            if slot.refused and slot.refused_revision >= revision:
                return f"a rank refused revision {slot.refused_revision}"
            if slot.revision > revision:
                return f"a rank follows revision {slot.revision}, newer than this agent's"
            if slot.collectives + GUARD > at:
                return f"a rank reached collective {slot.collectives} (switch at {at})"
        return ""

    @staticmethod
    def _armed(job: JobState, comm: CommState, at: int, choice: Choice, *,
               decision: int = 0) -> Entry:
        entry = job.entries.get(comm.comm_id)
        current, current_rules = (entry.after, entry.after_rules) if entry else (DEFAULT, ())
        revision = (entry.revision if entry else 0) + 1
        return Entry(comm.comm_id, at, current, choice.name, current_rules, choice.rules,
                     revision, pending=True, decision=decision)

    @staticmethod
    def _cancelled(entry: Entry) -> Entry:
        """The armed change withdrawn: the old rules hold past ``at`` too."""
        return dataclasses.replace(entry, revision=entry.revision + 1, pending=False,
                                   after=entry.before, after_rules=entry.before_rules)

    def _converge(self, job: JobState) -> None:
        """Arm every communicator with ranks here whose rules differ from the choice
        in force, where that is safe now; the others wait (and say why)."""
        choice = job.derivation.get(job.choice)
        rules = choice.rules
        for comm in job.comms.values():
            if not comm.slots:
                continue
            entry = job.entries.get(comm.comm_id)
            if (entry.after_rules if entry else ()) == rules:
                comm.waiting = ""
                continue
            if entry is None and len(job.entries) >= MAX_COMMS:
                # A full policy cannot list it; it stays with NCCL's choice throughout.
                job.unlisted.add(comm.comm_id)
                continue
            at = comm.collectives + self._margin(comm)
            comm.waiting = self._not_ready(job, comm, at)
            if comm.waiting:
                continue
            job.entries[comm.comm_id] = self._armed(job, comm, at, choice)
            job.arming[comm.comm_id] = at
        if job.arming:
            job.dirty = True

    def _single_step(self, job: JobState, now: float) -> None:
        desired = CHOICE_NAMES[job.desired_severity]
        if desired == job.choice:
            self._converge(job)
            job.waiting = self._waits(job)
            return
        if self._rate_limited(job, now):
            self._converge(job)
            job.waiting = (f"rate limit: {len(job.changes)} changes in the last minute "
                           f"(max {self.settings.max_changes_per_minute})")
            return
        previous, rising = job.choice, severity_of(desired) > severity_of(job.choice)
        job.choice = desired
        job.reason = self.evidence if desired != DEFAULT else (
            f"calm for {self.settings.hold:g} s")
        job.changes.append(now)
        # A rise is dated from the pass its level was first seen (what reaction time
        # measures); a fall is this pass's own (the hold decided it, not a link).
        onset = self._rise_step.get(severity_of(desired)) if rising else self.steps
        self._converge(job)
        self._record(job, now, "local", (previous, desired), job.reason, onset_step=onset,
                     activations=tuple(sorted(job.arming.items())))
        job.waiting = self._waits(job)

    @staticmethod
    def _waits(job: JobState) -> str:
        why = next((f"communicator {c.comm_id:#x}: {c.waiting}" for c in job.comms.values()
                    if c.waiting), "")
        return why

    def _multi_step(self, job: JobState, now: float) -> list[Action]:
        desired = CHOICE_NAMES[job.desired_severity]
        job.waiting = "" if desired == job.choice else (
            f"wants {desired}: waiting for the controller to agree it with the other hosts")
        comms = self._reports(job)
        state = (desired, tuple(_news(c) for c in comms))
        if state == job.last_report and now - job.report_at < self.settings.report_interval:
            return []
        job.last_report, job.report_at = state, now
        return [Publish(TuningReport(job.declaration.job, job.derivation.fingerprint, desired,
                                     job.desired_severity, comms))]

    def _reports(self, job: JobState) -> tuple[CommReport, ...]:
        out = []
        for comm in sorted(job.comms.values(), key=lambda c: c.comm_id)[:MAX_COMMS]:
            if not comm.slots:
                continue
            entry = job.entries.get(comm.comm_id)
            groups = merge(record_of(s).masked() for s in comm.slots)
            out.append(CommReport(
                wire_comm(comm.comm_id), comm.n_ranks, comm.n_nodes, len(comm.slots),
                min(comm.least, 2**62), min(comm.collectives, 2**62), min(comm.rate, 1e9),
                entry.after if entry else DEFAULT, min(entry.at, 2**62) if entry else 0,
                bool(entry and entry.pending),
                _switch_state(groups[-1]), _switch_state(groups[0]),
                sum(1 for s in comm.slots if s.waiting),
                sum(1 for s in comm.slots if s.refused),
                bool(comm.divergence)))
        return tuple(out)

    def _ack(self, job: JobState | str, decision: int, phase: AckPhase, reason: str) -> Publish:
        if isinstance(job, str):
            return Publish(TuningAck(job, decision, phase, reason[:1000]))
        job.acked = (max(job.acked[0], decision), phase)
        return Publish(TuningAck(job.declaration.job, decision, phase, reason[:1000],
                                 self._reports(job)))

    def _refuse(self, job: JobState, decision: int, why: str) -> Publish:
        self._record(job, self._last_now(job), "refused", (job.choice, job.choice),
                     f"decision {decision}: {why}")
        return self._ack(job, decision, AckPhase.REFUSED, why)

    @staticmethod
    def _last_now(job: JobState) -> float:
        return job.last_step if job.last_step is not None else job.since

    def _retire_step(self, name: str, job: JobState) -> list[Action]:
        live = [c for c in job.comms.values() if c.slots]
        if not job.multi:
            # One host: its communicators step back to NCCL's own choice first.
            job.choice = DEFAULT
            self._converge(job)
            unsettled = [c for c in live if (e := job.entries.get(c.comm_id)) is not None
                         and (e.after_rules or e.pending
                              or (e.switches and not c.passed(e.at)))]
        else:
            # Several hosts: the controller agrees the way back; until every rank here
            # follows NCCL's own choice (or is gone), the policy stays.
            unsettled = [c for c in live if (e := job.entries.get(c.comm_id)) is not None
                         and (e.after_rules or e.pending)]
        if unsettled:
            job.waiting = "withdrawn: returning to NCCL's choices before removing the policy"
        if job.dirty or job.arming:
            job.dirty = False
            return [WritePolicy(name, tuple(job.entries.values()))]
        if unsettled:
            return []
        del self.jobs[name]
        return [Retire(name)]

    # --- views -----------------------------------------------------------------------

    def _record(self, job: JobState, now: float, kind: str, change: tuple[str, str],
                reason: str, *, onset_step: int | None = None,
                activations: tuple[tuple[int, int], ...] = ()) -> None:
        job.history.append(Change(now, self.steps, kind, change[0], change[1], reason,
                                  onset_step, activations))

    def pending_activations(self, job_name: str) -> int:
        job = self.jobs[job_name]
        return sum(1 for c in job.comms.values()
                   if (e := job.entries.get(c.comm_id)) is not None
                   and (e.pending or (e.switches and c.slots and not c.passed(e.at))))


def _news(report: CommReport) -> tuple[object, ...]:
    """What of a communicator's report is news: everything but progress (how far its
    ranks got, and how fast), which is sent every report interval anyway."""
    return (report.comm, report.n_ranks, report.n_nodes, report.ranks, report.choice,
            report.at, report.pending, report.waiting, report.refused, report.diverged,
            *((state.switches, state.history, state.prev_history, state.last_switch)
              for state in (report.ahead, report.behind)))


def _switch_state(record: Record) -> SwitchState:
    return SwitchState(record.switches, record.history & WIRE_MASK,
                       record.prev_history & WIRE_MASK, min(record.last_switch, 2**62),
                       min(record.collectives, 2**62))
