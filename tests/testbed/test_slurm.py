"""The Slurm testbed the scheduler tests run on: real daemons start, run jobs on two
nodes, and leave nothing behind (no process, cgroup or file), under Slurm's cgroup/v1
plugin and under cgroup/v2 (the only layout of a fresh systemd host)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.gpu.jobs import JobResolver
from agent.gpu.settings import SLURM_JOB_CGROUP
from agent.gpu.types import JobRef
from testbed import cgroups
from testbed import slurm as testbed
from testbed.slurm import SlurmCluster

pytestmark = pytest.mark.scheduler
pytest_plugins = ["tests.slurmcluster"]  # the slurm and make_slurm fixtures

# /proc/self/mountinfo and /proc/self/cgroup of the three kinds of host.
V2_ONLY_MOUNTS = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 24 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 \
rw,nsdelegate,memory_recursiveprot
"""
HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_ONLY_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
"""
NO_CGROUP_MOUNTS = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
V2_SELF = "0::/user.slice/user-0.slice/session-3.scope\n"
HYBRID_SELF = "6:freezer:/\n4:memory:/user.slice\n0::/\n"


def _alive(pid: int) -> bool:
    """Running, or not yet dead: a killed task whose parent died is a zombie until
    init reaps it, which is no longer ours to wait for."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize(("mounts", "self_cgroup", "want", "version", "mountpoint", "hybrid"), [
    pytest.param(V2_ONLY_MOUNTS, V2_SELF, None, "v2", "/sys/fs/cgroup", False,
                 id="v2-only host"),
    pytest.param(V2_ONLY_MOUNTS, V2_SELF, "v2", "v2", "/sys/fs/cgroup", False,
                 id="v2-only host, v2 asked"),
    pytest.param(HYBRID_MOUNTS, HYBRID_SELF, None, "v1", "/sys/fs/cgroup", False,
                 id="hybrid host"),
    pytest.param(HYBRID_MOUNTS, HYBRID_SELF, "v2", "v2", "/sys/fs/cgroup/unified", True,
                 id="hybrid host, v2 asked"),
    pytest.param(V1_ONLY_MOUNTS, "6:freezer:/\n", "v1", "v1", "/sys/fs/cgroup", False,
                 id="v1-only host, v1 asked"),
])
def test_cgroup_layout_is_v1_where_a_freezer_hierarchy_is_else_v2(
        mounts: str, self_cgroup: str, want: str | None, version: str, mountpoint: str,
        hybrid: bool, tmp_path: Path) -> None:
    view = tmp_path / "libhz-unified-cgroup-view.so"
    view.touch()
    layout = cgroups.choose(mounts, self_cgroup, want, view=view)
    assert isinstance(layout, cgroups.CgroupLayout), layout
    assert (layout.version, str(layout.mountpoint), layout.hybrid) == (
        version, mountpoint, hybrid)


@pytest.mark.parametrize(("mounts", "want", "reason"), [
    pytest.param(V2_ONLY_MOUNTS, "v1", "no cgroup v1 freezer", id="v1 asked, v2 only"),
    pytest.param(NO_CGROUP_MOUNTS, None, "neither a cgroup v1 freezer hierarchy nor cgroup2",
                 id="no cgroups"),
    pytest.param(V1_ONLY_MOUNTS, "v2", "no cgroup2 at /sys/fs/cgroup or /sys/fs/cgroup/unified",
                 id="v2 asked, v1 only"),
    pytest.param(V2_ONLY_MOUNTS, "v3", "use v1 or v2", id="unknown version asked"),
    pytest.param("garbage\n - \n\n", None, "neither", id="unreadable mountinfo"),
])
def test_cgroup_layout_says_why_when_none_can_run_slurm(
        mounts: str, want: str | None, reason: str) -> None:
    layout = cgroups.choose(mounts, V2_SELF, want)
    assert isinstance(layout, str) and reason in layout


def test_cgroup_v2_on_a_hybrid_host_needs_the_unified_view_built(tmp_path: Path) -> None:
    layout = cgroups.choose(HYBRID_MOUNTS, HYBRID_SELF, "v2", view=tmp_path / "absent.so")
    assert layout == "cgroup v2 beside v1 hierarchies needs absent.so (./scripts/setup builds it)"
    # A v2-only host does not.
    layout = cgroups.choose(V2_ONLY_MOUNTS, V2_SELF, None, view=tmp_path / "absent.so")
    assert isinstance(layout, cgroups.CgroupLayout)


def test_cgroup_v2_conf_lets_slurm_make_its_own_scopes_without_systemd() -> None:
    v2 = cgroups.CgroupLayout("v2", Path("/sys/fs/cgroup"))
    assert v2.conf().splitlines() == [
        "CgroupPlugin=cgroup/v2", "CgroupMountpoint=/sys/fs/cgroup",
        "IgnoreSystemd=yes", "CgroupAutomount=yes"]
    # One scope per node name: several slurmd on one host never share a tree.
    assert v2.node_trees("a1") == [Path("/sys/fs/cgroup/system.slice/a1_slurmstepd.scope")]
    assert v2.node_trees("a1") != v2.node_trees("a2")
    assert v2.slurmd_env() == {}  # a v2-only host runs Slurm as it is
    hybrid = cgroups.CgroupLayout("v2", Path("/sys/fs/cgroup/unified"), hybrid=True)
    assert hybrid.slurmd_env() == {"LD_PRELOAD": str(cgroups.UNIFIED_VIEW)}


def _job_tasks(cluster: SlurmCluster, job_id: str, count: int) -> dict[str, int]:
    """SLURM_PROCID -> pid of each running task of the job, as the tasks wrote them."""
    def written() -> dict[str, int] | None:
        pids = {str(rank): cluster.dir / f"task-{job_id}-{rank}.pid" for rank in range(count)}
        if not all(path.exists() and path.read_text().strip() for path in pids.values()):
            return None
        return {rank: int(path.read_text()) for rank, path in pids.items()}
    return cluster.wait(written, 60.0, f"job {job_id}'s tasks")


def _run_job_and_stop(cluster: SlurmCluster) -> None:
    """srun on both nodes, a batch job still running at stop, and nothing left after."""
    nodes = ",".join(cluster.nodes)
    out = cluster.srun("-N2", "-n2", "-w", nodes, "sh", "-c",
                       'echo "$SLURMD_NODENAME $SLURM_PROCID $SLURM_JOB_ID"')
    ranks = sorted(line.split()[1] for line in out.splitlines()
                   if line.startswith(tuple(cluster.nodes)))
    assert ranks == ["0", "1"]

    job_id = cluster.sbatch("-N2", "-n2", "-w", nodes, script=(
        "#!/bin/sh\n"
        f"srun sh -c 'echo $$ > {cluster.dir}/task-$SLURM_JOB_ID-$SLURM_PROCID.pid;"
        " exec sleep 600'\n"))
    tasks = _job_tasks(cluster, job_id, 2)
    # The agent's resolver, with its default pattern, on the tasks' /proc.
    resolver = JobResolver(cgroup_pattern=SLURM_JOB_CGROUP)
    for rank, pid in tasks.items():
        text = Path(f"/proc/{pid}/cgroup").read_text()
        assert resolver.resolve(pid) == JobRef(job_id, rank), text
        assert re.search(rf"/job_{job_id}/step_0(/|$)", text, re.MULTILINE), text
        if cluster.cgroups.version == "v2":
            unified = next(line for line in text.splitlines() if line.startswith("0::"))
            path = unified.partition("::")[2]
            assert re.fullmatch(rf"/system\.slice/({'|'.join(cluster.nodes)})_slurmstepd"
                                rf"\.scope/job_{job_id}/step_0/user/task_\w+", path), path
            assert (cluster.cgroups.mountpoint / path.lstrip("/") / "cgroup.freeze").exists()
            assert str(pid) in (cluster.cgroups.mountpoint / path.lstrip("/")
                                / "cgroup.procs").read_text().split()
        else:
            assert re.search(r"freezer:/slurm_\w+/uid_\d+/job_", text), text
    # Each node's tree is where teardown will look for it.
    assert all(any(tree.is_dir() for tree in cluster.cgroups.node_trees(node))
               for node in cluster.nodes)

    daemons = [proc.pid for proc in cluster._procs.values()]
    directory = cluster.dir
    cluster.stop()
    assert not [pid for pid in [*daemons, *tasks.values()] if _alive(pid)]
    assert not directory.exists()
    assert not [tree for node in cluster.nodes for tree in cluster.cgroups.node_trees(node)
                if tree.exists()]


def test_testbed_runs_srun_on_two_nodes_and_cleans_up(slurm: SlurmCluster) -> None:
    _run_job_and_stop(slurm)


def test_testbed_runs_jobs_under_cgroup_v2_and_cleans_up(make_slurm) -> None:
    reason = testbed.missing("v2")
    if reason is not None:
        pytest.skip(f"Slurm testbed under cgroup v2: {reason}")
    cluster = make_slurm(count=2, cgroup="v2")
    assert cluster.cgroups.version == "v2"
    assert "CgroupPlugin=cgroup/v2" in (cluster.dir / "cgroup.conf").read_text()
    _run_job_and_stop(cluster)


def test_testbed_stops_what_it_started_when_start_fails(tmp_path: Path) -> None:
    reason = testbed.missing()
    if reason is not None:
        pytest.skip(reason)
    # A slurm.conf line slurmctld refuses: the controller never answers, start raises,
    # and munged (already running) is stopped with the directory removed.
    cluster = SlurmCluster(count=1, extra_conf=["NoSuchSlurmOption=1"], base=tmp_path)
    with pytest.raises(testbed.SlurmError), cluster:
        pass
    assert not any(_alive(proc.pid) for proc in cluster._procs.values())
    assert not cluster.dir.exists()
