"""A controller replica in cluster mode: the embedded controller's shell, on a bus.

Every replica is a door for agents and for tenants, and one of them (the lease's
holder) also leads (controller/bus/leader.py):

* **Agents** connect to any replica, with the same CurveZMQ keys. What an agent sends
  for the controller to apply is stored on the bus, one subject per host, before the
  agent is acknowledged (controller/bus/ingest.py decides, frame by frame); the leader
  applies it from there. Heartbeats stay here: the replica tells the leader, twice a
  second, which hosts were heard. What the leader has for a host reaches it through the
  replica it is connected to.
* **Tenants** connect to any replica, over ZeroMQ or the HTTP gateway. Each replica
  keeps the feed as the leader numbered it (from the bus's feed stream, in its own
  SQLite, a cache the bus can rebuild) and serves subscriptions, resumes and replays
  from it: the same numbers, positions and cursors at every replica. Requests that
  change state (declarations, answers to notices) go to the leader, and its answer
  comes back.
  Agents' frames are taken in controller/replicadoors.py.
* **Operators** use a replica's admin socket: what only the leader knows (hosts,
  capacity, jobs, placements, events, pools, privacy) is asked of the leader; the
  rest (status, feed, tokens, reload) is the replica's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgpack
import nats.errors
import nats.js.errors

from controller import views
from controller.bus import codec
from controller.bus.leader import Leader
from controller.bus.nats import (
    BEATS,
    FEED,
    FEED_SUBJECT,
    LEADER_ADMIN,
    LEADER_KEY,
    LEADER_REQUEST,
    Bus,
)
from controller.bus.requests import FORWARDED
from controller.bus.tokens import BusTokens
from controller.core import ControllerCore
from controller.gateway.shell import Refused
from controller.handshakes import watch as watch_handshakes
from controller.outputs import AnswerTenant, TenantPeer
from controller.replicadoors import AgentDoors, Door
from controller.server import ControllerServer
from controller.sockets import ZMQ_PEER, decoded
from harmonaize.messages import (
    TENANT_KINDS,
    Envelope,
    ErrorCode,
    Reply,
)
from harmonaize.opsocket import Command, CommandError
from harmonaize.schema import SchemaError, from_plain, to_plain

log = logging.getLogger("harmonaize.controller")

#: Seconds between a replica's word to the leader of which hosts it heard.
BEAT_INTERVAL = 0.5
#: Seconds a replica waits for its JetStream cluster to be usable at its start.
JOIN_TIMEOUT = 120.0
#: Seconds a request forwarded to the leader may take.
FORWARD_TIMEOUT = 5.0
#: Commands only the leader can answer (asked of it from any replica).
LEADER_COMMANDS = {
    "hosts": ("every known host and its last state", False),
    "capacity": ("what tenants currently see", False),
    "jobs": ("jobs' placements (from the scheduler)", False),
    "place": ("record a job's placement: job, tenant, members", True),
    "unplace": ("forget a job's placement", True),
    "events": ("recent host events", False),
    "tenants": ("tenants: jobs, declarations", False),
    "pools": ("pools: hosts and GPUs (the provider's view)", False),
    "privacy": ("the private feed's budget per pool: ε spent in 24 h, plan", False),
    "job-findings": ("jobs' hangs, stalls, stragglers and application XIDs, with hosts", False),
    "holds": ("tenants' capacity holds not yet started or ended", False),
    "holds-cancel": ("cancel a tenant's hold: tenant, request_id (charged to nobody)", True),
}


class ReplicaServer(AgentDoors, ControllerServer):
    DURABLE = False  # the feed here is a copy of the bus's

    def __init__(self, cfg: Any, cfg_path: Path | None = None, *,
                 initialise: bool = False) -> None:
        super().__init__(cfg, cfg_path, initialise=initialise)
        self.bus = Bus(cfg.cluster)
        self.leader: Leader | None = None
        self.doors: dict[str, Door] = {}
        self.ingest_stats: dict[str, int] = {"stored": 0, "fenced": 0, "failed": 0,
                                             "rejected": 0, "answered": 0, "beats": 0}
        self._heard: set[str] = set()
        self._forwarding: set[asyncio.Task[None]] = set()
        self._failure_logged = -math.inf
        self.feed_position = 0

    # --- lifecycle -----------------------------------------------------------------------

    async def _prepare(self) -> None:
        epoch = await self._join()
        if self.store.get_meta("bus_epoch") != epoch:
            # A cache of another cluster's feed (or none): begin it anew from the bus.
            with self.store.db:
                for table in ("feed_log", "feed_topics", "feed_streams"):
                    self.store.db.execute(f"DELETE FROM {table}")
                self.store.set_meta("bus_epoch", epoch)
                self.store.set_meta("bus_feed_seq", 0)
        restored = dataclasses.replace(self.store.restored(), feed_epoch=epoch)
        # Numbered by the leader (it may lag behind it), placed by the leader.
        self.core = ControllerCore(self.cfg, time.monotonic(), restored, follower=True)
        self.feed_position = int(self.store.get_meta("bus_feed_seq") or 0)
        assert self.bus.tokens is not None
        self.tokens = BusTokens(self.bus.tokens)
        self.tokens.start()
        self.leader = Leader(self.cfg, self.bus, epoch,
                             Path(f"{self.cfg.controller.database}.leader"))
        log.info("replica %s on the bus (%s), feed epoch %x", self.cfg.cluster.replica,
                 self.bus.nc.connected_url.netloc if self.bus.nc and
                 self.bus.nc.connected_url else "?", epoch)

    async def _join(self) -> int:
        """Connect, make or find the streams and buckets, read the feed's epoch: again
        while the JetStream cluster is still electing its leaders (it does at its start),
        for up to ``JOIN_TIMEOUT``; then one line saying what is wrong."""
        deadline = time.monotonic() + JOIN_TIMEOUT
        while True:
            try:
                if self.bus.nc is None or self.bus.nc.is_closed:
                    await self.bus.connect()
                else:
                    await self.bus.ensure()
                return await self.bus.epoch()
            except (OSError, nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}".strip()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"cluster.servers: no usable JetStream at "
                        f"{', '.join(self.cfg.cluster.servers)} within {JOIN_TIMEOUT:g} s "
                        f"({problem})") from None
                log.info("waiting for the JetStream cluster (%s)", problem)
                await asyncio.sleep(1.0)

    async def _finish(self) -> None:
        if isinstance(self.tokens, BusTokens):
            await self.tokens.stop()
        for door in self.doors.values():
            if door.task is not None:
                door.task.cancel()
        await self.bus.close()

    def _loops(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        assert self.leader is not None
        loops = super()._loops()
        for name, coro in loops:
            if name in ("ingest", "agent-port"):
                coro.close()  # agents are taken at this replica's door instead
        return [*(loop for loop in loops if loop[0] not in ("ingest", "agent-port")),
                ("ingest", self._door_loop()), ("edge", self._edge_loop()),
                ("leader", self.leader.run(self._stop)), ("beats", self._beat_loop()),
                ("presence", self._presence_loop())]

    # --- agents at this replica's door -----------------------------------------------------

    async def _door_loop(self) -> None:
        """Agents' frames while the bus is there. A replica cut off from its bus for a
        lease closes its door (agents see the connection drop and move to another
        replica) and opens it again when the bus is back."""
        while True:
            assert self.router is not None
            watcher = asyncio.get_running_loop().create_task(
                watch_handshakes(self.router, self.ports["agents"]))
            door = asyncio.get_running_loop().create_task(self._frames(self.router))
            away = asyncio.get_running_loop().create_task(self._while_the_bus_is_there())
            try:
                done, _ = await asyncio.wait([away, door, watcher],
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not away and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            finally:
                away.cancel()
                for task in (door, watcher):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            self.router.close()
            log.warning("replica %s: the bus has been away for %.1f s: agents' door closed "
                        "(they move to another replica)", self.cfg.cluster.replica,
                        self.cfg.cluster.lease)
            await self.bus.connected.wait()
            self.router = self._agent_socket()
            log.info("replica %s: the bus is back: agents' door open again",
                     self.cfg.cluster.replica)

    async def _while_the_bus_is_there(self) -> None:
        away_since: float | None = None
        while True:
            await asyncio.sleep(0.1)
            if self.bus.connected.is_set():
                away_since = None
            elif away_since is None:
                away_since = time.monotonic()
            elif time.monotonic() - away_since >= self.cfg.cluster.lease:
                return

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(BEAT_INTERVAL)
            if self._heard and self.bus.nc is not None and self.bus.connected.is_set():
                heard, self._heard = sorted(self._heard), set()
                with contextlib.suppress(Exception):
                    await self.bus.nc.publish(BEATS, msgpack.packb(heard))

    async def _presence_loop(self) -> None:
        key = f"replica.{self.cfg.cluster.replica}"
        revision: int | None = None
        while True:
            value = json.dumps({"listen": self.cfg.controller.listen,
                                "feed": self.cfg.controller.feed,
                                "gateway": self.cfg.gateway.listen,
                                "agents": len(self.doors)})
            with contextlib.suppress(Exception):
                if revision is not None:
                    revision = await self.bus.renew(key, value, revision)
                if revision is None:
                    revision = await self.bus.acquire(key, value)
            await asyncio.sleep(self.cfg.cluster.lease / 4)

    # --- the feed, as the leader numbered it ----------------------------------------------

    async def _edge_loop(self) -> None:
        async for batch in self.bus.read(FEED, FEED_SUBJECT, self.feed_position):
            entries = []
            for seq, data, _ in batch:
                try:
                    entries.append(codec.read_feed_entry(data))
                except codec.CodecError as exc:
                    log.warning("feed stream %d: %s", seq, exc)
                self.feed_position = seq
            self._execute(self.core.accept_feed(entries, time.monotonic()))
            self.store.set_meta("bus_feed_seq", self.feed_position)

    # --- tenants' requests go to the leader -----------------------------------------------

    async def _feed_loop(self) -> None:
        assert self.tenants is not None
        authenticated = self.zap is not None
        loop = asyncio.get_running_loop()
        while True:
            frames = await self.tenants.recv_multipart(copy=False)
            tenant = frames[1].get("User-Id") if authenticated and len(frames) >= 2 else ""
            if not self._admitted(tenant):
                # Over budget: dropped unread and unanswered, as the embedded core does.
                await asyncio.sleep(0)
                continue
            peer, message = decoded(frames, TENANT_KINDS, strict=True)
            if isinstance(message, Envelope) and message.kind in FORWARDED:
                task = loop.create_task(self._forward(ZMQ_PEER + peer, tenant, message))
                self._forwarding.add(task)  # held until done (the loop keeps weak refs)
                task.add_done_callback(self._forwarding.discard)
            else:
                self._execute(self.core.receive(
                    TenantPeer(ZMQ_PEER + peer, tenant, admitted=True), message,
                    time.monotonic()))
            await asyncio.sleep(0)

    async def _forward(self, peer: bytes, tenant: str, message: Envelope) -> None:
        reply = await self._ask_leader(tenant, message)  # admitted in _feed_loop
        self._execute([AnswerTenant(peer, reply)])

    def _admitted(self, tenant: str) -> bool:
        """Whether the tenant's request may go on to the leader: it spends the tenant's
        request budget here first, so a flood stays at this replica's door instead of
        filling the leader's queue, which agents' frames share (the leader spends the
        budget again: over all replicas a tenant gets one budget)."""
        assert self.core is not None
        return self.core.feed.admit(tenant, time.monotonic())

    async def ask(self, tenant: str, request: Envelope) -> Reply:
        """The leader's answer to a tenant's request ("unavailable" while there is none).
        The gateway spent the tenant's budget at the request's entry already."""
        return await self._ask_leader(tenant, request)

    async def _ask_leader(self, tenant: str, request: Envelope) -> Reply:
        payload = msgpack.packb({"tenant": tenant, "kind": request.kind, "seq": request.seq,
                                 "body": to_plain(request.body)})
        try:
            assert self.bus.nc is not None
            answer = await self.bus.nc.request(LEADER_REQUEST, payload,
                                               timeout=FORWARD_TIMEOUT)
            if answer.data:
                return from_plain(Reply, msgpack.unpackb(answer.data, raw=False))
        except (nats.errors.Error, TimeoutError, SchemaError, ValueError) as exc:
            log.info("request %d of %r not forwarded: %s", request.seq, tenant, exc)
        return Reply(request.seq, False, "no controller leader could take it now: retry",
                     ErrorCode.UNAVAILABLE.value)

    async def query(self, name: str, args: dict[str, Any]) -> Any:
        try:
            return await self._leader_command(name, args)
        except CommandError as exc:
            raise Refused(ErrorCode.UNAVAILABLE, str(exc)) from None

    async def _leader_command(self, name: str, args: dict[str, Any]) -> Any:
        assert self.bus.nc is not None
        try:
            answer = await self.bus.nc.request(
                LEADER_ADMIN, msgpack.packb({"command": name, "args": args},
                                            use_bin_type=True), timeout=FORWARD_TIMEOUT)
        except (nats.errors.Error, TimeoutError) as exc:
            raise CommandError(f"no leader answered ({type(exc).__name__}): the cluster "
                               "may be between leaders, or cut off from this replica") from None
        reply = msgpack.unpackb(answer.data, raw=False) if answer.data else {}
        if "error" in reply:
            raise CommandError(reply["error"])
        if "result" not in reply:
            raise CommandError("the leader stepped down before answering: try again")
        return reply["result"]

    # --- operators ------------------------------------------------------------------------

    def _commands(self) -> dict[str, Command]:
        commands = super()._commands()
        for name, (text, changes) in LEADER_COMMANDS.items():
            commands[name] = Command(self._asker(name), f"{text} (asked of the leader)",
                                     changes=changes, scheduler=name in ("place", "unplace"))
        commands["feed"] = Command(lambda _: views.feed(self.core, time.monotonic()),
                                   "tenant subscribers at this replica: topics, sent, dropped")
        commands["status"] = Command(self._cluster_status_command,
                                     "replica counters, endpoints, the cluster's leader and "
                                     "replicas")
        return commands

    def _asker(self, name: str) -> Any:
        async def ask(args: dict[str, Any]) -> Any:
            return await self._leader_command(name, args)
        return ask

    async def _cluster_status_command(self, args: dict[str, Any]) -> dict[str, Any]:
        status = self._cmd_status(args)
        status["cluster"] = {**self._cluster_status(), **await self.cluster_view()}
        return status

    def _cluster_status(self) -> dict[str, Any]:
        leader = self.leader
        return {
            "replica": self.cfg.cluster.replica,
            "bus": "connected" if self.bus.connected.is_set() else "reconnecting",
            "servers": list(self.cfg.cluster.servers),
            "leading": leader.view() if leader is not None and leader.leading else None,
            "feed_position": self.feed_position,
            "agents_here": sum(1 for d in self.doors.values() if d.conn is not None),
            "ingest": dict(self.ingest_stats),
        }

    async def cluster_view(self) -> dict[str, Any]:
        """Who leads, and which replicas are present (for ``status``)."""
        holders, unread = await self.bus.holders()
        return {"leader": holders.get(LEADER_KEY), "leader_unread": LEADER_KEY in unread,
                "replicas": {k.removeprefix("replica."): json.loads(v)
                             for k, v in holders.items() if k.startswith("replica.")}}
