"""The door's heartbeat fast path (controller/heartbeats.py and the core's heartbeat()):
it takes only what the full decoder and receive() would take as a heartbeat, and hands
everything else to them."""

from __future__ import annotations

import math
import random

import msgpack
import pytest

from controller.core import ControllerCore
from controller.heartbeats import heartbeat_sender
from controller.outputs import AgentPeer, SendToAgent
from harmonaize import messages as m
from harmonaize.messages import AGENT_KINDS, WireError, decode, encode
from tests.controller.test_core_with_outbox import HOST, agent_frame, config, hello

pytestmark = pytest.mark.redesign

STAMP = 1_700_000_000.5


def beat(sender: str = HOST, uptime: object = 12.5, last_seq: object = 3, seq: object = 0,
         stamp: object = STAMP, extra: dict[str, object] | None = None,
         envelope: list[object] | None = None) -> bytes:
    body = {"uptime": uptime, "last_seq": last_seq, **(extra or {})}
    frame = envelope if envelope is not None else ["hz", 1, "heartbeat", sender, seq, stamp, body]
    return msgpack.packb(frame, use_bin_type=True)


def full(data: bytes) -> m.Envelope | None:
    """What the full decoder makes of a frame (None: rejected)."""
    try:
        return decode(data, allowed=AGENT_KINDS)
    except WireError:
        return None


def test_a_heartbeat_from_the_agents_encoder_is_read_on_the_fast_path() -> None:
    data = encode(m.Heartbeat(uptime=3.0, last_seq=9), sender=HOST)
    assert heartbeat_sender(data) == HOST
    assert heartbeat_sender(beat(uptime=7, stamp=1_700_000_000)) == HOST  # integers too
    assert heartbeat_sender(beat(seq=5)) == HOST


@pytest.mark.parametrize("data", [
    beat(uptime=-1.0), beat(uptime=math.nan), beat(uptime=math.inf), beat(uptime="12"),
    beat(uptime=True), beat(uptime=2e9), beat(last_seq=-1), beat(last_seq=1.5),
    beat(last_seq=False), beat(last_seq=2**62 + 1), beat(sender=""), beat(sender="-h1"),
    beat(sender="h 1"), beat(sender="h" * 129), beat(sender=5), beat(seq=-1),
    beat(seq=True), beat(stamp=-1.0), beat(stamp=math.inf), beat(stamp=2e11),
    beat(stamp="now"), beat(envelope=["hz", 1, "heartbeat", HOST, 0, STAMP, [1, 2]]),
    beat(envelope=["hz", 1, "heartbeat", HOST, 0, STAMP, {"uptime": 1.0}]),
    beat(envelope=["hz", 1, "heartbeat", HOST, 0, STAMP, {}, "eighth"]),
    beat(envelope=["hz", 2, "heartbeat", HOST, 0, STAMP, {"uptime": 1.0, "last_seq": 0}]),
    beat(envelope=["zz", 1, "heartbeat", HOST, 0, STAMP, {"uptime": 1.0, "last_seq": 0}]),
    beat() + b"\x00",  # trailing bytes
    beat()[:-3],  # cut short
], ids=lambda d: d.hex()[:24])
def test_a_frame_that_only_looks_like_a_heartbeat_is_rejected_as_before(data: bytes) -> None:
    assert heartbeat_sender(data) is None
    assert full(data) is None  # the full decoder still refuses it, with its reason


def test_what_the_fast_path_leaves_alone_is_the_full_decoders_to_judge() -> None:
    # An unknown field is ignored by the full decoder (agents of a newer version):
    # left to it, not refused here.
    data = beat(extra={"load": 1})
    assert heartbeat_sender(data) is None
    decoded = full(data)
    assert decoded is not None and decoded.body == m.Heartbeat(12.5, 3)
    assert heartbeat_sender(encode(m.Goodbye("bye"), sender=HOST)) is None


def test_every_frame_the_fast_path_takes_the_full_decoder_takes_as_that_heartbeat() -> None:
    """Mutations of heartbeats (bytes changed, cut, added), fixed seed: the fast path
    never says "heartbeat from X" where the full decoder would not."""
    rng = random.Random(34)
    seeds = [beat(), beat(uptime=0, last_seq=0, seq=2**62), beat(sender="a.b:c@d+e-f_0"),
             encode(m.Heartbeat(uptime=1e9, last_seq=2**62), sender="x" * 128, now=1e11)]
    taken = rejected = 0
    for _ in range(20000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            what, at = rng.random(), rng.randrange(len(data))
            if what < 0.6:
                data[at] = rng.randrange(256)
            elif what < 0.8:
                del data[at:at + rng.randint(1, 4)]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        frame = bytes(data)
        sender = heartbeat_sender(frame)
        if sender is None:
            rejected += 1
            continue
        taken += 1
        decoded = full(frame)
        assert decoded is not None, frame.hex()
        assert decoded.kind == "heartbeat" and decoded.sender == sender, frame.hex()
    assert taken > 100 and rejected > 1000  # both sides of the check were exercised


def test_the_core_takes_a_known_living_hosts_heartbeat_and_nothing_else() -> None:
    core = ControllerCore(config(liveness={"missed_heartbeats": 3}), 0.0)
    peer = AgentPeer(b"c1", HOST)
    # Unbound: left to receive(), which asks for a hello.
    assert not core.heartbeat(peer, HOST, 0.0)
    replies = core.receive(peer, agent_frame(m.Heartbeat(1.0, 0)), 0.0)
    assert [type(r.message) for r in replies if isinstance(r, SendToAgent)] == [m.Resync]
    core.receive(peer, agent_frame(hello(heartbeat=1.0)), 0.0)
    core.tick(0.0, STAMP)
    frames = core.frames
    assert core.heartbeat(peer, HOST, 2.0)
    assert core.cluster.hosts[HOST].last_seen == 2.0 and core.frames == frames + 1
    # A key speaking for another host, or a connection bound to another: not taken.
    assert not core.heartbeat(AgentPeer(b"c1", "other"), HOST, 2.5)
    assert not core.heartbeat(AgentPeer(b"c1", None), "other", 2.5)
    assert core.cluster.hosts[HOST].last_seen == 2.0 and core.frames == frames + 1
    # Counted down after silence: receive() brings it back up (and says so).
    core.tick(10.0, STAMP)
    assert not core.cluster.hosts[HOST].alive
    assert not core.heartbeat(peer, HOST, 10.5)
    core.receive(peer, agent_frame(m.Heartbeat(1.0, 0)), 10.5)
    assert core.cluster.hosts[HOST].alive
    # The disk full: receive() decides (a heartbeat still counts there).
    core.storage_paused = True
    assert not core.heartbeat(peer, HOST, 11.0)


def test_cached_views_follow_every_change_of_a_host() -> None:
    core = ControllerCore(config(), 0.0)
    peer = AgentPeer(b"c1", HOST)
    core.receive(peer, agent_frame(hello(heartbeat=1.0)), 0.0)
    first = core.cluster.hosts[HOST].view()
    assert core.cluster.hosts[HOST].view() is first  # unchanged: made once
    busy = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8, in_use=3))
    core.receive(peer, agent_frame(busy, seq=1), 0.1)
    assert core.cluster.hosts[HOST].view().gpus.in_use == 3
    core.receive(peer, agent_frame(m.Goodbye("bye")), 0.2)
    assert not core.cluster.hosts[HOST].view().alive
    core.cluster.hosts[HOST].pool = "default"  # as a hello from another pool would
    assert core.cluster.hosts[HOST].view().pool == "default"
