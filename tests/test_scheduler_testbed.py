"""The Slurm testbed the scheduler tests run on: real daemons start, run jobs on two
nodes, and leave nothing behind (no process, cgroup or file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harmonaize.testbed import slurm as testbed
from harmonaize.testbed.slurm import SlurmCluster

pytestmark = pytest.mark.scheduler
pytest_plugins = ["tests.slurmcluster"]  # the slurm and make_slurm fixtures


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_testbed_runs_srun_on_two_nodes_and_cleans_up(slurm: SlurmCluster) -> None:
    out = slurm.srun("-N2", "-n2", "-w", ",".join(slurm.nodes), "sh", "-c",
                     'echo "$SLURMD_NODENAME $SLURM_PROCID $SLURM_JOB_ID";'
                     " grep freezer /proc/self/cgroup")
    lines = out.splitlines()
    ranks = sorted(line.split()[1] for line in lines if line.startswith(tuple(slurm.nodes)))
    assert ranks == ["0", "1"]
    # Each task sits in its node's job cgroup: what the agent reads the job id from.
    cgroups = [line for line in lines if "freezer" in line]
    assert len(cgroups) == 2
    assert all("/job_" in line and "/step_" in line for line in cgroups)

    pids = [proc.pid for proc in slurm._procs.values()]
    directory = slurm.dir
    slurm.stop()
    assert not any(_alive(pid) for pid in pids)
    assert not directory.exists()
    assert not [path for node in slurm.nodes
                for path in Path(testbed.CGROUP_ROOT).glob(f"*/slurm_{node}")]


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
