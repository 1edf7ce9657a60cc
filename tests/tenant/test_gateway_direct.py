"""A publication written at once to the streams whose writers wait with nothing queued
(controller/gateway/direct.py), without sockets: the bytes and framing each stream is
given, and the streams that must be queued instead (flow control, a busy writer, a
backlog, a closing connection) so that each keeps its order and the hwm holds."""

from __future__ import annotations

import pytest

from controller.gateway import direct
from controller.gateway.direct import Direct
from controller.gateway.events import Cursor
from controller.gateway.streaming import Stream
from controller.outputs import SendToTenant

pytestmark = pytest.mark.tenant

TOPIC = "pool/p/H200"


class Transport:
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def is_closing(self) -> bool:
        return self.closing


class Protocol:
    def __init__(self) -> None:
        self.transport: Transport | None = Transport()
        self.writing_paused = False


def idle(peer: bytes, tenant: str, cursor: Cursor, *, chunked: bool = True,
         ) -> tuple[Stream, Protocol]:
    """A live stream whose writer waits with nothing queued."""
    protocol = Protocol()
    stream = Stream(peer, tenant, ("pool/",), cursor=cursor,
                    direct=Direct(protocol, chunked))  # type: ignore[arg-type]
    return stream, protocol


def deliver(streams: list[Stream], peers: list[bytes], offset: int, body: bytes = b"{}",
            hwm: int = 2) -> tuple[int, list[bytes], list[bytes], list[Stream], int]:
    """(written, full, gone, queued, how often the event was asked for)."""
    full: list[bytes] = []
    gone: list[bytes] = []
    queued: list[Stream] = []
    asked = 0

    def event() -> bytes:
        nonlocal asked
        asked += 1
        return body

    written = direct.deliver_all({s.peer: s for s in streams}, peers,
                                 SendToTenant(b"", TOPIC, b"frame", offset), event, hwm,
                                 full=full, gone=gone, queued=queued)
    return written, full, gone, queued, asked


def test_idle_streams_get_the_event_at_once_in_their_own_framing() -> None:
    chunked, p1 = idle(b"hs1", "acme", Cursor(7, 3, 2))
    plain, p2 = idle(b"hs2", "acme", Cursor(7, 3, 2), chunked=False)  # HTTP/1.0
    ahead, p3 = idle(b"hs3", "acme", Cursor(7, 5, 0))  # has offset 4 already
    other, p4 = idle(b"hs4", "beta", Cursor(7, 1, 9))
    written, full, gone, queued, asked = deliver([chunked, plain, ahead, other],
                                                 [b"hs1", b"hs2", b"hs3", b"hs4", b"hs9"], 4,
                                                 b'{"a":1}')
    assert (written, full, gone, queued, asked) == (3, [], [b"hs9"], [], 1)
    event = b'id: 7-4-2\ndata: {"a":1}\n\n'
    assert p1.transport is not None and p1.transport.data == [b"%x\r\n%b\r\n" % (
        len(event), event)]
    assert p2.transport is not None and p2.transport.data == [event]
    assert p3.transport is not None and p3.transport.data == []
    assert ahead.cursor == Cursor(7, 5, 0)
    # Each stream's id is its own cursor after the event (the job offset is its own).
    assert p4.transport is not None and p4.transport.data[0].endswith(
        b'id: 7-4-9\ndata: {"a":1}\n\n\r\n')
    assert (chunked.cursor, plain.cursor, other.cursor) == (
        Cursor(7, 4, 2), Cursor(7, 4, 2), Cursor(7, 4, 9))
    assert chunked.written > 0 and not chunked.pending


def test_streams_that_cannot_take_a_write_now_are_queued_in_order_up_to_the_hwm() -> None:
    stream, protocol = idle(b"hs1", "acme", Cursor(7, 3, 0))
    assert protocol.transport is not None
    protocol.writing_paused = True  # the client does not read: flow control
    assert deliver([stream], [b"hs1"], 4)[:4] == (0, [], [], [stream])
    assert [s.offset for s in stream.pending] == [4]
    # Resumed, but an older event waits in the queue: this one goes behind it.
    protocol.writing_paused = False
    assert deliver([stream], [b"hs1"], 5)[:4] == (0, [], [], [stream])
    assert [s.offset for s in stream.pending] == [4, 5] and protocol.transport.data == []
    # The queue is full (hwm 2): the stream is counted full and ends; what it queued stays.
    assert deliver([stream], [b"hs1"], 6)[:4] == (0, [b"hs1"], [], [stream])
    assert stream.ending == "behind" and [s.offset for s in stream.pending] == [4, 5]
    assert stream.cursor == Cursor(7, 3, 0)  # its writer moves it as it writes

    busy, busy_protocol = idle(b"hs2", "acme", Cursor(7, 3, 0))
    busy.direct = None  # its writer is writing (or not live yet)
    closing, closing_protocol = idle(b"hs3", "acme", Cursor(7, 3, 0))
    assert closing_protocol.transport is not None
    closing_protocol.transport.closing = True
    gone, gone_protocol = idle(b"hs4", "acme", Cursor(7, 3, 0))
    gone_protocol.transport = None  # the connection was lost
    ending, _ = idle(b"hs5", "acme", Cursor(7, 3, 0))
    ending.ending = "revoked"
    written, full, _, queued, asked = deliver([busy, closing, gone, ending],
                                              [b"hs2", b"hs3", b"hs4", b"hs5"], 4)
    assert (written, full, queued, asked) == (0, [], [busy, closing, gone, ending], 0)
    assert closing_protocol.transport.data == [] and busy_protocol.transport is not None
    assert busy_protocol.transport.data == []
    assert all([s.offset for s in q.pending] == [4] for q in queued)


def test_a_publication_reaches_only_the_streams_it_is_for() -> None:
    """Two tenants' streams at the same cursor: each gets its own publication's bytes,
    never the other's (an encoding is shared per cursor within one publication only)."""
    acme, pa = idle(b"hs1", "acme", Cursor(7, 3, 0))
    beta, pb = idle(b"hs2", "beta", Cursor(7, 3, 0))
    deliver([acme, beta], [b"hs1"], 4, b'{"for":"acme"}')
    deliver([acme, beta], [b"hs2"], 4, b'{"for":"beta"}')
    assert pa.transport is not None and pb.transport is not None
    assert len(pa.transport.data) == len(pb.transport.data) == 1
    assert b"acme" in pa.transport.data[0] and b"beta" not in pa.transport.data[0]
    assert b"beta" in pb.transport.data[0] and b"acme" not in pb.transport.data[0]
