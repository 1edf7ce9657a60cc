"""Issue 28, item 10: what a compromised agent names and how much it announces.

Pool and GPU-class names reach tenants only as the operator declared them ([pools]):
an agent naming its pool like a host name or its class like an address is left out of
tenants' capacity, counted and logged once. And the validation notices kept are bounded
per host and per job however many distinct ones an agent sends."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import zmq

from controller.core import ControllerCore
from controller.outputs import AgentPeer, Commit, TenantPeer, tenant_sends
from controller.store import Store
from harmonaize import messages as m
from harmonaize.messages import decode
from harmonaize.schema import to_plain
from tests.conftest import needs_root
from tests.controller.test_core_with_outbox import HOST, WALL, agent_frame, config, tenant_frame
from tests.controller.test_feed import place
from tests.daemons import FakeAgent, start_controller, tenant_feed, wait_until

pytestmark = [pytest.mark.hardening, needs_root]

HOST_LIKE_POOL = "gpu-node-17.dc1.example.com"
ADDRESS_LIKE_CLASS = "10.20.30.40"



def say_hello(ctx: zmq.Context, controller, host: str, pool: str, gpu_class: str
              ) -> FakeAgent:
    agent = FakeAgent(ctx, controller, host)
    agent.send(m.Hello(pool=pool, gpu_class=gpu_class, gpus=8, version="t", epoch=1,
                       acked=0, heartbeat=1.0))
    assert agent.recv() == m.Ack(0)
    agent.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8)), seq=1)
    assert agent.recv() == m.Ack(1)
    return agent


def test_agent_pool_named_like_a_host_and_class_like_an_address_never_reach_a_tenant(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir, "[feed]\nrepublish = 0.5\n")
    with tenant_feed(controller, ["pool/"], context=ctx) as feed:
        named = {"good": ("p", "H200"), "evil1": (HOST_LIKE_POOL, "H200"),
                 "evil2": ("p", ADDRESS_LIKE_CLASS),
                 "evil3": (HOST_LIKE_POOL, ADDRESS_LIKE_CLASS)}
        agents = [say_hello(ctx, controller, host, *names) for host, names in named.items()]
        seen: list[tuple[str, object]] = []
        republished = 0
        deadline = time.monotonic() + 30
        while republished < 3:  # three rounds of every condition: all there is to see
            assert time.monotonic() < deadline, f"the feed stalled: {seen}"
            message = feed.recv(timeout=2)
            if message is None:
                continue
            seen.append((message.topic, to_plain(message.body)))
            republished += message.topic == "pool/p/H200"
        # The evil hosts said hello again: still held back, still not logged twice.
        for agent in agents[1:]:
            pool, gpu_class = named[agent.host]
            agent.send(m.Hello(pool=pool, gpu_class=gpu_class, gpus=8, version="t", epoch=1,
                               acked=1, heartbeat=1.0))
            assert agent.recv() == m.Ack(1)
    assert {topic for topic, _ in seen} == {"pool/p/H200"}
    text = repr(seen)
    assert HOST_LIKE_POOL not in text and ADDRESS_LIKE_CLASS not in text
    # The declared pool counts the good host only (the bucket 0-1, not 2-3 or more).
    assert all(body["hosts_up"]["lo"] == 0 for _, body in seen)
    status = wait_until(lambda: (s := controller.request("status"))["held_back_hosts"] == 3
                        and s, what="three hosts held back")
    assert status["protocol"]["pool_names_held_back"] == 3
    log = controller.log.read_text()
    assert log.count("which [pools] does not declare") == 3
    # The operator still sees its hosts as the agents named them.
    assert {(h["host_id"], h["pool"]) for h in controller.request("hosts")} >= {
        ("evil1", HOST_LIKE_POOL)}
    # A new pool is shown once the operator declares it and reloads.
    agents.append(say_hello(ctx, controller, "new", "q", "H200"))
    config = controller.config.read_text()
    assert 'names = ["default",' in config
    controller.config.write_text(config.replace('names = ["default",', 'names = ["q", "default",'))
    controller.request("reload")
    with tenant_feed(controller, ["pool/"], context=ctx) as feed:
        wait_until(lambda: (message := feed.recv(timeout=1)) is not None
                   and message.topic == "pool/q/H200", what="the declared pool's topic")
    for agent in agents:
        agent.close()


def test_notices_kept_are_bounded_per_host_and_per_job_after_20000_distinct_ones(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir, "[notices]\nper_host = 30\nper_job = 20\n")
    place(controller, "job-a", "acme", "h1")
    place(controller, "job-b", "acme", "h1")
    agent = FakeAgent(ctx, controller, "h1")
    assert agent.hello() == m.Ack(0)
    starts = time.time() + 600
    total = 20_000

    def notice(seq: int) -> m.ValidationNotice:
        job = "job-a" if seq <= total // 2 else "job-b"  # job-a fills its bound first
        return m.ValidationNotice(job, ("0",), 60, starts, f"plan-{seq}", starts)

    acked = 0

    def take_acks(wait_ms: int) -> None:
        nonlocal acked
        while agent.sock.poll(wait_ms):
            reply = decode(agent.sock.recv()).body
            if isinstance(reply, m.Ack):
                acked = max(acked, reply.seq)
            wait_ms = 0

    for seq in range(1, total + 1):  # pipelined, as an agent's outbox would
        agent.send(notice(seq), seq=seq)
        take_acks(0)
    deadline = time.monotonic() + 300
    while acked < total:
        assert time.monotonic() < deadline, f"acknowledged up to {acked} of {total}"
        take_acks(1000)
        if acked < total:  # an ack lost to a full queue: the agent sends the next again
            agent.send(notice(acked + 1), seq=acked + 1)
    db = sqlite3.connect(f"file:{workdir / 'controller.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT state FROM notices").fetchall()
        per_job = dict(db.execute(
            "SELECT json_extract(state, '$.job'), COUNT(*) FROM notices GROUP BY 1"))
    finally:
        db.close()
    assert len(rows) == 30 and per_job == {"job-a": 20, "job-b": 10}
    status = controller.request("status")
    assert status["protocol"]["job_message_too_many_notices"] == total - 30
    assert controller.proc.poll() is None
    agent.close()


def test_undeclared_pool_topic_kept_from_before_is_neither_republished_nor_given_to_new_subscribers(
        tmp_path: Path) -> None:
    """A database from a controller that took any name (here: one that declared it) keeps
    the topic an agent named; the controller that no longer declares it drops it."""
    def run(outputs: list) -> list:
        for out in outputs:
            if isinstance(out, Commit):
                store.commit(out.writes)
        return outputs

    store = Store(tmp_path / "c.db")
    before = config(pools={"names": ["p", HOST_LIKE_POOL], "gpu_classes": ["H200"]})
    core = ControllerCore(before, 0.0, store.restored())
    core.receive(AgentPeer(b"c1", HOST), agent_frame(m.Hello(
        pool=HOST_LIKE_POOL, gpu_class="H200", gpus=8, version="t", epoch=1, acked=0,
        heartbeat=3600.0)), 0.0)
    run(core.tick(0.0, WALL))
    # The private release, after its interval (a one-host pool's plan: every 6 h).
    run(core.tick(22000.0, WALL + 22000))
    evil = f"pool/{HOST_LIKE_POOL}/H200"
    assert evil in core.feed.latest
    store.close()

    store = Store(tmp_path / "c.db")
    core = ControllerCore(config(), 0.0, store.restored())  # declares "p" and "default"
    out = run(core.receive(TenantPeer(b"t1", "acme"), tenant_frame(m.Subscribe(("pool/",))),
                           1.0))
    out += run(core.tick(5000.0, WALL + 5000))  # republications and releases since
    sent = tenant_sends(out)
    assert all(HOST_LIKE_POOL not in o.topic and HOST_LIKE_POOL.encode() not in o.frame
               for o in sent)
    assert evil not in core.feed.latest
    store.close()
