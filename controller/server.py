"""The controller's daemon shell: sockets, authentication, SQLite, timers.

Every decision is the sans-I/O :class:`~controller.core.ControllerCore`'s
(cluster state, redaction, agreement, declarations, the feed's numbering and
tenants' access); this module only moves bytes and time in and out of it.

Agents talk to a ROUTER socket. The shell reads up to a batch of frames,
decodes each and hands it to the core with the connection's routing id and
the host its CurveZMQ key names; then it ticks the core, which answers with
one Commit and the sends that depend on it. The Commit (the batch's state and
its publications, numbered per topic, kept in a bounded feed log) is stored in
SQLite in one transaction; only then are agents acknowledged and tenants sent
the publications. So nothing an agent was told is stored can be lost for a
tenant: one that missed it resumes from its last sequence number.

Tenants talk to a second ROUTER socket: they subscribe (identity from their
CurveZMQ key, never from the request), renew, resume, and send declarations.
Each subscriber has its own bounded queue in ZeroMQ; a full one loses messages
(counted per subscriber, by the core) instead of slowing others.

Between frames the shell sleeps until the core's next deadline (a host that
may have gone silent, a capacity update held back by its interval and jitter,
an agreement timeout or resend, a subscription's renewal, republication,
pruning), or until new input may have moved it.

The operator's commands and reload are controller/operatorcommands.py's; decoding frames and
binding sockets controller/sockets.py's; sending to tenants controller/tenantsends.py's.

Longer than 400 lines: the three loops and the execution of every output in one place,
so that what is stored before what is sent can be read in one module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from controller import selfmetrics
from controller.auth import AGENTS, TENANTS, AllowList, ZapHandler
from controller.config import AuthMode, ControllerConfig
from controller.core import ControllerCore
from controller.gateway.http import Gateway
from controller.gateway.tokens import TokenBook, Tokens
from controller.handshakes import PortWatch
from controller.handshakes import watch as watch_handshakes
from controller.heartbeats import heartbeat_sender
from controller.limits import raise_descriptor_limit
from controller.operatorcommands import OperatorCommands
from controller.outputs import (
    AgentPeer,
    AnswerTenant,
    Commit,
    Delivery,
    FanOut,
    Output,
    Prune,
    Replay,
    SendToAgent,
    SendToTenant,
    TenantPeer,
)
from controller.publications import SENDER
from controller.scheduler.wiring import SchedulerWiring
from controller.sockets import (
    ZMQ_PEER,
    agent_router,
    bind_or_say,
    decoded,
    feed_router,
    received,
    sent,
)
from controller.store import Store, StoreError
from controller.tenantsends import fan_out, to_tenant
from controller.writeback import Writer
from harmonaize import keys
from harmonaize.exhaustion import AcceptExhaustion
from harmonaize.logs import one_line
from harmonaize.messages import (
    AGENT_KINDS,
    TENANT_KINDS,
    Envelope,
    Reply,
    encode,
)
from harmonaize.metrics import MetricsServer, Registry
from harmonaize.opsocket import OperatorSocket
from harmonaize.sdnotify import Notifier

log = logging.getLogger("harmonaize.controller")

#: Frames handled per batch before committing and acknowledging.
BATCH = 2000


class ControllerServer(OperatorCommands):
    #: Commits must survive an OS crash (a cluster replica's database is only a cache).
    DURABLE = True

    def __init__(self, cfg: ControllerConfig, cfg_path: Path | None = None, *,
                 initialise: bool = False) -> None:
        self.cfg = cfg
        self.cfg_path = cfg_path
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.metrics: MetricsServer | None = None
        self.notifier = Notifier()
        try:
            self.store = Store(cfg.controller.database, initialise=initialise,
                               durable=self.DURABLE)
        except StoreError as exc:
            raise RuntimeError(f"controller.database: {exc}") from None
        self.core = ControllerCore(cfg, time.monotonic(), self.store.restored(),
                                   rng=random.Random(), wall=time.time())
        #: Commits, paused while the disk is full (controller/writeback.py).
        self.writer = Writer(self.store, cfg.controller.full_disk_retry)
        self._ctx = zmq.asyncio.Context()
        self._stop = asyncio.Event()
        #: Set when input may have moved the core's next deadline.
        self._wake = asyncio.Event()
        self.router: zmq.asyncio.Socket | None = None
        self._pair: keys.KeyPair | None = None
        self.tenants: zmq.asyncio.Socket | None = None
        self.zap: ZapHandler | None = None
        self.ports = {"agents": PortWatch("agent"), "feed": PortWatch("feed")}
        #: Tenants over HTTP ([gateway]); None where it is off.
        self.gateway: Gateway | None = None
        #: Accepts that failed for want of descriptors, on any of our listeners.
        self.exhaustion = AcceptExhaustion()
        self.anonymous = cfg.auth.mode is AuthMode.NONE
        #: Tenants' HTTP gateway tokens (a cluster replica keeps them on its bus).
        self.tokens: TokenBook = Tokens(self.store.db)
        #: Hosts' holds drained and resumed in the provider's scheduler ([scheduler]).
        self.scheduler = SchedulerWiring(self)
        self.admin = OperatorSocket(
            cfg.controller.admin_socket,
            self._commands(),
            group=cfg.controller.admin_group,
            mode=0o660,
            scheduler_users=cfg.controller.scheduler_users,
        )

    # --- lifecycle -----------------------------------------------------------------------

    def _bind(self) -> None:
        auth = self.cfg.auth
        pair = None
        if auth.mode is AuthMode.CURVE:
            keys_dir = Path(auth.keys_dir)
            try:
                pair = keys.load_pair(keys_dir / f"controller{keys.SECRET_SUFFIX}")
            except keys.KeyFileError as exc:
                raise RuntimeError(
                    f"{exc} (make one with: harmonctl keygen --dir {keys_dir} controller; "
                    "or set auth.mode = \"none\")") from None
            self.zap = ZapHandler(self._ctx, {AGENTS: AllowList(keys_dir / AGENTS),
                                              TENANTS: AllowList(keys_dir / TENANTS)})
        else:
            log.warning("auth.mode = none: anyone who reaches %s may send host state, and "
                        "tenants get pool topics only", self.cfg.controller.listen)
        self._pair = pair
        self.router = self._agent_socket()
        self.tenants = feed_router(self._ctx, self.cfg.feed.send_hwm, self.cfg.feed.socket_buffer,
                                   pair)
        bind_or_say(self.tenants, "controller.feed", self.cfg.controller.feed)

    def _agent_socket(self) -> zmq.asyncio.Socket:
        """The agents' ROUTER, bound (a cluster replica makes it again after its bus
        came back)."""
        router = agent_router(self._ctx, self._pair)
        bind_or_say(router, "controller.listen", self.cfg.controller.listen)
        return router

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)  # the outcome is logged
        raise_descriptor_limit()
        self.exhaustion.install(loop)  # out of descriptors at accept: one line, counted
        await self._prepare()
        self._bind()
        if self.zap is not None:
            self.zap.start()
        try:
            await self.admin.start()
        except (OSError, RuntimeError) as exc:
            raise RuntimeError(f"controller.admin_socket: {one_line(exc)}") from None
        if self.cfg.gateway.listen:
            self.gateway = Gateway(self.cfg.gateway, self, hwm=self.cfg.feed.send_hwm)
            await self.gateway.start()
        if self.cfg.metrics.listen:
            registry = Registry("harmonaize_controller")
            registry.register("controller", lambda: selfmetrics.collect(self))
            self.metrics = MetricsServer(self.cfg.metrics.listen, registry)
            await self.metrics.start()
        self._execute(self.core.tick(time.monotonic(), time.time()))
        hosts = len(self.core.cluster.hosts)
        self.notifier.ready(f"{hosts} known hosts")
        log.info("controller ready: agents on %s, feed on %s, %d known hosts",
                 self.cfg.controller.listen, self.cfg.controller.feed, hosts)
        tasks = [asyncio.create_task(coro, name=name) for name, coro in self._loops()]
        stopper = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.notifier.stopping()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self.gateway is not None:
                await self.gateway.close()
            self._execute(self.core.close())
            if self.writer.unstored is not None:
                log.warning("stopping with %d batch(es) that found no room on disk: nothing "
                            "of them was acknowledged; agents send them again",
                            self.writer.unstored_batches)
            await self.admin.close()
            if self.metrics is not None:
                await self.metrics.close()
            await self._finish()
            for sock in (self.router, self.tenants):
                if sock is not None:
                    sock.close()
            if self.zap is not None:
                await self.zap.close()
            self._ctx.term()
            self.store.close()
            self.notifier.close()
            log.info("controller stopped")
        return 0

    def stop(self) -> None:
        self._stop.set()

    async def _prepare(self) -> None:
        """Before the sockets are bound (a cluster replica connects to its bus here)."""

    async def _finish(self) -> None:
        """After the loops stopped, before the sockets close."""

    def _loops(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """The shell's loops: agents in, tenants in, the handshake watchers, the timer."""
        assert self.router is not None and self.tenants is not None
        return [
            ("ingest", self._ingest_loop()),
            ("agent-port", watch_handshakes(self.router, self.ports["agents"])),
            ("feed-port", watch_handshakes(self.tenants, self.ports["feed"])),
            ("feed", self._feed_loop()),
            ("timer", self._timer_loop()),
            *self.scheduler.loops(),
        ]

    # --- the loops -----------------------------------------------------------------------

    async def _ingest_loop(self) -> None:
        assert self.router is not None
        authenticated = self.zap is not None
        core = self.core
        # The same socket, read without asyncio's future per frame: the loop drains what
        # is queued, then awaits the asyncio socket's readiness again.
        router = zmq.Socket.shadow(self.router.underlying)
        while True:
            await self.router.poll(flags=zmq.POLLIN)
            now = time.monotonic()
            out: list[Output] = []
            senders: set[str] = set()
            for _ in range(BATCH):
                try:
                    frames = received(router)
                except zmq.Again:
                    break
                # The key's name, which the core holds the frame's sender to.
                host = frames[1].get("User-Id") if authenticated and len(frames) == 2 else None
                if len(frames) == 2:
                    # A heartbeat from a known host, the common case, without the full
                    # decoder and envelope (controller/heartbeats.py); all else below.
                    sender = heartbeat_sender(frames[1].bytes)
                    if sender is not None and core.heartbeat(AgentPeer(frames[0].bytes, host),
                                                             sender, now):
                        senders.add(host or sender)
                        continue
                conn, message = decoded(frames, AGENT_KINDS)
                out += core.receive(AgentPeer(conn, host), message, now)
                if isinstance(message, Envelope):
                    senders.add(host or message.sender)
            out += core.tick(now, time.time())  # a Commit, then what it allows
            self._execute(out)
            self.scheduler.poke(senders)  # a sender's holds may have changed

    async def _feed_loop(self) -> None:
        assert self.tenants is not None
        authenticated = self.zap is not None
        while True:
            frames = await self.tenants.recv_multipart(copy=False)
            tenant = frames[1].get("User-Id") if authenticated and len(frames) >= 2 else ""
            # The request spends its tenant's budget before it is decoded: over budget
            # it is dropped unread, whatever it holds.
            if self.core.feed.admit(tenant, time.monotonic()):
                peer, message = decoded(frames, TENANT_KINDS, strict=True)
                # ZeroMQ's peers are z + routing id, the gateway's h + a number: no
                # client can choose a routing id that names another's peer.
                self._execute(self.core.receive(
                    TenantPeer(ZMQ_PEER + peer, tenant, admitted=True), message,
                    time.monotonic()))
            # A queued frame completes the await without yielding: let agents' frames,
            # acks and heartbeats have their turn between any two tenant requests.
            await asyncio.sleep(0)

    async def _timer_loop(self) -> None:
        """Sleep until the core's next deadline, or until input may have moved it."""
        while True:
            self._wake.clear()
            if self.writer.paused and time.monotonic() >= self.writer.next_retry:
                self._try_writing_again()
            deadline = self.core.next_deadline()
            if self.writer.paused:  # on its own deadline: no busy loop while the disk is full
                deadline = min(math.inf if deadline is None else deadline,
                               self.writer.next_retry)
            delay = None if deadline is None else deadline - time.monotonic()
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue  # look again: due now, or a new deadline
            self._execute(self.core.tick(time.monotonic(), time.time()))
            self.scheduler.poke()  # a host may have been counted down or back

    # --- executing the core's outputs ----------------------------------------------------

    def execute(self, outputs: list[Output]) -> None:
        """Run the core's outputs (the gateway's requests come this way too)."""
        self._execute(outputs)

    async def ask(self, tenant: str, request: Envelope) -> Reply | None:
        """This controller's own core answers its tenants' requests."""
        return None

    async def query(self, name: str, args: dict[str, Any]) -> Any:
        """This controller holds every view itself."""
        return None

    def _execute(self, outputs: list[Output]) -> None:
        """In order: a Commit is stored before anything after it goes out. While the disk
        is full, what depends on unstored state waits (controller/writeback.py)."""
        gateway = self.gateway
        writer = self.writer
        now = time.monotonic()
        unstored_before = False  # a Commit of these outputs found no room
        for out in outputs:
            if isinstance(out, Commit):
                unstored_before |= not writer.commit(out.writes, now)
                continue
            if isinstance(out, Prune):
                writer.prune(out, now)
                continue
            if unstored_before or (writer.paused and isinstance(out, SendToAgent | FanOut
                                                                 | SendToTenant)):
                # Answers to tenants' requests (reads, "try later") and replays of the
                # stored feed still go out; acknowledgements and publications wait.
                writer.hold(out)
                continue
            if isinstance(out, FanOut):
                self._fan_out(out)
            elif isinstance(out, SendToAgent):
                self._send(out.conn, out.message)
            elif isinstance(out, SendToTenant):
                if gateway is not None and gateway.ours(out.peer):
                    self.core.delivered(out, gateway.deliver(out))
                else:
                    self.core.delivered(out, self._to_tenant(out.peer, out.topic.encode(),
                                                             out.frame))
            elif isinstance(out, AnswerTenant):
                if gateway is not None and gateway.ours(out.peer):
                    self.core.delivered(out, gateway.answer(out.peer, out.message))
                else:
                    self.core.delivered(out, self._to_tenant(
                        out.peer, b"", encode(out.message, sender=SENDER)))
            elif isinstance(out, Replay):
                for _, frame in self.store.replay(out.topic, out.after, out.limit,
                                                  out.retained_from):
                    self.core.delivered(SendToTenant(out.peer, out.topic, frame),
                                        self._to_tenant(out.peer, out.topic.encode(), frame))
        self.core.storage_paused = writer.paused
        self._wake.set()

    def _try_writing_again(self) -> None:
        """The disk was full: store what was kept, then send what waited for it."""
        waiting = self.writer.try_again(time.monotonic())
        if waiting is not None:
            self.core.storage_paused = False
            self._execute(waiting)

    def _send(self, conn: bytes, body: Any) -> None:
        assert self.router is not None
        # Failure is fine: a gone peer resyncs, a full one resends what is unacknowledged.
        sent(self.router.send_multipart([conn, encode(body, sender=SENDER)], flags=zmq.NOBLOCK))

    def _fan_out(self, out: FanOut) -> None:
        full, gone = fan_out(self.tenants, self.gateway, out)
        if full or gone:
            self.core.fanned(full, gone)

    def _to_tenant(self, peer: bytes, topic: bytes, frame: bytes) -> Delivery:
        assert self.tenants is not None
        return to_tenant(self.tenants, peer, topic, frame)
