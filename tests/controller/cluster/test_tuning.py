"""Multi-host tuning agreement in cluster mode, across the leader's death.

The job of tests/e2e/test_tuning_multihost.py (two hosts, a real tuner plugin in a stand-in
rank on each, congestion on one host's link only), but with the controller as two
replicas over NATS JetStream and the agents given both. The leader is SIGKILLed right
after the hosts agreed to switch; when the congestion ends, the switch back must come
from the successor, again the same choice at the same collective on both hosts, and the
ranks must never have answered differently.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent.plugin.shm import policy_path, read_policy
from testbed.cluster import TestCluster
from testbed.natscluster import AGENT_PORT, Clustered, wait_for
from tests.conftest import needs_root
from tests.e2e.test_tuning_multihost import (
    COMM,
    JOB,
    SPEED,
    declare,
    links,
    outcomes,
    start_ranks,
)

pytestmark = [pytest.mark.cluster, pytest.mark.tuning, needs_root]

REPLICAS = ("controller", "r2")


def agreed(cluster: TestCluster, host: str) -> tuple[int, object] | None:
    """The host's agreed switch for the communicator: (collective index, the rules from
    then on; None: NCCL's own choice), or None while there is none or it is pending."""
    path = policy_path(cluster.policy_dir(host), JOB)
    if not path.exists():
        return None
    policy = read_policy(path)
    found = policy.entry(COMM)
    if found is None or found.pending or (found.after is None and found.before is None):
        return None
    return found.at, None if found.after is None else policy.rulesets[found.after]


def test_agreement_goes_on_from_the_successor_when_the_leader_dies(
        make_lab, workdir: Path) -> None:
    lab = make_lab(["n1", *REPLICAS, "a", "b", "tenant"], subnet="10.234.0.0/24")
    bus = Clustered(lab, workdir, nodes=("n1",))
    bus.start_all_nats()
    for name in REPLICAS:
        bus.start_replica(name)
    endpoints = ", ".join(f'"tcp://{lab.addr(r)}:{AGENT_PORT}"' for r in REPLICAS)
    cluster = TestCluster(lab, workdir,
                          agent_overrides=f"endpoints = [{endpoints}]\nfailover = 1.0\n")
    assert lab.run("a", ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                         f"{SPEED}mbit", "burst", "32kb", "latency", "50ms"]).returncode == 0
    cluster.start_agent("a", gpus=0, extra=links(SPEED), tuning="hold = 1.0\n")
    cluster.start_agent("b", gpus=0, extra=links(10_000), tuning="hold = 1.0\n")
    anyone = bus.replicas["r2"]
    wait_for(lambda: {h["host_id"] for h in anyone.request("hosts")} >= {"a", "b"}, 60,
             "both hosts at the leader")
    anyone.request("place", {"job": JOB, "tenant": "acme", "members": [
        {"name": "0", "host": "a"}, {"name": "1", "host": "b"}]})
    declare(cluster, workdir)
    for host in ("a", "b"):
        wait_for(lambda h=host: cluster.agent_request(h, "jobs")["jobs"], 30,
                 f"the declaration at {host}")

    logs, ranks = start_ranks(cluster, workdir)
    try:
        wait_for(lambda: all(cluster.agent_request(h, "policy", {"job": JOB})["communicators"]
                             for h in ("a", "b")), 30, "the ranks at both agents")
        server = lab.popen("b", ["iperf3", "-s", "-1", "-p", "5201"],
                           stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        client = lab.popen("a", ["iperf3", "-c", lab.addr("b"), "-p", "5201", "-t", "6"],
                           stdout=subprocess.DEVNULL)
        first = wait_for(lambda: (x := agreed(cluster, "a")) and x[1] is not None
                         and x == agreed(cluster, "b") and x, 30,
                         "an agreed switch on both hosts")
        # The switch was agreed: kill the replica that decided it.
        leader = bus.leader()
        bus.kill_replica(leader, signal.SIGKILL)
        successor = wait_for(lambda: next(
            (r for r in REPLICAS if r != leader and (bus.replicas[r].status() or {})
             .get("cluster", {}).get("leading")), None), 30, "a successor")
        client.wait(timeout=30)
        server.wait(timeout=30)
        # Calm again: the way back is agreed by the successor, on both hosts alike.
        second = wait_for(lambda: (x := agreed(cluster, "a")) and x[0] > first[0]
                          and x == agreed(cluster, "b") and x, 60,
                          "the switch back agreed on both hosts")
        assert second[1] != first[1]
        wait_for(lambda: all(len(outcomes(logs[h])) >= 3 for h in ("a", "b")), 60,
                 "both ranks past the switch back")
        # Every collective both ranks logged: the same answer at every index.
        at_a, at_b = dict((o[0], o[1:]) for o in outcomes(logs["a"])), \
            dict((o[0], o[1:]) for o in outcomes(logs["b"]))
        assert {i: at_a[i] for i in at_a if i in at_b} == {i: at_b[i] for i in at_a if i in at_b}
        assert second[0] in at_a and second[0] in at_b
        status = bus.replicas[successor].request("status")["cluster"]
        assert status["leader"] == successor and status["leading"]["terms"] >= 1
    finally:
        for proc in ranks:
            proc.terminate()
            proc.wait(timeout=10)
