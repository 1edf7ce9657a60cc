"""The controller's ZeroMQ frames and sockets: how a frame pair becomes a message (or
why it is none), how a socket binds, and the names the core gives tenants' ZeroMQ
connections. Shared by the shell (controller/server.py) and a cluster replica's
(controller/replica.py)."""

from __future__ import annotations

from typing import Any

import zmq
import zmq.asyncio

from controller.auth import AGENTS, TENANTS, curve_server
from controller.handshakes import HANDSHAKE_TIMEOUT_MS
from controller.outputs import BadFrame
from harmonaize import keys
from harmonaize.messages import MAX_FRAME, Envelope, WireError, decode

#: The core's name for a tenant's ZeroMQ connection: this, then its routing id.
ZMQ_PEER = b"z"
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)
#: Sends between two looks at the socket's news (its peers' queues).
NEWS_EVERY = 16


class FanOut:
    """Non-blocking sends on an asyncio ROUTER without an asyncio send each.

    A publication goes to thousands of subscribers in one pass of the loop. The asyncio
    socket makes each send a Future and, after each, asks the socket for its events (a
    send can take the edge that would have woken a pending receive); here the sends go
    through a plain shadow of the same socket and the events are looked at once, by
    :meth:`done`, after the pass."""

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self.sock = sock
        self._plain = zmq.Socket.shadow(sock.underlying)
        self._sent = False
        self._since_news = 0

    def send(self, routing_id: bytes, topic: bytes, frame: bytes) -> BaseException | None:
        """Send one message; the error, if any (EAGAIN: full; EHOSTUNREACH: gone)."""
        plain = self._plain
        try:
            plain.send(routing_id, _MORE)
            plain.send(topic, _MORE)
            plain.send(frame, _LAST)
        except zmq.ZMQError as exc:
            return exc
        self._sent = True
        self._since_news += 1
        if self._since_news >= NEWS_EVERY:
            # As the asyncio socket does after each send (here after every few): the
            # socket takes in its peers' news (a queue drained, a peer gone), so a full
            # queue is found full and a slow subscriber loses only its own messages
            # (tests/controller/test_feed.py).
            self._since_news = 0
            plain.get(zmq.EVENTS)
        return None

    def done(self) -> None:
        """After a pass of sends: wake a receive whose edge a send took (what pyzmq's
        asyncio socket does after each of its own sends)."""
        if self._sent:
            self._sent = False
            recheck = getattr(self.sock, "_schedule_remaining_events", None)
            if recheck is not None:
                recheck()


def sent(future: Any) -> BaseException | None:
    """The error of a non-blocking asyncio send (it completes at once), if any."""
    return future.exception() if future.done() else None


def bind_or_say(sock: zmq.Socket, key: str, endpoint: str) -> None:
    """Bind, or fail with one line naming the setting (a taken port, an unknown host)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise RuntimeError(f"{key} = {endpoint!r}: cannot listen there: {exc.strerror}"
                           ) from None


def decoded(frames: list[zmq.Frame], kinds: frozenset[str], *,
             strict: bool = False) -> tuple[bytes, Envelope | BadFrame]:
    """A frame pair as (routing id, message), or why it is none."""
    if len(frames) != 2:
        return frames[0].bytes, BadFrame("framing",
                                         f"{len(frames) - 1} frames where one was expected")
    try:
        return frames[0].bytes, decode(frames[1].bytes, allowed=kinds, strict=strict)
    except WireError as exc:
        return frames[0].bytes, BadFrame("invalid", str(exc), exc.seq, exc.readable)


def agent_router(ctx: zmq.asyncio.Context, pair: keys.KeyPair | None) -> zmq.asyncio.Socket:
    """The agents' ROUTER, not yet bound (CurveZMQ with ``pair``)."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
    # ZeroMQ drops a peer that sends a frame larger than this before we see it.
    router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME + 1024)
    if pair is not None:
        curve_server(router, pair, AGENTS)
    return router


def feed_router(ctx: zmq.asyncio.Context, send_hwm: int, socket_buffer: int,
                pair: keys.KeyPair | None) -> zmq.asyncio.Socket:
    """The tenants' ROUTER, not yet bound: a bounded queue per subscriber."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
    # Sending to a gone or full subscriber fails at once instead of vanishing.
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, send_hwm)
    if socket_buffer:
        router.setsockopt(zmq.SNDBUF, socket_buffer)
    router.setsockopt(zmq.RCVHWM, 100)
    router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
    if pair is not None:
        curve_server(router, pair, TENANTS)
    return router
