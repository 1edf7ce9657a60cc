"""region-failover: a region's leader SIGKILLed under its agents' load, several times.

A region is 100,000 hosts, each sending its summary every 30 s (3,333 sequenced frames a
second, docs/scaling.md) plus job advisories, each of which must become exactly one entry
of the tenants' feed. This benchmark puts that load on the bus and kills the leader under
it: no doors, no CurveZMQ, no agents (those scale out by adding replicas; the leader
does not).

1. One JetStream node (streams of one copy): on two shared cores three nodes would
   measure three servers' writes on one core, not a takeover (the same on one node).
2. Producer processes store agents' frames on ``HZ_AGENTS`` as doors do (a subject per
   host, each store fenced on its last position, the door's headers and message ids),
   every frame encoded before the clock: first every host's hello and first summary;
   once the leader committed those, a job placed on each of ``--jobs`` hosts and a
   snapshot taken (a region's leader takes over from a state that has its hosts), the
   load: each host's summary every ``hosts / rate`` seconds (mostly unchanged, some
   changed, some host events), and job advisories at ``--advisories`` a second over the
   job hosts. Each producer records the position and time of every acknowledgement.
3. Three leader processes (controller/bus/leader.py as a replica runs it: the lease, the
   restore from the newest snapshot and the commits after it, the fenced Commits, the
   feed) contend for the lease (``[cluster] lease``, 2 s by default), pinned to one CPU;
   the bus, the producers and this driver on the others. The driver tells the leader,
   every half second, which hosts were heard (each host once a second, in messages of
   at most 4,096 hosts, as the replicas' beats come).
4. ``--kills`` times: the lease holder (read from the lease bucket) is SIGKILLed, and
   restarted as a standby once its successor has caught up. Times are the bus's own
   (the store time JetStream gives each message): from the kill to the successor's
   lease, to its first stored Commit, to the feed's next stored entry; the backlog on
   ``HZ_AGENTS`` at the successor's first Commit (acknowledged positions not covered by
   a stored Commit) and the time until a Commit covered it.
5. At the end the leader covers every stored frame and ``HZ_FEED`` is read whole: per
   job, one entry per acknowledged advisory, numbers without hole or repeat, or it fails.

    ./scripts/bench region-failover [--hosts 100000] [--kills 5]

Last line: ``region-failover P99 s`` (kill to the successor's first stored Commit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, scratch, wait_until
from bench.load.bus import jetstream, prepare
from bench.region.leaders import (
    CANDIDATES,
    candidate,
    config,
    cpu_seconds,
    env,
    place_jobs,
    snapshot_at,
)
from bench.region.load import Plan, host_name, produce
from bench.region.watch import (
    Acks,
    Kill,
    Tally,
    Watch,
    feed_topics,
    measure,
    restore_seconds,
    summary,
    tally,
)
from controller.bus.nats import AGENTS, BEATS, Bus
from controller.config import load

#: Host names in one beat message (a replica's share of a region: 100,000 / 48).
BEAT_CHUNK = 4096
BEAT_INTERVAL = 0.5


# --- the driver ------------------------------------------------------------------------------


class Region:
    def __init__(self, args: argparse.Namespace, work: Path, url: str, *, leader_cpu: int,
                 others: set[int]) -> None:
        self.args, self.work, self.url = args, work, url
        self.leader_cpu, self.others = leader_cpu, others
        self.plan = Plan(args.hosts, args.rate or args.hosts / 30.0, args.duration, args.jobs,
                         args.advisories, args.events, args.changes)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.producers: list[tuple[subprocess.Popen[str], Path]] = []
        self.watch = Watch()
        self.load_at = math.inf
        self.nc: Any = None
        self.js: Any = None

    def start_candidate(self, name: str) -> None:
        cfg = config(self.work, self.url, name, self.args.lease, self.args.snapshot,
                     standby=self.args.standby == "warm")
        command = [sys.executable, __file__, "--candidate", str(cfg), "--mirror",
                   str(self.work / f"{name}-mirror.db")]
        if shutil.which("taskset"):
            command = ["taskset", "-c", str(self.leader_cpu), *command]
        with (self.work / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                env=env(), start_new_session=True)

    def start_producers(self) -> None:
        count = self.args.producers
        for i in range(count):
            out = self.work / f"producer-{i}.json"
            plan = json.dumps(self.plan.__dict__)
            proc = subprocess.Popen(
                [sys.executable, __file__, "--produce", self.url, "--plan", plan,
                 "--share", f"{i}/{count}", "--out", str(out)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env(),
                start_new_session=True)
            os.sched_setaffinity(proc.pid, self.others)
            self.producers.append((proc, out))

    async def say(self, word: str, answer: str | None) -> None:
        for proc, _ in self.producers:
            assert proc.stdin is not None
            proc.stdin.write(word + "\n")
            proc.stdin.flush()
        if answer is not None:
            for proc, _ in self.producers:
                assert proc.stdout is not None
                line = await asyncio.to_thread(proc.stdout.readline)
                if line.strip() != answer:
                    raise SystemExit(f"region-failover: a producer said {line.strip()!r}, "
                                     f"not {answer!r} (it exited {proc.poll()})")

    async def beat(self) -> None:
        names = [host_name(i) for i in range(self.args.hosts)]
        halves = [[msgpack.packb(names[h::2][i:i + BEAT_CHUNK])
                   for i in range(0, len(names[h::2]), BEAT_CHUNK)] for h in (0, 1)]
        turn = 0
        while True:
            for payload in halves[turn]:
                await self.nc.publish(BEATS, payload)
            turn ^= 1
            await asyncio.sleep(BEAT_INTERVAL)

    async def until(self, done: Any, limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while not done():
            self.alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"region-failover: no {what} within {limit:.0f} s")
            await asyncio.sleep(0.05)

    def alive(self) -> None:
        """A leader that exited on its own ends the run, with its log's tail."""
        for name, proc in self.procs.items():
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                tail = (self.work / f"{name}.log").read_text()[-2000:]
                raise SystemExit(f"region-failover: leader {name} exited "
                                 f"{proc.returncode}:\n{tail}")

    async def head(self) -> int:
        return (await self.js.stream_info(AGENTS)).state.last_seq

    async def run(self) -> int:
        args = self.args
        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream(timeout=30.0)
        subs = await self.watch.start(self.js)
        print(f"{args.hosts:,} hosts, {self.plan.rate:,.0f} summaries/s (each host every "
              f"{args.hosts / self.plan.rate:.0f} s), {args.advisories:g} advisories/s over "
              f"{args.jobs} jobs, {args.duration:.0f} s of load; {args.producers} producer "
              f"processes (frames encoded before the clock), three leaders on CPU "
              f"{self.leader_cpu}, nats-server and producers on CPUs {sorted(self.others)}; "
              f"lease {args.lease} s, snapshots every {args.snapshot} s, standbys "
              f"{args.standby}", flush=True)
        self.start_producers()
        began = time.monotonic()
        for proc, _ in self.producers:
            assert proc.stdout is not None
            if (await asyncio.to_thread(proc.stdout.readline)).strip() != "ready":
                raise SystemExit(f"region-failover: a producer failed ({proc.poll()})")
        print(f"frames encoded in {time.monotonic() - began:.1f} s", flush=True)
        began = time.monotonic()
        await self.say("warm", "warmed")
        warm_head = await self.head()
        print(f"warm-up: {warm_head:,} hellos and first summaries stored in "
              f"{time.monotonic() - began:.1f} s", flush=True)
        beats = asyncio.create_task(self.beat())
        began = time.monotonic()
        for name in CANDIDATES:
            self.start_candidate(name)
        await self.until(lambda: self.watch.covered() >= warm_head, args.limit,
                         "leader applying the warm-up")
        print(f"warm-up applied by {self.watch.holder()} in {time.monotonic() - began:.1f} s "
              f"(from its start)", flush=True)
        # Each placement is answered once the Commit that made it is stored.
        await place_jobs(self.nc, self.args.hosts, self.args.jobs)
        state = await self.js.stream_info("HZ_STATE")
        covered = state.state.last_seq
        began = time.monotonic()
        while await snapshot_at(self.js) < covered:
            self.alive()
            if time.monotonic() - began > args.snapshot + args.limit:
                raise SystemExit("region-failover: no snapshot of the warmed state")
            await asyncio.sleep(0.5)
        print(f"{args.jobs} jobs placed; a snapshot of the state at commit "
              f"{await snapshot_at(self.js)} (waited {time.monotonic() - began:.1f} s)",
              flush=True)
        await self.say("go", None)
        load_began, self.load_at = time.monotonic(), time.time()
        cpu0 = {name: cpu_seconds(proc.pid) for name, proc in self.procs.items()}
        kills: list[Kill] = []
        acks_live: list[tuple[float, int]] = []
        await asyncio.sleep(args.settle)
        holder = self.watch.holder()
        # The leader's own CPU under the load: how far this one core is from its ceiling.
        spent = time.monotonic() - load_began
        shares = {name: (cpu_seconds(proc.pid) - cpu0[name]) / spent
                  for name, proc in self.procs.items()}
        # The standbys share the leader's CPU here; on a region's replicas each has its own.
        others = ", ".join(f"{name} {100 * share:.0f}%" for name, share in shares.items()
                           if name != holder)
        print(f"leader {holder} under the load: {100 * shares[holder]:.0f}% of a core "
              f"({self.plan.rate + args.advisories:,.0f} frames/s stored; the machine "
              f"shared); the other candidates ({args.standby}): {others}", flush=True)
        for n in range(args.kills):
            if time.monotonic() - load_began > args.duration - args.gap - 5:
                print(f"region-failover: the load ends before kill {n + 1}: raise --duration",
                      file=sys.stderr)
                break
            victim = self.watch.holder()
            kill = Kill(victim, time.time())
            self.procs[victim].send_signal(signal.SIGKILL)
            self.procs[victim].wait()
            kills.append(kill)
            head_at_kill = await self.head()
            # Caught up: a Commit after the successor's lease that covers what was stored
            # by the kill; the exact backlog is worked out from the acks at the end.
            await self.until(lambda k=kill, h=head_at_kill: any(
                t > k.at and s >= h for t, s in self.watch.commits) and self.watch.holder()
                not in ("", k.victim), args.limit, f"successor after kill {n + 1}")
            self.start_candidate(victim)
            print(f"kill {n + 1}: {victim} killed; {self.watch.holder()} leads; caught up "
                  f"{time.time() - kill.at:.1f} s after the kill", flush=True)
            await asyncio.sleep(args.gap)
        for proc, _ in self.producers:
            await asyncio.to_thread(proc.wait)
        results = [json.loads(out.read_text()) for _, out in self.producers]
        for got in results:
            acks_live += [tuple(pair) for pair in got["acks"]]
        acks = Acks.of(acks_live)
        final = acks.seqs[-1] if acks.seqs else 0
        await self.until(lambda: self.watch.covered() >= final, args.limit,
                         "Commit covering every stored frame")
        await asyncio.sleep(2.0)  # a duplicate would be stored by now
        beats.cancel()
        for sub in subs:
            await sub.unsubscribe()
        for kill in kills:
            measure(kill, self.watch, acks)
            kill.restore, kill.began = restore_seconds(
                (self.work / f"{kill.successor}.log").read_text(),
                kill.at) if kill.successor else (math.nan, "")
        counted, entries = await self.check(results)
        return self.report(kills, results, acks, counted=counted, entries=entries)

    async def check(self, results: list[dict[str, Any]]) -> tuple[Tally, int]:
        """Per job: acknowledged advisories against HZ_FEED's entries for the job."""
        acked: Counter[str] = Counter()
        for got in results:
            acked.update(got["advisories"])
        cfg, _ = load(config(self.work, self.url, "check", self.args.lease, 3600))
        bus = Bus(cfg.cluster)
        await bus.connect()
        try:
            numbers, advisories = await feed_topics(bus)
        finally:
            await bus.close()
        return tally(acked, numbers, advisories), sum(map(len, advisories.values()))

    def report(self, kills: list[Kill], results: list[dict[str, Any]], acks: Acks, *,
               counted: Tally, entries: int) -> int:
        frames = sum(g["frames"] for g in results)
        wall = max(g["wall"] for g in results)
        failed = sum(g["failed"] for g in results)
        advised = sum(sum(g["advisories"].values()) for g in results)
        print(f"load: {frames:,} frames in {wall:.1f} s = {frames / wall:,.0f} frames/s "
              f"(producers at most {max(g['late'] for g in results):.2f} s behind their "
              f"schedule; {failed} stores not acknowledged)", flush=True)
        for n, kill in enumerate(kills, start=1):
            print(kill.line(n, self.plan.rate), flush=True)
        print(summary(kills, [acks.head(t) - s for t, s in self.watch.commits
                              if t > self.load_at]), flush=True)
        print(f"{advised:,} advisories acknowledged, {entries:,} advisories in HZ_FEED: "
              f"lost {counted.lost}, duplicates {counted.duplicates} ({counted.stored_twice} "
              f"entries stored twice, {counted.numbered_twice} advisories numbered twice)",
              flush=True)
        times = [k.commit for k in kills]
        if counted.lost or counted.duplicates or any(math.isnan(t) for t in times) or not times:
            print("region-failover: acknowledged advisories lost or duplicated, or a kill "
                  "without a successor", file=sys.stderr)
            return 1
        print(f"region-failover {percentile(times, 99):.2f} s")
        return 0

    def stop(self) -> None:
        for proc in [*self.procs.values(), *(p for p, _ in self.producers)]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.procs.values(), *(p for p, _ in self.producers)]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="summaries a second (default: every host every 30 s)")
    parser.add_argument("--jobs", type=int, default=100, help="jobs, each on one host")
    parser.add_argument("--advisories", type=float, default=30.0,
                        help="job advisories a second, over the jobs' hosts")
    parser.add_argument("--events", type=float, default=0.02, help="share of host events")
    parser.add_argument("--changes", type=float, default=0.05,
                        help="share of changed summaries")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--standby", choices=("warm", "cold"), default="warm",
                        help="replicas not leading keep the state as it is written "
                        "([cluster] warm_standby), or take over from the snapshot")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--snapshot", type=float, default=60.0,
                        help="[cluster] snapshot_interval")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds of load before the first kill")
    parser.add_argument("--gap", type=float, default=8.0,
                        help="seconds between a successor's catching up and the next kill")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="seconds of load (default: enough for the kills)")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--limit", type=float, default=300.0,
                        help="seconds any one step may take before the run fails")
    parser.add_argument("--candidate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mirror", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--produce", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--share", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.candidate is not None:
        candidate(args.candidate, args.mirror)
        return 0
    if args.produce is not None:
        i, count = (int(x) for x in args.share.split("/"))
        plan = Plan(**json.loads(args.plan))
        produce(args.produce, plan, list(range(i, plan.hosts, count)), 1000 + i, args.out)
        return 0
    if (min(args.hosts, args.jobs, args.kills, args.producers) < 1 or args.jobs > args.hosts
            or args.rate < 0 or args.advisories <= 0 or args.lease < 0.5):
        raise SystemExit("region-failover: --hosts, --jobs (at most --hosts), --kills and "
                         "--producers at least 1, --advisories above 0, --lease 0.5 s or more")
    if not args.duration:
        args.duration = args.settle + args.kills * (args.gap + 4 * args.lease + 10) + 10
    cpus = sorted(os.sched_getaffinity(0))
    leader_cpu, others = cpus[0], set(cpus[1:]) or {cpus[0]}
    with scratch() as work:
        server, url = jetstream(work)
        region = Region(args, work, url, leader_cpu=leader_cpu, others=others)
        try:
            os.sched_setaffinity(server.pid, others)
            os.sched_setaffinity(0, others)
            wait_until(lambda: server.poll() is not None or
                       b"Server is ready" in (work / "nats.log").read_bytes(), 30)
            asyncio.run(prepare(config(work, url, "prepare", args.lease, args.snapshot)))
            return asyncio.run(region.run())
        finally:
            region.stop()
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
