"""A probe agent for cluster tests: the real uplink (outbox, spool, failover), sending a
host summary and then ``--count`` job advisories, one per rank number, at ``--rate``.

It records what the controller acknowledged, as the agent's outbox sees it: a JSON line
per advisory acknowledged, ``{"n": N, "seq": S}``, so a test can tell an acknowledged
event from one that was still in flight when something was killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import zmq.asyncio

from agent.config import ControllerSection
from agent.spool import Spool
from agent.uplink import Uplink
from harmonaize import keys
from harmonaize.messages import (
    Advice,
    GpuCounts,
    Health,
    Hello,
    HostSummary,
    JobAdvisory,
    Urgency,
)


async def main(args: argparse.Namespace) -> None:
    cfg = ControllerSection(endpoint=args.endpoint[0], endpoints=tuple(args.endpoint),
                            heartbeat=0.25, ack_timeout=0.5, failover=args.failover,
                            spool=True)
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    epoch = int(time.time() * 1e6)
    ctx = zmq.asyncio.Context()
    uplink = Uplink(
        ctx, cfg, args.host,
        lambda acked: Hello(pool=args.pool, gpu_class="H200", gpus=8, version="probe",
                            epoch=epoch, acked=acked, heartbeat=cfg.heartbeat),
        spool=Spool(state / "spool.db", args.host),
        curve=(keys.load_pair(args.key), keys.load_public(args.server_key)))
    sent: dict[int, int] = {}  # seq -> the rank named

    def rank(n: int) -> str:
        named = args.first + n * args.step
        return str(named % args.ranks if args.ranks else named)

    taken = uplink.outbox.take

    def take(now: float) -> tuple[int, object] | None:
        item = taken(now)
        if item is not None and isinstance(item[1], JobAdvisory):
            sent[item[0]] = int(item[1].ranks[0])
        return item

    uplink.outbox.take = take  # type: ignore[method-assign]
    uplink.connect()
    stop = asyncio.Event()
    runner = asyncio.create_task(uplink.run(stop))

    def ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            print(f"probe agent: the uplink stopped: {task.exception()!r}", flush=True)

    runner.add_done_callback(ended)
    uplink.publish(HostSummary(Health.HEALTHY, True, GpuCounts(healthy=8)))
    with Path(args.record).open("a") as record:
        told = 0
        began = time.monotonic()
        n = 0
        halt = Path(f"{args.record}.halt")  # made by a caller: send no more, drain, end
        count = args.count
        while True:
            now = time.monotonic()
            if count > n and halt.exists():
                count = n
            while n < count and n <= (now - began) * args.rate:
                uplink.publish(JobAdvisory(args.job, Advice.CHECKPOINT_NOW, "thermal",
                                           Urgency.ELEVATED, (rank(n),)))
                n += 1
            acked = uplink.outbox.acked
            for seq in sorted(s for s in sent if s <= acked):
                record.write(json.dumps({"n": sent.pop(seq), "seq": seq, "at": time.time()})
                             + "\n")
                told += 1
            record.flush()
            status = {**uplink.status(), "queued": len(uplink.outbox), "acked": acked,
                      "told": told, "generated": n,
                      "progress_age": time.monotonic() - uplink._progress_at,
                      "down_age": None if uplink._down_since is None
                      else time.monotonic() - uplink._down_since,
                      "need_hello": uplink._need_hello}
            Path(f"{args.record}.status").write_text(json.dumps(status))
            if n >= count and not len(uplink.outbox) and not sent:
                break
            await asyncio.sleep(0.02)
    stop.set()
    await runner
    uplink.close()
    ctx.term()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--pool", default="p")
    parser.add_argument("--job", required=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--first", type=int, default=0, help="the first rank named")
    parser.add_argument("--step", type=int, default=1, help="between the ranks named")
    parser.add_argument("--ranks", type=int, default=0,
                        help="names ranks modulo this (0: never again the same)")
    parser.add_argument("--endpoint", action="append", required=True)
    parser.add_argument("--failover", type=float, default=2.0)
    parser.add_argument("--key", required=True)
    parser.add_argument("--server-key", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--record", required=True)
    asyncio.run(main(parser.parse_args()))
