"""Multi-host agreement on a job's tuning: reports in, two-phase changes out.

Every host of a job whose NCCL communicators span hosts reports what its own
links call for and where its ranks stand (:class:`TuningReport`: a choice,
a severity 0..2, and per communicator the ranks here, their progress and
their switch records). Every rank of a communicator must answer alike at
every collective index, whatever fails, so a change goes in two phases:

1. **Arm** (:class:`TuningArm`, to every host of the job): each host writes
   the change as *pending* from a switching index ``at`` and acknowledges
   (:class:`TuningAck`) once it checked that every local rank maps the policy
   and is below ``at``. A rank that reaches ``at`` before the outcome waits.
2. **Resolve** (:class:`TuningResolve`, to every host alike): *commit* only
   when every host armed and every rank of every communicator is accounted
   for (the hosts' ranks add up to NCCL's size of it), otherwise *cancel*. The
   outcome is recorded before it is sent and resent until every host has
   acknowledged it, across controller restarts; an arm the controller cannot
   show was resolved is cancelled after a restart.

So a host that never got the arm writes nothing; one cut off after arming
pauses its ranks at ``at`` until it hears the outcome, which every host
hears alike. No rank's answer depends on time or on one host's view.

Choosing: the most severe fresh wish wins (congestion anywhere on the job's
paths slows every rank of a collective alike). A rise is decided at once; a
fall only once the lower wish lasted ``hold`` seconds; changes of the choice
are limited per minute. ``at`` is past every host's projected position: the
highest count reported, projected at its rate, plus the fastest rate times
``lead`` (at least ``margin``). A communicator is not changed again before
every host reported all its ranks past its previous switch, nor while a rank
waits, refused a copy, or disagrees.

Detection: every host's switch records of a communicator are compared
(:func:`harmonaize.switches.disagreement`); a disagreement marks the job
``diverged`` (sticky while the communicator lives), waiting ranks mark it
``paused``. Ranks can wait only on a host that may have armed, so no change is armed
while a host of the job is unreachable (the shell says which are reachable at each
:meth:`step`): its report stays fresh for ``report_ttl`` after it fell silent, and an
arm sent then would be cancelled after ``arm_timeout`` while its tenant is told
``paused`` until that host comes back, though no rank ever waited.

Pure: time is a parameter and nothing here does I/O; the controller stores
:meth:`snapshot` before sending what :meth:`step` returns.
"""

# Over 400 lines because multi-host agreement (reports, arm, every host's acknowledgement,
# commit or cancel, step-down hold, durable state) is one protocol; split, its
# invariants would be spread over modules.

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from harmonaize.messages import (
    AckPhase,
    Activation,
    CommReport,
    Message,
    TuningAck,
    TuningArm,
    TuningReport,
    TuningResolve,
    TuningStatus,
)
from harmonaize.schema import Num
from harmonaize.switches import Record, disagreement

DEFAULT_CHOICE = "default"
#: The choices a declaration can give, by severity (agent/tuning/policies derives
#: these names): the only names that may become a job's choice, which its tenant sees.
CHOICES = {DEFAULT_CHOICE: 0, "congested": 1, "severe": 2}
MAX_ACTIVATIONS = 32
MAX_AT = 2**62
#: After a cancelled change, the next arm waits this long, doubling up to the maximum.
BACKOFF = 1.0
MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class AgreementSettings:
    """The ``[tuning]`` section of the controller's configuration."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Seconds a less severe wish must last before the choice steps down.
    hold: Annotated[float, Num(0.0, 3600.0)] = 10.0
    max_decisions_per_minute: Annotated[int, Num(1, 600)] = 4
    #: Seconds of collectives, at the fastest reported rate, between arming and ``at``
    #: (how long the slowest host may take to arm and hear the outcome before its
    #: ranks pause at ``at``).
    lead: Annotated[float, Num(0.0, 600.0)] = 2.0
    #: ... and at least this many collectives.
    margin: Annotated[int, Num(1, 1_000_000)] = 100
    #: A host's report older than this no longer counts (the host went quiet).
    report_ttl: Annotated[float, Num(0.5, 3600.0)] = 10.0
    #: Seconds to wait for every host's arm acknowledgement before cancelling.
    arm_timeout: Annotated[float, Num(0.05, 600.0)] = 1.0
    #: Seconds between resends of an arm or resolve a host has not acknowledged.
    resend: Annotated[float, Num(0.05, 600.0)] = 0.5


@dataclass
class _Decision:
    number: int
    choice: str
    activations: tuple[Activation, ...]
    hosts: frozenset[str]
    armed_at: float
    commit: bool | None = None
    reason: str = ""
    acks: dict[str, AckPhase] = field(default_factory=dict)
    ack_reports: dict[str, tuple[CommReport, ...]] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)

    def message(self, job: str, fingerprint: str) -> Message:
        if self.commit is None:
            return TuningArm(job, self.number, self.choice, fingerprint, self.activations)
        return TuningResolve(job, self.number, self.commit, self.activations)


@dataclass(frozen=True)
class _Report:
    report: TuningReport
    received: float


@dataclass
class _Job:
    hosts: frozenset[str] | None = None
    reports: dict[str, _Report] = field(default_factory=dict)
    number: int = 0
    decision: _Decision | None = None
    fingerprint: str = ""
    #: What every host follows per communicator (wire id): (choice, at).
    committed: dict[int, tuple[str, int]] = field(default_factory=dict)
    choice: str = DEFAULT_CHOICE
    severity: int = 0
    changes: deque[float] = field(default_factory=deque)
    lower_since: float | None = None
    lower_want: tuple[int, str] = (0, DEFAULT_CHOICE)
    withdrawn: bool = False
    waiting: str = ""
    diverged: dict[int, str] = field(default_factory=dict)
    #: No new arm before this (after cancellations), and the current back-off.
    retry_at: float = float("-inf")
    backoff: float = BACKOFF
    dirty: bool = True


class Agreement:
    def __init__(self, settings: AgreementSettings | None = None) -> None:
        self.settings = settings or AgreementSettings()
        self._jobs: dict[str, _Job] = {}
        #: Jobs forgotten since :meth:`take_dirty` (their stored state goes).
        self._gone: set[str] = set()
        #: Changes armed, confirmed and cancelled (for metrics).
        self.counters: Counter[str] = Counter()
        #: The hosts reachable at this step (None: every host).
        self._reachable: Container[str] | None = None

    def _job(self, name: str) -> _Job:
        job = self._jobs.get(name)
        if job is None:
            job = self._jobs[name] = _Job()
        return job

    # --- durable state -----------------------------------------------------------------

    def snapshot(self, name: str) -> dict[str, Any] | None:
        """What must survive a restart: numbers, the change in flight, what holds."""
        job = self._jobs.get(name)
        if job is None:
            return None
        decision = job.decision
        return {
            "number": job.number, "choice": job.choice, "severity": job.severity,
            "fingerprint": job.fingerprint, "withdrawn": job.withdrawn,
            "committed": [[comm, choice, at] for comm, (choice, at) in
                          sorted(job.committed.items())],
            "decision": None if decision is None else {
                "number": decision.number, "choice": decision.choice,
                "activations": [[a.comm, a.at] for a in decision.activations],
                "hosts": sorted(decision.hosts), "commit": decision.commit,
                "acks": {h: p.value for h, p in sorted(decision.acks.items())},
            },
        }

    def restore(self, name: str, state: Mapping[str, Any], now: float) -> None:
        """Load a job's state after a restart. An arm in flight is cancelled: its
        outcome was never sent, and hosts that armed it must hear one."""
        job = self._job(name)
        job.number = int(state.get("number", 0))
        job.choice = str(state.get("choice", DEFAULT_CHOICE))
        job.severity = int(state.get("severity", 0))
        job.fingerprint = str(state.get("fingerprint", ""))
        job.withdrawn = bool(state.get("withdrawn", False))
        job.committed = {int(c): (str(ch), int(at)) for c, ch, at in state.get("committed", [])}
        raw = state.get("decision")
        if raw:
            decision = _Decision(
                int(raw["number"]), str(raw["choice"]),
                tuple(Activation(int(c), int(at)) for c, at in raw["activations"]),
                frozenset(raw["hosts"]), now, raw.get("commit"))
            if decision.commit is None:
                decision.commit, decision.reason = False, "the controller restarted while arming"
                decision.acks = {}
            else:
                decision.acks = {h: AckPhase(p) for h, p in raw.get("acks", {}).items()
                                 if p == AckPhase.RESOLVED.value}
            job.decision = decision
        job.dirty = True

    def take_dirty(self) -> tuple[list[str], list[str]]:
        """Jobs whose durable state changed (save them) and jobs gone (delete them)."""
        dirty = [name for name, job in sorted(self._jobs.items()) if job.dirty]
        for name in dirty:
            self._jobs[name].dirty = False
        gone, self._gone = sorted(self._gone), set()
        return dirty, gone

    # --- inputs ------------------------------------------------------------------------

    def set_hosts(self, name: str, hosts: Iterable[str] | None) -> None:
        """The hosts a job runs on (from its placement); only their reports count."""
        job = self._job(name)
        job.hosts = None if hosts is None else frozenset(hosts)
        if job.hosts is not None:
            for host in set(job.reports) - job.hosts:
                del job.reports[host]
            if job.decision is not None and job.decision.commit is not None:
                # A host that left the job has no ranks of it to resolve.
                job.decision.hosts &= job.hosts

    def report(self, host: str, report: TuningReport, now: float) -> bool:
        """Take a host's report; False if it is refused (then it counts for nothing).

        A wish that names no choice a declaration can give (or gives a severity that
        is not that choice's) is refused: the choice in force is what the job's tenant
        is told, so it must be one of the controller's own names, never a host's word.
        """
        job = self._job(report.job)
        if job.hosts is not None and host not in job.hosts:
            return False  # not (or no longer) one of the job's hosts
        if CHOICES.get(report.want) != report.severity:
            self.counters["refused_reports"] += 1
            return False
        job.reports[host] = _Report(report, now)
        return True

    def ack(self, host: str, ack: TuningAck, now: float) -> None:
        job = self._jobs.get(ack.job)
        decision = job.decision if job else None
        if job is None or decision is None or ack.decision != decision.number:
            return  # an old decision's (or a stranger's) answer
        if host not in decision.hosts:
            return
        if decision.commit is None and ack.phase in (AckPhase.ARMED, AckPhase.REFUSED):
            decision.acks[host] = ack.phase
            decision.ack_reports[host] = ack.comms
            if ack.phase is AckPhase.REFUSED and not decision.reason:
                decision.reason = f"host {host} refused: {ack.reason}"
        elif decision.commit is not None and ack.phase is AckPhase.RESOLVED:
            decision.acks[host] = ack.phase
            job.dirty = True
        if ack.comms:
            previous = job.reports.get(host)
            if previous is not None:
                job.reports[host] = _Report(TuningReport(
                    ack.job, previous.report.fingerprint, previous.report.want,
                    previous.report.severity, ack.comms), now)

    def reconnected(self, host: str) -> None:
        """A host (re)connected: resend it whatever it has not acknowledged, now."""
        for job in self._jobs.values():
            if job.decision is not None:
                job.decision.sent.pop(host, None)

    def withdraw(self, name: str) -> None:
        """The declaration is withdrawn: back to NCCL's own choices on every host,
        without hold or rate limit; the job is forgotten once that holds."""
        job = self._jobs.get(name)
        if job is not None:
            job.withdrawn = True
            job.dirty = True

    def forget(self, name: str) -> None:
        if self._jobs.pop(name, None) is not None:
            self._gone.add(name)

    def forget_host(self, host: str) -> None:
        for job in self._jobs.values():
            job.reports.pop(host, None)

    # --- outputs -----------------------------------------------------------------------

    def step(self, now: float,
             reachable: Container[str] | None = None) -> list[tuple[str, Message]]:
        """Messages to send now: (host, message). ``reachable``: the hosts heard from
        recently enough to get an arm now; None: every host. Arms, never outcomes, wait
        for every host of the job to be reachable (an outcome is always resent)."""
        self._reachable = reachable
        out: list[tuple[str, Message]] = []
        for name in sorted(self._jobs):
            job = self._jobs[name]
            self._detect(job, now)
            out += self._step_job(name, job, now)
            if job.withdrawn and job.decision is None and self._settled_default(job, now):
                self.forget(name)
        return out

    def next_deadline(self, now: float) -> float | None:
        """The earliest time after ``now`` (the last :meth:`step`) at which :meth:`step`
        or :meth:`health` may answer differently with no new report or acknowledgement;
        None: not before one comes. The controller sleeps until then, so every rule
        that reads the clock is here.

        A change in flight is resent ``resend`` after this step, times out
        ``arm_timeout`` after it was armed and reads as paused ``lead`` after it.
        Between changes, a back-off ends, a lower wish has lasted ``hold``, and a
        change leaves the last minute's count. A report goes stale just after
        ``report_ttl``: its host counts as silent, its records as gone.
        """
        settings = self.settings
        times = []
        for job in self._jobs.values():
            decision = job.decision
            if decision is not None:
                times.append(now + settings.resend)
                if decision.commit is None:
                    times.append(decision.armed_at + settings.arm_timeout)
                times.append(decision.armed_at + settings.lead)
            else:
                times.append(job.retry_at)
                if job.lower_since is not None:
                    times.append(job.lower_since + settings.hold)
                if job.changes:
                    times.append(job.changes[0] + 60.0)
            times.extend(math.nextafter(r.received + settings.report_ttl, math.inf)
                         for r in job.reports.values())
        return min((t for t in times if t > now), default=None)

    def health(self, name: str, now: float) -> tuple[str, TuningStatus]:
        """What the job's tenant may know: the choice in force and whether ranks agree.

        ``paused`` when a host reports waiting ranks, and also when a change has been in
        flight for longer than its lead with a host silent: that host's ranks have
        reached the switching point by then and wait, though it cannot say so.
        """
        job = self._jobs.get(name)
        if job is None:
            return DEFAULT_CHOICE, TuningStatus.STEADY
        if job.diverged:
            return job.choice, TuningStatus.DIVERGED
        waiting = any(c.waiting for r in job.reports.values() for c in r.report.comms)
        decision = job.decision
        if decision is not None and now - decision.armed_at >= self.settings.lead:
            wanted = None if decision.commit is None else AckPhase.RESOLVED
            waiting = waiting or any(decision.acks.get(h) is None or (
                wanted is not None and decision.acks[h] is not wanted) for h in decision.hosts)
        return job.choice, TuningStatus.PAUSED if waiting else TuningStatus.STEADY

    def status(self, name: str, now: float) -> dict[str, Any]:
        job = self._jobs.get(name)
        if job is None:
            return {}
        decision = job.decision
        return {
            "choice": job.choice,
            "decision": job.number,
            "severity": job.severity,
            "phase": "idle" if decision is None else (
                "arming" if decision.commit is None else
                "confirming" if decision.commit else "cancelling"),
            "in_flight": None if decision is None else {
                "number": decision.number, "choice": decision.choice,
                "acks": {h: p.value for h, p in sorted(decision.acks.items())},
                "waiting_for": sorted(decision.hosts - set(decision.acks)),
                "reason": decision.reason,
                "activations": [[f"{a.comm:#x}", a.at] for a in decision.activations]},
            "waiting": job.waiting,
            "health": self.health(name, now)[1].value,
            "diverged": {f"{c:#x}": why for c, why in sorted(job.diverged.items())},
            "committed": {f"{c:#x}": {"choice": ch, "at": at}
                          for c, (ch, at) in sorted(job.committed.items())},
            "reports": {h: {"want": r.report.want, "severity": r.report.severity,
                            "received": r.received, "communicators": len(r.report.comms)}
                        for h, r in sorted(job.reports.items())},
        }

    # --- the rules ---------------------------------------------------------------------

    def _fresh(self, job: _Job, now: float) -> dict[str, _Report]:
        return {h: r for h, r in sorted(job.reports.items())
                if now - r.received <= self.settings.report_ttl}

    def _detect(self, job: _Job, now: float) -> None:
        """Compare every host's switch records of each communicator."""
        fresh = self._fresh(job, now)
        records: dict[int, list[Record]] = {}
        flagged: dict[int, str] = {}
        for host, report in fresh.items():
            for comm in report.report.comms:
                group = records.setdefault(comm.comm, [])
                for state in (comm.ahead, comm.behind):
                    group.append(Record(state.switches, state.history, state.prev_history,
                                        state.last_switch, state.collectives))
                if comm.diverged:
                    flagged[comm.comm] = f"host {host} saw its own ranks disagree"
        alive = set(records)
        for comm in list(job.diverged):
            if comm not in alive:
                del job.diverged[comm]  # the communicator is gone
        for comm, group in records.items():
            why = flagged.get(comm) or disagreement(group)
            if why and comm not in job.diverged:
                job.diverged[comm] = why

    def _target(self, job: _Job, fresh: dict[str, _Report], now: float) -> tuple[int, str] | None:
        """The (severity, choice) to switch to now, if any, after hysteresis."""
        if job.withdrawn:
            return (0, DEFAULT_CHOICE) if job.choice != DEFAULT_CHOICE else None
        top = max(r.report.severity for r in fresh.values())
        want = (top, min(r.report.want for r in fresh.values() if r.report.severity == top))
        if top > job.severity:
            job.lower_since = None
            return want
        if top == job.severity:
            job.lower_since = None
            return want if want[1] != job.choice else None
        if job.lower_since is None:
            job.lower_since, job.lower_want = now, want
            return None
        job.lower_want = max(job.lower_want, want)
        return job.lower_want if now - job.lower_since >= self.settings.hold else None

    def _rate_limited(self, job: _Job, now: float) -> bool:
        while job.changes and now - job.changes[0] >= 60.0:
            job.changes.popleft()
        return len(job.changes) >= self.settings.max_decisions_per_minute

    def _comms(self, fresh: Mapping[str, _Report]) -> dict[int, list[tuple[str, CommReport]]]:
        comms: dict[int, list[tuple[str, CommReport]]] = {}
        for host, report in fresh.items():
            for comm in report.report.comms:
                comms.setdefault(comm.comm, []).append((host, comm))
        return comms

    def _not_ready(self, job: _Job, comm: int, views: list[tuple[str, CommReport]]) -> str:
        n_ranks = max(v.n_ranks for _, v in views)
        seen = sum(v.ranks for _, v in views)
        if seen != n_ranks:
            return f"{seen} of its {n_ranks} ranks reported"
        if comm in job.diverged:
            return f"its ranks disagree: {job.diverged[comm]}"
        for host, view in views:
            if view.pending:
                return f"host {host} still has a change pending"
            if view.waiting:
                return f"{view.waiting} rank(s) on host {host} wait"
            if view.refused:
                return f"a rank on host {host} refused the newest copy"
            if view.at and view.collectives_min <= view.at:
                return f"a rank on host {host} has not passed the switch at {view.at}"
        choices = {v.choice for _, v in views}
        if len(choices) > 1:
            return f"hosts follow different rules for it ({', '.join(sorted(choices))})"
        return ""

    def _activation(self, views: list[tuple[str, CommReport]], reports: Mapping[str, _Report],
                    now: float) -> int:
        """Past every host's projected position, with a lead."""
        projected, fastest = 0.0, 0.0
        for host, view in views:
            age = max(0.0, now - reports[host].received)
            projected = max(projected, view.collectives_max + view.per_second * age)
            fastest = max(fastest, view.per_second)
        lead = max(self.settings.margin, math.ceil(fastest * self.settings.lead))
        return min(MAX_AT, math.ceil(projected) + lead)

    def _settled_default(self, job: _Job, now: float) -> bool:
        fresh = self._fresh(job, now)
        return not fresh or all(c.choice in (DEFAULT_CHOICE, "") and not c.pending
                                for r in fresh.values() for c in r.report.comms)

    def _step_job(self, name: str, job: _Job, now: float) -> list[tuple[str, Message]]:
        decision = job.decision
        if decision is not None:
            return self._progress(name, job, decision, now)
        if now < job.retry_at:
            return []
        fresh = self._fresh(job, now)
        hosts = job.hosts if job.hosts is not None else frozenset(fresh)
        if not fresh or not hosts:
            return []
        silent = sorted(hosts - set(fresh))
        if silent:
            job.waiting = f"no recent report from host {silent[0]}"
            return []
        if self._reachable is not None:
            unreachable = sorted(h for h in hosts if h not in self._reachable)
            if unreachable:
                job.waiting = f"host {unreachable[0]} is unreachable"
                return []
        prints = {r.report.fingerprint for r in fresh.values()}
        if len(prints) > 1:
            job.waiting = "hosts derived different rules (declaration revisions differ)"
            return []
        job.fingerprint = prints.pop()
        target = self._target(job, fresh, now)
        goal = target[1] if target is not None else job.choice
        comms = self._comms(fresh)
        change: list[Activation] = []
        why = ""
        for comm, views in sorted(comms.items()):
            current = {v.choice or DEFAULT_CHOICE for _, v in views}
            if current == {goal}:
                continue
            reason = self._not_ready(job, comm, views)
            if reason:
                why = why or f"communicator {comm:#x}: {reason}"
                continue
            change.append(Activation(comm, self._activation(views, fresh, now)))
        changes_choice = target is not None and goal != job.choice
        if changes_choice and not job.withdrawn and self._rate_limited(job, now):
            job.waiting = f"{goal} waits: {len(job.changes)} changes in the last minute"
            return []
        if not change:
            if changes_choice and not comms:
                job.choice, job.severity = goal, target[0] if target else job.severity
                job.dirty = True
            job.waiting = why
            return []
        if changes_choice:
            job.changes.append(now)
        if target is not None:
            job.severity = target[0]
        job.number += 1
        job.decision = _Decision(job.number, goal, tuple(change[:MAX_ACTIVATIONS]), hosts, now)
        self.counters["armed"] += 1
        job.waiting = why
        job.dirty = True
        job.lower_since = None
        return self._send(name, job, job.decision, now)

    def _send(self, name: str, job: _Job, decision: _Decision,
              now: float) -> list[tuple[str, Message]]:
        out = []
        message = decision.message(name, job.fingerprint)
        wanted = AckPhase.RESOLVED if decision.commit is not None else None
        for host in sorted(decision.hosts):
            acked = decision.acks.get(host)
            if acked is not None and (wanted is None or acked is wanted):
                continue
            if now - decision.sent.get(host, float("-inf")) < self.settings.resend:
                continue
            decision.sent[host] = now
            out.append((host, message))
        return out

    def _progress(self, name: str, job: _Job, decision: _Decision,
                  now: float) -> list[tuple[str, Message]]:
        if decision.commit is None:
            refused = any(p is AckPhase.REFUSED for p in decision.acks.values())
            complete = set(decision.acks) >= decision.hosts
            late = now - decision.armed_at >= self.settings.arm_timeout
            if refused or late or complete:
                why = decision.reason
                if not why and late and not complete:
                    missing = sorted(decision.hosts - set(decision.acks))
                    why = f"host {missing[0]} did not answer within {self.settings.arm_timeout:g} s"
                if not why:
                    why = self._unaccounted(decision)
                decision.commit = not why
                decision.reason = why
                self.counters["confirmed" if decision.commit else "cancelled"] += 1
                decision.acks = {}
                decision.sent = {}
                job.dirty = True
            return self._send(name, job, decision, now)
        if set(decision.acks) >= decision.hosts:
            if decision.commit:
                for activation in decision.activations:
                    job.committed[activation.comm] = (decision.choice, activation.at)
                job.choice = decision.choice
                job.backoff = BACKOFF
            else:
                job.retry_at = now + job.backoff
                job.backoff = min(MAX_BACKOFF, job.backoff * 2)
            job.waiting = "" if decision.commit else f"cancelled: {decision.reason}"
            job.decision = None
            job.dirty = True
            return []
        return self._send(name, job, decision, now)

    @staticmethod
    def _unaccounted(decision: _Decision) -> str:
        """Every rank of every communicator must have armed: the hosts' counts add up."""
        for activation in decision.activations:
            views = [c for reports in decision.ack_reports.values() for c in reports
                     if c.comm == activation.comm]
            if not views:
                return f"no host armed communicator {activation.comm:#x}"
            n_ranks = max(v.n_ranks for v in views)
            seen = sum(v.ranks for v in views)
            if seen != n_ranks:
                return (f"communicator {activation.comm:#x}: {seen} of its {n_ranks} ranks "
                        "armed")
        return ""
