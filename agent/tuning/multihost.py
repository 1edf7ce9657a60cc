"""The tuning loop's part for jobs spanning hosts: the controller's two phases.

The controller arms a decision on every host (:meth:`MultiHostSteps.arm`); each host
writes the armed entries, reads its ranks' fresh records and acknowledges or refuses
(:meth:`MultiHostSteps.acknowledge`); the controller then confirms or cancels
everywhere (:meth:`MultiHostSteps.resolve`). Between decisions each host reports where
its ranks stand (:meth:`MultiHostSteps.multi_step`). Each communicator's phase moves by
the table in :mod:`agent.tuning.phases`. Sans-I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from agent.plugin.layout import StatsSlot
from agent.tuning.entries import (
    Action,
    Entry,
    Publish,
    WritePolicy,
    cancelled,
    confirmed,
    wire_comm,
)
from agent.tuning.jobstate import JobState, LoopBase
from agent.tuning.phases import Event, Phase
from agent.tuning.policies import CHOICE_NAMES, DEFAULT
from agent.tuning.readiness import armed, by_wire, not_ready, unverified
from agent.tuning.reports import comm_reports, news
from harmonaize.messages import AckPhase, TuningAck, TuningArm, TuningReport, TuningResolve


class MultiHostSteps(LoopBase):
    def arm(self, message: TuningArm, now: float) -> list[Action]:
        """Phase one of a multi-host change. Returns the armed policy to write (then
        the ranks' fresh records decide the acknowledgement), or at once a refusal."""
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
        arming: dict[int, Entry] = {}
        for activation in message.activations:
            comm = by_wire(job, activation.comm)
            if comm is None:
                continue  # no rank of it here
            entry = job.entries.get(comm.comm_id)
            if entry is not None and entry.pending and entry.at == activation.at:
                arming[comm.comm_id] = dataclasses.replace(entry, decision=message.decision)
                continue  # armed already (a resent arm, or before a restart)
            why = not_ready(job, comm, activation.at)
            if why:
                return [self._refuse(job, message.decision, f"{comm.comm_id:#x}: {why}")]
            arming[comm.comm_id] = armed(job, comm, activation.at, choice,
                                         decision=message.decision)
        job.multi = True
        for comm_id, entry in arming.items():
            if self.move(job, comm_id, Event.ARM_AGREED) is Phase.AGREEING:
                job.entries[comm_id] = entry
        job.acking = message.decision
        self._record(job, now, "armed", (job.choice, choice.name),
                     f"decision {message.decision}",
                     activations=tuple((a.comm, a.at) for a in message.activations))
        return [WritePolicy(job.declaration.job, tuple(job.entries.values()))]

    def acknowledge(self, job: JobState, slots: Sequence[StatsSlot],
                    groups: Mapping[int, Sequence[StatsSlot]], now: float) -> Publish:
        """After the armed entries were written: acknowledge the decision if every
        communicator it armed here can take it, by its ranks' fresh records; else refuse."""
        agreeing = [comm_id for comm_id in job.entries
                    if (comm := job.comms.get(comm_id)) and comm.phase is Phase.AGREEING]
        why = ""
        for comm_id in agreeing:
            why = unverified(job, job.entries[comm_id], groups.get(comm_id, ()))
            if why:
                why = f"{comm_id:#x}: {why}"
                break
        for comm_id in agreeing:
            self.move(job, comm_id, Event.UNVERIFIED if why else Event.VERIFIED)
        self._observe_comms(job, slots, now)
        decision, job.acking = job.acking, 0
        return (self._refuse(job, decision, why) if why else
                self._ack(job, decision, AckPhase.ARMED, ""))

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
        event = Event.COMMIT if message.commit else Event.ABORT
        for entry in ours:
            phase = self.move(job, entry.comm_id, event)
            if phase is Phase.CONFIRMED:
                job.entries[entry.comm_id] = confirmed(entry)
            elif phase is Phase.CANCELLED:
                job.entries[entry.comm_id] = cancelled(entry)
            else:
                continue  # refused by the table: the entry stays as it is
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

    def multi_step(self, job: JobState, now: float) -> list[Action]:
        """A pass of a job spanning hosts: report where its ranks stand (when news, or
        every report interval); the controller decides every change."""
        desired = CHOICE_NAMES[job.desired_severity]
        job.waiting = "" if desired == job.choice else (
            f"wants {desired}: waiting for the controller to agree it with the other hosts")
        comms = comm_reports(job)
        state = (desired, tuple(news(c) for c in comms))
        if state == job.last_report and now - job.report_at < self.settings.report_interval:
            return []
        job.last_report, job.report_at = state, now
        return [Publish(TuningReport(job.declaration.job, job.derivation.fingerprint, desired,
                                     job.desired_severity, comms))]

    def _ack(self, job: JobState | str, decision: int, phase: AckPhase, reason: str) -> Publish:
        if isinstance(job, str):
            return Publish(TuningAck(job, decision, phase, reason[:1000]))
        job.acked = (max(job.acked[0], decision), phase)
        return Publish(TuningAck(job.declaration.job, decision, phase, reason[:1000],
                                 comm_reports(job)))

    def _refuse(self, job: JobState, decision: int, why: str) -> Publish:
        self._record(job, self._last_now(job), "refused", (job.choice, job.choice),
                     f"decision {decision}: {why}")
        return self._ack(job, decision, AckPhase.REFUSED, why)

    @staticmethod
    def _last_now(job: JobState) -> float:
        return job.last_step if job.last_step is not None else job.since

