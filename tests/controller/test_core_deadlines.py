"""What the core does when its deadlines come: held-back updates, silent hosts, unanswered arms."""

from __future__ import annotations

import random

import pytest

from controller.core import ControllerCore
from controller.outputs import AgentPeer, Output, SendToAgent, TenantPeer, tenant_sends
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import decode
from tests.controller.test_core_with_outbox import (
    HOST,
    JOB,
    SUMMARY,
    TENANT,
    TOPIC,
    WALL,
    agent_frame,
    config,
    hello,
    placement,
    pool_sends,
    tenant_frame,
)

pytestmark = pytest.mark.redesign


def test_a_held_back_capacity_update_goes_out_at_its_deadline_and_not_before() -> None:
    core = ControllerCore(config(redaction={"mode": "redacted", "min_interval": 5.0,
                                          "jitter": 2.0}), 0.0,
                          rng=random.Random(5))
    core.receive(TenantPeer(b"t1", TENANT), tenant_frame(m.Subscribe(("pool/",))), 0.0)
    peer = AgentPeer(b"c1", HOST)
    core.receive(peer, agent_frame(hello()), 1.0)
    core.receive(peer, agent_frame(SUMMARY, 1), 1.0)
    assert pool_sends(core.tick(1.0, WALL)) == []  # even the first waits for its jitter
    first_due = core.next_deadline()
    assert first_due is not None and 1.0 < first_due <= 3.0
    assert pool_sends(core.tick(first_due - 0.01, WALL)) == []
    (first,) = pool_sends(core.tick(first_due, WALL))
    assert str(first.gpus_available) == "8-15"  # type: ignore[attr-defined]
    busy = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8, in_use=8))
    core.receive(peer, agent_frame(busy, 2), first_due + 0.1)
    assert pool_sends(core.tick(first_due + 0.1, WALL)) == []  # held back: the interval
    due = core.next_deadline()
    assert due is not None and first_due + 5.0 <= due <= first_due + 7.0
    assert pool_sends(core.tick(due - 0.01, WALL)) == []
    assert core.next_deadline() == due
    (later,) = pool_sends(core.tick(due, WALL))
    assert str(later.gpus_available) == "0"  # type: ignore[attr-defined]


def test_a_silent_host_is_counted_down_when_its_deadline_comes() -> None:
    core = ControllerCore(config(liveness={"missed_heartbeats": 3}), 0.0)
    core.place(placement(hosts=(HOST,)), 0.0, WALL)
    core.receive(TenantPeer(b"t1", TENANT), tenant_frame(m.Subscribe((TOPIC,))), 0.0)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello(heartbeat=1.0)), 0.0)
    core.tick(0.0, WALL)
    assert core.next_deadline() == 3.0  # three heartbeats of silence
    assert core.tick(2.9, WALL) == []
    assert core.tick(3.0, WALL) == []  # at the limit, not past it
    assert core.next_deadline() == 3.25  # looked once: again a check interval later
    health = [decode(o.frame).body for o in tenant_sends(core.tick(3.25, WALL))]
    assert [h.lost for h in health] == [("0",)]  # type: ignore[attr-defined]
    assert not core.cluster.hosts[HOST].alive


def test_an_unanswered_arm_is_resent_at_the_agreements_deadline() -> None:
    core = ControllerCore(config(tuning={"resend": 0.5, "arm_timeout": 5.0}), 0.0)
    hosts = ("h1", "h2")
    core.place(Placement(JOB, TENANT, tuple(Member(str(i), h) for i, h in enumerate(hosts))),
               0.0, WALL)
    for i, host in enumerate(hosts):
        peer = AgentPeer(host.encode(), host)
        core.receive(peer, agent_frame(hello(), sender=host), 0.0)
        state = m.SwitchState(collectives=1000)
        comm = m.CommReport(7, 4, 2, 2, 1000, 1000, 100.0, "default", 0, False, state, state)
        wish = m.TuningReport(JOB, "f00d", "severe" if i == 0 else "default", 2 if i == 0 else 0,
                              (comm,))
        core.receive(peer, agent_frame(wish, 1, sender=host), 1.0)

    def arms(outputs: list[Output]) -> list[bytes]:
        return sorted(o.conn for o in outputs
                      if isinstance(o, SendToAgent) and isinstance(o.message, m.TuningArm))

    assert arms(core.tick(1.0, WALL)) == [b"h1", b"h2"]
    assert core.next_deadline() == 1.5
    assert arms(core.tick(1.49, WALL)) == []
    assert arms(core.tick(1.5, WALL)) == [b"h1", b"h2"]  # nobody acknowledged: again
