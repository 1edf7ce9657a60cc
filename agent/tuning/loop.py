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
   hands the ranks' fresh records back as the next input (:meth:`confirm`). If every rank maps the
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

Each communicator's phase (idle, armed, agreeing, acknowledged, refused, confirmed,
cancelled) is a table, :mod:`agent.tuning.phases`: the loop sends events and takes the
table's answer. The loop is split along its seams: the entries and actions
(:mod:`agent.tuning.entries`), the state (:mod:`agent.tuning.jobstate`), the checks
(:mod:`agent.tuning.readiness`), the controller's phases (:mod:`agent.tuning.multihost`),
the reports (:mod:`agent.tuning.reports`) and a restart (:mod:`agent.tuning.adoption`).
"""

# The loop's core: declarations, each pass on one host, confirmation, retirement. Its
# other parts are in the modules named above.

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from agent.links.interface import LinkJudgement
from agent.plugin.layout import MAX_COMMS, StatsSlot
from agent.tuning.adoption import Adoption
from agent.tuning.entries import (
    Action,
    Entry,
    Publish,
    Retire,
    WritePolicy,
    build_policy,
    cancelled,
    confirmed,
    resolved_policy,
    wire_comm,
)
from agent.tuning.jobstate import (
    GUARD,
    HISTORY,
    PREVIOUS,
    Change,
    CommState,
    JobState,
    LoopSettings,
    by_comm,
    record_of,
)
from agent.tuning.multihost import MultiHostSteps
from agent.tuning.phases import Event, Phase
from agent.tuning.policies import CHOICE_NAMES, DEFAULT, Choice, derive, severity_of
from agent.tuning.readiness import armed, not_ready, unverified
from harmonaize.hysteresis import LevelHold
from harmonaize.messages import JobDeclaration, Level

__all__ = ["GUARD", "HISTORY", "PREVIOUS", "Action", "Change", "CommState", "Entry", "JobState",
           "LoopSettings", "Publish", "Retire", "TuningLoop", "WritePolicy", "build_policy",
           "by_comm", "record_of", "resolved_policy", "wire_comm"]

MAX_STEP_GAP = 10.0  # seconds of one step that count towards a job's experience


class TuningLoop(Adoption, MultiHostSteps):
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

    def withdraw(self, job_name: str, now: float) -> list[Action]:
        job = self.jobs.get(job_name)
        if job is None:
            raise ValueError(f"no declaration for job {job_name}")
        job.retiring = True
        self._record(job, now, "withdrawn", (job.choice, DEFAULT), "declaration withdrawn")
        return self._retire_step(job_name, job)

    # --- confirmation: the input after armed entries were written --------------------

    def awaiting_confirmation(self) -> list[str]:
        """Jobs with entries armed and written but not yet decided: the shell reads
        their ranks' records again and hands them to :meth:`confirm`."""
        return [name for name, job in self.jobs.items() if job.arming or job.acking]

    def confirm(self, stats: Mapping[str, Sequence[StatsSlot]], now: float) -> list[Action]:
        """The input after the shell wrote armed entries: the ranks' fresh records. For
        each communicator armed here: confirm or cancel (one host), or acknowledge or
        refuse (several hosts). Not a call back: the shell hands it in as the next input
        while :meth:`awaiting_confirmation` names jobs."""
        actions: list[Action] = []
        for name, job in self.jobs.items():
            if not (job.arming or job.acking):
                continue
            slots = stats.get(name, ())
            groups = by_comm(slots)
            if job.arming:
                actions += self._confirm_local(name, job, groups, now)
            if job.acking:
                actions.append(self.acknowledge(job, slots, groups, now))
        return actions

    def _confirm_local(self, name: str, job: JobState,
                       groups: Mapping[int, Sequence[StatsSlot]], now: float) -> list[Action]:
        taken, withdrawn = [], []
        for comm_id in job.arming:
            entry = job.entries[comm_id]
            why = unverified(job, entry, groups[comm_id])
            phase = self.move(job, comm_id, Event.UNVERIFIED if why else Event.VERIFIED)
            if phase is Phase.CANCELLED:
                job.entries[comm_id] = cancelled(entry)
                withdrawn.append(f"{comm_id:#x}: {why}")
            elif phase is Phase.CONFIRMED:
                job.entries[comm_id] = confirmed(entry)
                taken.append((comm_id, entry.at))
        if withdrawn:
            job.aborted += len(withdrawn)
            self._record(job, now, "cancelled", (job.choice, job.choice), "; ".join(withdrawn))
        if taken:
            self._record(job, now, "confirmed", (job.choice, job.choice),
                         f"{len(taken)} communicator(s)", activations=tuple(taken))
        return [WritePolicy(name, tuple(job.entries.values()))]

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
                actions += self.multi_step(job, now)
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

    def _margin(self, comm: CommState) -> int:
        return max(self.settings.activation_margin,
                   math.ceil(comm.rate * self.settings.activation_lead))

    def _rate_limited(self, job: JobState, now: float) -> bool:
        while job.changes and now - job.changes[0] >= 60.0:
            job.changes.popleft()
        return len(job.changes) >= self.settings.max_changes_per_minute

    def _not_ready(self, job: JobState, comm: CommState, at: int) -> str:
        return not_ready(job, comm, at)

    @staticmethod
    def _armed(job: JobState, comm: CommState, at: int, choice: Choice, *,
               decision: int = 0) -> Entry:
        return armed(job, comm, at, choice, decision=decision)

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
            comm.waiting = not_ready(job, comm, at)
            if comm.waiting:
                continue
            if self.move(job, comm.comm_id, Event.ARM) is Phase.ARMED:
                job.entries[comm.comm_id] = armed(job, comm, at, choice)
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

    def pending_activations(self, job_name: str) -> int:
        job = self.jobs[job_name]
        return sum(1 for c in job.comms.values()
                   if (e := job.entries.get(c.comm_id)) is not None
                   and (e.pending or (e.switches and c.slots and not c.passed(e.at))))

