"""The controller's core judges a job's progress across its hosts' reports and tells the
owner, in the job's own terms, which ranks hold it up; withdrawn when they move again."""

from __future__ import annotations

import pytest

from controller.core import ControllerCore
from controller.outputs import AgentPeer, Output, TenantPeer, tenant_sends
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import decode
from harmonaize.messages.jobhealth import Cause, Finding, ProcessState, ProgressState
from tests.controller.jobhealth.reports import COMM, progress, rank
from tests.controller.test_core_with_outbox import (
    JOB,
    TENANT,
    TOPIC,
    WALL,
    agent_frame,
    config,
    hello,
    tenant_frame,
)

pytestmark = pytest.mark.jobhealth

HOSTS = ("h1", "h2")


class TwoHosts:
    """A core with a job of four ranks, two on each host, and its owner subscribed."""

    def __init__(self, **sections: dict[str, object]) -> None:
        self.core = ControllerCore(config(**sections), 0.0)
        members = (Member("0", "h1"), Member("1", "h1"), Member("2", "h2"), Member("3", "h2"))
        self.core.place(Placement(JOB, TENANT, members), 0.0, WALL)
        self.core.receive(TenantPeer(b"t1", TENANT), tenant_frame(m.Subscribe((TOPIC,))), 0.0)
        self.seqs = dict.fromkeys(HOSTS, 0)
        for host in HOSTS:
            self.core.receive(AgentPeer(host.encode(), host),
                              agent_frame(hello(), sender=host), 0.0)
        self.core.tick(0.0, WALL)

    def report(self, host: str, body: m.Message, now: float) -> list[m.Message]:
        self.seqs[host] += 1
        self.core.receive(AgentPeer(host.encode(), host),
                          agent_frame(body, self.seqs[host], now, sender=host), now)
        return told(self.core.tick(now, WALL + now))

    def tick(self, now: float) -> list[m.Message]:
        return told(self.core.tick(now, WALL + now))


def told(outputs: list[Output]) -> list[m.Message]:
    """What the job's owner was sent of its job's progress and XIDs."""
    return [body for o in tenant_sends(outputs)
            if (body := decode(o.frame).body).KIND in ("job-progress", "application-xid")]


def test_a_rank_stopped_on_one_host_is_named_to_its_owner_and_withdrawn_when_it_moves(
        ) -> None:
    run = TwoHosts()
    assert run.report("h1", progress(JOB, rank("0", 10), rank("1", 10)), 1.0) == []
    assert run.report("h2", progress(JOB, rank("2", 10), rank("3", 10)), 1.0) == []
    # Ranks 0-2 issued collective 10 and wait in it; rank 3 was stopped before it.
    assert run.report("h1", progress(JOB, rank("0", 11), rank("1", 11), still_for=0.5),
                      2.0) == []
    stopped = rank("3", 10, ProcessState.STOPPED, Cause.PROCESS_NOT_RUNNING)
    assert run.report("h2", progress(JOB, rank("2", 11), stopped, still_for=0.5,
                                     finding=Finding.HANG, cause=Cause.PROCESS_NOT_RUNNING),
                      2.0) == []
    # Still for hang_after (3 s) from when the hosts said they stopped moving.
    due = run.core.next_deadline()
    assert due == pytest.approx(4.5)
    assert run.tick(4.4) == []
    (hang,) = run.tick(4.5)
    assert hang == m.JobProgress(JOB, COMM, Finding.HANG, ProgressState.ACTIVE, ("3",),
                                 Cause.PROCESS_NOT_RUNNING, 10, round(WALL + 4.5, 3))
    assert run.tick(5.0) == []  # the same finding is said once
    # The operator's view names the host; the tenant's never did.
    (finding,) = run.core.jobhealth.view(5.0)["findings"]
    assert finding["ranks"][0]["host"] == "h2" and finding["tenant_told"] is True
    assert run.report("h2", progress(JOB, rank("2", 12), rank("3", 12)), 6.0) == [
        m.JobProgress(JOB, COMM, Finding.HANG, ProgressState.WITHDRAWN, ("3",),
                      Cause.PROCESS_NOT_RUNNING, 10, round(WALL + 4.5, 3))]
    assert run.core.jobhealth.view(6.0)["findings"] == []


def test_a_stall_the_job_made_itself_reaches_operators_only() -> None:
    run = TwoHosts(jobhealth={"stall_after": 20.0})
    for host, names in (("h1", ("0", "1")), ("h2", ("2", "3"))):
        run.report(host, progress(JOB, *(rank(n, 50) for n in names), still_for=1.0), 1.0)
    assert run.tick(20.9) == []
    assert run.tick(21.0) == []  # a stall, cause paused: the tenant is not told
    (finding,) = run.core.jobhealth.view(21.0)["findings"]
    assert (finding["finding"], finding["cause"], finding["tenant_told"]) == (
        "stall", "paused", False)


def test_a_stall_on_a_faulty_gpu_is_told_with_its_cause() -> None:
    run = TwoHosts(jobhealth={"stall_after": 20.0})
    run.report("h1", progress(JOB, rank("0", 50), rank("1", 50), still_for=1.0), 1.0)
    run.report("h2", progress(JOB, rank("2", 50), rank("3", 50, cause=Cause.GPU_FAULT),
                              still_for=1.0, cause=Cause.GPU_FAULT), 1.0)
    (stall,) = run.tick(21.0)
    assert (stall.finding, stall.cause, stall.ranks, stall.at_collective) == (
        Finding.STALL, Cause.GPU_FAULT, ("3",), 50)


def test_a_silent_host_counts_as_unknown_so_no_stall_is_concluded_without_it() -> None:
    run = TwoHosts(jobhealth={"stall_after": 20.0})
    run.report("h1", progress(JOB, rank("0", 50), rank("1", 50), still_for=1.0,
                              interval=30.0), 1.0)
    run.report("h2", progress(JOB, rank("2", 50), rank("3", 50, cause=Cause.GPU_FAULT),
                              still_for=1.0, interval=5.0), 1.0)
    # h2 said nothing for more than twice its interval: half the view is missing.
    assert run.tick(21.0) == []
    assert run.core.jobhealth.view(21.0)["findings"] == []


def test_a_hosts_own_straggler_finding_is_forwarded() -> None:
    run = TwoHosts()
    (straggler,) = run.report("h1", progress(JOB, rank("0", 900), rank("1", 700),
                                             finding=Finding.STRAGGLER), 1.0)
    assert run.report("h2", progress(JOB, rank("2", 905), rank("3", 905)), 1.0) == []
    # The host no longer finds it (the rank caught up): withdrawn.
    (caught_up,) = run.report("h1", progress(JOB, rank("0", 990), rank("1", 989)), 5.0)
    assert (caught_up.state, caught_up.ranks) == (ProgressState.WITHDRAWN, ("1",))
    assert (straggler.finding, straggler.ranks, straggler.state) == (
        Finding.STRAGGLER, ("1",), ProgressState.ACTIVE)


def test_the_owner_is_told_a_withdrawal_when_the_job_ends() -> None:
    run = TwoHosts()
    run.report("h1", progress(JOB, rank("0", 11), rank("1", 11), still_for=5.0), 1.0)
    (hang,) = run.report("h2", progress(JOB, rank("2", 11), rank("3", 10), still_for=5.0), 1.0)
    assert hang.state is ProgressState.ACTIVE and hang.ranks == ("3",)
    run.core.unplace(JOB, 2.0)
    (gone,) = run.tick(2.0)
    assert (gone.state, gone.ranks) == (ProgressState.WITHDRAWN, ("3",))
    assert run.core.jobhealth.reports == {} and run.core.jobhealth.judge.keys() == set()
