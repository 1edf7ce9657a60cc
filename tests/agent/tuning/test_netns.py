"""The tuning loop for real: an agent in a namespace, iperf3 traffic, the real plugin.

Host "a" runs the agent, watching its eth0 with eBPF; a veth pair joins it to
host "b". A stand-in rank (tests/bin/nccl_rank.py) loads the real tuner
plugin in "a" and issues collectives, so what the agent publishes is checked
where it matters: in the plugin's answers, collective by collective.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.plugin.shm import policy_path, read_policy
from agent.tuning.policies import derive
from harmonaize.messages import JobDeclaration
from harmonaize.schema import from_plain
from testbed.netns import Lab
from tests.conftest import ROOT, Spawn, needs_root, python
from tests.daemons import Agent, start_agent, wait_until

pytestmark = [pytest.mark.tuning, needs_root]

PLUGIN = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
RANK = ROOT / "tests" / "bin" / "nccl_rank.py"
JOB = "train-1"
COMM = 0x5EED000012345678
SPEED = 40  # Mb/s the agent is told eth0 carries
DECLARATION = {
    "job": JOB, "revision": 1,
    "tuning": [{"collectives": ["allreduce"], "algorithms": ["ring", "tree"],
                "protocols": ["ll", "simple"], "min_channels": 2, "max_channels": 16}],
    "bulk": {"floor_mbps": 10, "ports": [5202]},
}


@pytest.fixture
def lab(make_lab) -> Lab:
    return make_lab(["a", "b"], pair=True)


def config(workdir: Path, **tuning: object) -> str:
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in tuning.items())
    return ('[observers.links]\ninclude = ["eth0"]\nmode = "ebpf"\n'
            f"speeds = {{ eth0 = {SPEED} }}\n"
            f'[tuning]\npolicy_dir = "{workdir / "tuner"}"\n' + extra)


def agent_in(spawn: Spawn, workdir: Path, lab: Lab, **tuning: object) -> Agent:
    return start_agent(spawn, workdir, "a", links=config(workdir, **tuning), lab=lab)


def declare(agent: Agent, declaration: dict) -> None:
    agent.request("declare", {"declaration": declaration})


def rank(spawn: Spawn, workdir: Path, lab: Lab, rate: int = 200) -> Path:
    out = workdir / "rank.log"
    env = {**os.environ, "HARMONAIZE_JOB": JOB, "HARMONAIZE_TUNER_DIR": str(workdir / "tuner")}
    spawn(lab.cmd("a", [sys.executable, str(RANK), str(PLUGIN), hex(COMM), "1", "1",
                        str(rate), str(out), "--nccl", "23203"]), env=env)
    return out


def outcomes(log: Path) -> list[tuple[int, str, str, int]]:
    rows = []
    for line in log.read_text().splitlines():
        index, algo, proto, channels = line.split()
        rows.append((int(index), algo, proto, int(channels)))
    return rows


def iperf(spawn: Spawn, lab: Lab, port: int, seconds: float) -> subprocess.Popen:
    spawn(lab.cmd("b", ["iperf3", "-s", "-1", "-p", str(port)]), stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return spawn(lab.cmd("a", ["iperf3", "-c", lab.addr("b"), "-p", str(port), "-t",
                               str(seconds), "-J"]), stdout=subprocess.PIPE, text=True)


def received_bps(client: subprocess.Popen) -> float:
    out, _ = client.communicate(timeout=60)
    assert client.returncode == 0, out
    return json.loads(out)["end"]["sum_received"]["bits_per_second"]


def shaping(lab: Lab) -> tuple[str, str, str]:
    def show(*what: str) -> str:
        return lab.run("a", ["tc", *what, "show", "dev", "eth0"]).stdout

    return show("qdisc"), show("class"), lab.run(
        "a", ["tc", "filter", "show", "dev", "eth0", "egress"]).stdout


def shaped(lab: Lab) -> bool:
    """The agent's classes and filter are in place. The three reads are no snapshot, but
    the agent attaches the filter last, and the filter is read last."""
    _, classes, filters = shaping(lab)
    return "485a:100" in classes and "hz_bulk_egress" in filters


def test_congestion_changes_the_plugins_choice_at_the_activation_point(
        spawn, workdir: Path, lab: Lab) -> None:
    # A 40 Mb/s link: TBF on a's eth0 (someone else's root qdisc: the agent leaves it).
    assert lab.run("a", ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                         f"{SPEED}mbit", "burst", "32kb", "latency", "50ms"]).returncode == 0
    agent = agent_in(spawn, workdir, lab, hold=1.0)
    declare(agent, {**DECLARATION, "bulk": None})
    log = rank(spawn, workdir, lab)
    wait_until(lambda: agent.request("policy", {"job": JOB})["communicators"],
               what="the agent to see the rank's communicator")
    assert agent.request("jobs")["jobs"][0]["choice"] == "default"
    assert outcomes(log) == [(0, "ring", "ll", 0)]  # NCCL's own choice

    client = iperf(spawn, lab, 5201, seconds=5)
    choices = derive(from_plain(JobDeclaration, {**DECLARATION, "bulk": None}))

    def switched() -> object:
        policy = read_policy(policy_path(workdir / "tuner", JOB))
        entry = policy.entry(COMM)
        return (entry is not None and entry.after is not None and not entry.pending
                and (policy, entry))

    policy, entry = wait_until(switched, timeout=30, what="a congested policy")
    assert policy.rulesets[entry.after] in (choices.get("congested").rules,
                                            choices.get("severe").rules)
    view = agent.request("policy", {"job": JOB})
    # Usually straight to severe; TCP's slow start may show a moderate level first.
    change = next(h for h in view["history"] if h["kind"] == "local")
    assert change["to"] in ("congested", "severe") and "eth0: " in change["reason"]
    # Within two sampling intervals: the pass that first saw the congestion, or the next.
    assert change["step"] - change["onset_step"] <= 1
    # Every collective from the activation point on follows the policy, none before.
    ((comm, at),) = change["activations"]
    assert int(comm, 16) == COMM
    wait_until(lambda: len(outcomes(log)) >= 2, what="the rank to switch")
    cap = {"congested": 8, "severe": 4}[change["to"]]
    assert outcomes(log)[1] == (at, "ring", "simple", cap)
    received_bps(client)

    # Calm again: back to NCCL's own choice after the hold (through "congested": a
    # level falls one step per hold), each step at an agreed index.
    def returned() -> object:
        entry = read_policy(policy_path(workdir / "tuner", JOB)).entry(COMM)
        return entry is not None and entry.after is None and not entry.pending and entry

    back = wait_until(returned, timeout=30, what="the return to NCCL's choice")
    wait_until(lambda: outcomes(log)[-1][0] >= back.at, what="the rank to return")
    assert outcomes(log)[-1] == (back.at, "ring", "ll", 0)
    kinds = [(h["from"], h["to"]) for h in agent.request("policy", {"job": JOB})["history"]
             if h["kind"] == "local"]
    assert kinds[0][0] == "default" and kinds[-1][1] == "default"
    assert "tbf" in shaping(lab)[0]
    assert agent.request("jobs")["traffic_classes"]["links"] == {}


def test_bulk_keeps_its_floor_and_the_rest_goes_to_the_collectives(
        spawn, workdir: Path, lab: Lab) -> None:
    agent = agent_in(spawn, workdir, lab)
    declare(agent, DECLARATION)
    wait_until(lambda: shaped(lab), what="the traffic classes")
    qdiscs, classes, filters = shaping(lab)
    assert "qdisc htb 485a: root" in qdiscs
    assert "class htb 485a:10 parent 485a:1 " in classes and "rate 30Mbit ceil 40Mbit" in classes
    assert "class htb 485a:100 parent 485a:1 " in classes and "rate 10Mbit ceil 40Mbit" in classes
    assert "hz_bulk_egress" in filters
    # Both greedy: without the classes they would split the link about evenly.
    other, bulk = iperf(spawn, lab, 5201, seconds=6), iperf(spawn, lab, 5202, seconds=6)
    other_bps, bulk_bps = received_bps(other), received_bps(bulk)
    assert bulk_bps > 0.7 * 10e6, (other_bps, bulk_bps)  # its floor
    assert other_bps > 1.8 * bulk_bps, (other_bps, bulk_bps)  # the rest, first
    assert agent.request("jobs")["traffic_classes"]["bulk_packets"] > 1000

    # Bulk alone may use the whole link (ceil = link).
    alone = received_bps(iperf(spawn, lab, 5202, seconds=3))
    assert alone > 0.7 * SPEED * 1e6

    declare(agent, {"job": JOB, "revision": 2, "withdrawn": True})
    wait_until(lambda: not shaping(lab)[1], what="the classes to go")
    qdiscs, _, filters = shaping(lab)
    assert "htb" not in qdiscs and "hz_bulk" not in filters
    assert not policy_path(workdir / "tuner", JOB).exists()


def test_a_killed_agents_classes_are_removed_by_the_next(spawn, workdir: Path,
                                                         lab: Lab) -> None:
    agent = agent_in(spawn, workdir, lab)
    declare(agent, DECLARATION)
    wait_until(lambda: shaped(lab), what="the traffic classes")
    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(timeout=10)
    assert "485a:100" in shaping(lab)[1] and "hz_bulk_egress" in shaping(lab)[2]

    agent = agent_in(spawn, workdir, lab)
    wait_until(lambda: "removed traffic classes left by a previous agent"
               in agent.log.read_text(), what="the clean-up")
    qdiscs, classes, filters = shaping(lab)
    assert "htb" not in qdiscs and not classes and "hz_bulk" not in filters
    assert "hz_tc_e0" in filters  # the link observer's own filter is untouched

    declare(agent, DECLARATION)
    wait_until(lambda: shaped(lab), what="the classes again")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=10) == 0
    qdiscs, classes, filters = shaping(lab)
    assert "htb" not in qdiscs and not classes and not filters


def test_someone_elses_root_qdisc_is_reported_and_left_alone(spawn, workdir: Path,
                                                             lab: Lab) -> None:
    assert lab.run("a", ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "77:", "tbf",
                         "rate", "1gbit", "burst", "64kb", "latency", "50ms"]).returncode == 0
    agent = agent_in(spawn, workdir, lab)
    declare(agent, DECLARATION)
    links = wait_until(lambda: agent.request("jobs")["traffic_classes"]["links"],
                       what="the shaping status")
    assert links == {"eth0": "not shaped: root qdisc tbf 77:0 belongs to someone else"}
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), "jobs"),
                           capture_output=True, text=True, timeout=30).stdout
    assert "eth0 not shaped: root qdisc tbf 77:0 belongs to someone else" in table
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=10) == 0
    assert "qdisc tbf 77: root" in shaping(lab)[0]
