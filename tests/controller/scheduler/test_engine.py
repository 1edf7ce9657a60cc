"""The scheduler loop's sans-I/O engine: what a node gets from its host's holds and what
the scheduler shows (issue 29 item 2: drains, resumes, ownership, the breaker, shadow
mode, cancel; item 3's scheduler side: reboot and RMA; maintenance reservations)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from controller.scheduler.engine import Engine
from controller.scheduler.reasons import MAX_REASON, reason_of
from controller.scheduler.table import TABLE, Situation, Verdict, Want
from controller.scheduler.types import (
    Drain,
    HostView,
    Marks,
    Mode,
    Node,
    Observations,
    Reboot,
    Reserve,
    Resume,
    Settings,
    Unreserve,
)
from harmonaize.messages import Hold, HoldKind

pytestmark = pytest.mark.scheduler

ACT = Settings(mode=Mode.ACT, max_share=0.5)
QUARANTINED = (Hold(HoldKind.GPU_QUARANTINED, 2, "reset-gpu"),)


def _node(name: str, *flags: str, reason: str = "", parts: tuple[str, ...] = ("gpu",)) -> Node:
    return Node(name, frozenset(flags or ("IDLE",)), reason, parts)


def _host(name: str, holds: tuple[Hold, ...] = (), *, alive: bool = True,
          idle_wanted: bool = False) -> HostView:
    return HostView(name, name, alive, holds, idle_wanted)


def _step(engine: Engine, hosts: list[HostView], nodes: list[Node],
          reservations: frozenset[str] = frozenset()) -> list[object]:
    return engine.step(Observations(tuple(hosts), tuple(nodes), reservations), 0.0).actions


def _idle_nodes(count: int) -> list[Node]:
    return [_node(f"n{i}") for i in range(count)]


def _spare(count: int) -> list[Node]:
    """Idle nodes beside the ones a test looks at (the breaker's room)."""
    return [_node(f"spare{i}") for i in range(count)]


def test_every_situation_and_want_has_one_verdict() -> None:
    assert set(TABLE) == {(s, w) for s in Situation for w in Want}


def test_a_quarantined_gpu_drains_its_node_with_our_reason() -> None:
    engine = Engine(ACT)
    actions = _step(engine, [_host("n1", QUARANTINED)], [_node("n1"), *_spare(3)])
    assert actions == [Drain("n1", "hz: gpu 2 quarantined: reset-gpu")]


def test_released_host_resumes_only_our_drain() -> None:
    engine = Engine(ACT, Marks(ours={"n1": "hz: gpu 2 quarantined: reset-gpu"}))
    nodes = [_node("n1", "IDLE", "DRAIN", reason="hz: gpu 2 quarantined: reset-gpu"),
             _node("n2", "IDLE", "DRAIN", reason="bad fan, bob"), *_spare(2)]
    assert _step(engine, [_host("n1"), _host("n2")], nodes) == [Resume("n1")]


def test_someone_elses_drain_is_never_resumed_nor_drained_over() -> None:
    engine = Engine(ACT)
    nodes = [_node("n1", "IDLE", "DRAIN", reason="bad fan, bob"), *_spare(3)]
    step = engine.step(Observations((_host("n1", QUARANTINED),), tuple(nodes)), 0.0)
    assert step.actions == []
    assert any("drained or down by someone else" in note for note in step.notes)
    assert _step(engine, [_host("n1")], nodes) == []


def test_a_node_down_for_someone_elses_reason_keeps_that_reason() -> None:
    engine = Engine(ACT)
    nodes = [_node("n1", "DOWN", reason="Not responding"), *_spare(4)]
    assert _step(engine, [_host("n1", QUARANTINED)], nodes) == []
    assert engine.rows[0].situation == "theirs"


def test_a_hand_edited_reason_is_theirs_and_said_once() -> None:
    engine = Engine(ACT, Marks(ours={"n1": "hz: gpu 2 quarantined: reset-gpu"}))
    # Edited, even keeping our prefix: it is not what we wrote.
    nodes = [_node("n1", "IDLE", "DRAIN", reason="hz: gpu 2 checked by alice"),
             *_spare(3)]
    first = engine.step(Observations((_host("n1", QUARANTINED),), tuple(nodes)), 0.0)
    second = engine.step(Observations((_host("n1", QUARANTINED),), tuple(nodes)), 1.0)
    third = engine.step(Observations((_host("n1"),), tuple(nodes)), 2.0)
    assert first.actions == second.actions == third.actions == []
    assert [n for n in first.notes if "edited by hand" in n]
    assert second.notes == []  # said once, not again as someone else's
    assert "n1" in engine.marks.disowned and "n1" not in engine.marks.ours


def test_breaker_holds_drains_beyond_the_share_and_retries_when_room() -> None:
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.2))
    nodes = _idle_nodes(10)
    hosts = [_host(f"n{i}", QUARANTINED) for i in range(4)]
    first = _step(engine, hosts, nodes)
    assert first == [Drain("n0", reason_of(QUARANTINED)), Drain("n1", reason_of(QUARANTINED))]
    held = [row for row in engine.rows if row.held.startswith("breaker")]
    assert [row.node for row in held] == ["n2", "n3"]
    # Someone else's down node counts too: no room now.
    nodes[0] = _node("n0", "IDLE", "DRAIN", reason="hz: gpu 2 quarantined: reset-gpu")
    nodes[1] = _node("n1", "IDLE", "DRAIN", reason="hz: gpu 2 quarantined: reset-gpu")
    nodes[9] = _node("n9", "DOWN", reason="Not responding")
    assert _step(engine, hosts, nodes) == []
    nodes[9] = _node("n9")
    hosts[0] = _host("n0")
    engine.marks.ours.update({"n0": reason_of(QUARANTINED), "n1": reason_of(QUARANTINED)})
    assert _step(engine, hosts, nodes) == [Resume("n0")]


def test_shadow_mode_does_nothing_and_says_it_once() -> None:
    engine = Engine(Settings())  # the default
    first = engine.step(Observations((_host("n1", QUARANTINED),), tuple(_idle_nodes(5))), 0.0)
    second = engine.step(Observations((_host("n1", QUARANTINED),), tuple(_idle_nodes(5))), 1.0)
    assert first.actions == second.actions == []
    assert first.notes == ["shadow mode: would drain (hz: gpu 2 quarantined: reset-gpu) "
                           "on node n1"]
    assert second.notes == []


def test_cancelled_node_and_pause_leave_nodes_alone() -> None:
    engine = Engine(ACT, Marks(cancelled={"n1"}))
    hosts = [_host("n1", QUARANTINED), _host("n2", QUARANTINED)]
    nodes = _idle_nodes(6)
    assert _step(engine, hosts, nodes) == [Drain("n2", reason_of(QUARANTINED))]
    engine.marks.paused = True
    assert _step(engine, hosts, nodes) == []
    assert {row.node: row.held for row in engine.rows}["n1"] == "cancelled by an operator"


def test_a_silent_host_is_neither_drained_nor_resumed() -> None:
    engine = Engine(ACT, Marks(ours={"n2": reason_of(QUARANTINED)}))
    nodes = [_node("n2", "IDLE", "DRAIN", reason=reason_of(QUARANTINED)), *_spare(4)]
    hosts = [_host("n1", QUARANTINED, alive=False), _host("n2", alive=False)]
    assert _step(engine, hosts, nodes) == []


def test_reboot_hold_asks_once_and_the_pending_reboot_is_left_to_slurm() -> None:
    engine = Engine(ACT)
    holds = (Hold(HoldKind.REBOOT, -1, "3 resets failed"), *QUARANTINED)
    nodes = _idle_nodes(4)
    actions = _step(engine, [_host("n1", holds)], nodes)
    assert actions == [Reboot("n1", "hz: reboot; gpu 2 quarantined: reset-gpu")]
    engine.done(actions[0])
    reason = "hz: reboot; gpu 2 quarantined: reset-gpu"
    nodes[1] = _node("n1", "IDLE", "DRAIN", "REBOOT_REQUESTED", reason=reason)
    assert _step(engine, [_host("n1", holds)], nodes) == []
    # Back, resumed by nextstate=RESUME, the hold still there: drained, not rebooted again.
    nodes[1] = _node("n1")
    assert _step(engine, [_host("n1", holds)], nodes) == [Drain("n1", reason)]


def test_rma_drains_and_is_never_resumed_while_it_holds() -> None:
    engine = Engine(ACT)
    rma = (Hold(HoldKind.RMA, 5, ""),)
    nodes = _idle_nodes(4)
    assert _step(engine, [_host("n1", rma)], nodes) == [Drain("n1", "hz: gpu 5 rma")]
    engine.done(Drain("n1", "hz: gpu 5 rma"))
    nodes[1] = _node("n1", "IDLE", "DRAIN", reason="hz: gpu 5 rma")
    assert _step(engine, [_host("n1", rma)], nodes) == []


def test_validation_waiting_for_idle_gets_a_maintenance_reservation() -> None:
    engine = Engine(ACT)
    nodes = _idle_nodes(4)
    assert _step(engine, [_host("n1", idle_wanted=True)], nodes) == [
        Reserve("n1", "hz-validate-n1", 120)]
    assert _step(engine, [_host("n1", idle_wanted=True)], nodes,
                 frozenset({"hz-validate-n1"})) == []
    assert _step(engine, [_host("n1")], nodes, frozenset({"hz-validate-n1", "other"})) == [
        Unreserve("n1", "hz-validate-n1")]


def test_an_unreadable_scheduler_decides_nothing() -> None:
    engine = Engine(ACT)
    step = engine.step(Observations((_host("n1", QUARANTINED),), None), 0.0)
    assert step.actions == [] and step.deadline <= 5.0


def test_a_host_the_scheduler_does_not_know_is_said_once() -> None:
    engine = Engine(ACT)
    step = engine.step(Observations((_host("ghost", QUARANTINED),), tuple(_idle_nodes(3))), 0)
    assert step.actions == [] and "no node ghost" in step.notes[0]


def test_reasons_read_as_an_operator_would_write_them() -> None:
    assert reason_of((Hold(HoldKind.GPU_LOST, 3, "none"),
                      Hold(HoldKind.CONDITION, -1, "XidCritical"),
                      Hold(HoldKind.DRAINED, -1, "fan swap"))) == (
        "hz: gpu 3 lost; condition XidCritical; drained by operator: fan swap")
    assert reason_of((Hold(HoldKind.VALIDATION_FAILED, -1, "network"),)) == (
        "hz: validation failed: network")


holds = st.lists(st.builds(Hold, st.sampled_from(list(HoldKind)), st.integers(-1, 4096),
                           st.text(max_size=200)), min_size=1, max_size=64)


@given(holds)
@example([Hold(HoldKind.CONDITION, -1, "x" * 200)] * 3)
@example([Hold(HoldKind.DRAINED, -1, "a [b@c] ;rm -rf / \n reason=\"x\"")])
def test_reasons_are_ours_short_and_plain(hold_list: list[Hold]) -> None:
    reason = reason_of(tuple(hold_list))
    assert reason.startswith("hz: ") and len(reason) <= MAX_REASON
    assert all((c.isalnum() and c.isascii()) or c in " _.:,;+/()-" for c in reason)


@given(st.integers(1, 40), st.integers(0, 40), st.floats(0.0, 1.0))
def test_breaker_never_takes_more_than_the_share_out(size: int, sick: int,
                                                     share: float) -> None:
    engine = Engine(Settings(mode=Mode.ACT, max_share=share))
    nodes = _idle_nodes(size)
    hosts = [_host(f"n{i}", QUARANTINED) for i in range(min(sick, size))]
    drains = _step(engine, hosts, nodes)
    assert len(drains) <= share * size


REASONS = st.sampled_from(["", "hz: gpu 2 quarantined: reset-gpu", "hz: gpu 5 rma",
                           "bad fan", "hz: edited by hand", "Not responding"])
FLAGS = st.sampled_from([("IDLE",), ("IDLE", "DRAIN"), ("MIXED", "DRAIN"), ("DOWN",),
                         ("IDLE", "DRAIN", "REBOOT_REQUESTED"), ("ALLOCATED",)])
HOLDS = st.sampled_from([(), QUARANTINED, (Hold(HoldKind.RMA, 5, ""),),
                         (Hold(HoldKind.REBOOT, -1, ""),)])


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[Node], list[HostView], Marks, float]:
    count = draw(st.integers(1, 12))
    nodes, hosts, marks = [], [], Marks()
    for i in range(count):
        flags, reason = draw(FLAGS), draw(REASONS)
        nodes.append(_node(f"n{i}", *flags, reason=reason if "DRAIN" in flags else ""))
        if draw(st.booleans()):
            marks.ours[f"n{i}"] = draw(REASONS.filter(lambda r: r.startswith("hz:")))
        if draw(st.booleans()):
            hosts.append(_host(f"n{i}", draw(HOLDS), alive=draw(st.booleans())))
    return nodes, hosts, marks, draw(st.floats(0.0, 1.0))


@given(situations())
@example(([_node("n0", "IDLE", "DRAIN", reason="bad fan")], [_host("n0")],
          Marks(ours={"n0": "hz: gpu 5 rma"}), 1.0))
def test_only_our_own_reasons_are_resumed_or_rewritten_and_the_breaker_holds(
        case: tuple[list[Node], list[HostView], Marks, float]) -> None:
    nodes, hosts, marks, share = case
    written = dict(marks.ours)
    engine = Engine(Settings(mode=Mode.ACT, max_share=share), marks)
    actions = _step(engine, hosts, nodes)
    by_name = {n.name: n for n in nodes}
    alive = {h.node for h in hosts if h.alive}
    for action in actions:
        node = by_name[action.node]
        assert action.node in alive  # a silent or unknown host's node is never touched
        if isinstance(action, Resume | Drain) and node.drained:
            # Resumed or rewritten: only a drain we wrote (or an hz: one we forgot).
            assert node.reason == written.get(action.node, node.reason)
            assert node.reason.startswith("hz:") and not node.rebooting
    newly_out = {a.node for a in actions if isinstance(a, Drain | Reboot)
                 and not by_name[a.node].out}
    out_before = {n.name for n in nodes if n.out}
    assert len(out_before | newly_out) <= max(len(out_before), share * len(nodes))


# Shared with the files of the table and the engine's arithmetic, rows and notes.
S, W, V = Situation, Want, Verdict
MINE = "hz: gpu 2 quarantined: reset-gpu"
