"""A job across two hosts: the tenant declares through the controller, the hosts agree.

Hosts "a" and "b" each run an agent and a stand-in rank of one communicator
that spans both (the real tuner plugin, tests/bin/nccl_rank.py). Congestion
on a's link only must still switch *both* hosts, to the same choice, at the
same collective: the controller decides, each agent publishes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.plugin.shm import policy_path, read_policy
from testbed.cluster import TestCluster
from tests.conftest import ROOT, needs_root

pytestmark = [pytest.mark.tuning, needs_root]

PLUGIN = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
RANK = ROOT / "tests" / "bin" / "nccl_rank.py"
JOB = "train-2"
COMM = 0x5EED0000CAFE0002
SPEED = 40


def links(speed: int) -> str:
    return ('[observers.links]\ninclude = ["eth0"]\nmode = "ebpf"\n'
            f"speeds = {{ eth0 = {speed} }}\n")
DECLARATION = {
    "job": JOB, "revision": 1,
    "tuning": [{"collectives": ["allreduce"], "algorithms": ["ring", "tree"],
                "protocols": ["ll", "simple"], "min_channels": 2, "max_channels": 16}],
}


@pytest.fixture
def cluster(make_lab, workdir: Path) -> TestCluster:
    return TestCluster(make_lab(["controller", "a", "b", "tenant"]), workdir)


def outcomes(log: Path) -> list[tuple[int, str, str, int]]:
    rows = []
    for line in log.read_text().splitlines() if log.exists() else []:
        index, algo, proto, channels = line.split()
        rows.append((int(index), algo, proto, int(channels)))
    return rows


def declare(cluster: TestCluster, workdir: Path) -> None:
    """The tenant declares the job's tuning ranges (through whichever controller)."""
    declaration = workdir / "declaration.json"
    declaration.write_text(json.dumps(DECLARATION))
    declared = cluster.tenant_cli("declare", str(declaration))
    assert declared.returncode == 0, declared.stderr


def start_ranks(cluster: TestCluster, workdir: Path
                ) -> tuple[dict[str, Path], list[subprocess.Popen[bytes]]]:
    """Rank 0 on a and rank 1 on b, each the real plugin in a stand-in; their logs."""
    logs = {h: workdir / f"rank-{h}.log" for h in ("a", "b")}
    ranks = []
    for index, host in enumerate(("a", "b")):
        env = {**os.environ, "HARMONAIZE_JOB": JOB,
               "HARMONAIZE_TUNER_DIR": str(cluster.policy_dir(host)), "RANK": str(index)}
        ranks.append(cluster.lab.popen(host, [sys.executable, str(RANK), str(PLUGIN),
                                              hex(COMM), "2", "2", "200", str(logs[host]),
                                              "--nccl", "23203"], env=env))
    return logs, ranks


def entry(cluster: TestCluster, host: str) -> object:
    path = policy_path(cluster.policy_dir(host), JOB)
    if not path.exists():
        return None
    found = read_policy(path).entry(COMM)
    return (found if found is not None and found.after is not None and not found.pending
            else None)


def test_two_hosts_switch_together_on_one_hosts_congestion(cluster: TestCluster,
                                                           workdir: Path) -> None:
    assert cluster.lab.run("a", ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                                 f"{SPEED}mbit", "burst", "32kb", "latency",
                                 "50ms"]).returncode == 0
    cluster.start_controller()
    # a's link is the 40 Mb/s bottleneck; b's is told it carries 10 Gb/s, so the same
    # traffic is calm there: only a's agent sees congestion.
    cluster.start_agent("a", gpus=0, extra=links(SPEED), tuning="hold = 1.0\n")
    cluster.start_agent("b", gpus=0, extra=links(10_000), tuning="hold = 1.0\n")
    cluster.admin_request("place", {"job": JOB, "tenant": "acme", "members": [
        {"name": "0", "host": "a"}, {"name": "1", "host": "b"}]})
    declare(cluster, workdir)
    for host in ("a", "b"):
        jobs = cluster.agent_request(host, "jobs")["jobs"]
        deadline = time.monotonic() + 20
        while not jobs and time.monotonic() < deadline:
            time.sleep(0.2)
            jobs = cluster.agent_request(host, "jobs")["jobs"]
        assert [j["job"] for j in jobs] == [JOB], f"{host} never got the declaration"

    logs, ranks = start_ranks(cluster, workdir)
    try:
        deadline = time.monotonic() + 30
        while not all(cluster.agent_request(h, "policy", {"job": JOB})["communicators"]
                      for h in ("a", "b")):
            assert time.monotonic() < deadline, "the agents never saw the ranks"
            time.sleep(0.2)
        # Congest a's link only: b's own links are calm.
        server = cluster.lab.popen("b", ["iperf3", "-s", "-1", "-p", "5201"],
                                   stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        client = cluster.lab.popen("a", ["iperf3", "-c", cluster.lab.addr("b"), "-p", "5201",
                                         "-t", "6"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (entry(cluster, "a") and entry(cluster, "b")):
            assert time.monotonic() < deadline, "no agreed policy on both hosts"
            time.sleep(0.1)
        at_a, at_b = entry(cluster, "a"), entry(cluster, "b")
        assert at_a.at == at_b.at
        pa = read_policy(policy_path(cluster.policy_dir("a"), JOB))
        pb = read_policy(policy_path(cluster.policy_dir("b"), JOB))
        assert pa.rulesets[at_a.after] == pb.rulesets[at_b.after]
        # Both ranks switch exactly at the agreed collective, to the same answer.
        deadline = time.monotonic() + 30
        while not all(len(outcomes(logs[h])) >= 2 for h in ("a", "b")):
            assert time.monotonic() < deadline, "a rank never switched"
            time.sleep(0.1)
        assert outcomes(logs["a"])[1] == outcomes(logs["b"])[1]
        assert outcomes(logs["a"])[1][0] == at_a.at
        jobs = {j["job"]: j for j in cluster.admin_request("jobs")}
        assert jobs[JOB]["tuning"]["choice"] in ("congested", "severe")
        reports = jobs[JOB]["tuning"]["reports"]
        assert reports["a"]["severity"] > 0 and reports["b"]["severity"] == 0
        client.wait(timeout=30)
        server.wait(timeout=30)
    finally:
        for proc in ranks:
            proc.terminate()
            proc.wait(timeout=10)
