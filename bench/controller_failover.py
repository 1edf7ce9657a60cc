"""controller-failover: from a controller replica's SIGKILL to tenants receiving again.

Cluster mode with real processes, each in its own network namespace: a three-node NATS
JetStream cluster, three controller replicas (the default lease), a probe agent sending
job advisories at a steady rate to whichever replica answers, and two recording
tenants, each on a different replica first. Each round kills one replica with SIGKILL,
alternating between the leader (nothing is numbered until a successor holds the lease
and has read the log) and a replica a tenant is connected to (the tenant must move),
and restarts it once the feed flows again.

A round's time is from the kill to the first advisory a tenant receives after the
longest silence that followed it (so an advisory already on its way does not count as
"receiving again"), the slower of the two tenants. At the end the agent stops making
advisories and drains its queue; then each tenant must hold exactly as many advisories
as the agent had acknowledged, at feed numbers that neither repeat nor skip: the lost
and duplicate counts are printed beside the times, and a run with either fails.

    ./scripts/bench controller-failover [--rounds 20] [--lease 2.0]

Last line: ``controller-failover P99 s``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, scratch
from testbed.natscluster import Clustered, read_lines, wait_for
from testbed.netns import Lab

JOB = "job-f"
REPLICAS = ("r1", "r2", "r3")
HOSTS = ("n1", "n2", "n3", *REPLICAS, "a1", "t1", "t2")
RATE = 10.0  # advisories a second: one each 100 ms, the resolution of a round's time
MEMBERS = 64  # the job's ranks on a1; the agent names them in turn


def advisories(record: Path) -> list[tuple[int, float]]:
    """(feed number, time received) of every advisory a tenant was given, in order."""
    return [(line["seq"], line["at"]) for line in read_lines(record)
            if line["kind"] == "job-advisory"]


def acked(record: Path) -> int:
    """Advisories the agent had acknowledged (each line one of its sequence numbers)."""
    return len({line["seq"] for line in read_lines(record)})


def subscribed(record: Path) -> bool:
    try:
        return json.loads(Path(f"{record}.status").read_text())["stats"]["subscriptions"] > 0
    except (OSError, ValueError, KeyError):
        return False


def drained(record: Path) -> bool:
    try:
        status = json.loads(Path(f"{record}.status").read_text())
    except (OSError, ValueError):
        return False
    return status["queued"] == 0 and status["told"] == status["generated"]


def recovered(record: Path, killed_at: float, horizon: float) -> float | None:
    """Seconds from the kill to the advisory that ended the longest silence after it."""
    times = [at for _, at in advisories(record) if at >= killed_at - 1.0]
    after = [t for t in times if t > killed_at]
    if not after or after[-1] < killed_at + horizon:
        return None  # not yet sure the silence is over
    best_gap, end = -1.0, after[0]
    previous = max([t for t in times if t <= killed_at], default=killed_at)
    for t in after:
        if t > killed_at + horizon:
            break
        if t - previous > best_gap:
            best_gap, end = t - previous, t
        previous = t
    return end - killed_at


def serving_tenant(cluster: Clustered, record: Path) -> str | None:
    """The replica the tenant's feed comes through now."""
    try:
        endpoint = json.loads(Path(f"{record}.status").read_text())["endpoint"]
    except (OSError, ValueError, KeyError):
        return None
    return next((r for r in cluster.replicas if f"//{cluster.lab.addr(r)}:" in endpoint), None)


def run(rounds: int, lease: float) -> int:
    if not 1 <= rounds <= 200:
        print("controller-failover: --rounds from 1 to 200", file=sys.stderr)
        return 2
    with scratch() as workdir, Lab(HOSTS, subnet="10.233.0.0/24") as lab:
        cluster = Clustered(lab, workdir, lease=lease, snapshot_interval=30.0)
        cluster.start_all_nats()
        for name in REPLICAS:
            cluster.start_replica(name)
        cluster.leader()
        members = [{"name": str(i), "host": "a1"} for i in range(MEMBERS)]
        replica = cluster.replicas["r1"]
        wait_for(lambda: _try(replica.request, "place", {
            "job": JOB, "tenant": "acme", "members": members}), what="the placement")
        tenants = [cluster.start_tenant("t1", "acme", [f"job/acme/{JOB}/"], ["r1", "r2", "r3"]),
                   cluster.start_tenant("t2", "acme", [f"job/acme/{JOB}/"], ["r2", "r3", "r1"])]
        wait_for(lambda: all(subscribed(t) for t in tenants), 60, "the tenants' subscriptions")
        record = cluster.start_agent("a1", job=JOB, count=10**7, rate=RATE, ranks=MEMBERS)
        wait_for(lambda: all(len(advisories(t)) >= 20 for t in tenants), 60,
                 "the first advisories")
        if any(read_lines(t)[0]["seq"] != 1 for t in tenants):
            print("controller-failover: a tenant missed the first advisories: its "
                  "count would not say what was lost", file=sys.stderr)
            return 1
        times: list[float] = []
        kinds: list[str] = []
        for n in range(rounds):
            leader = cluster.leader()
            victim = leader if n % 2 == 0 else (serving_tenant(cluster, tenants[0]) or leader)
            if victim != leader:
                kinds.append("door")
            else:
                kinds.append("leader")
            killed_at = time.time()
            cluster.kill_replica(victim, signal.SIGKILL)
            horizon = 2 * lease + 4.0  # longer than any silence seen: the lease, twice
            took = [wait_for(lambda t=t, k=killed_at, h=horizon: recovered(t, k, h), horizon + 30,
                             "the feed after the kill") for t in tenants]
            times.append(max(took))
            print(f"round {n + 1}: killed {victim} ({kinds[-1]}), tenants receiving again "
                  f"after {took[0]:.2f} s and {took[1]:.2f} s", file=sys.stderr, flush=True)
            cluster.start_replica(victim)
        # Every acknowledged advisory reaches every tenant once: the agent stops, drains
        # its queue, and the feed settles.
        Path(f"{record}.halt").touch()
        wait_for(lambda: drained(record), 120, "the agent's queue to drain")
        sent = acked(record)
        with contextlib.suppress(TimeoutError, AssertionError):
            wait_for(lambda: all(len(advisories(t)) >= sent for t in tenants), 60,
                     "every acknowledged advisory at every tenant")
        time.sleep(2.0)  # anything more would be a duplicate: give it time to show
        lost = duplicates = 0
        for tenant in tenants:
            numbers = [line["seq"] for line in read_lines(tenant)
                       if line["topic"] == f"job/acme/{JOB}/"]
            repeated = sum(c - 1 for c in Counter(numbers).values())
            holes = (max(numbers) - min(numbers) + 1 - len(set(numbers))) if numbers else 0
            # The tenant subscribed before the first advisory: it holds them all.
            given = len({seq for seq, _ in advisories(tenant)})
            lost += max(0, sent - given) + holes
            duplicates += repeated + max(0, given - sent)
    by_kind = {k: [t for t, kk in zip(times, kinds, strict=True) if kk == k] for k in set(kinds)}
    for kind, values in sorted(by_kind.items()):
        print(f"  {kind:6} kills: {len(values)}, median {statistics.median(values):.2f} s, "
              f"max {max(values):.2f} s", file=sys.stderr)
    print(f"  all {len(times)} rounds: median {statistics.median(times):.2f} s, "
          f"p99 {percentile(times, 99):.2f} s, min {min(times):.2f} s; lease {lease} s; "
          f"{sent} advisories acknowledged, lost {lost}, duplicates {duplicates}",
          file=sys.stderr)
    if lost or duplicates:
        print("controller-failover: acknowledged advisories were lost or duplicated",
              file=sys.stderr)
        return 1
    print(f"controller-failover {percentile(times, 99):.2f} s")
    return 0


def _try(call, *args):  # type: ignore[no-untyped-def]
    try:
        return call(*args) or True
    except Exception:  # no leader yet: ask again
        return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20,
                        help="kills (each takes about 2 x lease + 8 s)")
    parser.add_argument("--lease", type=float, default=2.0,
                        help="the leader's lease in seconds ([cluster] lease; 2.0 by default)")
    args = parser.parse_args()
    sys.exit(run(args.rounds, args.lease))
