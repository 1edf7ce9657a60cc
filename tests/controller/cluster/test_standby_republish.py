"""What a successor publishes again after a warm takeover: found as a hole in a job's
feed (a term of the same process stored a commit, lost the bus before publishing it, and
its standby began from its mirror with nothing to publish again), and what review found
besides (a halted follower that closed the standby its successor was using)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controller.bus import codec
from controller.bus.leader import Leader, unpublished
from controller.bus.nats import Bus
from controller.bus.standby import Standby
from controller.outputs import FeedEntry
from tests.controller.cluster.test_standby import _feed, config, end, store_wave, until

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("warm", [False, True])
def test_a_commit_whose_publications_failed_reaches_the_feed_after_a_term_of_the_same_process(
        server: str, tmp_path: Path, warm: bool) -> None:
    """Found in review: a term stored a commit, its mirror too, then the feed timed out
    on its first publication; the same process led again from its own mirror (warm)
    and published nothing of that commit again: a hole in the topic's numbers."""
    async def scenario() -> None:
        cfg = config(tmp_path, server, "a", warm_standby=warm)
        door, bus = Bus(cfg.cluster), Bus(cfg.cluster)
        await door.connect()
        await bus.connect()
        stop = asyncio.Event()
        leader = Leader(cfg, bus, await door.epoch(), tmp_path / "a.mirror")
        real, failed = leader._publish, []

        async def flaky(entry: FeedEntry) -> None:  # the feed times out once
            if not failed:
                failed.append(entry)
                raise TimeoutError("HZ_FEED did not answer")
            await real(entry)

        leader._publish = flaky  # type: ignore[method-assign]
        task = asyncio.create_task(leader.run(stop))
        try:
            await store_wave(door, 0)
            head = await door.head("HZ_AGENTS")
            await asyncio.wait_for(until(lambda: leader.terms >= 2 and leader.leading
                                         and leader.committed == head), 30)
            assert failed and leader.core is not None
            have = Counter((e.topic, e.seq) for e in await _feed(door))
            wanted = {(t, n) for t, last in leader.core.feed.seqs.items()
                      for n in range(1, last + 1)}
            assert set(have) == wanted and set(have.values()) == {1}
        finally:
            await end(stop, task, door, bus)

    asyncio.run(scenario())


def test_a_standby_from_its_own_mirror_publishes_its_last_commits_entries_again(
        server: str, tmp_path: Path) -> None:
    """The same, the successor's standby begun from the mirror the failed term left
    (as a replica that stepped down begins), every time."""
    async def scenario() -> None:
        cfg = config(tmp_path, server, "a")
        door, bus = Bus(cfg.cluster), Bus(cfg.cluster)
        await door.connect()
        await bus.connect()
        mirror = tmp_path / "a.mirror"
        leader = Leader(cfg, bus, await door.epoch(), mirror)

        async def timeout(entry: FeedEntry) -> None:
            raise TimeoutError("HZ_FEED did not answer")

        leader._publish = timeout  # type: ignore[method-assign]
        standby = Standby(cfg, mirror)
        try:
            await store_wave(door, 0)
            await leader.take_over()
            frames = [f async for batch in door.read(
                "HZ_AGENTS", "hz.agents.>", 0, until=await door.head("HZ_AGENTS"))
                for f in batch]
            with pytest.raises(TimeoutError):  # its Commit stored, then the feed failed
                await leader.apply([("agents", frames)])
            stored = await door.last_commit()
            assert stored == leader.commit_seq > 0
            await leader._end()
            assert await _feed(door) == []
            data = await door.commit_at(stored)
            assert data is not None
            lost = {(e.topic, e.seq) for e in codec.decode(data).writes.feed_log}
            assert lost  # what tenants would never get
            await standby.begin(door, trusted=True)  # as the replica's next standby
            assert standby.commit_seq == stored
            successor = Leader(cfg, door, await door.epoch(), mirror)
            successor.standby = standby
            await successor.take_over()
            assert successor.took_over == "warm"
            have = Counter((e.topic, e.seq) for e in await _feed(door))
            assert set(have) == lost and set(have.values()) == {1}
            assert successor.store is not None
            successor.store.close()
        finally:
            standby.close()
            await door.close()
            await bus.close()

    asyncio.run(scenario())


class GapBus:
    """A log whose next commit is not the one after the standby's position."""

    async def read(self, *args: Any, **kwargs: Any) -> Any:
        yield [(5, b"unused", {})]
        await asyncio.sleep(3600)


def test_a_halted_follower_leaves_the_standby_alone(tmp_path: Path) -> None:
    """Found in review: a follower halted while it asked whether the log was purged
    (its cancellation swallowed) went on to close the standby a successor was using."""
    standby = Standby(config(tmp_path, "nats://127.0.0.1:1", "b"), tmp_path / "b.mirror")

    async def purged_since(bus: Any) -> bool:
        standby.halt()  # a takeover owns the standby's state from here
        await asyncio.sleep(0)
        return True  # and a newer snapshot exists

    async def scenario() -> None:
        await standby.open()
        standby._purged_since = purged_since  # type: ignore[method-assign]
        await asyncio.wait_for(standby.follow(GapBus(), trusted=True), 5)  # type: ignore[arg-type]
        assert standby.ready

    try:
        asyncio.run(scenario())
    finally:
        standby.close()


def test_only_what_the_feed_lacks_is_published_again() -> None:
    """The feed holds every publication of every commit before the log's last: of those
    read, the ones after its last entry (all when it holds none of them)."""
    entries = [FeedEntry("pool/p/H200", n, True, b"%d" % n) for n in (4, 5, 6)]
    assert unpublished(entries, None) == entries
    assert unpublished(entries, codec.feed_entry(entries[0])) == entries[1:]
    assert unpublished(entries, codec.feed_entry(entries[2])) == []
    older = FeedEntry("pool/p/H200", 3, True, b"3")
    assert unpublished(entries, codec.feed_entry(older)) == entries
    assert unpublished([], codec.feed_entry(older)) == []
