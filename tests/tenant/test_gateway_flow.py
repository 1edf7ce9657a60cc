"""A gateway stream whose client stops reading, against a real controller: flow control
stops the direct writes (controller/gateway/direct.py), what follows is queued up to
the feed's hwm, and the stream ends "behind" after what it queued (counted so) unless
the kernel's buffers took it all; what the client then reads (with Python's own HTTP
client, chunked framing and all) is the events in order with nothing twice. Streams
that read get them all, on HTTP/1.1 (chunked) and HTTP/1.0 (close-delimited)."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest
import zmq

from controller.gateway.events import Cursor
from harmonaize import messages as m
from tests.conftest import free_port, needs_root
from tests.controller.test_feed import Sender
from tests.daemons import FakeAgent, start_controller, wait_until
from tests.sse import CurlStream

pytestmark = [pytest.mark.tenant, needs_root]

#: Advisories sent while the one client does not read, each naming 400 ranks (about
#: 3.5 KB): more than its socket buffers, aiohttp's 64 KiB and the hwm of 10 hold (on
#: loopback here it ends behind after about 700) unless the kernel's buffers grew large.
SENT = 1500
RANKS = tuple(f"r{i:05d}" for i in range(400))


def advice(job: str) -> m.JobAdvisory:
    return m.JobAdvisory(job, m.Advice.CHECKPOINT_NOW, "gpu-memory", m.Urgency.HIGH, RANKS)


def events_of(body: bytes) -> list[tuple[str | None, int]]:
    """(id, seq) of each whole data event of an SSE body (read so far)."""
    found = []
    for block in body.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        data = [line[6:] for line in lines if line.startswith("data: ")]
        if data:
            ident = next((line[4:] for line in lines if line.startswith("id: ")), None)
            found.append((ident, json.loads("\n".join(data))["seq"]))
    return found


def test_a_stream_that_stops_reading_is_queued_then_ends_behind_in_order(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    port = free_port()
    controller = start_controller(spawn, workdir, f'[gateway]\nlisten = "127.0.0.1:{port}"\n'
                                  '[feed]\nsend_hwm = 10\n')
    controller.request("place", {"job": "job-a", "tenant": "acme", "members": [
        {"name": rank, "host": "h1"} for rank in RANKS]})
    sender = Sender(FakeAgent(ctx, controller))
    secret = controller.request("token-issue", {"tenant": "acme", "days": 1})["token"]
    reader = CurlStream(spawn, f"http://127.0.0.1:{port}/v1/feed?topic=job/acme/",
                        "-H", f"Authorization: Bearer {secret}")
    reader.take(2)  # subscribed, the present
    # HTTP/1.0: no chunks, the stream's end is the connection's close.
    plain = CurlStream(spawn, f"http://127.0.0.1:{port}/v1/feed?topic=job/acme/", "--http1.0",
                       "-H", f"Authorization: Bearer {secret}")
    plain.take(2)
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        stuck.settimeout(10)  # less than a keep-alive: a stream that does not end fails
        stuck.connect(("127.0.0.1", port))
        stuck.sendall(f"GET /v1/feed?topic=job/acme/ HTTP/1.1\r\nHost: gateway\r\n"
                      f"Authorization: Bearer {secret}\r\n\r\n".encode())
        wait_until(lambda: controller.request("status")["gateway"]["streams"] == 3,
                   what="the stream that does not read")
        sender.send(advice("job-a"))
        first = reader.next()
        for _ in range(1, SENT):
            sender.send(advice("job-a"), wait=False)
        sender.wait_ack(sender.seq, timeout=60)
        read = [first, *reader.take(SENT - 1, timeout=60)]
        assert [e.key[1] for e in read] == list(range(first.key[1], first.key[1] + SENT))
        assert [e.id for e in plain.take(SENT, timeout=60)] == [e.id for e in read]
        response = http.client.HTTPResponse(stuck)
        response.begin()
        assert response.status == 200 and response.getheader("Transfer-Encoding") == \
            "chunked"
        body = b""
        while len(events_of(body)) < SENT + 2:  # subscribed, the present, all it was sent
            data = response.read1(65536)
            if not data:
                break  # the end of the stream's last chunk: it ended
            body += data
        ended = not data
        got = events_of(body)
    finally:
        stuck.close()
        reader.close()
        plain.close()
    assert got[0][0] is None  # subscribed
    seqs = [seq for _, seq in got[2:]]
    assert seqs == list(range(first.key[1], first.key[1] + len(seqs)))  # none twice
    # All it was sent, or what it had until it fell behind: then it ended and was counted.
    assert len(seqs) == SENT or (ended and 0 < len(seqs) < SENT)
    jobs = [Cursor.parse(ident or "").job for ident, _ in got[1:]]
    assert jobs == sorted(set(jobs))  # each id a cursor past the one before
    assert controller.request("status")["gateway"]["closed_behind"] == (
        1 if len(seqs) < SENT else 0)
