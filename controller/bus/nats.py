"""The NATS JetStream side of cluster mode: connection, streams, buckets, leases.

What the bus holds (docs/scaling.md says why):

* ``HZ_AGENTS`` (subjects ``hz.agents.<host>``): every frame an agent sent that the
  controller must apply, stored by whichever replica the agent is connected to, before
  the agent is acknowledged. One subject per host, each store fenced on the subject's
  last position, so two replicas never both speak for one host.
* ``HZ_STATE`` (``hz.state.commit``): the leader's Commits, fenced the same way: a
  leader that lost its lease cannot write another (its next commit fails), so the log
  has one history. Snapshots of the state it folds to are in the object store
  ``hz-snapshots``.
* ``HZ_FEED`` (``hz.feed``): every numbered publication, in the order the leader made
  them; every replica serves its tenants from it.
* Key-value buckets: ``hz-leases`` (the leader's lease, and each replica's presence,
  with the lease as their time to live) and ``hz-cluster`` (the feed's epoch, tokens).
* Plain subjects, not stored: ``hz.beats`` (replicas tell the leader which hosts are
  alive), ``hz.to-agent.<host>`` (the leader's messages for a host, forwarded by the
  replica it is connected to), ``hz.leader.*`` (requests for the leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats
from nats.js import api
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)

from controller.bus.ingest import HostLog

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

    from controller.config import ClusterSection

log = logging.getLogger("harmonaize.controller.bus")

AGENTS, STATE, FEED = "HZ_AGENTS", "HZ_STATE", "HZ_FEED"
COMMIT_SUBJECT = "hz.state.commit"
FEED_SUBJECT = "hz.feed"
BEATS = "hz.beats"
LEADER_REQUEST = "hz.leader.request"
LEADER_ADMIN = "hz.leader.admin"
LEASES, CLUSTER, TOKENS, SNAPSHOTS = "hz-leases", "hz-cluster", "hz-tokens", "hz-snapshots"
LEADER_KEY = "leader"
#: JetStream's error code for a fenced store whose subject moved on.
WRONG_LAST_SEQUENCE = 10071
#: How long the streams remember a message id (a resend within it is stored once).
DUPLICATE_WINDOW = 120.0


def agent_subject(host: str) -> str:
    return f"hz.agents.{host}"


def to_agent_subject(host: str) -> str:
    return f"hz.to-agent.{host}"


def stream_seq(msg: Msg) -> int:
    """A delivered message's stream position, read from its reply subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<position>...``) without the client's
    full metadata (timestamps, a dataclass), which cost more than the leader's
    applying of a repeated summary; the client's parse for any other form."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5])
    return msg.metadata.sequence.stream


class Fenced(Exception):
    """A fenced store found its subject moved on: someone else wrote since."""


@dataclass(frozen=True)
class Stored:
    seq: int


class Bus:
    def __init__(self, cfg: ClusterSection) -> None:
        self.cfg = cfg
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.leases: KeyValue | None = None
        self.cluster: KeyValue | None = None
        self.tokens: KeyValue | None = None
        #: Set while the connection is up (the shell's status shows it).
        self.connected = asyncio.Event()

    async def connect(self) -> None:
        options: dict[str, Any] = {
            "servers": list(self.cfg.servers), "name": f"harmonaize-{self.cfg.replica}",
            "max_reconnect_attempts": -1, "reconnect_time_wait": 0.2,
            "connect_timeout": 2, "ping_interval": 2, "max_outstanding_pings": 2,
            "allow_reconnect": True,
            "disconnected_cb": self._down, "reconnected_cb": self._up,
            "error_cb": self._error, "closed_cb": self._down,
        }
        if self.cfg.credentials:
            options["user_credentials"] = self.cfg.credentials
        if self.cfg.nkey:
            options["nkeys_seed"] = self.cfg.nkey
        self.nc = await nats.connect(**options)
        self.connected.set()
        self.js = self.nc.jetstream(timeout=5.0)
        await self.ensure()

    async def _down(self) -> None:
        self.connected.clear()
        log.warning("lost the NATS connection; reconnecting")

    async def _up(self) -> None:
        self.connected.set()
        log.info("NATS connection back (%s)", self.nc.connected_url.netloc if self.nc and
                 self.nc.connected_url else "?")

    async def _error(self, exc: Exception) -> None:
        log.warning("NATS: %s", exc)

    async def ensure(self) -> None:
        """The streams and buckets, made if missing (the first replica to start makes
        them; their settings are the configuration's)."""
        assert self.js is not None
        replicas, age = self.cfg.stream_replicas, self.cfg.retention
        for name, subjects, extra in (
            (AGENTS, ["hz.agents.>"], {"max_age": age}),
            (STATE, ["hz.state.>"], {}),
            (FEED, [FEED_SUBJECT], {"max_age": age}),
        ):
            config = api.StreamConfig(
                name=name, subjects=subjects, storage=api.StorageType.FILE,
                num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW,
                allow_direct=True, **extra)
            try:
                await self.js.add_stream(config)
            except BadRequestError:
                await self.js.update_stream(config)
        self.leases = await self._bucket(LEASES, ttl=self.cfg.lease)
        self.cluster = await self._bucket(CLUSTER)
        self.tokens = await self._bucket(TOKENS)
        with contextlib.suppress(BadRequestError):
            await self.js.create_object_store(SNAPSHOTS, config=api.ObjectStoreConfig(
                bucket=SNAPSHOTS, replicas=replicas, storage=api.StorageType.FILE))

    async def _bucket(self, name: str, ttl: float | None = None) -> KeyValue:
        assert self.js is not None
        try:
            return await self.js.key_value(name)
        except (NotFoundError, APIError):
            return await self.js.create_key_value(api.KeyValueConfig(
                bucket=name, history=1, ttl=ttl, replicas=self.cfg.stream_replicas,
                storage=api.StorageType.FILE))

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 2.0)
            with contextlib.suppress(Exception):
                await self.nc.close()

    # --- the feed's epoch ----------------------------------------------------------------

    async def epoch(self) -> int:
        """The cluster's feed epoch, drawn once by the first replica (below 2^53)."""
        assert self.cluster is not None
        with contextlib.suppress(KeyWrongLastSequenceError):  # another replica drew it
            await self.cluster.create("epoch", str(secrets.randbits(53) or 1).encode())
        entry = await self.cluster.get("epoch")
        return int(entry.value or b"0")

    # --- fenced stores -------------------------------------------------------------------

    async def store(self, subject: str, payload: bytes, last: int,
                    headers: dict[str, str] | None = None, msg_id: str | None = None) -> Stored:
        """Store on ``subject`` only if its last message is still at ``last`` (0: none);
        raises :class:`Fenced` if another writer stored since."""
        assert self.js is not None
        head = {"Nats-Expected-Last-Subject-Sequence": str(last), **(headers or {})}
        if msg_id:
            head["Nats-Msg-Id"] = msg_id
        try:
            ack = await self.js.publish(subject, payload, headers=head)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise Fenced(subject) from None
            raise
        return Stored(ack.seq)

    async def publish_feed(self, payload: bytes, msg_id: str) -> int:
        assert self.js is not None
        return (await self.js.publish(FEED_SUBJECT, payload,
                                      headers={"Nats-Msg-Id": msg_id})).seq

    async def agent_log(self, host: str) -> HostLog:
        """What the bus holds for a host (nothing: a host never stored)."""
        assert self.js is not None
        try:
            msg = await self.js.get_last_msg(AGENTS, agent_subject(host), direct=True)
        except NotFoundError:
            return HostLog()
        head = msg.headers or {}
        return HostLog(int(head.get("hz-epoch", 0)), int(head.get("hz-seq", 0)), msg.seq or 0)

    async def last_commit(self) -> int:
        """The stream position of the last commit (0: none)."""
        assert self.js is not None
        try:
            return (await self.js.get_last_msg(STATE, COMMIT_SUBJECT, direct=True)).seq or 0
        except NotFoundError:
            return 0

    async def commit_at(self, seq: int) -> bytes | None:
        """The commit stored at stream position ``seq`` (None: none there, or purged)."""
        assert self.js is not None
        try:
            msg = await self.js.get_msg(STATE, seq, direct=True)
        except NotFoundError:
            return None
        return msg.data if msg.subject == COMMIT_SUBJECT else None

    async def last_feed_entry(self) -> bytes | None:
        """The feed stream's last entry as stored (None: none yet)."""
        assert self.js is not None
        try:
            return (await self.js.get_last_msg(FEED, FEED_SUBJECT, direct=True)).data
        except NotFoundError:
            return None

    # --- reading a stream in order ---------------------------------------------------------

    async def read(self, stream: str, subject: str, after: int, *,
                   until: int | None = None, batch: int = 256, wait: float = 0.5
                   ) -> AsyncIterator[list[tuple[int, bytes, dict[str, str]]]]:
        """Every message of ``subject`` after stream position ``after``, in order, in
        batches of (position, payload, headers); with ``until``, up to that position (or
        what there is) and no further, else for ever. A consumer lost to a server's
        failure is made again from where reading was."""
        assert self.js is not None
        position = after
        while until is None or position < until:
            try:
                sub = await self.js.pull_subscribe(
                    subject, stream=stream, config=api.ConsumerConfig(
                        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=position + 1, ack_policy=api.AckPolicy.NONE,
                        inactive_threshold=30.0, mem_storage=True, num_replicas=1))
            except (APIError, TimeoutError, nats.errors.Error) as exc:
                self._closed_under_us()
                log.debug("reading %s from %d: %s; again", stream, position, exc)
                await asyncio.sleep(wait)
                continue
            try:
                while until is None or position < until:
                    try:
                        msgs = await sub.fetch(batch, timeout=wait)
                    except TimeoutError:
                        if until is not None:
                            return  # caught up with what there was
                        continue
                    out = []
                    for msg in msgs:
                        seq = stream_seq(msg)
                        if seq > position and (until is None or seq <= until):
                            position = seq
                            out.append((seq, msg.data, dict(msg.headers or {})))
                    if out:
                        yield out
            except (APIError, nats.errors.Error) as exc:
                self._closed_under_us()
                log.info("reading %s from %d: %s; making the consumer again", stream,
                         position, exc)
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    def _closed_under_us(self) -> None:
        """A closed connection ends the reading (it never comes back; a reconnecting one
        does). Its client answers a cancelled wait with "connection closed" instead of
        the cancellation, so a reader that tried again would never end."""
        if self.nc is not None and self.nc.is_closed:
            raise nats.errors.ConnectionClosedError

    async def head(self, stream: str) -> int:
        assert self.js is not None
        return (await self.js.stream_info(stream)).state.last_seq

    # --- leases --------------------------------------------------------------------------

    async def acquire(self, key: str, holder: str) -> int | None:
        """Take a lease nobody holds; its revision, or None if it is held."""
        assert self.leases is not None
        try:
            return await self.leases.create(key, holder.encode())
        except KeyWrongLastSequenceError:
            return None

    async def renew(self, key: str, holder: str, revision: int) -> int | None:
        """Renew a lease we hold; the new revision, or None if it is no longer ours."""
        assert self.leases is not None
        try:
            return await self.leases.update(key, holder.encode(), last=revision)
        except (KeyWrongLastSequenceError, NotFoundError):
            return None

    async def release(self, key: str, revision: int) -> None:
        assert self.leases is not None
        with contextlib.suppress(Exception):
            await self.leases.delete(key, last=revision)

    async def _lease_keys(self) -> list[str]:
        """The lease bucket's keys, from its stream's own list of subjects: one request.
        (nats-py's ``keys()`` is a watch that, on a loaded machine, can end before the
        first key reaches it and then says there are none: seen as a replica's status
        naming no leader, or no replicas, while both were plainly there.)"""
        assert self.js is not None
        prefix = f"$KV.{LEASES}."
        info = await self.js.stream_info(f"KV_{LEASES}", subjects_filter=f"{prefix}>")
        return [subject.removeprefix(prefix) for subject in info.state.subjects or {}]

    async def holders(self) -> tuple[dict[str, str], set[str]]:
        """Every lease and presence now (key -> holder), and the keys the bus did not
        answer for. A read answered late (a busy node) is tried again rather than shown as
        "nobody holds it"; the leader's lease is read by its name even if listing the
        bucket failed."""
        assert self.leases is not None
        out: dict[str, str] = {}
        unread: set[str] = set()
        keys: list[str] = []
        for attempt in range(3):
            try:
                keys = await self._lease_keys()
                break
            except Exception:  # a timeout, or a node changing leader
                if attempt < 2:
                    await asyncio.sleep(0.1)
        for key in {LEADER_KEY, *keys}:
            for attempt in range(3):
                try:
                    entry = await self.leases.get(key)
                except (KeyNotFoundError, KeyDeletedError):
                    break  # not held (the leader's lease between two holders)
                except Exception:  # as above
                    if attempt < 2:
                        await asyncio.sleep(0.1)
                    else:
                        unread.add(key)
                    continue
                if entry.value:
                    out[key] = entry.value.decode()
                break
        return out, unread
