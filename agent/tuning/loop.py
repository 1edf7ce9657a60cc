"""Sans-I/O micro-level loop: which named choice each job's NCCL should follow, and when.

Inputs, each with an explicit ``now``: link observations and the plugin's
per-communicator counters (:meth:`TuningLoop.step`), declarations
(:meth:`declare`, :meth:`withdraw`) and the controller's decisions
(:meth:`decide`). Outputs are actions for the I/O shell: write a job's policy,
send a proposal, retire a job's files. Nothing here reads a clock or does I/O.

Per job, the congestion level of the host's data links (the worst link, by
the same thresholds as link health) is held with hysteresis: a rise counts at
once, a fall only after the calmer level lasted ``hold`` seconds. The level
names a choice (:mod:`agent.tuning.policies`); changes are limited to
``max_changes_per_minute``.

A change never takes effect mid-stream. Every rank of a communicator must
pick the same algorithm and protocol for the same collective, so a change is
published per communicator as ``before`` / ``after`` rules and the collective
index ``at`` from which ``after`` holds:

* a job whose communicators all live on this host switches by itself, at the
  highest collective count any local rank reported plus a margin (the
  communicator's rate times ``activation_lead``, at least
  ``activation_margin``), so no rank has passed it when the policy lands;
* a job with a communicator spanning hosts only *proposes* its choice, with
  its progress, to the controller, and applies the :class:`TuningDecision`
  every host of the job receives alike.

A communicator is not switched again until every active local rank passed
its last activation point; otherwise a rank still before it would read the
new ``before`` where the others followed the old one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.config import LinksSection
from agent.linkhealth import LevelHold, LinkView, congestion_of
from agent.tuning.policies import CHOICE_NAMES, DEFAULT, Derivation, derive, severity_of
from agent.tuning.shm import MAX_COMMS, MAX_RULESETS, CommEntry, Policy, Rule, StatsSlot
from harmonaize.messages import (
    JobDeclaration,
    Level,
    Progress,
    TuningDecision,
    TuningProposal,
)

#: Wire fields hold at most 2**62; NCCL's communicator ids are random 64-bit
#: values, so the wire carries their low 62 bits and each host maps them back
#: to the communicators it knows.
WIRE_MASK = (1 << 62) - 1
RATE_WINDOW = 8
HISTORY = 64
MAX_STEP_GAP = 10.0  # seconds of one step that count towards a job's experience


def wire_comm(comm_id: int) -> int:
    return comm_id & WIRE_MASK


@dataclass(frozen=True)
class LoopSettings:
    max_changes_per_minute: int = 6
    #: Seconds a calmer link level must last before the choice steps down.
    hold: float = 5.0
    #: Seconds of a communicator's collectives between publishing and activation.
    activation_lead: float = 0.5
    #: ... and at least this many collectives.
    activation_margin: int = 64
    #: Seconds between proposals while a change is still being agreed.
    proposal_refresh: float = 5.0
    #: A rank whose collective count did not move for this long counts as idle.
    stall: float = 10.0
    #: Link classes whose congestion counts for the job's choice.
    link_classes: tuple[str, ...] = ("data",)


# --- actions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One communicator under policy: ``before`` rules for collectives below ``at``,
    ``after`` rules from it on (empty rules: NCCL's own choice)."""

    comm_id: int
    at: int
    before: str
    after: str
    before_rules: tuple[Rule, ...] = ()
    after_rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class WritePolicy:
    job: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Propose:
    proposal: TuningProposal


@dataclass(frozen=True)
class Retire:
    """The job's declaration is gone and its communicators are quiet: remove its files."""

    job: str


Action = WritePolicy | Propose | Retire


def build_policy(entries: Iterable[Entry], policy_id: int, stale_after_ns: int) -> Policy:
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
                sets.append(rules)
            indexes.append(sets.index(rules))
        comms.append(CommEntry(entry.comm_id, entry.at, indexes[0], indexes[1]))
    if len(sets) > MAX_RULESETS:
        raise ValueError(f"{len(sets)} distinct rule sets exceed the {MAX_RULESETS} a policy "
                         "holds")
    return Policy(policy_id, tuple(comms), tuple(sets), stale_after_ns)


# --- state ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One entry of a job's history, for operators."""

    time: float
    step: int
    kind: str  # local, proposed, decided, declared, withdrawn, late
    before: str
    after: str
    reason: str
    #: The step at which the link level that caused it was first seen.
    onset_step: int | None = None
    activations: tuple[tuple[int, int], ...] = ()


@dataclass
class CommState:
    comm_id: int
    n_ranks: int = 0
    n_nodes: int = 0
    collectives: int = 0
    seen_at: float = 0.0
    #: pid -> (collectives, when that count last moved)
    slots: dict[int, tuple[int, float]] = field(default_factory=dict)
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    _last: tuple[int, float] | None = None

    @property
    def rate(self) -> float:
        return max(self.rates, default=0.0)

    def update(self, slots: Sequence[StatsSlot], now: float) -> None:
        for slot in slots:
            old = self.slots.get(slot.pid)
            moved = old is None or old[0] != slot.collectives
            self.slots[slot.pid] = (slot.collectives, now if moved else old[1])
            self.n_ranks, self.n_nodes = slot.n_ranks, max(self.n_nodes, slot.n_nodes)
        gone = set(self.slots) - {s.pid for s in slots}
        for pid in gone:
            del self.slots[pid]
        self.collectives = max((c for c, _ in self.slots.values()), default=self.collectives)
        if self._last is not None and now > self._last[1]:
            self.rates.append(max(0, self.collectives - self._last[0]) / (now - self._last[1]))
        self._last = (self.collectives, now)
        self.seen_at = now

    def active(self, now: float, stall: float) -> bool:
        return any(now - moved < stall for _, moved in self.slots.values())

    def passed(self, at: int, now: float, stall: float) -> bool:
        """Every rank that is still issuing collectives is at or past index ``at``."""
        return all(count >= at or now - moved >= stall for count, moved in self.slots.values())


@dataclass
class JobState:
    declaration: JobDeclaration
    derivation: Derivation
    level: LevelHold
    since: float
    #: What new communicators get, and (single host) what is in force.
    choice: str = DEFAULT
    reason: str = "declared"
    waiting: str = ""
    multi: bool = False
    retiring: bool = False
    comms: dict[int, CommState] = field(default_factory=dict)
    entries: dict[int, Entry] = field(default_factory=dict)
    changes: deque[float] = field(default_factory=deque)
    history: deque[Change] = field(default_factory=lambda: deque(maxlen=HISTORY))
    proposed: str | None = None
    proposed_at: float = float("-inf")
    proposed_comms: frozenset[int] = frozenset()
    decision: int = -1
    #: Activations for communicators not seen here yet: wire id -> (at, choice).
    awaiting: dict[int, tuple[int, str]] = field(default_factory=dict)
    #: Decided activations that wait for the communicator's previous one to pass.
    queued: dict[int, tuple[int, str]] = field(default_factory=dict)
    #: Communicators left to NCCL because the policy was full when they appeared.
    unlisted: set[int] = field(default_factory=set)
    #: A decision was applied: report progress once local ranks passed it, so the
    #: controller knows this host is clear for the next one.
    report_due: bool = False
    late_activations: int = 0
    observed: float = 0.0
    congested: float = 0.0
    retransmitting: bool = False
    last_step: float | None = None
    dirty: bool = True

    @property
    def desired_severity(self) -> int:
        return self.level.level.rank if self.derivation.tunable else 0


# --- the loop ------------------------------------------------------------------------


class TuningLoop:
    def __init__(self, settings: LoopSettings, thresholds: LinksSection) -> None:
        self.settings = settings
        self.thresholds = thresholds
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
                     + ("; rules change at the next activation" if outdated else ""))
        return []

    def adopt(self, job_name: str, policy: Policy, now: float) -> list[Action]:
        """Take over what a previous agent published for a declared job, so a restart
        changes nothing mid-stream (its rules stay until the next activation)."""
        job = self.jobs[job_name]
        job.entries = {}
        for comm in policy.comms:
            before = policy.rulesets[comm.before] if comm.before is not None else ()
            after = policy.rulesets[comm.after] if comm.after is not None else ()
            job.entries[comm.comm_id] = Entry(comm.comm_id, comm.activate_at,
                                              self._label(job, before), self._label(job, after),
                                              before, after)
            job.comms.setdefault(comm.comm_id, CommState(comm.comm_id, seen_at=now))
        labels = {e.after for e in job.entries.values()}
        if len(labels) == 1 and (label := labels.pop()) in CHOICE_NAMES:
            job.choice = label
            job.level.level = Level(("none", "low", "high")[severity_of(label)])
        # Entries that do not follow the choice in force converge on it at their
        # next activation point (one host), or with the next decision (several).
        self._record(job, now, "adopted", (job.choice, job.choice),
                     f"{len(job.entries)} communicator(s) from the previous agent's policy")
        job.dirty = False
        return [WritePolicy(job_name, tuple(job.entries.values()))]

    @staticmethod
    def _label(job: JobState, rules: tuple[Rule, ...]) -> str:
        for choice in job.derivation.choices:
            if choice.rules == rules:
                return choice.name
        return "previous" if rules else DEFAULT

    def withdraw(self, job_name: str, now: float) -> list[Action]:
        job = self.jobs.get(job_name)
        if job is None:
            raise ValueError(f"no declaration for job {job_name}")
        job.retiring = True
        self._record(job, now, "withdrawn", (job.choice, DEFAULT if not job.multi else job.choice),
                     "declaration withdrawn")
        return self._retire_step(job_name, job, now)

    # --- the controller's decisions ----------------------------------------------------

    def decide(self, decision: TuningDecision, now: float) -> list[Action]:
        """Apply a decision for a multi-host job. Raises ValueError if it is not ours
        to apply (unknown job or choice); a repeated decision changes nothing."""
        job = self.jobs.get(decision.job)
        if job is None or job.retiring:
            raise ValueError(f"decision {decision.decision} for job {decision.job}, "
                             "which has no declaration here")
        choice = job.derivation.get(decision.choice)  # ValueError for an unknown choice
        if decision.decision <= job.decision:
            return []
        job.decision = decision.decision
        job.multi = True
        job.report_due = True
        previous = job.choice
        for activation in decision.activations:
            comm = self._by_wire(job, activation.comm)
            if comm is None:
                job.awaiting[activation.comm] = (activation.at, choice.name)
            else:
                self._activate(job, comm, activation.at, choice.name, now, decided=True)
        job.choice = choice.name
        if previous != choice.name:
            job.changes.append(now)
            job.reason = f"agreed with the job's other hosts (decision {decision.decision})"
        self._record(job, now, "decided", (previous, choice.name),
                     f"decision {decision.decision}",
                     activations=tuple((a.comm, a.at) for a in decision.activations))
        job.waiting = ""
        return [WritePolicy(job.declaration.job, tuple(job.entries.values()))]

    # --- each pass -------------------------------------------------------------------

    def step(self, links: Sequence[LinkView], stats: Mapping[str, Sequence[StatsSlot]],
             now: float) -> list[Action]:
        self.steps += 1
        raw, evidence, retransmitting = self._links(links)
        if raw.rank > self.raw.rank:
            for severity in range(self.raw.rank + 1, raw.rank + 1):
                self._rise_step[severity] = self.steps
        self.raw, self.evidence = raw, evidence
        actions: list[Action] = []
        for name in list(self.jobs):
            job = self.jobs[name]
            self._observe(job, stats.get(name, ()), raw, retransmitting, now)
            if job.retiring:
                actions += self._retire_step(name, job, now)
                continue
            if not job.derivation.tunable and not job.entries:
                continue  # nothing to choose: NCCL's own choices throughout
            if job.multi:
                actions += self._multi_step(job, now)
            else:
                self._single_step(job, now)
            if job.dirty:
                job.dirty = False
                actions.append(WritePolicy(name, tuple(job.entries.values())))
        return actions

    def _links(self, links: Sequence[LinkView]) -> tuple[Level, str, bool]:
        worst, evidence, retransmitting = Level.NONE, "no congestion on the job's links", False
        for view in links:
            if view.link_class not in self.settings.link_classes or not view.up:
                continue
            level = congestion_of(view, self.thresholds)
            busy = view.packets_per_s >= self.thresholds.min_packets_per_s
            retransmitting = retransmitting or (
                busy and view.retransmit_fraction >= self.thresholds.retransmit_low)
            if level.rank > worst.rank:
                worst = level
                evidence = (f"{view.name}: {level.value}: utilization "
                            f"{(view.utilization or 0.0):.0%}, CE/CNP {view.ce_fraction:.2%}, "
                            f"retransmits {view.retransmit_fraction:.2%}")
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
        by_comm: dict[int, list[StatsSlot]] = {}
        for slot in slots:
            by_comm.setdefault(slot.comm_id, []).append(slot)
        for comm_id, group in by_comm.items():
            comm = job.comms.get(comm_id)
            if comm is None:
                comm = job.comms[comm_id] = CommState(comm_id)
            comm.update(group, now)
            if comm.n_nodes > 1 and not job.multi:
                job.multi = True
                job.reason = "communicator spans hosts: changes are agreed through the controller"
                job.choice = DEFAULT  # new communicators wait for a decision
        # A communicator whose ranks all left the stats files is forgotten, with its
        # entry, only after ``stall`` seconds: one unreadable directory listing must
        # not unlist (and so switch) a communicator that is still running.
        for comm_id, comm in list(job.comms.items()):
            if comm_id not in by_comm and now - comm.seen_at >= self.settings.stall:
                del job.comms[comm_id]
                job.queued.pop(comm_id, None)
                job.unlisted.discard(comm_id)
                if job.entries.pop(comm_id, None) is not None:
                    job.dirty = True
        for wire, (at, choice) in list(job.awaiting.items()):
            comm = self._by_wire(job, wire)
            if comm is not None:
                del job.awaiting[wire]
                self._activate(job, comm, at, choice, now, decided=True)
        for comm_id, (at, choice) in list(job.queued.items()):
            comm = job.comms.get(comm_id)
            entry = job.entries.get(comm_id)
            if comm is not None and (entry is None
                                     or comm.passed(entry.at, now, self.settings.stall)):
                del job.queued[comm_id]
                self._activate(job, comm, at, choice, now, decided=True)

    def _by_wire(self, job: JobState, wire: int) -> CommState | None:
        return next((c for c in job.comms.values() if wire_comm(c.comm_id) == wire), None)

    def _margin(self, comm: CommState) -> int:
        return max(self.settings.activation_margin,
                   math.ceil(comm.rate * self.settings.activation_lead))

    def _pending(self, job: JobState, now: float) -> CommState | None:
        for comm in job.comms.values():
            entry = job.entries.get(comm.comm_id)
            if entry is not None and not comm.passed(entry.at, now, self.settings.stall):
                return comm
        return None

    def _rate_limited(self, job: JobState, now: float) -> bool:
        while job.changes and now - job.changes[0] >= 60.0:
            job.changes.popleft()
        return len(job.changes) >= self.settings.max_changes_per_minute

    def _activate(self, job: JobState, comm: CommState, at: int, choice: str, now: float,
                  *, decided: bool = False) -> None:
        """Switch ``comm`` to ``choice`` from collective ``at`` (kept if it is there already)."""
        rules = job.derivation.get(choice).rules
        entry = job.entries.get(comm.comm_id)
        current, current_rules = (entry.after, entry.after_rules) if entry else (DEFAULT, ())
        if current_rules == rules:
            return  # the same rules under any name: nothing changes on the wire
        if entry is None and len(job.entries) >= MAX_COMMS:
            # A full policy cannot list it; it stays with NCCL's choice throughout
            # (dropping a listed communicator instead would switch it mid-stream).
            job.unlisted.add(comm.comm_id)
            return
        if entry is not None and not comm.passed(entry.at, now, self.settings.stall):
            if decided:  # the agreed point stands; it applies once this one passed
                job.queued[comm.comm_id] = (at, choice)
            return  # a local change is recomputed at a later pass instead
        if decided and at <= comm.collectives:
            job.late_activations += 1
            self._record(job, now, "late", (current, choice),
                         f"activation {at} on communicator {comm.comm_id:#x} arrived after "
                         f"local ranks reached {comm.collectives}")
        job.entries[comm.comm_id] = Entry(comm.comm_id, at, current, choice, current_rules, rules)
        job.dirty = True

    def _converge(self, job: JobState, now: float) -> None:
        """Bring every communicator with ranks onto the choice in force: new ones, and
        ones a restart or a new revision left on other rules. One that has not passed
        its last activation point yet is left for a later pass."""
        for comm in job.comms.values():
            if comm.slots:
                self._activate(job, comm, comm.collectives + self._margin(comm), job.choice,
                               now)

    def _single_step(self, job: JobState, now: float) -> None:
        desired = CHOICE_NAMES[job.desired_severity]
        pending = self._pending(job, now) if desired != job.choice else None
        if desired == job.choice:
            job.waiting = ""
        elif pending is not None:
            job.waiting = (f"communicator {pending.comm_id:#x} has not passed its activation at "
                           f"{job.entries[pending.comm_id].at} (at {pending.collectives})")
        elif self._rate_limited(job, now):
            job.waiting = (f"rate limit: {len(job.changes)} changes in the last minute "
                           f"(max {self.settings.max_changes_per_minute})")
        else:
            previous = job.choice
            job.choice, job.reason = desired, self.evidence if desired != DEFAULT else (
                f"calm for {self.settings.hold:g} s")
            job.changes.append(now)
            job.waiting = ""
            self._converge(job, now)
            onset = (self._rise_step.get(severity_of(desired)) if desired != DEFAULT
                     else self.steps)
            self._record(job, now, "local", (previous, desired), job.reason, onset_step=onset,
                         activations=tuple((e.comm_id, e.at) for e in job.entries.values()
                                           if e.after == desired))
            return
        self._converge(job, now)

    def _multi_step(self, job: JobState, now: float) -> list[Action]:
        desired = CHOICE_NAMES[job.desired_severity]
        comms = frozenset(job.comms)
        changed = desired != job.proposed
        if changed and job.proposed is not None and self._rate_limited(job, now):
            job.waiting = (f"rate limit: {len(job.changes)} proposals in the last minute "
                           f"(max {self.settings.max_changes_per_minute})")
            changed = False
        pending = self._pending(job, now) is not None
        unsettled = desired != job.choice or pending
        due = unsettled and now - job.proposed_at >= self.settings.proposal_refresh
        settled = job.report_due and not pending
        if not (changed or due or settled or not comms <= job.proposed_comms):
            return []
        if not pending:
            job.report_due = False
        if changed and job.proposed is not None:
            job.changes.append(now)
        if changed:
            onset = self._rise_step.get(severity_of(desired)) if desired != DEFAULT else None
            self._record(job, now, "proposed", (job.proposed or DEFAULT, desired),
                         self.evidence if desired != DEFAULT else "links calm",
                         onset_step=onset)
        job.proposed, job.proposed_at, job.proposed_comms = desired, now, comms
        if desired != job.choice:
            job.waiting = f"proposed {desired} to the controller; waiting for its decision"
        progress = tuple(
            Progress(wire_comm(c.comm_id), min(c.collectives, 2**62), min(c.rate, 1e9))
            for c in sorted(job.comms.values(), key=lambda c: c.comm_id)[:32])
        return [Propose(TuningProposal(job.declaration.job, desired, job.desired_severity,
                                       progress))]

    def _retire_step(self, name: str, job: JobState, now: float) -> list[Action]:
        live = [c for c in job.comms.values() if c.active(now, self.settings.stall)]
        if not job.multi:
            # One host: its communicators step back to NCCL's own choice at activation
            # points first, then the policy goes.
            job.choice = DEFAULT
            self._converge(job, now)
            unsettled = [c for c in live if (e := job.entries.get(c.comm_id)) is not None
                         and (e.after_rules or not c.passed(e.at, now, self.settings.stall))]
            if unsettled:
                job.waiting = "withdrawn: returning to NCCL's choices before removing the policy"
        else:
            # Several hosts: no agreed way back; keep the last agreed policy until the
            # job's communicators are quiet here.
            unsettled = live
            if unsettled:
                job.waiting = ("withdrawn: keeping the last agreed policy until the job's "
                               "communicators are quiet")
        if job.dirty:
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

    def pending_activations(self, job_name: str, now: float) -> int:
        job = self.jobs[job_name]
        return sum(1 for c in job.comms.values()
                   if (e := job.entries.get(c.comm_id)) is not None
                   and not c.passed(e.at, now, self.settings.stall))
