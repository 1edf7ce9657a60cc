"""What operators read from the engine: rows, notes said once, reservations, reboot marks."""

from __future__ import annotations

import pytest

from controller.scheduler.engine import Engine, Row
from controller.scheduler.table import situation
from controller.scheduler.types import (
    Drain,
    HostView,
    Marks,
    Mode,
    Observations,
    Reboot,
    Reserve,
    Resume,
    Settings,
    Unreserve,
)
from harmonaize.messages import Hold, HoldKind
from tests.controller.scheduler.test_engine import (
    ACT,
    MINE,
    QUARANTINED,
    S,
    _host,
    _idle_nodes,
    _node,
    _spare,
    _step,
)

pytestmark = pytest.mark.scheduler


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
