"""The controller's door with its heartbeat fast path, as a real process: a frame that
looks like a heartbeat but is not one is rejected as every bad frame is, and the
uncommon heartbeats (from an unbound connection, under another host's name) are
treated as before."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import zmq

from harmonaize import messages as m
from tests.conftest import needs_root
from tests.daemons import FakeAgent, start_controller, wait_until

pytestmark = [pytest.mark.foundation, needs_root]


def lookalike(body: object, sender: str = "h1", extra: tuple[object, ...] = ()) -> bytes:
    return msgpack.packb(["hz", 1, "heartbeat", sender, 0, 1.7e9, body, *extra])


def test_lookalike_heartbeats_are_rejected_and_real_ones_keep_a_host_up(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    agent = FakeAgent(ctx, controller)
    assert agent.hello() == m.Ack(0)
    agent.send(m.Heartbeat(uptime=1.0, last_seq=0))
    agent.sock.send(lookalike({"uptime": -1.0, "last_seq": 0}))
    agent.sock.send(lookalike({"uptime": 1.0, "last_seq": "0"}))
    agent.sock.send(lookalike({"uptime": 1.0, "last_seq": 0}, extra=("eighth",)))
    agent.sock.send(lookalike({"uptime": 1.0, "last_seq": 0}, sender="h2"))  # h1's key
    wait_until(lambda: sum(controller.request("status")["rejected"].values()) >= 4,
               what="the rejections to be counted")
    assert controller.request("status")["rejected"] == {"invalid": 3, "identity": 1}
    log = controller.log.read_text()
    assert "rejected a frame (invalid)" in log and "rejected a frame (identity)" in log
    assert [(h["host_id"], h["alive"]) for h in controller.request("hosts")] == [("h1", True)]
    # A heartbeat on a connection that never said hello: asked to say it.
    stranger = FakeAgent(ctx, controller, host="h3")
    stranger.send(m.Heartbeat(uptime=1.0, last_seq=0))
    assert isinstance(stranger.recv(), m.Resync)
    assert controller.request("status")["protocol"]["unbound"] == 1
