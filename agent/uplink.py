"""The agent's connection to the controller: a ZeroMQ DEALER around :class:`Outbox`.

``ZMQ_IMMEDIATE`` keeps messages out of ZeroMQ's queues while the controller is
away, so they wait in the outbox where they can be coalesced and counted. The
controller answers each sequenced message with a cumulative ack; a message
from a connection it does not know gets a ``resync``, to which we answer with
a hello and a resend of everything unacknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from agent.config import ControllerSection
from agent.outbox import Outbox
from agent.spool import Spool
from harmonaize import keys
from harmonaize.messages import (
    CONTROLLER_KINDS,
    Ack,
    Goodbye,
    Heartbeat,
    Hello,
    JobDeclaration,
    Message,
    Resync,
    TuningArm,
    TuningResolve,
    WireError,
    decode,
    encode,
)

log = logging.getLogger(__name__)


class Uplink:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        cfg: ControllerSection,
        host_id: str,
        hello: Callable[[int], Hello],
        *,
        on_resync: Callable[[], None] | None = None,
        on_declaration: Callable[[JobDeclaration], None] | None = None,
        on_tuning: Callable[[TuningArm | TuningResolve], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        spool: Spool | None = None,
        curve: tuple[keys.KeyPair, bytes] | None = None,
    ) -> None:
        self.cfg = cfg
        self.host_id = host_id
        self._hello = hello
        self._on_resync = on_resync
        self._on_declaration = on_declaration
        self._on_tuning = on_tuning
        self._clock = clock
        self._started = clock()
        self.outbox = Outbox(limit=cfg.outbox_limit, ack_timeout=cfg.ack_timeout, spool=spool)
        self._sock = ctx.socket(zmq.DEALER)
        if curve is not None:
            keys.curve_client(self._sock, *curve)
        self.authenticated = curve is not None
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # ZMTP heartbeats notice a dead TCP peer that never sent a FIN.
        beat_ms = max(100, int(cfg.heartbeat * 1000))
        self._sock.setsockopt(zmq.HEARTBEAT_IVL, beat_ms)
        self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, beat_ms * 3)
        self._need_hello = True
        self._next_heartbeat = 0.0
        self.last_ack_at: float | None = None
        self.rejected = 0
        self.resyncs = 0

    def connect(self) -> None:
        self._sock.connect(self.cfg.endpoint)
        self.pump()

    # --- sending ----------------------------------------------------------------------

    def _try_send(self, body: Message, seq: int = 0) -> bool:
        data = encode(body, sender=self.host_id, seq=seq)
        future = self._sock.send(data, flags=zmq.NOBLOCK)
        exc = future.exception() if future.done() else None
        if exc is None:
            return True
        if isinstance(exc, zmq.Again):
            return False
        raise exc

    def publish(self, body: Message) -> None:
        self.outbox.add(body)
        self.pump()

    def pump(self) -> None:
        """Send what can go now; whatever cannot stays in the outbox."""
        now = self._clock()
        if self._need_hello:
            if not self._try_send(self._hello(self.outbox.acked)):
                return
            self._need_hello = False
        for seq, body in self.outbox.due(now):
            if not self._try_send(body, seq):
                return
        while (item := self.outbox.take(now)) is not None:
            seq, body = item
            if not self._try_send(body, seq):
                self.outbox.untake(seq)
                return
        if now >= self._next_heartbeat:
            beat = Heartbeat(uptime=now - self._started, last_seq=self.outbox.last_sent)
            if self._try_send(beat):
                self._next_heartbeat = now + self.cfg.heartbeat

    # --- receiving --------------------------------------------------------------------

    def _handle(self, data: bytes) -> None:
        try:
            envelope = decode(data, allowed=CONTROLLER_KINDS)
        except WireError as exc:
            self.rejected += 1
            log.warning("ignoring a bad frame from the controller: %s", exc)
            return
        body = envelope.body
        if isinstance(body, Ack):
            self.outbox.ack(body.seq)
            self.last_ack_at = self._clock()
        elif isinstance(body, Resync):
            self.resyncs += 1
            log.info("controller asked for a resync: %s", body.reason or "unknown connection")
            self._need_hello = True
            self.outbox.rewind(self._clock())
            if self._on_resync is not None:
                self._on_resync()
        elif isinstance(body, JobDeclaration) and self._on_declaration is not None:
            self._on_declaration(body)
        elif isinstance(body, TuningArm | TuningResolve) and self._on_tuning is not None:
            self._on_tuning(body)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.pump()
            timeout = min(self.cfg.heartbeat, self.cfg.ack_timeout) / 2
            if await self._sock.poll(timeout=int(timeout * 1000), flags=zmq.POLLIN):
                while True:
                    try:
                        frames = self._sock.recv_multipart(flags=zmq.NOBLOCK).result()
                    except zmq.Again:
                        break
                    if len(frames) == 1:
                        self._handle(frames[0])
                    else:
                        self.rejected += 1

    def close(self, reason: str = "agent stopping") -> None:
        """Say goodbye (best effort: the controller also notices missed heartbeats)."""
        try:
            self._try_send(Goodbye(reason))
            self._sock.setsockopt(zmq.LINGER, 200)
        except zmq.ZMQError:
            pass
        self._sock.close()
        if self.outbox.spool is not None:
            self.outbox.spool.close()

    def status(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "endpoint": self.cfg.endpoint,
            "last_ack_age_seconds": None
            if self.last_ack_at is None
            else round(now - self.last_ack_at, 3),
            "last_seq": self.outbox.last_sent,
            "acked_seq": self.outbox.acked,
            "queued": self.outbox.queued,
            "in_flight": self.outbox.in_flight,
            "dropped_events": self.outbox.dropped,
            "restored_events": self.outbox.restored,
            "curve": self.authenticated,
            "resent": self.outbox.resent,
            "resyncs": self.resyncs,
            "rejected_frames": self.rejected,
        }
