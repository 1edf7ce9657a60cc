"""A property of what the owner is told, whatever hosts report: every rank a
job-progress or application-xid names is a member of the job placed on a host that
named it, and nothing else of the hosts' words (host names, foreign names) reaches the
owner. Also: a reload's [jobhealth] applies at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import ControllerConfig
from controller.core import ControllerCore
from controller.outputs import AgentPeer, TenantPeer, tenant_sends
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import decode
from harmonaize.messages.jobhealth import Cause, Fault, ProcessState
from harmonaize.schema import from_plain
from tests.controller.jobhealth.reports import progress, rank
from tests.controller.jobhealth.test_core_job_progress import TwoHosts
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

HOSTS = ("h1", "h2", "h3")  # h3 runs none of the job
PLACED = {"0": "h1", "1": "h1", "2": "h2", "3": "h2"}
NAMES = (*PLACED, "4", "h1", "10.0.0.7", "gpu3")

reports = st.lists(st.tuples(
    st.sampled_from(HOSTS),
    st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 5),
                       st.sampled_from(list(ProcessState)), st.sampled_from(list(Cause))),
             max_size=5),
    st.floats(0.0, 100.0), st.sampled_from((None, 13, 31, 45, 48, 79)),
    st.floats(0.0, 5.0)), max_size=12)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(reports)
def test_the_owner_is_told_only_members_placed_on_the_host_that_named_them(
        steps: list[tuple[str, list[tuple[str, int, ProcessState, Cause]], float, int | None,
                          float]]) -> None:
    core = ControllerCore(config(jobhealth={"hang_after": 1.0, "stall_after": 2.0}), 0.0)
    core.place(Placement(JOB, TENANT, tuple(Member(n, h) for n, h in PLACED.items())),
               0.0, WALL)
    core.receive(TenantPeer(b"t", TENANT), tenant_frame(m.Subscribe((TOPIC,))), 0.0)
    seqs = dict.fromkeys(HOSTS, 0)
    for host in HOSTS:
        core.receive(AgentPeer(host.encode(), host), agent_frame(hello(), sender=host), 0.0)
    named: dict[str, set[str]] = {host: set() for host in HOSTS}
    now, told = 0.0, []
    for host, ranks, still, xid, later in steps:
        now += later
        seqs[host] += 1
        named[host] |= {r[0] for r in ranks}
        body: m.Message = progress(JOB, *(rank(*r) for r in ranks), still_for=still)
        if xid is not None:
            body = m.ApplicationXid(JOB, xid, Fault.MEMORY_MANAGEMENT, tuple(r[0] for r in ranks))
        core.receive(AgentPeer(host.encode(), host), agent_frame(body, seqs[host], now,
                                                                  sender=host), now)
        told += core.tick(now, WALL + now)
    told += core.tick(now + 100.0, WALL + now + 100.0)
    for out in tenant_sends(told):
        env = decode(out.frame)
        assert "h1" not in str(env.body) and "10.0.0.7" not in str(env.body)
        if isinstance(env.body, m.JobProgress | m.ApplicationXid):
            for name in env.body.ranks:
                assert name in PLACED and name in named[PLACED[name]]
        if isinstance(env.body, m.ApplicationXid):
            assert env.body.xid in (13, 31, 45)


def test_a_reloaded_hang_after_applies_at_once() -> None:
    run = TwoHosts(jobhealth={"hang_after": 30.0, "stall_after": 60.0})
    run.report("h1", progress(JOB, rank("0", 11), rank("1", 11), still_for=5.0), 1.0)
    assert run.report("h2", progress(JOB, rank("2", 11), rank("3", 10), still_for=5.0),
                      1.0) == []
    plain = {"redaction": {"min_hosts": 1, "min_interval": 0, "jitter": 0},
             "pools": {"names": ["p"], "gpu_classes": ["H200"]},
             "jobhealth": {"hang_after": 3.0}}
    run.core.reconfigure(from_plain(ControllerConfig, plain))
    (hang,) = run.tick(1.5)
    assert hang.ranks == ("3",)
