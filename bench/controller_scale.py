"""Controller scale: how many agents at 1 Hz one controller sustains on one core.

The controller runs pinned to CPU 0 (its ZeroMQ I/O thread too, so CurveZMQ
decryption counts); simulated agents run in generator processes pinned to
the other CPUs. Each simulated agent is one DEALER connection with its own
CurveZMQ key, speaking the real protocol: a hello, a heartbeat every second,
its host summary (sequenced, acknowledged) every ``--refresh`` seconds as the
real agent's periodic refresh. Twenty probe agents also send one sequenced
host event per second and time its acknowledgement, which is committed to
SQLite before it is sent.

The load rises in steps. A step is sustained when, over its window, every
host stays alive at the controller, no generator ever found its connection's
queue full, the probes' acknowledgement p99 stays under a second, the last
third's median latency is not above twice the first third's plus 100 ms (no
growing backlog), and the controller used under 95% of its core. The last
line is ``controller-scale N agents``, N the largest sustained step.

``--cluster`` runs the controller as the one replica of cluster mode with the bus in the
path: a JetStream server (one node, streams of one copy; nats-server pinned to the load
generators' CPUs, its CPU printed beside the controller's) stores every sequenced frame
before it is acknowledged, the replica's leader applies it from there and commits to the
bus instead of SQLite. The figure is then agents per controller core with the bus's
round trips in every acknowledgement; docs/scaling.md takes it from here.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import nats
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch, wait_until
from harmonaize import keys
from harmonaize import messages as m
from harmonaize.messages import decode, encode
from harmonaize.opsocket import request
from testbed.natscluster import nats_server

PROBES = 20
SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))


class SimAgent:
    def __init__(self, ctx: zmq.Context, name: str, pair: tuple[bytes, bytes],
                 server: bytes, endpoint: str) -> None:
        secret, public = pair
        self.name = name
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100)
        self.sock.curve_secretkey, self.sock.curve_publickey = secret, public
        self.sock.curve_serverkey = server
        self.sock.connect(endpoint)
        self.seq = 0
        self.started = time.monotonic()
        self.beat: bytes | None = None

    def send(self, body: m.Message, seq: int = 0) -> bool:
        return self.send_raw(encode(body, sender=self.name, seq=seq))

    def send_raw(self, frame: bytes) -> bool:
        try:
            self.sock.send(frame, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False


@dataclass(frozen=True)
class Share:
    """One generator process's part of the load."""

    index: int
    endpoint: str
    server: bytes
    pairs: list[tuple[bytes, bytes]]
    refresh: float
    cpus: set[int]


def generator(share: Share, conn: Connection) -> None:
    """Run this process's share of the agents; obey the driver's step commands."""
    index, endpoint, server, pairs, refresh = (share.index, share.endpoint, share.server,
                                               share.pairs, share.refresh)
    os.sched_setaffinity(0, share.cpus)
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, len(pairs) + 100)
    agents: list[SimAgent] = []
    rng = random.Random(index)
    phase: list[float] = []
    blocked = 0
    latencies: list[tuple[float, float]] = []  # (when, ms)
    pending: dict[tuple[int, int], float] = {}
    next_probe = time.monotonic()
    probes = agents[:PROBES] if index == 0 else []
    tick, lag = 0, 0.0
    start = time.monotonic()
    while True:
        if conn.poll():
            command = conn.recv()
            if command == "stop":
                break
            if command == "report":
                conn.send({"blocked": blocked, "latencies": latencies, "lag": lag})
                blocked, latencies, lag = 0, [], 0.0
                continue
            target = int(command)
            while len(agents) < target:
                i = len(agents)
                agent = SimAgent(ctx, f"sim{index}-{i:05d}", pairs[i], server, endpoint)
                agent.send(m.Hello(pool="scale", gpu_class="H200", gpus=8, version="bench",
                                   epoch=1, acked=0, heartbeat=1.0))
                agents.append(agent)
                phase.append(rng.random())
            probes = agents[:PROBES] if index == 0 else []
            conn.send(len(agents))
            tick, start = 0, time.monotonic()  # connecting took time: start the clock again
        now = time.monotonic()
        lag = max(lag, now - (start + tick * 0.01))
        # Each agent beats once a second, at its own phase; every `refresh` s it resends its
        # summary (sequenced) instead, as the real agent refreshes an unchanged one.
        slot = tick % 100
        period = max(1, int(refresh))
        for i in range(slot, len(agents), 100):
            agent = agents[i]
            beat = int(now - agent.started)
            if beat % period == int(phase[i] * refresh) % period:
                agent.seq += 1
                ok = agent.send(SUMMARY, agent.seq)
                agent.beat = None
            else:
                if agent.beat is None:  # the controller reads last_seq; uptime may be stale
                    agent.beat = encode(m.Heartbeat(uptime=now - agent.started,
                                                    last_seq=agent.seq), sender=agent.name)
                ok = agent.send_raw(agent.beat)
            blocked += not ok
        if probes and now >= next_probe:
            next_probe = now + 1.0
            for p, agent in enumerate(probes):
                agent.seq += 1
                if agent.send(m.HostEvent("ScaleProbe", m.Severity.INFO), agent.seq):
                    pending[(p, agent.seq)] = now
        for p, agent in enumerate(probes):
            while True:
                try:
                    reply = decode(agent.sock.recv(flags=zmq.NOBLOCK)).body
                except zmq.Again:
                    break
                if isinstance(reply, m.Ack):
                    for key in [k for k in pending if k[0] == p and k[1] <= reply.seq]:
                        sent = pending.pop(key)
                        latencies.append((sent, (time.monotonic() - sent) * 1000))
        tick += 1
        # 100 slots of 10 ms: each agent's turn comes once a second.
        time.sleep(max(0.0, 0.01 - (time.monotonic() - now)))
    ctx.destroy(linger=0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="2500,5000,10000,15000,19000")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per step")
    parser.add_argument("--generators", type=int, default=4)
    parser.add_argument("--refresh", type=float, default=30.0)
    parser.add_argument("--cluster", action="store_true",
                        help="the controller as a cluster-mode replica, NATS JetStream in the path")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("controller-scale needs two CPUs: one for the controller, one for load")
    # The controller needs a descriptor per agent; a generator two (socket and mailbox).
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if max(steps) + 200 > hard or 2 * max(steps) / args.generators + 200 > hard:
        raise SystemExit(f"{max(steps)} agents need more than the {hard} file descriptors "
                         "allowed here: lower --steps or raise more --generators")
    with scratch() as work:
        agents_dir = work / "keys" / "agents"
        agents_dir.mkdir(parents=True)
        keys.generate(work / "keys", "controller")
        server = keys.load_public(work / "keys" / "controller.key")
        share = -(-max(steps) // args.generators)
        pairs: list[list[tuple[bytes, bytes]]] = []
        for g in range(args.generators):
            mine = []
            for i in range(share):
                public, secret = zmq.curve_keypair()
                keys.write_public(agents_dir, f"sim{g}-{i:05d}", public)
                mine.append((secret, public))
            pairs.append(mine)
        listen = f"tcp://127.0.0.1:{free_port()}"
        cfg = work / "controller.toml"
        cfg.write_text(
            f'[controller]\nlisten = "{listen}"\nfeed = "tcp://127.0.0.1:{free_port()}"\n'
            f'admin_socket = "{work / "controller.sock"}"\ndatabase = "{work / "c.db"}"\n'
            f'log_level = "warning"\n[auth]\nkeys_dir = "{work / "keys"}"\n'
            '[pools]\nnames = ["scale"]\ngpu_classes = ["H200"]\n'
        )
        admin = work / "controller.sock"
        nats = start_nats(work, set(cpus[1:]), cfg) if args.cluster else None
        try:
            return drive(args, steps, cpus=cpus, cfg=cfg, admin=admin, work=work, listen=listen,
                         server=server, pairs=pairs, nats=nats)
        finally:
            if nats is not None:
                nats.send_signal(signal.SIGTERM)
                nats.wait(timeout=10)


def start_nats(work: Path, cpus: set[int], cfg: Path) -> subprocess.Popen[bytes]:
    """One JetStream node on loopback, and the controller's configuration made a replica's."""
    port = free_port()
    (work / "nats").mkdir()
    with (work / "nats.log").open("wb") as out:
        proc = subprocess.Popen([nats_server(), "-a", "127.0.0.1", "-p", str(port), "-js",
                                 "-sd", str(work / "nats")], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    os.sched_setaffinity(proc.pid, cpus)
    with cfg.open("a") as f:
        f.write(f'[cluster]\nenabled = true\nreplica = "r1"\n'
                f'servers = ["nats://127.0.0.1:{port}"]\nstream_replicas = 1\n')
    return proc


def streams(cfg: Path) -> None:
    """What the bus holds after the run: messages and bytes per stream (the storage model)."""
    server = next(line.split('"')[1] for line in cfg.read_text().splitlines()
                  if line.startswith("servers"))

    async def show() -> None:
        nc = await nats.connect(server)
        try:
            js = nc.jetstream()
            for name in ("HZ_AGENTS", "HZ_STATE", "HZ_FEED"):
                state = (await js.stream_info(name)).state
                per = state.bytes / state.messages if state.messages else 0.0
                print(f"stream {name}: {state.messages} messages, {state.bytes} bytes, "
                      f"{per:.0f} bytes a message", flush=True)
        finally:
            await nc.close()
    asyncio.run(show())


def alive_hosts(admin: Path) -> int:
    """Hosts alive at the controller (in cluster mode the leader holds them: ask it)."""
    status = request(admin, "status")
    if status.get("cluster") is None:
        return int(status["hosts"]["alive"])
    if not status["cluster"].get("leading"):
        return 0
    return sum(1 for row in request(admin, "hosts", timeout=30.0) if row["alive"])


def drive(args: argparse.Namespace, steps: list[int], *, cpus: list[int], cfg: Path,
          admin: Path, work: Path, listen: str, server: bytes,
          pairs: list[list[tuple[bytes, bytes]]],
          nats: subprocess.Popen[bytes] | None) -> int:
    if nats is not None:
        wait_until(lambda: nats.poll() is not None or (work / "nats.log").read_text().find(
            "Server is ready") >= 0, 30)
    with daemon("controller.main", cfg, work / "controller.log", admin) as proc:
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            os.sched_setaffinity(int(task), {cpus[0]})  # threads started so far...
        gens, pipes = [], []
        for g in range(args.generators):
            ours, theirs = mp.Pipe()
            share = Share(g, listen, server, pairs[g], args.refresh, set(cpus[1:]))
            worker = mp.Process(target=generator, args=(share, theirs), daemon=True)
            worker.start()
            gens.append(worker)
            pipes.append(ours)
        best = 0
        try:
            for total in steps:
                result = run_step(total, args, proc.pid, pipes, admin,
                                  bus=nats.pid if nats is not None else None)
                print(result["line"], flush=True)
                if not result["ok"]:
                    break
                best = total
        finally:
            for pipe in pipes:
                pipe.send("stop")
            for worker in gens:
                worker.join(timeout=10)
            if nats is not None:
                streams(cfg)
    print(f"controller-scale {best} agents")
    return 0


def run_step(total: int, args: argparse.Namespace, pid: int, pipes: list[Connection],
             admin: Path, *, bus: int | None = None) -> dict[str, object]:
    per = -(-total // len(pipes))
    for pipe in pipes:
        pipe.send(per)
    for pipe in pipes:
        pipe.recv()
    total = per * len(pipes)
    deadline = time.monotonic() + 120
    while alive_hosts(admin) < total:
        if time.monotonic() > deadline:
            return {"ok": False, "line": f"{total} agents: not all came up within 120 s"}
        time.sleep(0.5)
    time.sleep(3.0)  # let the connection burst settle
    for pipe in pipes:
        pipe.send("report")
        pipe.recv()  # discard what the ramp cost
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    bus0 = cpu_seconds(bus) if bus is not None else 0.0
    time.sleep(args.window)
    cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)
    bus_cpu = ((cpu_seconds(bus) - bus0) / (time.monotonic() - wall0)) if bus is not None else None
    blocked, samples, lag = 0, [], 0.0
    for pipe in pipes:
        pipe.send("report")
        report = pipe.recv()
        blocked += report["blocked"]
        samples += report["latencies"]
        lag = max(lag, report["lag"])
    status = request(admin, "status")
    alive = alive_hosts(admin)
    samples.sort()
    ms = [v for _, v in samples]
    third = max(1, len(samples) // 3)
    first = statistics.median(v for _, v in samples[:third]) if samples else float("inf")
    last = statistics.median(v for _, v in samples[-third:]) if samples else float("inf")
    p50 = percentile(ms, 50) if ms else float("inf")
    p99 = percentile(ms, 99) if ms else float("inf")
    # A growing backlog shows as latency that keeps climbing; noise on a shared machine does
    # not double it and add a tenth of a second.
    ok = (alive == total and blocked == 0 and p99 < 1000 and last <= 2 * first + 100
          and cpu < 0.95)
    if not ok and lag > 0.5:
        # The load generators fell behind their own schedule: the step says nothing about
        # the controller (the machine is too small or too busy to generate this load).
        return {"ok": False, "line": f"{total} agents: inconclusive: the load generators fell "
                f"{lag:.1f} s behind (controller CPU {cpu * 100:.0f}% of a core, alive "
                f"{alive}/{total})"}
    line = (f"{total} agents: controller CPU {cpu * 100:.0f}% of a core, ack p50 {p50:.1f} ms "
            f"p99 {p99:.1f} ms (first third {first:.1f}, last third {last:.1f}), alive "
            f"{alive}/{total}, blocked sends {blocked}, frames {status['frames']}"
            + (f", nats-server CPU {bus_cpu * 100:.0f}% of a core" if bus_cpu is not None else "")
            + f" -> {'sustained' if ok else 'NOT sustained'}")
    return {"ok": ok, "line": line}


if __name__ == "__main__":
    sys.exit(main())
