"""The agent's connection to the controller: a ZeroMQ DEALER around :class:`Outbox`.

``ZMQ_IMMEDIATE`` keeps messages out of ZeroMQ's queues while the controller is
away, so they wait in the outbox where they can be coalesced and counted. The
controller answers each sequenced message with a cumulative ack; a message
from a connection it does not know gets a ``resync``, to which we answer with
a hello and a resend of everything unacknowledged.

With a clustered controller (``endpoints``), any replica takes any host: the agent
starts at one picked by its host id and moves to the next when its replica has been
unreachable, or has acknowledged nothing sent, for ``failover`` seconds; there it says
hello, learns what the cluster holds, and resends the rest.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import zlib
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

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
    ValidationDecision,
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
        on_validation: Callable[[ValidationDecision], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        spool: Spool | None = None,
        curve: tuple[keys.KeyPair, bytes] | None = None,
    ) -> None:
        self.cfg = cfg
        self.host_id = host_id
        self.endpoints = cfg.endpoints or (cfg.endpoint,)
        # Hosts spread over the replicas: each starts at one its id picks.
        self._at = zlib.crc32(host_id.encode()) % len(self.endpoints)
        self._curve = curve
        self._ctx = ctx
        self._hello = hello
        self._on_resync = on_resync
        self._on_declaration = on_declaration
        self._on_tuning = on_tuning
        self._on_validation = on_validation
        self._clock = clock
        self._started = clock()
        self.outbox = Outbox(limit=cfg.outbox_limit, ack_timeout=cfg.ack_timeout, spool=spool)
        self.authenticated = curve is not None
        self._sock, self._monitor = self._socket()
        #: When the connection was last known up (None: it is up now).
        self._down_since: float | None = clock()
        #: When acknowledgements last made progress (or nothing was waiting for one).
        self._progress_at = clock()
        self.failovers = 0
        #: Why the next wait of run() moves to the next replica first (None: it does not).
        self._moving: str | None = None
        self._need_hello = True
        #: When the last hello went out (resyncs soon after it are for frames before it).
        self._hello_at = -math.inf
        self._next_heartbeat = 0.0
        self.last_ack_at: float | None = None
        self.rejected = 0
        self.resyncs = 0

    def _socket(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        sock = self._ctx.socket(zmq.DEALER)
        if self._curve is not None:
            keys.curve_client(sock, *self._curve)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # ZMTP heartbeats notice a dead TCP peer that never sent a FIN.
        beat_ms = max(100, int(self.cfg.heartbeat * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, beat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, beat_ms * 3)
        up = zmq.EVENT_HANDSHAKE_SUCCEEDED if self._curve is not None else zmq.EVENT_CONNECTED
        return sock, sock.get_monitor_socket(up | zmq.EVENT_DISCONNECTED)

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._at]

    def connect(self) -> None:
        self._sock.connect(self.endpoint)
        self.pump()

    def _watch(self, now: float) -> None:
        """The connection's ups and downs, from the socket's monitor."""
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(
                    flags=zmq.NOBLOCK).result())
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                if self._down_since is None:
                    self._down_since = now
            else:
                self._down_since = None

    def _move_on(self, now: float) -> None:
        """With more than one replica: leave one that has been away, or silent about what
        it was sent, for ``failover`` seconds."""
        if len(self.endpoints) < 2:
            return
        if self.outbox.in_flight == 0:
            self._progress_at = now
        away = self._down_since is not None and now - self._down_since >= self.cfg.failover
        silent = now - self._progress_at >= self.cfg.failover
        if away or silent:
            # Not here: a task may be waiting on this socket (run()); it moves between waits.
            self._moving = "unreachable" if away else "acknowledged nothing"

    def _switch(self, now: float) -> None:
        """Leave this replica for the next one: a new socket, a hello, everything unacked
        resent there."""
        why, self._moving = self._moving, None
        previous = self.endpoint
        self._sock.disable_monitor()
        self._monitor.close()
        self._sock.close()
        self._at = (self._at + 1) % len(self.endpoints)
        self._sock, self._monitor = self._socket()
        self._sock.connect(self.endpoint)
        self.failovers += 1
        self._down_since = self._progress_at = now
        self._need_hello = True
        self.outbox.rewind(now)
        log.warning("controller at %s %s for %.1f s: moving to %s", previous, why,
                    self.cfg.failover, self.endpoint)

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
        self._watch(now)
        self._move_on(now)
        if self._moving is not None:
            return  # run() moves on first
        if self._need_hello:
            if not self._try_send(self._hello(self.outbox.acked)):
                return
            self._need_hello = False
            self._hello_at = now
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
            if body.seq > self.outbox.acked or self.outbox.in_flight == 0:
                self._progress_at = self._clock()
            self.outbox.ack(body.seq)
            self.last_ack_at = self._clock()
        elif isinstance(body, Resync):
            self.resyncs += 1
            now = self._clock()
            if now - self._hello_at < self.cfg.ack_timeout:
                # Frames sent before our hello was taken each draw a resync: one hello
                # answers them all (resending on each would feed a storm).
                return
            log.info("controller asked for a resync: %s", body.reason or "unknown connection")
            self._need_hello = True
            self.outbox.rewind(now)
            if self._on_resync is not None:
                self._on_resync()
        elif isinstance(body, JobDeclaration) and self._on_declaration is not None:
            self._on_declaration(body)
        elif isinstance(body, TuningArm | TuningResolve) and self._on_tuning is not None:
            self._on_tuning(body)
        elif isinstance(body, ValidationDecision) and self._on_validation is not None:
            self._on_validation(body)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._moving is not None:
                self._switch(self._clock())
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
        self._sock.disable_monitor()
        self._monitor.close()
        self._sock.close()
        if self.outbox.spool is not None:
            self.outbox.spool.close()

    def status(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "endpoint": self.endpoint,
            "endpoints": list(self.endpoints),
            "failovers": self.failovers,
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
