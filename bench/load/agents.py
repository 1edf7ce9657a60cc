"""controller-scale's load generators: simulated agents as cheap frame producers.

Each generator process holds a share of the agents, one DEALER connection with its own
CurveZMQ key each, speaking the real protocol. What makes it cheap enough to load one
controller core from a part of another:

- connections are made before the clock starts, in batches, and an agent counts only
  once the controller acknowledged its hello (the CurveZMQ handshake and the binding
  are behind it);
- frames are encoded once: a heartbeat's bytes per agent (the controller reads neither
  its uptime nor its time stamp), and a summary's bytes around its sequence number, so
  a sequenced frame is a concatenation (checked once against the codec);
- one timer per process: 100 slots a second, each slot sends the frames of the agents
  whose turn it is; no per-agent timer, no per-agent Python object on the hot path.

Each report says how much CPU the process used per second of wall time and how far
behind its send schedule it fell, so a step says what the controller sustained and not
what the generator could send.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection

import msgpack
import zmq

from harmonaize import messages as m
from harmonaize.messages import decode, encode
from harmonaize.schema import to_plain

#: Agents that also send a sequenced host event a second and time its acknowledgement.
PROBES = 20
#: Slots a second: an agent's frames go out in its own slot.
SLOTS = 100
#: Connections made (and hellos awaited) at once.
CONNECT_BATCH = 500
#: A slot this late means the generator missed its schedule (heartbeats are due each
#: second; the controller counts a host down after three missed ones).
BEHIND = 0.5

SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))


@dataclass(frozen=True)
class Share:
    """One generator process's part of the load."""

    index: int
    endpoint: str
    server: bytes
    pairs: list[tuple[bytes, bytes]]
    refresh: float
    rate: float
    cpus: set[int]


def around_seq(body: m.Message, sender: str, stamp: float) -> tuple[bytes, bytes]:
    """The envelope's bytes before and after its sequence number (a fixed time stamp):
    ``head + msgpack(seq) + tail`` is the frame :func:`encode` makes."""
    head = b"\x97" + b"".join(msgpack.packb(v) for v in (m.MAGIC, m.VERSION, body.KIND, sender))
    tail = msgpack.packb(stamp) + msgpack.packb(to_plain(body), use_bin_type=True)
    probe = head + msgpack.packb(7) + tail
    if probe != encode(body, sender=sender, seq=7, now=stamp):
        raise SystemExit("controller-scale: pre-encoded frames differ from the codec's")
    return head, tail


class Generator:
    def __init__(self, share: Share, conn: Connection) -> None:
        self.share, self.conn = share, conn
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, len(share.pairs) + 100)
        self.socks: list[zmq.Socket] = []
        self.beats: list[bytes] = []  # each agent's heartbeat frame
        self.heads: list[bytes] = []  # each agent's summary frame, around its seq
        self.tail = b""
        self.seqs: list[int] = []
        self.phase: list[int] = []  # the beat, modulo the refresh, of each one's summary
        self.rng = random.Random(share.index)
        self.beats_per_refresh = max(1, round(share.refresh * share.rate))
        self.slots_per_beat = max(1, round(SLOTS / share.rate))
        self.blocked = 0
        self.sent = 0
        self.lag = 0.0
        self.latencies: list[tuple[float, float]] = []
        self.pending: dict[tuple[int, int], float] = {}

    def connect(self, target: int) -> None:
        """Connect agents up to ``target``, each counted once its hello is acknowledged."""
        stamp = time.time()
        while len(self.socks) < target:
            batch = []
            for _ in range(min(CONNECT_BATCH, target - len(self.socks))):
                i = len(self.socks)
                name = f"sim{self.share.index}-{i:05d}"
                secret, public = self.share.pairs[i]
                sock = self.ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 100)
                sock.curve_secretkey, sock.curve_publickey = secret, public
                sock.curve_serverkey = self.share.server
                sock.connect(self.share.endpoint)
                sock.send(encode(m.Hello(pool="scale", gpu_class="H200", gpus=8,
                                         version="bench", epoch=1, acked=0,
                                         heartbeat=1.0 / self.share.rate), sender=name))
                self.socks.append(sock)
                self.beats.append(encode(m.Heartbeat(uptime=0.0, last_seq=0), sender=name,
                                         now=stamp))
                head, self.tail = around_seq(SUMMARY, name, stamp)
                self.heads.append(head)
                self.seqs.append(0)
                self.phase.append(self.rng.randrange(self.beats_per_refresh))
                batch.append(sock)
            self._await_hellos(batch)
            # As the real agent does, its first summary right after the hello: later ones
            # are the unchanged refresh, so a step measures a region at rest.
            for i in range(len(self.socks) - len(batch), len(self.socks)):
                self.seqs[i] += 1
                self.socks[i].send(self.heads[i] + msgpack.packb(self.seqs[i]) + self.tail)

    def _await_hellos(self, batch: list[zmq.Socket]) -> None:
        poller = zmq.Poller()
        for sock in batch:
            poller.register(sock, zmq.POLLIN)
        waiting = set(batch)
        deadline = time.monotonic() + 120
        while waiting:
            if time.monotonic() > deadline:
                raise SystemExit(f"controller-scale: {len(waiting)} hellos unanswered in 120 s")
            for sock, _ in poller.poll(1000):
                if list(acks(sock)):  # read them all
                    waiting.discard(sock)  # type: ignore[arg-type]
                if sock not in waiting:
                    poller.unregister(sock)

    def run(self) -> None:
        start, tick, next_probe = time.monotonic(), 0, 0.0
        cpu0, wall0 = time.process_time(), time.monotonic()
        while True:
            due = start + tick / SLOTS
            # Wait for the slot (or a command): one timer for all this process's agents.
            if self.conn.poll(max(0.0, due - time.monotonic())):
                command = self.conn.recv()
                if command == "stop":
                    return
                if command == "report":
                    wall = time.monotonic() - wall0
                    self.conn.send({"blocked": self.blocked, "latencies": self.latencies,
                                    "lag": self.lag, "sent": self.sent, "wall": wall,
                                    "cpu": (time.process_time() - cpu0) / max(wall, 1e-9)})
                    self.blocked, self.sent, self.lag, self.latencies = 0, 0, 0.0, []
                    cpu0, wall0 = time.process_time(), time.monotonic()
                    continue
                self.connect(int(command))
                self.conn.send(len(self.socks))
                start, tick = time.monotonic(), 0  # connecting took time: start again
                cpu0, wall0 = time.process_time(), time.monotonic()
                self.blocked, self.sent, self.lag, self.latencies = 0, 0, 0.0, []
                continue
            now = time.monotonic()
            self.lag = max(self.lag, now - due)
            self._slot(tick)
            if self.share.index == 0 and now >= next_probe:
                next_probe = now + 1.0
                self._probe(now)
            self._probe_acks()
            tick += 1  # late slots run back to back until the schedule is caught up

    def _slot(self, tick: int) -> None:
        """Send the frames of the agents whose turn this slot is."""
        per = self.slots_per_beat
        beat = tick // per
        socks, beats, heads, seqs, phase = self.socks, self.beats, self.heads, self.seqs, \
            self.phase
        refresh, tail, packb = self.beats_per_refresh, self.tail, msgpack.packb
        blocked = 0
        again = zmq.Again
        noblock = zmq.NOBLOCK
        indices = range(tick % per, len(socks), per)
        for i in indices:
            if (beat + phase[i]) % refresh == 0:
                seq = seqs[i] = seqs[i] + 1  # the periodic refresh of an unchanged summary
                frame = heads[i] + packb(seq) + tail
            else:
                frame = beats[i]
            try:
                socks[i].send(frame, flags=noblock, copy=True)
            except again:
                blocked += 1
        self.blocked += blocked
        self.sent += len(indices) - blocked

    def _probe(self, now: float) -> None:
        name = self.share.index
        for p, sock in enumerate(self.socks[:PROBES]):
            self.seqs[p] += 1
            frame = encode(m.HostEvent("ScaleProbe", m.Severity.INFO),
                           sender=f"sim{name}-{p:05d}", seq=self.seqs[p])
            try:
                sock.send(frame, flags=zmq.NOBLOCK)
                self.pending[(p, self.seqs[p])] = now
            except zmq.Again:
                self.blocked += 1

    def _probe_acks(self) -> None:
        if self.share.index != 0:
            return
        for p, sock in enumerate(self.socks[:PROBES]):
            for reply in acks(sock):
                for key in [k for k in self.pending if k[0] == p and k[1] <= reply.seq]:
                    sent = self.pending.pop(key)
                    self.latencies.append((sent, (time.monotonic() - sent) * 1000))



def acks(sock: zmq.Socket) -> Iterator[m.Ack]:
    """The acknowledgements waiting on ``sock`` (every reply read, the others dropped)."""
    while True:
        try:
            reply = decode(sock.recv(flags=zmq.NOBLOCK)).body
        except zmq.Again:
            return
        if isinstance(reply, m.Ack):
            yield reply


def generate(share: Share, conn: Connection) -> None:
    """A generator process: its share of the agents, on the driver's commands."""
    os.sched_setaffinity(0, share.cpus)
    gen = Generator(share, conn)
    try:
        gen.run()
    finally:
        gen.ctx.destroy(linger=0)
