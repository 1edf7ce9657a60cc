"""A job's progress across its hosts, judged at the controller: the hosts' reports of
their ranks merged into one view per communicator, and one :class:`ProgressJudge` over
them (harmonaize/progress.py, the engine the agents run on their own ranks).

Sans-I/O, time a parameter. What is kept comes only from hosts the job is placed on, and
of their ranks only the job's members placed on that host: a rank name another host or
another tenant's job uses is dropped and counted, never kept. A host silent for more than
twice its report interval no longer counts (the communicator's view is then partial, so
no stall is concluded from it). State is bounded: ``comms_per_job`` communicators per
job, ``hosts_per_comm`` reports per communicator, 256 ranks per report (the wire's cap).

Why the merged sample is not ``simultaneous``: each host reads its ranks' counts at its
own instant, so a rank behind another host's ranks while all move may only have been read
earlier; stragglers are judged where the counts are read together (on a host), and the
controller forwards a host's own straggler finding.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.types import Placement
from harmonaize.messages import ApplicationXid, JobProgress, JobRankProgress
from harmonaize.messages.jobhealth import Cause, CommProgress, Fault, Finding
from harmonaize.progress import (
    CommSample,
    ProgressJudge,
    ProgressSettings,
    RankSample,
    Verdict,
)

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.config import JobHealthSection

#: The XIDs a job's own process causes, and the fault class a tenant is told (after
#: NVIDIA's XID catalog): the controller's own table, whatever an agent called it.
APPLICATION_XIDS: Mapping[int, Fault] = {
    13: Fault.GRAPHICS_EXCEPTION,
    31: Fault.MEMORY_MANAGEMENT,
    43: Fault.STOPPED_PROCESSING,
    45: Fault.CLEANUP_AFTER_ERROR,
    94: Fault.CONTAINED_MEMORY_ERROR,
}
#: A host silent for more than this many of its report intervals is not counted on.
SILENT_INTERVALS = 2.0
#: ... and its report is forgotten after this many (its interval may be long).
FORGET_INTERVALS = 10.0
#: Seconds a restarted controller keeps a finding its owner was told, for the job's hosts
#: to report again (agents report every interval, 10 s by default): then it is judged
#: anew, and withdrawn if it no longer holds.
RESTORE_GRACE = 60.0
#: Hardware faults that name a stall's cause, the most specific first.
HARDWARE = (Cause.GPU_FAULT, Cause.NETWORK)


def settings_of(cfg: JobHealthSection) -> ProgressSettings:
    return ProgressSettings(cfg.hang_after, cfg.stall_after, cfg.straggler_margin,
                            cfg.straggler_window)


@dataclass(frozen=True)
class HostReport:
    """One host's latest word on one communicator (its ranks already filtered)."""

    host: str
    comm: CommProgress
    interval: float
    at: float

    def live(self, now: float) -> bool:
        return now - self.at <= SILENT_INTERVALS * self.interval


@dataclass(frozen=True)
class Told:
    """A verdict that began (``active``) or ended, for the job's owner and operators."""

    verdict: Verdict
    active: bool
    tenant: str
    #: When it began, on the controller's wall clock (what the tenant is told).
    since_wall: float

    @property
    def for_tenant(self) -> bool:
        """Stalls the job made itself (paused) are for operators only."""
        return not (self.verdict.finding is Finding.STALL and self.verdict.cause is Cause.PAUSED)


class JobHealthBoard:
    """Hosts' reports in, merged per communicator, judged; changes out."""

    def __init__(self, cfg: JobHealthSection) -> None:
        self.cfg = cfg
        self.judge = ProgressJudge(settings_of(cfg))
        self.reports: dict[tuple[str, int], dict[str, HostReport]] = {}
        #: What is in force per communicator (the judge's, or a host's straggler), the
        #: job's tenant and when it began (wall clock).
        self.current: dict[tuple[str, int], tuple[Verdict, str, float]] = {}
        self.counters: Counter[str] = Counter()
        #: The application XIDs passed on, by fault class.
        self.xids: Counter[str] = Counter()
        self.history: deque[dict[str, Any]] = deque(maxlen=cfg.history)
        #: Changes made outside a step (a job ended), told at the next one.
        self._pending: list[Told] = []
        self._dirty = False
        #: Communicators reported since the last step (a step that is not due judges
        #: only these: the judge keeps the others' verdicts and deadlines).
        self._reported: set[tuple[str, int]] = set()
        self._rejudge = False
        self._stepped_at = -float("inf")
        #: Findings told before a restart, kept until the hosts report again or then.
        self._restored: dict[tuple[str, int], float] = {}

    def configure(self, cfg: JobHealthSection) -> None:
        self.cfg = cfg
        self.judge.settings = settings_of(cfg)
        self.history = deque(self.history, maxlen=cfg.history)
        self._dirty = self._rejudge = True  # every communicator, under the new thresholds

    def restore(self, told: Iterable[tuple[str, JobProgress]],
                placements: Mapping[str, Placement], now: float) -> None:
        """Findings owners were told were active before a restart (from the feed log):
        held as in force, so that the same finding is not told twice and one that no
        longer holds is withdrawn (a job no longer placed for that owner: at once)."""
        for tenant, body in told:
            key = (body.job, body.comm)
            ranks = tuple(RankSample(r, body.at_collective) for r in body.ranks)
            verdict = Verdict(body.job, body.comm, body.finding, body.cause, ranks,
                              body.at_collective, now)
            self.current[key] = (verdict, tenant, body.since)
            placement = placements.get(body.job)
            if placement is None or placement.tenant != tenant:
                self.drop_job(body.job)
            else:
                self._restored[key] = now + RESTORE_GRACE

    # --- inputs -------------------------------------------------------------------------

    def report(self, host_id: str, body: JobRankProgress, placement: Placement | None,
               now: float) -> list[str]:
        """Keep a host's report of a job's communicators; what was dropped of it and why
        (each reason once), for the caller's one log line."""
        if placement is None:
            return self._refused("unplaced")
        here = {m.name for m in placement.members if m.host_id == host_id}
        if not here:
            return self._refused("not_placed_here")
        problems: set[str] = set()
        job = placement.job
        listed = {comm.comm for comm in body.comms}
        for key in [k for k in self.reports if k[0] == job and k[1] not in listed]:
            if self.reports[key].pop(host_id, None) is not None:  # destroyed on that host
                self._reported.add(key)
                self._dirty = True
        comms = {k[1] for k, hosts in self.reports.items() if k[0] == job and hosts}
        for comm in body.comms:
            ranks = tuple(r for r in comm.ranks if r.rank in here)
            if len(ranks) < len(comm.ranks):
                problems.add("rank_not_placed_here")
            if not ranks:
                continue  # nothing of the job's own: no state from it
            hosts = self.reports.setdefault((job, comm.comm), {})
            if comm.comm not in comms and len(comms) >= self.cfg.comms_per_job:
                problems.add("too_many_comms")
                continue
            if host_id not in hosts and len(hosts) >= self.cfg.hosts_per_comm:
                problems.add("too_many_hosts")
                continue
            comms.add(comm.comm)
            hosts[host_id] = HostReport(host_id, dataclasses.replace(comm, ranks=ranks),
                                        body.interval, now)
            self._reported.add((job, comm.comm))
            self._dirty = True
        for key in [k for k, hosts in self.reports.items() if not hosts]:
            del self.reports[key]
        for problem in problems:
            self.counters[problem] += 1
        self.counters["reports"] += 1
        return sorted(problems)

    def xid(self, host_id: str, body: ApplicationXid, placement: Placement | None,
            wall: float) -> tuple[Placement, ApplicationXid] | str:
        """A host's application XID rebuilt for the job's owner, or why not: the fault
        from the controller's own table, the ranks the job's members on that host, the
        time the controller's."""
        if placement is None:
            return self._refused("unplaced")[0]
        here = {m.name for m in placement.members if m.host_id == host_id}
        if not here:
            return self._refused("not_placed_here")[0]
        fault = APPLICATION_XIDS.get(body.xid)
        if fault is None:
            return self._refused("not_an_application_xid")[0]
        ranks = tuple(sorted(r for r in set(body.ranks) if r in here))
        if len(ranks) < len(set(body.ranks)):
            self.counters["rank_not_placed_here"] += 1
        self.xids[fault.value] += 1
        self.history.append({"at": round(wall, 3), "job": placement.job, "event": "xid",
                             "xid": body.xid, "fault": fault.value, "host": host_id,
                             "ranks": list(ranks), "teardown": body.teardown})
        return placement, ApplicationXid(placement.job, body.xid, fault, ranks,
                                         body.teardown, round(wall, 3))

    def drop_job(self, job: str) -> None:
        """The job's placement ended or changed: its communicators go, their verdicts are
        withdrawn at the next step."""
        keys = [k for k in set(self.reports) | set(self.current) | self.judge.keys()
                if k[0] == job]
        for key in keys:
            self.reports.pop(key, None)
            self._restored.pop(key, None)
        self.judge.drop(keys)
        for key in keys:
            held = self.current.pop(key, None)
            if held is not None:
                self._pending.append(Told(held[0], False, held[1], held[2]))
        self._dirty = self._dirty or bool(self._pending)

    # --- the judge ------------------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        """Whether reports or ended jobs wait for a step."""
        return self._dirty or bool(self._pending)

    def next_deadline(self) -> float | None:
        """When a step next has something to do unasked: the judge's next threshold, or
        a host falling silent (and, long after, its report being forgotten)."""
        times = [t for hosts in self.reports.values() for r in hosts.values()
                 for t in (r.at + SILENT_INTERVALS * r.interval,
                           r.at + FORGET_INTERVALS * r.interval) if t > self._stepped_at]
        times += [t for t in self._restored.values() if t > self._stepped_at]
        judged = self.judge.next_deadline()
        if judged is not None:
            times.append(judged)
        return min(times, default=None)

    def step(self, placements: Mapping[str, Placement], now: float, wall: float,
             *, due: bool = True) -> list[Told]:
        """Judge the communicators reported since the last step, and every one when a
        deadline is ``due``; what began or ended since the last step."""
        reported, self._reported = self._reported, set()
        due, self._rejudge = due or self._rejudge, False
        if due:
            self._stepped_at = now
        self._dirty = False
        told, self._pending = self._pending, []
        keys = [k for k in self.reports if due or k in reported]
        self.judge.step([self._sample(k, self.reports[k], now) for k in keys], now)
        for key in keys:
            hosts = self.reports[key]
            placement = placements.get(key[0])
            if placement is None:
                continue
            found = self.judge.verdict(*key) or self._forwarded(key, hosts, now)
            told += self._settle(key, found, placement.tenant, wall)
        for key in [k for k in self._restored if k in self.reports or self._restored[k] <= now]:
            del self._restored[key]  # its hosts report again, or they had their time
        for key in [k for k in self.current if k not in self.reports
                    and k not in self._restored]:
            verdict, tenant, since = self.current.pop(key)
            told.append(Told(verdict, False, tenant, since))
        if due:
            for hosts in self.reports.values():
                for host in [h for h, r in hosts.items()
                             if now - r.at >= FORGET_INTERVALS * r.interval]:
                    del hosts[host]
            for key in [k for k, hosts in self.reports.items() if not hosts]:
                del self.reports[key]
        self.judge.drop(self.judge.keys() - set(self.reports))
        for change in told:
            self._record(change, wall)
        return told

    def _sample(self, key: tuple[str, int], hosts: Mapping[str, HostReport],
                now: float) -> CommSample:
        live = [r for r in hosts.values() if r.live(now)]
        ranks = tuple(RankSample(p.rank, p.collectives, p.process, p.cause, place=r.host)
                      for r in live for p in r.comm.ranks)
        still = min((r.comm.still_for + (now - r.at) if r.comm.still_for > 0 else 0.0
                     for r in live), default=0.0)
        causes = {r.comm.cause for r in live} | {p.cause for p in ranks}
        fault = next((c for c in HARDWARE if c in causes), None)
        n_ranks = max(r.comm.n_ranks for r in hosts.values())
        return CommSample(key[0], key[1], n_ranks, ranks, still, fault, simultaneous=False)

    @staticmethod
    def _forwarded(key: tuple[str, int], hosts: Mapping[str, HostReport],
                   now: float) -> Verdict | None:
        """A host's own straggler finding (its counts were read at one instant)."""
        for report in sorted(hosts.values(), key=lambda r: r.host):
            comm = report.comm
            if not report.live(now) or comm.finding is not Finding.STRAGGLER:
                continue
            low = min(r.collectives for r in comm.ranks)
            named = tuple(RankSample(r.rank, r.collectives, r.process, r.cause,
                                     place=report.host)
                          for r in comm.ranks if r.collectives == low)
            return Verdict(key[0], key[1], Finding.STRAGGLER, comm.cause, named, low, now)
        return None

    def _settle(self, key: tuple[str, int], verdict: Verdict | None, tenant: str,
                wall: float) -> list[Told]:
        held = self.current.get(key)
        if held is not None and verdict is not None and held[0].identity == verdict.identity:
            return []  # the same finding: it keeps its first time
        out = []
        if held is not None:
            out.append(Told(held[0], False, held[1], held[2]))
            del self.current[key]
        if verdict is not None:
            self.current[key] = (verdict, tenant, round(wall, 3))
            out.append(Told(verdict, True, tenant, round(wall, 3)))
        return out

    def _record(self, change: Told, wall: float) -> None:
        verdict = change.verdict
        self.counters["active" if change.active else "withdrawn"] += 1
        self.history.append({
            "at": round(wall, 3), "job": verdict.job, "comm": verdict.comm,
            "event": verdict.finding.value, "state": "active" if change.active else "withdrawn",
            "cause": verdict.cause.value, "at_collective": verdict.at_collective,
            "ranks": [{"rank": r.rank, "host": r.place} for r in verdict.ranks],
            "tenant_told": change.for_tenant})

    def _refused(self, reason: str) -> list[str]:
        self.counters[reason] += 1
        return [reason]

    # --- operators ---------------------------------------------------------------------------

    def view(self, now: float) -> dict[str, Any]:
        """Findings in force, with hosts (operators may see them), and the recent history."""
        findings = []
        for (job, comm), (verdict, tenant, since) in sorted(self.current.items()):
            hosts = self.reports.get((job, comm), {})
            findings.append({
                "job": job, "tenant": tenant, "comm": comm, "finding": verdict.finding.value,
                "cause": verdict.cause.value, "at_collective": verdict.at_collective,
                "since": since, "tenant_told": Told(verdict, True, tenant, since).for_tenant,
                "ranks": [{"rank": r.rank, "host": r.place, "collectives": r.collectives,
                           "process": r.process.value, "cause": r.cause.value}
                          for r in verdict.ranks],
                "hosts": {h: {"age_seconds": round(now - r.at, 3), "live": r.live(now)}
                          for h, r in sorted(hosts.items())}})
        return {"findings": findings, "communicators": len(self.reports),
                "counters": dict(self.counters), "application_xids": dict(self.xids),
                "history": list(self.history)}
