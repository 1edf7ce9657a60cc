"""A warm standby: a replica that is not leading keeps the leader's state as it is
written, so that taking over reads only what was committed since it last looked.

A cold takeover fetches the newest snapshot, replays every commit after it and counts
every host again: at 100,000 hosts that is seconds (docs/scaling.md, "Region
failover"), all of it after the lease ran out. A standby does the same work as the
commits come instead: it begins from the newest snapshot once, then applies each
commit on ``hz.state.commit`` to its own mirror (the same SQLite file the leader
would write, at the path it would write it) and to the parts of the state that grow
with the region: every host's record and each pool's counts
(controller/pooltally.py), moved by the hosts each commit carries. A successor then
reads the few commits since, and builds its core from these (the rest of the state,
per job and per topic, is small and read from the mirror).

What it holds is exactly what a cold restore would build from the same log: commits
have one history (each is fenced on the one before), a standby applies them in the
log's order, each whole in one transaction (its position in the same transaction),
and a commit it cannot have read (purged by a newer snapshot while it was behind) makes
it begin again from that snapshot (``tests/controller/cluster/test_standby.py``
compares the two).

Publications to publish again: a leader publishes a commit's publications (each
acknowledged by the feed stream) before it stores its next commit, and a successor
publishes again what it read before its first; so when a commit is in the log, the
publications of every commit before it are in the feed. A standby keeps those of the
commit it stands at (read from the log when it begins: the term that stored it may
have died before publishing them) and of every commit after it; the successor
publishes again only those after the feed's last entry (controller/bus/leader.py:
``unpublished``), so nothing is stored in the feed twice however old the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from controller.bus import codec, snapshots
from controller.bus.nats import COMMIT_SUBJECT, STATE, Bus
from controller.cluster import HostRecord
from controller.outputs import FeedEntry
from controller.pooltally import PoolTally
from controller.redactionconfig import PoolNames
from controller.store import Store

if TYPE_CHECKING:
    from controller.config import ControllerConfig

log = logging.getLogger("harmonaize.controller.leader")

#: Seconds between a standby's prunings of its mirror (the leader's core prunes as often).
PRUNE_INTERVAL = 60.0

T = TypeVar("T")


class Behind(Exception):
    """The log no longer holds the commit after the standby's position."""


class Halted(Exception):
    """The following this was part of was halted (a takeover has the state)."""


@dataclass
class Warm:
    """What a successor takes over from its standby."""

    store: Store
    commit_seq: int
    agents_seq: int
    hosts: dict[str, HostRecord]
    tally: PoolTally
    #: The publications of the last commit applied, and of any read after it.
    again: list[FeedEntry]


class Standby:
    """The leader's state as of the last commit applied (sans I/O but for the mirror)."""

    def __init__(self, cfg: ControllerConfig, mirror: Path) -> None:
        self.cfg = cfg
        self.mirror = mirror
        self.store: Store | None = None
        self.commit_seq = 0
        self.agents_seq = 0
        self.hosts: dict[str, HostRecord] = {}
        self.tally = PoolTally()
        self.again: list[FeedEntry] = []
        #: Which following may change the state: one that began under another (halted:
        #: the NATS client can swallow a task's cancellation in a fetch, and a follower
        #: left behind must not apply anything to a successor's state) stops at its
        #: next step.
        self._term = 0
        self._prune_at = 0.0

    @property
    def ready(self) -> bool:
        return self.store is not None

    def _rules(self) -> tuple[PoolNames, int]:
        return (PoolNames.of(self.cfg.pools.names, self.cfg.pools.gpu_classes),
                self.cfg.redaction.host_gpus)

    def _load(self) -> tuple[dict[str, HostRecord], PoolTally]:
        """Every host in the mirror, and each pool counted: seconds at 100,000 hosts, so
        run off the event loop (with its own connection: SQLite's are per thread)."""
        reader = Store(self.mirror, durable=False)
        try:
            hosts = {record.host_id: record for record in reader.load_hosts()}
        finally:
            reader.close()
        tally = PoolTally()
        names, cap = self._rules()
        tally.rebuild((record.view() for record in hosts.values()), names, cap)
        return hosts, tally

    def halt(self) -> None:
        """Whatever follows now stops before it changes anything more."""
        self._term += 1

    def _check(self, term: int | None) -> None:
        if term is not None and term != self._term:
            raise Halted

    async def open(self) -> None:
        """Begin from the mirror as it is on disk, with nothing to publish again."""
        self._install(await self._opened(None), [])

    async def _opened(self, term: int | None) -> Warm:
        """The mirror on disk opened and loaded, not yet the standby's."""
        store = Store(self.mirror, durable=False)
        try:
            hosts, tally = await finished(asyncio.to_thread(self._load))
            self._check(term)
        except BaseException:
            store.close()
            raise
        return Warm(store, int(store.get_meta("bus_commit_seq") or 0),
                    int(store.get_meta("bus_agents_seq") or 0), hosts, tally, [])

    def _install(self, loaded: Warm, again: list[FeedEntry]) -> None:
        """The standby's state, whole, in one step (nothing awaited between its parts)."""
        self.close()
        self.store, self.hosts, self.tally = loaded.store, loaded.hosts, loaded.tally
        self.commit_seq, self.agents_seq, self.again = loaded.commit_seq, loaded.agents_seq, again

    def apply(self, seq: int, data: bytes, *, keep: bool = False) -> None:
        """The commit stored at ``seq``, the next one the log holds after this standby's
        position. ``keep``: its publications are kept with those before (a successor's
        catch-up), else instead of them."""
        assert self.store is not None
        commit = codec.decode(data)
        writes = commit.writes
        self.store.commit(writes, meta={"bus_commit_seq": seq,
                                        "bus_agents_seq": commit.agents_seq})
        self.commit_seq, self.agents_seq = seq, commit.agents_seq
        try:
            self.hosts.update((record.host_id, record) for record in writes.hosts)
            names, cap = self._rules()
            self.tally.update((record.view() for record in writes.hosts), names, cap)
        except BaseException:
            self.close()  # the mirror has the commit and these may not: begin again
            raise
        self.again = [*self.again, *writes.feed_log] if keep else list(writes.feed_log)

    def hand_over(self) -> Warm:
        """Everything, to a successor; the standby holds nothing after."""
        assert self.store is not None
        warm = Warm(self.store, self.commit_seq, self.agents_seq, self.hosts, self.tally,
                    self.again)
        self.store, self.hosts, self.tally, self.again = None, {}, PoolTally(), []
        return warm

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.store, self.hosts, self.tally, self.again = None, {}, PoolTally(), []

    # --- on the bus ------------------------------------------------------------------------

    async def begin(self, bus: Bus, *, trusted: bool, term: int | None = None) -> None:
        """Ready to follow: from the newest snapshot, or, where the mirror on disk is one
        this process wrote (``trusted``: it stepped down from leading, or followed, on
        this bus), no snapshot covers more and the log still holds its commit, from the
        mirror. Either way the publications of the commit it stands at are kept to
        publish again (a term that stored it may have died before publishing them).
        The standby is ready only once all of that is done (a following halted or
        failed midway leaves it as it was)."""
        self.close()
        if trusted and self.mirror.exists():
            loaded = await self._opened(term)
            try:
                newest = snapshots.covers(await snapshots.newest(bus) or "")
                again = (await self._again_from_log(bus, loaded.commit_seq)
                         if newest <= loaded.commit_seq else None)
                self._check(term)
            except BaseException:
                loaded.store.close()
                raise
            if again is not None:
                self._install(loaded, again)
                return
            loaded.store.close()
        # Fetched beside the mirror and put in its place only while this following is
        # still the standby's: one left behind must not replace a successor's mirror.
        incoming = self.mirror.with_name(self.mirror.name + ".incoming")
        await snapshots.fetch_newest(bus, incoming)
        self._check(term)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.mirror}{suffix}").unlink(missing_ok=True)
        if incoming.exists():
            incoming.replace(self.mirror)
        loaded = await self._opened(term)
        try:
            again = await self._again_from_log(bus, loaded.commit_seq)
            self._check(term)
        except BaseException:
            loaded.store.close()
            raise
        self._install(loaded, again or [])

    @staticmethod
    async def _again_from_log(bus: Bus, position: int) -> list[FeedEntry] | None:
        """The publications of the commit at ``position``, from the log (the purge keeps
        the newest snapshot's own); None: the log does not hold it (the bus was begun
        anew: a mirror at it is of another history)."""
        if position == 0:
            return []
        data = await bus.commit_at(position)
        return None if data is None else list(codec.decode(data).writes.feed_log)

    async def catch_up(self, bus: Bus, until: int | None, *, keep: bool = False,
                       term: int | None = None) -> None:
        """Apply the log's commits after the standby's position, up to ``until`` (or for
        ever). :class:`Behind` when the log skipped a commit this standby needs;
        :class:`Halted` when ``term`` is no longer the standby's."""
        reading = bus.read(STATE, COMMIT_SUBJECT, self.commit_seq, until=until)
        async with contextlib.aclosing(reading):
            async for batch in reading:
                self._check(term)
                for seq, data, _ in batch:
                    if seq != self.commit_seq + 1:
                        purged = await self._purged_since(bus)
                        self._check(term)
                        if purged:
                            raise Behind(f"the log holds commit {seq} next, the standby is "
                                         f"at {self.commit_seq}, and a newer snapshot was "
                                         "stored")
                        log.info("standby: commit %d follows %d (nothing purged between)",
                                 seq, self.commit_seq)
                    self.apply(seq, data, keep=keep)
                if term is not None:
                    self._prune_if_due()
                await asyncio.sleep(0)  # a long catch-up shares the loop

    def _prune_if_due(self) -> None:
        """Old host events and feed messages out of the mirror, as the leader prunes its
        own (its Prune is not in the log): a standby of days keeps a mirror of a day."""
        now = time.monotonic()
        if self.store is None or now < self._prune_at:
            return
        self._prune_at = now + PRUNE_INTERVAL
        self.store.prune_events()
        self.store.prune_feed(self.cfg.feed.retention)

    async def _purged_since(self, bus: Bus) -> bool:
        """Whether commits after the standby's position may have been purged: a snapshot
        covering more was stored (only those purge the log)."""
        return snapshots.covers(await snapshots.newest(bus) or "") > self.commit_seq

    async def follow(self, bus: Bus, *, trusted: bool) -> None:
        """Follow the log until :meth:`halt` (or the task's cancellation), stopping
        between two commits; begins again from the newest snapshot when behind."""
        term = self._term
        errors = 0
        while term == self._term:
            try:
                if not self.ready:
                    await self.begin(bus, trusted=trusted, term=term)
                    log.info("standby: the state to commit %d, %d hosts", self.commit_seq,
                             len(self.hosts))
                await self.catch_up(bus, None, term=term)
            except Halted:
                return
            except Behind as exc:
                if term != self._term:
                    return
                log.warning("standby: %s; from that snapshot again", exc)
                self.close()
                trusted = False
            except Exception as exc:
                # A standby keeps trying: it is never what a takeover waits for (one
                # begins cold without it). Its state is whole between two commits, so it
                # goes on from where it is, more slowly each time the same fails.
                if term != self._term:
                    return
                errors += 1
                log.warning("standby: %s: %s; again", type(exc).__name__, exc)
                await asyncio.sleep(min(30.0, 2.0 ** min(errors, 5) / 2))
            else:
                errors = 0


async def finished(work: Awaitable[T]) -> T:
    """``work`` (a thread's), awaited to its end even when the awaiting task is
    cancelled: a thread cannot be stopped, and what it was writing must not be half
    done when the canceller goes on (a successor taking the standby's state)."""
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise
