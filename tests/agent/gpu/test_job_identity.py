"""Issue 28, item 12: a GPU process's job comes from the kernel, never from its environment
alone. Real processes as nobody, in real cgroup v2 groups and real Unix groups, on the
fake NVML's GPUs: a rank that sets HARMONAIZE_JOB to another tenant's job gets none of
that job's advisories; the genuine rank's reach it."""

from __future__ import annotations

import contextlib
import grp
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gpu.jobs import JobResolver
from agent.gpu.types import JobRef
from harmonaize.messages import JobAdvisory
from tests.conftest import needs_root
from tests.daemons import (
    NO_LINKS,
    Agent,
    fake_gpus,
    gpu_section,
    start_agent,
    start_controller,
    tenant_feed,
    wait_until,
)

pytestmark = [pytest.mark.hardening, pytest.mark.gpu, needs_root]

CGROUP2 = next((p for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
                if (p / "cgroup.procs").exists() and (p / "cgroup.subtree_control").exists()),
               None)
NOBODY = 65534


class Cgroups:
    """Child cgroups under one scratch parent, named like a scheduler's job cgroups."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.parent = root / f"hz-{uuid.uuid4().hex[:8]}"
        self.parent.mkdir()

    def job(self, name: str) -> Path:
        path = self.parent / f"job_{name}"
        path.mkdir(exist_ok=True)
        return path

    def move(self, pid: int, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        for child in self.parent.iterdir():
            if child.is_dir():
                for pid in (child / "cgroup.procs").read_text().split():
                    # Back to the root group, so the scratch groups can go (the process
                    # itself is stopped by the spawn fixture).
                    with contextlib.suppress(OSError):
                        (self.root / "cgroup.procs").write_text(pid)
                child.rmdir()
        self.parent.rmdir()


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    if CGROUP2 is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    groups = Cgroups(CGROUP2)
    try:
        yield groups
    finally:
        groups.close()


@pytest.fixture
def unix_group() -> Iterator[tuple[str, int]]:
    name = f"hzjob{uuid.uuid4().hex[:8]}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def rank_process(spawn, job: str, rank: str, groups: list[int] | None = None
                 ) -> subprocess.Popen:
    """A tenant's rank: nobody's, with the environment it chose for itself."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HARMONAIZE_JOB": job,
           "RANK": rank}
    return spawn(["sleep", "600"], env=env, user=NOBODY, group=NOBODY,
                 extra_groups=groups or [])


def jobs_on(agent: Agent, index: int) -> list[dict]:
    return next(g for g in agent.request("health")["gpus"] if g["index"] == index)["jobs"]


def refused(agent: Agent) -> int:
    status = {o["name"]: o for o in agent.request("status")["observers"]}
    return status["gpu"]["job_claims_refused"]


def test_item12_an_impostor_in_another_jobs_cgroup_gets_none_of_the_jobs_advisories(
    spawn, workdir: Path, cgroups: Cgroups
) -> None:
    controller = start_controller(spawn, workdir)
    fake, env = fake_gpus(workdir)
    pattern = rf"^/{cgroups.parent.name}/job_(?P<job>[A-Za-z0-9-]+)$"
    agent = start_agent(spawn, workdir, "g1", endpoint=controller.listen, env=env,
                        links=NO_LINKS + gpu_section(
                            extra=f"job_cgroup_pattern = '{pattern}'\n"))
    impostor = rank_process(spawn, "job-b", "66")  # names tenant beta's job
    genuine = rank_process(spawn, "job-b", "7")
    cgroups.move(impostor.pid, cgroups.job("job-a"))  # the scheduler put it in job-a
    cgroups.move(genuine.pid, cgroups.job("job-b"))
    fake.set(3, processes={impostor.pid: 1 << 30})
    fake.set(5, processes={genuine.pid: 1 << 30})
    wait_until(lambda: jobs_on(agent, 3) == [{"job": "job-a", "rank": "66"}],
               what="the impostor counted for its own cgroup's job")
    wait_until(lambda: jobs_on(agent, 5) == [{"job": "job-b", "rank": "7"}],
               what="the genuine rank counted for job-b")
    assert refused(agent) == 1
    assert "names job 'job-b' in HARMONAIZE_JOB, but its cgroup is job job-a's" in \
        agent.log.read_text()
    for job, tenant, member in (("job-a", "alpha", "66"), ("job-b", "beta", "7")):
        controller.request("place", {"job": job, "tenant": tenant,
                                     "members": [{"name": member, "host": "g1"}]})
    with tenant_feed(controller, ["job/beta/job-b/"], tenant="beta") as beta:
        # The impostor's GPU fails first, then the genuine rank's: beta's first advisory
        # must be for its own rank, and none ever names the impostor's.
        fake.inject_xid(3, 79)
        wait_until(lambda: jobs_on(agent, 3) == [] or
                   next(g for g in agent.request("health")["gpus"]
                        if g["index"] == 3)["state"] == "lost", what="gpu 3 lost")
        fake.inject_xid(5, 79)
        advisories = []
        while not advisories:
            message = beta.recv(timeout=15)
            assert message is not None, "the genuine rank's advisory never reached beta"
            if isinstance(message.body, JobAdvisory):
                advisories.append(message.body)
        assert advisories[0].ranks == ("7",)


def test_item12_without_cgroups_the_environment_counts_only_with_the_jobs_group(
    spawn, workdir: Path, unix_group: tuple[str, int]
) -> None:
    name, gid = unix_group
    fake, env = fake_gpus(workdir)
    agent = start_agent(spawn, workdir, "g1", env=env, links=NO_LINKS + gpu_section())
    impostor = rank_process(spawn, "job-b", "66")
    genuine = rank_process(spawn, "job-b", "7", groups=[gid])
    fake.set(2, processes={impostor.pid: 1 << 30})
    fake.set(4, processes={genuine.pid: 1 << 30})
    # Before the job's group is known here, neither counts for it.
    wait_until(lambda: refused(agent) == 2, what="both claims refused for now")
    assert jobs_on(agent, 2) == [] and jobs_on(agent, 4) == []
    assert "the job's group on this host is not known" in agent.log.read_text()
    # The job's group on this host comes from its placement, with its declaration.
    agent.request("declare", {"declaration": {"job": "job-b", "revision": 1,
                                              "group": name}})
    wait_until(lambda: jobs_on(agent, 4) == [{"job": "job-b", "rank": "7"}],
               what="the genuine rank counted for job-b")
    assert jobs_on(agent, 2) == []  # still refused: it does not hold the group
    assert refused(agent) == 2  # each process counted once, however many looks


def test_item12_a_jobs_group_made_on_the_host_after_its_placement_counts_then(
        tmp_path: Path) -> None:
    """A group looked up before it exists (a prolog or a directory service makes it a
    moment later) is found at a later look: a failed lookup is not remembered."""
    name = f"hzjob{uuid.uuid4().hex[:8]}"
    process = tmp_path / "4242"
    process.mkdir()
    (process / "environ").write_bytes(b"HARMONAIZE_JOB=job-c\0RANK=3\0")
    (process / "cgroup").write_text("0::/\n")
    resolver = JobResolver(tmp_path, group_of=lambda job: name if job == "job-c" else None)
    try:
        (process / "status").write_text("Uid:\t65534\t65534\t65534\t65534\n"
                                        "Gid:\t65534\t65534\t65534\t65534\nGroups:\t\n")
        assert resolver.resolve(4242) is None  # no such group yet
        subprocess.run(["groupadd", name], check=True, capture_output=True)
        gid = grp.getgrnam(name).gr_gid
        (process / "status").write_text("Uid:\t65534\t65534\t65534\t65534\n"
                                        f"Gid:\t65534\t65534\t65534\t65534\nGroups:\t{gid}\n")
        resolver.forget_except(set())  # the process's facts are read afresh
        assert resolver.resolve(4242) == JobRef("job-c", "3")
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def test_a_rank_seen_while_root_is_judged_again_once_it_dropped_to_the_tenants_uid(
        tmp_path: Path) -> None:
    """A launcher starts a rank as root and drops privileges a moment later: the first
    look (root's: the host's own) must not stand for the process once it is a tenant's."""
    process = tmp_path / "4343"
    process.mkdir()
    (process / "environ").write_bytes(b"HARMONAIZE_JOB=job-d\0RANK=5\0")
    (process / "cgroup").write_text("0::/\n")
    (process / "status").write_text("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n")
    resolver = JobResolver(tmp_path, group_of=lambda job: "0")  # a group it does not hold
    assert resolver.resolve(4343) == JobRef("job-d", "5")  # root's claim: the host's own
    (process / "status").write_text("Uid:\t65534\t65534\t65534\t65534\n"
                                    "Gid:\t65534\t65534\t65534\t65534\nGroups:\t\n")
    assert resolver.resolve(4343) is None  # now a tenant's, outside the job's group
