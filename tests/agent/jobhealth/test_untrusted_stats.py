"""Bad input to job health: stats a tenant forged for a process of another job, for a
process the job's group does not back, for no process at all, truncated files, and a
job of thousands of ranks: nothing of it makes a finding, one line each, bounded work."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from agent.gpu.interface import JobResolver
from agent.jobhealth.service import JobHealthService
from agent.jobhealth.settings import JobHealthSection
from agent.links.settings import LinksSection
from agent.plugin.layout import StatsSlot, StatsSlots
from agent.plugin.shm import job_dir
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import JobDeclaration, JobRankProgress
from testbed.ranks import RankKit, stop
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root
from tests.daemons import wait_until

pytestmark = pytest.mark.jobhealth

JOB = "train-forged"
COMM = 0x0BAD0000000000F1
TENANT, JOB_GID = 61031, 61077


def spawn(env: dict[str, str], uid: int | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    if uid is not None:
        argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                "/usr/bin/python3", "-c", "import time; time.sleep(120)"]
    return subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", **env})


def forge(directory: Path, real: Path, pid: int, tag: int) -> int:
    """A copy of a real rank's stats file claiming another process; its lock held."""
    data = bytearray(real.read_bytes())
    data[8:12] = pid.to_bytes(4, "little")
    data[16:24] = tag.to_bytes(8, "little")
    path = directory / f"{pid}-{tag:016x}.stats"
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # "alive", as the plugin holds it
    return fd


@pytest.fixture
def others() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        proc.kill()
        proc.wait()


@needs_root
def test_item5_forged_stats_of_another_jobs_process_or_none_are_not_counted(
        workdir: Path, others, caplog: pytest.LogCaptureFixture) -> None:
    directory = workdir / "tuner"
    tuning = TuningService(TuningSection(policy_dir=str(directory), htb=False),
                           LinksSection(), publish=lambda message: None)
    tuning.start(0.0)
    tuning.declare(JobDeclaration(JOB, revision=1, group=str(JOB_GID)), 0.0)
    sent: list[JobRankProgress] = []
    health = JobHealthService(JobHealthSection(), publish=sent.append,  # type: ignore[arg-type]
                              resolver=JobResolver("/proc", "HARMONAIZE_JOB", "", ("RANK",),
                                                   group_of=lambda job: str(JOB_GID)))
    now = 0.0

    def tick() -> None:
        nonlocal now
        now += 0.1
        tuning.step(link_sample(0), link_judgements(0), now)
        health.step(tuning, None, (), (), now)

    fds = []
    with RankKit() as kit:
        rank = kit.start(job=JOB, directory=directory, comm=COMM, n_ranks=4, n_nodes=1,
                         rate=100, env={"RANK": "0"})
        try:
            folder = job_dir(directory, JOB)
            real = wait_until(lambda: next(folder.glob("*.stats"), None), timeout=30,
                              what="the real rank's stats")
            other_job = spawn({"HARMONAIZE_JOB": "someone-else", "RANK": "1"})
            unbacked = spawn({"HARMONAIZE_JOB": JOB, "RANK": "2"}, uid=TENANT)
            others += [other_job, unbacked]
            # The tenant's process is root's until setpriv has dropped to its uid.
            wait_until(lambda: f"Uid:\t{TENANT}\t" in Path(f"/proc/{unbacked.pid}/status")
                       .read_text(), timeout=10, what="the tenant's process as its user")
            fds += [forge(folder, real, other_job.pid, 1), forge(folder, real, unbacked.pid, 2),
                    forge(folder, real, 4_194_000, 3)]  # no such process
            (folder / "77-0000000000000004.stats").write_bytes(b"HZST\x01")  # truncated
            fds.append(os.open(folder / "77-0000000000000004.stats", os.O_RDONLY))
            fcntl.flock(fds[-1], fcntl.LOCK_SH)
            caplog.set_level(logging.WARNING, "harmonaize.agent")
            for _ in range(50):
                tick()
            comm = health.engine.jobs[JOB].comms[COMM]
            assert [r.rank for r in comm.ranks.values()] == ["0"]  # only the real one
            assert health.uncounted == 2
            lines = [r.getMessage() for r in caplog.records if "not counted" in r.getMessage()]
            assert len([m for m in lines if str(other_job.pid) in m]) == 1
            assert len([m for m in lines if str(unbacked.pid) in m]) == 1
            assert health.engine.judge.verdicts() == {}
            assert {r.rank for m in sent for c in m.comms for r in c.ranks} == {"0"}
        finally:
            for fd in fds:
                os.close(fd)
            stop([rank])


class Stats:
    def __init__(self, stats: Mapping[str, StatsSlots]) -> None:
        self.stats = stats


def fake_proc(root: Path, pids: range) -> None:
    """A /proc of ``pids``: each a root process of JOB with its RANK (a bounded tree of
    real files, read through the same code as the kernel's)."""
    for i, pid in enumerate(pids):
        base = root / str(pid)
        base.mkdir()
        (base / "stat").write_bytes(f"{pid} (rank) S 1 ".encode() + b"0 " * 17 + b"5000\n")
        (base / "environ").write_bytes(f"HARMONAIZE_JOB={JOB}\0RANK={i}\0".encode())
        (base / "status").write_text("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\n")


def test_item5_a_job_of_thousands_of_ranks_is_taken_in_with_bounded_work_per_pass(
        tmp_path: Path) -> None:
    pids = range(20_000, 23_000)
    fake_proc(tmp_path, pids)
    slots = StatsSlots(StatsSlot(pid, COMM, 3000, 375, 1000 + pid % 5, tag=pid)
                       for pid in pids)
    cfg = JobHealthSection(resolves_per_pass=256)
    sent: list[JobRankProgress] = []
    health = JobHealthService(cfg, publish=sent.append,  # type: ignore[arg-type]
                              resolver=JobResolver(tmp_path, "HARMONAIZE_JOB", "", ("RANK",)),
                              proc_root=str(tmp_path))
    counted = []
    for n in range(14):
        health.step(Stats({JOB: slots}), None, (), (), n * 0.1)
        counted.append(len(health.engine.jobs[JOB].comms[COMM].ranks))
    assert counted[:3] == [256, 512, 768]  # at most resolves_per_pass new ones a pass
    assert counted[-1] == 3000
    report = health.engine.report(JOB, 1.4).comms[0]  # the next interval's report
    assert report.ranks_here == 3000 and len(report.ranks) == 256
    assert all(r.collectives == 1000 for r in report.ranks[:8])  # furthest behind first


def test_item5_ranks_past_the_jobs_cap_are_not_counted_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pids = range(24_000, 24_300)
    fake_proc(tmp_path, pids)
    slots = StatsSlots(StatsSlot(pid, COMM, 300, 38, 7, tag=pid) for pid in pids)
    health = JobHealthService(JobHealthSection(ranks_per_job=100), publish=lambda m: None,
                              resolver=JobResolver(tmp_path, "HARMONAIZE_JOB", "", ("RANK",)),
                              proc_root=str(tmp_path))
    caplog.set_level(logging.WARNING, "harmonaize.agent")
    for n in range(4):
        health.step(Stats({JOB: slots}), None, (), (), n * 0.1)
    assert len(health.engine.jobs[JOB].comms[COMM].ranks) == 100
    assert health.over_cap == 200 and health.view(0.4)["ranks_over_cap"] == 200
    assert len([r for r in caplog.records if "ranks_per_job" in r.getMessage()]) == 1
