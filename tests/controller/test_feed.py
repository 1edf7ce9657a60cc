"""The tenant side of the controller: authentication, access control, resume, durability."""

from __future__ import annotations

import contextlib
import random
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from harmonaize import messages as m
from harmonaize.messages import decode, encode
from harmonaize.tenant.client import FeedClient, FeedError, RequestError
from tests.conftest import needs_root
from tests.daemons import (
    Controller,
    FakeAgent,
    curve_dealer,
    keyring,
    start_controller,
    tenant_feed,
    wait_until,
)

pytestmark = [pytest.mark.controller, needs_root]

SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))
FAST_RENEW = "[feed]\nrenew = 1\n"



def place(controller: Controller, job: str, tenant: str, *hosts: str) -> None:
    controller.request("place", {"job": job, "tenant": tenant, "members": [
        {"name": str(i), "host": h} for i, h in enumerate(hosts)]})


def advice(job: str, rank: int) -> m.JobAdvisory:
    return m.JobAdvisory(job, m.Advice.CHECKPOINT_NOW, "gpu-memory", m.Urgency.HIGH,
                         (str(rank),))


class Sender:
    """A FakeAgent that delivers events reliably, as the real agent's outbox does."""

    def __init__(self, agent: FakeAgent, epoch: int = 1) -> None:
        self.agent, self.epoch, self.acked, self.seq = agent, epoch, 0, 0
        assert agent.hello(epoch=epoch) == m.Ack(0)

    def send(self, body: m.Message, wait: bool = True) -> None:
        self.seq += 1
        self.agent.send(body, seq=self.seq)
        if wait:
            self.acked = self.wait_ack(self.seq)

    def wait_ack(self, seq: int, timeout: float = 5.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.agent.sock.poll(100):
                reply = decode(self.agent.sock.recv()).body
                if isinstance(reply, m.Ack) and reply.seq >= seq:
                    return reply.seq
        raise AssertionError(f"no ack for {seq}")

    def reconnect(self) -> None:
        """After a controller restart: hello, learn what is stored, resend the rest."""
        deadline = time.monotonic() + 20
        while True:
            self.agent.send(m.Hello(pool="p", gpu_class="H200", gpus=8, version="t",
                                    epoch=self.epoch, acked=self.acked, heartbeat=1.0))
            if self.agent.sock.poll(1000):
                reply = decode(self.agent.sock.recv()).body
                if isinstance(reply, m.Ack):
                    break
            assert time.monotonic() < deadline, "the controller never came back"
        self.acked = reply.seq
        self.seq = reply.seq


@contextlib.contextmanager
def locked(database: Path) -> Iterator[None]:
    """Hold the database's write lock (the controller's commits wait for it, up to the
    five seconds SQLite waits by default)."""
    db = sqlite3.connect(database, isolation_level=None, timeout=0)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def drain(feed: FeedClient, until: int, kind: type, timeout: float = 20.0) -> list[m.Message]:
    got: list[m.Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < until and time.monotonic() < deadline:
        message = feed.recv(timeout=0.2)
        if message is not None and isinstance(message.body, kind):
            got.append(message.body)
    return got


def test_tenants_see_only_their_own_jobs(spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir)
    place(controller, "job-a", "alpha", *["h1"] * 5)  # ranks 0-4, all on h1
    place(controller, "job-b", "beta", *["h1"] * 5)
    sender = Sender(FakeAgent(ctx, controller))
    with tenant_feed(controller, ["pool/", "job/alpha/"], "alpha") as alpha, \
            tenant_feed(controller, ["pool/", "job/beta/", "job/alpha/", "job/", "job/beta",
                                     ""], "beta") as beta:
        assert alpha.recv(timeout=10) is not None  # job-a's health: subscribed
        wait_until(lambda: beta.recv(timeout=0.2) is not None, what="beta's subscription")
        sender.send(SUMMARY)
        for i in range(5):
            sender.send(advice("job-a", i))
            sender.send(advice("job-b", i))
        alpha_saw = drain(alpha, 5, m.JobAdvisory)
        beta_saw = drain(beta, 5, m.JobAdvisory)
        assert [a.ranks[0] for a in alpha_saw] == ["0", "1", "2", "3", "4"]
        assert {a.job for a in alpha_saw} == {"job-a"}
        assert {a.job for a in beta_saw} == {"job-b"} and len(beta_saw) == 5
        refused = {r.topic: r.reason for r in beta.refused}
        assert beta.tenant == "beta" and alpha.tenant == "alpha"
        assert refused == {"job/alpha/": "not your job",
                           "job/": "too broad: subscribe to pool/ or job/beta/",
                           "job/beta": "too broad: subscribe to pool/ or job/beta/",
                           "": "too broad: subscribe to pool/ or job/beta/"}
        assert {r.topic: r.code for r in beta.refused} == {
            "job/alpha/": "not-your-job", "job/": "too-broad", "job/beta": "too-broad",
            "": "too-broad"}
    status = controller.request("status")
    assert status["feed_stats"]["refused_subscriptions"] >= 4
    assert "refused tenant 'beta' a subscription to 'job/alpha/'" in controller.log.read_text()


def test_unknown_and_unauthenticated_peers_are_refused(spawn, workdir: Path,
                                                       ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir)
    ring = keyring(workdir)
    ring.tenant("alpha")
    stranger = ring.tenant("mallory", allowed=False)
    with FeedClient(controller.feed, ["pool/"], key=stranger.key,
                    server_key=stranger.server_key) as feed, \
            pytest.raises(FeedError, match="refused this key"):
        feed.recv(timeout=5.0)  # said, not a silent wait
    assert feed.tenant is None
    with FeedClient(controller.feed, ["pool/"]) as plain:  # no CurveZMQ at all
        assert plain.recv(timeout=1.0) is None and plain.tenant is None
    # Keys only open their own door: an agent's key is no tenant, a tenant's no agent.
    host_creds = ring.agent("h1")
    with FeedClient(controller.feed, ["pool/"], key=host_creds.key,
                    server_key=host_creds.server_key) as wrong_door, \
            pytest.raises(FeedError, match="refused this key"):
        wrong_door.recv(timeout=5.0)
    tenant_as_agent = curve_dealer(ctx, controller, ring.tenant("alpha"))
    tenant_as_agent.send(encode(m.Hello(pool="p", gpu_class="H200", gpus=8, version="t",
                                        epoch=1, acked=0, heartbeat=1.0), sender="alpha"))
    assert not tenant_as_agent.poll(1000)
    # A host's key cannot speak for another host.
    impostor = FakeAgent(ctx, controller, host="h1", creds=ring.agent("h2"))
    impostor.send(m.Hello(pool="p", gpu_class="H200", gpus=8, version="t", epoch=1, acked=0,
                          heartbeat=1.0))
    wait_until(lambda: controller.request("status")["rejected"].get("identity"),
               what="the impostor to be rejected")
    auth = controller.request("status")["auth"]
    assert auth["mode"] == "curve" and auth["refused"]["unknown tenants key"] >= 2
    assert auth["refused"]["unknown agents key"] >= 1
    assert controller.request("hosts") == []
    tenants = {t["tenant"]: t for t in controller.request("tenants")}
    assert tenants["alpha"]["key"] is True and "mallory" not in tenants


def test_without_auth_tenants_get_pool_topics_only(spawn, workdir: Path,
                                                   ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir, extra='[auth]\nmode = "none"\n')
    agent = FakeAgent(ctx, controller, plain=True)
    agent.hello()
    agent.send(SUMMARY, seq=1)
    with FeedClient(controller.feed, ["pool/", "job/acme/"]) as feed:
        message = feed.recv(timeout=10)
        assert message is not None and message.topic.startswith("pool/")
        assert feed.tenant == "" and [r.topic for r in feed.refused] == ["job/acme/"]
        with pytest.raises(RequestError, match="not authenticated"):
            feed.declare(m.JobDeclaration("job-a"))


def test_declarations_reach_the_jobs_hosts_and_only_from_their_owner(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    h1, h2 = FakeAgent(ctx, controller, "h1"), FakeAgent(ctx, controller, "h2")
    h1.hello()
    h2.hello()
    place(controller, "job-a", "alpha", "h1")
    declaration = m.JobDeclaration("job-a", 120.0, (m.TuningRange(
        (m.Collective.ALLREDUCE,), (m.Algorithm.RING,), (m.Protocol.SIMPLE,)),), revision=1)
    with tenant_feed(controller, ["pool/"], "alpha") as alpha, \
            tenant_feed(controller, ["pool/"], "beta") as beta:
        alpha.declare(declaration)
        assert h1.recv() == declaration
        assert not h2.sock.poll(300)
        with pytest.raises(RequestError, match="no job 'job-a' of yours"):
            beta.declare(m.JobDeclaration("job-a", 3600.0))
        with pytest.raises(RequestError, match="no job 'job-z' of yours"):
            alpha.declare(m.JobDeclaration("job-z"))
    # Garbage in the tenant's request gets an error back; the controller keeps serving.
    raw = curve_dealer(ctx, controller, keyring(workdir).tenant("alpha"), controller.feed)
    raw.send(msgpack.packb(["hz", 1, "job-declaration", "t", 7, 1.0,
                            {"job": "job-a", "max_validation_pause": -5}]))
    assert raw.poll(5000)
    topic, frame = raw.recv_multipart()
    reply = decode(frame).body
    assert topic == b"" and isinstance(reply, m.Reply) and not reply.ok
    assert "max_validation_pause" in reply.error
    # A host that reconnects learns it again; the end of the job withdraws it.
    h1.hello(epoch=2)
    assert h1.recv() == declaration
    assert controller.request("tenants")[0]["declared"] == ["job-a"]
    controller.request("unplace", {"job": "job-a"})
    assert h1.recv() == m.JobDeclaration("job-a", withdrawn=True)


def test_a_killed_controller_loses_nothing_acknowledged_and_delivers_nothing_twice(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir, extra=FAST_RENEW)
    ports = (int(controller.listen.rsplit(":", 1)[1]), int(controller.feed.rsplit(":", 1)[1]))
    place(controller, "job-a", "alpha", *["h1"] * 40)  # ranks mark each message
    sender = Sender(FakeAgent(ctx, controller))
    with tenant_feed(controller, ["job/alpha/"], "alpha", gap_timeout=30) as feed:
        assert feed.recv(timeout=10) is not None  # job health: subscribed
        for i in range(20):
            sender.send(advice("job-a", i))
        # The shell stores a batch before it acknowledges it: while the database is
        # locked (its commit waits), no acknowledgement may come.
        with locked(workdir / "controller.db"):
            sender.send(advice("job-a", 20), wait=False)
            assert not sender.agent.sock.poll(1000), "acknowledged before it was stored"
        sender.acked = sender.wait_ack(21)
        controller.proc.send_signal(signal.SIGKILL)  # at once: what was acked is stored
        controller.proc.wait(timeout=10)
        sender.send(advice("job-a", 21), wait=False)  # into the void: surely not stored
        controller = start_controller(spawn, workdir, extra=FAST_RENEW, ports=ports)
        sender.reconnect()
        assert sender.seq == 21  # the restarted controller knows the last one acked
        for i in range(sender.seq, 40):
            sender.send(advice("job-a", i))
        got = drain(feed, 40, m.JobAdvisory, timeout=30)
        ranks = [int(a.ranks[0]) for a in got]
        assert ranks == list(range(40)), ranks
        assert drain(feed, 1, m.JobAdvisory, timeout=1.5) == []  # and nothing more
        assert feed.stats.gaps == 0


def test_a_tenant_resumes_where_it_left_off(spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir)
    place(controller, "job-a", "alpha", *["h1"] * 8)  # ranks mark each message
    sender = Sender(FakeAgent(ctx, controller))
    with tenant_feed(controller, ["job/alpha/"], "alpha") as feed:
        assert feed.recv(timeout=10) is not None
        for i in range(3):
            sender.send(advice("job-a", i))
        assert len(drain(feed, 3, m.JobAdvisory)) == 3
        positions = feed.positions
    for i in range(3, 8):  # while the tenant is away
        sender.send(advice("job-a", i))
    with tenant_feed(controller, ["job/alpha/"], "alpha", resume=positions) as back:
        missed = drain(back, 5, m.JobAdvisory)
        assert [a.ranks[0] for a in missed] == ["3", "4", "5", "6", "7"]
    with tenant_feed(controller, ["job/alpha/"], "alpha") as fresh:  # no history for newcomers
        assert drain(fresh, 1, m.JobAdvisory, timeout=1.5) == []
    assert controller.request("status")["feed_stats"]["replays"] >= 1


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_slow_subscriber_loses_only_its_own_messages(spawn, workdir: Path,
                                                       ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir,
                                  extra="[feed]\nsend_hwm = 50\nsocket_buffer = 16384\n"
                                  "retention = 5000\n")  # the fast one may need it all
    place(controller, "job-a", "alpha", *["h1"] * 1000)  # ranks mark the messages
    sender = Sender(FakeAgent(ctx, controller))
    slow = curve_dealer(ctx, controller, keyring(workdir).tenant("alpha"), controller.feed,
                        {zmq.RCVHWM: 1, zmq.RCVBUF: 4096})
    slow.send(encode(m.Subscribe(("job/alpha/",)), sender="t"))  # and never reads again
    wait_until(lambda: controller.request("feed"), what="the slow subscriber")
    before = rss_kib(controller.proc.pid)
    count = 3000
    with tenant_feed(controller, ["job/alpha/"], "alpha") as fast:
        assert fast.recv(timeout=10) is not None
        for i in range(count):  # pipelined, as an agent with a backlog sends
            sender.seq += 1
            sender.agent.send(advice("job-a", i % 1000), seq=sender.seq)
        got = drain(fast, count, m.JobAdvisory, timeout=60)
        assert [int(a.ranks[0]) for a in got] == [i % 1000 for i in range(count)]
        assert fast.stats.gaps == 0
    rows = controller.request("feed")
    slow_row = max(rows, key=lambda row: row["dropped"])
    assert slow_row["sent"] < 500 and slow_row["dropped"] >= count - 500, (
        rows, controller.request("status")["feed_stats"])
    # Its queue is bounded: the controller did not keep what the slow one could not take.
    assert rss_kib(controller.proc.pid) - before < 20_000


def test_fuzzed_frames_are_counted_and_the_controller_keeps_serving(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    rng = random.Random(7)
    valid = [encode(m.Subscribe(("pool/",), (m.Position("pool/p/H200", 3),)), sender="t"),
             encode(m.JobDeclaration("job-a", 30.0), sender="t", seq=1)]
    tenant = curve_dealer(ctx, controller, keyring(workdir).tenant("alpha"), controller.feed)
    agent = FakeAgent(ctx, controller, "h9")
    sent = 0
    for i in range(600):
        if i % 3 == 0:
            frame = rng.randbytes(rng.randint(0, 300))
        else:  # a valid frame with a few bytes changed
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            frame = bytes(data)
        if not frame:
            continue
        (tenant if i % 2 else agent.sock).send(frame)
        sent += 1
    tenant.send_multipart([b"a", b"b", b"c"])
    wait_until(lambda: controller.request("status")["frames"] >= sent // 2 - 5,
               what="the agent-side frames to be handled")
    status = controller.request("status")
    assert sum(status["rejected"].values()) > 0 and status["feed_stats"]["bad_request"] > 0
    assert controller.proc.poll() is None
    sender = Sender(FakeAgent(ctx, controller, "h1"))
    sender.send(SUMMARY)
    with tenant_feed(controller, ["pool/"], "alpha") as feed:
        message = feed.recv(timeout=10)
        assert message is not None and isinstance(message.body, m.PoolCapacity)
