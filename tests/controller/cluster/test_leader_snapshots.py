"""A successor that read commits since the snapshot takes a snapshot of its own after
its first batch, whatever ``snapshot_interval`` says: leaders that each live shorter
than the interval (region-failover kills one every few seconds) would otherwise leave
every later successor a longer log to read and publish again, without end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.bus.leader import Leader
from controller.bus.nats import STATE, Bus
from controller.bus.snapshots import fetch_newest
from controller.store import Store
from tests.controller.cluster.test_leader_batches import config, store_frames

pytestmark = pytest.mark.cluster


def test_a_successor_that_read_the_log_snapshots_after_its_first_batch(
        server: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        assert cfg_a.cluster.snapshot_interval == 3600  # no snapshot by the clock
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
            await asyncio.wait_for(_until_async(
                lambda: _snapshot_covers(door, tmp_path / "seen.db"), logged), 30)
            # What B read is the snapshot now; the commits before it are gone from the
            # log but the last one (the next Commit is fenced on it).
            assert door.js is not None
            assert (await door.js.stream_info(STATE)).state.first_seq >= logged
            stop_b.set()
            await task_b
        finally:
            for bus in (door, bus_a, bus_b):
                await bus.close()

    asyncio.run(scenario())


async def _snapshot_covers(bus: Bus, path: Path) -> int:
    """The commit the newest snapshot covers (0: none)."""
    await fetch_newest(bus, path)
    if not path.exists():
        return 0
    store = Store(path, durable=False)
    try:
        return int(store.get_meta("bus_commit_seq") or 0)
    finally:
        store.close()


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def _until_async(value: Any, at_least: int) -> None:
    while await value() < at_least:
        await asyncio.sleep(0.05)
