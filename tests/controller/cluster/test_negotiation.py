"""Negotiation in cluster mode: a tenant negotiates through whichever replica it reaches
(its requests go to the leader), with ``harmonaize-tenant negotiate`` in its own network
namespace; the leader is SIGKILLed, and its successor keeps the hold and the open offer
(both are in the commits it reads back) and takes the offer's acceptance."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.natscluster import FEED_PORT, Clustered, wait_for
from tests.conftest import needs_root

pytestmark = [pytest.mark.negotiation, pytest.mark.cluster, needs_root]

REPLICAS = ("r1", "r2")
NEGOTIATING = "[negotiation]\nweights = { acme = 1.0, globex = 1.0 }\n"


def negotiate(bus: Clustered, *args: str) -> list[dict[str, Any]]:
    """``harmonaize-tenant negotiate ARGS --json`` as acme, from host t, given every
    replica; its answers (a refusal fails the test with the tool's own line)."""
    creds = bus.keyring.tenant("acme")
    feeds = [a for r in REPLICAS for a in ("--feed", f"tcp://{bus.lab.addr(r)}:{FEED_PORT}")]
    done = bus.lab.run("t", [sys.executable, "-m", "harmonaize.tenant.cli", "negotiate",
                             *args, "--json", "--timeout", "20", *feeds,
                             "--key", str(creds.key), "--server-key", str(creds.server_key)],
                       timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def holds(bus: Clustered, replica: str) -> list[tuple[str, int]] | None:
    try:
        return [(h["id"], h["count"]) for h in bus.replicas[replica].request("holds")]
    except Exception:  # no leader to ask yet
        return None


def test_a_leader_change_keeps_a_hold_and_an_open_offer(make_lab, workdir: Path) -> None:
    lab = make_lab(["n1", *REPLICAS, "a1", "t"], subnet="10.236.0.0/24")
    bus = Clustered(lab, workdir, nodes=("n1",))
    bus.keyring.tenant("acme")  # filed before the replicas read their allow-lists
    bus.start_all_nats()
    for name in REPLICAS:
        bus.start_replica(name, NEGOTIATING)
    # A host of 8 free GPUs in pool p, heartbeating; its advisories name no placed job.
    bus.start_agent("a1", job="job-none", count=10**6, rate=0.001)
    wait_for(lambda: any(c.get("gpus_available", {}).get("lo", 0) >= 8
                         for c in (_try(bus.replicas["r2"].request, "capacity") or [])),
             90, "the pool's release at the leader")

    start = f"+{2 * 3600}"
    window = ["--pool", "p", "--class", "H200", "--earliest", start,
              "--latest", f"+{3 * 3600}", "--duration", "3600"]
    (offer,) = negotiate(bus, "propose", "n1", "--min", "1", "--max", "2", *window)
    assert (offer["outcome"], offer["count"]) == ("offer", 2), offer
    (held,) = negotiate(bus, "accept", "n1", "--offer", offer["offer_id"])
    assert held["outcome"] == "hold"
    (pending,) = negotiate(bus, "propose", "n2", "--min", "1", "--max", "1", *window)
    assert pending["outcome"] == "offer", pending

    leader = bus.leader()
    bus.kill_replica(leader, signal.SIGKILL)
    successor = next(r for r in REPLICAS if r != leader)
    wait_for(lambda: (bus.replicas[successor].status() or {}).get("cluster", {})
             .get("leading"), 60, "the successor to lead")
    assert wait_for(lambda: holds(bus, successor), 30, "the successor's holds") == [
        ("acme/n1", 2)]
    listed = {n["request_id"]: n for n in negotiate(bus, "list")}
    assert {k: n["outcome"] for k, n in listed.items()} == {"n1": "hold", "n2": "offer"}
    assert listed["n1"]["start"] == held["start"]
    # The offer made by the dead leader is taken by its successor.
    (taken,) = negotiate(bus, "accept", "n2", "--offer", pending["offer_id"])
    assert (taken["outcome"], taken["count"]) == ("hold", 1)
    assert sorted(wait_for(lambda: holds(bus, successor), 30, "both holds")) == [
        ("acme/n1", 2), ("acme/n2", 1)]


def _try(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # no leader yet: try again
        return None
