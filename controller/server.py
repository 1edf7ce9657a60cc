"""The controller's daemon shell: sockets, batching, persistence, publication.

Agents talk to a ROUTER socket; every batch of frames is applied to the
sans-I/O :class:`Cluster`, and what tenants may see is worked out by the
:class:`Redactor` (aggregation and redaction, shared with the simulator).
The batch's state *and* its publications (numbered per topic, kept in a
bounded feed log) are committed to SQLite in one transaction; only then are
agents acknowledged and tenants sent the publications. So nothing an agent
was told is stored can be lost for a tenant: one that missed it resumes from
its last sequence number.

Tenants talk to a second ROUTER socket: they subscribe (access-controlled by
:mod:`controller.feed`, identity from their CurveZMQ key), renew, resume, and
send declarations. Each subscriber has its own bounded queue in ZeroMQ; a
full one loses messages (counted per subscriber) instead of slowing others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import zmq
import zmq.asyncio

from controller import config as controller_config
from controller import selfmetrics
from controller.agreement import Agreement
from controller.auth import AGENTS, TENANTS, AllowList, ZapHandler, curve_server
from controller.cluster import Cluster
from controller.cluster import Reply as ClusterReply
from controller.config import AuthMode, ControllerConfig
from controller.feed import Budgets, FeedHub, Subscriber
from controller.handshakes import HANDSHAKE_TIMEOUT_MS, PortWatch
from controller.handshakes import watch as watch_handshakes
from controller.limits import descriptors, raise_descriptor_limit
from controller.redaction import Redactor
from controller.store import Store, StoreError
from controller.types import Member, Placement
from harmonaize import __version__, keys
from harmonaize.config import ConfigError
from harmonaize.logs import one_line
from harmonaize.messages import (
    AGENT_KINDS,
    MAX_FRAME,
    TENANT_KINDS,
    Category,
    Hello,
    JobDeclaration,
    Message,
    PoolCapacity,
    Reply,
    Subscribe,
    TuningReport,
    TuningStatus,
    WireError,
    decode,
    encode,
)
from harmonaize.metrics import MetricsServer, Registry
from harmonaize.opsocket import Command, CommandError, OperatorSocket
from harmonaize.schema import Ident, Len, Name, SchemaError, from_plain, to_plain
from harmonaize.sdnotify import Notifier

log = logging.getLogger("harmonaize.controller")

SENDER = "controller"
#: Frames handled per batch before committing and acknowledging.
BATCH = 2000
#: Rejected frames logged per window; all of them are counted.
REJECT_LOG_BURST = 10
REJECT_LOG_WINDOW = 10.0
#: Seconds between prunings of old host events and of the feed log beyond its retention.
FEED_PRUNE_INTERVAL = 60.0


@dataclass(frozen=True)
class MemberRequest:
    name: Ident
    host: Ident


@dataclass(frozen=True)
class PlacementRequest:
    """A placement as the provider's scheduler sends it (validated like any input)."""

    STRICT_KEYS: ClassVar[bool] = True
    job: Ident
    tenant: Ident
    members: Annotated[tuple[MemberRequest, ...], Len(4096, min_len=1)]
    #: The Unix group (name or number) the job's processes run with on its hosts:
    #: only that group may read and follow the job's tuner policy there.
    group: Name = ""


def _sent(future: Any) -> BaseException | None:
    """The error of a non-blocking asyncio send (it completes at once), if any."""
    return future.exception() if future.done() else None


def _budgets(cfg: ControllerConfig) -> Budgets:
    feed = cfg.feed
    return Budgets(feed.request_rate, feed.request_burst, feed.replay_rate, feed.replay_burst)


def _bind_or_say(sock: zmq.Socket, key: str, endpoint: str) -> None:
    """Bind, or fail with one line naming the setting (a taken port, an unknown host)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise RuntimeError(f"{key} = {endpoint!r}: cannot listen there: {exc.strerror}"
                           ) from None


class ControllerServer:
    def __init__(self, cfg: ControllerConfig, cfg_path: Path | None = None, *,
                 initialise: bool = False) -> None:
        self.cfg = cfg
        self.cfg_path = cfg_path
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.metrics: MetricsServer | None = None
        self.notifier = Notifier()
        try:
            self.store = Store(cfg.controller.database, initialise=initialise)
        except StoreError as exc:
            raise RuntimeError(f"controller.database: {exc}") from None
        self.cluster = Cluster(missed_heartbeats=cfg.liveness.missed_heartbeats)
        self.cluster.restore(self.store.load_hosts(), time.monotonic())
        self.redactor = Redactor(cfg.redaction, random.Random())
        #: Multi-host jobs' tuning: two-phase changes every host applies alike.
        self.agreement = Agreement(cfg.tuning)
        now = time.monotonic()
        for job, state in self.store.load_tuning().items():
            try:
                self.agreement.restore(job, state, now)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("job %s: unreadable tuning state ignored: %s", job, exc)
        for placement in self.store.load_placements():
            self.redactor.place(placement)
            self.agreement.set_hosts(placement.job, {m.host_id for m in placement.members})
        #: Sequence numbers are per topic, so a tenant's gaps say nothing about
        #: traffic on topics it cannot see.
        self.feed_seqs = self.store.load_feed_seqs()
        self._feed_dirty: dict[str, int] = {}
        #: Publications committed with the next batch, then sent: (topic, seq, condition, frame).
        self._feed_log: list[tuple[str, int, bool, bytes]] = []
        self._outgoing: list[tuple[str, bytes]] = []
        #: Arms and outcomes for agents, sent after the batch's replies.
        self._tuning_out: list[tuple[str, Message]] = []
        #: Each topic's newest condition (seq, frame): for late joiners and republication.
        self.latest = self.store.latest_conditions()
        self.hub = FeedHub(renew=cfg.feed.renew, budgets=_budgets(cfg))
        #: Declarations by job: (tenant, declaration).
        self.declarations: dict[str, tuple[str, JobDeclaration]] = {
            d.job: (tenant, d) for tenant, d in self.store.load_declarations()}
        self.frames = 0
        self.rejected: Counter[str] = Counter()
        self.feed_stats: Counter[str] = Counter()
        self._reject_window = (0.0, 0)
        self._ctx = zmq.asyncio.Context()
        self._stop = asyncio.Event()
        self.router: zmq.asyncio.Socket | None = None
        self.tenants: zmq.asyncio.Socket | None = None
        self.zap: ZapHandler | None = None
        self.ports = {"agents": PortWatch("agent"), "feed": PortWatch("feed")}
        self.admin = OperatorSocket(
            cfg.controller.admin_socket,
            self._commands(),
            group=cfg.controller.admin_group,
            mode=0o660,
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
        self.router = self._ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
        # ZeroMQ drops a peer that sends a frame larger than this before we see it.
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME + 1024)
        if pair is not None:
            curve_server(self.router, pair, AGENTS)
        _bind_or_say(self.router, "controller.listen", self.cfg.controller.listen)
        self.tenants = self._ctx.socket(zmq.ROUTER)
        self.tenants.setsockopt(zmq.LINGER, 0)
        self.tenants.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
        # Sending to a gone or full subscriber fails at once instead of vanishing.
        self.tenants.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.tenants.setsockopt(zmq.SNDHWM, self.cfg.feed.send_hwm)
        if self.cfg.feed.socket_buffer:
            self.tenants.setsockopt(zmq.SNDBUF, self.cfg.feed.socket_buffer)
        self.tenants.setsockopt(zmq.RCVHWM, 100)
        self.tenants.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        if pair is not None:
            curve_server(self.tenants, pair, TENANTS)
        _bind_or_say(self.tenants, "controller.feed", self.cfg.controller.feed)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)  # the outcome is logged
        raise_descriptor_limit()
        self._bind()
        if self.zap is not None:
            self.zap.start()
        try:
            await self.admin.start()
        except (OSError, RuntimeError) as exc:
            raise RuntimeError(f"controller.admin_socket: {one_line(exc)}") from None
        if self.cfg.metrics.listen:
            registry = Registry("harmonaize_controller")
            registry.register("controller", lambda: selfmetrics.collect(self))
            self.metrics = MetricsServer(self.cfg.metrics.listen, registry)
            await self.metrics.start()
        self._flush_publications()
        self.notifier.ready(f"{len(self.cluster.hosts)} known hosts")
        log.info(
            "controller ready: agents on %s, feed on %s, %d known hosts",
            self.cfg.controller.listen, self.cfg.controller.feed, len(self.cluster.hosts),
        )
        tasks = [
            asyncio.create_task(self._ingest_loop(), name="ingest"),
            asyncio.create_task(watch_handshakes(self.router, self.ports["agents"]),
                                name="agent-port"),
            asyncio.create_task(watch_handshakes(self.tenants, self.ports["feed"]),
                                name="feed-port"),
            asyncio.create_task(self._feed_loop(), name="feed"),
            asyncio.create_task(self._tick_loop(), name="tick"),
        ]
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
            self._commit()
            await self.admin.close()
            if self.metrics is not None:
                await self.metrics.close()
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

    # --- ingest --------------------------------------------------------------------------

    async def _ingest_loop(self) -> None:
        assert self.router is not None
        while True:
            await self.router.poll(flags=zmq.POLLIN)
            now = time.monotonic()
            replies = []
            for _ in range(BATCH):
                try:
                    frames = self.router.recv_multipart(flags=zmq.NOBLOCK, copy=False).result()
                except zmq.Again:
                    break
                replies.extend(self._frame(frames, now))
            self._publish_changes()  # staged: committed with the batch, sent after
            self._commit()
            for reply in replies:
                self._send(reply.conn, reply.body)
            self._send_tuning()
            self._send_feed()

    def _frame(self, frames: list[zmq.Frame], now: float) -> list[Any]:
        self.frames += 1
        if len(frames) != 2:
            self._reject("framing", f"{len(frames) - 1} frames where one was expected")
            return []
        conn, data = frames[0].bytes, frames[1].bytes
        try:
            envelope = decode(data, allowed=AGENT_KINDS)
        except WireError as exc:
            self._reject("invalid", str(exc))
            return []
        if self.zap is not None:
            # The key decides who a host is; the frame's sender must agree with it.
            user = frames[1].get("User-Id")
            if envelope.sender != user:
                self._reject("identity", f"key of {user!r} used to speak for "
                             f"{envelope.sender!r:.60}")
                return []
        replies = self.cluster.receive(conn, envelope, now)
        if isinstance(envelope.body, Hello):
            replies.extend(self._declarations_for(envelope.sender, conn))
        return replies

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        start, count = self._reject_window
        now = time.monotonic()
        if now - start > REJECT_LOG_WINDOW:
            start, count = now, 0
        if count < REJECT_LOG_BURST:
            log.warning("rejected a frame (%s): %s", reason, detail)
        self._reject_window = (start, count + 1)

    def _send(self, conn: bytes, body: Message) -> None:
        assert self.router is not None
        # Failure is fine: a gone peer resyncs, a full one resends what is unacknowledged.
        _sent(self.router.send_multipart([conn, encode(body, sender=SENDER)], flags=zmq.NOBLOCK))

    def _commit(self) -> None:
        records, events = self.cluster.take_dirty()
        if records or events or self._feed_dirty:
            self.store.flush(records, events, self._feed_dirty, self._feed_log)
            self._feed_dirty = {}
            self._feed_log = []

    # --- feed ----------------------------------------------------------------------------

    def _publish(self, body: Message, topic: str) -> None:
        """Number, log and queue one publication; it goes out after the next commit."""
        seq = self.feed_seqs[topic] = self.feed_seqs.get(topic, 0) + 1
        self._feed_dirty[topic] = seq
        frame = encode(body, sender=SENDER, seq=seq)
        condition = body.CATEGORY is Category.CONDITION
        if condition:
            self.latest[topic] = (seq, frame)
        self._feed_log.append((topic, seq, condition, frame))
        self._outgoing.append((topic, frame))
        self.feed_stats["published"] += 1

    def _send_feed(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        for topic, frame in outgoing:
            for sub in self.hub.targets(topic):
                self._to_subscriber(sub, topic, frame)

    def _to_subscriber(self, sub: Subscriber, topic: str, frame: bytes) -> None:
        if self._to_tenant(sub.peer, topic.encode(), frame):
            sub.sent += 1
        elif sub.peer in self.hub.subscribers:
            sub.dropped += 1
            self.feed_stats["dropped"] += 1

    def _to_tenant(self, peer: bytes, topic: bytes, frame: bytes) -> bool:
        """Send without ever blocking; False if the peer's queue is full or it is gone."""
        assert self.tenants is not None
        exc = _sent(self.tenants.send_multipart([peer, topic, frame], flags=zmq.NOBLOCK))
        if exc is None:
            return True
        if isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EHOSTUNREACH:
            self.hub.drop([peer])  # disconnected: it renews when it comes back
            self.feed_stats["gone"] += 1
        return False

    def _agree(self, now: float) -> None:
        """Reports and acknowledgements from the job's own hosts in; arms and resolves
        out, each stored before it is sent (so a restart resends or cancels it)."""
        messages, self.cluster.tuning = self.cluster.tuning, []
        for host_id, body in messages:
            if host_id not in self._hosts_of(body.job):
                self.feed_stats["foreign_tuning_messages"] += 1
                continue
            if isinstance(body, TuningReport):
                if not self.agreement.report(host_id, body, now):
                    log.warning("host %s: tuning report for job %r refused (wish %r at "
                                "severity %d is no choice a declaration gives)", host_id,
                                body.job, body.want, body.severity)
            else:
                self.agreement.ack(host_id, body, now)
        hellos, self.cluster.hellos = self.cluster.hellos, []
        for host_id in hellos:
            self.agreement.reconnected(host_id)
        outgoing = self.agreement.step(now)
        dirty, gone = self.agreement.take_dirty()
        if dirty or gone:
            self.store.save_tuning({**{job: self.agreement.snapshot(job) for job in dirty},
                                    **dict.fromkeys(gone)})
        # Sent after this batch's replies: a host saying hello gets the declarations
        # of its jobs before any arm or outcome for them.
        self._tuning_out += outgoing
        for job in sorted(self.redactor.placements):
            choice, status = self.agreement.health(job, now)
            if self.redactor.tuning(job, choice, status):
                self.cluster.changed = True
                if status is not TuningStatus.STEADY:
                    log.warning("job %s: tuning %s: %s", job, status.value,
                                self.agreement.status(job, now).get("diverged")
                                or "ranks wait at a switching point")

    def _send_tuning(self) -> None:
        outgoing, self._tuning_out = self._tuning_out, []
        for host_id, body in outgoing:
            log.info("job %s: %s decision %d to host %s", body.job, body.KIND,  # type: ignore[attr-defined]
                     body.decision, host_id)  # type: ignore[attr-defined]
            conn = self.cluster.conn_of.get(host_id)
            if conn is not None:
                self._send(conn, body)

    def _publish_changes(self) -> None:
        """Feed the redactor what changed; stage whatever it lets out now."""
        now = time.monotonic()
        self._agree(now)
        advisories, self.cluster.advisories = self.cluster.advisories, []
        for host_id, advisory in advisories:
            declared = self.declarations.get(advisory.job)
            refused = self.redactor.advisory(
                host_id, advisory, now, time.time(),
                max_pause=declared[1].max_validation_pause if declared else None)
            if refused is not None:
                # Acknowledged to the host (it was delivered) but not passed on: a host
                # speaking for a job it does not run, or beyond what the job allows.
                self.cluster.counters[f"job_message_{refused}"] += 1
                log.warning("host %s: %s for job %r not passed on (%s)", host_id,
                            advisory.KIND, advisory.job, refused.replace("_", " "))
        if self.cluster.changed:
            self.cluster.changed = False
            self.redactor.observe(self.cluster.views(), now)
        for publication in self.redactor.due(now):
            body = publication.body
            if isinstance(body, PoolCapacity):
                log.info("capacity %s: hosts up %s, down %s, gpus %s (%s)", publication.topic,
                         body.hosts_up, body.hosts_down, body.gpus_available, body.trend.value)
            self._publish(body, publication.topic)

    def _flush_publications(self) -> None:
        self._publish_changes()
        self._commit()
        self._send_tuning()
        self._send_feed()

    def _republish(self) -> None:
        """Resend every condition as it was (same sequence number): a safety net only."""
        for topic, (_, frame) in self.latest.items():
            for sub in self.hub.targets(topic):
                self._to_subscriber(sub, topic, frame)

    async def _feed_loop(self) -> None:
        assert self.tenants is not None
        while True:
            frames = await self.tenants.recv_multipart(copy=False)
            self._tenant_frame(frames)
            # A queued frame completes the await without yielding: let agents' frames,
            # acks and heartbeats have their turn between any two tenant requests.
            await asyncio.sleep(0)

    def _tenant_frame(self, frames: list[zmq.Frame]) -> None:
        self.feed_stats["requests"] += 1
        if len(frames) != 2:
            self.feed_stats["bad_request"] += 1
            return
        peer, data = frames[0].bytes, frames[1].bytes
        tenant = frames[1].get("User-Id") if self.zap is not None else ""
        try:
            envelope = decode(data, allowed=TENANT_KINDS, strict=True)
        except WireError as exc:
            self.feed_stats["bad_request"] += 1
            self._answer(peer, Reply(exc.seq, False, f"rejected: {exc}"[:1000]))
            return
        body = envelope.body
        if not self.hub.admit(tenant, time.monotonic()):
            # Over the tenant's request budget: dropped (a renewal comes again).
            self.feed_stats["throttled_requests"] += 1
            return
        if isinstance(body, Subscribe):
            self._subscribe(peer, tenant, body)
        elif isinstance(body, JobDeclaration):
            error = self._declare(tenant, body)
            self._answer(peer, Reply(envelope.seq, error is None, error or ""))

    def _answer(self, peer: bytes, body: Message) -> None:
        self._to_tenant(peer, b"", encode(body, sender=SENDER))

    def _subscribe(self, peer: bytes, tenant: str, request: Subscribe) -> None:
        new = peer not in self.hub.subscribers
        result = self.hub.subscribe(peer, tenant, request, time.monotonic(), self.feed_seqs,
                                    epoch=self.store.feed_epoch)
        for refusal in result.reply.refused:
            self.feed_stats["refused_subscriptions"] += 1
            log.warning("refused tenant %r a subscription to %r: %s", tenant or "(no key)",
                        refusal.topic, refusal.reason)
        if new:
            self.feed_stats["subscriptions"] += 1
        self._answer(peer, result.reply)
        sub = self.hub.subscribers.get(peer)
        if sub is None:
            return
        for topic in result.conditions:  # a late joiner gets the present at once
            latest = self.latest.get(topic)
            if latest is not None:
                self._to_subscriber(sub, topic, latest[1])
        # A resumed one gets what it missed, a queue's worth at a time: it asks
        # again for the rest, so a replay never overflows its own queue.
        chunk = min(self.cfg.feed.retention, max(1, self.cfg.feed.send_hwm // 2))
        now = time.monotonic()
        for topic, after in result.replay:
            newest = self.feed_seqs.get(topic, 0)
            retained_from = newest - self.cfg.feed.retention + 1
            wanted = min(chunk, newest - max(after, retained_from - 1))
            allowed = self.hub.replay_allowance(tenant, wanted, now) if wanted > 0 else 0
            if allowed < wanted:
                self.feed_stats["replays_throttled"] += 1  # the client asks again
            if allowed <= 0:
                continue
            self.feed_stats["replays"] += 1
            for _, frame in self.store.replay(topic, after, allowed, retained_from):
                self._to_subscriber(sub, topic, frame)
            self.feed_stats["replayed_messages"] += allowed

    async def _tick_loop(self) -> None:
        next_republish = time.monotonic() + self.cfg.feed.republish
        next_prune = time.monotonic() + FEED_PRUNE_INTERVAL
        while True:
            await asyncio.sleep(self.cfg.liveness.check_interval)
            now = time.monotonic()
            for host_id in self.cluster.tick(now):
                log.warning("host %s is down: %s", host_id, self.cluster.hosts[host_id].down_reason)
            self._publish_changes()  # also what the redactor held back until now
            self._commit()
            self._send_tuning()
            self._send_feed()
            for sub in self.hub.expire(now):
                self.feed_stats["lapsed"] += 1
                log.info("tenant %r's subscription lapsed (not renewed)", sub.tenant)
            if now >= next_republish:
                self._republish()
                next_republish = now + self.cfg.feed.republish
            if now >= next_prune:
                self.store.prune_events()
                self.store.prune_feed(self.cfg.feed.retention)
                next_prune = now + FEED_PRUNE_INTERVAL

    # --- declarations ----------------------------------------------------------------------

    def _declare(self, tenant: str, declaration: JobDeclaration) -> str | None:
        """Store and forward a tenant's declaration; the error for the tenant, if any."""
        placement = self.redactor.placements.get(declaration.job)
        if not tenant:
            error = "not authenticated: declarations need a tenant key"
        elif placement is None or placement.tenant != tenant:
            # The same answer for "not yours" and "no such job": no probing for job ids.
            error = f"no job {declaration.job!r} of yours is placed"
        elif declaration.group:
            error = "declaration.group: set by the provider's placement, not by a tenant"
        elif (current := self.declarations.get(declaration.job)) is not None and \
                declaration.revision < current[1].revision:
            # Agents ignore an older revision too: acknowledging it would say it applies.
            error = (f"revision {declaration.revision} is older than revision "
                     f"{current[1].revision} in force: ignored (declare a higher one)")
        else:
            error = None
        if error is not None:
            self.feed_stats["refused_declarations"] += 1
            log.warning("refused a declaration from %r: %s", tenant or "(no key)", error)
            return error
        if declaration.withdrawn:
            self._withdraw(declaration.job)
            return None
        self.declarations[declaration.job] = (tenant, declaration)
        self.store.save_declaration(tenant, declaration)
        self.feed_stats["declarations"] += 1
        self._forward(declaration)
        return None

    def _hosts_of(self, job: str) -> set[str]:
        placement = self.redactor.placements.get(job)
        return {m.host_id for m in placement.members} if placement else set()

    def _for_host(self, declaration: JobDeclaration) -> JobDeclaration:
        """What a host gets: the tenant's declaration plus the job's Unix group there."""
        placement = self.redactor.placements.get(declaration.job)
        group = placement.group if placement is not None else ""
        return dataclasses.replace(declaration, group=group)

    def _forward(self, declaration: JobDeclaration) -> None:
        body = self._for_host(declaration)
        for host_id in sorted(self._hosts_of(declaration.job)):
            conn = self.cluster.conn_of.get(host_id)
            if conn is not None:
                self._send(conn, body)

    def _withdraw(self, job: str) -> None:
        # Hosts step back to NCCL's own choices at agreed points, then forget the job.
        self.agreement.withdraw(job)
        if self.declarations.pop(job, None) is None:
            return
        self.store.delete_declaration(job)
        self._forward(JobDeclaration(job, withdrawn=True))

    def _declarations_for(self, host_id: str, conn: bytes) -> list[Any]:
        """A (re)connecting agent learns the declarations of the jobs it hosts (the
        agreement resends it any arm or resolve it has not acknowledged)."""
        replies: list[Any] = []
        for _, declaration in self.declarations.values():
            if host_id in self._hosts_of(declaration.job):
                replies.append(ClusterReply(conn, self._for_host(declaration)))
        return replies

    def reload(self) -> str | None:
        """SIGHUP or ``reload``: re-read the configuration; a bad file keeps the running one.

        What the loops read each time (liveness, feed timing and retention,
        redaction, tuning agreement, log level) applies at once; sockets, the
        database, keys and metrics keep their values until the next restart, and
        the log says which. Returns the error that refused the new file, if any.
        """
        self.notifier.reloading()
        try:
            new, _ = controller_config.load(self.cfg_path)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.notifier.notify("READY=1", f"STATUS=reload failed: {exc}")
            return str(exc)
        old = self.cfg
        later = [name for name, before, after in (
            ("controller.listen", old.controller.listen, new.controller.listen),
            ("controller.feed", old.controller.feed, new.controller.feed),
            ("controller.admin_socket", old.controller.admin_socket,
             new.controller.admin_socket),
            ("controller.admin_group", old.controller.admin_group, new.controller.admin_group),
            ("controller.database", old.controller.database, new.controller.database),
            ("feed.send_hwm", old.feed.send_hwm, new.feed.send_hwm),
            ("feed.socket_buffer", old.feed.socket_buffer, new.feed.socket_buffer),
            ("auth", old.auth, new.auth),
            ("metrics", old.metrics, new.metrics),
        ) if before != after]
        if later:
            log.warning("changes to %s take effect at the next restart", ", ".join(later))
        # Keep what needs a restart as it runs, so status shows what is in force.
        self.cfg = dataclasses.replace(
            new, controller=dataclasses.replace(
                old.controller, log_level=new.controller.log_level),
            feed=dataclasses.replace(new.feed, send_hwm=old.feed.send_hwm,
                                     socket_buffer=old.feed.socket_buffer),
            auth=old.auth, metrics=old.metrics)
        self.cluster.missed_heartbeats = new.liveness.missed_heartbeats
        self.hub.renew = new.feed.renew
        self.hub.configure(_budgets(new))
        if new.redaction != old.redaction:
            self.redactor.cfg = new.redaction
            self.cluster.changed = True  # recompute what tenants see under the new rules
        self.agreement.settings = new.tuning
        logging.getLogger().setLevel(new.controller.log_level.value.upper())
        self.notifier.notify("READY=1", f"STATUS={len(self.cluster.hosts)} known hosts")
        log.info("configuration reloaded from %s", self.cfg_path or "built-in defaults")
        return None

    def _cmd_reload(self, args: dict[str, Any]) -> dict[str, Any]:
        error = self.reload()
        if error is not None:
            raise CommandError(f"reload refused, running configuration kept: {error}")
        return {"config": str(self.cfg_path) if self.cfg_path else None}

    # --- admin commands ------------------------------------------------------------------

    def _commands(self) -> dict[str, Command]:
        return {
            "status": Command(self._cmd_status, "controller counters and endpoints"),
            "hosts": Command(self._cmd_hosts, "every known host and its last state"),
            "capacity": Command(self._cmd_capacity, "what tenants currently see"),
            "jobs": Command(self._cmd_jobs, "jobs' placements (from the scheduler)"),
            "place": Command(self._cmd_place, "record a job's placement: job, tenant, members",
                             changes=True),
            "unplace": Command(self._cmd_unplace, "forget a job's placement", changes=True),
            "events": Command(self._cmd_events, "recent host events"),
            "feed": Command(self._cmd_feed, "tenant subscribers: topics, sent, dropped"),
            "tenants": Command(self._cmd_tenants, "tenants: key, jobs, declarations, "
                               "subscribers"),
            "pools": Command(self._cmd_pools, "pools: hosts and GPUs (the provider's view)"),
            "reload": Command(self._cmd_reload, "re-read the configuration file", changes=True),
        }

    def _cmd_status(self, args: dict[str, Any]) -> dict[str, Any]:
        alive = sum(1 for h in self.cluster.hosts.values() if h.alive)
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_seconds": round(time.monotonic() - self.started_at, 3),
            "listen": self.cfg.controller.listen,
            "feed": self.cfg.controller.feed,
            "database": self.cfg.controller.database,
            "hosts": {"known": len(self.cluster.hosts), "alive": alive},
            "frames": self.frames,
            "rejected": dict(self.rejected),
            "protocol": dict(self.cluster.counters),
            "feed_stats": {**self.feed_stats, "topics": len(self.feed_seqs),
                           "subscribers": len(self.hub.subscribers)},
            "auth": self._auth_status(),
            "handshakes_failed": {name: sum(port.failed.values())
                                  for name, port in self.ports.items()},
            "ports": {name: port.view() for name, port in self.ports.items()},
            "descriptors": descriptors(),
            "admin_socket": asdict(self.admin.stats),
        }

    def _auth_status(self) -> dict[str, Any]:
        if self.zap is None:
            return {"mode": "none"}
        return {
            "mode": "curve",
            "keys_dir": self.cfg.auth.keys_dir,
            "agents_allowed": len(self.zap.lists[AGENTS].names()),
            "tenants_allowed": len(self.zap.lists[TENANTS].names()),
            "accepted": dict(self.zap.accepted),
            "refused": dict(self.zap.refused),
        }

    def _cmd_feed(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{
            "tenant": sub.tenant, "peer": sub.peer.hex(), "topics": list(sub.prefixes),
            "connected_seconds": round(now - sub.since, 1), "sent": sub.sent,
            "dropped": sub.dropped, "refused": sub.refused,
        } for sub in sorted(self.hub.subscribers.values(), key=lambda s: (s.tenant, s.peer))]

    def _cmd_tenants(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        names = set(self.zap.lists[TENANTS].names()) if self.zap is not None else set()
        jobs: dict[str, list[str]] = {}
        for placement in self.redactor.placements.values():
            jobs.setdefault(placement.tenant, []).append(placement.job)
            names.add(placement.tenant)
        rows = []
        for name in sorted(names):
            subs = [s for s in self.hub.subscribers.values() if s.tenant == name]
            rows.append({
                "tenant": name,
                "key": self.zap is None or name in self.zap.lists[TENANTS].names(),
                "jobs": sorted(jobs.get(name, [])),
                "declared": sorted(j for j, (t, _) in self.declarations.items() if t == name),
                "subscribers": len(subs),
                "dropped": sum(s.dropped for s in subs),
            })
        return rows

    def _cmd_pools(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pools: dict[tuple[str, str], dict[str, Any]] = {}
        for host in self.cluster.hosts.values():
            row = pools.setdefault((host.pool, host.gpu_class), {
                "pool": host.pool, "gpu_class": host.gpu_class, "hosts": 0, "alive": 0,
                "schedulable": 0, "gpus": 0, "gpus_healthy": 0, "gpus_in_use": 0})
            row["hosts"] += 1
            summary = host.summary
            if host.alive:
                row["alive"] += 1
                if summary is not None and summary.schedulable:
                    row["schedulable"] += 1
            row["gpus"] += host.gpus
            if host.alive and summary is not None:
                row["gpus_healthy"] += summary.gpus.healthy
                row["gpus_in_use"] += summary.gpus.in_use
        return [pools[k] for k in sorted(pools)]

    def _cmd_hosts(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        now = time.monotonic()
        rows = []
        for host in sorted(self.cluster.hosts.values(), key=lambda h: h.host_id):
            summary = host.summary
            rows.append({
                "host_id": host.host_id,
                "pool": host.pool,
                "gpu_class": host.gpu_class,
                "gpus": host.gpus,
                "alive": host.alive,
                "down_reason": host.down_reason,
                "health": summary.health.value if summary else None,
                "schedulable": summary.schedulable if summary else None,
                "last_seen_seconds": round(now - host.last_seen, 3),
                "last_seq": host.last_seq,
                "version": host.version,
            })
        return rows

    def _cmd_capacity(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"topic": p.topic, "tenant": p.tenant, "kind": p.body.KIND, **to_plain(p.body)}
                for p in self.redactor.current()]

    def _cmd_jobs(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**to_plain(p), "declared": job in self.declarations,
                 "tuning": self.agreement.status(job, time.monotonic())}
                for job, p in sorted(self.redactor.placements.items())]

    def _cmd_place(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            placement = from_plain(PlacementRequest, args, "place")
        except SchemaError as exc:
            raise CommandError(str(exc)) from None
        record = Placement(placement.job, placement.tenant,
                           tuple(Member(m.name, m.host) for m in placement.members),
                           placement.group)
        previous = self.redactor.placements.get(record.job)
        if previous is not None and previous.tenant != record.tenant:
            # A job id now belongs to someone else: the old owner's declaration is void.
            self._withdraw(record.job)
        self.store.save_placement(record)
        self.redactor.place(record)
        self.agreement.set_hosts(record.job, {m.host_id for m in record.members})
        self.cluster.changed = True
        self._flush_publications()
        declared = self.declarations.get(record.job)
        if declared is not None:
            self._forward(declared[1])  # hosts the job has moved to learn it now
        return {"job": record.job, "members": len(record.members)}

    def _cmd_unplace(self, args: dict[str, Any]) -> dict[str, Any]:
        job = args.get("job")
        if not isinstance(job, str) or job not in self.redactor.placements:
            raise CommandError("job must name a placed job")
        self._withdraw(job)
        self.store.delete_placement(job)
        self.redactor.remove_job(job)
        self.agreement.forget(job)
        self._agree(time.monotonic())  # its stored tuning state goes too
        return {"job": job}

    def _cmd_events(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        limit = args.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise CommandError("limit must be an integer from 1 to 10000")
        return self.store.recent_events(limit)
