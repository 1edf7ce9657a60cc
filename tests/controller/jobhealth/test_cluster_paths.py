"""Cluster mode's paths for job health, without a NATS cluster: a replica stores an
agent's rank-progress frame on the bus like any sequenced message, the leader applies
it from there through the same core (so it judges across every host, whichever replica
each host is connected to), and an operator's job-findings at any replica is the
leader's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.bus import requests
from controller.bus.ingest import HostLog, Verdict, judge
from controller.bus.leader import peer_of
from controller.core import ControllerCore
from controller.outputs import AgentPeer, TenantPeer, tenant_sends
from controller.replica import LEADER_COMMANDS
from controller.store import Store
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import decode
from harmonaize.messages.jobhealth import Cause, ProcessState
from tests.controller.jobhealth.reports import progress, rank
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


def test_the_leader_judges_reports_each_replica_stored_and_answers_job_findings(
        tmp_path: Path) -> None:
    frames = {
        "h1": [agent_frame(hello(), sender="h1"),
               agent_frame(progress(JOB, rank("0", 20), still_for=4.0, n_ranks=2), 1,
                           sender="h1")],
        "h2": [agent_frame(hello(), sender="h2"),
               agent_frame(progress(JOB, rank("1", 19, ProcessState.EXITED,
                                               Cause.PROCESS_EXITED), still_for=4.0,
                                    n_ranks=2), 1, sender="h2")],
    }
    # Each host's replica stores its frames (a hello, then the next sequence number).
    for first, report in frames.values():
        stored = judge(None, first)
        assert stored.verdict is Verdict.STORE and stored.after is not None
        assert judge(stored.after, report).verdict is Verdict.STORE
        assert judge(HostLog(1, 1), report).verdict is Verdict.ANSWER  # said again: not twice
    # The leader applies the bus's frames in order through its core.
    core = ControllerCore(config(), 0.0)
    core.place(Placement(JOB, TENANT, (Member("0", "h1"), Member("1", "h2"))), 0.0, WALL)
    core.receive(TenantPeer(b"t", TENANT), tenant_frame(m.Subscribe((TOPIC,))), 0.0)
    outputs = []
    for host, envelopes in frames.items():
        for env in envelopes:
            outputs += core.receive(AgentPeer(peer_of(host), host), env, 1.0)
    outputs += core.tick(1.0, WALL + 1.0)
    told = [b for o in tenant_sends(outputs)
            if isinstance(b := decode(o.frame).body, m.JobProgress)]
    assert [(t.ranks, t.cause, t.at_collective) for t in told] == [
        (("1",), Cause.PROCESS_EXITED, 19)]
    # Asked at any replica, answered by the leader from its core.
    assert "job-findings" in LEADER_COMMANDS
    view, _ = requests.command(core, Store(tmp_path / "leader.db"), "job-findings", {},
                               now=1.0, wall=WALL)
    (finding,) = view["findings"]
    assert finding["ranks"][0]["host"] == "h2"
