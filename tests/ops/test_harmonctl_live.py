"""harmonctl against what a live controller really holds."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from tests.conftest import needs_root, python
from tests.controller.test_feed import Sender, place
from tests.daemons import FakeAgent, start_controller, wait_until

pytestmark = [pytest.mark.hardening, pytest.mark.ops, needs_root]


def test_capacity_shows_pools_and_jobs_once_a_job_health_row_exists(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir)
    place(controller, "job-a", "alpha", "h1", "h1")
    ctx = zmq.Context()
    try:
        Sender(FakeAgent(ctx, controller, "h1")).send(
            m.HostSummary(m.Health.DEGRADED, True, m.GpuCounts(healthy=8)))
        kinds = wait_until(lambda: {r["kind"] for r in controller.request("capacity")}
                           >= {"pool-capacity", "job-health"} or None, what="both rows")
        assert kinds
    finally:
        ctx.destroy(linger=0)
    shown = subprocess.run(python("harmonaize.harmonctl", "-C", str(controller.admin),
                                  "capacity"), capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    pools, jobs = shown.stdout.split("\n\n")
    assert pools.splitlines()[0].split()[:3] == ["TOPIC", "HOSTS", "UP"]
    assert "pool/p/H200" in pools and "job/" not in pools
    header, row = jobs.strip().splitlines()
    assert header.split()[:4] == ["JOB", "TOPIC", "TENANT", "DEGRADED"]
    assert row.split()[:3] == ["job/alpha/job-a/", "alpha", "0,"]


def test_the_controller_reloads_on_sighup_and_keeps_a_bad_file_out(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir)
    text = controller.config.read_text()
    controller.config.write_text(text.replace("min_hosts = 1", "min_hosts = 3")
                                 + "[liveness]\nmissed_heartbeats = 7\n")
    controller.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "configuration reloaded" in controller.log.read_text(), what="reload")
    assert controller.proc.poll() is None and controller.admin.is_socket()
    controller.config.write_text(text.replace('listen = "', 'listen = "udp://'))
    controller.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in controller.log.read_text(), what="the refusal")
    refused = subprocess.run(python("harmonaize.harmonctl", "-C", str(controller.admin),
                                    "reload"), capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "running configuration kept" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    controller.config.write_text(text.replace('feed = "', 'feed = "tcp://127.0.0.1:1"\n#'))
    ok = subprocess.run(python("harmonaize.harmonctl", "-C", str(controller.admin), "reload"),
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert "changes to controller.feed take effect at the next restart" in (
        controller.log.read_text())
    assert controller.request("status")["feed"] != "tcp://127.0.0.1:1"  # still the running one
    assert "Traceback" not in controller.log.read_text()
    assert controller.proc.poll() is None
