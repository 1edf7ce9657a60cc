"""A controller restarted while a job's owner was told of a hang: the finding is taken
back from the stored feed log, so the owner is not told it twice while it holds, and is
told its withdrawal when the ranks move again, when its hosts say nothing within the
grace, or when the job ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.jobhealth import RESTORE_GRACE
from controller.outputs import AgentPeer, Commit, Output, TenantPeer
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages.jobhealth import ProgressState
from tests.controller.jobhealth.reports import progress, rank
from tests.controller.jobhealth.test_core_job_progress import told
from tests.controller.test_core_with_outbox import (
    JOB,
    TENANT,
    TOPIC,
    WALL,
    agent_frame,
    config,
    hello,
    new_store,
    tenant_frame,
)

pytestmark = pytest.mark.jobhealth

HUNG = progress(JOB, rank("0", 11), rank("1", 10), still_for=5.0, n_ranks=2)
MOVING = progress(JOB, rank("0", 12), rank("1", 12), n_ranks=2)


class Controller:
    """A core over a real SQLite store: every Commit stored before what follows it."""

    def __init__(self, store: Store, place: bool) -> None:
        self.store = store
        self.core = ControllerCore(config(), 0.0, store.restored())
        self.seq = 0
        if place:
            self.run(self.core.place(Placement(JOB, TENANT, (Member("0", "h1"),
                                                             Member("1", "h1"))), 0.0, WALL))
        self.core.receive(TenantPeer(b"t", TENANT), tenant_frame(m.Subscribe((TOPIC,))), 0.0)
        self.core.receive(AgentPeer(b"h1", "h1"), agent_frame(hello(), sender="h1"), 0.0)

    def run(self, outputs: list[Output]) -> list[m.Message]:
        for output in outputs:
            if isinstance(output, Commit):
                self.store.commit(output.writes)
        return told(outputs)

    def report(self, body: m.Message, now: float) -> list[m.Message]:
        self.seq += 1
        self.core.receive(AgentPeer(b"h1", "h1"), agent_frame(body, self.seq, now,
                                                               sender="h1"), now)
        return self.run(self.core.tick(now, WALL + now))

    def tick(self, now: float) -> list[m.Message]:
        return self.run(self.core.tick(now, WALL + now))


def hung_then_restarted(tmp_path: Path) -> tuple[Controller, m.JobProgress]:
    store = new_store(tmp_path / "controller.db")
    before = Controller(store, place=True)
    (hang,) = before.report(HUNG, 1.0)
    assert hang.state is ProgressState.ACTIVE
    return Controller(store, place=False), hang


def test_a_finding_still_true_after_a_restart_is_not_told_twice(tmp_path: Path) -> None:
    after, hang = hung_then_restarted(tmp_path)
    assert after.tick(1.0) == []
    assert after.report(HUNG, 2.0) == []  # the same hang: the owner knows it
    (withdrawn,) = after.report(MOVING, 3.0)
    assert (withdrawn.state, withdrawn.ranks, withdrawn.since) == (
        ProgressState.WITHDRAWN, ("1",), hang.since)


def test_a_finding_its_hosts_no_longer_report_is_withdrawn_after_the_grace(
        tmp_path: Path) -> None:
    after, hang = hung_then_restarted(tmp_path)
    assert after.tick(0.0) == []
    assert after.core.jobhealth.next_deadline() == RESTORE_GRACE  # the core wakes then
    assert after.tick(RESTORE_GRACE - 1) == []
    after.core.receive(TenantPeer(b"t", TENANT), tenant_frame(m.Subscribe((TOPIC,)), 2),
                       RESTORE_GRACE - 1)  # renewed, as a client does
    (withdrawn,) = after.tick(RESTORE_GRACE)
    assert (withdrawn.state, withdrawn.ranks) == (ProgressState.WITHDRAWN, hang.ranks)


def test_a_finding_of_a_job_that_ended_while_down_is_withdrawn_at_once(
        tmp_path: Path) -> None:
    store = new_store(tmp_path / "controller.db")
    before = Controller(store, place=True)
    before.report(HUNG, 1.0)
    # The job ends; the controller stops before its next tick told the withdrawal.
    before.run(before.core.unplace(JOB, 2.0))
    after = Controller(store, place=False)
    (withdrawn,) = after.tick(0.0)
    assert (withdrawn.job, withdrawn.state, withdrawn.ranks) == (
        JOB, ProgressState.WITHDRAWN, ("1",))
    assert after.core.jobhealth.view(0.0)["findings"] == []
