"""The controller as a real process with real ZeroMQ peers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import msgpack
import pytest
import zmq

from harmonaize import messages as m
from tests.conftest import needs_root
from tests.daemons import (
    FakeAgent,
    curve_dealer,
    keyring,
    python,
    start_agent,
    start_controller,
    tenant_feed,
    wait_until,
)

pytestmark = [pytest.mark.foundation, needs_root]

SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))



def test_malformed_frames_are_counted_and_the_controller_keeps_serving(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    bad = curve_dealer(ctx, controller, keyring(workdir).agent("h9"))
    bad.send(b"\x00garbage")
    bad.send(msgpack.packb(["hz", 1, "hello", "h9", 0, 1.0, {"pool": 5}]))
    bad.send(msgpack.packb(["hz", 1, "pool-capacity", "h9", 0, 1.0, {}]))  # not an agent kind
    bad.send(msgpack.packb(["hz", 99, "hello", "h9", 0, 1.0, {}]))
    bad.send_multipart([b"one", b"two"])
    too_big = curve_dealer(ctx, controller, keyring(workdir).agent("h8"))
    too_big.send(b"x" * (m.MAX_FRAME + 4096))  # ZeroMQ drops this peer before we see it
    wait_until(lambda: sum(controller.request("status")["rejected"].values()) >= 5,
               what="the rejections to be counted")
    status = controller.request("status")
    assert status["rejected"] == {"invalid": 4, "framing": 1}
    assert "rejected a frame (invalid)" in controller.log.read_text()
    agent = FakeAgent(ctx, controller)
    assert agent.hello() == m.Ack(0)
    agent.send(SUMMARY, seq=1)
    assert agent.recv() == m.Ack(1)
    assert controller.proc.poll() is None
    assert [h["host_id"] for h in controller.request("hosts")] == ["h1"]


def test_unbound_senders_are_asked_to_resync(spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir)
    agent = FakeAgent(ctx, controller)
    agent.send(SUMMARY, seq=1)
    assert isinstance(agent.recv(), m.Resync)
    assert controller.request("status")["protocol"]["unbound"] == 1


def test_late_joiners_get_current_conditions_at_once(spawn, workdir: Path,
                                                     ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir, extra="[feed]\nrepublish = 3600\n")
    agent = FakeAgent(ctx, controller)
    agent.hello()
    agent.send(SUMMARY, seq=1)
    agent.recv()
    wait_until(lambda: controller.request("capacity"), what="the first aggregate")
    with tenant_feed(controller, ["pool/"], context=ctx) as feed:
        message = feed.recv(timeout=10)
    assert message is not None and message.topic == "pool/p/H200"
    # One host up shares the default's first host bucket with none up.
    assert str(message.body.hosts_up) == "0-1" and str(message.body.gpus_available) == "8-15"


def test_a_restart_keeps_hosts_sequence_numbers_and_feed_order(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    agent = FakeAgent(ctx, controller)
    agent.hello(epoch=7)
    for seq in (1, 2, 3):
        agent.send(SUMMARY, seq=seq)
        assert agent.recv() == m.Ack(seq)
    wait_until(lambda: controller.request("capacity"), what="the first aggregate")
    with tenant_feed(controller, ["pool/"], context=ctx) as feed:
        before = feed.recv(timeout=10)
    ports = (int(controller.listen.rsplit(":", 1)[1]), int(controller.feed.rsplit(":", 1)[1]))
    controller.proc.send_signal(signal.SIGTERM)
    assert controller.proc.wait(timeout=10) == 0
    controller = start_controller(spawn, workdir, ports=ports)
    (host,) = controller.request("hosts")
    assert (host["host_id"], host["last_seq"], host["alive"]) == ("h1", 3, True)
    # The agent reconnects with its epoch: it is told what is already stored.
    assert agent.hello(epoch=7) == m.Ack(3)
    agent.send(SUMMARY, seq=3)
    assert agent.recv() == m.Ack(3)  # a resend of something stored is not applied twice
    with tenant_feed(controller, ["pool/"], context=ctx) as feed:
        present = feed.recv(timeout=10)
        # Nothing changed: a late joiner gets the condition as it was, number and all
        # (a restart is no news), and the next change is numbered after it.
        assert before is not None and present is not None
        assert (present.seq, present.body) == (before.seq, before.body)
        agent.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8, in_use=8)),
                   seq=4)
        assert agent.recv() == m.Ack(4)
        after = feed.recv(timeout=10)
    assert after is not None and after.seq == before.seq + 1
    assert after.body.revision == before.body.revision + 1


def test_a_real_agent_reconnects_after_the_controller_goes_away(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    ports = (int(controller.listen.rsplit(":", 1)[1]), int(controller.feed.rsplit(":", 1)[1]))
    agent = start_agent(spawn, workdir, endpoint=controller.listen,
                        extra="heartbeat = 0.2\nack_timeout = 0.3\n")
    wait_until(lambda: controller.request("hosts"), what="the agent to register")
    controller.proc.send_signal(signal.SIGKILL)
    controller.proc.wait(timeout=10)
    agent.request("drain", {"reason": "while the controller was away"})
    wait_until(lambda: agent.request("status")["uplink"]["last_seq"]
               > agent.request("status")["uplink"]["acked_seq"]
               or agent.request("status")["uplink"]["queued"] > 0,
               what="the change to wait in the outbox")
    controller = start_controller(spawn, workdir, ports=ports)

    def delivered() -> bool:
        (host,) = controller.request("hosts")
        return host["alive"] and host["schedulable"] is False

    wait_until(delivered, what="the drain to reach the restarted controller")
    events = controller.request("events")
    assert [e["reason"] for e in events] == ["DrainedStarted"]
    uplink = agent.request("status")["uplink"]
    assert uplink["queued"] == 0 and uplink["acked_seq"] == uplink["last_seq"]


def test_admin_socket_rejects_garbage_and_keeps_serving(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(controller.admin))
        sock.sendall(b'{"cmd": "events", "args": {"limit": -1}}\nnot json\n')
        sock.shutdown(socket.SHUT_WR)
        replies = [json.loads(x) for x in sock.makefile("rb").read().splitlines()]
    assert [r["ok"] for r in replies] == [False, False]
    assert "limit must be" in replies[0]["error"]
    assert controller.request("status")["admin_socket"]["errors"] == 2


def test_harmonctl_places_lists_and_forgets_jobs(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)

    def harmonctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(python("harmonaize.harmonctl", "-C", str(controller.admin), *args),
                              capture_output=True, text=True, timeout=30)

    placement = workdir / "job.json"
    placement.write_text(json.dumps({"job": "job-9", "tenant": "acme", "members": [
        {"name": "0", "host": "h1"}, {"name": "1", "host": "h2"}]}))
    assert harmonctl("place", str(placement)).returncode == 0
    listed = harmonctl("jobs")
    assert listed.returncode == 0, listed.stderr
    table = listed.stdout
    assert "job-9" in table and "acme" in table and "0, 1" in table
    bad = workdir / "bad.json"
    bad.write_text(json.dumps({"job": "job-10", "tenant": "acme", "members": []}))
    refused = harmonctl("place", str(bad))
    assert refused.returncode == 1 and "members" in refused.stderr
    assert harmonctl("unplace", "job-9").returncode == 0
    assert json.loads(harmonctl("--json", "jobs").stdout) == []
    assert "placed job" in harmonctl("unplace", "job-9").stderr
