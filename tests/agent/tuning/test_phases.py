"""The tuning phase of a communicator as a table: every (phase, event) pair, and the real
loop driven through arm -> confirm, arm -> cancel and the controller's two phases.

The table is written out again here, by hand, so a changed move in
``agent.tuning.phases`` fails a test instead of passing with it (the mutation bench
finds nothing to change in a table of enum members: this comparison is its check).
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from agent.tuning import service as tuning_service
from agent.tuning.loop import wire_comm
from agent.tuning.phases import PHASES, Event, Phase
from harmonaize import statemachine
from harmonaize.messages import AckPhase, Activation, TuningArm, TuningResolve
from harmonaize.statemachine import IllegalTransition
from tests.agent.tuning.test_loop import (
    CALM,
    COMM,
    DERIVED,
    FULL,
    JOB,
    Host,
    arm,
    judged,
    multi_host,
    race,
    resolve,
)

pytestmark = [pytest.mark.tuning, pytest.mark.architecture]

N, A, G, K, R, C, X = (Phase.IDLE, Phase.ARMED, Phase.AGREEING, Phase.ACKNOWLEDGED,
                       Phase.REFUSED, Phase.CONFIRMED, Phase.CANCELLED)
EXPECTED: dict[tuple[Phase, Event], Phase] = {
    (N, Event.ARM): A, (C, Event.ARM): A, (X, Event.ARM): A,
    (N, Event.ARM_AGREED): G, (C, Event.ARM_AGREED): G, (X, Event.ARM_AGREED): G,
    (K, Event.ARM_AGREED): G, (R, Event.ARM_AGREED): G,
    (N, Event.ADOPTED_PENDING): K,
    (A, Event.VERIFIED): C, (A, Event.UNVERIFIED): X,
    (G, Event.VERIFIED): K, (G, Event.UNVERIFIED): R,
    (G, Event.COMMIT): C, (K, Event.COMMIT): C,
    (G, Event.ABORT): X, (K, Event.ABORT): X, (R, Event.ABORT): X,
}


@pytest.mark.parametrize(("phase", "event"), list(PHASES.pairs()),
                         ids=str)
def test_every_phase_and_event_pair_moves_as_the_table_says_or_raises(
        phase: Phase, event: Event) -> None:
    if (phase, event) in EXPECTED:
        assert PHASES.move(phase, event) is EXPECTED[(phase, event)]
    else:
        with pytest.raises(IllegalTransition, match="tuning_phase: no move from"):
            PHASES.move(phase, event)


def test_the_table_holds_exactly_the_expected_moves_and_every_phase_is_reachable() -> None:
    assert dict(PHASES.moves) == EXPECTED
    reached, frontier = {Phase.IDLE}, [Phase.IDLE]
    while frontier:
        phase = frontier.pop()
        for event in PHASES.events_from(phase):
            target = PHASES.move(phase, event)
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(Phase)


def phase(host: Host) -> Phase:
    return host.job.comms[COMM].phase


def armed_one_host() -> tuple[Host, list]:
    """A job on one host whose link fills: the loop's step arms, nothing confirmed yet."""
    host = Host(activation_margin=50)
    host.declare()
    host.add(2)
    host.step(CALM, 0.1)
    host.advance(1000)
    assert phase(host) is Phase.IDLE
    actions = host.loop.step(judged([FULL]), {JOB: host.slots()}, 0.2)
    assert phase(host) is Phase.ARMED and host.entry().pending
    assert host.loop.awaiting_confirmation() == [JOB]
    return host, actions


def test_arm_then_confirm_drives_the_real_loop_idle_armed_confirmed() -> None:
    host, actions = armed_one_host()
    host.run(actions, 0.2)  # written; the ranks' fresh records are the next input
    assert phase(host) is Phase.CONFIRMED and not host.entry().pending
    assert host.loop.awaiting_confirmation() == []
    assert [c.kind for c in host.job.history][-2:] == ["local", "confirmed"]


def test_arm_then_cancel_drives_the_real_loop_idle_armed_cancelled() -> None:
    host, actions = armed_one_host()
    race(host)  # a rank runs past the switching point before the records are read
    host.run(actions, 0.2)
    assert phase(host) is Phase.CANCELLED
    entry = host.entry()
    assert not entry.pending and entry.after_rules == entry.before_rules
    assert host.job.history[-1].kind == "cancelled"


def test_a_confirmed_communicator_is_armed_again_by_the_next_change() -> None:
    host, actions = armed_one_host()
    host.run(actions, 0.2)
    host.advance(host.entry().at + 10 - 1000)  # every rank passed the switch
    host.step(CALM, 60.0)  # calm starts; the fall waits for the hold
    assert phase(host) is Phase.CONFIRMED
    host.loop.step(judged([CALM]), {JOB: host.slots()}, 70.0)
    assert phase(host) is Phase.ARMED and host.entry().after == "default"


@pytest.mark.parametrize(("commit", "final"), [(True, Phase.CONFIRMED),
                                               (False, Phase.CANCELLED)])
def test_the_controllers_two_phases_move_agreeing_acknowledged_then_the_outcome(
        commit: bool, final: Phase) -> None:
    host = multi_host()
    message = TuningArm(JOB, 1, "severe", DERIVED.fingerprint,
                        (Activation(wire_comm(COMM), 2000),))
    actions = host.loop.arm(message, 1.0)
    assert phase(host) is Phase.AGREEING and host.loop.awaiting_confirmation() == [JOB]
    host.run(actions, 1.0)
    assert phase(host) is Phase.ACKNOWLEDGED
    assert resolve(host, commit).phase is AckPhase.RESOLVED
    assert phase(host) is final and not host.entry().pending


def test_a_refused_decision_waits_for_the_cancel_and_a_commit_of_it_is_refused() -> None:
    host = multi_host()
    race(host)
    assert arm(host).phase is AckPhase.REFUSED
    assert phase(host) is Phase.REFUSED and host.entry().pending
    statemachine.set_strict(False)
    try:
        before = statemachine.illegal_counts().get("tuning_phase", 0)
        entry = host.entry()
        host.run(host.loop.resolve(TuningResolve(JOB, 1, True,
                                                 (Activation(wire_comm(COMM), 2000),)), 2.0),
                 2.0)
        # The table refused the move: counted, and neither the phase nor the entry moved.
        assert statemachine.illegal_counts()["tuning_phase"] == before + 1
        assert phase(host) is Phase.REFUSED and host.entry() == entry
    finally:
        statemachine.set_strict(True)
    resolve(host, False)
    assert phase(host) is Phase.CANCELLED and not host.entry().pending


def test_confirmation_is_the_next_input_not_a_call_back_into_the_service() -> None:
    """The service hands the ranks' fresh records to the loop once per input: its
    ``_run`` never calls itself, and the loop never calls ``confirm`` itself."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(tuning_service.TuningService._run)))
    called = {node.func.attr for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "_run" not in called and "confirm" in called
    from agent.tuning import loop, multihost  # noqa: PLC0415 - the loop's own modules
    for module in (loop, multihost):
        calls = [node for node in ast.walk(ast.parse(inspect.getsource(module)))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr == "confirm"]
        assert calls == [], module.__name__
