"""The controller core's handling of jobs' health (see controller/core.py and
controller/jobhealth.py): hosts' reports of their ranks' progress and their application
XIDs in, the job's owner told what the controller itself concluded.

What a tenant receives is built here from the controller's own state (invariant 3): a
:class:`JobProgress` names the placement's members and a coarse cause, at the
controller's clock; an :class:`ApplicationXid` carries the fault class of the
controller's own table, the job's members on the reporting host and the controller's
time. Stalls the job made itself (``paused``) reach operators only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from controller.corestate import CoreState
from controller.jobhealth import JobHealthBoard, Told
from controller.redactionconfig import Mode, job_topic
from harmonaize.messages import ApplicationXid, JobProgress, JobRankProgress
from harmonaize.messages.jobhealth import ProgressState

log = logging.getLogger("harmonaize.controller")

#: A tenant is told at most this many ranks per finding (the message's own cap).
MAX_RANKS_TOLD = 1024


class JobHealthPart(CoreState):
    """Ranks' progress in, findings out: a part of
    :class:`controller.core.ControllerCore`, which holds the state."""

    jobhealth: JobHealthBoard

    if TYPE_CHECKING:  # in controller/coreagents.py
        def _may_log(self, now: float) -> bool: ...

    def _job_health(self, now: float, wall: float) -> None:
        """Take the hosts' reports and XIDs of this batch; judge when due; stage what the
        owners are told."""
        reports, self.cluster.jobhealth = self.cluster.jobhealth, []
        placements = self.redactor.placements
        for host_id, body in reports:
            placement = placements.get(body.job)
            if isinstance(body, JobRankProgress):
                dropped = self.jobhealth.report(host_id, body, placement, now)
                if dropped and self._may_log(now):
                    log.warning("host %s: ranks' progress of job %.60r: %s dropped",
                                host_id, body.job, ", ".join(d.replace("_", " ")
                                                             for d in dropped))
                continue
            rebuilt = self.jobhealth.xid(host_id, body, placement, wall)
            if isinstance(rebuilt, str):
                if self._may_log(now):
                    log.warning("host %s: application XID %d for job %.60r not passed on "
                                "(%s)", host_id, body.xid, body.job, rebuilt.replace("_", " "))
                continue
            placement, xid = rebuilt
            log.info("job %s: application XID %d (%s) on host %s, ranks %s", xid.job, xid.xid,
                     xid.fault.value, host_id, ", ".join(xid.ranks) or "-")
            self._tell_owner(placement.tenant, xid.job, xid, wall)
        deadline = self.jobhealth.next_deadline()
        due = deadline is not None and now >= deadline
        if self.jobhealth.waiting or due:
            for change in self.jobhealth.step(placements, now, wall, due=due):
                self._tell_change(change, wall)

    def _job_health_due(self) -> float | None:
        return self.jobhealth.next_deadline()

    def _tell_change(self, change: Told, wall: float) -> None:
        verdict = change.verdict
        ranks = ", ".join(f"{r.rank}@{r.place}" for r in verdict.ranks[:16])
        log.log(logging.WARNING if change.active else logging.INFO,
                "job %s comm %d: %s (%s) %s at collective %d: %s", verdict.job, verdict.comm,
                verdict.finding.value, verdict.cause.value,
                "found" if change.active else "withdrawn", verdict.at_collective, ranks or "-")
        if not change.for_tenant:
            return
        body = JobProgress(
            verdict.job, verdict.comm, verdict.finding,
            ProgressState.ACTIVE if change.active else ProgressState.WITHDRAWN,
            tuple(sorted({r.rank for r in verdict.ranks}))[:MAX_RANKS_TOLD], verdict.cause,
            verdict.at_collective, change.since_wall)
        self._tell_owner(change.tenant, verdict.job, body, wall)

    def _tell_owner(self, tenant: str, job: str, body: JobProgress | ApplicationXid,
                    wall: float) -> None:
        if self.redactor.cfg.mode is Mode.NONE:
            return  # no feed at all (the simulator's comparison)
        self._held += self.feed.publish(body, job_topic(tenant, job), wall)
