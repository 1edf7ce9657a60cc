"""A hold's end: started, released (free early, charged late), cancelled by an operator,
or a no-show; and how every final state is forgotten, its id refused for a while."""

from __future__ import annotations

import pytest

from controller.negotiation import table
from controller.negotiation.engine import Engine
from controller.negotiation.types import (
    Accept,
    Cancel,
    CapacityRelease,
    Closed,
    Hold,
    Offer,
    Propose,
    Release,
    Started,
    State,
)
from tests.controller.negotiation.helpers import CLASS, POOL, T0, one, proposal, world

pytestmark = pytest.mark.negotiation


def held(engine: Engine, request_id: str = "r1", hi: int = 4, **kw: object) -> Hold:
    offer = one(engine, Propose(proposal(request_id, hi=hi, **kw)))  # type: ignore[arg-type]
    assert isinstance(offer, Offer)
    hold = one(engine, Accept(offer.tenant, request_id, offer.offer_id))
    assert isinstance(hold, Hold)
    return hold


def test_a_started_hold_counts_until_a_release_taken_after_it_shows_the_job() -> None:
    engine = world()
    hold = held(engine, hi=8)
    at = hold.start + 60
    assert one(engine, Started("a", "r1"), at) == Closed("r1", "a", State.STARTED)
    assert engine.records["a"].used == 8 * 3600
    assert engine.negotiations[("a", "r1")].until == hold.end + table.RETAIN
    assert engine.holds() == []
    # until the feed's next release sees the job, its GPUs stay out of the share
    assert engine.load(POOL, CLASS, at, at + 1, at) == 8
    engine.step([CapacityRelease(POOL, CLASS, 8, 32, at + 30)], at + 30)
    assert engine.load(POOL, CLASS, at, at + 1, at + 30) == 0
    assert one(engine, Started("a", "r1"), at + 31) == Closed("r1", "a", State.STARTED)


def test_a_hold_released_well_before_its_start_costs_nothing() -> None:
    engine = world()
    held(engine, earliest=T0 + 7200, latest=T0 + 7200)
    assert one(engine, Release("a", "r1"), T0 + 60) == Closed("r1", "a", State.RELEASED)
    assert engine.holds() == []
    assert one(engine, Propose(proposal("r2", lo=8, hi=8)), T0 + 61).count == 8


def test_a_hold_released_late_is_charged_and_shrinks_the_tenants_share() -> None:
    engine = world()
    hold = held(engine)
    closed = one(engine, Release("a", "r1"), hold.start - 60)
    assert closed == Closed("r1", "a", State.RELEASED, 4 * 3600.0)
    # 86400 of good record against 14400 charged: 6 of its 8 GPUs now
    offer = one(engine, Propose(proposal("r2", lo=1, hi=8)), hold.start - 59)
    assert isinstance(offer, Offer) and offer.count == 6


def test_a_hold_never_started_expires_as_a_no_show_and_is_charged() -> None:
    engine = world()
    hold = held(engine)
    out, deadline = engine.step([], hold.expires_at - 1)
    assert out == [] and deadline == hold.expires_at
    out, _ = engine.step([], hold.expires_at)
    assert out == [Closed("r1", "a", State.EXPIRED, 4 * 3600.0)]
    assert engine.records["a"].no_show == 4 * 3600.0
    late = one(engine, Started("a", "r1"), hold.expires_at + 1)
    assert late.field == "request_id" and "expired" in late.message


def test_an_operator_cancels_a_hold_and_nothing_is_charged() -> None:
    engine = world()
    held(engine)
    assert one(engine, Cancel("a", "r1"), T0 + 5) == Closed("r1", "a", State.CANCELLED)
    assert "a" not in engine.records or engine.records["a"].no_show == 0
    assert engine.holds() == []


def test_a_final_state_is_forgotten_and_its_id_refused_then_free_again() -> None:
    engine = world()
    offer = one(engine, Propose(proposal()))
    closed_at = offer.expires_at
    engine.step([], closed_at)
    _, deadline = engine.step([], closed_at + 1)
    assert deadline == closed_at + table.RETAIN
    engine.step([], deadline)
    assert ("a", "r1") not in engine.negotiations
    refused = one(engine, Propose(proposal()), deadline + 1)
    assert refused.field == "request_id" and "closed" in refused.message
    _, deadline = engine.step([], deadline + 2)
    assert deadline == closed_at + table.RETAIN + table.TOMBSTONE
    engine.step([], deadline)
    assert engine.negotiations == {} and engine.closed == {}
    assert engine.step([], deadline + 1) == ([], None)
    # a day later the id is anyone's again (a client's retries are long over)
    assert isinstance(one(engine, Propose(proposal(earliest=deadline + 600,
                                                   latest=deadline + 3600)), deadline + 1),
                      Offer)


def test_finished_records_per_tenant_are_bounded() -> None:
    engine = world()
    for i in range(table.MAX_RETAINED + 5):
        offer = one(engine, Propose(proposal(f"r{i}")))
        one(engine, Accept("a", f"r{i}", offer.offer_id))
        one(engine, Cancel("a", f"r{i}"))
    kept = [k for k in engine.negotiations if k[0] == "a"]
    assert len(kept) == table.MAX_RETAINED
    assert ("a", "r0") in engine.closed
