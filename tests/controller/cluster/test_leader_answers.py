"""An operator's answer larger than the bus's message limit (``hosts`` of a region of
more than about 6,000 hosts at NATS's default 1 MB) is refused in one line. Before, the
bus refused to send it, the leader took that for the bus failing and stepped down, and
every such request cost the region a takeover (found by controller-scale --cluster at
7,500 agents, whose hosts count was such a request)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from controller.bus.leader import Leader, fitted, tenant_answer
from controller.bus.nats import LEADER_ADMIN, Bus
from harmonaize.messages import ErrorCode, Reply
from harmonaize.schema import from_plain, to_plain
from tests.controller.cluster.test_standby import HOSTS, config, end, store_wave, until

pytestmark = pytest.mark.cluster


def test_an_answer_too_large_for_the_bus_is_refused_in_one_line_and_the_leader_stays(
        server: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg = config(tmp_path, server, "a")
        door, bus = Bus(cfg.cluster), Bus(cfg.cluster)
        await door.connect()
        await bus.connect()
        stop = asyncio.Event()
        leader = Leader(cfg, bus, await door.epoch(), tmp_path / "a.mirror")
        task = asyncio.create_task(leader.run(stop))
        try:
            await store_wave(door, 0)
            head = await door.head("HZ_AGENTS")
            await asyncio.wait_for(until(lambda: leader.leading and leader.committed == head),
                                   30)
            assert door.nc is not None and bus.nc is not None

            async def ask(command: str) -> dict[str, object]:
                reply = await door.nc.request(LEADER_ADMIN, msgpack.packb(  # type: ignore[union-attr]
                    {"command": command}), timeout=10.0)
                return msgpack.unpackb(reply.data, raw=False)

            hosts = await ask("hosts")
            assert len(hosts["result"]) == len(HOSTS)  # type: ignore[arg-type]
            size = len(msgpack.packb(hosts, use_bin_type=True))
            bus.nc._max_payload = size - 1  # as a region's list is for the default 1 MB
            refused = await ask("hosts")
            assert "over the bus's message limit" in str(refused["error"])
            assert "\n" not in str(refused["error"])
            # Still the leader, in the same term, and answering what fits.
            view = (await ask("leader"))["result"]
            assert view["leading"] and view["terms"] == 1  # type: ignore[index]
            assert view["hosts_alive"] == len(HOSTS)  # type: ignore[index]
        finally:
            await end(stop, task, door, bus)

    asyncio.run(scenario())


def test_an_answer_within_the_limit_goes_as_it_is() -> None:
    answer = msgpack.packb({"result": [1, 2, 3]})
    assert fitted("hosts", answer, len(answer)) == answer
    assert fitted("hosts", answer, 0) == answer  # a limit the server did not say
    assert "error" in msgpack.unpackb(fitted("hosts", answer, len(answer) - 1))


def test_a_tenants_answer_too_large_for_the_bus_is_a_refusal_of_the_same_request() -> None:
    """The same for a tenant's answer (its own negotiations, say): a refusal of its
    request, saying nothing of the bus, instead of a takeover."""
    reply = Reply(7, True, "x" * 400)
    assert msgpack.unpackb(tenant_answer(reply, 10_000)) == to_plain(reply)
    refused = from_plain(Reply, msgpack.unpackb(tenant_answer(reply, 100)))
    assert (refused.request, refused.ok, refused.code) == (7, False,
                                                    ErrorCode.UNAVAILABLE.value)
    assert "too large" in refused.error and "bytes" not in refused.error
