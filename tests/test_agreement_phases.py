"""The agreement's phase table (controller/agreementphases.py): every move, the real
engine walking it, and illegal moves counted on the controller's metrics endpoint."""

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
from harmonaize.messages import AckPhase, TuningResolve
from harmonaize.statemachine import IllegalTransition
from tests.conftest import free_port
from tests.daemons import start_controller, wait_until
from tests.test_tuning_agreement import JOB, ack, agreement, arm_of, comm, report

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
