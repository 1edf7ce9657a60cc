"""Fan-out: from an aggregate's publication to its receipt, across many subscribers.

One controller (CurveZMQ on, as in production); ``--subscribers`` tenant
connections (spread over ten tenants, each with its own key) subscribe to the
pool feed from ``--workers`` processes. A simulated agent makes the pool's
capacity change ``--rounds`` times; each change is one publication that
every subscriber must receive. The latency of a receipt is the receiving
time minus the publication time stamped in the frame's envelope (one clock:
everything runs on this machine). Prints p50 and p99 over every receipt; the
last line is ``fanout P99 ms``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch, wait_until
from harmonaize import keys
from harmonaize import messages as m
from harmonaize.messages import decode, encode
from harmonaize.opsocket import request
from testbed.keyring import Credentials, Keyring

TENANTS = 10


def subscriber_worker(feed: str, creds: list[Credentials], conn: Connection) -> None:
    """Hold ``len(creds)`` subscriptions; report receipt latencies (ms) when done."""
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, len(creds) + 64)
    socks = []
    for cred in creds:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        keys.curve_client(sock, keys.load_pair(cred.key), keys.load_public(cred.server_key))
        sock.connect(feed)
        socks.append(sock)
    subscribe = encode(m.Subscribe(("pool/",)), sender="bench")
    for sock in socks:
        sock.send(subscribe)
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    baseline: dict[zmq.Socket, dict[str, int]] = {}
    latencies: list[float] = []
    conn.send("started")
    target: int | None = None  # receipts to wait for, once the driver knows
    deadline = float("inf")
    last_renew = time.monotonic()
    while target is None or len(latencies) < target:
        if target is None and conn.poll():
            target = conn.recv() * len(socks)
            deadline = time.monotonic() + 10.0
        if time.monotonic() > deadline:
            break
        if time.monotonic() - last_renew > 8:
            for sock in socks:
                sock.send(subscribe)
            last_renew = time.monotonic()
        for sock, _ in poller.poll(100):
            while True:
                try:
                    topic, frame = sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                now = time.time()
                if not topic:
                    reply = decode(frame).body
                    if isinstance(reply, m.Subscribed) and sock not in baseline:
                        baseline[sock] = {p.topic: p.seq for p in reply.positions}
                        if len(baseline) == len(socks):
                            conn.send("subscribed")
                    continue
                envelope = msgpack.unpackb(frame, raw=False)
                # Count each publication once: what came before we subscribed (sent to late
                # joiners) and republications of what we have are no fan-out.
                seen = baseline.setdefault(sock, {})
                name = topic.decode()
                if envelope[4] > seen.get(name, 0):
                    seen[name] = envelope[4]
                    latencies.append((now - envelope[5]) * 1000)
    conn.send(latencies)
    ctx.destroy(linger=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    with scratch() as work:
        keyring = Keyring(work / "keys")
        listen, feed = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        cfg = work / "controller.toml"
        cfg.write_text(
            f'[controller]\nlisten = "{listen}"\nfeed = "{feed}"\n'
            f'admin_socket = "{work / "controller.sock"}"\ndatabase = "{work / "c.db"}"\n'
            'log_level = "warning"\n'
            "[redaction]\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n"
            '[pools]\nnames = ["p", "default"]\ngpu_classes = ["H200"]\n'
            + keyring.controller_config()
        )
        tenants = [keyring.tenant(f"tenant-{i}") for i in range(TENANTS)]
        creds = [tenants[i % TENANTS] for i in range(args.subscribers)]
        with daemon("controller.main", cfg, work / "controller.log", work / "controller.sock"):
            agent_creds = keyring.agent("bench-host")
            ctx = zmq.Context()
            agent = ctx.socket(zmq.DEALER)
            agent.setsockopt(zmq.LINGER, 0)
            keys.curve_client(agent, keys.load_pair(agent_creds.key),
                              keys.load_public(agent_creds.server_key))
            agent.connect(listen)
            agent.send(encode(m.Hello(pool="p", gpu_class="H200", gpus=8, version="bench",
                                      epoch=1, acked=0, heartbeat=60.0), sender="bench-host"))
            if not agent.poll(10_000):
                raise SystemExit("the controller never answered the simulated agent")
            agent.recv()
            workers, pipes = [], []
            share = -(-args.subscribers // args.workers)
            for w in range(args.workers):
                mine = creds[w * share:(w + 1) * share]
                if not mine:
                    continue
                ours, theirs = mp.Pipe()
                proc = mp.Process(target=subscriber_worker,
                                  args=(feed, mine, theirs), daemon=True)
                proc.start()
                workers.append(proc)
                pipes.append(ours)
            for pipe in pipes:
                if pipe.recv() != "started":
                    raise SystemExit("a subscriber worker failed to start")
            for pipe in pipes:
                if not pipe.poll(120) or pipe.recv() != "subscribed":
                    raise SystemExit("subscribers did not all get their subscriptions")
            wait_until(lambda: len(request(work / "controller.sock", "feed"))
                       >= args.subscribers, timeout=60)
            before = request(work / "controller.sock", "status")["feed_stats"]["published"]
            for i in range(args.rounds):
                healthy = 8 if i % 2 else 0  # 0 <-> 8 GPUs: the bucket moves every round
                agent.send(encode(m.HostSummary(m.Health.HEALTHY, True,
                                                m.GpuCounts(healthy=healthy)),
                                  sender="bench-host", seq=i + 1))
                time.sleep(0.25)
                while agent.poll(0):
                    agent.recv()
            time.sleep(0.5)
            stats = request(work / "controller.sock", "status")["feed_stats"]
            publications = stats["published"] - before
            for pipe in pipes:
                pipe.send(publications)
            latencies: list[float] = []
            for pipe in pipes:
                latencies += pipe.recv()
            for proc in workers:
                proc.join(timeout=10)
            ctx.destroy(linger=0)
    expected = publications * args.subscribers
    print(f"subscribers {args.subscribers} (over {TENANTS} tenants, CurveZMQ), publications "
          f"{publications}, receipts {len(latencies)} of {expected}, dropped "
          f"{stats.get('dropped', 0)}")
    if len(latencies) < expected * 0.99:
        print("fanout: receipts missing", file=sys.stderr)
        return 1
    print(f"latency p50 {percentile(latencies, 50):.1f} ms, p99 "
          f"{percentile(latencies, 99):.1f} ms, max {max(latencies):.1f} ms")
    print(f"fanout {percentile(latencies, 99):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
