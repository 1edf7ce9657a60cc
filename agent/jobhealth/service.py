"""Job health's I/O shell: the ranks' counts the tuning service read this pass, each
rank's process from /proc, the GPU and link domains' judgements, into the engine; its
reports to the controller out.

The stats files are a tenant's (invariant 5): a slot counts only when its process is
visible here, its start time known (a pid reused later is another process), and the
kernel ties it to the slot's job (:class:`JobResolver`, as the GPU domain resolves its
processes: the job's cgroup, or the job's Unix group backing its environment). Anything
else is not counted, with one line per process. New processes are resolved, and still
ranks' states read, within per-pass budgets, so a job of thousands of ranks costs
bounded time per pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.gpu.interface import GpuSample, GpuState, GpuView, JobResolver
from agent.jobhealth import views
from agent.jobhealth.engine import JobHealthEngine
from agent.jobhealth.procstate import read_stat
from agent.jobhealth.settings import JobHealthSection
from agent.jobhealth.types import CommReading, HostReading, JobReading, RankReading
from agent.links.interface import LinkLevels
from agent.tuning.interface import RanksRead, StatsSlots
from harmonaize.messages import Level, Message
from harmonaize.messages.jobhealth import ProcessState
from harmonaize.progress import Change

log = logging.getLogger("harmonaize.agent")

#: Seconds before a process the kernel did not tie to its job is looked at again (the
#: job's group may reach the host after its first ranks).
RETRY_REFUSED = 10.0
#: A still rank's process state is read at most this often (seconds): it matters at
#: ``hang_after``'s scale, and each read is a /proc file per rank.
STATE_EVERY = 0.5
OUT_OF_SERVICE = frozenset({GpuState.VALIDATING, GpuState.QUARANTINED, GpuState.LOST})


@dataclass
class Process:
    """A stats file's process (pid and tag) as this host resolved it."""

    pid: int
    start: int
    #: The job whose directory holds its stats file (the tenant's claim).
    claimed: str
    #: The job the kernel ties it to (None: none, or not the one its file is under).
    job: str | None
    rank: str
    state: ProcessState
    retry_at: float = float("inf")
    read_at: float = float("-inf")


def faulty_gpus(gpus: Iterable[GpuView]) -> set[int]:
    """GPUs with a fault: out of service, or a critical condition or an XID holding."""
    return {g.index for g in gpus if g.state in OUT_OF_SERVICE or any(
        c.status.value == "True" and (c.severity.value == "critical" or c.type == "Xid")
        for c in g.conditions)}


def network_faulty(links: Iterable[LinkLevels]) -> bool:
    """The host's data links (class ``data``): one down or erroring."""
    return any(link.link_class == "data" and (not link.up or link.errors is Level.HIGH)
               for link in links)


def data_retransmits(links: Iterable[LinkLevels]) -> tuple[tuple[str, float], ...]:
    """Each data link that is up, with its retransmitted segments per second: the
    engine judges whether they say a path under a still job is dead."""
    return tuple((link.name, link.retransmits_per_s) for link in links
                 if link.link_class == "data" and link.up)


class JobHealthService:
    def __init__(self, cfg: JobHealthSection, *, publish: Callable[[Message], None],
                 resolver: JobResolver, proc_root: str = "/proc") -> None:
        self.cfg = cfg
        self.publish = publish
        self.resolver = resolver
        self.proc_root = proc_root
        self.engine = JobHealthEngine(cfg)
        self.processes: dict[tuple[int, int], Process] = {}
        #: Per job, the processes counted at the last pass (to tell who exited).
        self._counted: dict[str, set[tuple[int, int]]] = {}
        #: Each slot's count at the last pass (pid, tag, communicator): unchanged ones
        #: are still, and their processes' states are read.
        self._counts: dict[tuple[int, int, int], int] = {}
        #: This pass's counts and (pid, tag) of the slots named.
        self._seen: dict[tuple[int, int, int], int] = {}
        self._present: set[tuple[int, int]] = set()
        #: Processes whose stats were not counted (the kernel did not tie them to the job).
        self.processes_refused: set[tuple[int, int]] = set()
        self.uncounted = 0
        #: Slots not counted at the last pass: their job is over ``ranks_per_job``.
        self.over_cap = 0
        self.reports = 0
        self._capped: set[str] = set()

    def configure(self, cfg: JobHealthSection) -> None:
        self.cfg = cfg
        self.engine.configure(cfg)

    def next_deadline(self) -> float | None:
        return self.engine.next_deadline()

    # --- each pass ----------------------------------------------------------------

    def step(self, ranks: RanksRead | None, gpu: GpuSample | None,
             gpus: Iterable[GpuView], links: Iterable[LinkLevels], now: float) -> None:
        """``ranks``: the tuning service, whose stats of this pass are judged (None:
        tuning is off, and no job's ranks are known here)."""
        stats: Mapping[str, StatsSlots] = ranks.stats if ranks is not None else {}
        faulty = faulty_gpus(gpus)
        budget = [self.cfg.resolves_per_pass, self.cfg.proc_reads_per_pass]
        # Cached /proc facts only for processes still counted: a pid seen anew is read anew.
        self.resolver.forget_except({p.pid for p in self.processes.values() if p.job})
        self._seen = {}
        self._present = set()
        self.over_cap = 0
        jobs = tuple(self._job(job, slots, gpu, faulty, budget=budget, now=now)
                     for job, slots in sorted(stats.items()))
        self._counts = self._seen
        self._forget({j.job for j in jobs})
        levels = tuple(links)
        result = self.engine.step(HostReading(jobs, network_faulty(levels),
                                              data_retransmits(levels)), now)
        for change in result.changes:
            self._journal(change)
        for report in result.reports:
            self.reports += 1
            self.publish(report)

    def _job(self, job: str, slots: StatsSlots, gpu: GpuSample | None, faulty: set[int],
             *, budget: list[int], now: float) -> JobReading:
        by_pid, job_gpus, busy = _gpus_of(job, gpu)
        comms: dict[int, tuple[int, list[RankReading]]] = {}
        counted: set[tuple[int, int]] = set()
        exited: set[tuple[int, int]] = set()
        ranks = 0
        for slot in slots:
            self._present.add((slot.pid, slot.tag))
            process = self._process(slot.pid, slot.tag, job, budget, now)
            if process is None or process.job != job:
                continue
            key = (slot.pid, slot.tag, slot.comm_id)
            still = self._counts.get(key) == slot.collectives
            self._seen[key] = slot.collectives
            if still and budget[1] > 0 and process.state is not ProcessState.EXITED \
                    and now - process.read_at >= STATE_EVERY:
                budget[1] -= 1
                process.read_at = now
                self._refresh(process)
            if process.state is ProcessState.EXITED:
                exited.add((process.pid, process.start))
                continue
            if ranks >= self.cfg.ranks_per_job:
                self._cap(job, len(slots))
                continue
            ranks += 1
            counted.add((slot.pid, slot.tag))
            gpu_index = by_pid.get(slot.pid)
            comms.setdefault(slot.comm_id, (slot.n_ranks, []))[1].append(RankReading(
                (process.pid, process.start), process.rank, slot.collectives, process.state,
                gpu_index in faulty))
        for gone in self._counted.get(job, set()) - counted:
            process = self.processes.get(gone)
            if process is not None and process.state is not ProcessState.EXITED:
                self._refresh(process)  # its slots went: did the process go?
            if process is not None and process.state in (ProcessState.EXITED,
                                                         ProcessState.ZOMBIE):
                exited.add((process.pid, process.start))  # a zombie's slots went: it died
        self._counted[job] = counted
        return JobReading(job, tuple(CommReading(c, n, tuple(r))
                                     for c, (n, r) in sorted(comms.items())),
                          frozenset(exited), bool(job_gpus & faulty), busy)

    def _process(self, pid: int, tag: int, job: str, budget: list[int],
                 now: float) -> Process | None:
        """The slot's process if the kernel ties it to ``job`` (else its record, whose
        ``job`` is None: looked at again after ``RETRY_REFUSED``, one line the first time)."""
        key = (pid, tag)
        process = self.processes.get(key)
        if process is not None and (process.job is not None or now < process.retry_at):
            return process
        if budget[0] <= 0:
            return None  # resolved at a next pass
        budget[0] -= 1
        stat = read_stat(pid, self.proc_root)
        refused_before = self.resolver.refused
        ref = self.resolver.resolve(pid) if stat is not None else None
        process = Process(pid, stat.start_time if stat else -1, job, None, f"pid-{pid}",
                          stat.state if stat else ProcessState.UNKNOWN)
        self.processes[key] = process
        if stat is None or ref is None or ref.job != job:
            process.retry_at = now + RETRY_REFUSED
            if stat is not None and key not in self.processes_refused:
                self.processes_refused.add(key)
                self.uncounted += 1
                if self.resolver.refused == refused_before:  # else the resolver said why
                    log.warning("job %s: stats of process %d not counted: the kernel does "
                                "not tie it to the job (%s)", job, pid,
                                f"it is job {ref.job}'s" if ref else "no job backed")
            return process
        process.job, process.rank = job, ref.rank or f"pid-{pid}"
        process.retry_at = float("inf")
        return process

    def _refresh(self, process: Process) -> None:
        stat = read_stat(process.pid, self.proc_root)
        if stat is None or stat.start_time != process.start:
            process.state = ProcessState.EXITED  # gone, or its pid is another process's now
        else:
            process.state = stat.state

    def _cap(self, job: str, slots: int) -> None:
        self.over_cap += 1
        if job not in self._capped:
            self._capped.add(job)
            log.warning("job %s: %d ranks' stats here, over jobhealth.ranks_per_job (%d): "
                        "the others are not counted", job, slots, self.cfg.ranks_per_job)

    def _forget(self, jobs: set[str]) -> None:
        """Processes and counts of jobs no longer tracked: the job ended here."""
        for job in set(self._counted) - jobs:
            del self._counted[job]
        self._capped &= jobs
        # An exited process is the engine's to remember; its record stays while a file
        # still names it, so that a later process with its pid is not taken for it.
        for key in [k for k, p in self.processes.items() if p.claimed not in jobs or (
                p.state is ProcessState.EXITED and k not in self._present)]:
            del self.processes[key]
        self.processes_refused &= set(self.processes)

    def _journal(self, change: Change) -> None:
        v = change.verdict
        ranks = ", ".join(r.rank for r in v.ranks[:16]) + (" ..." if len(v.ranks) > 16 else "")
        if change.active:
            log.warning("job %s: communicator %x: %s (%s) at collective %d: ranks %s",
                        v.job, v.comm, v.finding.value, v.cause.value, v.at_collective, ranks)
        else:
            log.info("job %s: communicator %x: %s (%s) over", v.job, v.comm,
                     v.finding.value, v.cause.value)

    # --- what operators see --------------------------------------------------------

    def view(self, now: float) -> dict[str, Any]:
        return views.jobs_view(self, now)


def _gpus_of(job: str, sample: GpuSample | None) -> tuple[dict[int, int], set[int],
                                                          float | None]:
    """Which GPU each process uses, the job's GPUs, and their mean utilisation."""
    if sample is None:
        return {}, set(), None
    mine = {index for index, refs in sample.jobs.items() if any(r.job == job for r in refs)}
    by_pid: dict[int, int] = {}
    utils = []
    for snap in sample.gpus:
        t = snap.telemetry
        if t is None:
            continue
        for p in t.processes:
            by_pid.setdefault(p.pid, snap.identity.index)
        if snap.identity.index in mine and t.util_gpu is not None:
            utils.append(float(t.util_gpu))
    return by_pid, mine, sum(utils) / len(utils) if utils else None
