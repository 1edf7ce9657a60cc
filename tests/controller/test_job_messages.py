"""Job-scoped messages from agents: only a host the job is placed on may speak for it,
and the tenant receives what the controller rebuilt, never the agent's words."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import zmq

from controller.jobredaction import NOTICE_HORIZON
from controller.redaction import Redactor
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import Advice, JobAdvisory, Urgency, ValidationNotice
from tests.conftest import needs_root
from tests.controller.test_feed import Sender, drain, place
from tests.daemons import FakeAgent, start_controller, tenant_feed

pytestmark = [pytest.mark.hardening, pytest.mark.controller]

WALL = 1.8e9


def redactor() -> Redactor:
    r = Redactor(rng=random.Random(1))
    r.place(Placement("job-1", "acme", (Member("0", "g1"), Member("1", "g1"),
                                         Member("2", "g2"))))
    return r


def advisory(ranks: tuple[str, ...] = ("0",), reason: str = "gpu-memory") -> JobAdvisory:
    return JobAdvisory("job-1", Advice.CHECKPOINT_NOW, reason, Urgency.HIGH, ranks)


def test_a_host_running_none_of_the_job_is_not_heard() -> None:
    r = redactor()
    forged = advisory(("h2.internal", "10.1.2.3"), "host-h2-gpu7")
    assert r.advisory("g9", forged, 1.0, WALL) == "not_placed_here"
    notice = ValidationNotice("job-1", ("h2.internal",), 86400, WALL)
    assert r.advisory("g9", notice, 1.0, WALL, max_pause=86400) == "not_placed_here"
    assert r.due(1.0) == []


def test_ranks_come_from_the_placement_on_the_sending_host() -> None:
    r = redactor()
    # Named ranks elsewhere, or names the job has not, are dropped; none left: all of its own.
    assert r.advisory("g1", advisory(("1", "2", "10.1.2.3")), 1.0, WALL) is None
    assert r.advisory("g1", advisory(("h2.internal",)), 1.0, WALL) is None
    first, second = (p.body for p in r.due(1.0))
    assert first.ranks == ("1",)
    assert second.ranks == ("0", "1")


def test_reasons_outside_the_coarse_classes_are_refused() -> None:
    r = redactor()
    assert r.advisory("g1", advisory(reason="host-h2-gpu7"), 1.0, WALL) == "unknown_reason"
    assert r.advisory("g1", advisory(reason="thermal"), 1.0, WALL) is None
    (pub,) = r.due(1.0)
    assert (pub.tenant, pub.body.reason) == ("acme", "thermal")


def test_pauses_stay_within_the_declaration_and_starts_near_now() -> None:
    r = redactor()
    long = ValidationNotice("job-1", ("0",), 86400, WALL + 30)
    assert r.advisory("g1", long, 1.0, WALL, max_pause=600) == "pause_not_allowed"
    assert r.advisory("g1", long, 1.0, WALL, max_pause=0) == "pause_not_allowed"
    # No declaration at the controller (an operator allowed it on the host): a fixed cap.
    assert r.advisory("g1", long, 1.0, WALL) == "pause_not_allowed"
    assert r.advisory("g1", ValidationNotice("job-1", ("0",), 600, WALL), 1.0, WALL) is None
    assert r.due(1.0)[0].body.pause_seconds == 600
    far = ValidationNotice("job-1", ("0",), 600, WALL + 10 * NOTICE_HORIZON)
    past = ValidationNotice("job-1", ("0",), 60, 5.0)
    assert r.advisory("g2", far, 1.0, WALL, max_pause=600) is None
    assert r.advisory("g2", past, 1.0, WALL, max_pause=600) is None
    a, b = (p.body for p in r.due(1.0))
    assert (a.members, a.pause_seconds, a.starts_at) == (("2",), 600, WALL + NOTICE_HORIZON)
    assert (b.members, b.starts_at) == (("2",), WALL)


@needs_root
def test_a_forging_host_reaches_no_tenant_and_is_counted(spawn, workdir: Path) -> None:
    """The attack as it was run: a host with a valid key and no part in the job."""
    controller = start_controller(spawn, workdir)
    place(controller, "job-a", "alpha", "h1", "h1")
    ctx = zmq.Context()
    try:
        h1 = Sender(FakeAgent(ctx, controller, "h1"))
        h2 = Sender(FakeAgent(ctx, controller, "h2"))
        with tenant_feed(controller, ["job/alpha/"], "alpha") as feed:
            assert feed.recv(timeout=10) is not None  # job health: subscribed
            h2.send(m.JobAdvisory("job-a", m.Advice.CHECKPOINT_NOW, "host-h2-gpu7",
                                  m.Urgency.HIGH, ("h2.internal", "10.1.2.3")))
            h2.send(m.ValidationNotice("job-a", ("h2.internal",), 86400, time.time()))
            h1.send(m.JobAdvisory("job-a", m.Advice.CHECKPOINT_NOW, "thermal",
                                  m.Urgency.HIGH, ("1", "10.1.2.3")))
            (got,) = drain(feed, 1, m.JobAdvisory)
            assert (got.reason, got.ranks) == ("thermal", ("1",))
            assert drain(feed, 1, m.Message, timeout=1.5) == []
        protocol = controller.request("status")["protocol"]
        assert protocol["job_message_not_placed_here"] == 2
        assert "host h2: job-advisory for job 'job-a' not passed on" in controller.log.read_text()
    finally:
        ctx.destroy(linger=0)
