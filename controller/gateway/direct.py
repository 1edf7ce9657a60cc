"""A publication to the gateway's streams in one pass of the loop, written at once to
each stream whose writer has nothing queued.

Waking one writer task per stream cost more than writing: a publication to thousands
of streams scheduled thousands of tasks, each to make one small write. A stream whose
writer waits with nothing queued (live, its headers sent, not ending) and whose
connection takes writes (not paused by flow control) is written here, in the loop
that hands the publication over; any other is queued for its writer as before (its
queue of at most ``hwm``, then "behind"), which wakes that writer alone. So nothing is
written directly while older events wait in a stream's queue: its order holds.

The bytes are the ones the writer would write: the same CloudEvent and ``id:`` (the
stream's cursor after it), framed as an HTTP/1.1 chunk where the response is chunked
(aiohttp makes a response of unknown length chunked on HTTP/1.1; on HTTP/1.0 it is
delimited by the connection's close, so the bytes go as they are). Streams at the
same cursor share one encoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from controller.feed import stream_of
from controller.gateway import events
from controller.gateway.events import Cursor
from controller.outputs import SendToTenant

if TYPE_CHECKING:
    from aiohttp.base_protocol import BaseProtocol

    from controller.gateway.streaming import Stream


@dataclass(frozen=True, slots=True)
class Direct:
    """How to write to a live stream's connection without its writer."""

    #: The connection's aiohttp protocol: its transport, and whether writing is paused.
    protocol: BaseProtocol
    #: Whether the response is chunked (HTTP/1.1), so each write is one chunk.
    chunked: bool


def deliver_all(streams: dict[bytes, Stream], peers: list[bytes], send: SendToTenant,
                event: Callable[[], bytes], hwm: int, *, full: list[bytes],
                gone: list[bytes], queued: list[Stream]) -> int:
    """``send`` to ``peers``: written to the idle streams, queued for the others (which
    go to ``queued``, their writers to be woken), the ones with a full queue marked
    behind and named in ``full``, the ones not ours in ``gone``. ``event`` gives the
    publication's CloudEvent (asked at most once). How many streams were written."""
    name, offset = stream_of(send.topic), send.offset
    framed: dict[Cursor, tuple[Cursor, bytes, bytes]] = {}  # cursor before -> after, bytes
    body: bytes | None = None
    written = 0
    now = time.monotonic()
    for peer in peers:
        stream = streams.get(peer)
        if stream is None:
            gone.append(peer)
            continue
        direct = stream.direct
        if direct is not None and not stream.pending and stream.ending is None:
            protocol = direct.protocol
            transport = protocol.transport
            cursor = stream.cursor
            if (transport is not None and cursor is not None and not protocol.writing_paused
                    and not transport.is_closing()):
                if offset <= cursor.at(name):
                    continue  # it has it already (its writer would skip it as well)
                done = framed.get(cursor)
                if done is None:
                    if body is None:
                        body = event()
                    after = cursor.moved(name, offset)
                    text = events.sse(body, after)
                    done = framed[cursor] = (after, text, b"%x\r\n%b\r\n" % (len(text), text))
                stream.cursor = done[0]
                transport.write(done[2] if direct.chunked else done[1])
                stream.written = now
                written += 1
                continue
        if len(stream.pending) >= hwm:
            stream.ending = "behind"  # the stream ends, the client resumes
            full.append(peer)
        else:
            stream.pending.append(send)
        queued.append(stream)
    return written
