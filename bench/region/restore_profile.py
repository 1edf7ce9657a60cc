"""A takeover's restore without the bus, timed and profiled: a mirror of ``hosts`` hosts
(hello and first summary each, applied by the core as the leader applies them), a
snapshot of it, then ``seconds`` of region-failover's load applied as Commits; the
restore opens the snapshot, replays the Commits' bytes into it, loads the state and
builds the core, as Leader.take_over does after fetching.

    .venv/bin/python -m bench.region.restore_profile [--hosts 100000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import random
import shutil
import time
from pathlib import Path

from bench.common import scratch
from bench.region.leaders import config
from bench.region.load import Plan, host_name, schedule, warm_frames
from controller.bus import codec
from controller.bus.frames import FrameReader
from controller.bus.leader import peer_of
from controller.config import ControllerConfig, load
from controller.core import ControllerCore
from controller.outputs import AgentPeer, Commit
from controller.store import Store


def build(cfg: ControllerConfig, work: Path, hosts: int, seconds: float) -> list[bytes]:
    """The snapshot (work/snap.db) and the Commits after it, as the bus holds them."""
    store = Store(work / "mirror.db", durable=False)
    core = ControllerCore(cfg, time.monotonic(), store.restored(), rng=random.Random(1),
                          wall=time.time())
    reader, logged = FrameReader(), []

    def apply(frames: list[tuple[str, bytes]], keep: bool) -> None:
        now, wall = time.monotonic(), time.time()
        outputs = []
        for host, data in frames:
            outputs += core.receive(AgentPeer(peer_of(host), host), reader.read(host, data),
                                    now)
        for out in [*outputs, *core.tick(now, wall)]:
            if isinstance(out, Commit):
                store.commit(out.writes)
                if keep:
                    logged.append(codec.encode(codec.Commit(out.writes, 0)))

    warm = [(host_name(i), f) for i in range(hosts) for _, f in warm_frames(host_name(i))]
    for i in range(0, len(warm), 2048):
        apply(warm[i:i + 2048], False)
    store.db.execute("VACUUM INTO ?", (str(work / "snap.db"),))
    load_ = schedule(Plan(hosts, hosts / 30, seconds, 100, 30.0, 0.02, 0.05),
                     list(range(hosts)), 7)
    frames = [(host, frame) for _, host, _, frame, _ in load_]
    for i in range(0, len(frames), 2048):
        apply(frames[i:i + 2048], True)
    store.close()
    return logged


def restore(cfg: ControllerConfig, work: Path, logged: list[bytes]) -> str:
    shutil.copy(work / "snap.db", work / "restore.db")
    t0 = time.perf_counter()
    store = Store(work / "restore.db", durable=False)
    for seq, data in enumerate(logged, start=1):
        commit = codec.decode(data)
        store.commit(commit.writes, meta={"bus_commit_seq": seq,
                                          "bus_agents_seq": commit.agents_seq})
    t1 = time.perf_counter()
    restored = store.restored()
    t2 = time.perf_counter()
    core = ControllerCore(cfg, time.monotonic(), restored, rng=random.Random(),
                          wall=time.time())
    for host in list(core.cluster.hosts):
        core.cluster.bind(peer_of(host), host)
    t3 = time.perf_counter()
    store.close()
    return (f"replay {t1 - t0:.2f} s, load {t2 - t1:.2f} s, core {t3 - t2:.2f} s, "
            f"total {t3 - t0:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # hosts the core counts down while building
    with scratch() as work:
        cfg, _ = load(config(work, "nats://127.0.0.1:1", "profile", 2.0, 60.0))
        logged = build(cfg, work, args.hosts, args.seconds)
        print(f"{args.hosts:,} hosts; {len(logged)} commits, {sum(map(len, logged)):,} "
              f"bytes; snapshot {(work / 'snap.db').stat().st_size:,} bytes", flush=True)
        for _ in range(2):
            print(restore(cfg, work, logged), flush=True)
        profile = cProfile.Profile()
        profile.runcall(restore, cfg, work, logged)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
