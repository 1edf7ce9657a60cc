"""The fan-out bench's subscribers: ZeroMQ DEALERs and raw SSE readers in worker
processes, each reporting its receipt latencies (ms) to the driver (bench/fanout.py)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import time
from datetime import datetime
from multiprocessing.connection import Connection

import msgpack
import zmq

from harmonaize import keys
from harmonaize import messages as m
from harmonaize.messages import decode, encode
from testbed.keyring import Credentials

#: Seconds between a ZeroMQ subscriber's renewals (the feed's renew is 30 s).
RENEW = 10.0

# --- ZeroMQ subscribers ------------------------------------------------------------------


def zmq_worker(feed: str, creds: list[Credentials], prefix: str, conn: Connection) -> None:
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
    subscribe = encode(m.Subscribe((prefix,)), sender="bench")
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
            deadline = time.monotonic() + 20.0
        if time.monotonic() > deadline:
            break
        if time.monotonic() - last_renew > RENEW:
            for sock in socks:
                sock.send(subscribe)
            last_renew = time.monotonic()
        # One message per ready socket per poll (zmq_poll is level-triggered: a socket
        # with more comes again), not a drain loop ending in an exception per socket.
        for sock, _ in poller.poll(100):
            try:
                topic, frame = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                continue
            now = time.time()
            if not topic:
                reply = decode(frame).body
                if isinstance(reply, m.Subscribed) and sock not in baseline:
                    if not reply.accepted:
                        conn.send(f"refused: {reply.refused}")
                        return
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


# --- SSE subscribers ---------------------------------------------------------------------


class SseClient:
    """One event stream read off a raw socket: no HTTP library in the way."""

    def __init__(self, latencies: list[float]) -> None:
        self.latencies = latencies
        self.seen: dict[str, int] | None = None  # the positions of its "subscribed" event
        self.subscribed = asyncio.Event()

    async def run(self, host: str, port: int, token: str, prefix: str,
                  opening: asyncio.Semaphore) -> None:
        async with opening:  # not all at once: the listen backlog would overflow
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET /v1/feed?topic={prefix} HTTP/1.1\r\nHost: {host}\r\n"
                         f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n"
                         "\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"the gateway refused a stream: {head[:200]!r}")
            rest = b""
            while self.seen is None:
                rest = self.lines(rest + await reader.read(65536), time.time())
        self.subscribed.set()
        while data := await reader.read(65536):
            rest = self.lines(rest + data, time.time())
        writer.close()

    def lines(self, data: bytes, now: float) -> bytes:
        """Take the events' data lines (between them: ids, chunk sizes); the rest back."""
        lines = data.split(b"\n")
        for line in lines[:-1]:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if self.seen is None:
                if event["type"].startswith("io.harmonaize.feed.subscribed."):
                    self.seen = {p["topic"]: p["seq"] for p in event["data"]["positions"]}
                continue
            topic, seq = event.get("subject"), event.get("seq", 0)
            if topic is not None and seq > self.seen.get(topic, 0):
                self.seen[topic] = seq
                stamp = datetime.fromisoformat(event["time"]).timestamp()
                self.latencies.append((now - stamp) * 1000)
        return lines[-1]


def sse_worker(address: tuple[str, int], tokens: list[str], prefix: str,
               conn: Connection) -> None:
    asyncio.run(sse_main(address, tokens, prefix, conn))


async def sse_main(address: tuple[str, int], tokens: list[str], prefix: str,
                   conn: Connection) -> None:
    latencies: list[float] = []
    clients = [SseClient(latencies) for _ in tokens]
    opening = asyncio.Semaphore(32)
    conn.send("started")
    tasks = [asyncio.create_task(c.run(*address, token, prefix, opening))
             for c, token in zip(clients, tokens, strict=True)]
    for client, task in zip(clients, tasks, strict=True):
        done, _ = await asyncio.wait([asyncio.ensure_future(client.subscribed.wait()), task],
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # it failed: say why
    conn.send("subscribed")
    while not conn.poll():
        await asyncio.sleep(0.05)
    target = conn.recv() * len(clients)
    deadline = time.monotonic() + 20.0
    while len(latencies) < target and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    conn.send(latencies)
    for task in tasks:
        task.cancel()




def start_workers(kind: str, shares: list[object], *, workers: int, where: object,
                  prefix: str, cpus: set[int]) -> tuple[list[mp.Process], list[Connection]]:
    """``workers`` processes of one transport on ``cpus``, each with its part of ``shares``
    (credentials or tokens) to subscribe to ``prefix`` at ``where``."""
    procs, pipes = [], []
    share = -(-len(shares) // workers)
    for w in range(workers):
        mine = shares[w * share:(w + 1) * share]
        if not mine:
            continue
        ours, theirs = mp.Pipe()
        target = zmq_worker if kind == "zmq" else sse_worker
        proc = mp.Process(target=target, args=(where, mine, prefix, theirs), daemon=True)
        proc.start()
        os.sched_setaffinity(proc.pid, cpus)
        procs.append(proc)
        pipes.append(ours)
    return procs, pipes
