"""The demo's story under pytest: hosts in network namespaces, a tenant feed."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from testbed.cluster import TestCluster
from testbed.demo import HOSTS, capacity_is
from tests.conftest import needs_root

pytestmark = [pytest.mark.foundation, needs_root]


@pytest.fixture
def cluster(make_lab, workdir: Path) -> TestCluster:
    return TestCluster(make_lab(HOSTS), workdir)


def test_capacity_follows_hosts_across_namespaces(cluster: TestCluster) -> None:
    cluster.start_controller()
    tenant = cluster.tenant_watch()
    cluster.start_agent("h1")
    cluster.start_agent("h2")
    up = tenant.wait_for(
        lambda m: capacity_is(2, 0)(m) and m["body"]["gpus_available"]["lo"] == 16, 20,
        "two hosts and their GPUs up")
    assert up["topic"] == "pool/default/H200" and up["category"] == "condition"
    assert up["body"]["gpus_available"] == {"lo": 16, "hi": 31}

    status = cluster.harmonctl("h1", "status")
    assert "host:        h1" in status and "sent / acked:" in status

    assert cluster.stop_agent("h2", signal.SIGTERM) == 0
    down = tenant.wait_for(capacity_is(1, 1), 20, "h2 stopped")
    assert down["body"]["trend"] == "falling" and down["seq"] > up["seq"]

    cluster.start_agent("h2")
    tenant.wait_for(capacity_is(2, 0), 20, "h2 back")
    cluster.stop_agent("h1", signal.SIGKILL)
    tenant.wait_for(capacity_is(1, 1), 20, "h1 counted down after SIGKILL")
    (h1,) = [h for h in cluster.admin_request("hosts") if h["host_id"] == "h1"]
    assert h1["down_reason"] == "missed heartbeats"

    # Nothing the tenant saw names a host or an address.
    seen = json.dumps(tenant.seen)
    for secret in ("h1", "h2", *(cluster.lab.addr(h) for h in HOSTS)):
        assert secret not in seen


def test_a_late_tenant_gets_the_current_state_at_once(cluster: TestCluster) -> None:
    cluster.start_controller()
    cluster.start_agent("h1")
    early = cluster.tenant_watch()

    def settled(message: dict) -> bool:
        return capacity_is(1, 0)(message) and message["body"]["gpus_available"]["lo"] == 8

    current = early.wait_for(settled, 20, "h1 with its eight GPUs")
    late = cluster.tenant_watch()
    # The controller republishes only every 10 s; the late joiner must not wait for that.
    message = late.wait_for(settled, 5, "current conditions on subscribing")
    assert message["body"]["revision"] == current["body"]["revision"]
