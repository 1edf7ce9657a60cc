"""The controller's core joined to the agent's real outbox in memory: no root, no sockets.

Frames between the outbox and the core are dropped, duplicated and reordered on
the way, and the controller is killed at the worst moment (just after an
acknowledgement left); the real SQLite store is what survives. Nothing
acknowledged may be lost, nothing may reach the tenant twice, the deadlines the
core names are when its work is due, and the same inputs at the same times give
the same outputs.
"""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.outbox import Outbox
from controller.config import ControllerConfig
from controller.core import ControllerCore
from controller.outputs import (
    AgentPeer,
    AnswerTenant,
    BadFrame,
    Commit,
    Delivery,
    FanOut,
    Output,
    Prune,
    Replay,
    SendToAgent,
    SendToTenant,
    TenantPeer,
    tenant_sends,
)
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.config import parse
from harmonaize.messages import AGENT_KINDS, TENANT_KINDS, Envelope, decode, encode

pytestmark = pytest.mark.redesign

HOST = "gpu-host-17"
TENANT = "alpha"
JOB = "job-a"
TOPIC = f"job/{TENANT}/{JOB}/"
WALL = 1_700_000_000.0  # the wall clock at monotonic 0, for timestamps
EVENTS = 40
SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))


def config(**sections: dict[str, object]) -> ControllerConfig:
    plain: dict[str, dict[str, object]] = {
        "redaction": {"min_hosts": 1, "min_interval": 0, "jitter": 0},
        "feed": {"republish": 3600},
        "pools": {"names": ["p", "default"], "gpu_classes": ["H200", "none"]}}
    for name, values in sections.items():
        plain[name] = {**plain.get(name, {}), **values}
    return parse(ControllerConfig, plain)


def placement(job: str = JOB, hosts: tuple[str, ...] = (HOST,) * EVENTS) -> Placement:
    return Placement(job, TENANT, tuple(Member(str(i), h) for i, h in enumerate(hosts)))


def hello(heartbeat: float = 60.0, acked: int = 0) -> m.Hello:
    return m.Hello(pool="p", gpu_class="H200", gpus=8, version="t", epoch=1, acked=acked,
                   heartbeat=heartbeat)


def agent_frame(body: m.Message, seq: int = 0, now: float = 0.0,
                sender: str = HOST) -> Envelope:
    """Through the real wire format, as the shell decodes it."""
    return decode(encode(body, sender=sender, seq=seq, now=WALL + now), allowed=AGENT_KINDS)


def tenant_frame(body: m.Message, seq: int = 1) -> Envelope:
    return decode(encode(body, sender=TENANT, seq=seq, now=WALL), allowed=TENANT_KINDS,
                  strict=True)


def new_store(path: Path) -> Store:
    store = Store(path)
    store.set_meta("feed_epoch", 7)  # drawn at random per database: fixed for comparisons
    store.feed_epoch = 7
    return store


@dataclass
class Tenant:
    """A strict tenant: every message once, in order, per topic."""

    peer: bytes = b"tenant-1"
    positions: dict[str, int] = field(default_factory=dict)
    seen: list[tuple[str, int]] = field(default_factory=list)
    advisories: list[str] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)
    answers: list[m.Message] = field(default_factory=list)

    def got(self, topic: str, frame: bytes) -> None:
        envelope = decode(frame)
        assert (topic, envelope.seq) not in self.seen, f"{topic} {envelope.seq} twice"
        assert envelope.seq == self.positions.get(topic, 0) + 1, "a gap or a step back"
        self.seen.append((topic, envelope.seq))
        self.positions[topic] = envelope.seq
        self.frames.append(frame)
        if isinstance(envelope.body, m.JobAdvisory):
            self.advisories.extend(envelope.body.ranks)

    def subscribe(self) -> m.Subscribe:
        return m.Subscribe((TOPIC,), tuple(m.Position(t, s) for t, s in
                                           sorted(self.positions.items())), epoch=7)


class Run:
    """One agent's outbox and one tenant, joined to a core through lossy links."""

    def __init__(self, workdir: Path, seed: int) -> None:
        self.faults = random.Random(seed)
        self.store = new_store(workdir / "controller.db")
        self.core = ControllerCore(config(), 0.0, self.store.restored(),
                                   rng=random.Random(seed))
        self.outbox = Outbox(limit=10_000, ack_timeout=1.0)
        self.conn = b"conn-1"
        self.need_hello = True
        self.up: list[bytes] = []    # frames on their way to the core
        self.down: list[m.Message] = []  # and back to the agent
        self.tenant = Tenant()
        self.log: list[Output] = []  # everything the core said, for comparisons
        self.acks_seen = 0
        self.lossy = True

    def start(self) -> None:
        self.execute(self.core.place(placement(), 0.0, WALL))
        self.execute(self.core.receive(TenantPeer(self.tenant.peer, TENANT),
                                       tenant_frame(self.tenant.subscribe()), 0.0))

    # --- the links ---------------------------------------------------------------------

    def transmit(self, body: m.Message, seq: int, now: float) -> None:
        frame = encode(body, sender=HOST, seq=seq, now=WALL + now)
        roll = self.faults.random() if self.lossy else 1.0
        if roll < 0.15:
            return  # lost
        self.up.append(frame)
        if roll < 0.25:
            self.up.append(frame)  # duplicated

    def pump(self, now: float) -> None:
        """What agent/uplink.py's pump does with the outbox."""
        if self.need_hello:
            self.transmit(hello(acked=self.outbox.acked), 0, now)
            self.need_hello = False
        for seq, body in self.outbox.due(now):
            self.transmit(body, seq, now)
        while (item := self.outbox.take(now)) is not None:
            self.transmit(item[1], item[0], now)

    def to_agent(self, body: m.Message, now: float) -> None:
        """What agent/uplink.py's _handle does with the controller's answers."""
        if isinstance(body, m.Ack):
            self.outbox.ack(body.seq)
            self.acks_seen += 1
        elif isinstance(body, m.Resync):
            self.need_hello = True
            self.outbox.rewind(now)

    # --- the shell's part ----------------------------------------------------------------

    def execute(self, outputs: list[Output], crash_after_ack: bool = False) -> bool:
        """In order, as controller/server.py does; True if it crashed on the way."""
        self.log += outputs
        for out in outputs:
            if isinstance(out, Commit):
                self.store.commit(out.writes)
            elif isinstance(out, SendToAgent):
                if crash_after_ack and isinstance(out.message, m.Ack):
                    self.to_agent(out.message, 0.0)  # it got out, then the process died
                    return True
                self.down.append(out.message)
            elif isinstance(out, SendToTenant):
                self.tenant.got(out.topic, out.frame)
                self.core.delivered(out, Delivery.SENT)
            elif isinstance(out, FanOut):  # counted as sent when made
                for send in out.sends():
                    self.tenant.got(send.topic, send.frame)
            elif isinstance(out, AnswerTenant):
                self.tenant.answers.append(out.message)
                self.core.delivered(out, Delivery.SENT)
            elif isinstance(out, Replay):
                for _, frame in self.store.replay(out.topic, out.after, out.limit,
                                                  out.retained_from):
                    self.tenant.got(out.topic, frame)
            elif isinstance(out, Prune):
                self.store.prune_feed(out.retention)
        return False

    def step(self, now: float, crash_after_ack: bool = False) -> None:
        self.pump(now)
        frames, self.up = self.up, []
        if self.lossy and len(frames) > 1 and self.faults.random() < 0.3:
            i = self.faults.randrange(len(frames) - 1)
            frames[i], frames[i + 1] = frames[i + 1], frames[i]  # reordered
        out: list[Output] = []
        for frame in frames:
            out += self.core.receive(AgentPeer(self.conn, HOST),
                                     decode(frame, allowed=AGENT_KINDS), now)
        out += self.core.tick(now, WALL + now)
        if self.execute(out, crash_after_ack):
            self.restart(now)
            return
        replies, self.down = self.down, []
        for body in replies:
            if not self.lossy or self.faults.random() > 0.15:  # acks get lost too
                self.to_agent(body, now)

    def restart(self, now: float) -> None:
        """kill -9: the core's memory and everything in flight are gone, the store is not."""
        self.up, self.down = [], []
        self.core = ControllerCore(config(), now, self.store.restored(),
                                   rng=random.Random(1))
        self.conn = b"conn-2"  # the agent's socket reconnects: a new routing id
        self.execute(self.core.receive(TenantPeer(b"tenant-2", TENANT),
                                       tenant_frame(self.tenant.subscribe()), now))

    def scenario(self, crash_at: int) -> None:
        self.start()
        t = 0.0
        for i in range(EVENTS):
            self.outbox.add(m.HostEvent(f"E{i}", m.Severity.INFO))
            self.outbox.add(m.JobAdvisory(JOB, m.Advice.CHECKPOINT_NOW, "gpu-failure",
                                          m.Urgency.HIGH, (str(i),)))
            self.step(t, crash_after_ack=i == crash_at and self.acks_seen > 0)
            t += 0.25
        self.lossy = False  # then the links heal: everything must arrive
        for _ in range(40):
            self.step(t)
            t += 0.25


def test_an_outbox_through_lossy_links_and_a_kill_loses_nothing_acknowledged(
        tmp_path: Path) -> None:
    run = Run(tmp_path, seed=3)
    run.scenario(crash_at=EVENTS // 2)
    assert run.conn == b"conn-2"  # it did crash
    assert len(run.outbox) == 0 and run.outbox.acked == run.outbox.last_sent == 2 * EVENTS
    # Every event the outbox was told is stored is stored, once.
    stored = [e["reason"] for e in run.store.recent_events(1000)]
    assert sorted(stored) == sorted(f"E{i}" for i in range(EVENTS))
    # Every advice reached the tenant once, in order, across the kill (Tenant.got
    # refuses a duplicate or a gap).
    assert run.tenant.advisories == [str(i) for i in range(EVENTS)]
    # Rebuilt, never copied: the host's name reaches no tenant.
    assert not any(HOST.encode() in frame for frame in run.tenant.frames)
    assert all(isinstance(a, m.Subscribed) for a in run.tenant.answers)


def test_the_same_inputs_at_the_same_times_give_the_same_outputs(tmp_path: Path) -> None:
    runs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        run = Run(tmp_path / name, seed=11)
        run.scenario(crash_at=EVENTS)  # no crash: one core all along
        runs.append(run)
    assert runs[0].log == runs[1].log
    assert any(isinstance(out, Commit) for out in runs[0].log)
    # A third run, its inputs at other times, says something else (the comparison can fail).
    (tmp_path / "three").mkdir()
    other = Run(tmp_path / "three", seed=11)
    other.start()
    other.outbox.add(m.HostEvent("E0", m.Severity.INFO))
    other.step(0.5)
    assert other.log != runs[0].log[:len(other.log)]


def test_a_frame_from_another_hosts_key_is_rejected_and_counted() -> None:
    core = ControllerCore(config(), 0.0)
    assert core.receive(AgentPeer(b"c1", "other-host"), agent_frame(hello()), 0.0) == []
    assert core.receive(AgentPeer(b"c1", HOST), BadFrame("invalid", "junk"), 0.0) == []
    assert core.rejected == {"identity": 1, "invalid": 1} and core.frames == 2
    assert not core.cluster.hosts


def pool_sends(outputs: list[Output]) -> list[m.Message]:
    return [decode(o.frame).body for o in tenant_sends(outputs)
            if o.topic.startswith("pool/")]


def test_the_core_imports_no_socket_database_event_loop_or_clock() -> None:
    root = Path(__file__).resolve().parents[2]
    pure = ["core", "outputs", "declarations", "publications", "types", "views", "cluster",
            "redaction", "agreement", "feed"]
    banned = {"time", "zmq", "asyncio", "sqlite3", "socket", "selectors"}
    for name in pure:
        tree = ast.parse((root / "controller" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not {n.split(".")[0] for n in names} & banned, (name, names)
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, controller.core, controller.views; "
         "print(' '.join(sorted(sys.modules)))"],
        cwd=root, capture_output=True, text=True, check=True).stdout.split()
    assert not {n.split(".")[0] for n in loaded} & banned - {"time"}
