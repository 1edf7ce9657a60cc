"""The bus's fences, against a real nats-server: what makes "one decision per job" and
"one replica speaks for a host" hold in cluster mode. Two replicas' Bus objects race
for the leader's lease and the commit log; a deposed leader's next commit is refused,
whatever it believes; a replica that lost a host to another cannot store for it."""

from __future__ import annotations

import asyncio

import pytest

from controller.bus.nats import (
    COMMIT_SUBJECT,
    LEADER_KEY,
    STATE,
    Bus,
    Fenced,
    agent_subject,
)
from controller.config import ClusterSection

pytestmark = pytest.mark.cluster


def bus(url: str, name: str, lease: float = 1.0) -> Bus:
    return Bus(ClusterSection(enabled=True, replica=name, servers=(url,), stream_replicas=1,
                              lease=lease))


def test_a_deposed_leaders_commit_is_refused_and_the_log_has_one_history(server: str) -> None:
    async def scenario() -> None:
        a, b = bus(server, "a"), bus(server, "b")
        await a.connect()
        await b.connect()
        try:
            held = await a.acquire(LEADER_KEY, "a")
            assert held is not None
            assert await b.acquire(LEADER_KEY, "b") is None  # held: b cannot lead
            first = await a.store(COMMIT_SUBJECT, b"a:1", 0)
            # a stops renewing (paused, cut off); its lease lapses and b takes over.
            await asyncio.sleep(1.6)
            taken = await b.acquire(LEADER_KEY, "b")
            assert taken is not None
            assert await a.renew(LEADER_KEY, "a", held) is None  # a learns it lost
            last = await b.last_commit()
            assert last == first.seq  # b read the log to its end before deciding
            second = await b.store(COMMIT_SUBJECT, b"b:1", last)
            # a, still believing it leads, commits on what it last knew: refused.
            with pytest.raises(Fenced):
                await a.store(COMMIT_SUBJECT, b"a:2", first.seq)
            assert await a.last_commit() == second.seq
            # One history: a's first commit, then b's; nothing of a's after b took over.
            assert a.js is not None
            bodies = [(await a.js.get_msg(STATE, seq)).data for seq in (first.seq, second.seq)]
            assert bodies == [b"a:1", b"b:1"]
            assert (await a.js.stream_info(STATE)).state.messages == 2
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_only_one_replica_stores_for_a_host_at_each_position(server: str) -> None:
    async def scenario() -> None:
        a, b = bus(server, "a"), bus(server, "b")
        await a.connect()
        await b.connect()
        try:
            subject = agent_subject("gpu-017")
            # The agent moved from a to b; both saw the host's subject at its start.
            stored = await b.store(subject, b"frame 1 via b", 0)
            with pytest.raises(Fenced):
                await a.store(subject, b"frame 1 via a", 0)
            # a, reading where the subject is now, may store after it (the agent resends).
            assert (await a.agent_log("gpu-017")).subject_seq == stored.seq
            again = await a.store(subject, b"frame 2 via a", stored.seq,
                                  headers={"hz-epoch": "7", "hz-seq": "2"})
            log = await b.agent_log("gpu-017")
            assert (log.subject_seq, log.epoch, log.seq) == (again.seq, 7, 2)
            with pytest.raises(Fenced):  # and b, behind now, is refused in turn
                await b.store(subject, b"frame 2 via b", stored.seq)
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_the_holders_are_every_lease_held_now_and_none_released_or_lapsed(server: str) -> None:
    """What a replica's status names: read from the bucket's own list of keys (the watch
    nats-py lists keys with could end before the first key on a loaded machine and name
    nobody), a released lease and a lapsed one not among them."""
    async def scenario() -> None:
        a, b = bus(server, "a"), bus(server, "b")
        await a.connect()
        await b.connect()
        try:
            assert await b.holders() == ({}, set())  # nothing held yet
            held = await a.acquire(LEADER_KEY, "a")
            assert held is not None
            await a.acquire("replica.a", "{}")
            gone = await b.acquire("replica.b", "{}")
            assert gone is not None
            await b.release("replica.b", gone)  # b stopped: its presence deleted
            assert await b.holders() == ({LEADER_KEY: "a", "replica.a": "{}"}, set())
            await asyncio.sleep(1.6)  # nobody renews: both lapse
            assert await b.holders() == ({}, set())
        finally:
            await a.close()
            await b.close()
    asyncio.run(scenario())
