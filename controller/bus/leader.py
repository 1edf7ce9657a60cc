"""The leader: the one replica that runs the controller's core on the bus.

Whichever replica holds the lease ``leader`` (a key with the lease's time to live,
renewed a few times per lease) is the leader. It rebuilds the core's state from the
newest snapshot and the commits after it, then applies, in the order the bus holds
them, what agents sent (from every replica's door), the replicas' word of which hosts
are alive, and tenants' and operators' requests. Each batch ends in the core's Commit,
which the leader stores on the bus fenced on the last commit it knows: a leader that
lost its lease (and was replaced, and the new one wrote) cannot store another, and
steps down without having sent anything that depended on it. Only after the commit is
stored does it publish the batch's numbered publications to the feed stream (every
replica serves its tenants from there), send hosts what the core has for them, and
answer requests. A new leader publishes again what the commits it read hold (a
publication the feed already has is stored once: its id is the same), so tenants see
each number once whichever leader numbered it.

Longer than 400 lines: one term of leading (taking over, the batches, the fenced
Commit, what goes out after it, stepping down) is kept in one place, so that "nothing
leaves before the Commit that covers it" can be checked by reading one file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import nats.errors
import nats.js.errors

from controller.bus import codec, requests, snapshots
from controller.bus.frames import FrameReader
from controller.bus.nats import (
    AGENTS,
    BEATS,
    COMMIT_SUBJECT,
    LEADER_ADMIN,
    LEADER_KEY,
    LEADER_REQUEST,
    STATE,
    Bus,
    Fenced,
    to_agent_subject,
)
from controller.bus.standby import Behind, Standby, Warm
from controller.core import ControllerCore
from controller.outputs import (
    AgentPeer,
    AnswerTenant,
    Commit,
    FeedEntry,
    Output,
    Prune,
    SendToAgent,
    TenantPeer,
)
from controller.publications import SENDER
from controller.store import Store
from harmonaize.messages import (
    Ack,
    ErrorCode,
    Message,
    Reply,
    Resync,
    WireError,
    encode,
)
from harmonaize.opsocket import CommandError
from harmonaize.schema import SchemaError, to_plain

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from controller.config import ControllerConfig

log = logging.getLogger("harmonaize.controller.leader")

#: The core's name for a host heard on the bus.
BUS_PEER = b"bus:"
#: Agents' frames applied under one Commit at most. A Commit costs a round trip to the
#: bus, a transaction on the mirror and a tick of the core whatever it covers, so a
#: backlog is taken in large batches; what waits for the batch to end (publications,
#: answers) waits a little longer. 2,048 summaries make a Commit of about 0.5 MB, well
#: under the bus's default message limit of 1 MB.
MAX_BATCH = 2048
#: Queue items (fetched batches of frames, beats, requests) taken into one batch at most.
MAX_ITEMS = 64
#: Seconds a leader stepping down waits for its tasks to end.
STOP_WAIT = 5.0


class StepDown(Exception):
    """The lease, or the log, is someone else's now."""


def peer_of(host: str) -> bytes:
    return BUS_PEER + host.encode()


def within(answer: bytes, limit: int, refusal: Callable[[str], bytes]) -> bytes:
    """An answer as it can cross the bus: one larger than the bus's message limit is
    replaced by ``refusal`` of why. Sent, the bus would refuse it, and the leader would
    take that for the bus failing and step down: one request would cost a takeover."""
    if limit <= 0 or len(answer) <= limit:
        return answer
    return refusal(f"the answer is {len(answer):,} bytes, over the bus's message limit "
                   f"of {limit:,}")


def fitted(command: str, answer: bytes, limit: int) -> bytes:
    """An operator's answer, within the bus's limit (``hosts`` of a region: about 150
    bytes a host, so past 6,000 hosts at the default 1 MB), or one line saying why not."""
    return within(answer, limit, lambda why: msgpack.packb({"error": (
        f"{command}: {why}; ask for less (harmonctl status gives the counts), or raise "
        "max_payload on the NATS servers")}, use_bin_type=True))


def tenant_answer(message: Message, limit: int) -> bytes:
    """A tenant's answer, within the bus's limit, or a refusal of the same request (by
    its number) that says only that the answer was too large (nothing of the bus's)."""
    return within(msgpack.packb(to_plain(message)), limit, lambda _: msgpack.packb(to_plain(
        Reply(getattr(message, "request", 0), False, "the answer is too large to send; "
              "ask for less", ErrorCode.UNAVAILABLE.value))))


def unpublished(again: list[FeedEntry], last: bytes | None) -> list[FeedEntry]:
    """Of publications read from the log's last commits (in the order their leaders
    published them), those after the feed's ``last`` entry. The feed holds every
    publication of every commit before the log's last (a leader publishes a commit's
    before it stores the next), so the last entry it holds is among ``again``, or none
    of ``again`` is stored. Publishing again what is there would store it twice once
    the bus's duplicate window has passed."""
    if last is None or not again:
        return again
    try:
        entry = codec.read_feed_entry(last)
    except codec.CodecError:
        return again
    for index in range(len(again) - 1, -1, -1):
        if (again[index].topic, again[index].seq) == (entry.topic, entry.seq):
            return again[index + 1:]
    return again


class Leader:
    def __init__(self, cfg: ControllerConfig, bus: Bus, epoch: int, mirror: Path, *,
                 max_batch: int = MAX_BATCH) -> None:
        self.cfg = cfg
        #: Agents' frames applied under one Commit at most (1: a Commit per frame).
        self.max_batch = max(1, max_batch)
        self.bus = bus
        self.epoch = epoch
        #: The leader's own copy of the state (SQLite), which snapshots are made of.
        self.mirror_path = mirror
        self.core: ControllerCore | None = None
        self.store: Store | None = None
        self.revision = 0
        self.commit_seq = 0
        self.agents_seq = 0
        self.terms = 0
        self.took_over_at: float | None = None
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        #: Agents' frames read but left for the next batch (the last one was full).
        self._carry: list[tuple[int, bytes, dict[str, str]]] = []
        #: Frames decoded once per batch, repeated bodies taken from the host's last one.
        self._frames = FrameReader()
        #: Frames applied, and Commits stored, by this leader (the benchmark's counters).
        self.applied = 0
        self.commits = 0
        #: The agents' stream position the last stored Commit covers.
        self.committed = 0
        self._pending: dict[bytes, Msg] = {}
        #: Answers that depend on nothing stored (malformed requests), sent after a batch.
        self._replies: list[tuple[Msg, Reply]] = []
        self._numbers = 0
        self._snapshot_at = 0.0
        #: The state kept as the log is written while not leading (None: off), so that
        #: a takeover reads only what came since (controller/bus/standby.py).
        self.standby = Standby(cfg, mirror) if cfg.cluster.warm_standby else None
        self._following: asyncio.Task[None] | None = None
        #: Whether the mirror on disk is one this process wrote on this bus (a standby
        #: may go on from it rather than from the newest snapshot).
        self._trusted = False
        #: How the last takeover began: "warm" (from the standby) or "cold".
        self.took_over = ""

    @property
    def leading(self) -> bool:
        return self.core is not None

    async def run(self, stop: asyncio.Event) -> None:
        """Contend for the lease for as long as the replica runs; lead while it is ours."""
        period = self.cfg.cluster.lease / 4
        try:
            while not stop.is_set():
                await self._contend(stop, period)
        finally:
            await self._stop_following()
            if self.standby is not None:
                self.standby.close()

    async def _contend(self, stop: asyncio.Event, period: float) -> None:
        """One try for the lease (following the log meanwhile); one term if it is ours."""
        if self.standby is not None and (self._following is None or self._following.done()):
            self._following = asyncio.create_task(
                self.standby.follow(self.bus, trusted=self._trusted))
        revision = None
        with contextlib.suppress(Exception):
            revision = await self.bus.acquire(LEADER_KEY, self.cfg.cluster.replica)
        if revision is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
            return
        self.revision = revision
        self._trusted = True  # whatever this term writes to the mirror, the log holds
        try:
            await self._lead(stop)
        except StepDown as exc:
            log.warning("no longer the leader: %s", exc)
        except (OSError, TimeoutError, nats.errors.Error, nats.js.errors.Error,
                codec.CodecError) as exc:
            # The bus failed under us (a node gone, a timeout): whether the last store
            # landed is unknown, so step down; whoever leads next (perhaps this replica
            # again) reads the log as it is.
            log.warning("stepping down: the bus failed: %s: %s", type(exc).__name__, exc)
        finally:
            await self._end()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)

    async def _stop_following(self) -> None:
        """The standby stopped between two commits (or at the end of a load it began)."""
        task, self._following = self._following, None
        if self.standby is not None:
            self.standby.halt()  # a follower that outlives its cancellation changes nothing
        if task is not None:
            task.cancel()
            # Waited for a while, not for ever (as the term's tasks below).
            done, _ = await asyncio.wait([task], timeout=STOP_WAIT)
            if not done:
                log.warning("the standby did not stop within %.0f s; left behind", STOP_WAIT)
            elif not task.cancelled():
                task.exception()  # retrieved; the follower logged it

    async def _end(self) -> None:
        if self.core is not None and self.revision:
            await self.bus.release(LEADER_KEY, self.revision)
        self.core = None
        for msg in self._pending.values():
            with contextlib.suppress(Exception):
                await msg.respond(b"")
        self._pending.clear()
        if self.store is not None:
            self.store.close()
            self.store = None

    # --- taking over ---------------------------------------------------------------------

    async def _restore(self) -> list[FeedEntry]:
        """The state as of the last commit: the newest snapshot, then every commit after
        it. Returns the publications of those commits (to publish again)."""
        await snapshots.fetch_newest(self.bus, self.mirror_path)
        self.store = Store(self.mirror_path, durable=False)
        self.commit_seq = int(self.store.get_meta("bus_commit_seq") or 0)
        self.agents_seq = int(self.store.get_meta("bus_agents_seq") or 0)
        self.committed = self.agents_seq
        last = await self.bus.last_commit()
        again: list[FeedEntry] = []
        async for batch in self.bus.read(STATE, COMMIT_SUBJECT, self.commit_seq, until=last):
            for seq, data, _ in batch:
                commit = codec.decode(data)
                # The positions with the writes, as the leader that stored it wrote them:
                # a snapshot taken before this term's own first Commit (an idle term)
                # says what it holds, not "nothing" (its successor would read the log
                # from the start, purged up to this snapshot).
                self.store.commit(commit.writes, meta={"bus_commit_seq": seq,
                                                       "bus_agents_seq": commit.agents_seq})
                self.commit_seq, self.agents_seq = seq, commit.agents_seq
                self.committed = self.agents_seq
                again += commit.writes.feed_log
                await asyncio.sleep(0)  # the lease's renewal between commits
        if self.commit_seq < last:
            raise StepDown(f"the log holds commits to {last}, read to {self.commit_seq}")
        return again

    async def _warm(self) -> Warm | None:
        """The standby's state, brought to the log's last commit, for this term (None:
        there is none, or it cannot be brought there: a cold restore then)."""
        standby = self.standby
        if standby is None or not standby.ready:
            return None
        last = await self.bus.last_commit()
        try:
            await standby.catch_up(self.bus, last, keep=True)
        except Behind as exc:
            log.warning("taking over cold: %s", exc)
            return None
        if standby.commit_seq != last:  # short of it, or ahead (the bus begun anew)
            log.warning("taking over cold: the standby read to commit %d of %d",
                        standby.commit_seq, last)
            return None
        warm = standby.hand_over()
        self.store, self.commit_seq = warm.store, warm.commit_seq
        self.agents_seq = self.committed = warm.agents_seq
        return warm

    def _build(self, warm: Warm | None = None) -> ControllerCore:
        """The core from the mirror as restored (its own connection: this runs in a
        thread, while the leader's connection waits); with ``warm``, its hosts and
        their counts as the standby kept them, the rest from the mirror."""
        reader = Store(self.mirror_path, durable=False)
        try:
            restored = dataclasses.replace(
                reader.restored(None if warm is None else warm.hosts.values()),
                feed_epoch=self.epoch)
        finally:
            reader.close()
        core = ControllerCore(self.cfg, time.monotonic(), restored, rng=random.Random(),
                              wall=time.time(), tally=None if warm is None else warm.tally)
        for host in list(core.cluster.hosts):
            core.cluster.bind(peer_of(host), host)
        return core

    async def _log_age(self) -> float:
        """Seconds since the log's oldest commit was stored (the newest snapshot's own,
        which the purge keeps); 0 for an empty log, or one the bus would not tell."""
        assert self.bus.js is not None
        with contextlib.suppress(Exception):
            first = (await self.bus.js.stream_info(STATE)).state.first_seq
            oldest = await self.bus.js.get_msg(STATE, first)
            if oldest.time is not None:
                return max(0.0, time.time() - oldest.time.timestamp())
        return 0.0

    async def _lead(self, stop: asyncio.Event) -> None:
        # The lease is renewed from the start, the restore included: a restore longer
        # than the lease would otherwise hand leadership on mid-takeover (and the next
        # leader would restore as long again).
        renew = asyncio.create_task(self._renew())
        stopper = asyncio.create_task(stop.wait())
        taking = asyncio.create_task(self.take_over())
        tasks = [renew]
        everything: list[asyncio.Task[Any]] = [taking, renew, stopper]
        subs = []
        try:
            await asyncio.wait([taking, renew, stopper], return_when=asyncio.FIRST_COMPLETED)
            if not taking.done():  # the lease was lost, or the replica stops, first
                if renew.done() and renew.exception() is not None:
                    raise renew.exception()  # type: ignore[misc]
                return
            taking.result()
            assert self.bus.nc is not None
            subs = [await self.bus.nc.subscribe(BEATS, cb=self._beats),
                    await self.bus.nc.subscribe(LEADER_REQUEST, cb=self._request),
                    await self.bus.nc.subscribe(LEADER_ADMIN, cb=self._admin)]
            tasks += [asyncio.create_task(self._read_agents()),
                      asyncio.create_task(self._timer())]
            work = asyncio.create_task(self._work())
            everything += [*tasks[1:], work]
            done, _ = await asyncio.wait([stopper, work, *tasks],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in everything:
                task.cancel()
            # Waited for a while, not for ever: the NATS client can keep a fetch's wait
            # from its cancellation (seen in leader-apply: a leader that never finished
            # stepping down, so never released, never led again). A task left behind
            # reads into this term's queue, which no later term uses, and then stops.
            done, left = await asyncio.wait(everything, timeout=STOP_WAIT)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: the reason to step down was raised above
            if left:
                log.warning("stepping down: %d task(s) did not end within %.0f s; left "
                            "behind", len(left), STOP_WAIT)
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def take_over(self) -> None:
        """Take over: the state as the log has it, its publications published again."""
        began = time.monotonic()
        # Stopped here, with the lease renewed meanwhile (a standby loading its state
        # finishes that first: seconds at 100,000 hosts).
        await self._stop_following()
        self._queue = asyncio.Queue()
        self._carry = []
        self._frames = FrameReader()
        warm = await self._warm()
        if warm is None:
            if self.standby is not None:
                self.standby.close()  # its mirror is begun anew below
            again = await self._restore()
        else:
            again = warm.again
        self.took_over = "cold" if warm is None else "warm"
        # Off the event loop, where the lease is renewed: at 100,000 hosts loading the
        # state and building the core take about as long as the lease (cold).
        core = await asyncio.to_thread(self._build, warm)
        for entry in unpublished(again, await self.bus.last_feed_entry()):
            await self._publish(entry)
        self.core = core
        self.terms += 1
        self.took_over_at = time.time()
        # The interval counts from the oldest commit a successor would read, not from
        # this takeover: leaders that each live shorter than it would otherwise never
        # snapshot, and each successor would read (and publish again) a longer log, its
        # oldest publications past the bus's duplicate window, so stored again.
        self._snapshot_at = time.monotonic() - await self._log_age()
        log.info("leading: state to commit %d, agents' stream to %d, %d hosts (%s, "
                 "%.2f s)", self.commit_seq, self.agents_seq, len(core.cluster.hosts),
                 self.took_over, time.monotonic() - began)

    # --- inputs --------------------------------------------------------------------------

    async def _read_agents(self) -> None:
        queue = self._queue  # this term's: a reader left behind must not feed the next
        # Fetched as much at a time as a batch takes: a backlog is read in few round trips.
        async for batch in self.bus.read(AGENTS, "hz.agents.>", self.agents_seq,
                                         batch=max(256, min(self.max_batch, 4096))):
            if queue is not self._queue:
                return
            await queue.put(("agents", batch))

    async def _beats(self, msg: Msg) -> None:
        with contextlib.suppress(ValueError, TypeError):
            hosts = msgpack.unpackb(msg.data, raw=False)
            if isinstance(hosts, list):
                self._queue.put_nowait(("beats", [h for h in hosts if isinstance(h, str)]))

    async def _request(self, msg: Msg) -> None:  # a tenant's, forwarded by a replica
        self._queue.put_nowait(("request", msg))

    async def _admin(self, msg: Msg) -> None:  # an operator's, forwarded by a replica
        self._queue.put_nowait(("admin", msg))

    async def _renew(self) -> None:
        """Renew the lease a few times per lease; a leader that could not renew it for a
        whole lease (it may have expired, and another leader begun) steps down at once,
        without waiting for the bus to say so."""
        lease = self.cfg.cluster.lease
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(lease / 4)
            try:
                revision = await asyncio.wait_for(self.bus.renew(
                    LEADER_KEY, self.cfg.cluster.replica, self.revision), lease / 2)
            except (TimeoutError, OSError, nats.errors.Error, nats.js.errors.Error):
                if time.monotonic() - renewed >= lease:
                    raise StepDown("the lease was not renewed for a whole lease") from None
                continue
            if revision is None:
                raise StepDown("the lease is someone else's")
            self.revision, renewed = revision, time.monotonic()

    async def _timer(self) -> None:
        while True:
            core = self.core
            deadline = core.next_deadline() if core is not None else None
            delay = 0.5 if deadline is None else deadline - time.monotonic()
            await asyncio.sleep(min(0.5, max(0.01, delay)))
            self._queue.put_nowait(("tick", None))

    # --- the work ------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            await self.apply(await self._batch())

    async def _batch(self) -> list[tuple[str, Any]]:
        """The next batch: what waits in the queue, in its order, with at most
        ``max_batch`` agents' frames (the rest is carried to the next batch, ahead of
        anything queued after it)."""
        items: list[tuple[str, Any]] = []
        room = self.max_batch
        first = None if self._carry else await self._queue.get()
        while len(items) < MAX_ITEMS:
            if first is not None:
                (kind, item), first = first, None
            elif self._carry:
                kind, item = "agents", self._carry
                self._carry = []
            elif not self._queue.empty():
                kind, item = self._queue.get_nowait()
            else:
                break
            if kind == "agents":
                if room == 0:
                    self._carry = item
                    break
                if len(item) > room:
                    item, self._carry = item[:room], item[room:]
                room -= len(item)
            items.append((kind, item))
        return items

    async def apply(self, items: list[tuple[str, Any]]) -> None:
        """One batch: every item applied to the core, one tick, then its outputs in order:
        the batch's Commit stored (fenced) before anything that depends on it goes out.
        Raises :class:`StepDown` when the Commit is refused: then nothing of the batch
        was stored, published, sent or answered (the next leader applies its frames
        again from the agents' stream, from the last stored Commit's position)."""
        core = self.core
        assert core is not None
        now, wall = time.monotonic(), time.time()
        outputs: list[Output] = []
        for kind, item in items:
            if kind == "agents":
                outputs += self._agents(core, item, now)
            elif kind == "beats":
                # A heartbeat of each host, as a frame from it would be applied, in one
                # pass: a beat names every host a replica serves, twice a second.
                core.heard(item, now)
            elif kind == "request":
                outputs += self._tenant_request(core, item, now)
            elif kind == "admin":
                outputs += await self._admin_request(core, item, now, wall)
        outputs += core.tick(now, wall)
        await self._execute(outputs)
        replies, self._replies = self._replies, []
        for msg, reply in replies:
            await msg.respond(msgpack.packb(to_plain(reply)))
        if now - self._snapshot_at >= self.cfg.cluster.snapshot_interval:
            self._snapshot_at = now
            await self._snapshot()

    def _agents(self, core: ControllerCore, batch: list[tuple[int, bytes, dict[str, str]]],
                now: float) -> list[Output]:
        out: list[Output] = []
        frames = self._frames
        for seq, data, head in batch:
            self.agents_seq = seq
            host = head.get("hz-host", "")
            try:
                env = frames.read(host, data)
            except WireError as exc:  # a replica stored only what it could decode
                log.warning("agents' stream %d (%s): not a frame: %s", seq, host, exc)
                continue
            out += core.receive(AgentPeer(peer_of(host), host), env, now)
        self.applied += len(batch)
        return out

    def _tenant_request(self, core: ControllerCore, msg: Msg, now: float) -> list[Output]:
        """A tenant's request a replica forwarded: {tenant, kind, seq, body}."""
        try:
            tenant, env = requests.forwarded(msg.data)
        except (ValueError, TypeError, KeyError, SchemaError) as exc:
            reply = Reply(0, False, f"rejected: {exc}"[:1000], ErrorCode.INVALID.value)
            self._replies.append((msg, reply))
            return []
        self._numbers += 1
        peer = b"req:" + str(self._numbers).encode()
        self._pending[peer] = msg
        return core.receive(TenantPeer(peer, tenant), env, now)

    async def _admin_request(self, core: ControllerCore, msg: Msg, now: float,
                             wall: float) -> list[Output]:
        """An operator's command a replica forwarded: {command, args}."""
        outputs: list[Output] = []
        name = "?"
        try:
            request = msgpack.unpackb(msg.data, raw=False)
            name, args = str(request["command"]), dict(request.get("args") or {})
            assert self.store is not None
            result, outputs = (self.view(), []) if name == "leader" else requests.command(
                core, self.store, name, args, now=now, wall=wall)
            answer = {"result": result}
        except CommandError as exc:
            answer = {"error": str(exc)}
        except (ValueError, TypeError, KeyError) as exc:
            answer = {"error": f"malformed request: {exc}"}
        # Answered once what it changed is committed (the outputs run first).
        await self._execute(outputs)
        assert self.bus.nc is not None
        await msg.respond(fitted(name, msgpack.packb(answer, use_bin_type=True),
                                 self.bus.nc.max_payload))
        return []

    # --- outputs -------------------------------------------------------------------------

    async def _execute(self, outputs: list[Output]) -> None:
        """In order: a Commit is stored (fenced) before anything after it goes out."""
        assert self.bus.nc is not None
        for out in outputs:
            if isinstance(out, Commit):
                await self._commit(out)
            elif isinstance(out, SendToAgent):
                if isinstance(out.message, Ack | Resync):
                    continue  # the replica at the agent's door answered those
                host = out.conn.removeprefix(BUS_PEER).decode()
                await self.bus.nc.publish(to_agent_subject(host),
                                          encode(out.message, sender=SENDER))
            elif isinstance(out, AnswerTenant):
                msg = self._pending.pop(out.peer, None)
                if msg is not None:
                    await msg.respond(tenant_answer(out.message, self.bus.nc.max_payload))
            elif isinstance(out, Prune) and self.store is not None:
                self.store.prune_events()
                self.store.prune_feed(out.retention)

    async def _commit(self, commit: Commit) -> None:
        payload = codec.encode(codec.Commit(commit.writes, self.agents_seq))
        try:
            stored = await self.bus.store(COMMIT_SUBJECT, payload, self.commit_seq)
        except Fenced:
            raise StepDown("another leader stored a commit") from None
        self.commit_seq = stored.seq
        self.commits += 1
        self.committed = self.agents_seq
        assert self.store is not None
        # The positions in the same transaction as the writes: a mirror never says it
        # holds a commit it holds only part of.
        self.store.commit(commit.writes, meta={"bus_commit_seq": self.commit_seq,
                                               "bus_agents_seq": self.agents_seq})
        for entry in commit.writes.feed_log:
            await self._publish(entry)

    async def _publish(self, entry: FeedEntry) -> None:
        await self.bus.publish_feed(codec.feed_entry(entry),
                                    f"{self.epoch}:{entry.topic}:{entry.seq}")

    async def _snapshot(self) -> None:
        """The mirror as of the last commit, in the object store; commits before it go."""
        assert self.store is not None
        await snapshots.take(self.bus, self.store, self.mirror_path, self.commit_seq)

    def view(self) -> dict[str, Any]:
        return {"leading": self.leading, "terms": self.terms, "took_over": self.took_over,
                "commit": self.commit_seq, "agents_stream": self.agents_seq,
                "since": self.took_over_at,
                "queued": self._queue.qsize(),
                "hosts": len(self.core.cluster.hosts) if self.core else 0,
                "hosts_alive": sum(h.alive for h in self.core.cluster.hosts.values())
                if self.core else 0,
                "next_deadline_in": (max(0.0, d - time.monotonic()) if self.core and
                                     (d := self.core.next_deadline()) is not None
                                     and math.isfinite(d) else None)}
