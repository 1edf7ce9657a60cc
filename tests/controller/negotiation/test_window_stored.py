"""In the core with the real store: a maintenance window the tenant agreed is stored with
its notice, goes to the host that planned the validation after the Commit that stores
it, and is told again to the host when it reconnects to a restarted controller."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.notices import Notice, Notices
from controller.outputs import AgentPeer, AnswerTenant, Commit, SendToAgent, TenantPeer
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from tests.controller.test_core_with_outbox import (
    HOST,
    WALL,
    agent_frame,
    config,
    hello,
    tenant_frame,
)

pytestmark = pytest.mark.negotiation

JOB = "job-7"


def negotiating() -> object:
    return config(negotiation={"weights": {"acme": 1.0},
                               "least_notice": {"correctable-trend": 10.0}})


def run(store: Store, outputs: list) -> list:
    for out in outputs:
        if isinstance(out, Commit):
            store.commit(out.writes)
    return outputs


def test_an_agreed_window_is_stored_sent_after_its_commit_and_sent_again(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    core = ControllerCore(negotiating(), 0.0, store.restored())
    run(store, core.place(Placement(JOB, "acme", (Member("3", HOST),)), 0.0, WALL))
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    run(store, core.tick(0.0, WALL))
    declared = m.JobDeclaration(JOB, 600.0, revision=1)
    run(store, core.receive(TenantPeer(b"t1", "acme"), tenant_frame(declared), 0.1))
    core.receive(TenantPeer(b"t1", "acme"), tenant_frame(m.Subscribe(("job/acme/",))), 0.2)
    plan = m.ValidationNotice(JOB, ("3",), 60, WALL + 600, "v17-1", WALL + 600,
                              cause=m.ValidationCause.CORRECTABLE_TREND)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(plan, 1, 1.0), 1.0)
    told = [m.decode(o.frame).body for o in run(store, core.tick(1.0, WALL + 1))
            if hasattr(o, "frame")]
    notice = told[-1]
    assert isinstance(notice, m.ValidationNotice)
    assert notice.cause is m.ValidationCause.CORRECTABLE_TREND
    (window,) = [i.window for i in core.negotiation.maintenance.items.values()]
    assert (window.notice_id, window.start) == (notice.id, WALL + 600)
    # Too soon for the condition's least notice (10 s): no window fits, the provider's
    # stands (overridden), and the host is told its own start.
    out = run(store, core.receive(TenantPeer(b"t1", "acme"), tenant_frame(
        m.MaintenanceCounter(notice.id, (WALL + 5,)), seq=4), 2.0))
    assert isinstance(out[0], Commit) and out[0].writes.notices[notice.id].window == WALL + 600
    assert out[1] == SendToAgent(b"c1", m.ValidationDecision("v17-1", JOB, start=WALL + 600))
    assert isinstance(out[2], AnswerTenant)
    assert out[2].message.negotiation[0].state == "overridden"  # type: ignore[attr-defined]
    store.close()
    # A new controller from the same database: the host says hello and hears it again.
    store = Store(tmp_path / "c.db")
    core = ControllerCore(negotiating(), 0.0, store.restored())
    assert core.notices.get(notice.id).window == WALL + 600
    core.receive(AgentPeer(b"c9", HOST), agent_frame(hello(), 0, 5.0), 5.0)
    sends = [o for o in core.tick(5.0, WALL + 5) if isinstance(o, SendToAgent)]
    assert SendToAgent(b"c9", m.ValidationDecision("v17-1", JOB, start=WALL + 600)) in sends
    store.close()


def test_a_window_agreed_at_a_checkpoint_goes_to_the_host(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    core = ControllerCore(negotiating(), 0.0, store.restored())
    run(store, core.place(Placement(JOB, "acme", (Member("3", HOST),)), 0.0, WALL))
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    run(store, core.tick(0.0, WALL))
    # The declaration's cadence: a checkpoint every 120 s, one at WALL.
    declared = m.JobDeclaration(JOB, 600.0, revision=1, checkpoint_every=120.0,
                                last_checkpoint=WALL)
    run(store, core.receive(TenantPeer(b"t1", "acme"), tenant_frame(declared), 0.1))
    plan = m.ValidationNotice(JOB, ("3",), 60, WALL + 300, "v17-2", WALL + 300,
                              cause=m.ValidationCause.CORRECTABLE_TREND)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(plan, 1, 1.0), 1.0)
    run(store, core.tick(1.0, WALL + 1))
    (item,) = core.negotiation.maintenance.items.values()
    assert item.window.start == WALL + 360  # the next checkpoint after the host's start
    out = run(store, core.receive(TenantPeer(b"t1", "acme"), tenant_frame(
        m.MaintenanceCounter(item.window.notice_id, ()), seq=4), 2.0))
    assert SendToAgent(b"c1", m.ValidationDecision("v17-2", JOB, start=WALL + 360)) in out
    store.close()


def test_a_notice_with_a_window_cannot_be_deferred_but_can_be_approved() -> None:
    notices = Notices()
    placement = Placement(JOB, "acme", (Member("3", HOST),))
    notices.record(Notice("vn-1", "acme", JOB, HOST, "v17-1", not_before=WALL + 600,
                          pause=60.0))
    decision = notices.settle_window("vn-1", WALL + 360)
    assert decision == m.ValidationDecision("v17-1", JOB, start=WALL + 360)
    assert notices.defer_left("vn-1", 300.0) == 0.0
    refused = notices.answer("acme", m.ValidationAnswer("vn-1", m.NoticeAction.DEFER), 300.0,
                             placement)
    assert isinstance(refused, tuple) and refused[0] is m.ErrorCode.NOT_DEFERRABLE
    approved = notices.answer("acme", m.ValidationAnswer("vn-1", m.NoticeAction.APPROVE),
                              300.0, placement)
    assert approved == m.ValidationDecision("v17-1", JOB, approve=True, start=WALL + 360)
