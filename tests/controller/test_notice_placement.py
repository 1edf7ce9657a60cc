"""Issue 28, item 5: a validation notice belongs to the placement it was issued for.

A real controller with its HTTP gateway, a probe agent speaking the agents' protocol
over a real socket (it keeps every message the controller sends it) and two tenants,
one on each transport. Once the job is placed anew, the old tenant's answers are
refused exactly as for a notice that never existed, the new tenant sees none of the old
notices, the host never hears an old answer again, and the host's next notice of the
same plan is a new notice for the new placement."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from controller.core import ControllerCore
from controller.outputs import AgentPeer, AnswerTenant, Commit, SendToAgent, TenantPeer
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import ValidationDecision, ValidationNotice
from harmonaize.tenant.client import FeedClient, RequestError
from tests.conftest import needs_root
from tests.controller.test_core_with_outbox import (
    HOST,
    WALL,
    agent_frame,
    config,
    hello,
    tenant_frame,
)
from tests.controller.test_feed import place
from tests.daemons import FakeAgent, tenant_feed
from tests.sse import curl
from tests.tenant.test_http import bearer, gateway, token

pytestmark = [pytest.mark.hardening, needs_root]

JOB = "job-7"
UNKNOWN = "vn-00000000000000ff"



class Probe:
    """An agent's connection that keeps everything the controller sends it."""

    def __init__(self, agent: FakeAgent) -> None:
        self.agent, self.seq, self.got = agent, 0, []  # type: list[m.Message]
        self.hello()

    def hello(self) -> None:
        self.agent.send(m.Hello(pool="p", gpu_class="H200", gpus=8, version="t", epoch=1,
                                acked=self.seq, heartbeat=1.0))
        self.until(lambda: any(isinstance(x, m.Ack) for x in self.got[-1:]), "hello's ack")

    def send(self, body: m.Message) -> None:
        self.seq += 1
        self.agent.send(body, seq=self.seq)
        self.until(lambda: m.Ack(self.seq) in self.got, f"the ack of {self.seq}")

    def until(self, done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"the controller never sent {what}"
            if self.agent.sock.poll(100):
                self.got.append(m.decode(self.agent.sock.recv()).body)

    def decisions(self) -> list[ValidationDecision]:
        return [x for x in self.got if isinstance(x, ValidationDecision)]


def subscribed(feed: FeedClient) -> None:
    """Until the controller has answered the client's subscription."""
    deadline = time.monotonic() + 20
    while not feed.stats.subscriptions:
        assert time.monotonic() < deadline, "the subscription was never answered"
        feed.recv(timeout=0.2)


def next_notice(feed: FeedClient, not_ids: tuple[str, ...] = ()) -> ValidationNotice:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        message = feed.recv(timeout=1)
        if (message is not None and isinstance(message.body, ValidationNotice)
                and message.body.id not in not_ids):
            return message.body
    raise AssertionError("no validation notice came")


def refusal(feed: FeedClient, notice: str) -> tuple[str, str]:
    """(code, text with the id taken out) of a refused approval over ZeroMQ."""
    with pytest.raises(RequestError) as refused:
        feed.answer_notice(notice, "approve")
    return refused.value.code, str(refused.value).replace(notice, "<id>")


def http_refusal(url: str, secret: str, notice: str) -> tuple[int, str, str]:
    status, body, _ = curl("POST", f"{url}/notices/{notice}", *bearer(secret),
                           body={"action": "approve"})
    error = body["error"]
    return status, error["code"], error["message"].replace(notice, "<id>")


def test_notice_answer_from_the_old_tenant_is_refused_once_the_job_is_placed_anew(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir)
    place(controller, JOB, "acme", "g1")
    probe = Probe(FakeAgent(ctx, controller, "g1"))
    acme_token, beta_token = token(controller, "acme"), token(controller, "beta")
    with tenant_feed(controller, ["job/acme/"], "acme", context=ctx) as acme, \
            tenant_feed(controller, ["job/beta/"], "beta", context=ctx) as beta:
        # A new subscriber is sent what comes after its subscription is answered: the
        # notice is sent once both tenants are subscribed (a busy machine may be slow).
        subscribed(acme)
        subscribed(beta)
        starts = time.time() + 900
        probe.send(ValidationNotice(JOB, ("0",), 600, starts, "plan-1", starts))
        first = next_notice(acme)
        probe.send(ValidationNotice(JOB, ("0",), 600, starts, "plan-2", starts))
        second = next_notice(acme, (first.id,))
        # Before the move the owner's approval reaches the host, as it should.
        acme.answer_notice(first.id, "approve")
        probe.until(lambda: bool(probe.decisions()), "the approval")
        assert probe.decisions() == [ValidationDecision("plan-1", JOB, approve=True)]

        place(controller, JOB, "beta", "g1")  # the job id now belongs to beta
        # The old owner is refused as for a notice that does not exist, on both transports.
        assert refusal(acme, second.id) == refusal(acme, UNKNOWN)
        assert refusal(acme, second.id)[0] == "no-such-notice"
        assert http_refusal(url, acme_token, second.id) == \
            http_refusal(url, acme_token, UNKNOWN)
        assert http_refusal(url, acme_token, second.id)[:2] == (404, "no-such-notice")
        # Nor may the new owner answer what was issued for the old placement.
        assert refusal(beta, first.id) == refusal(beta, UNKNOWN)
        assert http_refusal(url, beta_token, second.id) == \
            http_refusal(url, beta_token, UNKNOWN)
        for secret in (acme_token, beta_token):
            status, body, _ = curl("GET", f"{url}/notices", *bearer(secret))
            assert status == 200 and body["notices"] == []
        # The host reconnects: no old answer is sent again; nothing new reached it.
        probe.hello()
        # A round trip: whatever was sent before it has come.
        probe.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8)))
        assert probe.decisions() == [ValidationDecision("plan-1", JOB, approve=True)]
        # The host's next notice of the same plan is a new notice, for beta.
        probe.send(ValidationNotice(JOB, ("0",), 600, starts, "plan-2", starts))
        renewed = next_notice(beta)
        assert renewed.id not in (first.id, second.id)
        beta.answer_notice(renewed.id, "approve")
        probe.until(lambda: len(probe.decisions()) == 2, "beta's approval")
        assert probe.decisions()[-1] == ValidationDecision("plan-2", JOB, approve=True)

        # Placed anew for the same tenant (other members): its notices are void too.
        probe.send(ValidationNotice(JOB, ("0",), 600, starts, "plan-3", starts))
        third = next_notice(beta, (renewed.id,))
        place(controller, JOB, "beta", "g1", "g1")
        assert refusal(beta, third.id) == refusal(beta, UNKNOWN)
    stats = controller.request("status")["feed_stats"]
    assert stats["notice_answers"] == 2


def test_notice_withdrawn_by_a_new_placement_stays_withdrawn_after_a_restart(
        tmp_path: Path) -> None:
    """The core with the real store: the same placement said again keeps its notices; a
    new one withdraws them, and a restarted controller neither lists nor resends them."""
    def run(outputs: list) -> list:
        for out in outputs:
            if isinstance(out, Commit):
                store.commit(out.writes)
        return outputs

    store = Store(tmp_path / "c.db")
    core = ControllerCore(config(), 0.0, store.restored())
    here = (Member("3", HOST),)
    run(core.place(Placement(JOB, "acme", here), 0.0, WALL))
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    run(core.tick(0.0, WALL))
    plan = m.ValidationNotice(JOB, ("3",), 600, WALL + 900, "v17-1", WALL + 900)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(plan, 1, 1.0), 1.0)
    run(core.tick(1.0, WALL + 1))
    (told,) = core.notices.of_tenant("acme")
    out = run(core.receive(TenantPeer(b"t1", "acme"), tenant_frame(
        m.ValidationAnswer(told.id, m.NoticeAction.APPROVE), seq=2), 2.0))
    assert AnswerTenant(b"t1", m.Reply(2, True, "")) in out
    run(core.place(Placement(JOB, "acme", here), 3.0, WALL + 3))  # the scheduler, again
    assert core.notices.of_tenant("acme") == [dataclasses.replace(told, approved=True)]
    run(core.place(Placement(JOB, "beta", here), 4.0, WALL + 4))  # placed anew
    assert core.notices.of_tenant("acme") == core.notices.of_tenant("beta") == []
    store.close()

    store = Store(tmp_path / "c.db")
    core = ControllerCore(config(), 10.0, store.restored())
    assert core.notices.of_tenant("acme") == core.notices.of_tenant("beta") == []
    assert core.redactor.placements[JOB].generation == 2
    core.receive(AgentPeer(b"c9", HOST), agent_frame(hello(), 0, 10.0), 10.0)
    sends = [o for o in core.tick(10.0, WALL + 10) if isinstance(o, SendToAgent)]
    assert not any(isinstance(s.message, ValidationDecision) for s in sends)
    out = core.receive(TenantPeer(b"t2", "acme"), tenant_frame(
        m.ValidationAnswer(told.id, m.NoticeAction.APPROVE), seq=3), 11.0)
    (answer,) = [o for o in out if isinstance(o, AnswerTenant)]
    assert answer.message.code == "no-such-notice"
    store.close()
