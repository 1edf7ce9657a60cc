"""Agents' frames at a cluster replica's door (see controller/replica.py).

Each frame is read, its sender checked against its key, and handed to its host's
:class:`Door`, which takes the host's frames one at a time: what the agent sends for the
controller to apply is stored on the bus, fenced on the host's previous store
(controller/bus/ingest.py decides, frame by frame), before the agent is answered. A
host's hello makes this replica the way the leader's messages reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from controller.auth import ZapHandler
from controller.bus.ingest import HostLog, Verdict, judge, message_id
from controller.bus.nats import Bus, Fenced, agent_subject, to_agent_subject
from controller.heartbeats import heartbeat_sender
from controller.publications import SENDER
from controller.sockets import decoded
from harmonaize.messages import AGENT_KINDS, Envelope, Goodbye, Hello, Message, encode

log = logging.getLogger("harmonaize.controller")


@dataclass
class Door:
    """One host at this replica: its connection, what the bus holds for it, its frames
    in order."""

    host: str
    conn: bytes | None = None
    log: HostLog | None = None
    frames: asyncio.Queue[tuple[bytes, Envelope, bytes]] = field(
        default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    listening: bool = False
    #: A frame of this host's is being taken (stored, answered): what it does may change
    #: what the next one is judged by.
    busy: bool = False


class AgentDoors:
    """The agents' doors of :class:`controller.replica.ReplicaServer`, which holds the
    state."""

    bus: Bus
    doors: dict[str, Door]
    ingest_stats: dict[str, int]
    router: zmq.asyncio.Socket | None
    zap: ZapHandler | None
    _heard: set[str]
    _failure_logged: float

    async def _frames(self, router: zmq.asyncio.Socket) -> None:
        authenticated = self.zap is not None
        while True:
            await router.poll(flags=zmq.POLLIN)
            while True:
                try:
                    frames = router.recv_multipart(flags=zmq.NOBLOCK, copy=False).result()
                except zmq.Again:
                    break
                if len(frames) == 2 and self._beat(frames, authenticated):
                    continue
                conn, message = decoded(frames, AGENT_KINDS)
                if not isinstance(message, Envelope):
                    self.ingest_stats["rejected"] += 1
                    continue
                host = frames[1].get("User-Id") if authenticated else message.sender
                if host != message.sender:
                    # The key decides who a host is; the frame's sender must agree with it.
                    self.ingest_stats["rejected"] += 1
                    continue
                door = self.doors.get(host)
                if door is None:
                    door = self.doors[host] = Door(host)
                    door.task = asyncio.get_running_loop().create_task(self._door(door))
                door.frames.put_nowait((conn, message, frames[1].bytes))

    def _beat(self, frames: list[zmq.Frame], authenticated: bool) -> bool:
        """A heartbeat, the common case (one a second from every host), read without the
        full decoder (controller/heartbeats.py) and taken without the host's queue when
        its door is idle on this connection: the host heard, as :meth:`_take` would
        judge it then (a beat). False: anything else, or another moment; the full way."""
        sender = heartbeat_sender(frames[1].bytes)
        if sender is None:
            return False
        host = frames[1].get("User-Id") if authenticated else sender
        door = self.doors.get(host)
        if (host != sender or door is None or door.log is None or door.busy
                or not door.frames.empty() or door.conn != frames[0].bytes):
            return False
        self._heard.add(host)
        self.ingest_stats["beats"] += 1
        return True

    async def _door(self, door: Door) -> None:
        """One host's frames, one at a time: each store is fenced on the one before."""
        while True:
            conn, env, frame = await door.frames.get()
            door.busy = True
            try:
                await self._take(door, conn, env, frame)
            except Exception as exc:  # the bus away, a timeout: no answer, the agent resends
                self.ingest_stats["failed"] += 1
                now = time.monotonic()
                if now - self._failure_logged >= 10.0:
                    self._failure_logged = now
                    log.warning("host %s: frame %d not stored (%s: %s); %d such in all",
                                door.host, env.seq, type(exc).__name__, exc,
                                self.ingest_stats["failed"])
            finally:
                door.busy = False

    async def _take(self, door: Door, conn: bytes, env: Envelope, frame: bytes) -> None:
        if isinstance(env.body, Hello):
            door.log = await self.bus.agent_log(door.host)  # another replica may have had it
        known = door.log if conn == door.conn or isinstance(env.body, Hello) else None
        decision = judge(known, env)
        if decision.verdict is Verdict.BEAT:
            self._heard.add(door.host)
            return
        if decision.verdict is Verdict.STORE:
            assert decision.after is not None and door.log is not None
            after = decision.after
            try:
                stored = await self.bus.store(
                    agent_subject(door.host), frame, door.log.subject_seq,
                    headers={"hz-host": door.host, "hz-epoch": str(after.epoch),
                             "hz-seq": str(after.seq)},
                    msg_id=message_id(door.host, after, env))
            except Fenced:
                # Another replica stored for this host since: what does the bus hold now?
                self.ingest_stats["fenced"] += 1
                door.log = await self.bus.agent_log(door.host)
                if conn == door.conn and not isinstance(env.body, Hello | Goodbye):
                    self._answer(conn, judge(door.log, env).answer)
                return
            self.ingest_stats["stored"] += 1
            door.log = dataclasses.replace(after, subject_seq=stored.seq)
            self._heard.add(door.host)
            if isinstance(env.body, Hello):
                door.conn = conn
                await self._listen(door)
        self._answer(conn, decision.answer)

    def _answer(self, conn: bytes, message: Message | None) -> None:
        if message is None or self.router is None:
            return
        self.ingest_stats["answered"] += 1
        with contextlib.suppress(zmq.ZMQError):  # the door closed meanwhile: it resends
            self.router.send_multipart([conn, encode(message, sender=SENDER)],
                                       flags=zmq.NOBLOCK)

    async def _listen(self, door: Door) -> None:
        """What the leader has for the host reaches it through this replica."""
        if door.listening:
            return
        assert self.bus.nc is not None

        async def forward(msg: Any) -> None:
            if door.conn is not None and self.router is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self.router.send_multipart([door.conn, msg.data], flags=zmq.NOBLOCK)

        await self.bus.nc.subscribe(to_agent_subject(door.host), cb=forward)
        door.listening = True
