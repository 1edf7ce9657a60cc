"""Controller scale: how many agents at 1 Hz one controller sustains on one core.

The controller runs pinned to CPU 0 (its ZeroMQ I/O thread too, so CurveZMQ
decryption counts); simulated agents run in generator processes pinned to
the other CPUs (bench/load/agents.py: cheap frame producers, pre-encoded frames,
handshakes done before the clock starts, one timer per process). Each simulated
agent is one DEALER connection with its own CurveZMQ key, speaking the real
protocol: a hello, a heartbeat every second (``--rate``), its host summary
(sequenced, acknowledged) every ``--refresh`` seconds as the real agent's
periodic refresh. Twenty probe agents also send one sequenced host event per
second and time its acknowledgement, which is committed to SQLite before it
is sent. Each generator's CPU (per second of wall time) and how far behind
its send schedule it fell are printed beside every step.

The load rises in steps. A step is sustained when, over its window, every
host stays alive at the controller, no generator ever found its connection's
queue full, the probes' acknowledgement p99 stays under a second, the last
third's median latency is not above twice the first third's plus 100 ms (no
growing backlog), and the controller used under 95% of its core. A step where
a generator fell more than half a second behind its schedule is undecided (it
says nothing about the controller), not failed, and so is one that failed while the
other processes used a tenth of the controller's core or more (its busy time in
/proc/stat less the controller's own); either ends the run. The last
line is ``controller-scale N agents``, N the largest sustained step (with
``--rate`` R other than 1: ``N·R heartbeats/s``; the machine's descriptor limit
may hold fewer connections than the frame load of the agents wanted).

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
import resource
import signal
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import nats
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch, wait_until
from bench.load.agents import BEHIND, Share, generate
from bench.load.bus import replica_bus
from harmonaize import keys
from harmonaize.opsocket import request

#: A step that failed while other processes used this share of the controller's core
#: says nothing about the controller: it is undecided.
CPU_TAKEN = 0.10
#: The controller's core, set by drive() (a list, so run_step reads what drive() set).
CONTROLLER_CPU = [0]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds per kind of thread (the Python loop, ZeroMQ's I/O threads, the rest)."""
    out: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended
        kind = "loop" if int(task) == pid else "zmq-io" if "ZMQbg/IO" in comm else "other"
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf(
            "SC_CLK_TCK")
    return out


def cpu_busy(cpu: int) -> float:
    """Seconds CPU ``cpu`` has been busy (not idle, not waiting for I/O), any process's."""
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == f"cpu{cpu}":
            ticks = [int(f) for f in fields[1:]]
            return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    raise SystemExit(f"controller-scale: no cpu{cpu} in /proc/stat")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="2500,5000,10000,15000,19000")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per step")
    parser.add_argument("--generators", type=int, default=4)
    parser.add_argument("--refresh", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=1.0,
                        help="heartbeats a second per agent (2: the frame load of twice the "
                        "agents on half the connections, where descriptors are short)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="sample the controller with py-spy over each step's window; "
                        "the tops (own time and with callees) are written to this folder")
    parser.add_argument("--cluster", action="store_true",
                        help="the controller as a cluster-mode replica, NATS JetStream in the path")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("controller-scale needs two CPUs: one for the controller, one for load")
    # The controller needs a descriptor per agent; a generator two (socket and mailbox).
    # The hard limit is the machine's: a process without CAP_SYS_RESOURCE cannot raise it.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if max(steps) + 200 > hard or 2 * max(steps) / args.generators + 200 > hard:
        raise SystemExit(f"{max(steps)} agents need more than the {hard} file descriptors "
                         "allowed here (the hard limit): lower --steps, use --rate 2 on half "
                         "the agents, or raise more --generators")
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
        nats = replica_bus(work, cfg, set(cpus[1:])) if args.cluster else None
        try:
            return drive(args, steps, cpus=cpus, cfg=cfg, admin=admin, work=work, listen=listen,
                         server=server, pairs=pairs, nats=nats)
        finally:
            if nats is not None:
                nats.send_signal(signal.SIGTERM)
                nats.wait(timeout=10)


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
    leading = status["cluster"].get("leading")
    # The replica leads: its leader's count (a list of every host would not fit in one
    # bus message past about 6,000 hosts).
    return int(leading.get("hosts_alive", 0)) if leading else 0


def drive(args: argparse.Namespace, steps: list[int], *, cpus: list[int], cfg: Path,
          admin: Path, work: Path, listen: str, server: bytes,
          pairs: list[list[tuple[bytes, bytes]]],
          nats: subprocess.Popen[bytes] | None) -> int:
    if nats is not None:
        wait_until(lambda: nats.poll() is not None or (work / "nats.log").read_text().find(
            "Server is ready") >= 0, 30)
    with daemon("controller.main", cfg, work / "controller.log", admin) as proc:
        CONTROLLER_CPU[0] = cpus[0]
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            os.sched_setaffinity(int(task), {cpus[0]})  # threads started so far...
        gens, pipes = [], []
        for g in range(args.generators):
            ours, theirs = mp.Pipe()
            share = Share(g, listen, server, pairs[g], args.refresh, args.rate, set(cpus[1:]))
            worker = mp.Process(target=generate, args=(share, theirs), daemon=True)
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
    if args.rate == 1:
        print(f"controller-scale {best} agents")
    else:  # agents at another rate: the figure is the heartbeats a second sustained
        print(f"controller-scale {best * args.rate:.0f} heartbeats/s")
    return 0


def profile(pid: int, seconds: float, out: Path) -> None:
    """Sample ``pid`` (all its threads' Python stacks) for ``seconds`` without pausing it;
    write the raw stacks and the top 25 functions by own and by inclusive samples."""
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        raise SystemExit("controller-scale --profile needs py-spy in the virtual environment")
    raw = out.with_suffix(".raw")
    # Sampled from the generators' CPUs, so the sampler's own work is not the controller's.
    subprocess.run(["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[1:])),
                    str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                    "--rate", "200", "--nonblocking", "--format", "raw", "--output", str(raw)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")"
                  if " (" in f else f for f in stack.split(";")]
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            total[f] = total.get(f, 0) + n
    lines = [f"{samples} samples"]
    for title, table in (("own", own), ("inclusive", total)):
        lines.append(f"-- top by {title} samples")
        for name, n in sorted(table.items(), key=lambda kv: -kv[1])[:25]:
            lines.append(f"{n * 100 / max(samples, 1):5.1f}% {name}")
    out.with_suffix(".top").write_text("\n".join(lines) + "\n")


def run_step(total: int, args: argparse.Namespace, pid: int, pipes: list[Connection],
             admin: Path, *, bus: int | None = None) -> dict[str, object]:
    per = -(-total // len(pipes))
    for pipe in pipes:
        pipe.send(per)  # connect up to per agents, each hello acknowledged
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
    cpu0, wall0, threads0 = cpu_seconds(pid), time.monotonic(), thread_seconds(pid)
    busy0 = cpu_busy(CONTROLLER_CPU[0])
    bus0 = cpu_seconds(bus) if bus is not None else 0.0
    if args.profile is not None:
        profile(pid, args.window, args.profile / f"step-{total}")
    else:
        time.sleep(args.window)
    cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)
    wall = time.monotonic() - wall0
    # What else ran on the controller's core: its busy time less the controller's own.
    others = max(0.0, (cpu_busy(CONTROLLER_CPU[0]) - busy0) / wall - cpu)
    split = ", ".join(f"{kind} {(used - threads0.get(kind, 0.0)) * 100 / wall:.0f}%"
                      for kind, used in sorted(thread_seconds(pid).items()))
    bus_cpu = ((cpu_seconds(bus) - bus0) / (time.monotonic() - wall0)) if bus is not None else None
    blocked, samples, lag, sent, gen_cpu = 0, [], 0.0, 0.0, []
    for pipe in pipes:
        pipe.send("report")
        report = pipe.recv()
        blocked += report["blocked"]
        samples += report["latencies"]
        lag = max(lag, report["lag"])
        sent += report["sent"] / report["wall"]
        gen_cpu.append(report["cpu"])
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
    gens = (f"generators {sum(gen_cpu) * 100:.0f}% of a core in all "
            f"({', '.join(f'{c * 100:.0f}' for c in gen_cpu)}), {sent:,.0f} frames/s sent, "
            f"at most {lag * 1000:.0f} ms behind schedule")
    head = f"{total} agents at {args.rate:g} Hz"
    if not ok and others > CPU_TAKEN:
        # Other processes had the controller's core: the step says nothing about it.
        return {"ok": False, "line": f"{head}: undecided: other processes took "
                f"{others * 100:.0f}% of the controller's core (controller CPU "
                f"{cpu * 100:.0f}%, ack p99 {p99:.0f} ms; {gens})"}
    if lag > BEHIND:
        # A generator missed its send schedule: the step says nothing about the
        # controller (the machine is too small or too busy to generate this load).
        return {"ok": False, "line": f"{head}: undecided: a load generator fell behind "
                f"(controller CPU {cpu * 100:.0f}% of a core, alive {alive}/{total}; {gens})"}
    line = (f"{head}: controller CPU {cpu * 100:.0f}% of a core ({split}), ack p50 {p50:.1f} ms "
            f"p99 {p99:.1f} ms (first third {first:.1f}, last third {last:.1f}), alive "
            f"{alive}/{total}, blocked sends {blocked}, frames {status['frames']}, "
            f"others on its core {others * 100:.0f}%"
            + (f", nats-server CPU {bus_cpu * 100:.0f}% of a core" if bus_cpu is not None else "")
            + f"; {gens} -> {'sustained' if ok else 'NOT sustained'}")
    return {"ok": ok, "line": line}


if __name__ == "__main__":
    sys.exit(main())
