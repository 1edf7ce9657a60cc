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
