"""The agreement's phase table (controller/agreementphases.py): every move, the real
engine walking it, what each move does there (counted, stored, said, sent), and illegal
moves counted on the controller's metrics endpoint."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.agreement import Agreement
from controller.agreementphases import (
    ANSWERS,
    PHASES,
    RESOLVING,
    Event,
    Phase,
    answered,
    outcome,
)
from harmonaize import statemachine
from harmonaize.messages import AckPhase, TuningResolve, TuningStatus
from harmonaize.statemachine import IllegalTransition
from tests.conftest import free_port
from tests.controller.test_agreement import (
    COMM,
    JOB,
    ack,
    agreement,
    arm_of,
    comm,
    kinds,
    report,
)
from tests.daemons import start_controller, wait_until

pytestmark = [pytest.mark.tuning, pytest.mark.architecture]

#: The protocol as controller/agreement.py's docstring tells it, written out again.
EXPECTED = {
    (Phase.IDLE, Event.ARM): Phase.ARMING,
    (Phase.ARMING, Event.CONFIRM): Phase.CONFIRMING,
    (Phase.ARMING, Event.CANCEL): Phase.CANCELLING,
    (Phase.CONFIRMING, Event.RESOLVED): Phase.IDLE,
    (Phase.CANCELLING, Event.RESOLVED): Phase.IDLE,
}


def test_every_agreement_phase_and_event_pair_is_a_listed_move_or_raises() -> None:
    pairs = list(PHASES.pairs())
    assert len(pairs) == len(Phase) * len(Event) == 16
    for phase, event in pairs:
        if (phase, event) in EXPECTED:
            assert PHASES.move(phase, event) is EXPECTED[(phase, event)]
        else:
            with pytest.raises(IllegalTransition, match=f"agreement: no move from .*{event}"):
                PHASES.move(phase, event)
    assert dict(PHASES.moves) == EXPECTED
    assert {Phase.CONFIRMING, Phase.CANCELLING} == RESOLVING
    # What the controller's status shows as "phase".
    assert [p.value for p in Phase] == ["idle", "arming", "confirming", "cancelling"]


def test_an_outcome_is_decided_once_and_a_new_change_waits_for_the_last() -> None:
    for phase in RESOLVING:
        for event in (Event.ARM, Event.CONFIRM, Event.CANCEL):
            with pytest.raises(IllegalTransition):
                PHASES.move(phase, event)
    with pytest.raises(IllegalTransition):
        PHASES.move(Phase.ARMING, Event.ARM)


def test_each_agreement_phase_waits_for_its_own_answers_and_an_outcome_is_decided_by_why() -> None:
    assert {phase: set(acks) for phase, acks in ANSWERS.items()} == {
        Phase.IDLE: set(),
        Phase.ARMING: {AckPhase.ARMED, AckPhase.REFUSED},
        Phase.CONFIRMING: {AckPhase.RESOLVED},
        Phase.CANCELLING: {AckPhase.RESOLVED},
    }
    for phase in Phase:
        assert not answered(phase, None)
        for ack_phase in AckPhase:
            assert answered(phase, ack_phase) is (ack_phase in ANSWERS[phase])
    assert outcome("") is Event.CONFIRM
    assert outcome("host h2 refused") is Event.CANCEL


def walk(a: Agreement, steps: list[tuple[float, list[tuple[str, AckPhase]]]]) -> list[str]:
    """Step the engine, acknowledging as told, and note each phase it shows."""
    seen = [a.status(JOB, 0.0)["phase"]]
    for now, acks in steps:
        for host, phase in acks:
            ack(a, host, a.status(JOB, now)["decision"], phase, comm(1010 + 10 * now),
                now=now)
        a.step(now)
        if a.status(JOB, now)["phase"] != seen[-1]:
            seen.append(a.status(JOB, now)["phase"])
        assert a.phase(JOB).value == seen[-1]
    return seen


def test_a_full_agreement_round_passes_idle_arming_confirming_idle() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    seen = walk(a, [(1.0, []), (1.1, [("h1", AckPhase.ARMED)]),
                    (1.2, [("h2", AckPhase.ARMED)]), (1.3, [("h1", AckPhase.RESOLVED)]),
                    (1.4, [("h2", AckPhase.RESOLVED)])])
    assert seen == ["idle", "arming", "confirming", "idle"]
    assert a.health(JOB, 1.4)[0] == "severe"


def test_a_refused_agreement_round_passes_through_cancelling() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    seen = walk(a, [(1.0, []), (1.1, [("h1", AckPhase.REFUSED)]),
                    (1.2, [("h1", AckPhase.RESOLVED), ("h2", AckPhase.RESOLVED)])])
    assert seen == ["idle", "arming", "cancelling", "idle"]
    assert a.health(JOB, 1.2)[0] == "default"


def test_a_restart_while_arming_restores_as_cancelling_and_while_confirming_as_is() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    arm = arm_of(a.step(1.0))
    arming = a.snapshot(JOB)
    assert arming is not None and arming["decision"]["commit"] is None
    after = agreement()
    after.restore(JOB, arming, 5.0)
    assert after.phase(JOB) is Phase.CANCELLING
    assert {m for _, m in after.step(5.0)} == {TuningResolve(JOB, 1, False, arm.activations)}

    walk(a, [(1.1, [("h1", AckPhase.ARMED), ("h2", AckPhase.ARMED)])])
    assert a.phase(JOB) is Phase.CONFIRMING
    confirming = a.snapshot(JOB)
    assert confirming is not None and confirming["decision"]["commit"] is True
    again = agreement()
    again.restore(JOB, confirming, 6.0)
    assert again.phase(JOB) is Phase.CONFIRMING
    assert {m for _, m in again.step(6.0)} == {TuningResolve(JOB, 1, True, arm.activations)}
    assert again.phase("no-such-job") is Phase.IDLE


#: Starts the real controller after one illegal move on the real agreement table, as a
#: bug would make it, with illegal moves refused (production) rather than raised.
BUGGY_START = """\
import sys
from controller import main
from controller.agreementphases import PHASES, Event, Phase
from harmonaize import statemachine
statemachine.set_strict(False)
PHASES.move(Phase.IDLE, Event.RESOLVED)
PHASES.move(Phase.CONFIRMING, Event.ARM)
sys.exit(main.main(sys.argv[4:]))
"""


def illegal_on_endpoint(port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "harmonaize_controller_illegal_transitions_total"
                    and sample.labels == {"machine": "agreement"}):
                return sample.value
    return None


@pytest.mark.controller
def test_illegal_agreement_moves_are_counted_on_the_controller_metrics(
        spawn, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A controller without the bug shows the machine, at 0.
    plain, port = workdir / "plain", free_port()
    plain.mkdir()
    start_controller(spawn, plain, extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    wait_until(lambda: illegal_on_endpoint(port) is not None, what="the metric")
    assert illegal_on_endpoint(port) == 0

    # One with two illegal moves made (refused, not raised, as in production) counts them.
    script = workdir / "buggy.py"
    script.write_text(BUGGY_START)
    monkeypatch.delenv(statemachine.STRICT_ENV)
    port = free_port()
    start_controller(spawn, workdir, extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n',
                     wrap=[sys.executable, str(script)])
    assert wait_until(lambda: illegal_on_endpoint(port), what="the illegal moves") == 2


# --- what each move does (the engine, to the letter) -------------------------------------


def armed(a: Agreement, now: float = 1.0) -> None:
    """Both hosts report, the change is armed on both (decision 1)."""
    a.report("h1", report(2, comm(1000)), now)
    a.report("h2", report(0, comm(1200)), now)
    assert sorted(kinds(a.step(now))) == [("h1", "tuning-arm"), ("h2", "tuning-arm")]


def test_arming_is_counted_stored_and_leaves_nothing_to_wait_for() -> None:
    a = agreement()
    a.take_dirty()
    armed(a)
    assert a.counters == {"armed": 1}
    assert a.take_dirty() == ([JOB], [])
    assert a.status(JOB, 1.0)["waiting"] == ""
    assert a.report("h3", report(2, comm(1000)), 1.0) is False  # not one of the job's hosts


def test_a_confirmation_is_counted_stored_and_sent_at_once_then_resolves_to_idle() -> None:
    a = agreement(resend=0.5)
    armed(a)
    a.take_dirty()
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    ack(a, "h2", 1, AckPhase.ARMED, comm(1210), now=1.1)
    assert sorted(kinds(a.step(1.1))) == [("h1", "tuning-resolve"), ("h2", "tuning-resolve")]
    assert a.counters == {"armed": 1, "confirmed": 1}
    assert a.take_dirty() == ([JOB], [])
    ack(a, "h1", 1, AckPhase.RESOLVED, now=1.2)
    ack(a, "h2", 1, AckPhase.RESOLVED, now=1.2)
    a.take_dirty()
    a.step(1.2)
    assert a.take_dirty() == ([JOB], [])
    assert (a.phase(JOB), a.status(JOB, 1.2)["waiting"]) == (Phase.IDLE, "")


def test_a_cancellation_says_why_and_each_one_doubles_the_wait_before_the_next_arm() -> None:
    a = agreement(resend=0.5)
    armed(a)
    ack(a, "h1", 1, AckPhase.REFUSED, comm(1010), now=1.1, reason="no")
    a.step(1.1)
    assert a.counters == {"armed": 1, "cancelled": 1}
    for host in ("h1", "h2"):
        ack(a, host, 1, AckPhase.RESOLVED, now=1.2)
    a.step(1.2)
    assert a.status(JOB, 1.2)["waiting"] == "cancelled: host h1 refused: no"
    assert a.next_deadline(1.2) == pytest.approx(2.2)  # one second of back-off
    armed(a, 2.2)
    ack(a, "h2", 2, AckPhase.REFUSED, comm(1210), now=2.3, reason="again")
    a.step(2.3)
    for host in ("h1", "h2"):
        ack(a, host, 2, AckPhase.RESOLVED, now=2.4)
    a.step(2.4)
    assert a.next_deadline(2.4) == pytest.approx(4.4)  # then two
    assert a.step(4.39) == []
    armed(a, 4.4)
    for host in ("h1", "h2"):
        ack(a, host, 3, AckPhase.ARMED, comm(1400, ranks=2), now=4.5)
    a.step(4.5)
    for host in ("h1", "h2"):
        ack(a, host, 3, AckPhase.RESOLVED, now=4.6)
    a.step(4.6)
    assert a.phase(JOB) is Phase.IDLE and a.health(JOB, 4.6)[0] == "severe"
    assert a.counters == {"armed": 3, "cancelled": 2, "confirmed": 1}


def test_a_host_silent_past_the_arm_timeout_is_named_in_the_cancellation() -> None:
    a = agreement(arm_timeout=1.0)
    armed(a)
    a.set_hosts(JOB, {"h1"})  # a host leaving while arming is still waited for
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    a.step(1.9)
    assert a.phase(JOB) is Phase.ARMING  # not yet late
    a.step(2.0)
    assert a.phase(JOB) is Phase.CANCELLING
    assert a.status(JOB, 2.0)["in_flight"]["reason"] == "host h2 did not answer within 1 s"


def test_an_outcome_goes_only_to_the_hosts_that_were_armed() -> None:
    a = agreement()
    armed(a)
    for host in ("h1", "h2"):
        ack(a, host, 1, AckPhase.ARMED, comm(1010), now=1.1)
    a.step(1.1)
    a.set_hosts(JOB, {"h1", "h2", "h3"})  # h3 joins while confirming: it armed nothing
    assert sorted(h for h, _ in a.step(1.7)) == ["h1", "h2"]


def test_an_arm_is_resent_exactly_after_resend_to_each_host_that_has_not_answered() -> None:
    a = agreement(resend=0.5, arm_timeout=5.0)
    armed(a)
    ack(a, "h1", 1, AckPhase.ARMED, comm(1010), now=1.1)
    assert kinds(a.step(1.5)) == [("h2", "tuning-arm")]


def test_the_next_deadline_is_strictly_after_now_and_follows_the_arm_timeout() -> None:
    a = agreement(resend=0.5, arm_timeout=0.6, lead=1.0)
    armed(a)
    assert a.next_deadline(1.55) == pytest.approx(1.6)  # the arm timeout
    assert a.next_deadline(2.0) == pytest.approx(2.5)  # the lead is now: not after it


def test_with_every_answer_in_the_tenant_is_told_steady_even_past_the_lead() -> None:
    a = agreement(lead=1.0)
    armed(a)
    for host in ("h1", "h2"):
        ack(a, host, 1, AckPhase.ARMED, comm(1010), now=1.1)
    assert a.health(JOB, 2.5)[1] is TuningStatus.STEADY  # not stepped yet: still arming
    assert a.phase(JOB) is Phase.ARMING
    b = agreement(lead=1.0)
    armed(b)
    assert b.status(JOB, 2.5)["health"] == "paused"  # nobody answered


def test_a_job_without_placement_takes_the_reporting_hosts_and_a_placed_one_waits() -> None:
    a = Agreement()
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    assert sorted(kinds(a.step(1.0))) == [("h1", "tuning-arm"), ("h2", "tuning-arm")]
    placed = agreement()
    placed.step(1.0)
    assert placed.status(JOB, 1.0)["waiting"] == ""  # no report yet: nothing to say


def test_what_a_job_waits_for_is_said_in_words() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200), fingerprint="beef"), 1.0)
    a.step(1.0)
    assert a.status(JOB, 1.0)["waiting"] == ("hosts derived different rules (declaration "
                                             "revisions differ)")
    b = agreement()
    b.report("h1", report(2, comm(1000, switches=1, history=1, last=10)), 1.0)
    b.report("h2", report(0, comm(1200, switches=2, history=2, last=10)), 1.0)
    assert b.step(1.0) == []
    assert b.status(JOB, 1.0)["waiting"].startswith(
        f"communicator {COMM:#x}: its ranks disagree")


def test_without_communicators_a_new_choice_is_stored_once_and_a_withdrawal_too() -> None:
    a = agreement()
    for host in ("h1", "h2"):
        a.report(host, report(2), 1.0)
    a.take_dirty()
    a.step(1.0)
    assert a.take_dirty() == ([JOB], []) and a.health(JOB, 1.0)[0] == "severe"
    a.step(1.1)
    assert a.take_dirty() == ([], [])  # nothing changed: nothing to store
    a.withdraw(JOB)
    assert a.take_dirty() == ([JOB], [])


def test_forgetting_a_host_leaves_jobs_it_never_reported_for_alone() -> None:
    a = agreement()
    a.report("h1", report(0, comm(1000)), 1.0)
    a.set_hosts("other", {"h9"})
    a.forget_host("h1")
    assert a.status(JOB, 1.0)["reports"] == {}
