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

The change in flight moves through a table of phases (idle, arming, confirming or
cancelling, idle again: controller/agreementphases.py); the choosing and detection
rules are in controller/agreementrules.py, the per-job state and its stored form in
controller/agreementstate.py.

Pure: time is a parameter and nothing here does I/O; the controller stores
:meth:`snapshot` before sending what :meth:`step` returns.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from typing import Any

from controller import agreementrules as rules
from controller.agreementphases import RESOLVING, Event, Phase, answered, outcome
from controller.agreementstate import (
    BACKOFF,
    CHOICES,
    DEFAULT_CHOICE,
    MAX_ACTIVATIONS,
    MAX_BACKOFF,
    AgreementSettings,
    Decision,
    JobState,
    Report,
    load,
    stored,
)
from harmonaize.messages import (
    AckPhase,
    Activation,
    Message,
    TuningAck,
    TuningReport,
    TuningStatus,
)


class Agreement:
    def __init__(self, settings: AgreementSettings | None = None) -> None:
        self.settings = settings or AgreementSettings()
        self._jobs: dict[str, JobState] = {}
        #: Jobs forgotten since :meth:`take_dirty` (their stored state goes).
        self._gone: set[str] = set()
        #: Changes armed, confirmed and cancelled (for metrics).
        self.counters: Counter[str] = Counter()
        #: The hosts reachable at this step (None: every host).
        self._reachable: Container[str] | None = None

    def _job(self, name: str) -> JobState:
        job = self._jobs.get(name)
        if job is None:
            job = self._jobs[name] = JobState()
        return job

    # --- durable state -----------------------------------------------------------------

    def snapshot(self, name: str) -> dict[str, Any] | None:
        """What must survive a restart: numbers, the change in flight, what holds."""
        job = self._jobs.get(name)
        return None if job is None else stored(job)

    def restore(self, name: str, state: Mapping[str, Any], now: float) -> None:
        """Load a job's state after a restart. An arm in flight is cancelled: its
        outcome was never sent, and hosts that armed it must hear one."""
        load(self._job(name), state, now)

    def phase(self, name: str) -> Phase:
        """Where the job's change in flight stands."""
        job = self._jobs.get(name)
        return Phase.IDLE if job is None else job.phase

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
            if job.decision is not None and job.phase in RESOLVING:
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
        job.reports[host] = Report(report, now)
        return True

    def ack(self, host: str, ack: TuningAck, now: float) -> None:
        job = self._jobs.get(ack.job)
        decision = job.decision if job else None
        if job is None or decision is None or ack.decision != decision.number:
            return  # an old decision's (or a stranger's) answer
        if host not in decision.hosts:
            return
        if answered(job.phase, ack.phase):
            decision.acks[host] = ack.phase
            if job.phase is Phase.ARMING:
                decision.ack_reports[host] = ack.comms
                if ack.phase is AckPhase.REFUSED and not decision.reason:
                    decision.reason = f"host {host} refused: {ack.reason}"
            else:
                job.dirty = True  # an outcome's acknowledgement is stored
        if ack.comms:
            previous = job.reports.get(host)
            if previous is not None:
                job.reports[host] = Report(TuningReport(
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
            rules.detect(self.settings, job, now)
            out += self._step_job(name, job, now)
            if (job.withdrawn and job.decision is None
                    and rules.settled_default(self.settings, job, now)):
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
                if job.phase is Phase.ARMING:
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
            waiting = waiting or not all(answered(job.phase, decision.acks.get(h))
                                         for h in decision.hosts)
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
            "phase": job.phase.value,
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

    # --- the protocol ------------------------------------------------------------------

    def _step_job(self, name: str, job: JobState, now: float) -> list[tuple[str, Message]]:
        decision = job.decision
        if decision is not None:
            return self._progress(name, job, decision, now)
        if now < job.retry_at:
            return []
        fresh = rules.fresh(self.settings, job, now)
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
        target = rules.target(self.settings, job, fresh, now)
        goal = target[1] if target is not None else job.choice
        comms = rules.by_comm(fresh)
        change: list[Activation] = []
        why = ""
        for comm, views in sorted(comms.items()):
            current = {v.choice or DEFAULT_CHOICE for _, v in views}
            if current == {goal}:
                continue
            reason = rules.not_ready(job, comm, views)
            if reason:
                why = why or f"communicator {comm:#x}: {reason}"
                continue
            change.append(Activation(comm, rules.activation(self.settings, views, fresh, now)))
        changes_choice = target is not None and goal != job.choice
        if changes_choice and not job.withdrawn and rules.rate_limited(self.settings, job, now):
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
        job.decision = Decision(job.number, goal, tuple(change[:MAX_ACTIVATIONS]), hosts, now)
        job.move(Event.ARM)
        self.counters["armed"] += 1
        job.waiting = why
        job.dirty = True
        job.lower_since = None
        return self._send(name, job, job.decision, now)

    def _send(self, name: str, job: JobState, decision: Decision,
              now: float) -> list[tuple[str, Message]]:
        out = []
        message = decision.message(name, job.fingerprint, job.phase)
        for host in sorted(decision.hosts):
            acked = decision.acks.get(host)
            if answered(job.phase, acked):
                continue
            if now - decision.sent.get(host, float("-inf")) < self.settings.resend:
                continue
            decision.sent[host] = now
            out.append((host, message))
        return out

    def _progress(self, name: str, job: JobState, decision: Decision,
                  now: float) -> list[tuple[str, Message]]:
        if job.phase is Phase.ARMING:
            refused = any(p is AckPhase.REFUSED for p in decision.acks.values())
            complete = set(decision.acks) >= decision.hosts
            late = now - decision.armed_at >= self.settings.arm_timeout
            if refused or late or complete:
                why = decision.reason
                if not why and late and not complete:
                    missing = sorted(decision.hosts - set(decision.acks))
                    why = f"host {missing[0]} did not answer within {self.settings.arm_timeout:g} s"
                if not why:
                    why = rules.unaccounted(decision)
                decision.reason = why
                job.move(outcome(why))
                self.counters["cancelled" if why else "confirmed"] += 1
                decision.acks = {}
                decision.sent = {}
                job.dirty = True
            return self._send(name, job, decision, now)
        if set(decision.acks) >= decision.hosts:
            confirmed = job.phase is Phase.CONFIRMING
            if confirmed:
                for activation in decision.activations:
                    job.committed[activation.comm] = (decision.choice, activation.at)
                job.choice = decision.choice
                job.backoff = BACKOFF
            else:
                job.retry_at = now + job.backoff
                job.backoff = min(MAX_BACKOFF, job.backoff * 2)
            job.waiting = "" if confirmed else f"cancelled: {decision.reason}"
            job.move(Event.RESOLVED)
            job.decision = None
            job.dirty = True
            return []
        return self._send(name, job, decision, now)
