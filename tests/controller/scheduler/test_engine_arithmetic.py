"""The engine's arithmetic: wants, the breaker's share, deadlines and what it counts."""

from __future__ import annotations

import pytest

from controller.scheduler.engine import RETRY, Breaker, Engine, reservation_name, want_of
from controller.scheduler.table import Want
from controller.scheduler.types import (
    Drain,
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
from tests.controller.scheduler.test_engine import ACT, MINE, QUARANTINED, _host, _idle_nodes, _node

pytestmark = pytest.mark.scheduler


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
