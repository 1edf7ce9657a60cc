"""A replica's door takes a heartbeat on the fast path (controller/replicadoors.py:
``_beat``) only when the full way would have judged it a beat at once: from the host
its door is for, on the connection that said hello, with nothing of the host's queued
or in flight. Everything else, a lookalike included, goes the full way, in the host's
order. Real ZeroMQ sockets on loopback; the bus is never reached (no door's task runs,
so what the full way queued stays queued for the test to see)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import zmq
import zmq.asyncio

from controller.bus.ingest import HostLog
from controller.replicadoors import AgentDoors, Door
from harmonaize import messages as m
from harmonaize.messages import encode
from tests.controller.test_heartbeat_fast_path import beat

pytestmark = pytest.mark.cluster


class Doors(AgentDoors):
    """The doors alone, as a replica holds them."""

    def __init__(self, router: zmq.asyncio.Socket) -> None:
        self.router, self.zap = router, None
        self.doors: dict[str, Door] = {}
        self.ingest_stats = dict.fromkeys(("stored", "fenced", "failed", "rejected",
                                           "answered", "beats"), 0)
        self._heard: set[str] = set()
        self._failure_logged = 0.0


def test_only_a_beat_the_full_way_would_take_at_once_takes_the_fast_path() -> None:
    async def scenario() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        agents = []
        for routing_id in (b"conn-1", b"conn-2"):
            agent = ctx.socket(zmq.DEALER)
            agent.setsockopt(zmq.ROUTING_ID, routing_id)
            agent.connect(f"tcp://127.0.0.1:{port}")
            agents.append(agent)
        doors = Doors(router)
        door = doors.doors["h1"] = Door("h1", conn=b"conn-1", log=HostLog(1, 5, 10))
        reading = asyncio.create_task(doors._frames(router))

        async def send(agent: zmq.asyncio.Socket, frame: bytes) -> None:
            seen = sum(doors.ingest_stats.values()) + door.frames.qsize()
            await agent.send(frame)
            for _ in range(500):
                if sum(doors.ingest_stats.values()) + door.frames.qsize() > seen:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the door never took the frame")

        try:
            heartbeat = encode(m.Heartbeat(uptime=3.0, last_seq=5), sender="h1")
            await send(agents[0], heartbeat)
            assert doors._heard == {"h1"} and doors.ingest_stats["beats"] == 1
            assert door.frames.empty()
            # A lookalike (a field too many) goes the full way: queued for the host.
            await send(agents[0], beat(sender="h1", extra={"more": 1}))
            assert door.frames.qsize() == 1
            # With a frame of the host's queued, a heartbeat waits its turn behind it.
            await send(agents[0], heartbeat)
            assert door.frames.qsize() == 2 and doors.ingest_stats["beats"] == 1
            while not door.frames.empty():
                door.frames.get_nowait()
            # One in flight (being stored): the same.
            door.busy = True
            await send(agents[0], heartbeat)
            assert door.frames.qsize() == 1 and doors.ingest_stats["beats"] == 1
            door.busy = False
            door.frames.get_nowait()
            # Another connection than the one that said hello: the full way (a resync).
            await send(agents[1], heartbeat)
            assert door.frames.qsize() == 1 and doors.ingest_stats["beats"] == 1
            door.frames.get_nowait()
            # A host with no door here yet: the full way makes it one.
            doors._heard.clear()
            await send(agents[0], encode(m.Heartbeat(uptime=3.0, last_seq=5), sender="h2"))
            assert "h2" in doors.doors and doors._heard == set()
            doors.doors["h2"].task.cancel()  # type: ignore[union-attr]
            # And the common case again.
            await send(agents[0], heartbeat)
            assert doors._heard == {"h1"} and doors.ingest_stats["beats"] == 2
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            for sock in (router, *agents):
                sock.close(0)
            ctx.term()

    asyncio.run(scenario())
