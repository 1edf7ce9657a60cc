"""A warm standby (controller/bus/standby.py) holds what a cold restore builds from the
same log, commit for commit; one left behind a snapshot begins again from it; and a
successor that takes over warm applies every frame once, publishing each entry once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controller.bus import codec
from controller.bus.leader import Leader
from controller.bus.nats import FEED, FEED_SUBJECT, Bus, agent_subject
from controller.bus.standby import Behind, Halted, Standby
from controller.cluster import HostRecord
from controller.config import ControllerConfig, load
from controller.outputs import FeedEntry, Writes
from harmonaize import messages as m
from harmonaize.messages import encode
from tests.controller.cluster.test_leader_batches import logged_events

pytestmark = pytest.mark.cluster

EPOCH = 7
#: Hosts, each with a pool and GPUs: one reports a pool [pools] does not declare.
HOSTS = {"h1": "p", "h2": "p", "h3": "p", "h4": "p", "h5": "q"}


def config(tmp_path: Path, url: str, name: str, **cluster: Any) -> ControllerConfig:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[controller]\ndatabase = "{tmp_path / name}.db"\n'
        '[pools]\nnames = ["p"]\ngpu_classes = ["H200"]\n'
        # A publication per change, so that commits carry feed entries.
        '[redaction]\nmode = "redacted"\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n'
        f'[cluster]\nenabled = true\nreplica = "{name}"\nservers = ["{url}"]\n'
        'stream_replicas = 1\nlease = 1.0\nsnapshot_interval = 3600\n')
    cfg = load(path)[0]
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, **cluster))


async def store_wave(bus: Bus, wave: int) -> None:
    """Each host's frames as a door stores them: a hello first (wave 0), then a summary
    whose free GPUs differ by wave and host, and a host event."""
    for index, (host, pool) in enumerate(HOSTS.items()):
        position = (await bus.agent_log(host)).subject_seq
        seq = 2 * wave + 1
        frames = [] if wave else [(0, encode(m.Hello(
            pool=pool, gpu_class="H200", gpus=8, version="t", epoch=EPOCH, acked=0,
            heartbeat=1.0), sender=host))]
        free = (8 - index - wave) % 9
        frames += [
            (seq, encode(m.HostSummary(m.Health.HEALTHY, (index + wave) % 3 != 0,
                                       m.GpuCounts(healthy=free, in_use=8 - free)),
                         sender=host, seq=seq)),
            (seq + 1, encode(m.HostEvent("Probe", m.Severity.INFO, f"{host} {wave}"),
                             sender=host, seq=seq + 1))]
        for hz_seq, frame in frames:
            stored = await bus.store(agent_subject(host), frame, position, headers={
                "hz-host": host, "hz-epoch": str(EPOCH), "hz-seq": str(hz_seq)})
            position = stored.seq


async def lead_to_head(cfg: ControllerConfig, epoch: int, mirror: Path,
                       **kwargs: Any) -> Leader:
    """A term (its own connection) that applies every stored frame, then ends."""
    own = Bus(cfg.cluster)
    await own.connect()
    try:
        head = await own.head("HZ_AGENTS")
        leader = Leader(cfg, own, epoch, mirror, **kwargs)
        stop = asyncio.Event()
        task = asyncio.create_task(leader.run(stop))
        await asyncio.wait_for(until(lambda: leader.committed == head), 30)
        stop.set()
        await task
        return leader
    finally:
        await own.close()


async def until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def end(stop: asyncio.Event, task: asyncio.Task[None], *buses: Bus) -> None:
    """A leader's run stopped and waited for, then the test's connections closed."""
    stop.set()
    try:
        await asyncio.wait_for(task, 20)
    finally:
        for bus in buses:
            await bus.close()


def tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, sorted; of the meta table the positions only (each file has
    its own feed epoch, drawn when it was begun)."""
    db = sqlite3.connect(path)
    try:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = "
                                          "'table' AND name NOT LIKE 'sqlite_%'")]
        out = {n: sorted(db.execute(f"SELECT * FROM {n}").fetchall(), key=repr)
               for n in names if n != "meta"}
        out["meta"] = sorted(db.execute("SELECT key, value FROM meta WHERE key LIKE 'bus_%'"))
        return out
    finally:
        db.close()


def stored(record: HostRecord) -> HostRecord:
    """A host as stored (the core sets when it was last heard as it restores it)."""
    return dataclasses.replace(record, last_seen=0.0)


def test_a_standby_holds_what_a_cold_restore_builds(server: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        cfg_c = config(tmp_path, server, "c")
        door, bus_b = Bus(cfg_a.cluster), Bus(cfg_b.cluster)
        await door.connect()
        await bus_b.connect()
        standby = Standby(cfg_b, tmp_path / "b.mirror")
        following = asyncio.create_task(standby.follow(bus_b, trusted=False))
        try:
            epoch = await door.epoch()
            for wave in range(3):  # three terms, each a Commit per 4 frames
                await store_wave(door, wave)
                await lead_to_head(cfg_a, epoch, tmp_path / "a.mirror", max_batch=4)
            last = await door.last_commit()
            assert last > 6
            await asyncio.wait_for(until(lambda: standby.commit_seq == last), 30)
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            cold = Leader(cfg_c, door, epoch, tmp_path / "c.mirror")
            await cold.take_over()
            assert cold.took_over == "cold" and cold.core is not None
            assert standby.store is not None and cold.store is not None
            assert tables(tmp_path / "b.mirror") == tables(tmp_path / "c.mirror")
            assert standby.hosts == {h.host_id: h for h in cold.store.load_hosts()}
            # Each pool counted as the cold core counted it (a pool held back too).
            assert standby.tally.pools == cold.core.redactor.tally.pools
            assert standby.tally.pools and standby.tally.held_back == Counter({("q", "H200"): 1})
            # The successor from the standby: the same core.
            warm = Leader(cfg_b, bus_b, epoch, tmp_path / "b.mirror")
            warm.standby = standby
            await warm.take_over()
            assert warm.took_over == "warm" and warm.core is not None
            assert (warm.commit_seq, warm.agents_seq) == (cold.commit_seq, cold.agents_seq)
            assert ({h: stored(r) for h, r in warm.core.cluster.hosts.items()}
                    == {h: stored(r) for h, r in cold.core.cluster.hosts.items()})
            assert warm.core.redactor.tally.pools == cold.core.redactor.tally.pools
            assert warm.core.feed.seqs == cold.core.feed.seqs
            assert warm.core.feed.latest == cold.core.feed.latest
            # Both go on alike: a tick of each publishes the same.
            assert _published(warm) == _published(cold)
            for leader in (warm, cold):
                assert leader.store is not None
                leader.store.close()
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            standby.close()
            await door.close()
            await bus_b.close()

    asyncio.run(scenario())


def _published(leader: Leader) -> list[tuple[str, bytes]]:
    assert leader.core is not None
    now, wall = 1e6, 2e9  # far on: whatever is due is due in both
    out = []
    for output in leader.core.tick(now, wall):
        writes = getattr(output, "writes", None)
        if isinstance(writes, Writes):
            out += [(e.topic, e.frame) for e in writes.feed_log]
    return out


def test_a_standby_behind_a_snapshot_begins_again_from_it(
        server: str, tmp_path: Path) -> None:
    """Commits it had not read were purged by a newer snapshot: the next one it reads is
    not the one after its position, and it must not go on as if it were."""
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        door = Bus(cfg_a.cluster)
        await door.connect()
        standby = Standby(cfg_b, tmp_path / "b.mirror")
        try:
            epoch = await door.epoch()
            await store_wave(door, 0)
            await lead_to_head(cfg_a, epoch, tmp_path / "a.mirror", max_batch=4)
            await standby.begin(door, trusted=False)
            await standby.catch_up(door, await door.last_commit())
            behind = standby.commit_seq
            assert behind > 0
            await store_wave(door, 1)
            leader = await lead_to_head(cfg_a, epoch, tmp_path / "a.mirror", max_batch=4)
            snapshotting = Leader(cfg_a, door, epoch, tmp_path / "s.mirror")
            await snapshotting.take_over()
            await snapshotting._snapshot()  # purges the commits before its own
            assert snapshotting.store is not None
            snapshotting.store.close()
            last = await door.last_commit()
            assert last > behind + 1 and leader.commits > 1
            # A following halted (a takeover has the state) applies nothing more.
            term = standby._term
            standby.halt()
            with pytest.raises(Halted):
                await standby.catch_up(door, last, term=term)
            with pytest.raises(Behind):
                await standby.catch_up(door, last)
            assert standby.commit_seq == behind  # nothing applied past the hole
            # Following begins again from the snapshot, and reaches the log's end.
            following = asyncio.create_task(standby.follow(door, trusted=True))
            try:
                await asyncio.wait_for(until(lambda: standby.ready and
                                             standby.commit_seq == last), 30)
            finally:
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following
            cold = Leader(cfg_a, door, epoch, tmp_path / "c.mirror")
            await cold.take_over()
            assert cold.store is not None
            assert standby.hosts == {h.host_id: h for h in cold.store.load_hosts()}
            assert tables(tmp_path / "b.mirror") == tables(tmp_path / "c.mirror")
            cold.store.close()
        finally:
            standby.close()
            await door.close()

    asyncio.run(scenario())


def test_a_successor_takes_over_warm_and_applies_each_frame_once(
        server: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        door, bus_a, bus_b = Bus(cfg_a.cluster), Bus(cfg_a.cluster), Bus(cfg_b.cluster)
        for bus in (door, bus_a, bus_b):
            await bus.connect()
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            epoch = await door.epoch()
            await store_wave(door, 0)
            a = Leader(cfg_a, bus_a, epoch, tmp_path / "a.mirror", max_batch=4)
            b = Leader(cfg_b, bus_b, epoch, tmp_path / "b.mirror", max_batch=4)
            tasks.append(asyncio.create_task(a.run(stop_a)))
            await asyncio.wait_for(until(lambda: a.leading), 30)
            tasks.append(asyncio.create_task(b.run(stop_b)))  # B follows while A leads
            await store_wave(door, 1)
            head = await door.head("HZ_AGENTS")
            await asyncio.wait_for(until(lambda: a.committed == head), 30)
            assert b.standby is not None
            await asyncio.wait_for(until(lambda: b.standby is not None and
                                         b.standby.commit_seq == a.commit_seq), 30)
            stop_a.set()  # A ends its term: B takes over, warm
            await tasks[0]
            await asyncio.wait_for(until(lambda: b.leading), 30)
            assert b.took_over == "warm"
            await store_wave(door, 2)
            head = await door.head("HZ_AGENTS")
            await asyncio.wait_for(until(lambda: b.committed == head), 30)
            # Every host event is in exactly one commit, across both terms.
            events = await logged_events(door)
            assert len(events) == len(HOSTS) * 3 and set(events.values()) == {1}
            # Every publication is in the feed once (by topic and number).
            numbers = Counter((e.topic, e.seq) for e in await _feed(door))
            assert numbers and set(numbers.values()) == {1}
        finally:
            stop_a.set()
            stop_b.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for bus in (door, bus_a, bus_b):
                await bus.close()

    asyncio.run(scenario())


async def _feed(bus: Bus) -> list[FeedEntry]:
    entries: list[FeedEntry] = []
    async for batch in bus.read(FEED, FEED_SUBJECT, 0, until=await bus.head(FEED)):
        entries += [codec.read_feed_entry(data) for _, data, _ in batch]
    return entries


def test_a_successor_publishes_again_the_last_commits_entries_and_those_after(
        tmp_path: Path) -> None:
    """Only the last commit's publications may be missing from the feed (its leader
    publishes them before it stores another): those, and the catch-up's, are kept."""
    cfg = config(tmp_path, "nats://127.0.0.1:1", "b")
    standby = Standby(cfg, tmp_path / "b.mirror")

    def commit(n: int) -> bytes:
        entry = FeedEntry("pool/p/H200", n, True, b"frame %d" % n)
        return codec.encode(codec.Commit(Writes(feed_seqs={entry.topic: n},
                                                feed_log=(entry,)), n))

    async def scenario() -> None:
        await standby.open()
        try:
            standby.apply(1, commit(1))
            standby.apply(2, commit(2))
            assert [e.seq for e in standby.again] == [2]
            standby.apply(3, commit(3), keep=True)
            standby.apply(4, commit(4), keep=True)
            assert [e.seq for e in standby.again] == [2, 3, 4]
            warm = standby.hand_over()
            assert (warm.commit_seq, warm.agents_seq) == (4, 4)
            assert not standby.ready
            warm.store.close()
        finally:
            standby.close()

    asyncio.run(scenario())
