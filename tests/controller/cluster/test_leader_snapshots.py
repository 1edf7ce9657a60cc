"""A snapshot taken in a term that stored no Commit of its own (an idle cluster, a
leader that took over and had nothing to apply) says which commit and agents' position
it holds: the positions come with each commit the term read, not only with its own.
Before, such a snapshot said "nothing" while the log was purged up to it, and its
successor took the agents' stream from the start."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from controller.bus import leader as leading
from controller.bus.leader import Leader
from controller.bus.nats import STATE, Bus
from controller.bus.snapshots import fetch_newest
from controller.store import Store
from tests.controller.cluster.test_leader_batches import config, store_frames

pytestmark = pytest.mark.cluster


def test_a_snapshot_before_the_terms_own_first_commit_says_what_it_holds(
        server: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        assert cfg_a.cluster.snapshot_interval == 3600  # A takes none
        # B's first snapshot comes a second into its term, before any Commit of its own
        # (no new frames; its hosts are counted down after three heartbeats at most).
        cfg_b = dataclasses.replace(cfg_b, cluster=dataclasses.replace(
            cfg_b.cluster, snapshot_interval=1.0))
        door = Bus(cfg_a.cluster)
        await door.connect()
        bus_a, bus_b = Bus(cfg_a.cluster), Bus(cfg_b.cluster)
        await bus_a.connect()
        await bus_b.connect()
        try:
            await store_frames(door, "h1", 1, 30)
            head = await door.head("HZ_AGENTS")
            epoch = await door.epoch()
            a = Leader(cfg_a, bus_a, epoch, tmp_path / "a.mirror", max_batch=8)
            stop_a = asyncio.Event()
            task_a = asyncio.create_task(a.run(stop_a))
            await asyncio.wait_for(_until(lambda: a.committed == head), 30)
            stop_a.set()
            await task_a
            # A's term: commits, and no snapshot (it lived shorter than the interval).
            assert await _snapshot_covers(door, tmp_path / "seen.db") == 0
            logged = await door.last_commit()
            assert logged > 1
            b = Leader(cfg_b, bus_b, epoch, tmp_path / "b.mirror")
            stop_b = asyncio.Event()
            task_b = asyncio.create_task(b.run(stop_b))
            await asyncio.wait_for(_until(lambda: b.leading), 30)
            first = await asyncio.wait_for(_first_snapshot(door, tmp_path / "seen.db"), 30)
            assert b.commits == 0  # taken before B stored anything
            assert first == (logged, head)
            # The log is purged up to it: a successor that took it for "nothing" would
            # have read from here with A's agents' position lost.
            assert door.js is not None
            # The purge follows the snapshot's upload (controller/bus/snapshots.py): wait
            # for it to happen, then check how far it went.
            js = door.js

            async def purged() -> int:
                while (first_seq := (await js.stream_info(STATE)).state.first_seq) == 1:
                    await asyncio.sleep(0.02)
                return first_seq
            assert await asyncio.wait_for(purged(), 30) == logged
            stop_b.set()
            await task_b
        finally:
            for bus in (door, bus_a, bus_b):
                await bus.close()

    asyncio.run(scenario())


async def _snapshot_covers(bus: Bus, path: Path) -> int:
    """The commit the newest snapshot covers (0: none)."""
    return (await _snapshot(bus, path) or (0, 0))[0]


async def _snapshot(bus: Bus, path: Path) -> tuple[int, int] | None:
    """The newest snapshot's (commit, agents' position); None: no snapshot."""
    await fetch_newest(bus, path)
    if not path.exists():
        return None
    store = Store(path, durable=False)
    try:
        return (int(store.get_meta("bus_commit_seq") or 0),
                int(store.get_meta("bus_agents_seq") or 0))
    finally:
        store.close()


async def _first_snapshot(bus: Bus, path: Path) -> tuple[int, int]:
    while (found := await _snapshot(bus, path)) is None:
        await asyncio.sleep(0.02)
    return found


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)




def test_the_snapshot_interval_counts_from_the_logs_oldest_commit(
        server: str, tmp_path: Path) -> None:
    """Leaders that each live shorter than ``snapshot_interval`` still snapshot: a
    successor whose log is older than the interval takes one after its first batch."""
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        short = dataclasses.replace(cfg_b, cluster=dataclasses.replace(
            cfg_b.cluster, snapshot_interval=1.0))
        door = Bus(cfg_a.cluster)
        await door.connect()
        bus_a = Bus(cfg_a.cluster)
        await bus_a.connect()
        try:
            await store_frames(door, "h1", 1, 10)
            head = await door.head("HZ_AGENTS")
            epoch = await door.epoch()
            a = Leader(cfg_a, bus_a, epoch, tmp_path / "a.mirror")
            stop_a = asyncio.Event()
            task_a = asyncio.create_task(a.run(stop_a))
            await asyncio.wait_for(_until(lambda: a.committed == head), 30)
            stop_a.set()
            await task_a
            # A successor under a long interval: its log is young, nothing is due.
            patient = Leader(cfg_b, door, epoch, tmp_path / "b.mirror")
            await patient.take_over()
            assert time.monotonic() - patient._snapshot_at < cfg_b.cluster.snapshot_interval
            patient.store.close()  # type: ignore[union-attr]
            await asyncio.sleep(1.1)  # the log is now older than a 1 s interval
            hurried = Leader(short, door, epoch, tmp_path / "c.mirror")
            await hurried.take_over()
            assert time.monotonic() - hurried._snapshot_at >= 1.0  # due at the first batch
            hurried.store.close()  # type: ignore[union-attr]
        finally:
            for bus in (door, bus_a):
                await bus.close()

    asyncio.run(scenario())


def test_an_older_snapshot_never_replaces_a_newer_one(server: str, tmp_path: Path) -> None:
    """A deposed leader that still snapshots (its mirror as of an older commit) stores
    nothing once a newer snapshot is stored: before, it deleted the newer one, whose
    leader had purged the commits between the two, and a successor lost them."""
    async def scenario() -> None:
        cfg = config(tmp_path, server, "a")
        door = Bus(cfg.cluster)
        await door.connect()
        try:
            epoch = await door.epoch()
            await store_frames(door, "h1", 1, 10)
            await _lead_to_head(cfg, door, epoch, tmp_path / "a.mirror")
            deposed = Leader(cfg, door, epoch, tmp_path / "old.mirror")
            await deposed.take_over()  # its mirror stays at this commit
            older = deposed.commit_seq
            await store_frames(door, "h1", 11, 30)
            await _lead_to_head(cfg, door, epoch, tmp_path / "b.mirror")
            current = Leader(cfg, door, epoch, tmp_path / "new.mirror")
            await current.take_over()
            newer = current.commit_seq
            assert newer > older + 1  # commits between the two that the purge removes
            await current._snapshot()
            assert await _snapshot_covers(door, tmp_path / "seen.db") == newer
            assert door.js is not None
            assert (await door.js.stream_info(STATE)).state.first_seq == newer
            await deposed._snapshot()  # late: a newer snapshot is stored
            assert await _snapshot_covers(door, tmp_path / "seen.db") == newer
            # A successor has every commit: the newest snapshot, then the log after it.
            successor = Leader(cfg, door, epoch, tmp_path / "c.mirror")
            await successor.take_over()
            assert successor.commit_seq == newer
            assert successor.agents_seq == await door.head("HZ_AGENTS")
            for leader in (deposed, current, successor):
                leader.store.close()  # type: ignore[union-attr]
        finally:
            await door.close()

    asyncio.run(scenario())


async def _lead_to_head(cfg: Any, bus: Bus, epoch: int, mirror: Path) -> None:
    """A term that applies every stored frame (a Commit per 8), then ends."""
    own = Bus(cfg.cluster)
    await own.connect()
    try:
        head = await bus.head("HZ_AGENTS")
        leader = Leader(cfg, own, epoch, mirror, max_batch=8)
        stop = asyncio.Event()
        task = asyncio.create_task(leader.run(stop))
        await asyncio.wait_for(_until(lambda: leader.committed == head), 30)
        stop.set()
        await task
    finally:
        await own.close()


async def _leader_over_frames(cfg: Any, bus: Bus, tmp_path: Path) -> tuple[Leader, int]:
    """A leader (not yet run) over ten frames of one host, and the stream's head."""
    await store_frames(bus, "h1", 1, 10)
    head = await bus.head("HZ_AGENTS")
    return Leader(cfg, bus, await bus.epoch(), tmp_path / "a.mirror"), head


async def _one_term_through(leader: Leader, head: int, lease: float) -> None:
    """Run ``leader`` until it committed up to ``head`` and several renewals after: it
    must still lead, in its first term (a lapsed lease would have made a second)."""
    stop = asyncio.Event()
    task = asyncio.create_task(leader.run(stop))
    try:
        await asyncio.wait_for(_until(lambda: leader.committed == head), 30)
        await asyncio.sleep(2 * lease)
        assert leader.leading
        assert leader.terms == 1
    finally:
        stop.set()
        await task


def test_the_lease_is_renewed_while_restoring(server: str, tmp_path: Path) -> None:
    """A restore three leases long is one takeover: the lease is renewed during it.
    Before, it was renewed only once the restore ended, by which time it had expired;
    the leader stepped down at its first renewal and took over a second time."""
    async def scenario() -> None:
        cfg = config(tmp_path, server, "a")
        lease = cfg.cluster.lease
        bus = Bus(cfg.cluster)
        await bus.connect()
        try:
            leader, head = await _leader_over_frames(cfg, bus, tmp_path)
            restore = leader._restore
            slow = [True]

            async def slow_restore() -> Any:
                again = await restore()
                if slow.pop() if slow else False:  # the first takeover only
                    await asyncio.sleep(3 * lease)
                return again

            leader._restore = slow_restore  # type: ignore[method-assign]
            await _one_term_through(leader, head, lease)
        finally:
            await bus.close()

    asyncio.run(scenario())


def test_the_lease_is_renewed_while_the_core_is_built(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the core from the restored state (about a lease long at 100,000 hosts,
    all CPU) does not hold the event loop, where the lease is renewed: one takeover.
    Before, it ran on the loop; the lease expired under it."""
    made: list[bool] = []

    def slow_core(*args: Any, **kwargs: Any) -> Any:
        if not made:  # the first takeover only
            time.sleep(3 * lease)  # as CPU-bound work would, holding the caller
        made.append(True)
        return real(*args, **kwargs)

    real = leading.ControllerCore
    monkeypatch.setattr(leading, "ControllerCore", slow_core)
    cfg = config(tmp_path, server, "a")
    lease = cfg.cluster.lease

    async def scenario() -> None:
        bus = Bus(cfg.cluster)
        await bus.connect()
        try:
            leader, head = await _leader_over_frames(cfg, bus, tmp_path)
            await _one_term_through(leader, head, lease)
        finally:
            await bus.close()

    asyncio.run(scenario())
