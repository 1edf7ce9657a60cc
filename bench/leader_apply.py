"""Leader apply: sequenced frames a second through the bus and the cluster's leader.

What a region's single leader must keep up with is every sequenced frame its agents send
(docs/scaling.md: 3,333 a second for 100,000 hosts at the default summary refresh). This
benchmark measures that alone: no doors, no CurveZMQ, no agents.

1. One JetStream node (nats-server, streams of one copy) on the CPUs the leader does not
   use. Producer processes, on those CPUs too, store agents' frames on ``HZ_AGENTS`` as
   a replica's door does (one subject per host, each store fenced on the subject's last
   position, the door's headers and message ids): per host a hello, then sequenced
   frames, mostly its summary sent again unchanged (the periodic refresh), some changed,
   some host events. Every frame is encoded before the clock starts; each producer
   prints the frames it stored a second and the CPU it used.
2. The leader (controller/bus/leader.py, as a replica runs it: the lease, the restore,
   the reading, the core, the fenced Commits, the mirror) runs in its own process pinned
   to one CPU (``taskset``), from an empty state, and applies the stored frames; a beat
   process tells it every half second that all hosts were heard, as replicas do. The
   rate is the agents' stream positions covered by stored Commits, over ``--window``
   seconds or to the stream's end, counted from when every host's hello and first
   summary are applied (in large batches whatever the variant: a region's leader
   takes over from a state that has them), a second and a second of the leader's CPU.
3. Variants run interleaved, round after round, over the same stored frames, each from a
   fresh state (the commit log, the feed and the snapshots emptied): ``--batch`` frames
   under one Commit at most, and 1 (a Commit per frame, the path before batching).

The last line is ``leader-apply N frames/s``, N the median of the batched variant's runs;
before it, each variant's runs, its median and spread, and the ratio per round.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack
import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import scratch, wait_until
from bench.load.bus import jetstream, prepare
from controller.bus.leader import Leader
from controller.bus.nats import Bus
from controller.config import load
from harmonaize import messages as m
from harmonaize.messages import encode

EPOCH = 1
BEAT_INTERVAL = 0.5
#: Hosts a beat names at most: a replica's doors' worth (docs/scaling.md: 2,500 agents a
#: replica core); 100,000 hosts in one beat would pass the bus's 1 MB message limit.
BEAT_SHARE = 2500
#: Stores in flight per producer (each host's next store waits for its last one's answer).
IN_FLIGHT = 256


def host_name(index: int) -> str:
    return f"apply-{index:06d}"


def frames_of(host: str, count: int, rng: random.Random, events: float,
              changes: float) -> list[tuple[int, bytes]]:
    """A host's hello and ``count`` sequenced frames, encoded: (its seq, the frame)."""
    out = [(0, encode(m.Hello(pool="scale", gpu_class="H200", gpus=8, version="bench",
                              epoch=EPOCH, acked=0, heartbeat=1.0), sender=host))]
    healthy = 8
    for seq in range(1, count + 1):
        draw = rng.random()
        if draw < events:
            body: m.Message = m.HostEvent("BenchEvent", m.Severity.INFO, f"event {seq}")
        else:
            if draw < events + changes:
                healthy = 15 - healthy  # 8 and 7 in turn: a GPU out, then back
            body = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=healthy,
                                                                      suspect=8 - healthy))
        out.append((seq, encode(body, sender=host, seq=seq)))
    return out


def produce(url: str, hosts: list[str], count: int, seed: int, *, events: float,
            changes: float, cpus: set[int], conn: Connection) -> None:
    """Store every host's frames, in each host's order, fenced as a door stores them."""
    os.sched_setaffinity(0, cpus)
    rng = random.Random(seed)
    frames = {host: frames_of(host, count, rng, events, changes) for host in hosts}

    async def run() -> dict[str, float]:
        nc = await nats.connect(url)
        js = nc.jetstream(timeout=30.0)
        last = dict.fromkeys(hosts, 0)
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def store(host: str, seq: int, frame: bytes) -> None:
            head = {"Nats-Expected-Last-Subject-Sequence": str(last[host]), "hz-host": host,
                    "hz-epoch": str(EPOCH), "hz-seq": str(seq)}
            if seq:
                head["Nats-Msg-Id"] = f"{host}:{EPOCH}:{seq}"
            async with gate:
                ack = await js.publish(f"hz.agents.{host}", frame, headers=head)
            last[host] = ack.seq

        cpu, began = time.process_time(), time.monotonic()
        for index in range(count + 1):  # round by round: every host's next frame
            await asyncio.gather(*(store(host, *frames[host][index]) for host in hosts))
        wall = time.monotonic() - began
        await nc.close()
        return {"frames": len(hosts) * (count + 1), "wall": wall,
                "cpu": time.process_time() - cpu}

    conn.send(asyncio.run(run()))


def beat(url: str, hosts: list[str], cpus: set[int], conn: Connection) -> None:
    """Every half second, that every host was heard (replicas' word to their leader): a
    beat per ``BEAT_SHARE`` hosts, as each replica names the hosts at its doors."""
    os.sched_setaffinity(0, cpus)

    async def run() -> None:
        nc = await nats.connect(url)
        payloads = [msgpack.packb(hosts[i:i + BEAT_SHARE])
                    for i in range(0, len(hosts), BEAT_SHARE)]
        while not conn.poll():
            for payload in payloads:
                await nc.publish("hz.beats", payload)
            await asyncio.sleep(BEAT_INTERVAL)
        await nc.close()

    asyncio.run(run())


# --- the leader's process -------------------------------------------------------------------


def lead(cfg_path: Path, mirror: Path, *, batch: int, window: float, start: int,
         end: int, profile: Path | None = None) -> None:
    """Run the leader until it committed ``end`` or ``window`` seconds after it committed
    ``start``; print what it did as one JSON line. ``profile``: cProfile's statistics of
    the measured part (from the clock's start), written there."""
    cfg, _ = load(cfg_path)
    profiler = cProfile.Profile() if profile is not None else None

    async def run() -> dict[str, Any]:
        bus = Bus(cfg.cluster)
        await bus.connect()
        # The hellos are applied in large batches whatever the variant (one at a time,
        # each one's new host makes the core look at every host again); the variant's
        # batch size is set once they are committed, before the clock starts.
        leader = Leader(cfg, bus, await bus.epoch(), mirror, max_batch=max(batch, 2048))
        stop = asyncio.Event()
        task = asyncio.create_task(leader.run(stop))
        # Every host's hello and first summary: a minute, or more for a large region.
        await waiting(lambda: leader.committed >= start, task, "the hellos applied",
                      limit=max(60.0, start / 1000))
        leader.max_batch = batch
        # A batch taken before the switch may be in flight: the clock starts after it.
        switched = leader.commits
        # (A small run may have nothing left after it: then the clock finds it done.)
        await waiting(lambda: leader.commits >= switched + 2 or leader.committed >= end, task,
                      "the switch")
        if profiler is not None:
            profiler.enable()
        t0, cpu0, at0, commits0 = (time.monotonic(), time.process_time(), leader.committed,
                                   leader.commits)
        while leader.committed < end and time.monotonic() - t0 < window:
            await asyncio.sleep(0.002)
        elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile))
        frames, commits = leader.committed - at0, leader.commits - commits0
        reused = leader._frames.reused
        stop.set()
        await waiting(task.done, task, "the leader's stop")
        await bus.close()
        return {"frames": frames, "seconds": elapsed, "cpu": cpu, "commits": commits,
                "reused": reused}

    print(json.dumps(asyncio.run(run())), flush=True)


async def waiting(done: Any, task: asyncio.Task[None], what: str, limit: float = 60.0) -> None:
    """Until ``done()``; a leader that stopped, or no end within ``limit`` seconds, ends
    the run with what every task was doing."""
    deadline = time.monotonic() + limit
    while not done():
        if task.done() and task.exception() is not None:
            raise SystemExit(f"the leader stopped: {task.exception()!r}")
        if time.monotonic() > deadline:
            for each in asyncio.all_tasks():
                each.print_stack(file=sys.stderr)
            raise SystemExit(f"no end to {what} within {limit:.0f} s")
        await asyncio.sleep(0.002)


# --- the driver ------------------------------------------------------------------------------


async def reset(url: str) -> None:
    """A fresh start for the next leader: no commits, no feed, no snapshot, no lease."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for stream in ("HZ_STATE", "HZ_FEED", "OBJ_hz-snapshots"):
            await js.purge_stream(stream)
        kv = await js.key_value("hz-leases")
        await kv.purge("leader")
    finally:
        await nc.close()


def run_leader(cfg_path: Path, work: Path, *, cpu: int, batch: int, window: float,
               start: int, end: int, n: int, profile: Path | None = None) -> dict[str, Any]:
    mirror = work / f"leader-{n}.db"
    command = [sys.executable, __file__, "--lead", str(cfg_path), "--mirror", str(mirror),
               "--batch", str(batch), "--window", str(window), "--start", str(start),
               "--end", str(end)]
    if profile is not None:
        command += ["--profile", str(profile)]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(cpu), *command]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=window + 120 + start / 1000, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"the leader's run did not end: {str(exc.stderr or '')[-2000:]}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the leader's run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):,.0f} "
            f"(min {min(values):,.0f}, max {max(values):,.0f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4000)
    parser.add_argument("--frames", type=int, default=25, help="sequenced frames per host")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2048, help="frames under one Commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=6.0, help="seconds measured per run")
    parser.add_argument("--events", type=float, default=0.02, help="share of host events")
    parser.add_argument("--changes", type=float, default=0.05, help="share of changed summaries")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics of the "
                        "batched variant's leader (its measured part) to PATH.N, N the run")
    parser.add_argument("--lead", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mirror", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lead is not None:
        lead(args.lead, args.mirror, batch=args.batch, window=args.window, start=args.start,
             end=args.end, profile=args.profile)
        return 0
    if min(args.hosts, args.producers, args.batch, args.rounds) < 1 or args.frames < 2:
        raise SystemExit("leader-apply: --hosts, --producers, --batch and --rounds must be at "
                         "least 1, --frames at least 2")
    cpus = sorted(os.sched_getaffinity(0))
    leader_cpu, others = cpus[0], set(cpus[1:]) or {cpus[0]}
    if len(cpus) < 2:
        print("leader-apply: one CPU only: the leader shares it with the bus", flush=True)
    with scratch() as work:
        server, url = jetstream(work)
        try:
            os.sched_setaffinity(server.pid, others)
            wait_until(lambda: server.poll() is not None or
                       b"Server is ready" in (work / "nats.log").read_bytes(), 30)
            return drive(args, work, url, leader_cpu=leader_cpu, others=others, server=server)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=10)


def drive(args: argparse.Namespace, work: Path, url: str, *, leader_cpu: int,
          others: set[int], server: subprocess.Popen[bytes]) -> int:
    cfg = work / "controller.toml"
    cfg.write_text(
        f'[controller]\ndatabase = "{work / "c.db"}"\nlog_level = "warning"\n'
        '[pools]\nnames = ["scale"]\ngpu_classes = ["H200"]\n'
        f'[cluster]\nenabled = true\nreplica = "bench"\nservers = ["{url}"]\n'
        'stream_replicas = 1\nsnapshot_interval = 3600\n')
    asyncio.run(prepare(cfg))
    hosts = [host_name(i) for i in range(args.hosts)]
    shares = [hosts[i::args.producers] for i in range(args.producers)]
    print(f"storing {args.hosts} hosts x ({args.frames} frames + a hello) = "
          f"{args.hosts * (args.frames + 1):,} frames with {args.producers} producer "
          f"processes (pre-encoded; CPUs {sorted(others)})", flush=True)
    pipes, procs = [], []
    for i, share in enumerate(shares):
        ours, theirs = mp.Pipe()
        proc = mp.Process(target=produce, args=(url, share, args.frames, 1000 + i), kwargs={
            "events": args.events, "changes": args.changes, "cpus": others, "conn": theirs},
            daemon=True)
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    for i, (pipe, proc) in enumerate(zip(pipes, procs, strict=True)):
        got = pipe.recv()
        proc.join()
        print(f"producer {i}: {got['frames']:,} frames stored in {got['wall']:.1f} s "
              f"({got['frames'] / got['wall']:,.0f} frames/s), its CPU {got['cpu']:.1f} s "
              f"({100 * got['cpu'] / got['wall']:.0f}% of a core)", flush=True)
    end = args.hosts * (args.frames + 1)
    ours, theirs = mp.Pipe()
    beater = mp.Process(target=beat, args=(url, hosts, others, theirs), daemon=True)
    beater.start()
    variants = [args.batch, 1] if args.batch != 1 else [1]
    rates: dict[int, list[float]] = {v: [] for v in variants}  # per leader CPU second
    walls: dict[int, list[float]] = {v: [] for v in variants}  # per second
    ratios: list[float] = []
    n = 0
    server_cpu = 0.0
    try:
        for round_ in range(1, args.rounds + 1):
            for batch in variants:
                asyncio.run(reset(url))
                n += 1
                cpu0 = cpu_seconds(server.pid)
                profile = (args.profile.with_name(f"{args.profile.name}.{n}")
                           if args.profile is not None and batch == variants[0] else None)
                got = run_leader(cfg, work, cpu=leader_cpu, batch=batch, window=args.window,
                                 start=2 * args.hosts, end=end, n=n, profile=profile)
                server_cpu = cpu_seconds(server.pid) - cpu0
                if not got["frames"] or not got["seconds"]:
                    raise SystemExit("leader-apply: nothing was left to measure after the "
                                     "hellos: give it more hosts or --frames")
                rate = got["frames"] / got["seconds"]
                per_cpu = got["frames"] / max(got["cpu"], 1e-9)
                rates[batch].append(per_cpu)
                walls[batch].append(rate)
                print(f"round {round_}, batch {batch}: {got['frames']:,} frames in "
                      f"{got['seconds']:.2f} s = {rate:,.0f} frames/s, {per_cpu:,.0f} per "
                      f"second of the leader's CPU; {got['commits']:,} "
                      f"commits ({got['frames'] / max(1, got['commits']):.0f} frames each); "
                      f"leader CPU {100 * got['cpu'] / got['seconds']:.0f}% of CPU {leader_cpu}; "
                      f"nats-server {server_cpu:.1f} CPU s; summaries reused "
                      f"{got['reused']:,}", flush=True)
            if len(variants) == 2:
                ratios.append(rates[variants[0]][-1] / rates[variants[1]][-1])
    finally:
        theirs.close()
        ours.send("stop")
        beater.join(timeout=5)
    for batch in variants:
        print(f"batch {batch}: {spread(walls[batch])} frames/s; {spread(rates[batch])} frames "
              f"per second of the leader's CPU (one core of its own); {len(rates[batch])} runs",
              flush=True)
    if ratios:
        print(f"batch {variants[0]} / batch 1 (per CPU second): "
              f"{statistics.median(ratios):.1f}x (min {min(ratios):.1f}x, "
              f"max {max(ratios):.1f}x), runs interleaved", flush=True)
    # The figure is per second of the leader's CPU: on a machine shared with other work
    # its process is not always running, and the bus is on the other CPUs.
    print(f"leader-apply {statistics.median(rates[variants[0]]):.0f} frames/s")
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
