"""The gateway's event streams: ``GET /v1/events`` as server-sent CloudEvents.

A stream is a subscriber of the core's feed hub for as long as its connection lasts:
it is sent the present (the newest condition of each topic) or, from a cursor, what
the stored feed log retained after it (within the tenant's replay budget, with a
``gap`` event naming topics pruning took), then what the hub hands it live. It ends
when it falls a queue's length behind (the client resumes from its cursor), when its
token is revoked, its session ends or the gateway closes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.http_writer import HttpVersion11

from controller.feed import stream_of, streams_of
from controller.gateway import events
from controller.gateway.direct import Direct
from controller.gateway.events import Cursor, CursorError
from controller.gateway.shell import PEER, GatewayStats, Refused, Shell
from controller.outputs import SendToTenant, TenantPeer
from harmonaize.messages import ErrorCode
from harmonaize.schema import to_plain

if TYPE_CHECKING:
    from controller.config import GatewaySection

log = logging.getLogger("harmonaize.controller.gateway")

#: Stored messages read per query on a resume.
CHUNK = 500
#: The wire's Topic (harmonaize/messages/feed.py), as the query's topic= may carry it.
TOPIC = re.compile(r"[A-Za-z0-9._:@+/-]{0,256}")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


@dataclass
class Stream:
    peer: bytes
    tenant: str
    prefixes: tuple[str, ...]
    #: What the hub handed it and its writer has not written yet (at most the gateway's
    #: ``hwm``).
    pending: list[SendToTenant] = field(default_factory=list)
    #: The token it was opened with (its id), if any: revoking the token ends it.
    token: str | None = None
    #: The browser session it was opened with, if any: ending the session ends it.
    session: str | None = None
    #: Why it is ending: "behind" (its queue overflowed: what is queued goes first),
    #: "revoked", "logged out" or "closing" (at once).
    ending: str | None = None
    #: Once live: where the stream is (the cursor after the last event written).
    cursor: Cursor | None = None
    #: When it was last written to (keep-alives go to quiet streams only).
    written: float = 0.0
    #: Set while its writer waits with nothing queued: how a publication is written to
    #: it at once (controller/gateway/direct.py).
    direct: Direct | None = None
    #: What its waiting writer waits on (set to wake it).
    waiter: asyncio.Future[None] | None = None


class FeedStreams:
    """The streams of :class:`controller.gateway.http.Gateway`, which holds the state."""

    cfg: GatewaySection
    shell: Shell
    hwm: int
    streams: dict[bytes, Stream]
    #: Streams open per tenant (its limit is checked at each open, among thousands).
    open_per_tenant: dict[str, int]
    stats: GatewayStats
    #: Each publication's CloudEvent, written once for all the streams it goes to.
    written: events.EventCache
    _numbers: itertools.count[int]
    _ticker: asyncio.Task[None] | None

    if TYPE_CHECKING:  # in controller/gateway/http.py
        def _admitted(self, request: web.Request, *, session: bool = False) -> str: ...

        def _wake(self) -> None: ...

    async def _feed(self, request: web.Request) -> web.StreamResponse:
        tenant = self._admitted(request, session=True)
        topics = tuple(dict.fromkeys(request.query.getall("topic", ["pool/"])))
        if not 1 <= len(topics) <= 64 or not all(TOPIC.fullmatch(t) for t in topics):
            raise Refused(ErrorCode.INVALID, "topic: 1 to 64 topic prefixes of letters, "
                          "digits and ._:@+/-")
        given = request.headers.get("Last-Event-ID") or request.query.get("since")
        try:
            cursor = Cursor.parse(given) if given else None
        except CursorError as exc:
            raise Refused(ErrorCode.INVALID, f"Last-Event-ID: {exc}") from None
        feed = self.shell.core.feed
        present = Cursor(feed.epoch, *feed.heads(tenant))
        if cursor is not None and cursor.epoch == present.epoch and not feed.follower and (
                cursor.pool > present.pool or cursor.job > present.job):
            # Never given by this feed (a replica behind another waits to catch up).
            raise Refused(ErrorCode.INVALID, f"Last-Event-ID: {cursor} is beyond the "
                          f"present ({present}): resume from a cursor the feed gave, or "
                          "without one")
        mine = self.open_per_tenant.get(tenant, 0)
        if len(self.streams) >= self.cfg.max_streams or mine >= self.cfg.streams_per_tenant:
            raise Refused(ErrorCode.TOO_MANY_SUBSCRIPTIONS, "too many streams open "
                          f"({self.cfg.streams_per_tenant} per tenant)")
        peer = PEER + f"s{next(self._numbers)}".encode()
        core = self.shell.core
        reply = core.attach(TenantPeer(peer, tenant, True), topics, time.monotonic())
        if reply is None:
            raise Refused(ErrorCode.THROTTLED, "over your request budget: retry in a second")
        if not reply.accepted:
            core.detach(peer)
            first = reply.refused[0]
            raise Refused(ErrorCode(first.code), first.reason,
                          refused=[to_plain(r) for r in reply.refused])
        stream = Stream(peer, tenant, reply.accepted, token=request.get("token"),
                        session=request.get("session"))
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._keep_alive())
        self.streams[peer] = stream
        self.open_per_tenant[tenant] = mine + 1
        self.stats.streams += 1
        response = web.StreamResponse(headers={**SSE_HEADERS,
                                               "X-Request-Id": request["request_id"]})
        if request.version == HttpVersion11:
            # What aiohttp does for a body of unknown length anyway, said here so the
            # direct writes (controller/gateway/direct.py) know to frame chunks.
            response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await self._write(response, events.event(
                # A random id: a count of the gateway's would tell a tenant how many
                # requests others made.
                "subscribed", to_plain(reply), self.cfg.source, event_id=uuid.uuid4().hex,
                time=time.time()), None)
            epoch = core.feed.epoch
            if cursor is not None and cursor.epoch == epoch:
                cursor = await self._resume(response, stream, cursor)
            elif cursor is not None:  # a cursor of another epoch: everything retained
                cursor = await self._resume(response, stream, Cursor(epoch))
            else:
                cursor = await self._present(response, stream)
            await self._live(request, response, stream, cursor)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            core.detach(peer)
            if self.streams.pop(peer, None) is not None:
                left = self.open_per_tenant[tenant] - 1
                if left:
                    self.open_per_tenant[tenant] = left
                else:
                    del self.open_per_tenant[tenant]
        return response

    async def _write(self, response: web.StreamResponse, event: bytes,
                     cursor: Cursor | None) -> None:
        await response.write(events.sse(event, cursor))
        self.stats.events += 1

    async def _send(self, response: web.StreamResponse, topic: str, frame: bytes,
                    cursor: Cursor) -> None:
        epoch = self.shell.core.feed.epoch
        await self._write(response, self.written.get(frame, topic, self.cfg.source, epoch),
                          cursor)

    async def _present(self, response: web.StreamResponse, stream: Stream) -> Cursor:
        """A fresh stream: the newest condition of every topic, then the streams' heads.
        Each condition's cursor stands before the ones still to come."""
        feed = self.shell.core.feed
        names = streams_of(stream.tenant)
        heads = {name: feed.offsets.get(name, 0) for name in names}
        items = feed.present(stream.tenant, stream.prefixes)
        start = []
        for name in names:
            offsets = [offset for topic, _, _, offset in items if stream_of(topic) == name]
            start.append(min(offsets) - 1 if offsets else heads[name])
        cursor = Cursor(feed.epoch, *start)
        for topic, _, frame, offset in items:
            cursor = cursor.moved(stream_of(topic), offset)
            await self._send(response, topic, frame, cursor)
        return Cursor(feed.epoch, *(heads[name] for name in names))

    async def _resume(self, response: web.StreamResponse, stream: Stream,
                      cursor: Cursor) -> Cursor:
        """What is retained after the cursor, stream by stream, within the replay budget;
        first, which topics lost messages to pruning since it."""
        store, core = self.shell.store, self.shell.core
        lost = [t for s in streams_of(stream.tenant) for t in store.lost_after(s, cursor.at(s))
                if t.startswith(stream.prefixes)]
        if lost:
            await self._write(response, events.event(
                "gap", {"topics": lost[:1024]}, self.cfg.source,
                event_id=f"{cursor}:gap", time=time.time()), cursor)
        for name in streams_of(stream.tenant):
            while True:
                allowed = core.replay_allowance(stream.tenant, CHUNK, time.monotonic())
                if allowed <= 0:
                    await asyncio.sleep(0.05)  # the budget refills; the client waits
                    continue
                rows = store.replay_stream(name, cursor.at(name), allowed)
                for topic, _, frame, offset in rows:
                    cursor = cursor.moved(name, offset)
                    if topic.startswith(stream.prefixes):
                        await self._send(response, topic, frame, cursor)
                if len(rows) < allowed:
                    break
        return cursor

    async def _live(self, request: web.Request, response: web.StreamResponse,
                    stream: Stream, cursor: Cursor) -> None:
        """What the hub hands the stream, written as it comes. While the writer waits
        with nothing queued, a publication is written to the connection at once by the
        loop that hands it over (controller/gateway/direct.py), without waking it;
        what is queued (the connection was paused, or the writer busy) it writes, all
        that is pending in one write. A writer with nothing to write sends a keep-alive
        once its stream was quiet for ``keepalive`` (woken for that by one timer)."""
        pending, source, keepalive = stream.pending, self.cfg.source, self.cfg.keepalive
        direct = Direct(request.protocol, response.chunked) \
            if not response.compression else None
        loop = asyncio.get_running_loop()
        stream.cursor, stream.written = cursor, time.monotonic()
        while True:
            if not pending and stream.ending is None:
                stream.waiter = loop.create_future()
                stream.direct = direct
                try:
                    await stream.waiter
                finally:
                    stream.direct = stream.waiter = None
                if not pending and stream.ending is None:
                    if time.monotonic() - stream.written >= keepalive:
                        await response.write(b": keep-alive\n\n")
                        stream.written = time.monotonic()
                    continue
            if stream.ending in ("revoked", "closing", "logged out"):
                log.info("ended a stream of tenant %r: %s", stream.tenant, stream.ending)
                return
            batch = pending[:]  # at most the gateway's hwm
            pending.clear()
            epoch = self.shell.core.feed.epoch
            chunks = []
            cursor = stream.cursor or cursor  # moved by direct writes meanwhile
            for send in batch:
                name = stream_of(send.topic)
                if send.offset > cursor.at(name):
                    cursor = cursor.moved(name, send.offset)
                    chunks.append(events.sse(self.written.get(send.frame, send.topic, source,
                                                              epoch), cursor))
            stream.cursor = cursor
            if chunks:
                await response.write(b"".join(chunks))
                stream.written = time.monotonic()
                self.stats.events += len(chunks)
            if stream.ending == "behind" and not pending:
                self.stats.overflowed += 1
                log.warning("closed a stream of tenant %r that fell %d messages behind; it "
                            "resumes from its cursor", stream.tenant, self.hwm)
                return

    async def _keep_alive(self) -> None:
        """While streams are open: wake their writers every half ``keepalive``, so each
        quiet one sends its keep-alive (one timer for all, not one per wait)."""
        while self.streams:
            await asyncio.sleep(self.cfg.keepalive / 2)
            self._wake()
