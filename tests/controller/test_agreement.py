"""controller/agreement.py: two-phase changes every host applies alike, whatever fails."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.agreement import Agreement
from controller.agreementstate import AgreementSettings
from harmonaize.messages import (
    AckPhase,
    CommReport,
    Message,
    SwitchState,
    TuningAck,
    TuningArm,
    TuningReport,
    TuningResolve,
    TuningStatus,
)

pytestmark = pytest.mark.tuning

JOB = "job-1"
NAMES = ("default", "congested", "severe")
FP = "f00d"
COMM = 7


def comm(collectives: int, *, ranks: int = 2, n_ranks: int = 4, rate: float = 100.0,
         choice: str = "default", at: int = 0, pending: bool = False, waiting: int = 0,
         switches: int = 0, history: int = 0, last: int = 0, comm_id: int = COMM
         ) -> CommReport:
    state = SwitchState(switches, history, 0, last, collectives)
    return CommReport(comm_id, n_ranks, 2, ranks, collectives, collectives, rate, choice, at,
                      pending, state, state, waiting)


def report(severity: int, *comms: CommReport, fingerprint: str = FP) -> TuningReport:
    return TuningReport(JOB, fingerprint, NAMES[severity], severity, comms)


def agreement(**overrides: object) -> Agreement:
    a = Agreement(AgreementSettings(**{"hold": 10.0, "lead": 1.0, "margin": 100,  # type: ignore[arg-type]
                                       "arm_timeout": 1.0, "resend": 0.5, **overrides}))
    a.set_hosts(JOB, {"h1", "h2"})
    return a


def kinds(out: Sequence[tuple[str, Message]]) -> list[tuple[str, str]]:
    return [(host, message.KIND) for host, message in out]


def arm_of(out: Sequence[tuple[str, Message]]) -> TuningArm:
    arms = {m for _, m in out if isinstance(m, TuningArm)}
    assert len(arms) == 1, out
    return arms.pop()


def ack(a: Agreement, host: str, decision: int, phase: AckPhase, *comms: CommReport,
        now: float, reason: str = "") -> None:
    a.ack(host, TuningAck(JOB, decision, phase, reason, comms), now)


def congested_two_hosts(a: Agreement, now: float = 1.0) -> TuningArm:
    a.report("h1", report(2, comm(1000)), now)
    a.report("h2", report(0, comm(1200)), now)
    out = a.step(now)
    assert sorted(kinds(out)) == [("h1", "tuning-arm"), ("h2", "tuning-arm")]
    return arm_of(out)


def test_a_change_is_armed_everywhere_then_confirmed_alike() -> None:
    a = agreement()
    arm = congested_two_hosts(a)
    assert (arm.choice, arm.decision, arm.fingerprint) == ("severe", 1, FP)
    (activation,) = arm.activations
    assert activation.comm == COMM and activation.at >= 1200 + 100
    assert a.step(1.1) == []  # waiting for both hosts
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    assert a.step(1.2) == []
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.2)
    out = a.step(1.2)
    resolves = {m for _, m in out}
    assert sorted(kinds(out)) == [("h1", "tuning-resolve"), ("h2", "tuning-resolve")]
    assert resolves == {TuningResolve(JOB, 1, True, arm.activations)}
    assert a.health(JOB, 0.0) == ("default", TuningStatus.STEADY)  # not yet everywhere
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.3)
    ack(a, "h2", 1, AckPhase.RESOLVED, now=1.3)
    assert a.step(1.3) == []
    assert a.health(JOB, 0.0)[0] == "severe"
    assert a.status(JOB, 0.0)["phase"] == "idle"


def test_a_refusal_cancels_on_every_host() -> None:
    a = agreement()
    arm = congested_two_hosts(a)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    ack(a, "h2", 1, AckPhase.REFUSED, comm(1310), now=1.1, reason="a rank reached it")
    out = a.step(1.1)
    assert sorted(h for h, _ in out) == ["h1", "h2"]
    assert {m for _, m in out} == {TuningResolve(JOB, 1, False, arm.activations)}
    assert "refused" in a.status(JOB, 0.0)["in_flight"]["reason"]


def test_a_silent_host_is_cancelled_and_still_told() -> None:
    a = agreement()
    congested_two_hosts(a)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    assert kinds(a.step(1.6)) == [("h2", "tuning-arm")]  # resent to the one that is silent
    out = a.step(2.0)
    assert sorted(kinds(out)) == [("h1", "tuning-resolve"), ("h2", "tuning-resolve")]
    assert not any(m.commit for _, m in out)  # type: ignore[attr-defined]
    ack(a, "h1", 1, AckPhase.RESOLVED, now=2.1)
    # h2 may have armed before its answer was lost: it hears the outcome until it says so.
    assert kinds(a.step(2.6)) == [("h2", "tuning-resolve")]
    assert a.step(2.7) == []
    a.reconnected("h2")
    assert kinds(a.step(2.8)) == [("h2", "tuning-resolve")]
    ack(a, "h2", 1, AckPhase.RESOLVED, now=2.9)
    a.step(2.9)
    assert a.status(JOB, 2.9)["phase"] == "idle" and a.health(JOB, 2.9)[0] == "default"
    # After a cancellation the next arm waits a back-off.
    a.report("h1", report(2, comm(1400)), 3.0)
    a.report("h2", report(0, comm(1600)), 3.0)
    assert a.step(3.0) == []
    assert kinds(a.step(4.0)) == [("h1", "tuning-arm"), ("h2", "tuning-arm")]


def test_a_silent_host_past_the_lead_reads_as_paused() -> None:
    a = agreement(lead=1.0)
    congested_two_hosts(a)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    assert a.health(JOB, 1.5)[1] is TuningStatus.STEADY
    a.step(2.0)  # cancelled: h2 never answered; h1 resolves, h2 is cut off
    ack(a, "h1", 1, AckPhase.RESOLVED, now=2.1)
    # h2 may have armed: its ranks wait at the switching point by now.
    assert a.health(JOB, 2.2)[1] is TuningStatus.PAUSED
    ack(a, "h2", 1, AckPhase.RESOLVED, now=5.0)
    a.step(5.0)
    assert a.health(JOB, 5.0)[1] is TuningStatus.STEADY


def test_every_rank_must_be_accounted_for() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000, ranks=2)), 1.0)
    a.report("h2", report(0, comm(1000, ranks=1)), 1.0)  # one of h2's ranks unseen
    assert a.step(1.0) == []
    assert "3 of its 4 ranks reported" in a.status(JOB, 0.0)["waiting"]
    a.report("h2", report(0, comm(1010, ranks=2)), 1.1)
    arm = arm_of(a.step(1.1))
    # At commit the hosts' own counts decide: one host armed fewer ranks than before.
    ack(a, "h1", arm.decision, AckPhase.ARMED, comm(1010, ranks=2), now=1.2)
    ack(a, "h2", arm.decision, AckPhase.ARMED, comm(1020, ranks=1), now=1.2)
    out = a.step(1.2)
    assert out and not any(m.commit for _, m in out)  # type: ignore[attr-defined]
    assert "3 of its 4 ranks armed" in a.status(JOB, 0.0)["in_flight"]["reason"]


def test_every_placed_host_must_report() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000, ranks=4)), 1.0)
    assert a.step(1.0) == []
    assert a.status(JOB, 0.0)["waiting"] == "no recent report from host h2"


def test_activation_projects_each_report_to_now() -> None:
    a = agreement(lead=2.0, margin=10)
    a.report("h1", report(2, comm(1000, rate=500.0)), 10.0)  # 4 s old by now: ~3000
    a.report("h2", report(1, comm(2500, rate=100.0)), 14.0)
    arm = arm_of(a.step(14.0))
    assert arm.activations[0].at == 3000 + 1000  # + fastest rate x lead


def commit(a: Agreement, arm: TuningArm, now: float, at: int = 0) -> None:
    """Both hosts arm (their ranks below the switch, the entry pending), then resolve."""
    switch = arm.activations[0].at
    for host in ("h1", "h2"):
        ack(a, host, arm.decision, AckPhase.ARMED,
            comm(at or 1, ranks=2, choice=arm.choice, at=switch, pending=True), now=now)
    a.step(now)
    for host in ("h1", "h2"):
        ack(a, host, arm.decision, AckPhase.RESOLVED, now=now)
    a.step(now)


def test_a_fall_waits_for_the_hold_and_for_every_host_to_pass() -> None:
    a = agreement(hold=5.0)
    arm = congested_two_hosts(a)
    commit(a, arm, 1.1)
    at = arm.activations[0].at
    # Calm everywhere, but h2's ranks have not passed the switch yet.
    a.report("h1", report(0, comm(at + 5, choice="severe", at=at)), 2.0)
    a.report("h2", report(0, comm(at - 50, choice="severe", at=at)), 2.0)
    assert a.step(2.0) == []
    assert a.step(7.5) == []
    assert "has not passed the switch" in a.status(JOB, 0.0)["waiting"]
    a.report("h2", report(0, comm(at + 1, choice="severe", at=at)), 7.6)
    down = arm_of(a.step(7.6))
    assert down.choice == "default" and down.decision == 2


def test_a_rise_is_at_once_and_changes_are_rate_limited() -> None:
    a = agreement(hold=0.0, max_decisions_per_minute=2)
    decided, waits = [], []
    current, at, now = "default", 0, 1.0
    for level in (2, 0, 2, 0):
        position = max(at + 1, int(now * 100))  # every rank past the last switch
        a.report("h1", report(level, comm(position, choice=current, at=at)), now)
        a.report("h2", report(0, comm(position, choice=current, at=at)), now)
        out = a.step(now) or a.step(now + 0.01)  # a fall is seen once, then held (0 s)
        if out:
            arm = arm_of(out)
            decided.append(arm.choice)
            commit(a, arm, now, at=position)
            current, at = arm.choice, arm.activations[0].at
        waits.append(a.status(JOB, 0.0)["waiting"])
        now += 10.0
    assert decided == ["severe", "default"]  # the third change waits for the minute
    assert "changes in the last minute" in waits[2]


def test_no_change_while_a_rank_waits_or_refused() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000, waiting=1)), 1.0)
    a.report("h2", report(0, comm(1000)), 1.0)
    assert a.step(1.0) == []
    assert "wait" in a.status(JOB, 0.0)["waiting"]
    assert a.health(JOB, 0.0)[1] is TuningStatus.PAUSED


def test_hosts_that_derived_other_rules_are_not_switched() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000), fingerprint="a"), 1.0)
    a.report("h2", report(0, comm(1000), fingerprint="b"), 1.0)
    assert a.step(1.0) == []
    assert "different rules" in a.status(JOB, 0.0)["waiting"]


def test_only_the_jobs_hosts_count_and_stale_reports_expire() -> None:
    a = agreement(report_ttl=5.0)
    a.report("stranger", report(2, comm(1000, ranks=4)), 1.0)
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1000)), 1.0)
    assert arm_of(a.step(1.0)).choice == "severe"
    b = agreement(report_ttl=5.0)
    b.report("h1", report(2, comm(1000)), 1.0)
    b.report("h2", report(0, comm(1000)), 1.0)
    assert b.step(7.0) == []  # both reports expired


def test_divergence_across_hosts_is_detected() -> None:
    a = agreement()
    # h1's ranks changed at collective 500; h2's passed 500 without changing.
    a.report("h1", report(0, comm(900, switches=1, history=11, last=500)), 1.0)
    a.report("h2", report(0, comm(900, switches=0, history=0)), 1.0)
    a.step(1.0)
    assert a.health(JOB, 0.0)[1] is TuningStatus.DIVERGED
    assert "passed collective 500" in a.status(JOB, 0.0)["diverged"][f"{COMM:#x}"]
    # One host still before the change is no disagreement.
    b = agreement()
    b.report("h1", report(0, comm(900, switches=1, history=11, last=500)), 1.0)
    b.report("h2", report(0, comm(450, switches=0, history=0)), 1.0)
    b.step(1.0)
    assert b.health(JOB, 0.0)[1] is TuningStatus.STEADY


def test_state_survives_a_restart_and_an_arm_in_flight_is_cancelled() -> None:
    a = agreement()
    arm = congested_two_hosts(a)
    dirty, _ = a.take_dirty()
    assert JOB in dirty
    snapshot = a.snapshot(JOB)
    assert snapshot is not None and snapshot["decision"]["commit"] is None
    b = Agreement(a.settings)
    b.restore(JOB, snapshot, 50.0)
    b.set_hosts(JOB, {"h1", "h2"})
    out = b.step(50.0)
    assert {m for _, m in out} == {TuningResolve(JOB, 1, False, arm.activations)}
    for host in ("h1", "h2"):
        ack(b, host, 1, AckPhase.RESOLVED, now=50.1)
    b.step(50.1)
    b.report("h1", report(2, comm(5000)), 60.0)
    b.report("h2", report(0, comm(5000)), 60.0)
    assert arm_of(b.step(60.0)).decision == 2  # numbers keep rising


def test_a_recorded_commit_is_resent_after_a_restart() -> None:
    a = agreement()
    arm = congested_two_hosts(a)
    for host in ("h1", "h2"):
        ack(a, host, 1, AckPhase.ARMED, comm(1010), now=1.1)
    out = a.step(1.1)
    assert all(m.commit for _, m in out)  # type: ignore[attr-defined]
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.2)
    a.step(1.2)
    b = Agreement(a.settings)
    b.restore(JOB, a.snapshot(JOB) or {}, 9.0)
    b.set_hosts(JOB, {"h1", "h2"})
    assert {(h, m) for h, m in b.step(9.0)} == {("h2", TuningResolve(JOB, 1, True,
                                                                     arm.activations))}


def test_withdrawal_returns_every_host_to_nccl_then_forgets() -> None:
    a = agreement()
    arm = congested_two_hosts(a)
    commit(a, arm, 1.1)
    at = arm.activations[0].at
    a.withdraw(JOB)
    a.report("h1", report(2, comm(at + 1, choice="severe", at=at)), 30.0)
    a.report("h2", report(0, comm(at + 1, choice="severe", at=at)), 30.0)
    down = arm_of(a.step(30.0))  # no hold, though h1 is still congested
    assert down.choice == "default"
    commit(a, down, 30.1)
    a.report("h1", report(0, comm(at + 9, choice="default", at=down.activations[0].at)), 31.0)
    a.report("h2", report(0, comm(at + 9, choice="default", at=down.activations[0].at)), 31.0)
    a.step(31.0)
    assert a.status(JOB, 0.0) == {}
    assert a.take_dirty()[1] == [JOB]


@settings(max_examples=150, deadline=None)
@given(events=st.lists(st.tuples(
    st.sampled_from(["report", "ack", "step", "restart", "reconnect"]),
    st.sampled_from(["h1", "h2", "h3"]), st.integers(0, 2),
    st.sampled_from(list(AckPhase)), st.floats(0.0, 3.0)), min_size=5, max_size=80))
def test_every_host_hears_one_outcome_per_decision(events) -> None:
    """Whatever arrives in whatever order, and across restarts, a decision is confirmed
    only if every host armed it, and no two hosts ever hear different outcomes."""
    settings_ = AgreementSettings(hold=0.5, lead=0.1, margin=10, arm_timeout=1.0, resend=0.3)
    a = Agreement(settings_)
    hosts = {"h1", "h2", "h3"}
    a.set_hosts(JOB, hosts)
    outcomes: dict[int, bool] = {}
    armed: dict[int, set[str]] = {}
    current = 0
    now = 0.0
    for kind, host, level, phase, dt in events:
        now += dt
        if kind == "report":
            a.report(host, report(level, comm(int(now * 100), ranks=1, n_ranks=3)), now)
        elif kind == "ack":
            if phase is AckPhase.ARMED:
                armed.setdefault(current, set()).add(host)
            ack(a, host, current, phase, comm(int(now * 100), ranks=1, n_ranks=3), now=now)
        elif kind == "restart":
            snapshots = {JOB: a.snapshot(JOB)} if a.snapshot(JOB) else {}
            a = Agreement(settings_)
            for job, state in snapshots.items():
                a.restore(job, state or {}, now)
            a.set_hosts(JOB, hosts)
        elif kind == "reconnect":
            a.reconnected(host)
        for _, message in a.step(now):
            if isinstance(message, TuningResolve):
                seen = outcomes.setdefault(message.decision, message.commit)
                assert seen == message.commit, "two outcomes for one decision"
                if message.commit:
                    assert armed.get(message.decision, set()) >= hosts
            elif isinstance(message, TuningArm):
                assert message.decision not in outcomes, "a decision armed after its outcome"
                current = message.decision
                assert all(x.at > 0 for x in message.activations)
