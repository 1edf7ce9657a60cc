"""Holds the controller executes through Slurm that the agent's remediation raises
(issue 29 item 3, the scheduler's side): a reboot asked of Slurm with our reason, an RMA
drain never resumed while it holds, and a maintenance reservation while a validation
waits for an idle host (item 4 of the drains work). The agent here is a raw client of
the real protocol, since the agent's remediation is built beside this."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from testbed.slurm import SlurmCluster
from tests.conftest import needs_root
from tests.daemons import FakeAgent, wait_until
from tests.schedulerrig import Rig, start_rig

pytestmark = [pytest.mark.scheduler, needs_root]
pytest_plugins = ["tests.slurmcluster"]  # the make_slurm fixture


class Host:
    """h1 as the controller hears it: a hello, then summaries (heartbeat long enough
    that it stays up for the test)."""

    def __init__(self, ctx: zmq.Context, rig: Rig) -> None:
        self.agent = FakeAgent(ctx, rig.controller, "h1")
        self.agent.send(m.Hello(pool="p", gpu_class="H200", gpus=8, version="t", epoch=1,
                                acked=0, heartbeat=600.0))
        assert self.agent.recv() == m.Ack(0)
        self.seq = 0

    def summary(self, holds: tuple[m.Hold, ...] = (), idle_wanted: bool = False) -> None:
        self.seq += 1
        self.agent.send(m.HostSummary(m.Health.HEALTHY, not holds, m.GpuCounts(healthy=8),
                                      holds=holds, idle_wanted=idle_wanted), seq=self.seq)
        assert self.agent.recv() == m.Ack(self.seq)


def test_reboot_hold_runs_scontrol_reboot_asap_once_with_our_reason(
        spawn, workdir: Path, ctx: zmq.Context,
        make_slurm: Callable[..., SlurmCluster]) -> None:
    called = workdir / "reboots"
    program = workdir / "reboot-program"
    program.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\n")
    program.chmod(0o755)
    cluster = make_slurm(count=2, extra_conf=[f"RebootProgram={program}"])
    rig = start_rig(spawn, workdir, cluster)
    host = Host(ctx, rig)
    host.summary((m.Hold(m.HoldKind.REBOOT, -1, "3 resets failed"),
                  m.Hold(m.HoldKind.GPU_QUARANTINED, 2, "reset-gpu")))
    wait_until(called.exists, what="Slurm's RebootProgram called")
    flags = set(rig.node()["State"].split("+"))
    assert flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"} and "DRAIN" in flags
    # Slurm keeps our reason, adding its own note once it issued the reboot.
    assert rig.node()["Reason"].startswith("hz: reboot; gpu 2 quarantined: reset-gpu")
    rig.passes_after(3)
    assert rig.view()["counters"].get("reboot_done") == 1  # asked once
    assert rig.row()["situation"] == "rebooting"
    assert called.read_text().count("\n") == 1


def test_rma_gpu_drains_with_our_reason_and_is_never_resumed_while_it_holds(
        spawn, workdir: Path, ctx: zmq.Context,
        make_slurm: Callable[..., SlurmCluster]) -> None:
    rig = start_rig(spawn, workdir, make_slurm(count=2))
    host = Host(ctx, rig)
    rma = (m.Hold(m.HoldKind.RMA, 5, ""),)
    host.summary(rma)
    wait_until(rig.drained, what="the RMA drain")
    assert rig.node()["Reason"].startswith("hz: gpu 5 rma [")
    host.summary(rma)
    rig.passes_after(3)
    assert rig.drained() and "resume_done" not in rig.view()["counters"]


def test_validation_waiting_for_an_idle_host_gets_a_maintenance_reservation(
        spawn, workdir: Path, ctx: zmq.Context,
        make_slurm: Callable[..., SlurmCluster]) -> None:
    cluster = make_slurm(count=2)
    rig = start_rig(spawn, workdir, cluster)
    node = cluster.nodes[0]
    name = f"hz-validate-{node}"
    host = Host(ctx, rig)
    host.summary(idle_wanted=True)
    wait_until(lambda: name in cluster.scontrol("-o", "show", "reservation"),
               what="the maintenance reservation")
    shown = cluster.scontrol("-o", "show", "reservation", name)
    assert f"Nodes={node} " in shown and "MAINT" in shown and "IGNORE_JOBS" in shown
    # No new job lands on the node meanwhile.
    job = cluster.sbatch("-w", node, "-o", "/dev/null", "--wrap", "true")
    rig.passes_after(2)
    assert cluster.job(job)["JobState"] == "PENDING"
    host.summary(idle_wanted=False)
    wait_until(lambda: name not in cluster.scontrol("-o", "show", "reservation"),
               what="the reservation deleted")
    cluster.wait_job_state(job, {"RUNNING", "COMPLETED"})
