"""Fan-out: from an aggregate's publication to its receipt, across many subscribers.

One controller (CurveZMQ on, as in production, and the HTTP gateway) pinned to one
CPU; ``--subscribers`` tenant connections per transport, spread over tenants (each
with its own key and token; a tenant may hold 256 subscriptions, so there are enough
of them), held by ``--workers`` processes per transport on the other CPUs:

* ``zmq``: DEALER sockets on the CurveZMQ feed, subscribed to ``pool/pz/``;
* ``sse``: raw asyncio HTTP readers of ``GET /v1/feed?topic=pool/ps/`` with a bearer
  token each tenant was issued before the clock starts (docs/wire.md).

Two simulated agents, one in pool ``pz`` and one in ``ps``, change their capacity in
turn, ``--rounds`` times in all: with ``--transport both`` round by round the ZeroMQ
subscribers' pool and the SSE subscribers' pool, so the two are measured interleaved
against the same controller and each publication goes to one transport's
``--subscribers``. The latency of a receipt is its receiving time minus the
publication's stamp (the envelope's for ZeroMQ, the CloudEvent's ``time`` for SSE; one
clock: everything runs on this machine). Prints p50 and p99 over every receipt of each
transport, the controller's CPU during the rounds and the subscribers'; the last line is
``fanout P99 ms``, the worse transport's.

``--cluster`` runs the controller as the one replica of cluster mode (a JetStream node on
the subscribers' CPUs, its CPU printed beside): a publication is then made by the
replica's leader, stored on the bus and read back by the replica, which fans it out to
its own subscribers, as each replica of a region does with its share of them. The stamp
is the leader's, so a receipt's latency includes the bus. A region's replicas each serve
their share on their own cores; docs/scaling.md extends this figure by that model.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch, wait_until
from bench.load.bus import replica_bus
from bench.load.subscribers import start_workers
from harmonaize import keys
from harmonaize import messages as m
from harmonaize.messages import decode, encode
from harmonaize.opsocket import request
from testbed.keyring import Keyring

#: Subscriptions per tenant the bench gives (the feed allows 256: controller/feed.py).
PER_TENANT = 200
POOLS = {"zmq": "pz", "sse": "ps"}


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def io_thread_seconds(pid: int) -> float:
    """CPU used so far by the process's ZeroMQ background threads (libzmq names them
    ZMQbg/...): CurveZMQ's encryption and the TCP writes, apart from the Python thread."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
            name, fields = stat.split("(", 1)[1].rsplit(")", 1)
            if name.startswith("ZMQbg"):
                parts = fields.split()
                total += int(parts[11]) + int(parts[12])
    return total / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it starts later inherit it)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cpus)


# --- the driver --------------------------------------------------------------------------


def agent_socket(ctx: zmq.Context[zmq.Socket[bytes]], listen: str, keyring: Keyring,
                 pool: str) -> zmq.Socket[bytes]:
    creds = keyring.agent(f"bench-{pool}")
    agent = ctx.socket(zmq.DEALER)
    agent.setsockopt(zmq.LINGER, 0)
    keys.curve_client(agent, keys.load_pair(creds.key), keys.load_public(creds.server_key))
    agent.connect(listen)
    agent.send(encode(m.Hello(pool=pool, gpu_class="H200", gpus=8, version="bench", epoch=1,
                              acked=0, heartbeat=60.0), sender=f"bench-{pool}"))
    if not agent.poll(10_000):
        raise SystemExit("the controller never answered a simulated agent")
    agent.recv()
    return agent


def profiler(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the controller for as long as the rounds last (on the other CPUs)."""
    if args.profile is None:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "250", "--nonblocking",
                             "--duration", str(int(args.rounds * args.interval) + 1),
                             "--format", "raw", "--output", str(args.profile)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def acked(agent: zmq.Socket[bytes], seq: int) -> None:
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        if agent.poll(1000):
            body = decode(agent.recv()).body
            if isinstance(body, m.Ack) and body.seq >= seq:
                return
    raise SystemExit(f"the controller did not acknowledge change {seq} within 30 s")


def config(work: Path, keyring: Keyring, listen: str, feed: str, gateway: int) -> Path:
    cfg = work / "controller.toml"
    cfg.write_text(
        f'[controller]\nlisten = "{listen}"\nfeed = "{feed}"\n'
        f'admin_socket = "{work / "controller.sock"}"\ndatabase = "{work / "c.db"}"\n'
        'log_level = "warning"\n'
        # "redacted": a publication per change (the private mode releases on a plan,
        # every 900 s by default): fan-out is measured, not the release plan.
        '[redaction]\nmode = "redacted"\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n'
        '[pools]\nnames = ["pz", "ps", "default"]\ngpu_classes = ["H200"]\n'
        # Every subscriber opens at once: a tenant's request budget would spread its
        # subscriptions over seconds, which is the budget's work, not fan-out.
        "[feed]\nrequest_rate = 1000.0\nrequest_burst = 100000.0\n"
        # All streams come from one address, more than the defaults let one address hold.
        f'[gateway]\nlisten = "127.0.0.1:{gateway}"\nmax_streams = 100000\n'
        "streams_per_tenant = 10000\nmax_connections = 1000000\n"
        "connections_per_address = 1000000\nkeepalive = 60.0\n"
        + keyring.controller_config())
    return cfg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--subscribers", type=int, default=1000,
                        help="subscribers per transport")
    parser.add_argument("--transport", choices=("zmq", "sse", "both"), default="zmq")
    parser.add_argument("--rounds", type=int, default=60,
                        help="publications in all (with both: alternately to each)")
    parser.add_argument("--interval", type=float, default=0.5,
                        help="seconds between publications")
    parser.add_argument("--workers", type=int, default=4, help="processes per transport")
    parser.add_argument("--cluster", action="store_true",
                        help="the controller as a cluster-mode replica (its leader too), "
                        "NATS JetStream in the path")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write py-spy's collapsed stacks of the controller during the "
                        "rounds here (py-spy must be on PATH)")
    args = parser.parse_args()
    if args.subscribers < 1 or args.rounds < 1 or args.workers < 1 or args.interval <= 0:
        parser.error("--subscribers, --rounds and --workers at least 1, --interval above 0")
    transports = ["zmq", "sse"] if args.transport == "both" else [args.transport]
    # Each subscriber's connection is a descriptor at the controller (which raises its
    # soft limit to the hard one); the workers hold theirs in separate processes.
    need = args.subscribers * len(transports) + 1024
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # only with the privilege to
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, max(hard, need)))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        print(f"fanout: {need} descriptors wanted at the controller, the hard limit is "
              f"{hard}: run fewer subscribers, or one transport at a time", file=sys.stderr)
        return 1
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("fanout: needs two CPUs (the controller on one, subscribers on the rest)",
              file=sys.stderr)
        return 1
    controller_cpu, others = {cpus[0]}, set(cpus[1:])
    os.sched_setaffinity(0, others)
    with scratch() as work:
        return run(args, transports, work, controller_cpu, others)


def run(args: argparse.Namespace, transports: list[str], work: Path,
        controller_cpu: set[int], others: set[int]) -> int:
    keyring = Keyring(work / "keys")
    listen, feed = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    port = free_port()
    cfg = config(work, keyring, listen, feed, port)
    bus = replica_bus(work, cfg, others) if args.cluster else None
    try:
        return measure(args, transports, work, keyring, cfg, listen=listen, feed=feed,
                       port=port, controller_cpu=controller_cpu, others=others, bus=bus)
    finally:
        if bus is not None:
            bus.terminate()
            bus.wait(timeout=10)


def measure(args: argparse.Namespace, transports: list[str], work: Path, keyring: Keyring,
            cfg: Path, *, listen: str, feed: str, port: int, controller_cpu: set[int],
            others: set[int], bus: subprocess.Popen[bytes] | None) -> int:
    n_tenants = max(10, -(-args.subscribers * len(transports) // PER_TENANT))
    tenants = [f"tenant-{i}" for i in range(n_tenants)]
    creds = {name: keyring.tenant(name) for name in tenants}
    admin = work / "controller.sock"
    with daemon("controller.main", cfg, work / "controller.log", admin) as proc:
        pin(proc.pid, controller_cpu)
        if bus is not None:  # the replica answers agents once it leads
            wait_until(lambda: (request(admin, "status").get("cluster") or {}).get("leading"),
                       timeout=60)
        ctx = zmq.Context()
        agents = {t: agent_socket(ctx, listen, keyring, POOLS[t]) for t in transports}
        tokens = {t: request(admin, "token-issue", {"tenant": t, "days": 1})["token"]
                  for t in tenants}
        procs: list[mp.Process] = []
        pipes: dict[str, list[Connection]] = {}
        offset = 0  # the transports' subscribers take turns over the tenants
        for kind in transports:
            owners = [tenants[(offset + i) % n_tenants] for i in range(args.subscribers)]
            offset += args.subscribers
            shares: list[object] = [creds[t] if kind == "zmq" else tokens[t] for t in owners]
            ps, pipes[kind] = start_workers(
                kind, shares, workers=args.workers, prefix=f"pool/{POOLS[kind]}/", cpus=others,
                where=feed if kind == "zmq" else ("127.0.0.1", port))
            procs += ps
        everyone = [p for kind in transports for p in pipes[kind]]
        for pipe in everyone:
            if pipe.recv() != "started":
                raise SystemExit("a subscriber worker failed to start")
        for pipe in everyone:
            said = pipe.recv() if pipe.poll(300) else "nothing in 300 s"
            if said != "subscribed":
                raise SystemExit(f"subscribers did not all get their subscriptions: {said}")
        wait_until(lambda: len(request(admin, "feed", timeout=60))
                   >= args.subscribers * len(transports), timeout=120)
        time.sleep(1.0)
        before = request(admin, "status")["feed_stats"]
        subs_cpu = {p.pid: cpu_seconds(p.pid) for p in procs}
        spy = profiler(args, proc.pid)
        ctl_cpu, wall = cpu_seconds(proc.pid), time.monotonic()
        io_cpu = io_thread_seconds(proc.pid)
        bus_cpu = cpu_seconds(bus.pid) if bus is not None else 0.0
        for i in range(args.rounds):
            kind = transports[i % len(transports)]
            turn = i // len(transports)
            healthy = 0 if turn % 2 else 8  # 8 <-> 0 GPUs: the bucket moves every round
            agents[kind].send(encode(m.HostSummary(m.Health.HEALTHY, True,
                                                   m.GpuCounts(healthy=healthy)),
                                     sender=f"bench-{POOLS[kind]}", seq=turn + 1))
            # Its acknowledgement comes after the batch that published it: a controller
            # still busy with the last fan-out would otherwise take two changes in one
            # batch, and 8 -> 0 -> 8 GPUs publishes nothing.
            acked(agents[kind], turn + 1)
            time.sleep(args.interval)
        ctl_cpu, wall = cpu_seconds(proc.pid) - ctl_cpu, time.monotonic() - wall
        io_cpu = io_thread_seconds(proc.pid) - io_cpu
        bus_cpu = cpu_seconds(bus.pid) - bus_cpu if bus is not None else None
        subs_used = sum(cpu_seconds(p.pid) - subs_cpu[p.pid] for p in procs)
        if spy is not None:
            spy.wait(timeout=60)
        time.sleep(1.0)
        stats = request(admin, "status")["feed_stats"]
        publications = stats.get("published", 0) - before.get("published", 0)
        per_kind = {kind: sum(1 for i in range(args.rounds)
                              if transports[i % len(transports)] == kind)
                    for kind in transports}
        if publications != args.rounds:
            print(f"fanout: {publications} publications for {args.rounds} changes; the "
                  "controller's log ends:\n" + "".join(
                      (work / "controller.log").read_text().splitlines(True)[-15:]),
                  file=sys.stderr)
            return 1
        latencies: dict[str, list[float]] = {}
        for kind in transports:
            for pipe in pipes[kind]:
                pipe.send(per_kind[kind])
            latencies[kind] = [x for pipe in pipes[kind] for x in pipe.recv()]
        for p in procs:
            p.join(timeout=10)
        ctx.destroy(linger=0)
    return report(args, transports, latencies, per_kind=per_kind,
                  dropped=stats.get("dropped", 0) - before.get("dropped", 0), ctl_cpu=ctl_cpu,
                  io_cpu=io_cpu, subs_cpu=subs_used, bus_cpu=bus_cpu, wall=wall,
                  n_tenants=n_tenants, n_others=len(others))


def report(args: argparse.Namespace, transports: list[str], latencies: dict[str, list[float]],
           *, per_kind: dict[str, int], dropped: int, ctl_cpu: float, io_cpu: float,
           subs_cpu: float, bus_cpu: float | None, wall: float, n_tenants: int,
           n_others: int) -> int:
    sends = sum(per_kind[k] * args.subscribers for k in transports)
    print(f"subscribers {args.subscribers} per transport over {n_tenants} tenants "
          f"(CurveZMQ; SSE over plain HTTP on loopback), publications {args.rounds} "
          f"({', '.join(f'{per_kind[k]} {k}' for k in transports)}), one every "
          f"{args.interval:g} s, dropped {dropped}")
    print(f"controller CPU during the rounds: {ctl_cpu:.2f} s of {wall:.1f} s "
          f"({100 * ctl_cpu / wall:.0f} % of its one CPU), {1e6 * ctl_cpu / sends:.1f} us a "
          f"receipt (ZeroMQ's I/O thread {1e6 * io_cpu / sends:.1f}, the rest "
          f"{1e6 * (ctl_cpu - io_cpu) / sends:.1f}); subscribers: {subs_cpu:.2f} s "
          f"({100 * subs_cpu / wall / n_others:.0f} % of their {n_others} CPU(s))")
    if bus_cpu is not None:
        print(f"cluster mode (the controller a replica leading itself): nats-server "
              f"{bus_cpu:.2f} s ({100 * bus_cpu / wall:.0f} % of a CPU); a stamp is the "
              "leader's, a latency includes the bus")
    worst, failed = 0.0, False
    for kind in transports:
        got, expected = latencies[kind], per_kind[kind] * args.subscribers
        if len(got) < expected * 0.99:
            print(f"{kind}: receipts {len(got)} of {expected}: missing", file=sys.stderr)
            failed = True
            continue
        p99 = percentile(got, 99)
        worst = max(worst, p99)
        print(f"{kind}: receipts {len(got)} of {expected}, latency p50 "
              f"{percentile(got, 50):.1f} ms, p99 {p99:.1f} ms, max {max(got):.1f} ms")
    if failed:
        return 1
    print(f"fanout {worst:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
