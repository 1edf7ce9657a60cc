"""Cluster mode with real processes: a three-node NATS JetStream cluster, controller
replicas, probe agents and recording tenants, each in a network namespace. Replicas
and NATS nodes are killed, partitioned and restarted; what agents were acknowledged
must reach tenants once, at the same numbers whichever replica serves them.

Tenants are subscribed before any agent starts: a fresh subscriber is not sent events
published before it subscribed (docs/wire.md), so an advisory acknowledged before then
is not one it should have. On a busy machine a tenant started beside the agent
subscribed after the first advisories, and the test waited for them in vain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster import Timeout
from testbed.natscluster import FEED_PORT, Clustered, read_lines, wait_for
from tests.conftest import ROOT, needs_root, python

pytestmark = [pytest.mark.cluster, needs_root]

JOB = "job-c"
TOPIC = f"job/acme/{JOB}/"
HOSTS = ("n1", "n2", "n3", "r1", "r2", "r3", "a1", "a2", "t1", "t2")


@pytest.fixture
def cluster(make_lab, workdir: Path) -> Iterator[Clustered]:
    lab = make_lab(HOSTS, subnet="10.232.0.0/24")
    clustered = Clustered(lab, workdir)
    clustered.start_all_nats()
    yield clustered
    # Shown only when the test failed (pytest prints what a passing test wrote to no one).
    for log in sorted(workdir.glob("*.log")) + sorted(workdir.glob("r*/controller.log")):
        print(f"===== {log.relative_to(workdir)}\n{log.read_text()[-4000:]}")
    for status in sorted(workdir.glob("*.status")):
        print(f"===== {status.name}: {status.read_text()}")


def place(cluster: Clustered, members: int, *hosts: str) -> None:
    """The job's ranks 0..members-1 on ``hosts``, in turn (asked of any replica)."""
    replica = next(iter(cluster.replicas.values()))
    wait_for(lambda: _try(replica.request, "place", {
        "job": JOB, "tenant": "acme",
        "members": [{"name": str(i), "host": hosts[i % len(hosts)]}
                    for i in range(members)]}), what="the placement")


def _try(call: Any, *args: Any) -> Any:
    try:
        return call(*args) or True
    except Exception:  # no leader yet: try again
        return None


def acked(record: Path) -> set[int]:
    return {line["n"] for line in read_lines(record)}


def advised(record: Path) -> list[int]:
    """Every rank number the tenant was given in an advisory, in order."""
    return [int(line["body"]["ranks"][0]) for line in read_lines(record)
            if line["kind"] == "job-advisory"]


def check_feed(record: Path) -> None:
    """Each topic's numbers once each and in order, with no hole."""
    seen: dict[str, list[int]] = {}
    for line in read_lines(record):
        seen.setdefault(line["topic"], []).append(line["seq"])
    for topic, seqs in seen.items():
        assert len(seqs) == len(set(seqs)), f"{topic}: a number delivered twice: {seqs}"
        assert seqs == sorted(seqs), f"{topic}: out of order: {seqs}"
        if topic == TOPIC:  # events: every one from the first on
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{topic}: a hole"


def settle(cluster: Clustered, records: list[Path], tenants: list[Path], n: int) -> None:
    """Until the agents are done and every acknowledged advisory reached the tenants."""
    def missing() -> dict[str, list[int]]:
        sent = set().union(*(acked(r) for r in records))
        return {t.name: sorted(sent - set(advised(t))) for t in tenants}

    def done() -> bool:
        sent = set().union(*(acked(r) for r in records))
        return len(sent) >= n and not any(missing().values())
    try:
        wait_for(done, 120, "every acknowledged advisory at every tenant")
    except Timeout as exc:  # say which, so a failure tells lost from never sent
        acks = len(set().union(*(acked(r) for r in records)))
        raise Timeout(f"{exc}: {acks} of {n} acknowledged; not at the tenants: "
                      + "; ".join(f"{name} {gone[:20]}" for name, gone in missing().items())
                      ) from None


def tenants_before_agents(cluster: Clustered, hosts: dict[str, list[str] | None],
                          topics: list[str]) -> list[Path]:
    """Recording tenants on ``hosts`` (each at the replicas named, or all), every one
    subscribed to the job's topic before this returns."""
    return [cluster.start_tenant(host, "acme", topics, replicas, subscribed_to=TOPIC)
            for host, replicas in hosts.items()]


def test_replicas_share_agents_and_tenants_see_one_feed(cluster: Clustered) -> None:
    for name in ("r1", "r2"):
        cluster.start_replica(name)
    leader = cluster.leader()
    place(cluster, 100, "a1", "a2")
    tenants = tenants_before_agents(cluster, {"t1": ["r1"], "t2": ["r2"]},
                                    ["job/acme/", "pool/"])
    # Ranks 0, 2, 4, ... are on a1 and the rest on a2: each agent names its own.
    records = [cluster.start_agent("a1", job=JOB, count=50, rate=40, replicas=["r1"]),
               cluster.start_agent("a2", job=JOB, count=50, rate=40, replicas=["r2"])]
    settle(cluster, records, tenants, 50)
    first, second = (read_lines(t) for t in tenants)
    job = [(x["seq"], x["body"]) for x in first if x["topic"] == TOPIC]
    other = [(x["seq"], x["body"]) for x in second if x["topic"] == TOPIC]
    # One feed: the same messages under the same numbers at either replica. Either tenant
    # may be a message behind when they are read (settle waits for the acknowledged
    # advisories, not for what was published after them), so compare what both have.
    common = min(len(job), len(other))
    assert common >= 50 and job[:common] == other[:common]
    for tenant in tenants:
        check_feed(tenant)
    # A follower learns the leader from its heartbeats; on a loaded machine one may be
    # late, and the status says "no leader known" until the next: wait for one.
    status = wait_for(lambda: (s := cluster.replicas["r2"].request("status"))
                      ["cluster"]["leader"] and s, what="r2 to know its leader")
    assert status["cluster"]["leader"] == leader
    assert set(status["cluster"]["replicas"]) == {"r1", "r2"}
    hosts = {h["host_id"] for h in cluster.replicas["r2"].request("hosts")}
    assert hosts == {"a1", "a2"}  # the leader's view, asked of either replica


@pytest.mark.hardening
def test_a_tenant_subscribed_after_advisories_is_not_sent_them_so_tests_subscribe_first(
        cluster: Clustered) -> None:
    """Why the tests in this file start their tenants first: at any replica, a fresh
    subscriber gets the topic's condition and what is published from then on, never the
    events before it. (Tenants started beside the agent missed its first advisories on
    a busy machine, and the leader-kill test waited for them until it timed out.)"""
    for name in ("r1", "r2"):
        cluster.start_replica(name)
    cluster.leader()
    place(cluster, 200, "a1", "a2")
    [early] = tenants_before_agents(cluster, {"t1": ["r1"]}, ["job/acme/"])
    before = cluster.start_agent("a1", job=JOB, count=20, rate=40, step=2)
    settle(cluster, [before], [early], 20)  # published and at r1: the feed has them
    [late] = tenants_before_agents(cluster, {"t2": ["r2"]}, ["job/acme/"])
    after = cluster.start_agent("a2", job=JOB, count=10, rate=40, first=101, step=2)
    settle(cluster, [before, after], [early], 30)
    settle(cluster, [after], [late], 10)
    assert not set(advised(late)) & acked(before), "events from before it subscribed"
    assert sorted(advised(late)) == sorted(acked(after))
    check_feed(early)
    # The late one: the condition first (its seq may be old), then each number once,
    # without a hole, from the first published after it subscribed.
    job = [line for line in read_lines(late) if line["topic"] == TOPIC]
    assert job[0]["kind"] == "job-health"
    seqs = [line["seq"] for line in job[1:]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


def test_killing_the_leader_loses_nothing_acknowledged_and_delivers_nothing_twice(
        cluster: Clustered) -> None:
    for name in ("r1", "r2", "r3"):
        cluster.start_replica(name)
    leader = cluster.leader()
    place(cluster, 400, "a1")
    tenants = tenants_before_agents(cluster, {"t1": None, "t2": None}, ["job/acme/"])
    record = cluster.start_agent("a1", job=JOB, count=300, rate=30)
    wait_for(lambda: len(acked(record)) >= 80, 60, "the first advisories")
    cluster.kill_replica(leader)  # SIGKILL, mid-stream
    settle(cluster, [record], [t for t in tenants], 300)
    for tenant in tenants:
        check_feed(tenant)
        counts = Counter(advised(tenant))
        assert not [n for n, c in counts.items() if c > 1], "an advisory delivered twice"
        assert acked(record) <= set(counts)
    successor = cluster.leader()
    assert successor != leader
    status = cluster.replicas[successor].request("status")["cluster"]["leading"]
    assert status["terms"] == 1 and status["commit"] > 0
    # What an operator reads: harmonctl -C status at any replica names the leader.
    other = next(r for r in ("r1", "r2", "r3") if r not in (leader, successor))
    shown = subprocess.run(
        python("harmonaize.harmonctl", "-C", "status"), capture_output=True, text=True,
        timeout=30, env={**os.environ,
                         "HARMONCTL_ADMIN_SOCKET": str(cluster.replicas[other].admin)})
    assert shown.returncode == 0, shown.stderr
    lines = dict(line.split(":", 1) for line in shown.stdout.splitlines() if ":" in line)
    assert lines["leader"].strip() == successor
    assert lines["leading"].strip() == "no"
    assert leader not in lines["replicas"] and successor in lines["replicas"]


def test_a_nats_node_killed_and_every_process_restarted(cluster: Clustered) -> None:
    for name in ("r1", "r2"):
        cluster.start_replica(name)
    cluster.leader()
    place(cluster, 200, "a1")
    [tenant] = tenants_before_agents(cluster, {"t1": None}, ["job/acme/"])
    record = cluster.start_agent("a1", job=JOB, count=120, rate=30)
    wait_for(lambda: len(acked(record)) >= 30, 60, "the first advisories")
    cluster.kill_nats("n2")  # R3 streams carry on with two of three
    wait_for(lambda: len(acked(record)) >= 80, 60, "advisories with a node down")
    cluster.start_nats("n2")
    settle(cluster, [record], [tenant], 120)
    before = read_lines(tenant)
    # Everything restarted: the feed goes on at the same numbers, epoch and all.
    for name in list(cluster.replicas):
        cluster.kill_replica(name, signal.SIGTERM)
    for node in list(cluster.nats):
        cluster.kill_nats(node)
    cluster.start_all_nats()
    for name in ("r1", "r2"):
        cluster.start_replica(name)
    cluster.leader()
    place(cluster, 200, "a1", "a2")  # ranks 1, 3, 5, ... now on a2
    # a2 names its own ranks, ones no advisory named before: 121, 123, ... 139
    again = cluster.start_agent("a2", job=JOB, count=10, rate=20, first=121, step=2)
    wait_for(lambda: len(acked(again)) >= 10, 90, "the second agent's advisories")
    wait_for(lambda: acked(again) <= set(advised(tenant)), 90,
             "the advisories after the restart")
    check_feed(tenant)
    assert acked(record) <= set(advised(tenant))
    assert not [n for n, c in Counter(advised(tenant)).items() if c > 1], "delivered twice"
    assert len(read_lines(tenant)) > len(before)
    status = Path(f"{tenant}.status").read_text()
    assert '"resets": 0' in status  # one epoch throughout


def test_a_partitioned_leader_steps_down_and_its_successor_goes_on(
        cluster: Clustered) -> None:
    for name in ("r1", "r2", "r3"):
        cluster.start_replica(name)
    leader = cluster.leader()
    place(cluster, 400, "a1")
    [tenant] = tenants_before_agents(cluster, {"t1": None}, ["job/acme/"])
    record = cluster.start_agent("a1", job=JOB, count=240, rate=30)
    wait_for(lambda: len(acked(record)) >= 60, 60, "the first advisories")
    cluster.lab.cut(leader)
    successor = wait_for(lambda: _other_leader(cluster, leader), 60, "a new leader")
    time.sleep(cluster.lease * 2)
    cluster.lab.cut(leader, off=False)
    settle(cluster, [record], [tenant], 240)
    check_feed(tenant)
    assert not [n for n, c in Counter(advised(tenant)).items() if c > 1]
    # Healed, the old leader follows: one leader, whose log was never forked.
    wait_for(lambda: (cluster.replicas[leader].status() or {}).get("cluster", {})
             .get("bus") == "connected", 60, "the old leader back on the bus")
    wait_for(lambda: not cluster.replicas[leader].status()["cluster"]["leading"], 30,
             "the old leader to follow")
    assert cluster.leader() == successor


def _other_leader(cluster: Clustered, old: str) -> str | None:
    for name, replica in cluster.replicas.items():
        if name == old:
            continue
        status = replica.status()
        if status and status["cluster"].get("leading"):
            return name
    return None


def test_one_tenants_flood_is_throttled_at_its_replica_and_agents_go_on(
        cluster: Clustered) -> None:
    cluster.start_replica("r1")
    cluster.leader()
    place(cluster, 100, "a1")
    record = cluster.start_agent("a1", job=JOB, count=60, rate=30)
    creds = cluster.keyring.tenant("acme")
    flood = cluster.lab.run("t1", [
        sys.executable, str(ROOT / "tests" / "bin" / "flood_requests.py"),
        f"tcp://{cluster.lab.addr('r1')}:{FEED_PORT}", str(creds.key),
        str(creds.server_key), JOB, "2000"], timeout=60)
    assert flood.returncode == 0, flood.stderr
    answered = json.loads(flood.stdout)["answered"]
    # The budget (100 saved up, 20 a second) lets about a hundred through; the rest are
    # dropped at the replica's door, never reaching the leader's queue.
    assert 0 < answered <= 300, answered
    status = cluster.replicas["r1"].request("status")
    assert status["feed_stats"]["throttled_requests"] >= 2000 - 300
    # The agent was not held up: every advisory acknowledged, and promptly.
    wait_for(lambda: len(acked(record)) >= 60, 30, "the agent's advisories")
