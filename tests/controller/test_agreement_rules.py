"""The agreement's durable state, status and deadlines to the letter (what mutation
testing found unpinned): a restart must bring back exactly what was, and operators
must see exactly where a change stands."""

from __future__ import annotations

import pytest

from controller.agreement import Agreement
from controller.agreementstate import AgreementSettings
from harmonaize.messages import AckPhase, TuningStatus
from tests.controller.test_agreement import (
    COMM,
    FP,
    JOB,
    ack,
    agreement,
    comm,
    congested_two_hosts,
    report,
)

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


def committed_once(a: Agreement) -> None:
    congested_two_hosts(a)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.1)
    a.step(1.1)
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.2)
    ack(a, "h2", 1, AckPhase.RESOLVED, now=1.2)
    a.step(1.2)


def test_status_through_arming_confirming_and_idle() -> None:
    a = agreement()
    assert a.status("nobody", 0.0) == {}
    arm = congested_two_hosts(a)
    (activation,) = arm.activations
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    status = a.status(JOB, 1.1)
    assert status["phase"] == "arming"
    assert (status["choice"], status["decision"], status["severity"]) == ("default", 1, 2)
    assert status["in_flight"] == {
        "number": 1, "choice": "severe", "acks": {"h1": "armed"}, "waiting_for": ["h2"],
        "reason": "", "activations": [[f"{COMM:#x}", activation.at]]}
    assert status["health"] == "steady" and status["diverged"] == {}
    assert status["committed"] == {}
    assert status["reports"]["h1"] == {"want": "severe", "severity": 2, "received": 1.1,
                                       "communicators": 1}
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.2)
    a.step(1.2)
    confirming = a.status(JOB, 1.2)
    assert confirming["phase"] == "confirming"
    assert confirming["in_flight"]["acks"] == {}  # outcome acks start afresh
    assert confirming["in_flight"]["waiting_for"] == ["h1", "h2"]
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.3)
    ack(a, "h2", 1, AckPhase.RESOLVED, now=1.3)
    a.step(1.3)
    idle = a.status(JOB, 1.3)
    assert (idle["phase"], idle["in_flight"], idle["choice"], idle["severity"]) == (
        "idle", None, "severe", 2)
    assert idle["committed"] == {f"{COMM:#x}": {"choice": "severe", "at": activation.at}}


def test_a_cancellation_reads_as_cancelling() -> None:
    a = agreement()
    congested_two_hosts(a)
    ack(a, "h1", 1, AckPhase.REFUSED, comm(1010), now=1.1, reason="too late")
    a.step(1.1)
    status = a.status(JOB, 1.1)
    assert status["phase"] == "cancelling"
    assert status["in_flight"]["reason"] == "host h1 refused: too late"


def test_a_snapshot_restores_to_exactly_the_same_state() -> None:
    a = agreement()
    committed_once(a)
    before = a.snapshot(JOB)
    assert before is not None
    assert (before["number"], before["choice"], before["severity"], before["fingerprint"],
            before["withdrawn"], before["decision"]) == (1, "severe", 2, FP, False, None)
    b = Agreement(AgreementSettings())
    b.restore(JOB, before, 50.0)
    assert b.snapshot(JOB) == before
    assert b.take_dirty() == ([JOB], [])  # a restored job is saved again
    assert b.take_dirty() == ([], [])
    assert b.health(JOB, 50.0) == ("severe", TuningStatus.STEADY)
    a.withdraw(JOB)
    withdrawn = a.snapshot(JOB)
    c = Agreement(AgreementSettings())
    c.restore(JOB, withdrawn, 50.0)
    assert c.snapshot(JOB)["withdrawn"] is True


def test_an_empty_or_partial_state_restores_to_the_defaults() -> None:
    a = Agreement(AgreementSettings())
    a.restore(JOB, {}, 5.0)
    assert a.snapshot(JOB) == {"number": 0, "choice": "default", "severity": 0,
                               "fingerprint": "", "withdrawn": False, "committed": [],
                               "decision": None}
    a.restore("other", {"number": 3, "decision": {
        "number": 3, "choice": "severe", "activations": [[COMM, 900]], "hosts": ["h1"],
        "commit": True}}, 5.0)
    decision = a.snapshot("other")["decision"]
    assert decision == {"number": 3, "choice": "severe", "activations": [[COMM, 900]],
                        "hosts": ["h1"], "commit": True, "acks": {}}


def test_a_restart_keeps_only_outcome_acks_and_cancels_an_arm() -> None:
    a = Agreement(AgreementSettings())
    a.restore(JOB, {"number": 4, "decision": {
        "number": 4, "choice": "severe", "activations": [[COMM, 900]], "hosts": ["h1", "h2"],
        "commit": True, "acks": {"h1": "resolved", "h2": "armed"}}}, 5.0)
    assert a.snapshot(JOB)["decision"]["acks"] == {"h1": "resolved"}
    assert a.status(JOB, 5.0)["in_flight"]["waiting_for"] == ["h2"]
    a.restore("armed", {"number": 2, "decision": {
        "number": 2, "choice": "severe", "activations": [[COMM, 900]], "hosts": ["h1"],
        "commit": None, "acks": {"h1": "armed"}}}, 7.0)
    status = a.status("armed", 7.0)
    assert status["phase"] == "cancelling"
    assert status["in_flight"]["reason"] == "the controller restarted while arming"
    assert status["in_flight"]["acks"] == {}
    # The restored change counts from the restart for its lead.
    assert a.health("armed", 7.0 + 0.5) == ("default", TuningStatus.STEADY)
    assert a.health("armed", 7.0 + 2.0) == ("default", TuningStatus.PAUSED)


def test_deadlines_follow_the_phase() -> None:
    a = agreement(arm_timeout=1.0, resend=0.5)
    assert a.next_deadline(0.0) is None
    congested_two_hosts(a, now=1.0)
    assert a.next_deadline(1.2) == pytest.approx(1.7)  # resend comes before the timeout
    assert a.next_deadline(1.8) == pytest.approx(2.0)  # the arm timeout
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.1)
    a.step(1.1)
    assert a.next_deadline(3.0) == pytest.approx(3.5)  # confirming: resends only


def test_deadlines_cover_every_rule_that_reads_the_clock() -> None:
    # In flight: a silent host reads as paused from the lead on.
    a = agreement(arm_timeout=1.0, resend=0.8, lead=0.3)
    congested_two_hosts(a, now=1.0)
    assert a.next_deadline(1.0) == pytest.approx(1.3)
    assert a.health(JOB, 1.29)[1] is TuningStatus.STEADY
    assert a.health(JOB, 1.3)[1] is TuningStatus.PAUSED
    # Cancelled: the back-off ends.
    a = agreement()
    congested_two_hosts(a, now=1.0)
    ack(a, "h2", 1, AckPhase.REFUSED, comm(1210), now=1.1, reason="no")
    a.step(1.1)
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.2)
    ack(a, "h2", 1, AckPhase.RESOLVED, now=1.2)
    a.step(1.2)
    assert a.next_deadline(1.2) == pytest.approx(2.2)
    assert a.step(2.19) == []
    assert a.step(2.2) != []  # armed again
    # Committed, then a lower wish: it must last the hold.
    a = agreement(report_ttl=100.0)
    committed_once(a)
    assert a.next_deadline(1.2) == pytest.approx(61.0)  # the change leaves the minute
    for host, n in (("h1", 2000), ("h2", 2200)):
        a.report(host, report(0, comm(n, choice="severe")), 2.0)
    assert a.step(2.0) == []
    assert a.next_deadline(2.0) == pytest.approx(12.0)
    assert a.step(11.99) == []
    assert [m.choice for _, m in a.step(12.0)] == ["default", "default"]  # type: ignore[attr-defined]
    # Idle: a report goes stale just after its time to live.
    a = agreement(report_ttl=5.0)
    a.report("h1", report(0, comm(100)), 1.0)
    a.step(1.0)
    stale = a.next_deadline(1.0)
    assert stale is not None and 6.0 < stale < 6.0 + 1e-9
    a.report("h1", report(1, comm(100)), 2.0)  # the newest report is the host's
    assert a.next_deadline(2.0) == pytest.approx(7.0)
