"""The agreement's hosts: silent, answering, leaving, forgotten; and every job stepped."""

from __future__ import annotations

import pytest

from harmonaize.messages import AckPhase, TuningAck, TuningReport, TuningStatus
from tests.controller.test_agreement import FP, JOB, ack, agreement, comm, congested_two_hosts

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


def test_a_silent_host_reads_as_paused_only_past_the_lead() -> None:
    a = agreement(lead=1.0)
    congested_two_hosts(a, now=1.0)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    assert a.health(JOB, 1.9) == ("default", TuningStatus.STEADY)
    assert a.health(JOB, 2.0) == ("default", TuningStatus.PAUSED)
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=2.1)
    a.step(2.1)
    ack(a, "h1", 1, AckPhase.RESOLVED, now=2.2)
    # Confirming, h2 has not said it heard the outcome: its ranks may be waiting.
    assert a.health(JOB, 2.2) == ("default", TuningStatus.PAUSED)
    ack(a, "h2", 1, AckPhase.RESOLVED, now=2.3)
    a.step(2.3)
    assert a.health(JOB, 2.3) == ("severe", TuningStatus.STEADY)


def test_answers_count_only_in_their_phase_and_refresh_the_hosts_report() -> None:
    a = agreement()
    arm = congested_two_hosts(a)
    assert arm.job == JOB
    a.ack("h1", TuningAck("nobody", 1, AckPhase.ARMED, "", ()), 1.1)  # a stranger's: nothing
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.1)  # an outcome ack while arming: not counted
    assert a.status(JOB, 1.1)["in_flight"]["acks"] == {}
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.15)
    assert a.status(JOB, 1.15)["reports"]["h1"]["received"] == 1.15  # its ranks, as of now
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.2)
    a.step(1.2)
    a.take_dirty()
    ack(a, "h1", 1, AckPhase.ARMED, now=1.3)  # an arm ack while confirming: not counted
    assert a.status(JOB, 1.3)["in_flight"]["acks"] == {}
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.3)
    assert a.take_dirty() == ([JOB], [])  # who heard the outcome is durable at once
    assert a.status(JOB, 1.3)["in_flight"]["acks"] == {"h1": "resolved"}


def test_hosts_leaving_a_job_and_hosts_forgotten() -> None:
    a = agreement()
    congested_two_hosts(a)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    a.set_hosts(JOB, {"h1", "h2", "h3"})  # while arming, the decision's hosts stay
    assert a.status(JOB, 1.1)["in_flight"]["waiting_for"] == ["h2"]
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.2)
    a.step(1.2)
    a.set_hosts(JOB, {"h1"})  # h2 left the job while its outcome was out
    assert a.status(JOB, 1.2)["in_flight"]["waiting_for"] == ["h1"]
    assert sorted(a.status(JOB, 1.2)["reports"]) == ["h1"]
    other = "job-2"
    a.set_hosts(other, None)  # no placement known: every host's report counts
    a.report("h9", TuningReport(other, FP, "default", 0, ()), 1.3)
    a.report("h1", TuningReport(other, FP, "default", 0, ()), 1.3)
    a.forget_host("h1")
    assert sorted(a.status(other, 1.3)["reports"]) == ["h9"]
    assert a.status(JOB, 1.3)["reports"] == {}
    a.forget("never-known")  # nothing to forget: no error
    a.reconnected("h-unknown")


def test_every_job_is_stepped() -> None:
    a = agreement()
    a.set_hosts("job-2", {"h1", "h2"})
    for job in (JOB, "job-2"):
        a.report("h1", TuningReport(job, FP, "severe", 2, (comm(1000),)), 1.0)
        a.report("h2", TuningReport(job, FP, "default", 0, (comm(1200),)), 1.0)
    out = a.step(1.0)
    assert sorted({(host, message.job) for host, message in out}) == [  # type: ignore[attr-defined]
        ("h1", JOB), ("h1", "job-2"), ("h2", JOB), ("h2", "job-2")]
