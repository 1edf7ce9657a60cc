"""The scheduler loop's sans-I/O engine: what a node gets from its host's holds and what
the scheduler shows (issue 29 item 2: drains, resumes, ownership, the breaker, shadow
mode, cancel; item 3's scheduler side: reboot and RMA; maintenance reservations)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from controller.scheduler.engine import RETRY, Breaker, Engine, Row, reservation_name, want_of
from controller.scheduler.reasons import MAX_REASON, clean, phrase, reason_of
from controller.scheduler.table import TABLE, Situation, Verdict, Want, situation
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


# --- reasons: the exact words, their order, their cleaning and their cut ---------------


def test_reason_cleaning_keeps_only_plain_characters_and_single_spaces() -> None:
    assert clean("  a\n[b@c]\t\"x\"  ") == "a b c x"
    assert clean("A-z 0_9.:,;+/()-") == "A-z 0_9.:,;+/()-"
    assert clean("") == ""


@pytest.mark.parametrize(("hold", "words"), [
    (Hold(HoldKind.RMA, 5, "ignored"), "gpu 5 rma"),
    (Hold(HoldKind.RMA, -1, ""), "host rma"),
    (Hold(HoldKind.REBOOT, -1, "3 resets failed"), "reboot"),
    (Hold(HoldKind.REBOOT, 0, ""), "reboot: gpu 0"),
    (Hold(HoldKind.GPU_LOST, -1, ""), "gpu lost"),
    (Hold(HoldKind.GPU_LOST, 7, "fell off the bus"), "gpu 7 lost: fell off the bus"),
    (Hold(HoldKind.GPU_QUARANTINED, -1, ""), "gpu quarantined"),
    (Hold(HoldKind.GPU_QUARANTINED, 0, "none"), "gpu 0 quarantined"),
    (Hold(HoldKind.GPU_QUARANTINED, 2, "reset-gpu"), "gpu 2 quarantined: reset-gpu"),
    (Hold(HoldKind.VALIDATION_FAILED, -1, ""), "validation failed"),
    (Hold(HoldKind.VALIDATION_FAILED, 1, "nvlink"), "validation failed: nvlink"),
    (Hold(HoldKind.CONDITION, -1, ""), "condition"),
    (Hold(HoldKind.CONDITION, 3, "Xid79"), "condition Xid79"),
    (Hold(HoldKind.DRAINED, -1, ""), "drained by operator"),
    (Hold(HoldKind.DRAINED, -1, "none"), "drained by operator"),
    (Hold(HoldKind.DRAINED, -1, "fan swap"), "drained by operator: fan swap"),
])
def test_each_hold_kind_has_its_own_words(hold: Hold, words: str) -> None:
    assert phrase(hold) == words
    assert reason_of((hold,)) == f"hz: {words}"


def test_a_holds_detail_is_cleaned_then_cut_to_forty_characters() -> None:
    assert phrase(Hold(HoldKind.DRAINED, -1, "[" + "x" * 50)) == (
        "drained by operator: " + "x" * 40)
    assert phrase(Hold(HoldKind.CONDITION, -1, "y" * 41)) == "condition " + "y" * 40


def test_no_hold_is_our_bare_prefix() -> None:
    assert reason_of(()) == "hz:"


def test_reasons_go_most_severe_first_then_by_gpu_and_say_each_once() -> None:
    holds = (Hold(HoldKind.DRAINED, -1, ""),
             Hold(HoldKind.GPU_QUARANTINED, 3, ""), Hold(HoldKind.GPU_QUARANTINED, 1, ""),
             Hold(HoldKind.GPU_QUARANTINED, 3, ""), Hold(HoldKind.GPU_LOST, 4, ""),
             Hold(HoldKind.RMA, 6, ""))
    assert reason_of(holds) == ("hz: gpu 6 rma; gpu 4 lost; gpu 1 quarantined; "
                                "gpu 3 quarantined; drained by operator")
    assert reason_of((Hold(HoldKind.VALIDATION_FAILED), Hold(HoldKind.REBOOT))) == (
        "hz: reboot; validation failed")


def test_a_long_reason_fits_exactly_or_says_how_many_more() -> None:
    # 100 characters with room for "(+1 more)": the second phrase is written whole.
    fits = (Hold(HoldKind.DRAINED, -1, "a" * 13), Hold(HoldKind.CONDITION, -1, "b" * 40))
    assert reason_of(fits) == "hz: condition " + "b" * 40 + "; drained by operator: " + "a" * 13
    # One character more: the count of what is left out instead.
    over = (Hold(HoldKind.DRAINED, -1, "a" * 14), Hold(HoldKind.CONDITION, -1, "b" * 40))
    assert reason_of(over) == "hz: condition " + "b" * 40 + " (+1 more)"
    many = tuple(Hold(HoldKind.CONDITION, -1, f"{i}" + "c" * 30) for i in range(5))
    assert reason_of(many) == ("hz: condition 0" + "c" * 30 + "; condition 1" + "c" * 30
                               + " (+3 more)")


# --- the table: every cell, and how a node's situation is read ---------------------------

S, W, V = Situation, Want, Verdict


def test_the_table_says_what_each_situation_and_want_gets() -> None:
    assert TABLE == {
        (S.FREE, W.HOLD): V.DRAIN, (S.FREE, W.REBOOT): V.REBOOT,
        (S.FREE, W.FREE): V.NOTHING, (S.FREE, W.NONE): V.NOTHING,
        (S.OURS, W.HOLD): V.REDRAIN, (S.OURS, W.REBOOT): V.REBOOT,
        (S.OURS, W.FREE): V.RESUME, (S.OURS, W.NONE): V.NOTHING,
        (S.EDITED, W.HOLD): V.LEAVE, (S.EDITED, W.REBOOT): V.LEAVE,
        (S.EDITED, W.FREE): V.LEAVE, (S.EDITED, W.NONE): V.LEAVE,
        (S.THEIRS, W.HOLD): V.LEAVE, (S.THEIRS, W.REBOOT): V.LEAVE,
        (S.THEIRS, W.FREE): V.NOTHING, (S.THEIRS, W.NONE): V.NOTHING,
        (S.REBOOTING, W.HOLD): V.NOTHING, (S.REBOOTING, W.REBOOT): V.NOTHING,
        (S.REBOOTING, W.FREE): V.NOTHING, (S.REBOOTING, W.NONE): V.NOTHING,
    }


MINE = "hz: gpu 2 quarantined: reset-gpu"


@pytest.mark.parametrize(("node", "written", "disowned", "expected"), [
    (_node("n", "IDLE", "DRAIN", "REBOOT_REQUESTED", reason=MINE), MINE, True, S.REBOOTING),
    (_node("n", "REBOOT_ISSUED"), None, False, S.REBOOTING),
    (_node("n", "IDLE"), MINE, False, S.FREE),
    (_node("n", "DOWN", reason="Not responding"), None, False, S.THEIRS),
    (_node("n", "FAIL", reason="bad psu"), None, False, S.THEIRS),
    (_node("n", "DOWN"), None, False, S.FREE),  # down with no reason: nothing to keep
    (_node("n", "DOWN", reason=MINE), None, False, S.FREE),
    (_node("n", "IDLE", reason="stale text"), None, False, S.FREE),
    (_node("n", "IDLE", "DRAIN", reason=MINE), MINE, True, S.THEIRS),
    (_node("n", "IDLE", "DRAIN", reason=MINE), MINE, False, S.OURS),
    (_node("n", "IDLE", "DRAIN", reason=MINE), None, False, S.OURS),  # records lost
    (_node("n", "IDLE", "DRAIN", reason=MINE + " : reboot issued"), MINE, False, S.OURS),
    (_node("n", "IDLE", "DRAIN", reason=MINE + "x"), MINE, False, S.EDITED),
    (_node("n", "IDLE", "DRAIN", reason="hz: gpu 5 rma"), MINE, False, S.EDITED),
    (_node("n", "IDLE", "DRAIN", reason="bad fan"), MINE, False, S.EDITED),
    (_node("n", "IDLE", "DRAIN", reason="bad fan"), None, False, S.THEIRS),
])
def test_a_nodes_situation_is_read_from_its_flags_reason_and_our_record(
        node: Node, written: str | None, disowned: bool, expected: Situation) -> None:
    assert situation(node, written, disowned=disowned) is expected


# --- the engine: wants, the breaker's arithmetic, notes, rows, deadlines, counters, marks -


def test_a_hosts_want_comes_from_its_holds_and_our_reboot_mark() -> None:
    reboot = (Hold(HoldKind.REBOOT), *QUARANTINED)
    assert want_of(None, Marks()) is Want.NONE
    assert want_of(_host("n1", QUARANTINED, alive=False), Marks()) is Want.NONE
    assert want_of(_host("n1"), Marks()) is Want.FREE
    assert want_of(_host("n1", QUARANTINED), Marks()) is Want.HOLD
    assert want_of(_host("n1", reboot), Marks()) is Want.REBOOT
    assert want_of(_host("n1", reboot), Marks(rebooted={"n1"})) is Want.HOLD
    assert want_of(_host("n1", reboot), Marks(rebooted={"n2"})) is Want.REBOOT


def test_our_reservation_is_named_after_its_node() -> None:
    assert reservation_name("gpu-07") == "hz-validate-gpu-07"


def test_the_breaker_admits_up_to_the_share_exactly_and_says_why_not() -> None:
    nodes = _idle_nodes(4)
    breaker = Breaker(nodes, 0.5)
    assert breaker.admit(nodes[0]) == ""
    assert breaker.admit(nodes[1]) == ""  # 2 of 4 is the share itself: allowed
    assert breaker.admit(nodes[2]) == "breaker: partition gpu would have 3 of 4 out (max 50%)"
    assert breaker.out == {"gpu": {"n0", "n1"}}
    assert breaker.admit(nodes[0]) == ""  # already out: takes no more room


def test_the_breaker_counts_nodes_out_by_anyone_and_our_reservations() -> None:
    nodes = [_node("a", "DOWN"), _node("b", "IDLE"), _node("c"), _node("d"), _node("e")]
    breaker = Breaker(nodes, 0.4, frozenset({"hz-validate-b", "hz-validate-zz"}))
    assert breaker.out == {"gpu": {"a", "b"}}
    assert breaker.admit(nodes[2]) == "breaker: partition gpu would have 3 of 5 out (max 40%)"


def test_the_breaker_needs_room_in_every_partition_of_a_node() -> None:
    both = _node("both", parts=("gpu", "debug"))
    nodes = [both, _node("g1", parts=("gpu",)), _node("d1", "DRAIN", parts=("debug",)),
             _node("d2", parts=("debug",))]
    breaker = Breaker(nodes, 0.5)
    assert breaker.members == {"gpu": {"both", "g1"}, "debug": {"both", "d1", "d2"}}
    assert breaker.admit(both) == "breaker: partition debug would have 2 of 3 out (max 50%)"
    assert breaker.out == {"debug": {"d1"}}  # nothing taken where one partition refused
    roomy = Breaker(nodes, 1.0)
    assert roomy.admit(both) == ""
    assert roomy.out == {"gpu": {"both"}, "debug": {"both", "d1"}}


def test_the_next_deadline_is_the_reconcile_or_a_retry_after_a_failure() -> None:
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.5, reconcile=30.0))
    obs = Observations((_host("n1", QUARANTINED),), tuple(_idle_nodes(4)))
    assert engine.step(obs, 100.0).deadline == 130.0
    engine.failed(Drain("n1", MINE), 110.0)
    assert engine.counters == {"drain_failed": 1}
    assert engine.step(obs, 112.0).deadline == 110.0 + RETRY
    assert engine.step(obs, 113.0).deadline == 143.0  # the retry came: back to reconcile
    engine.failed(Resume("n1"), 200.0)
    engine.failed(Resume("n1"), 201.0)  # the earliest retry counts
    assert engine.counters == {"drain_failed": 1, "resume_failed": 2}
    unread = Observations((), None)
    assert engine.step(unread, 201.5).deadline == 200.0 + RETRY
    assert engine.step(unread, 202.0).deadline == 200.0 + RETRY  # kept while unread
    assert engine.step(obs, 203.0).deadline == 200.0 + RETRY  # then taken by this read
    assert engine.step(obs, 204.0).deadline == 234.0
    assert engine.step(unread, 300.0).deadline == 300.0 + RETRY
    assert Engine(Settings(reconcile=3.0)).step(unread, 10.0).deadline == 13.0


def test_an_unreadable_scheduler_keeps_the_last_rows() -> None:
    engine = Engine(ACT)
    engine.step(Observations((_host("n1"),), (_node("n1"),)), 0.0)
    assert engine.step(Observations((), None), 1.0).rows == engine.rows != []


def test_what_the_scheduler_took_is_counted_and_remembered_as_ours() -> None:
    engine = Engine(ACT, Marks(disowned={"n1", "n2"}))
    engine.done(Drain("n1", MINE))
    engine.done(Reboot("n2", "hz: reboot"))
    engine.done(Reserve("n3", "hz-validate-n3", 120))
    assert engine.marks.ours == {"n1": MINE, "n2": "hz: reboot"}
    assert engine.marks.disowned == set() and engine.marks.rebooted == {"n2"}
    engine.done(Resume("n1"))
    engine.done(Unreserve("n3", "hz-validate-n3"))
    engine.done(Drain("n4", MINE))
    assert engine.marks.ours == {"n2": "hz: reboot", "n4": MINE}
    assert engine.counters == {"drain_done": 2, "reboot_done": 1, "reserve_done": 1,
                               "resume_done": 1, "unreserve_done": 1}


def test_each_row_shows_the_node_as_the_operator_reads_it() -> None:
    engine = Engine(ACT, Marks(ours={"n2": "hz: gpu 1 lost"}, cancelled={"n3"}))
    hosts = [HostView("n1", "host-a", True, QUARANTINED),
             HostView("n2", "host-b", True, (Hold(HoldKind.GPU_LOST, 1),)),
             HostView("n3", "host-c", True, QUARANTINED),
             HostView("n5", "host-e", True, (Hold(HoldKind.GPU_LOST, 1),))]
    nodes = [_node("n1", "MIXED"), _node("n2", "IDLE", "DRAIN", reason="hz: gpu 1 lost"),
             _node("n3"), _node("n4", "IDLE", "DRAIN", reason="bad fan"),
             _node("n5", "IDLE", "DRAIN", reason="hz: gpu 0 lost"), *_spare(5)]
    engine.marks.ours["n5"] = "hz: gpu 0 lost"
    step = engine.step(Observations(tuple(hosts), tuple(nodes)), 0.0)
    assert step.actions == [Drain("n1", MINE), Drain("n5", "hz: gpu 1 lost")]
    assert step.rows == engine.rows
    assert [row.node for row in step.rows] == [
        "n1", "n2", "n3", "n4", "n5", *(f"spare{i}" for i in range(5))]
    assert step.rows[1] == Row("n2", "host-b", "ours", "DRAIN+IDLE", "hz: gpu 1 lost",
                               "drained", "")
    assert step.rows[3] == Row("n4", "", "theirs", "DRAIN+IDLE", "bad fan", "", "")
    by_node = {row.node: row for row in step.rows}
    assert by_node["n2"].slurm == "DRAIN+IDLE" and by_node["n4"].intent == ""
    assert by_node["n1"] == Row("n1", "host-a", "free", "MIXED", "", f"drain ({MINE})", "")
    assert by_node["n3"].held == "cancelled by an operator"
    assert by_node["n5"].intent == "rewrite reason (hz: gpu 1 lost)"
    assert by_node["spare0"] == Row("spare0", "", "free", "IDLE", "", "", "")


def test_each_note_is_said_in_its_own_words_once_per_episode() -> None:
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.25))
    hosts = (_host("n1", QUARANTINED), _host("n2", QUARANTINED), _host("ghost"))
    nodes = (_node("n0", "IDLE", "DRAIN", reason="bad fan"), _node("n1"), _node("n2"),
             _node("n3"))
    first = engine.step(Observations(hosts, nodes), 0.0)
    assert first.actions == []
    assert first.notes == [
        "host ghost: the scheduler has no node ghost (map it in [scheduler] node_map); "
        "left alone",
        f"node n1: drain ({MINE}) held: breaker: partition gpu would have 2 of 4 out "
        "(max 25%)",
        f"node n2: drain ({MINE}) held: breaker: partition gpu would have 2 of 4 out "
        "(max 25%)"]
    assert engine.step(Observations(hosts, nodes), 1.0).notes == []
    # The episode ends (the host is known now), then starts again: said again.
    engine.step(Observations(hosts[:2], nodes), 2.0)
    assert engine.step(Observations(hosts, nodes), 3.0).notes == first.notes[:1]


def test_someone_elses_drain_is_named_in_the_note_with_its_reason() -> None:
    engine = Engine(ACT)
    nodes = (_node("n1", "IDLE", "DRAIN", reason="bad fan"), *_spare(3))
    step = engine.step(Observations((_host("n1", (Hold(HoldKind.REBOOT),)),), nodes), 0.0)
    assert step.notes == ["node n1: drained or down by someone else ('bad fan'); our holds "
                          "are not written there"]
    assert engine.step(Observations((_host("n1"),), nodes), 1.0).notes == []


def test_an_edited_reason_is_named_in_the_note_and_stays_theirs_until_resumed() -> None:
    engine = Engine(ACT, Marks(ours={"n1": MINE}))
    edited = (_node("n1", "IDLE", "DRAIN", reason="hz: alice checks"), *_spare(3))
    step = engine.step(Observations((_host("n1"),), edited), 0.0)
    assert step.actions == []
    assert step.notes == ["node n1: its drain reason was edited by hand ('hz: alice checks'): "
                          "it is not ours any more, left alone"]
    assert engine.rows[0].situation == "edited" and engine.rows[0].intent == \
        "leave alone (not ours)"
    assert engine.marks.disowned == {"n1"} and engine.marks.ours == {}
    # Someone resumed it: ours to drain again, and the marks forget it.
    free = (_node("n1"), *_spare(3))
    assert _step(engine, [_host("n1", QUARANTINED)], list(free)) == [Drain("n1", MINE)]
    assert engine.marks.disowned == set()


def test_a_node_back_in_service_is_no_longer_ours_but_a_pending_reboot_stays() -> None:
    engine = Engine(ACT, Marks(ours={"n1": MINE, "n2": "hz: reboot", "n3": MINE},
                               disowned={"n1"}))
    nodes = [_node("n1"), _node("n2", "IDLE", "REBOOT_ISSUED"),
             _node("n3", "IDLE", "DRAIN", reason=MINE), *_spare(3)]
    _step(engine, [], nodes)
    assert engine.marks.ours == {"n2": "hz: reboot", "n3": MINE}
    assert engine.marks.disowned == set()


def test_the_reboot_mark_ends_with_the_reboot_hold_and_not_on_silence() -> None:
    engine = Engine(ACT, Marks(rebooted={"n1", "n2", "n3"}))
    reboot = (Hold(HoldKind.REBOOT),)
    hosts = [_host("n1"), _host("n2", reboot), _host("n3", alive=False)]
    _step(engine, hosts, [_node("n1"), _node("n2"), _node("n3"), *_spare(5)])
    assert engine.marks.rebooted == {"n2", "n3"}


def test_a_reboot_on_a_node_we_drained_skips_the_breaker() -> None:
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.0), Marks(ours={"n1": MINE}))
    reboot = (Hold(HoldKind.REBOOT), *QUARANTINED)
    nodes = [_node("n1", "IDLE", "DRAIN", reason=MINE), _node("n2")]
    assert _step(engine, [_host("n1", reboot)], nodes) == [
        Reboot("n1", "hz: reboot; gpu 2 quarantined: reset-gpu")]
    assert engine.rows[0].intent == "reboot (hz: reboot; gpu 2 quarantined: reset-gpu)"
    # A free node's reboot takes it out: the breaker holds it.
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.0))
    assert _step(engine, [_host("n2", reboot)], nodes) == []
    assert engine.rows[1].held.startswith("breaker: partition gpu")


def test_pause_and_shadow_mode_are_shown_as_why_nothing_is_done() -> None:
    engine = Engine(ACT, Marks(paused=True, ours={"n2": MINE}))
    nodes = [_node("n1"), _node("n2", "IDLE", "DRAIN", reason=MINE), *_spare(4)]
    hosts = [_host("n1", QUARANTINED), _host("n2")]
    assert _step(engine, hosts, nodes) == []
    assert [row.held for row in engine.rows[:2]] == ["paused", "paused"]
    shadow = Engine(Settings(max_share=1.0), Marks(ours={"n2": MINE}))
    step = shadow.step(Observations(tuple(hosts), tuple(nodes)), 0.0)
    assert step.actions == [] and [row.held for row in shadow.rows[:2]] == [
        "shadow mode", "shadow mode"]
    assert step.notes == [f"shadow mode: would drain ({MINE}) on node n1",
                          "shadow mode: would resume on node n2"]


def test_a_reservation_is_asked_only_for_a_live_host_left_to_us_and_with_room() -> None:
    nodes = _idle_nodes(4)
    waiting = [_host("n1", idle_wanted=True)]
    minutes = Engine(Settings(mode=Mode.ACT, max_share=0.5, reservation_minutes=45))
    assert _step(minutes, waiting, nodes) == [Reserve("n1", "hz-validate-n1", 45)]
    assert _step(Engine(ACT), [_host("n1", alive=False, idle_wanted=True)], nodes) == []
    assert _step(Engine(ACT, Marks(cancelled={"n1"})), waiting, nodes) == []
    assert _step(Engine(ACT, Marks(paused=True)), waiting, nodes) == []
    full = Engine(Settings(mode=Mode.ACT, max_share=0.25))
    assert _step(full, waiting, [_node("n0", "DOWN"), *nodes[1:]]) == []
    # Ours on a silent, cancelled or paused host: left to expire on its own.
    ours = frozenset({"hz-validate-n1"})
    assert _step(Engine(ACT), [_host("n1", alive=False)], nodes, ours) == []
    assert _step(Engine(ACT), [], nodes, ours) == []
    assert _step(Engine(ACT, Marks(cancelled={"n1"})), [_host("n1")], nodes, ours) == []
    assert _step(Engine(ACT, Marks(paused=True)), [_host("n1")], nodes, ours) == []


def test_a_reservation_in_shadow_mode_is_only_said() -> None:
    nodes = tuple(_idle_nodes(4))
    engine = Engine(Settings(max_share=0.5))
    step = engine.step(Observations((_host("n1", idle_wanted=True),), nodes), 0.0)
    assert step.actions == [] and step.notes == ["shadow mode: would reserve hz-validate-n1"]
    step = engine.step(Observations((_host("n1"),), nodes, frozenset({"hz-validate-n1"})), 1.0)
    assert step.actions == [] and step.notes == ["shadow mode: would unreserve hz-validate-n1"]


def test_a_node_is_not_disowned_unless_said() -> None:
    assert situation(_node("n", "IDLE", "DRAIN", reason=MINE), MINE) is S.OURS


def test_every_node_gets_its_reservation_decision_whatever_came_before() -> None:
    # n0 is held by the breaker, n1 has nothing to do, n2 and n3 are decided after them.
    nodes = [_node(f"n{i}") for i in range(4)] + [_node("d", "DOWN")]
    hosts = [_host("n0", idle_wanted=True), _host("n1"), _host("n2"),
             _host("n3", idle_wanted=True)]
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.2))
    ours = frozenset({"hz-validate-n2", "hz-validate-n3"})
    assert _step(engine, hosts, nodes, ours) == [Unreserve("n2", "hz-validate-n2")]
    shadow = Engine(Settings(max_share=1.0))
    step = shadow.step(Observations(tuple(hosts), tuple(nodes), ours), 0.0)
    assert step.notes == ["shadow mode: would reserve hz-validate-n0",
                          "shadow mode: would unreserve hz-validate-n2"]


def test_a_row_without_a_reason_held_shows_none() -> None:
    assert Row("n1", "h1", "free", "IDLE", "", "").held == ""


def test_before_the_scheduler_was_ever_read_there_are_no_rows_nor_notes() -> None:
    step = Engine(ACT).step(Observations((_host("n1", QUARANTINED),), None), 0.0)
    assert step.rows == [] and step.notes == [] and step.actions == []


def test_a_node_with_our_reservation_counts_as_out_for_the_breaker() -> None:
    engine = Engine(Settings(mode=Mode.ACT, max_share=0.25))
    nodes = _idle_nodes(4)
    assert _step(engine, [_host("n1", QUARANTINED)], nodes,
                 frozenset({"hz-validate-n0"})) == []
    assert engine.rows[1].held == "breaker: partition gpu would have 2 of 4 out (max 25%)"


def test_several_nodes_notes_are_each_said_once() -> None:
    engine = Engine(Settings(max_share=1.0), Marks(ours={"e1": MINE, "e2": MINE}))
    hosts = (_host("ghost1"), _host("ghost2"), _host("e1", QUARANTINED),
             _host("e2", QUARANTINED),
             _host("t1", QUARANTINED), _host("t2", QUARANTINED),
             _host("s1", QUARANTINED), _host("s2", QUARANTINED),
             _host("r1", idle_wanted=True), _host("r2", idle_wanted=True))
    nodes = (_node("e1", "IDLE", "DRAIN", reason="hz: alice"),
             _node("e2", "IDLE", "DRAIN", reason="hz: bob"),
             _node("t1", "IDLE", "DRAIN", reason="fan"), _node("t2", "DOWN", reason="psu"),
             _node("s1"), _node("s2"), _node("r1"), _node("r2"))
    first = engine.step(Observations(hosts, nodes), 0.0)
    assert len(first.notes) == 10
    assert engine.step(Observations(hosts, nodes), 1.0).notes == []


def test_a_drain_we_wrote_before_our_records_were_lost_is_resumed_and_forgotten() -> None:
    engine = Engine(ACT)
    nodes = [_node("n1", "IDLE", "DRAIN", reason=MINE), *_spare(3)]
    actions = _step(engine, [_host("n1")], nodes)
    assert actions == [Resume("n1")]
    engine.done(actions[0])
    assert engine.marks.ours == {} and engine.counters == {"resume_done": 1}
