"""The outbox at its edges: a refused send, overflow with nothing droppable, the
counters an operator reads (what mutation testing found unpinned)."""

from __future__ import annotations

import pytest

from agent.outbox import Outbox
from agent.spool import Spool
from harmonaize.messages import Bucket, PoolCapacity, Trend
from tests.agent.test_outbox import event, summary

pytestmark = [pytest.mark.foundation, pytest.mark.hardening]


def test_a_refused_send_is_queued_again_with_its_number_given_back() -> None:
    box = Outbox(limit=10, ack_timeout=1.0)
    box.add(event(1))
    box.add(event(2))
    assert box.take(0.0) == (1, event(1))
    assert box.take(0.0) == (2, event(2))
    box.untake(1)  # not the last one taken: nothing happens
    assert (box.in_flight, box.queued, box.last_sent) == (2, 0, 2)
    box.untake(2)
    assert (box.in_flight, box.queued, box.last_sent) == (1, 1, 1)
    assert box.take(0.5) == (2, event(2))  # the same number again, the same message
    empty = Outbox(limit=10, ack_timeout=1.0)
    empty.untake(1)  # nothing in flight: nothing happens
    assert (empty.in_flight, empty.queued, empty.last_sent) == (0, 0, 0)


def test_a_refused_send_keeps_its_place_on_disk(tmp_path) -> None:
    spool = Spool(tmp_path / "spool.db", "h1")
    box = Outbox(limit=10, ack_timeout=1.0, spool=spool)
    box.add(event(1))
    seq, _ = box.take(0.0)
    box.untake(seq)
    seq, _ = box.take(0.1)
    box.ack(seq)
    assert spool.load() == []  # acknowledged after the retry: gone from disk too


def test_overflow_with_only_conditions_queued_drops_nothing() -> None:
    box = Outbox(limit=1, ack_timeout=1.0)
    box.add(summary(8))
    box.add(event(1))  # over the limit: the event is the one to go
    assert (box.dropped, box.queued) == (1, 1)
    box.add(summary(7))  # a condition replaces the unsent one; nothing else to drop
    assert (box.dropped, box.queued) == (1, 1)
    assert box.take(0.0) == (1, summary(7))


def test_resends_come_exactly_at_the_timeout_and_are_counted() -> None:
    box = Outbox(limit=10, ack_timeout=1.0)
    box.add(event(1))
    box.add(event(2))
    box.take(0.0)
    box.take(0.0)
    assert box.due(0.99) == []
    assert box.due(1.0) == [(1, event(1)), (2, event(2))]
    assert box.resent == 2
    box.ack(1)
    assert (box.acked, box.in_flight) == (1, 1)
    box.ack(1)  # again: nothing more
    assert (box.acked, box.in_flight) == (1, 1)
    assert box.due(2.0) == [(2, event(2))] and box.resent == 3


def test_over_the_limit_with_no_event_to_drop_keeps_every_condition() -> None:
    box = Outbox(limit=1, ack_timeout=1.0)
    box.add(summary(8))
    box.add(PoolCapacity("p", "H200", Bucket(1, 1), Bucket(0, 0), Bucket(8, 8), Trend.STEADY, 1))
    assert (box.dropped, box.queued) == (0, 2)  # conditions are never dropped for room
    box.add(event(1))
    box.add(event(2))
    assert (box.dropped, box.queued) == (2, 2)  # both events went, oldest first, and only they


def test_a_new_run_counts_what_it_carried_over(tmp_path) -> None:
    spool = Spool(tmp_path / "spool.db", "h1")
    first = Outbox(limit=10, ack_timeout=1.0, spool=spool)
    for n in range(3):
        first.add(event(n))
    again = Outbox(limit=10, ack_timeout=1.0, spool=Spool(tmp_path / "spool.db", "h1"))
    assert (again.restored, again.queued) == (3, 3)
    assert [again.take(0.0)[1] for _ in range(3)] == [event(0), event(1), event(2)]
