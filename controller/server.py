"""The controller's daemon shell: sockets, batching, persistence, publication.

Agents talk to a ROUTER socket; every batch of frames is applied to the
sans-I/O :class:`Cluster`, committed to SQLite, and only then acknowledged.
What tenants may see comes from :class:`Redactor` (aggregation and
redaction, shared with the simulator) and goes out on an XPUB socket, which
also tells us when someone subscribes so that a late joiner gets the current
conditions at once.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from controller.cluster import Cluster
from controller.config import ControllerConfig
from controller.redaction import Member, Placement, Redactor
from controller.store import Store
from harmonaize import __version__
from harmonaize.messages import (
    AGENT_KINDS,
    MAX_FRAME,
    Message,
    PoolCapacity,
    WireError,
    decode,
    encode,
)
from harmonaize.opsocket import Command, CommandError, OperatorSocket
from harmonaize.schema import Ident, Len, SchemaError, from_plain, to_plain
from harmonaize.sdnotify import Notifier

log = logging.getLogger("harmonaize.controller")

SENDER = "controller"
#: Frames handled per batch before committing and acknowledging.
BATCH = 2000
#: Rejected frames logged per window; all of them are counted.
REJECT_LOG_BURST = 10
REJECT_LOG_WINDOW = 10.0
EVENT_PRUNE_INTERVAL = 3600.0


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


class ControllerServer:
    def __init__(self, cfg: ControllerConfig, cfg_path: Path | None = None) -> None:
        self.cfg = cfg
        self.cfg_path = cfg_path
        self.started_at = time.monotonic()
        self.notifier = Notifier()
        self.store = Store(cfg.controller.database)
        self.cluster = Cluster(missed_heartbeats=cfg.liveness.missed_heartbeats)
        self.cluster.restore(self.store.load_hosts(), time.monotonic())
        self.redactor = Redactor(cfg.redaction, random.Random())
        for placement in self.store.load_placements():
            self.redactor.place(placement)
        #: Sequence numbers are per topic, so a tenant's gaps say nothing about
        #: traffic on topics it cannot see.
        self.feed_seqs = self.store.load_feed_seqs()
        self._feed_dirty: dict[str, int] = {}
        self.frames = 0
        self.rejected: Counter[str] = Counter()
        self.feed_stats: Counter[str] = Counter()
        self._reject_window = (0.0, 0)
        self._ctx = zmq.asyncio.Context()
        self._stop = asyncio.Event()
        self.router: zmq.asyncio.Socket | None = None
        self.xpub: zmq.asyncio.Socket | None = None
        self.admin = OperatorSocket(
            cfg.controller.admin_socket,
            self._commands(),
            group=cfg.controller.admin_group,
            mode=0o660,
        )

    # --- lifecycle -----------------------------------------------------------------------

    def _bind(self) -> None:
        self.router = self._ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        # ZeroMQ drops a peer that sends a frame larger than this before we see it.
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME + 1024)
        self.router.bind(self.cfg.controller.listen)
        self.xpub = self._ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.LINGER, 0)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscription, not just the first
        self.xpub.setsockopt(zmq.SNDHWM, self.cfg.feed.send_hwm)
        self.xpub.setsockopt(zmq.MAXMSGSIZE, 4096)  # subscriptions are short
        self.xpub.bind(self.cfg.controller.feed)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self._bind()
        await self.admin.start()
        self._publish_changes()
        self.notifier.ready(f"{len(self.cluster.hosts)} known hosts")
        log.info(
            "controller ready: agents on %s, feed on %s, %d known hosts",
            self.cfg.controller.listen, self.cfg.controller.feed, len(self.cluster.hosts),
        )
        tasks = [
            asyncio.create_task(self._ingest_loop(), name="ingest"),
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
            for sock in (self.router, self.xpub):
                if sock is not None:
                    sock.close()
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
                    frames = self.router.recv_multipart(flags=zmq.NOBLOCK).result()
                except zmq.Again:
                    break
                replies.extend(self._frame(frames, now))
            self._commit()
            for reply in replies:
                self._send(reply.conn, reply.body)
            self._publish_changes()

    def _frame(self, frames: list[bytes], now: float) -> list[Any]:
        self.frames += 1
        if len(frames) != 2:
            self._reject("framing", f"{len(frames) - 1} frames where one was expected")
            return []
        conn, data = frames
        try:
            envelope = decode(data, allowed=AGENT_KINDS)
        except WireError as exc:
            self._reject("invalid", str(exc))
            return []
        return self.cluster.receive(conn, envelope, now)

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
        with contextlib.suppress(zmq.ZMQError):  # the peer may be gone: it will resync
            self.router.send_multipart([conn, encode(body, sender=SENDER)], flags=zmq.NOBLOCK)

    def _commit(self) -> None:
        records, events = self.cluster.take_dirty()
        if records or events or self._feed_dirty:
            self.store.flush(records, events, self._feed_dirty)
            self._feed_dirty = {}

    # --- feed ----------------------------------------------------------------------------

    def _publish(self, body: Message, topic: str) -> None:
        assert self.xpub is not None
        seq = self.feed_seqs[topic] = self.feed_seqs.get(topic, 0) + 1
        self._feed_dirty[topic] = seq
        frame = encode(body, sender=SENDER, seq=seq)
        with contextlib.suppress(zmq.Again):  # XPUB drops for slow subscribers, never blocks
            self.xpub.send_multipart([topic.encode(), frame], flags=zmq.NOBLOCK)
        self.feed_stats["published"] += 1

    def _publish_changes(self) -> None:
        """Feed the redactor what changed; publish whatever it lets out now."""
        now = time.monotonic()
        advisories, self.cluster.advisories = self.cluster.advisories, []
        for advisory in advisories:
            self.redactor.advisory(advisory, now)
        if self.cluster.changed:
            self.cluster.changed = False
            self.redactor.observe(self.cluster.views(), now)
        publications = self.redactor.due(now)
        for publication in publications:
            body = publication.body
            if isinstance(body, PoolCapacity):
                log.info("capacity %s: hosts up %s, down %s, gpus %s (%s)", publication.topic,
                         body.hosts_up, body.hosts_down, body.gpus_available, body.trend.value)
            self._publish(body, publication.topic)
        if publications:
            self._commit()  # feed sequence numbers must not go back after a restart

    def _republish(self, prefix: str = "") -> None:
        for publication in self.redactor.current(prefix):
            self._publish(publication.body, publication.topic)

    async def _feed_loop(self) -> None:
        assert self.xpub is not None
        while True:
            frames = await self.xpub.recv_multipart()
            message = frames[0] if frames else b""
            if len(frames) != 1 or not message or message[0] not in (0, 1):
                self.feed_stats["bad_subscription"] += 1
                continue
            try:
                topic = message[1:].decode()
            except UnicodeDecodeError:
                self.feed_stats["bad_subscription"] += 1
                continue
            if message[0] == 1:
                self.feed_stats["subscriptions"] += 1
                self._republish(topic)  # a late joiner gets current conditions at once
            else:
                self.feed_stats["unsubscriptions"] += 1

    async def _tick_loop(self) -> None:
        next_republish = time.monotonic() + self.cfg.feed.republish
        next_prune = time.monotonic() + EVENT_PRUNE_INTERVAL
        while True:
            await asyncio.sleep(self.cfg.liveness.check_interval)
            now = time.monotonic()
            for host_id in self.cluster.tick(now):
                log.warning("host %s is down: %s", host_id, self.cluster.hosts[host_id].down_reason)
            self._commit()
            self._publish_changes()  # also what the redactor held back until now
            if now >= next_republish:
                self._republish()
                next_republish = now + self.cfg.feed.republish
            if now >= next_prune:
                self.store.prune_events()
                next_prune = now + EVENT_PRUNE_INTERVAL

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
            "feed_stats": {**self.feed_stats, "topics": len(self.feed_seqs)},
            "admin_socket": asdict(self.admin.stats),
        }

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
        return [to_plain(p) for _, p in sorted(self.redactor.placements.items())]

    def _cmd_place(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            placement = from_plain(PlacementRequest, args, "place")
        except SchemaError as exc:
            raise CommandError(str(exc)) from None
        record = Placement(placement.job, placement.tenant,
                           tuple(Member(m.name, m.host) for m in placement.members))
        self.store.save_placement(record)
        self.redactor.place(record)
        self.cluster.changed = True
        self._publish_changes()
        return {"job": record.job, "members": len(record.members)}

    def _cmd_unplace(self, args: dict[str, Any]) -> dict[str, Any]:
        job = args.get("job")
        if not isinstance(job, str) or job not in self.redactor.placements:
            raise CommandError("job must name a placed job")
        self.store.delete_placement(job)
        self.redactor.remove_job(job)
        return {"job": job}

    def _cmd_events(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        limit = args.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise CommandError("limit must be an integer from 1 to 10000")
        return self.store.recent_events(limit)
