"""A job placed by Slurm alone (issue 29, item 1), end to end on real daemons: munged,
slurmctld and slurmd, the controller, an agent on the fake NVML's GPUs and a tenant
subscribed. The job is submitted with sbatch and launched with plain srun, with no
HARMONAIZE_* variable: the prolog records its placement, the agent finds its GPU
processes' job in Slurm's cgroup and their ranks in SLURM_PROCID, an XID on its GPU
reaches the tenant as the job's advisory, and the epilog removes the placement."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from agent.gpu.jobs import job_from_cgroup
from agent.gpu.settings import SLURM_JOB_CGROUP
from harmonaize.messages import JobAdvisory
from testbed.slurm import SlurmCluster
from tests.conftest import Spawn
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
from tests.slurmhook import make_hook

pytestmark = pytest.mark.scheduler
pytest_plugins = ["tests.slurmcluster"]


@pytest.mark.parametrize(("cgroup", "job"), [
    ("6:freezer:/slurm_n2/uid_0/job_2/step_0", "2"),  # v1, multiple-slurmd
    ("4:memory:/slurm/uid_1000/job_17/step_batch/task_0", "17"),  # v1
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1", "4242"),  # v2
    ("0::/system.slice/slurmstepd.scope/job_9", "9"),
    ("0::/system.slice/n2_slurmstepd.scope/job_5/step_0/user/task_special", "5"),  # v2, multi
    ("0::/user.slice/myjob_3/x", None),  # not a path component of its own
    # A tenant's own delegated subtree: it may name cgroups as it likes, so only the
    # places slurmd makes (root's) count.
    ("0::/user.slice/user-1000.slice/user@1000.service/job_42/step_0", None),
    ("0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_42",
     None),
    ("4:freezer:/user/job_42/step_0", None),
    ("0::/system.slice/slurmstepd.scope/job_12x/step_0", None),
    ("0::/", None),
])
def test_agent_finds_the_slurm_job_in_cgroup_v1_and_v2_layouts_by_default(
        cgroup: str, job: str | None) -> None:
    assert job_from_cgroup(cgroup, re.compile(SLURM_JOB_CGROUP)) == job


def jobs_on(agent: Agent, index: int) -> list[dict]:
    return next(g for g in agent.request("health")["gpus"] if g["index"] == index)["jobs"]


def task_pids(path: Path, count: int) -> dict[str, int]:
    """SLURM_PROCID -> pid, as the job's tasks wrote them."""
    if not path.exists():
        return {}
    found = dict(line.split()[::-1] for line in path.read_text().splitlines()
                 if len(line.split()) == 2)
    return {rank: int(pid) for rank, pid in found.items()} if len(found) >= count else {}


def env_of(pids: Path, rank: str) -> str:
    """What a task wrote of its environment ("" until the file is there)."""
    path = Path(f"{pids}.env{rank}")
    return path.read_text() if path.exists() else ""


def test_a_job_placed_by_slurm_alone_reaches_agent_controller_and_tenant(
        spawn: Spawn, workdir: Path, make_slurm) -> None:
    controller = start_controller(spawn, workdir, admin_group="slurm",
                                  extra='scheduler_users = ["slurm"]\n')
    fake, env = fake_gpus(workdir)
    # No job_cgroup_pattern: the default is Slurm's.
    agent = start_agent(spawn, workdir, "g1", endpoint=controller.listen, env=env,
                        links=NO_LINKS + gpu_section())
    node = "hz" + workdir.name[-6:].lower().replace("_", "x") + "a"
    hook = make_hook(workdir, controller.admin, accounts={"physics": "acme"},
                     hosts={node: "g1"}, owner="slurm")
    slurm: SlurmCluster = make_slurm(
        [node], extra_conf=[f"PrologSlurmctld={hook.wrapper}",
                            f"EpilogSlurmctld={hook.wrapper}"])
    pids = workdir / "tasks"
    pids.touch()
    pids.chmod(0o666)
    job = slurm.sbatch(
        "-A", "physics", "-N1", "-n2", "--export=NONE",
        # --export=NONE: the tasks get Slurm's variables only (so no PATH either).
        script="#!/bin/sh\n"
               f"/usr/bin/srun -n2 /bin/sh -c 'echo $$ $SLURM_PROCID >> {pids};"
               f" /usr/bin/env > {pids}.env$SLURM_PROCID; exec /bin/sleep 600'\n")
    # Each task writes its pid line before its environment: wait for both.
    ranks = wait_until(lambda: (found := task_pids(pids, 2)) and all(
        "SLURM_PROCID=" in env_of(pids, rank) for rank in found) and found, 60,
        "the job's two tasks and their environments")
    assert not any(line.startswith("HARMONAIZE_")
                   for rank in ranks for line in Path(f"{pids}.env{rank}").read_text().split())
    # The prolog recorded the placement, in the tenant's terms, on the agent's host.
    placed = wait_until(lambda: {j["job"]: j for j in controller.request("jobs")}.get(job),
                        30, "the prolog's placement")
    assert placed["tenant"] == "acme"
    assert placed["members"] == [{"name": "node0", "host_id": "g1"}]
    # The fake driver reports the tasks on GPUs 0 and 1 (the hardware edge); the agent
    # finds their job from their cgroup and their ranks from SLURM_PROCID.
    fake.set(0, processes={ranks["0"]: 1 << 30})
    fake.set(1, processes={ranks["1"]: 1 << 30})
    wait_until(lambda: jobs_on(agent, 0) == [{"job": job, "rank": "0"}], 30,
               "GPU 0's process counted for the Slurm job")
    wait_until(lambda: jobs_on(agent, 1) == [{"job": job, "rank": "1"}], 30,
               "GPU 1's process counted for the Slurm job")
    with tenant_feed(controller, [f"job/acme/{job}/"]) as feed:
        fake.inject_xid(1, 79)
        advisory = None
        while advisory is None:
            message = feed.recv(timeout=20)
            assert message is not None, "no advisory reached the tenant"
            if isinstance(message.body, JobAdvisory):
                advisory = message.body
        # Named as the placement names the job's members: its node index (SLURM_NODEID;
        # the task layout is each step's, unknown when the job starts).
        assert advisory.job == job and advisory.ranks == ("node0",)
    # The job ends: the epilog removes its placement.
    slurm.run("scancel", job)
    wait_until(lambda: job not in {j["job"] for j in controller.request("jobs")}, 30,
               "the epilog's unplace")
    assert hook.queued() == [] and hook.rejected() == []


def test_jobs_run_while_the_controller_is_down_or_hung_and_their_placements_follow(
        spawn: Spawn, workdir: Path, make_slurm) -> None:
    # Real slurmctld running the hook: a controller that is absent, then one that
    # accepts and never answers, fails or holds no job; what they spooled arrives once
    # when the controller is back.
    admin = workdir / "controller.sock"
    hook = make_hook(workdir, admin, accounts={"physics": "acme"}, owner="slurm")
    slurm: SlurmCluster = make_slurm(
        count=1, extra_conf=[f"PrologSlurmctld={hook.wrapper}",
                             f"EpilogSlurmctld={hook.wrapper}"])
    down = slurm.sbatch("-A", "physics", script="#!/bin/sh\n/usr/bin/srun /bin/true\n")
    assert slurm.wait_job_state(down, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        hung.bind(str(admin))
        os.chmod(admin, 0o666)
        hung.listen(64)  # connections wait in the kernel, never answered
        late = slurm.sbatch("-A", "physics", script="#!/bin/sh\n/usr/bin/srun /bin/true\n")
        assert slurm.wait_job_state(late, {"COMPLETED", "FAILED", "CANCELLED"}) == \
            "COMPLETED"
        wait_until(lambda: len(hook.queued()) == 4, 30, "both jobs' place and unplace")
    finally:
        hung.close()
        admin.unlink()
    assert sum("did not answer" in line for line in hook.lines()) >= 1
    assert sum("not running" in line for line in hook.lines()) >= 1
    controller = start_controller(spawn, workdir, admin_group="slurm",
                                  extra='scheduler_users = ["slurm"]\n')
    assert hook.run("replay", {}, user="slurm").returncode == 0
    assert hook.queued() == [] and hook.rejected() == []
    assert controller.request("jobs") == []  # each placed, then removed: in order, once
