"""Reliable delivery on the agent's side (sans-I/O)."""

from __future__ import annotations

import pytest

from agent.outbox import Outbox
from agent.spool import Spool
from harmonaize.messages import GpuCounts, Health, HostEvent, HostSummary, Severity

pytestmark = pytest.mark.foundation


def event(n: int) -> HostEvent:
    return HostEvent(f"E{n}", Severity.INFO)


def summary(healthy: int) -> HostSummary:
    return HostSummary(Health.HEALTHY, True, GpuCounts(healthy=healthy))


def drain(box: Outbox, now: float) -> list[int]:
    seqs = []
    while (item := box.take(now)) is not None:
        seqs.append(item[0])
    return seqs


def test_sequence_numbers_are_assigned_when_sent() -> None:
    box = Outbox(limit=100, ack_timeout=1.0)
    box.add(event(1))
    box.add(event(2))
    assert drain(box, 0.0) == [1, 2]
    box.add(event(3))
    seq, body = box.take(0.0)
    box.untake(seq)  # the transport refused it
    assert box.take(0.0) == (3, body)


def test_an_unsent_condition_is_replaced_by_a_newer_one() -> None:
    box = Outbox(limit=100, ack_timeout=1.0)
    box.add(summary(8))
    box.add(event(1))
    box.add(summary(7))
    bodies = [box.take(0.0)[1] for _ in range(2)]
    assert bodies == [event(1), summary(7)]
    assert box.take(0.0) is None


def test_overflow_drops_the_oldest_events_and_counts_them() -> None:
    box = Outbox(limit=3, ack_timeout=1.0)
    box.add(summary(8))
    for n in range(5):
        box.add(event(n))
    assert box.dropped == 3
    assert [box.take(0.0)[1] for _ in range(3)] == [summary(8), event(3), event(4)]


def test_cumulative_acks_and_go_back_resends() -> None:
    box = Outbox(limit=100, ack_timeout=1.0)
    for n in range(4):
        box.add(event(n))
    assert drain(box, 0.0) == [1, 2, 3, 4]
    box.ack(2)
    assert box.in_flight == 2 and box.acked == 2
    assert box.due(0.5) == []
    assert [seq for seq, _ in box.due(1.0)] == [3, 4]
    assert box.resent == 2
    assert box.due(1.5) == []
    box.ack(4)
    assert box.due(5.0) == [] and len(box) == 0


def test_acks_for_unsent_sequence_numbers_are_ignored() -> None:
    box = Outbox(limit=100, ack_timeout=1.0)
    box.add(event(1))
    drain(box, 0.0)
    box.ack(99)
    assert box.acked == 0 and box.in_flight == 1


def test_rewind_makes_everything_in_flight_due() -> None:
    box = Outbox(limit=100, ack_timeout=10.0)
    box.add(event(1))
    drain(box, 0.0)
    box.rewind(1.0)
    assert [seq for seq, _ in box.due(1.0)] == [1]


def test_the_window_bounds_what_is_in_flight() -> None:
    box = Outbox(limit=100, ack_timeout=1.0, window=2)
    for n in range(3):
        box.add(event(n))
    assert drain(box, 0.0) == [1, 2]
    box.ack(1)
    assert drain(box, 0.0) == [3]


@pytest.mark.controller
def test_the_spool_carries_unacknowledged_events_across_a_restart(tmp_path) -> None:
    path = tmp_path / "spool.db"
    box = Outbox(limit=4, ack_timeout=1.0, spool=Spool(path, "h1"))
    for n in range(1, 6):
        box.add(event(n))  # E1 is dropped: the queue holds 4
    box.add(summary(8))  # E2 is dropped for it: conditions are never dropped
    box.add(summary(7))  # replaces the unsent summary, and is never spooled
    assert box.dropped == 2 and drain(box, 0.0) == [1, 2, 3, 4]  # E3 E4 E5 S7
    box.ack(2)  # E3 and E4 are stored at the controller
    assert box.spool is not None
    box.spool.close()
    # The agent is killed here; a new run finds what was not acknowledged.
    again = Outbox(limit=100, ack_timeout=1.0, spool=Spool(path, "h1"))
    assert again.restored == 1
    again.add(event(6))
    bodies = [again.take(0.0) for _ in range(2)]
    assert [b[1].reason for b in bodies if b] == ["E5", "E6"]
    again.ack(2)
    assert again.spool is not None
    assert Spool(path, "h1").load() == []
    # A damaged row is dropped and counted, never fatal.
    again.spool.db.execute("INSERT INTO events (frame) VALUES (x'00ff')")
    damaged = Spool(path, "h1")
    assert damaged.load() == [] and damaged.unreadable == 1
