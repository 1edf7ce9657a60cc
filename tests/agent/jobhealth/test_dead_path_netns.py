"""A dead path under a job, for real: two hosts in network namespaces, a real agent on
host a with its eBPF links observer on eth0, a declared job's two ranks on a whose
collectives move data to a peer on b over TCP, and a bulk TCP flow from a to b. An nft
rule on b then drops everything to and from a: a's link stays up with no drop or error
of its own, the ranks block in their sockets (asleep, not stopped), and TCP on a keeps
retransmitting. Job health must name the network from those retransmissions."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.netns import Lab
from tests.conftest import ROOT, needs_root, python
from tests.daemons import Agent, start_agent, wait_until

pytestmark = [pytest.mark.jobhealth, needs_root]

JOB = "train-cut"
COMM = 0x0DEAD0000000C071
RANKS_PORT, BULK_PORT = 7311, 5311
TABLE = "hzjhnet"
SCRIPT = ROOT / "tests" / "bin" / "socket_rank.py"
LIBRARY = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
CONFIG = ('[observers.links]\ninclude = ["eth0"]\nmode = "ebpf"\nspeeds = { eth0 = 10000 }\n'
          # Short thresholds so that a finding stands soon; the dead path's own window
          # and segments are the defaults.
          "[jobhealth]\nhang_after = 1.0\nstall_after = 2.0\n")


@pytest.fixture
def lab(make_lab) -> Lab:
    return make_lab(["a", "b"], tag="jhnet")


@pytest.fixture
def partition(lab: Lab) -> Iterator[list[list[str]]]:
    """The nft rules that cut b off from a (applied by the test); the table is removed
    whatever happens, before the namespaces go."""
    a = lab.addr("a")
    rules = [["add", "table", "inet", TABLE],
             ["add", "chain", "inet", TABLE, "in",
              "{ type filter hook input priority 0; policy accept; }"],
             ["add", "rule", "inet", TABLE, "in", "ip", "saddr", a, "drop"],
             ["add", "chain", "inet", TABLE, "out",
              "{ type filter hook output priority 0; policy accept; }"],
             ["add", "rule", "inet", TABLE, "out", "ip", "daddr", a, "drop"]]
    try:
        yield rules
    finally:
        lab.run("b", ["nft", "delete", "table", "inet", TABLE])


def comm_view(agent: Agent) -> dict[str, Any] | None:
    jobs = agent.request("job-health", {"job": JOB})["jobs"]
    return jobs[0]["comms"][0] if jobs and jobs[0]["comms"] else None


def eth0(agent: Agent) -> dict[str, Any]:
    (link,) = agent.request("links")["links"]
    return link


def test_item2_an_nft_partition_behind_a_clean_link_is_named_network(
        spawn, workdir: Path, lab: Lab, partition: list[list[str]]) -> None:
    agent = start_agent(spawn, workdir, "a", links=CONFIG, lab=lab, host="a")
    assert agent.request("links")["mode"] == "ebpf"
    agent.request("declare", {"declaration": {"job": JOB, "revision": 1}})
    b = lab.addr("b")
    lab.popen("b", [sys.executable, str(SCRIPT), "peer", b, str(RANKS_PORT)])
    lab.popen("b", ["iperf3", "-s", "-1", "-p", str(BULK_PORT)],
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: listening(lab, "b", RANKS_PORT) and listening(lab, "b", BULK_PORT),
               timeout=30, what="the peer and the bulk flow's server on b")
    for r in range(2):
        env = {"PATH": "/usr/bin:/bin", "HARMONAIZE_JOB": JOB, "RANK": str(r),
               "HARMONAIZE_TUNER_DIR": str(workdir / "a" / "tuner")}
        lab.popen("a", [sys.executable, str(SCRIPT), "rank", str(LIBRARY), hex(COMM), "2", b,
                        str(RANKS_PORT)], env=env)
    # The bulk flow: always data in flight from a, so a is the side that retransmits.
    lab.popen("a", ["iperf3", "-c", b, "-p", str(BULK_PORT), "-t", "600"],
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    moving = wait_until(lambda: (c := comm_view(agent)) and c["ranks_here"] == 2
                        and c["collectives_min"] > 50 and eth0(agent)["tx_bps"] > 1e8 and c,
                        timeout=60, what="both ranks moving beside the bulk flow")
    assert (moving["finding"], moving["dead_paths"]) == ("moving", [])
    for rule in partition:
        done = lab.run("b", ["nft", *rule])
        assert done.returncode == 0, done.stderr
    view = wait_until(lambda: (c := comm_view(agent)) and c["cause"] == "network" and c,
                      timeout=90, what="the network named from retransmissions")
    assert view["finding"] in ("hang", "stall") and view["dead_paths"] == ["eth0"]
    assert {r["process"] for r in view["laggards"]} <= {"sleeping", "running"}
    # ... though the link is up and clean: the links domain finds no fault of its own.
    health = agent.request("job-health", {"job": JOB})
    assert health["network_fault"] is False
    link = eth0(agent)
    assert (link["errors"], link["drops_per_s"], link["errors_per_s"]) == ("none", 0.0, 0.0)
    assert link["up"] is True
    assert link["totals"]["retransmits"] >= health["retransmit_segments"]
    status = {c["type"]: c for c in agent.request("status")["conditions"]}
    assert status.get("LinkDown", {}).get("status", "False") == "False"
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket),
                                  "job-health"), capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "(a dead path): eth0" in table.stdout, table.stderr
    assert f"job {JOB}: communicator {COMM:x}: {view['finding']} (network)" in \
        agent.log.read_text()


def listening(lab: Lab, host: str, port: int) -> bool:
    out = lab.run(host, ["ss", "-Hltn", f"sport = :{port}"]).stdout
    return bool(out.strip())
