"""Job health's sans-I/O engine: each pass's reading of the local ranks in, the judge's
verdict changes and the reports to the controller out, with a next deadline.

Per communicator (job, NCCL id) it keeps every local rank by process (pid and start
time): its launcher's name, its count, its process state and what the host found at
fault for it. A rank whose process exited stays, as ``exited`` at its last count, while
the communicator has other ranks here (so a killed rank is named); a communicator with
no live rank left, and every communicator of a job that ended, is forgotten.

``still_for`` is the time since any local rank's count changed, on the agent's clock.
The judge (:mod:`harmonaize.progress`, the same one the controller runs across hosts)
sees the host's own view, read at one instant (``simultaneous``). A communicator is
judged when it stops or starts moving, when a rank's process or cause changes, at its
next threshold, and, while it moves, every ``judge_interval`` (for stragglers): bounded
work however many ranks a job has.

The network is at fault for a communicator's ranks when a data link is down or erroring
(the links domain's held levels, for every communicator), or, once it has been still for
``hang_after``, when a data link has kept retransmitting since it went still
(:mod:`agent.jobhealth.retransmits`: a dead path behind a link that looks fine). A
moving communicator (a straggler's) is never judged from retransmissions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.jobhealth.retransmits import RetransmitWatch
from agent.jobhealth.settings import JobHealthSection
from agent.jobhealth.types import (
    CommState,
    HostReading,
    JobReading,
    JobState,
    RankReading,
    RankState,
)
from harmonaize.messages.jobhealth import (
    Cause,
    CommProgress,
    Finding,
    JobRankProgress,
    ProcessState,
    RankProgress,
)
from harmonaize.progress import NOT_RUNNING, Change, CommSample, ProgressJudge, RankSample
from harmonaize.switches import WIRE_MASK

MAX_STILL = 1e9
MAX_COUNT = 2**62


def cause_of(state: ProcessState, gpu_fault: bool, network: bool) -> Cause:
    """What the host knows of a rank, the most specific first."""
    if state is ProcessState.EXITED:
        return Cause.PROCESS_EXITED
    if state in NOT_RUNNING:
        return Cause.PROCESS_NOT_RUNNING
    if gpu_fault:
        return Cause.GPU_FAULT
    if network:
        return Cause.NETWORK
    return Cause.UNKNOWN


@dataclass
class EngineStep:
    reports: list[JobRankProgress] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)


class JobHealthEngine:
    def __init__(self, cfg: JobHealthSection) -> None:
        self.cfg = cfg
        self.judge = ProgressJudge(cfg.progress())
        self.jobs: dict[str, JobState] = {}
        self.network = False
        self.retransmits = RetransmitWatch(cfg.retransmit_window, cfg.retransmit_segments)
        #: Dead paths by the time a communicator went still, within one pass (the
        #: communicators of one job mostly stopped at the same pass).
        self._dead: dict[float, tuple[str, ...]] = {}
        #: Verdicts that became true, by (finding, cause), since the start.
        self.found: Counter[tuple[str, str]] = Counter()

    def configure(self, cfg: JobHealthSection) -> None:
        """A reload: new thresholds; what the judge holds is judged anew."""
        self.cfg = cfg
        self.judge.settings = cfg.progress()
        self.retransmits.window = cfg.retransmit_window
        self.retransmits.segments = cfg.retransmit_segments
        for job in self.jobs.values():
            for comm in job.comms.values():
                comm.dirty = True

    # --- each pass ----------------------------------------------------------------

    def step(self, reading: HostReading, now: float) -> EngineStep:
        out = EngineStep()
        network_changed = reading.network != self.network
        self.network = reading.network
        self.retransmits.observe(reading.retransmits, now)
        self._dead = {}
        seen = {job.job for job in reading.jobs}
        for name in [n for n in self.jobs if n not in seen]:
            out.changes += self.judge.drop((name, c) for c in self.jobs.pop(name).comms)
        for job_reading in reading.jobs:
            self._job(job_reading, now, network_changed, out)
        # Retransmissions matter from the stillest communicator's standstill on.
        self.retransmits.forget_before(min(
            (c.moved_at for j in self.jobs.values() for c in j.comms.values()), default=now))
        for change in out.changes:
            if change.active:
                self.found[(change.verdict.finding.value, change.verdict.cause.value)] += 1
        return out

    def _job(self, reading: JobReading, now: float, network_changed: bool,
             out: EngineStep) -> None:
        job = self.jobs.setdefault(reading.job, JobState())
        if job.gpu_fault != reading.gpu_fault or network_changed:
            for comm in job.comms.values():
                comm.dirty = True
        job.gpu_fault, job.gpu_busy = reading.gpu_fault, reading.gpu_busy
        present = {c.comm: c for c in reading.comms}
        changed = False
        for comm_id in set(job.comms) | set(present):
            got = present.get(comm_id)
            state = job.comms.get(comm_id)
            if state is None:
                assert got is not None
                state = job.comms[comm_id] = CommState(reading.job, comm_id, got.n_ranks,
                                                       moved_at=now)
                changed = True
            if got is not None:
                state.n_ranks = got.n_ranks
            self._update(state, got.ranks if got is not None else (), reading, now)
            if not any(r.state is not ProcessState.EXITED for r in state.ranks.values()):
                del job.comms[comm_id]
                out.changes += self.judge.drop([(reading.job, comm_id)])
                changed = True
                continue
            if self._due(state, now):
                out.changes += self._judge(state, job, now)
                changed |= self._resign(state)
        if not job.comms:
            del self.jobs[reading.job]
            return
        if changed or now >= job.report_at:
            job.report_at = now + self.cfg.report_interval
            out.reports.append(self.report(reading.job, now))

    def _update(self, state: CommState, ranks: Iterable[RankReading], reading: JobReading,
                now: float) -> None:
        moved = False
        live: set[tuple[int, int]] = set()
        for r in ranks:
            live.add(r.process)
            known = state.ranks.get(r.process)
            if known is None:
                state.ranks[r.process] = RankState(r.rank, r.process[0], r.collectives,
                                                   r.state, r.gpu_fault)
                moved = state.dirty = True
                continue
            if known.collectives != r.collectives:
                known.collectives = r.collectives
                moved = True
            if (known.state, known.gpu_fault, known.rank) != (r.state, r.gpu_fault, r.rank):
                known.state, known.gpu_fault, known.rank = r.state, r.gpu_fault, r.rank
                state.dirty = True
        for key in [k for k in state.ranks if k not in live]:
            known = state.ranks[key]
            if known.state is ProcessState.EXITED:
                continue
            if key in reading.exited:
                known.state = ProcessState.EXITED  # kept at its last count: it is named
            else:
                del state.ranks[key]  # its communicator ended in a live process
            state.dirty = True
        if moved:
            state.moved_at = now

    def _dead_paths(self, state: CommState, now: float) -> tuple[str, ...]:
        """The data links retransmitting on a dead path under ``state`` (only once it
        has been still for ``hang_after``: a moving one's are a busy link's losses)."""
        if now - state.moved_at < self.cfg.hang_after:
            return ()
        found = self._dead.get(state.moved_at)
        if found is None:
            found = self._dead[state.moved_at] = self.retransmits.dead_paths(
                state.moved_at, now)
        return found

    def _due(self, state: CommState, now: float) -> bool:
        still = now > state.moved_at
        if still != state.still or state.dirty:
            return True
        if self._dead_paths(state, now) != state.dead_paths:
            return True
        if still:
            for threshold in (self.cfg.hang_after, self.cfg.stall_after):
                if state.judged_at < state.moved_at + threshold <= now:
                    return True
            return False
        return now - state.judged_at >= self.cfg.judge_interval

    def _judge(self, state: CommState, job: JobState, now: float) -> list[Change]:
        state.judged_at = now
        state.dirty = False
        state.still = now > state.moved_at
        state.dead_paths = self._dead_paths(state, now)
        network = self.network or bool(state.dead_paths)
        for rank in state.ranks.values():
            rank.cause = cause_of(rank.state, rank.gpu_fault, network)
        fault = Cause.GPU_FAULT if job.gpu_fault else Cause.NETWORK if network else None
        sample = CommSample(
            state.job, state.comm, state.n_ranks,
            tuple(RankSample(r.rank, r.collectives, r.state, r.cause)
                  for r in state.ranks.values()),
            now - state.moved_at, fault, simultaneous=True)
        return self.judge.step([sample], now)

    def _resign(self, state: CommState) -> bool:
        """Whether what must be reported at once changed: the still level, the finding,
        and while still, every rank's count, process and cause."""
        verdict = self.judge.verdict(state.job, state.comm)
        still = state.judged_at - state.moved_at
        level = 2 if still >= self.cfg.stall_after else 1 if still >= self.cfg.hang_after else 0
        ranks: tuple[object, ...] = ()
        if level:
            ranks = tuple(sorted((r.rank, r.collectives, r.state.value, r.cause.value)
                                 for r in state.ranks.values()))
        signature = (level, verdict.identity if verdict else None, ranks)
        if signature == state.signature:
            return False
        state.signature = signature
        return True

    # --- what it says -------------------------------------------------------------

    def verdict_of(self, state: CommState) -> tuple[Finding, Cause]:
        verdict = self.judge.verdict(state.job, state.comm)
        return (verdict.finding, verdict.cause) if verdict else (Finding.MOVING, Cause.UNKNOWN)

    def behind_first(self, state: CommState) -> list[RankState]:
        return sorted(state.ranks.values(), key=lambda r: (r.collectives, r.rank, r.pid))

    def report(self, job: str, now: float) -> JobRankProgress:
        """The job's communicators here, those with a finding then the stillest first."""
        comms = sorted(self.jobs[job].comms.values(), key=lambda c: (
            self.judge.verdict(c.job, c.comm) is None, c.moved_at, c.comm))
        busy = self.jobs[job].gpu_busy
        return JobRankProgress(job, tuple(
            self._comm(c, now, busy) for c in comms[:self.cfg.comms_per_job]),
            interval=self.cfg.report_interval)

    def _comm(self, state: CommState, now: float, busy: float | None) -> CommProgress:
        finding, cause = self.verdict_of(state)
        ranks = self.behind_first(state)
        counts = [min(r.collectives, MAX_COUNT) for r in ranks]
        still = min(max(now - state.moved_at, 0.0), MAX_STILL)
        # A standstill shorter than hang_after goes out as none: its end is never reported
        # (only crossing a threshold, and moving after one, are), so the controller, which
        # counts a reported standstill on until the next report, would otherwise take a
        # slow step's wait between two collectives for a hang across hosts.
        still = still if still >= self.cfg.hang_after else 0.0
        return CommProgress(
            # NCCL's ids are random 64-bit values; the wire carries their low 62 bits,
            # as the tuning reports do, so the controller matches the two.
            comm=state.comm & WIRE_MASK, n_ranks=state.n_ranks, ranks_here=len(ranks),
            collectives_min=min(counts), collectives_max=max(counts),
            still_for=round(still, 3),
            finding=finding, cause=cause,
            ranks=tuple(RankProgress(r.rank, min(r.collectives, MAX_COUNT), r.state, r.cause)
                        for r in ranks[:self.cfg.ranks_per_comm]),
            gpu_busy=None if busy is None else max(0.0, min(100.0, busy)))

    def next_deadline(self) -> float | None:
        """When time alone would change what this engine says: a threshold a still
        communicator crosses, its dead path's retransmissions lapsing, or a job's next
        report. (A moving communicator is judged at the agent's passes, every
        ``judge_interval``.)"""
        times = []
        for job in self.jobs.values():
            times.append(job.report_at)
            for comm in job.comms.values():
                if not comm.still:
                    continue
                if comm.dead_paths:
                    lapse = self.retransmits.lapses_at(comm.dead_paths, comm.moved_at)
                    if lapse is not None:
                        times.append(lapse)
                for threshold in (self.cfg.hang_after, self.cfg.stall_after):
                    if comm.moved_at + threshold > comm.judged_at:
                        times.append(comm.moved_at + threshold)
                        break
        return min(times, default=None)
