"""A real controller process, real ZeroMQ agents on two hosts sending their ranks'
progress, a real tenant subscriber: the owner is told the stopped rank by its member
name only, then its withdrawal; an application XID is rebuilt; operators see the hosts
(harmonctl -C job-findings) and the metrics count the findings."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from harmonaize import messages as m
from harmonaize.messages.jobhealth import Cause, Fault, Finding, ProcessState, ProgressState
from tests.conftest import free_port, needs_root
from tests.controller.jobhealth.reports import COMM, progress, rank
from tests.controller.test_feed import Sender, drain
from tests.daemons import FakeAgent, start_controller, tenant_feed
from tests.ops.test_harmonctl import harmonctl

pytestmark = [pytest.mark.jobhealth, pytest.mark.controller]

HOSTS = ("gpu-h1", "gpu-h2")


def metric(port: int, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


@needs_root
def test_a_tenant_is_told_the_rank_that_hangs_its_job_by_member_name_only(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    port = free_port()
    controller = start_controller(spawn, workdir, extra=(
        f'[metrics]\nlisten = "127.0.0.1:{port}"\n[jobhealth]\nhang_after = 1.0\n'))
    controller.request("place", {"job": "train", "tenant": "alpha", "members": [
        {"name": str(i), "host": HOSTS[i // 2]} for i in range(4)]})
    h1, h2 = (Sender(FakeAgent(ctx, controller, host)) for host in HOSTS)
    with tenant_feed(controller, ["job/alpha/"], "alpha") as feed:
        assert feed.recv(timeout=10) is not None  # the job's health: subscribed
        h1.send(progress("train", rank("0", 11), rank("1", 11), still_for=0.2))
        stopped = rank("3", 10, ProcessState.STOPPED, Cause.PROCESS_NOT_RUNNING)
        # h2 also names h1's rank and a host address: neither is its to name.
        h2.send(progress("train", rank("2", 11), stopped, rank("1", 3), rank("10.0.0.2", 3),
                         still_for=0.2))
        (hang,) = drain(feed, 1, m.JobProgress)
        assert hang == m.JobProgress("train", COMM, Finding.HANG, ProgressState.ACTIVE, ("3",),
                                     Cause.PROCESS_NOT_RUNNING, 10, hang.since)
        findings = json.loads(harmonctl("-C", str(controller.admin), "job-findings",
                                        "--json").stdout)["findings"]
        assert [(r["rank"], r["host"]) for r in findings[0]["ranks"]] == [("3", "gpu-h2")]
        assert metric(port, "harmonaize_controller_job_findings", finding="hang",
                      cause="process-not-running") == 1
        h2.send(progress("train", rank("2", 12), rank("3", 12)))
        (withdrawn,) = drain(feed, 1, m.JobProgress)
        assert (withdrawn.state, withdrawn.ranks, withdrawn.since) == (
            ProgressState.WITHDRAWN, ("3",), hang.since)
        h1.send(m.ApplicationXid("train", 31, Fault.GRAPHICS_EXCEPTION, ("0", "2"), False,
                                 1.0))
        (xid,) = drain(feed, 1, m.ApplicationXid)
        assert (xid.xid, xid.fault, xid.ranks) == (31, Fault.MEMORY_MANAGEMENT, ("0",))
        assert xid.at > 1e9  # the controller's clock, not the agent's
    assert metric(port, "harmonaize_controller_application_xids_total",
                  fault="memory-management") == 1
    assert metric(port, "harmonaize_controller_job_health_dropped_total",
                  reason="rank_not_placed_here") == 2
    table = harmonctl("-C", str(controller.admin), "job-findings")
    assert table.returncode == 0 and "3@gpu-h2" in table.stdout and "XID 31" in table.stdout
    assert "ranks' progress of job 'train': rank not placed here dropped" in \
        controller.log.read_text()
