"""Validation notices a tenant answers, end to end: a real controller, a real agent on
fake GPUs, the tenant's own feed client. Approve starts the pause at once; defer moves
it, once, within the declaration; every answer is refused with a code where it must be."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.outputs import AgentPeer, AnswerTenant, Commit, SendToAgent, TenantPeer
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import JobDeclaration, NoticeStatus, ValidationNotice
from harmonaize.tenant.client import FeedClient, RequestError
from tests.agent.validation.test_agent import FAKE_CHECK, finished
from tests.conftest import needs_root
from tests.controller.test_core_with_outbox import (
    HOST,
    WALL,
    agent_frame,
    config,
    hello,
    tenant_frame,
)
from tests.daemons import NO_LINKS, fake_gpus, gpu_section, start_agent, start_controller
from tests.daemons import tenant_feed as feed_of
from tests.daemons import wait_until as wait

pytestmark = [pytest.mark.tenant, pytest.mark.validation, needs_root]

JOB = "job-7"


def next_notice(feed: FeedClient, after: ValidationNotice | None = None) -> ValidationNotice:
    """The next notice on the feed (another one than ``after``)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = feed.recv(timeout=1)
        if message is not None and isinstance(message.body, ValidationNotice) and (
                message.body != after):
            return message.body
    raise AssertionError("no validation notice came")


def test_a_tenant_defers_once_then_approves_and_the_pause_starts(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    control = workdir / "control"
    control.mkdir()
    (control / "behaviour.all").write_text("print metric gflops 100\n")
    fake, env = fake_gpus(workdir)
    # A notice lead of ten minutes: nothing starts in this test unless the tenant approves.
    validation = ("[validation]\ncooldown = 3600\nnotice_lead = 600\n"
                  "[[validation.commands]]\nname = \"burn\"\n"
                  f'command = ["{sys.executable}", "{FAKE_CHECK}", "{control}", "{{gpu}}"]\n'
                  'parser = "metrics"\nlevels = [2, 3]\nbudget = 5\n')
    agent = start_agent(spawn, workdir, "g1", endpoint=controller.listen,
                        env=env, links=NO_LINKS + gpu_section() + validation)
    tenant = spawn([sys.executable, "-c", "import time; time.sleep(600)"],
                   env={**os.environ, "HARMONAIZE_JOB": JOB, "RANK": "3"})
    fake.set(6, processes={tenant.pid: 1 << 30})
    wait(lambda: any(g["jobs"] for g in agent.request("health")["gpus"]), what="the job")
    controller.request("place", {"job": JOB, "tenant": "acme",
                                 "members": [{"name": "3", "host": "g1"}]})
    with feed_of(controller, [f"job/acme/{JOB}/"]) as feed, \
            feed_of(controller, ["job/beta/"], "beta") as beta:
        feed.declare(JobDeclaration(JOB, max_validation_pause=600, revision=1,
                                    max_validation_defer=120))
        fake.set(6, ecc_sbe_volatile=900)  # suspect: a validation is planned, and told
        told = next_notice(feed)
        assert told.status is NoticeStatus.SCHEDULED and told.members == ("3",)
        assert told.id.startswith("vn-") and told.not_before == told.starts_at
        assert told.not_before > time.time() + 500 and told.defer_seconds == 120
        assert "gpu" not in told.id and "g1" not in repr(told)
        # Not yours, no such notice, too long, then a good deferral: moved, and no more.
        with pytest.raises(RequestError) as other:
            beta.answer_notice(told.id, "approve")
        assert other.value.code == "no-such-notice"
        with pytest.raises(RequestError) as unknown:
            feed.answer_notice("vn-0000000000000000", "approve")
        assert unknown.value.code == "no-such-notice"
        with pytest.raises(RequestError) as long:
            feed.answer_notice(told.id, "defer", 121)
        assert long.value.code == "invalid" and "max_validation_defer" in str(long.value)
        feed.answer_notice(told.id, "defer", 60)
        deferred = next_notice(feed, told)
        assert deferred.id == told.id and deferred.status is NoticeStatus.SCHEDULED
        assert deferred.not_before == pytest.approx(told.not_before + 60, abs=0.01)
        assert deferred.defer_seconds == 0
        with pytest.raises(RequestError) as again:
            feed.answer_notice(told.id, "defer")
        assert again.value.code == "not-deferrable"
        assert finished(agent) is None  # nothing ran meanwhile
        # Approved: the pause starts now, and the tenant is told it started.
        feed.answer_notice(told.id, "approve")
        started = next_notice(feed, deferred)
        while started.status is NoticeStatus.SCHEDULED:  # the approval's own echo first
            started = next_notice(feed, started)
        assert started.id == told.id and started.status is NoticeStatus.STARTED
        (run,) = wait(lambda: finished(agent), what="the approved validation")
        assert run["target"] == "gpu:6"
        with pytest.raises(RequestError) as late:
            feed.answer_notice(told.id, "defer")
        assert late.value.code == "notice-started"
    status = controller.request("status")["feed_stats"]
    assert status["notice_answers"] == 2 and status["refused_notice_answers"] == 5


def test_answers_are_stored_and_reach_a_host_that_reconnects(tmp_path: Path) -> None:
    """In the core with the real store: a notice and its answer survive a controller
    restart, and the host hears the answer again when it says hello."""
    def run(core: ControllerCore, store: Store, outputs: list) -> list:
        for out in outputs:
            if isinstance(out, Commit):
                store.commit(out.writes)
        return outputs

    store = Store(tmp_path / "c.db")
    core = ControllerCore(config(), 0.0, store.restored())
    run(core, store, core.place(Placement(JOB, "acme", (Member("3", HOST),)), 0.0, WALL))
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    run(core, store, core.tick(0.0, WALL))
    declaration = m.JobDeclaration(JOB, 600.0, revision=1, max_validation_defer=300.0)
    run(core, store, core.receive(TenantPeer(b"t1", "acme"), tenant_frame(declaration), 0.1))
    core.receive(TenantPeer(b"t1", "acme"), tenant_frame(m.Subscribe(("job/acme/",))), 0.2)
    plan = m.ValidationNotice(JOB, ("3", "spoofed"), 600, WALL + 40, "v17-1", WALL + 40)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(plan, 1, 1.0), 1.0)
    told = [o.frame for o in run(core, store, core.tick(1.0, WALL + 1))
            if hasattr(o, "frame")]
    notice = m.decode(told[-1]).body
    assert isinstance(notice, m.ValidationNotice) and notice.members == ("3",)
    assert notice.id.startswith("vn-") and notice.defer_seconds == 300.0
    out = run(core, store, core.receive(TenantPeer(b"t1", "acme"), tenant_frame(
        m.ValidationAnswer(notice.id, m.NoticeAction.DEFER), seq=4), 2.0))
    assert isinstance(out[0], Commit) and out[0].writes.notices[notice.id].deferred == 300.0
    assert out[1] == SendToAgent(b"c1", m.ValidationDecision("v17-1", JOB, defer=300.0))
    assert out[2] == AnswerTenant(b"t1", m.Reply(4, True, ""))
    store.close()
    # A new controller from the same database: the host says hello and hears it again.
    store = Store(tmp_path / "c.db")
    core = ControllerCore(config(), 0.0, store.restored())
    assert core.notices.get(notice.id).deferred == 300.0
    core.receive(TenantPeer(b"t2", "acme"), tenant_frame(m.Subscribe(("job/acme/",))), 5.0)
    core.receive(AgentPeer(b"c9", HOST), agent_frame(hello(), 0, 5.0), 5.0)
    sends = [o for o in core.tick(5.0, WALL + 5) if isinstance(o, SendToAgent)]
    assert SendToAgent(b"c9", m.ValidationDecision("v17-1", JOB, defer=300.0)) in sends
    # The host's next notice keeps the controller's id, and no deferral is left.
    moved = m.ValidationNotice(JOB, ("3",), 600, WALL + 340, "v17-1", WALL + 340)
    core.receive(AgentPeer(b"c9", HOST), agent_frame(moved, 2, 6.0), 6.0)
    again = [m.decode(o.frame).body for o in core.tick(6.0, WALL + 6) if hasattr(o, "frame")]
    assert again[-1] == m.ValidationNotice(JOB, ("3",), 600, WALL + 340, notice.id,
                                           WALL + 340, m.NoticeStatus.SCHEDULED, 0.0)
    store.close()
