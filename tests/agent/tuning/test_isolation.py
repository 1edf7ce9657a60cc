"""Ranks of any user are tuned; another tenant's processes see and follow nothing.

Real uids: stand-in ranks run as unprivileged users (``setpriv``) with the
real plugin, against the real :class:`TuningService` writing real files as
root. The job's directory belongs to root and the job's group (as the
provider's placement names it); a process of another user cannot list the
host's jobs, read the job's policy or stats, or follow its policy by naming
the job.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from agent.links.settings import LinksSection
from agent.plugin.shm import job_dir, policy_path, read_stats
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import (
    Algorithm,
    Collective,
    JobDeclaration,
    Protocol,
    TuningRange,
)
from testbed.ranks import RankKit, stop
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root
from tests.daemons import wait_until

pytestmark = [pytest.mark.tuning, needs_root]

JOB = "train-iso"
TENANT, OTHER = 61001, 61002  # uids (and primary gids) without passwd entries
COMM = 0x15011A7E00000001
DECLARATION = JobDeclaration(JOB, revision=1, group=str(TENANT), tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE), (Protocol.LL, Protocol.SIMPLE),
    0, 1 << 40, 2, 16),))


def as_user(uid: int, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["setpriv", "--reuid", str(uid), "--regid", str(uid),
                           "--clear-groups", *argv], capture_output=True, timeout=30,
                          check=False)


@pytest.fixture
def kit():
    with RankKit() as made:
        yield made


def test_a_tenants_rank_is_tuned_and_another_tenant_sees_nothing(workdir: Path, kit) -> None:
    directory = workdir / "tuner"
    service = TuningService(TuningSection(policy_dir=str(directory), htb=False, hold=0.5,
                                          activation_margin=32),
                            LinksSection(), publish=lambda message: None)
    service.start(0.0)
    service.declare(DECLARATION, 0.0)
    mine = kit.start(job=JOB, directory=directory, comm=COMM, n_ranks=1, n_nodes=1,
                     rate=200, uid=TENANT, gid=TENANT)
    theirs = kit.start(job=JOB, directory=directory, comm=COMM, n_ranks=1, n_nodes=1,
                       rate=200, uid=OTHER, gid=OTHER)
    try:
        now = 0.0

        def seen() -> bool:
            nonlocal now
            now += 0.1
            service.step(link_sample(0), link_judgements(0), now)
            return bool(service.stats.get(JOB))

        wait_until(seen, timeout=20, what="the tenant's rank in the stats")
        (slot,) = read_stats(directory, JOB)
        assert slot.pid == mine.proc.pid  # only the tenant's process is there
        stats_file = next(job_dir(directory, JOB).glob("*.stats"))
        info = stats_file.stat()
        assert (info.st_uid, info.st_gid) == (TENANT, TENANT)

        # The other tenant cannot list the host's jobs, nor read this job's files.
        assert as_user(OTHER, "ls", str(directory)).returncode != 0
        for path in (policy_path(directory, JOB), stats_file, job_dir(directory, JOB)):
            assert as_user(OTHER, "cat", str(path)).returncode != 0
            assert as_user(OTHER, "ls", str(path)).returncode != 0
        assert as_user(TENANT, "cat", str(policy_path(directory, JOB))).returncode == 0
        assert as_user(TENANT, "ls", str(directory)).returncode != 0  # nor may the tenant

        # Congestion: the tenant's rank switches at the agreed point.
        for _ in range(5):
            now += 0.1
            service.step(link_sample(2), link_judgements(2), now)
            time.sleep(0.1)
        entry = service.loop.jobs[JOB].entries[COMM]
        assert entry.after == "severe" and not entry.pending
        wait_until(lambda: len(mine.outcomes()) >= 2, timeout=20, what="the rank to switch")
        assert mine.outcomes()[1][:3] == (entry.at, "ring", "simple")
    finally:
        ended = stop([mine, theirs])
    assert ended == [True, True]
    # The other tenant's rank, naming the same job, never followed anything.
    assert theirs.outcomes() == [(0, "ring", "ll", 0)]


def test_a_job_without_a_group_is_root_only(workdir: Path, kit) -> None:
    directory = workdir / "tuner"
    service = TuningService(TuningSection(policy_dir=str(directory), htb=False),
                            LinksSection(), publish=lambda message: None)
    service.start(0.0)
    service.declare(JobDeclaration(JOB, revision=1), 0.0)
    assert as_user(TENANT, "ls", str(job_dir(directory, JOB))).returncode != 0
    rank = kit.start(job=JOB, directory=directory, comm=COMM, n_ranks=1, n_nodes=1, rate=100,
                     uid=TENANT, gid=TENANT, limit=600)
    rank.proc.wait(timeout=30)
    assert read_stats(directory, JOB) == []
    assert rank.outcomes() == [(0, "ring", "ll", 0)]
    assert os.stat(job_dir(directory, JOB)).st_mode & 0o777 == 0o700
