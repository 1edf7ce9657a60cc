"""Job health over the real tuner plugin's stats files, written by real stand-in rank
processes (one process per rank, the launcher's ``RANK`` in its environment).

The stand-ins are not coupled (each issues collectives at its own pace), so a rank's
fellows are stopped once it is behind, as NCCL ranks block in the collective it never
issues; the stopped or killed rank is the one behind, and the one named.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gpu.interface import JobResolver
from agent.jobhealth.metrics import families
from agent.jobhealth.service import JobHealthService
from agent.jobhealth.settings import JobHealthSection
from agent.links.settings import LinksSection
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import Cause, Finding, JobDeclaration, JobRankProgress, ProcessState
from testbed.ranks import RankKit, RankProcess, stop
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root
from tests.daemons import wait_until

pytestmark = [pytest.mark.jobhealth, needs_root]

JOB = "train-hang"
COMM = 0x4A4E0000000000C1


class Host:
    """The tuning service reading the stats, job health judging them, on a test clock."""

    def __init__(self, directory: Path) -> None:
        self.tuning = TuningService(TuningSection(policy_dir=str(directory), htb=False),
                                    LinksSection(), publish=lambda message: None)
        self.tuning.start(0.0)
        self.tuning.declare(JobDeclaration(JOB, revision=1), 0.0)
        self.sent: list[JobRankProgress] = []
        self.health = JobHealthService(
            JobHealthSection(), publish=self.sent.append,  # type: ignore[arg-type]
            resolver=JobResolver("/proc", "HARMONAIZE_JOB", "", ("RANK",)))
        self.now = 0.0

    def tick(self, seconds: float = 0.1) -> None:
        self.now += seconds
        self.tuning.step(link_sample(0), link_judgements(0), self.now)
        self.health.step(self.tuning, None, (), (), self.now)

    def counts(self) -> dict[str, int]:
        comm = self.health.engine.jobs[JOB].comms[COMM]
        return {r.rank: r.collectives for r in comm.ranks.values()}


@pytest.fixture
def ranks(workdir: Path) -> Iterator[tuple[Host, list[RankProcess]]]:
    directory = workdir / "tuner"
    host = Host(directory)
    with RankKit() as kit:
        started = [kit.start(job=JOB, directory=directory, comm=COMM, n_ranks=3, n_nodes=1,
                             rate=200, env={"RANK": str(r)}) for r in range(3)]
        try:
            yield host, started
        finally:
            for rank in started:
                if rank.proc.poll() is None:
                    os.kill(rank.proc.pid, signal.SIGCONT)
            stop(started)


def freeze_behind(host: Host, started: list[RankProcess], victim: int) -> None:
    """Once ``victim`` is behind its fellows, stop them too (they would wait for it)."""
    def ahead(index: int) -> bool:
        host.tick()
        return host.counts()[str(index)] > host.counts().get(str(victim), 0) + 10

    for index, rank in enumerate(started):
        if index != victim:
            wait_until(lambda: ahead(index), timeout=30,  # noqa: B023 (called at once)
                       what="the fellows ahead")
            os.kill(rank.proc.pid, signal.SIGSTOP)
    previous: dict[str, int] = {}

    def settled() -> bool:
        nonlocal previous
        host.tick()
        now = host.counts()
        same, previous = now == previous, now
        return same

    wait_until(settled, timeout=30, what="counts frozen")


def test_item3_a_sigstopped_rank_is_a_local_hang_published_by_its_rank(ranks) -> None:
    host, started = ranks
    wait_until(lambda: host.tick() or (JOB in host.health.engine.jobs
                                       and len(host.counts()) == 3), timeout=30,
               what="three ranks counted")
    os.kill(started[1].proc.pid, signal.SIGSTOP)
    freeze_behind(host, started, victim=1)
    for _ in range(35):
        host.tick()
    verdict = host.health.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
    assert [r.rank for r in verdict.ranks] == ["1"]
    assert verdict.cause is Cause.PROCESS_NOT_RUNNING
    report = next(m for m in reversed(host.sent) if m.comms[0].finding is Finding.HANG)
    (comm,) = report.comms
    # the wire carries the id's low 62 bits
    assert (comm.comm, comm.n_ranks, comm.ranks_here) == (COMM & ((1 << 62) - 1), 3, 3)
    assert comm.ranks[0].rank == "1" and comm.ranks[0].process is ProcessState.STOPPED
    assert comm.collectives_min == host.counts()["1"] < comm.collectives_max
    # Operators see it in the metrics (by finding and cause: no job or rank label) ...
    standing, found, _ = families("harmonaize_agent", host.health)
    key = (("cause", "process-not-running"), ("finding", "hang"))
    assert dict(standing.samples)[key] == 1 and dict(found.samples)[key] == 1
    # ... and the laggard with its pid; it moves again: the finding is withdrawn.
    view = host.health.view(host.now)["jobs"][0]["comms"][0]
    assert view["laggards"][0]["pid"] == started[1].proc.pid
    for rank in started:
        os.kill(rank.proc.pid, signal.SIGCONT)
    wait_until(lambda: host.tick() or host.health.engine.judge.verdict(JOB, COMM) is None,
               timeout=30, what="the hang withdrawn")
    assert host.sent[-1].comms[0].finding is not Finding.HANG
    assert dict(families("harmonaize_agent", host.health)[0].samples)[key] == 0


def test_item1_a_sigkilled_rank_is_named_process_exited(ranks) -> None:
    host, started = ranks
    wait_until(lambda: host.tick() or (JOB in host.health.engine.jobs
                                       and len(host.counts()) == 3), timeout=30,
               what="three ranks counted")
    started[2].proc.kill()
    started[2].proc.wait()
    freeze_behind(host, started, victim=2)
    for _ in range(35):
        host.tick()
    verdict = host.health.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
    assert [(r.rank, r.cause) for r in verdict.ranks] == [("2", Cause.PROCESS_EXITED)]
    comm = host.sent[-1].comms[0]
    assert comm.ranks[0].rank == "2" and comm.ranks[0].process is ProcessState.EXITED
