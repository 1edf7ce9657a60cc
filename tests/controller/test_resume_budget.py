"""Resume requests cost what the tenant's budget allows, and never the agents' turn."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import zmq

from controller.feed import Budgets, FeedHub, TokenBucket
from harmonaize import messages as m
from harmonaize.messages import encode
from tests.conftest import needs_root
from tests.controller.test_feed import Sender, advice, place
from tests.daemons import FakeAgent, curve_dealer, keyring, start_controller

pytestmark = [pytest.mark.hardening, pytest.mark.controller]


def test_a_token_bucket_grants_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=50.0)
    assert bucket.take(40, 0.0) == 40
    assert bucket.take(40, 0.0) == 10  # what is left of the burst
    assert bucket.take(5, 0.0) == 0
    assert bucket.take(100, 2.0) == 20  # 2 s at 10 a second
    assert bucket.take(100, 1000.0) == 50  # never more than the burst saved up
    assert bucket.take(1, 999.0) == 0  # time going backwards adds nothing


def test_a_reload_changes_the_budgets_of_tenants_already_seen() -> None:
    hub = FeedHub(budgets=Budgets(request_rate=1.0, request_burst=100.0,
                                  replay_rate=1.0, replay_burst=1000.0))
    assert hub.admit("alpha", 0.0) and hub.replay_allowance("alpha", 10, 0.0) == 10
    hub.configure(Budgets(request_rate=1.0, request_burst=2.0, replay_rate=5.0,
                          replay_burst=20.0))
    assert [hub.admit("alpha", 0.0) for _ in range(3)] == [True, True, False]
    assert hub.replay_allowance("alpha", 100, 0.0) == 20  # the new burst, not 990 left
    assert hub.replay_allowance("alpha", 100, 2.0) == 10  # the new rate: 5 a second
    assert [hub.admit("beta", 0.0) for _ in range(3)] == [True, True, False]  # new ones too


@needs_root
def test_a_thousand_resumes_from_zero_neither_stall_agents_nor_cost_unbounded(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir, extra="[liveness]\nmissed_heartbeats = 3\n")
    place(controller, "job-a", "alpha", "h1")
    ctx = zmq.Context()
    stop = threading.Event()
    try:
        sender = Sender(FakeAgent(ctx, controller))
        for i in range(500):
            sender.send(advice("job-a", 0), wait=i % 50 == 49)
        attacker = curve_dealer(ctx, controller, keyring(workdir).tenant("alpha"),
                                controller.feed, {zmq.RCVHWM: 0})
        request = encode(m.Subscribe(("job/alpha/",), (m.Position("job/alpha/job-a/", 0),),
                                     epoch=1), sender="t")
        beat = FakeAgent(ctx, controller, "h2")
        assert beat.hello() == m.Ack(0)

        def heartbeats() -> None:  # live hosts, beating once a second throughout
            while not stop.wait(1.0):
                beat.send(m.Heartbeat(uptime=1.0, last_seq=0))
                sender.agent.send(m.Heartbeat(uptime=1.0, last_seq=500))

        beater = threading.Thread(target=heartbeats)
        beater.start()
        began = time.monotonic()
        for _ in range(1000):
            attacker.send(request)
        time.sleep(3.5)  # more than the liveness period: the host must stay up
        elapsed = time.monotonic() - began
        status = controller.request("status")
        stop.set()
        beater.join()
        stats = status["feed_stats"]
        assert stats["throttled_requests"] >= 800 and stats["replays_throttled"] >= 1
        assert stats["replayed_messages"] <= 10_000 + 2000 * elapsed
        assert status["protocol"].get("host_down", 0) == 0  # neither counted down
        assert all(h["alive"] for h in controller.request("hosts"))
    finally:
        stop.set()
        ctx.destroy(linger=0)
