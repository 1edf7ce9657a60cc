"""The agreement's durable state, status and deadlines to the letter (what mutation
testing found unpinned): a restart must bring back exactly what was, and operators
must see exactly where a change stands."""

from __future__ import annotations

import dataclasses

import pytest

from controller.agreement import Agreement
from controller.agreementstate import AgreementSettings
from controller.core import ControllerCore
from controller.outputs import AgentPeer, Output, SendToAgent
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import AckPhase, TuningAck, TuningReport, TuningStatus
from tests.test_redesign_controller_core import WALL, agent_frame, config, hello
from tests.test_tuning_agreement import (
    COMM,
    FP,
    JOB,
    ack,
    agreement,
    arm_of,
    comm,
    congested_two_hosts,
    kinds,
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


def test_the_switching_point_is_past_every_hosts_projected_position() -> None:
    a = agreement(lead=1.0, margin=100)
    a.report("h1", report(2, comm(1000, rate=100.0)), 0.5)  # half a second old at 1.0: 1050
    a.report("h2", report(0, comm(1200, rate=300.0)), 1.0)  # the furthest, and the fastest
    (activation,) = arm_of(a.step(1.0)).activations
    assert activation.at == 1200 + 300  # its position + the fastest rate x the lead (> margin)
    b = agreement(lead=0.1, margin=100)
    b.report("h1", report(2, comm(1000, rate=100.0)), 0.0)
    b.report("h2", report(0, comm(1200, rate=100.0)), 0.0)
    (slow,) = arm_of(b.step(2.0)).activations
    assert slow.at == 1200 + 200 + 100  # projected 2 s on at 100/s, then the margin


def test_a_step_down_waits_exactly_the_hold_and_takes_the_highest_wish_meanwhile() -> None:
    a = agreement(hold=10.0)
    committed_once(a)
    at = a.status(JOB, 1.3)["committed"][f"{COMM:#x}"]["at"]
    past = dict(choice="severe", at=at)

    def wish(now: float, h1: int, h2: int = 0) -> list:
        a.report("h1", report(h1, comm(at + 500, **past)), now)
        a.report("h2", report(h2, comm(at + 700, **past)), now)
        return a.step(now)

    assert wish(2.0, 0) == []  # the fall starts being held
    assert wish(5.0, 1) == []  # a milder wish than before, but not the mildest
    assert wish(11.9, 0) == []
    out = wish(12.0, 0)
    assert arm_of(out).choice == "congested"  # the highest wish seen while held


def test_changes_are_limited_to_so_many_a_minute_to_the_second() -> None:
    a = agreement(hold=0.0, max_decisions_per_minute=1)
    committed_once(a)  # one change, at 1.0
    at = a.status(JOB, 1.3)["committed"][f"{COMM:#x}"]["at"]

    def fall(now: float) -> list:
        a.report("h1", report(0, comm(at + 500, choice="severe", at=at)), now)
        a.report("h2", report(0, comm(at + 700, choice="severe", at=at)), now)
        # The first step notes the fall (a hold of 0 still needs one look), the next decides.
        return a.step(now) + a.step(now)

    assert fall(30.0) == []
    assert a.status(JOB, 30.0)["waiting"] == "default waits: 1 changes in the last minute"
    assert fall(60.9) == []
    assert arm_of(fall(61.0)).choice == "default"


def test_a_report_counts_until_exactly_its_ttl() -> None:
    a = agreement(report_ttl=10.0)
    a.report("h1", report(2, comm(1000)), 0.0)
    a.report("h2", report(0, comm(1200)), 0.0)
    assert arm_of(a.step(10.0)).choice == "severe"
    b = agreement(report_ttl=10.0)
    b.report("h1", report(2, comm(1000)), 0.0)
    b.report("h2", report(0, comm(1200)), 0.0)
    assert b.step(10.01) == []


def test_a_host_that_saw_its_own_ranks_disagree_marks_the_job_until_the_comm_is_gone() -> None:
    a = agreement()
    a.report("h1", report(0, dataclasses.replace(comm(1000), diverged=True)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    a.step(1.0)
    assert a.health(JOB, 1.0) == ("default", TuningStatus.DIVERGED)
    assert a.status(JOB, 1.0)["diverged"] == {f"{COMM:#x}": "host h1 saw its own ranks disagree"}
    a.report("h1", report(0, comm(1000, comm_id=8)), 2.0)
    a.report("h2", report(0, comm(1200, comm_id=8)), 2.0)
    a.step(2.0)
    assert a.health(JOB, 2.0) == ("default", TuningStatus.STEADY)


def test_withdrawing_a_job_at_nccls_choices_sends_nothing_and_forgets_it() -> None:
    a = agreement()
    a.report("h1", report(0, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    assert a.step(1.0) == []
    a.withdraw(JOB)
    assert a.step(1.1) == []
    assert a.snapshot(JOB) is None and a.take_dirty()[1] == [JOB]


def test_at_most_32_communicators_change_at_once() -> None:
    a = agreement()
    many = [comm(1000, comm_id=100 + i) for i in range(40)]
    a.report("h1", report(2, *many), 1.0)
    a.report("h2", report(0, *many), 1.0)
    arm = arm_of(a.step(1.0))
    assert [x.comm for x in arm.activations] == [100 + i for i in range(32)]


def test_each_communicator_is_judged_on_its_own() -> None:
    a = agreement()
    views = {"h1": [comm(1000, comm_id=1, choice="severe"), comm(1000, comm_id=2,
                                                                 choice="congested"),
                    comm(1000, comm_id=3)],
             "h2": [comm(1200, comm_id=1, choice="severe"), comm(1200, comm_id=2),
                    comm(1200, comm_id=3)]}
    a.report("h1", report(2, *views["h1"]), 1.0)
    a.report("h2", report(0, *views["h2"]), 1.0)
    arm = arm_of(a.step(1.0))
    # 1 is already there, 2 is not ready (its hosts disagree), 3 changes.
    assert [x.comm for x in arm.activations] == [3]
    assert a.status(JOB, 1.0)["waiting"] == (
        "communicator 0x2: hosts follow different rules for it (congested, default)")


def test_a_rank_exactly_at_the_previous_switch_has_not_passed_it() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000, choice="congested", at=1000)), 1.0)
    a.report("h2", report(0, comm(1200, choice="congested", at=1000)), 1.0)
    assert a.step(1.0) == []
    assert "has not passed the switch at 1000" in a.status(JOB, 1.0)["waiting"]


def test_without_communicators_the_choice_is_simply_recorded() -> None:
    a = agreement()
    a.report("h1", report(2), 1.0)
    a.report("h2", report(0), 1.0)
    assert a.step(1.0) == []
    status = a.status(JOB, 1.0)
    assert (status["choice"], status["severity"], status["phase"]) == ("severe", 2, "idle")


def test_a_wish_that_names_no_declared_choice_is_refused() -> None:
    """The choice in force reaches the tenant: it must be the controller's own name."""
    a = agreement()
    assert a.report("h1", TuningReport(JOB, FP, "h2.internal", 2, (comm(1000),)), 1.0) is False
    assert a.report("h1", TuningReport(JOB, FP, "congested", 2, (comm(1000),)), 1.0) is False
    assert a.report("h2", TuningReport(JOB, FP, "default", 0, (comm(1200),)), 1.0) is True
    assert a.step(1.0) == []  # h1 said nothing usable: no change
    assert a.counters["refused_reports"] == 2
    assert a.health(JOB, 1.0) == ("default", TuningStatus.STEADY)


# --- issue 28, item 15: `paused` only when ranks can be waiting ---------------------------


def test_item15_no_change_is_armed_while_a_host_of_the_job_is_unreachable() -> None:
    a = agreement(report_ttl=10.0)
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1000)), 1.0)
    # h2's report is fresh, but h2 has gone quiet: an arm would reach nobody there.
    assert a.step(1.0, reachable={"h1"}) == []
    assert a.status(JOB, 1.0)["waiting"] == "host h2 is unreachable"
    assert a.health(JOB, 9.0) == ("default", TuningStatus.STEADY)  # long past the lead
    # Reachable again: the change goes to both, as before.
    assert kinds(a.step(9.5, reachable={"h1", "h2"})) == [("h1", "tuning-arm"),
                                                          ("h2", "tuning-arm")]


def test_item15_a_host_silent_before_the_change_leaves_the_tenant_told_steady() -> None:
    """The campaign's schedule through the controller's core: two hosts, h2 silent from
    0.5 s (its report fresh for 10 s more), h1 congested from 3 s, when h2 has missed two
    heartbeats but is not yet counted down (3.5 s); no rank ever waits, so the job must
    never read as paused, and the change goes out once h2 is back."""
    core = ControllerCore(config(liveness={"missed_heartbeats": 3}), 0.0)
    core.place(Placement(JOB, "acme", (Member("0", "h1"), Member("1", "h2"))), 0.0, WALL)
    peers = {h: AgentPeer(h.encode(), h) for h in ("h1", "h2")}
    seqs = {"h1": 0, "h2": 0}

    def send(host: str, body: m.Message, now: float) -> list[Output]:
        seqs[host] += 1
        return core.receive(peers[host], agent_frame(body, seqs[host], now, sender=host), now)

    def wish(severity: int, n: int) -> m.TuningReport:
        return report(severity, comm(n))

    for host in ("h1", "h2"):
        core.receive(peers[host], agent_frame(hello(heartbeat=1.0), sender=host), 0.0)
    send("h1", wish(0, 1000), 0.5)
    send("h2", wish(0, 1000), 0.5)  # h2's last word before it falls silent
    arms: list[tuple[float, bytes]] = []
    statuses = set()
    t = 1.0
    while t <= 30.0:
        out = send("h1", wish(2 if t >= 3.0 else 0, 1000 + int(t * 100)), t)
        out += core.tick(t, WALL)
        arms += [(t, o.conn) for o in out
                 if isinstance(o, SendToAgent) and isinstance(o.message, m.TuningArm)]
        statuses.add(core.agreement.health(JOB, t)[1])
        t = round(t + 0.5, 3)
    assert arms == [] and statuses == {TuningStatus.STEADY}
    assert "unreachable" in core.agreement.status(JOB, t)["waiting"] \
        or "no recent report" in core.agreement.status(JOB, t)["waiting"]
    # h2 is back: the change is armed on both hosts.
    core.receive(peers["h2"], agent_frame(hello(heartbeat=1.0), sender="h2"), t)
    send("h2", wish(0, 4000), t)
    send("h1", wish(2, 4000), t)
    out = core.tick(t, WALL)
    assert sorted(o.conn for o in out if isinstance(o, SendToAgent)
                  and isinstance(o.message, m.TuningArm)) == [b"h1", b"h2"]
