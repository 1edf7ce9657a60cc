"""The leader's batches against a real nats-server: frames applied many at a time under
one Commit keep the guarantees frames applied one by one had. A batch cut by the
leader's death (its Commit never stored, or stored but never known to it) is applied by
its successor exactly once: every frame on the agents' stream is in the commit log once,
none twice. A deposed leader's batch is refused whole: nothing of it reaches the log,
its mirror or the feed, however many frames it held."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controller.bus import codec
from controller.bus.leader import Leader, StepDown
from controller.bus.nats import AGENTS, COMMIT_SUBJECT, FEED, STATE, Bus, agent_subject
from controller.config import ControllerConfig, load
from harmonaize import messages as m
from harmonaize.messages import encode

pytestmark = pytest.mark.cluster

EPOCH = 3


def config(tmp_path: Path, url: str, name: str) -> ControllerConfig:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[controller]\ndatabase = "{tmp_path / name}.db"\n'
        '[pools]\nnames = ["p"]\ngpu_classes = ["H200"]\n'
        f'[cluster]\nenabled = true\nreplica = "{name}"\nservers = ["{url}"]\n'
        'stream_replicas = 1\nlease = 1.0\nsnapshot_interval = 3600\n')
    return load(path)[0]


async def store_frames(bus: Bus, host: str, first: int, last: int) -> None:
    """What a door stores for ``host``: its hello (with ``first`` 1), then host events
    ``first``..``last``, each fenced on the host's subject and with the door's headers."""
    position = (await bus.agent_log(host)).subject_seq
    frames: list[tuple[int, bytes]] = []
    if first == 1:
        frames.append((0, encode(m.Hello(pool="p", gpu_class="H200", gpus=8, version="t",
                                         epoch=EPOCH, acked=0, heartbeat=1.0), sender=host)))
    frames += [(seq, encode(m.HostEvent("Probe", m.Severity.INFO, f"{host} {seq}"),
                            sender=host, seq=seq)) for seq in range(first, last + 1)]
    for seq, frame in frames:
        stored = await bus.store(agent_subject(host), frame, position, headers={
            "hz-host": host, "hz-epoch": str(EPOCH), "hz-seq": str(seq)},
            msg_id=f"{host}:{EPOCH}:{seq}" if seq else None)
        position = stored.seq


async def logged_events(bus: Bus) -> Counter[tuple[str, int]]:
    """Every host event in the commit log, counted: (host, seq) -> how many commits hold it."""
    assert bus.js is not None
    out: Counter[tuple[str, int]] = Counter()
    async for batch in bus.read(STATE, COMMIT_SUBJECT, 0, until=await bus.head(STATE)):
        for _, data, _ in batch:
            out.update((e.host_id, e.seq) for e in codec.decode(data).writes.events)
    return out


def mirrored_events(leader: Leader) -> Counter[tuple[str, int]]:
    assert leader.store is not None
    return Counter(leader.store.db.execute("SELECT host_id, seq FROM host_events").fetchall())


class DyingBus(Bus):
    """A bus whose ``cut``-th Commit is the last its leader sends: it never hears back
    (the leader died waiting), the Commit stored first if ``stored``."""

    def __init__(self, cfg: Any, cut: int, stored: bool) -> None:
        super().__init__(cfg)
        self.cut, self.stored, self.commits = cut, stored, 0
        self.dead = asyncio.Event()

    async def store(self, subject: str, payload: bytes, last: int, **kw: Any) -> Any:
        if subject == COMMIT_SUBJECT:
            self.commits += 1
            if self.commits == self.cut:
                if self.stored:
                    await super().store(subject, payload, last, **kw)
                self.dead.set()
                await asyncio.Event().wait()  # for ever
        return await super().store(subject, payload, last, **kw)


@pytest.mark.parametrize("stored", [False, True], ids=["commit-lost", "commit-stored"])
def test_a_batch_cut_by_the_leaders_death_is_applied_once_by_its_successor(
        server: str, tmp_path: Path, stored: bool) -> None:
    hosts = ["h1", "h2", "h3"]

    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        door = Bus(cfg_a.cluster)
        await door.connect()
        bus_a = DyingBus(cfg_a.cluster, cut=3, stored=stored)
        await bus_a.connect()
        bus_b = Bus(cfg_b.cluster)
        await bus_b.connect()
        try:
            for host in hosts:
                await store_frames(door, host, 1, 40)
            epoch = await door.epoch()
            a = Leader(cfg_a, bus_a, epoch, tmp_path / "a.mirror", max_batch=16)
            stop_a = asyncio.Event()
            task_a = asyncio.create_task(a.run(stop_a))
            await asyncio.wait_for(bus_a.dead.wait(), 30)
            # Cut: it applied a batch beyond what its stored Commits cover, then died.
            assert a.agents_seq > a.committed
            assert bus_a.nc is not None
            await bus_a.nc.close()
            task_a.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task_a
            for host in hosts:  # the agents go on
                await store_frames(door, host, 41, 50)
            head = await door.head(AGENTS)
            b = Leader(cfg_b, bus_b, epoch, tmp_path / "b.mirror", max_batch=16)
            stop_b = asyncio.Event()
            task_b = asyncio.create_task(b.run(stop_b))
            await asyncio.wait_for(_until(lambda: b.leading and b.committed == head), 30)
            every = Counter({(host, seq): 1 for host in hosts for seq in range(1, 51)})
            assert await logged_events(door) == every  # none lost, none twice, in the log
            assert mirrored_events(b) == every  # and in the successor's state
            assert b.core is not None
            assert [b.core.cluster.hosts[h].last_seq for h in hosts] == [50, 50, 50]
            stop_b.set()
            await task_b
        finally:
            for bus in (door, bus_a, bus_b):
                await bus.close()

    asyncio.run(scenario())


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


def test_a_deposed_leaders_batch_is_refused_whole(server: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg_a, cfg_b = config(tmp_path, server, "a"), config(tmp_path, server, "b")
        bus_a, bus_b = Bus(cfg_a.cluster), Bus(cfg_b.cluster)
        await bus_a.connect()
        await bus_b.connect()
        assert bus_a.nc is not None
        to_agents: list[bytes] = []

        async def heard(msg: Any) -> None:
            to_agents.append(msg.data)

        await bus_a.nc.subscribe("hz.to-agent.>", cb=heard)
        try:
            for host in ("h1", "h2"):
                await store_frames(bus_a, host, 1, 30)
            epoch = await bus_a.epoch()
            frames = [f async for batch in bus_a.read(AGENTS, "hz.agents.>", 0,
                                                      until=await bus_a.head(AGENTS))
                      for f in batch]
            a = Leader(cfg_a, bus_a, epoch, tmp_path / "a.mirror", max_batch=len(frames))
            await a.take_over()
            first = [f for f in frames if f[0] <= 20]
            await a.apply([("agents", first)])
            assert a.commits == 1 and a.committed == 20
            # A successor takes over from the log and commits the next frames.
            b = Leader(cfg_b, bus_b, epoch, tmp_path / "b.mirror", max_batch=len(frames))
            await b.take_over()
            await b.apply([("agents", [f for f in frames if 20 < f[0] <= 25])])
            assert b.commits == 1
            log_before = await logged_events(bus_a)
            feed_before = await bus_a.head(FEED)
            mirror_before = mirrored_events(a)
            assert a.store is not None
            position_before = a.store.get_meta("bus_agents_seq")
            # a, deposed without knowing it, applies all the rest as one batch: refused.
            rest = [f for f in frames if f[0] > 20]
            assert len(rest) > 5
            with pytest.raises(StepDown):
                await a.apply([("agents", rest)])
            assert a.commits == 1  # nothing of the batch stored ...
            assert await logged_events(bus_a) == log_before  # ... in the log,
            assert (await bus_a.js.stream_info(STATE)).state.messages == 2  # type: ignore[union-attr]
            assert mirrored_events(a) == mirror_before  # in its mirror,
            assert a.store.get_meta("bus_agents_seq") == position_before
            assert await bus_a.head(FEED) == feed_before  # on the feed,
            await asyncio.sleep(0.2)
            assert to_agents == []  # or sent to a host
            # The log holds a's batch and b's, and b goes on from it: every event once.
            await b.apply([("agents", [f for f in frames if f[0] > 25])])
            every = Counter({(h, s): 1 for h in ("h1", "h2") for s in range(1, 31)})
            assert await logged_events(bus_a) == every
        finally:
            await bus_a.close()
            await bus_b.close()

    asyncio.run(scenario())
