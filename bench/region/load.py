"""A region's agents as producers: every host's frames encoded before the clock, then
stored on ``HZ_AGENTS`` as a replica's door stores them (a subject per host, each store
fenced on its last position, the door's headers and message ids), on a schedule: each
host's summary every ``hosts / rate`` seconds, job advisories from the jobs' hosts.
Every acknowledgement's time and stream position is recorded: what was stored is
counted from those, not from anyone's word.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from harmonaize import messages as m
from harmonaize.messages import encode

EPOCH = 1
#: Stores in flight per producer.
IN_FLIGHT = 256
#: A job's ranks on its host; the advisories name them in turn.
RANKS = 8


def host_name(index: int) -> str:
    return f"region-{index:06d}"


def job_name(index: int) -> str:
    return f"job-{index:04d}"


def job_hosts(hosts: int, jobs: int) -> list[int]:
    """The host index each job is placed on, spread over the region."""
    return [j * hosts // jobs for j in range(jobs)]


# --- producers -------------------------------------------------------------------------------


@dataclass
class Plan:
    hosts: int
    rate: float
    duration: float
    jobs: int
    advisories: float
    events: float
    changes: float


def schedule(plan: Plan, mine: list[int], seed: int) -> list[tuple[float, str, int, bytes, str]]:
    """This producer's load, encoded: (seconds after the start, host, seq, frame, job or
    "") in time order. Seq 0 and 1 (hello, first summary) are the warm-up's."""
    rng = random.Random(seed)
    refresh = plan.hosts / plan.rate
    on_job = {h: job_name(j) for j, h in enumerate(job_hosts(plan.hosts, plan.jobs))}
    every = plan.jobs / plan.advisories if plan.advisories > 0 else math.inf
    out: list[tuple[float, str, int, bytes, str]] = []
    for index in mine:
        host = host_name(index)
        times: list[tuple[float, str]] = []
        t = (index / plan.hosts) * refresh
        while t < plan.duration:
            times.append((t, ""))
            t += refresh
        if index in on_job:
            t = (sorted(on_job).index(index) / plan.jobs) * every
            while t < plan.duration:
                times.append((t, on_job[index]))
                t += every
        times.sort()
        healthy = 8
        for seq, (at, job) in enumerate(times, start=2):
            if job:
                rank = str(seq % RANKS)
                body: m.Message = m.JobAdvisory(job, m.Advice.CHECKPOINT_NOW, "thermal",
                                                m.Urgency.ELEVATED, (rank,))
            else:
                draw = rng.random()
                if draw < plan.events:
                    body = m.HostEvent("BenchEvent", m.Severity.INFO, f"event {seq}")
                else:
                    if draw < plan.events + plan.changes:
                        healthy = 15 - healthy  # a GPU out, then back
                    body = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(
                        healthy=healthy, suspect=8 - healthy))
            out.append((at, host, seq, encode(body, sender=host, seq=seq), job))
    out.sort(key=lambda item: item[0])
    return out


def warm_frames(host: str) -> list[tuple[int, bytes]]:
    return [(0, encode(m.Hello(pool="scale", gpu_class="H200", gpus=8, version="bench",
                               epoch=EPOCH, acked=0, heartbeat=1.0), sender=host)),
            (1, encode(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8)),
                       sender=host, seq=1))]


def produce(url: str, plan: Plan, mine: list[int], seed: int, out: Path) -> None:
    """Warm-up on "warm" from stdin, the load on "go"; what was acknowledged, to ``out``."""
    hosts = [host_name(i) for i in mine]
    warm = {host: warm_frames(host) for host in hosts}
    load = schedule(plan, mine, seed)
    print("ready", flush=True)

    async def run() -> dict[str, Any]:
        nc = await nats.connect(url, max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=10.0)
        last = dict.fromkeys(hosts, 0)
        gate = asyncio.Semaphore(IN_FLIGHT)
        acks: list[tuple[float, int]] = []
        acked: Counter[str] = Counter()
        failed = 0

        async def store(host: str, seq: int, frame: bytes, job: str,
                        before: asyncio.Task[None] | None) -> None:
            nonlocal failed
            if before is not None:
                await before  # a host's frames in its order, each fenced on the last
            head = {"Nats-Expected-Last-Subject-Sequence": str(last[host]), "hz-host": host,
                    "hz-epoch": str(EPOCH), "hz-seq": str(seq)}
            if seq:
                head["Nats-Msg-Id"] = f"{host}:{EPOCH}:{seq}"
            async with gate:
                for _ in range(5):  # a door resends under the same id: stored once
                    try:
                        ack = await js.publish(f"hz.agents.{host}", frame, headers=head)
                        break
                    except Exception:  # a timeout, a reconnect: again
                        await asyncio.sleep(0.2)
                else:
                    failed += 1
                    return
            last[host] = ack.seq
            acks.append((time.time(), ack.seq))
            if job:
                acked[job] += 1

        line = await asyncio.to_thread(sys.stdin.readline)
        assert line.strip() == "warm"
        for index in range(2):
            await asyncio.gather(*(store(h, *warm[h][index], "", None) for h in hosts))
        print("warmed", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        assert line.strip() == "go"
        pending: dict[str, asyncio.Task[None]] = {}
        began, late = time.monotonic(), 0.0
        for at, host, seq, frame, job in load:
            now = time.monotonic() - began
            if at > now:
                await asyncio.sleep(at - now)
            else:
                late = max(late, now - at)
            pending[host] = asyncio.create_task(store(host, seq, frame, job,
                                                      pending.get(host)))
        await asyncio.gather(*pending.values())
        await nc.close()
        return {"acks": acks, "advisories": dict(acked), "failed": failed, "late": late,
                "frames": len(load), "wall": time.monotonic() - began}

    out.write_text(json.dumps(asyncio.run(run())))
