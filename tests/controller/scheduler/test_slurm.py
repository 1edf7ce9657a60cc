"""Drains and resumes in a real Slurm (issue 29 item 2), with real slurmctld and slurmd,
a real controller and a real agent on the fake NVML: our reason as ``scontrol show
node`` reports it, resume on release, someone else's drain and a hand-edited reason
left alone, the breaker, shadow mode, an operator's cancel across a restart, and a
failing or hung scontrol."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.slurm import SlurmCluster
from tests.conftest import free_port, needs_root, python
from tests.daemons import wait_until
from tests.schedulerrig import Rig, hand, start_rig

pytestmark = [pytest.mark.scheduler, needs_root]
pytest_plugins = ["tests.slurmcluster"]  # the make_slurm fixture

OUR_REASON = "hz: gpu 2 quarantined: drain"


def harmonctl(rig: Rig, *args: str) -> str:
    done = subprocess.run(python("harmonaize.harmonctl", "-C", str(rig.controller.admin),
                                 *args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quarantined_gpu_drains_the_node_with_our_reason_and_release_resumes_it(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    metrics = free_port()
    rig = start_rig(spawn, workdir, make_slurm(count=2),
                    extra=f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    agent = rig.agent("h1")
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(rig.drained, what="the node drained in slurmctld")
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read()
    assert b'scheduler_actions_total{kind="drain",outcome="done"} 1' in scraped
    assert rig.node()["Reason"].startswith(OUR_REASON + " [")  # Slurm adds [user@time]
    assert not rig.drained(1)  # the other node is nobody's business
    agent.request("release", {"gpu": 2, "force": True})
    wait_until(lambda: not rig.drained(), what="the node resumed")
    wait_until(lambda: rig.row()["situation"] == "free", what="the loop to see it resumed")
    counters = rig.view()["counters"]
    assert {k: v for k, v in counters.items() if k != "passes"} == {
        "read_failures": 0, "drain_done": 1, "resume_done": 1}


def test_someone_elses_drain_is_never_resumed_nor_drained_over(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    cluster = make_slurm(count=2)
    hand(cluster, "update", f"nodename={cluster.nodes[0]}", "state=drain", "reason=bad fan")
    rig = start_rig(spawn, workdir, cluster)
    agent = rig.agent("h1")
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(lambda: rig.row().get("intent") == "leave alone (not ours)",
               what="the loop to see the node is someone else's")
    agent.request("release", {"gpu": 2, "force": True})
    rig.passes_after(3)
    assert rig.drained() and rig.node()["Reason"].startswith("bad fan [")
    assert len(rig.log_lines("drained or down by someone else")) == 1  # said once


def test_a_hand_edited_reason_makes_the_drain_theirs(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    cluster = make_slurm(count=2)
    rig = start_rig(spawn, workdir, cluster)
    agent = rig.agent("h1")
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(rig.drained, what="our drain")
    hand(cluster, "update", f"nodename={cluster.nodes[0]}", "reason=alice checks gpu 2")
    wait_until(lambda: rig.row().get("situation") == "theirs", what="the drain disowned")
    agent.request("release", {"gpu": 2, "force": True})
    rig.passes_after(3)
    assert rig.drained() and rig.node()["Reason"].startswith("alice checks gpu 2")
    assert len(rig.log_lines("edited by hand")) == 1
    assert rig.log_lines("by someone else") == []  # one line, not a second in other words


def test_breaker_holds_a_drain_beyond_the_partition_share_until_there_is_room(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    cluster = make_slurm(count=3)
    hand(cluster, "update", f"nodename={cluster.nodes[2]}", "state=drain", "reason=bad psu")
    rig = start_rig(spawn, workdir, cluster, share=0.34)  # one node of three
    agent = rig.agent("h1")
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(lambda: rig.row().get("held", "").startswith("breaker"),
               what="the drain held by the breaker")
    rig.passes_after(2)
    assert not rig.drained()
    hand(cluster, "update", f"nodename={cluster.nodes[2]}", "state=resume")
    wait_until(rig.drained, what="the held drain done once there was room")
    assert rig.node()["Reason"].startswith(OUR_REASON)


def test_shadow_mode_logs_what_it_would_do_and_does_nothing_until_reloaded_to_act(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    rig = start_rig(spawn, workdir, make_slurm(count=2), mode="shadow")
    agent = rig.agent("h1")
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(lambda: rig.log_lines("shadow mode: would drain"), what="the shadow line")
    rig.passes_after(3)
    assert not rig.drained()
    assert len(rig.log_lines("shadow mode: would drain")) == 1
    assert rig.row()["held"] == "shadow mode"
    config = rig.controller.config
    config.write_text(config.read_text().replace('mode = "shadow"', 'mode = "act"'))
    rig.controller.request("reload")
    wait_until(rig.drained, what="the drain once the operator set act")


def test_operator_cancel_survives_a_controller_restart_which_does_not_act_twice(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    cluster = make_slurm(count=2)
    rig = start_rig(spawn, workdir, cluster, hosts=("h1", "h2"))
    h1, h2 = rig.agent("h1"), rig.agent("h2")
    h2.request("drain", {"gpu": 1, "reason": "looks odd"})
    wait_until(lambda: rig.drained(1), what="h2's node drained")
    harmonctl(rig, "scheduler", "cancel", cluster.nodes[0])
    h1.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(lambda: rig.row().get("held") == "cancelled by an operator",
               what="the cancelled node's drain held")
    rig.restart_controller()
    assert rig.view()["cancelled"] == [cluster.nodes[0]]
    rig.passes_after(3)
    assert not rig.drained()
    # Our drain of h2's node was remembered: nothing was drained again after the restart.
    counters = rig.view()["counters"]
    assert counters.get("drain_done", 0) == 0 and counters.get("drain_failed", 0) == 0
    assert rig.row(1)["situation"] == "ours"
    shown = harmonctl(rig, "scheduler")
    assert "cancelled by an operator" in shown and cluster.nodes[0] in shown
    harmonctl(rig, "scheduler", "release", cluster.nodes[0])
    wait_until(rig.drained, what="the released node drained")


def test_a_refused_drain_costs_one_line_is_counted_and_retried(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    rig = start_rig(spawn, workdir, make_slurm(count=2))
    agent = rig.agent("h1")
    (workdir / "scontrol.refuse").touch()
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(lambda: rig.view()["counters"].get("drain_failed", 0) >= 2,
               what="the drain refused twice")
    assert len(rig.log_lines("permission denied")) == 1
    assert not rig.drained()
    (workdir / "scontrol.refuse").unlink()
    wait_until(rig.drained, what="the drain once scontrol takes it")


def test_a_failing_then_hung_scontrol_costs_one_line_and_is_retried(
        spawn, workdir: Path, make_slurm: Callable[..., SlurmCluster]) -> None:
    rig = start_rig(spawn, workdir, make_slurm(count=2))
    agent = rig.agent("h1")
    # Read once first: a slurmctld slow to answer at the start (a loaded machine) is a
    # real failure of its own, with its own line.
    wait_until(lambda: rig.view()["counters"]["passes"] >= 1 and not rig.view()["last_error"],
               what="a first good read")
    before = len(rig.log_lines("Unable to contact slurm controller"))
    (workdir / "scontrol.fail").touch()
    agent.request("drain", {"gpu": 2, "reason": "looks odd"})
    wait_until(lambda: rig.view()["counters"]["read_failures"] >= 3, what="failed reads")
    assert len(rig.log_lines("Unable to contact slurm controller")) == before + 1
    (workdir / "scontrol.fail").unlink()
    (workdir / "scontrol.hang").touch()
    wait_until(lambda: "no answer within" in rig.view()["last_error"], what="a hung read")
    assert rig.controller.request("status")["pid"]  # the controller keeps serving
    assert len(rig.log_lines("no answer within")) == 1
    (workdir / "scontrol.hang").unlink()
    wait_until(rig.drained, what="the drain once scontrol works again")
    assert "Traceback" not in rig.controller.log.read_text()
