"""Each move of a negotiation: proposed, offered or countered or refused, accepted into
a hold or rejected or countered by the tenant, and the bounded rounds."""

from __future__ import annotations

import pytest

from controller.negotiation.types import (
    Accept,
    Closed,
    Counter,
    CounterProposal,
    Flexibility,
    Hold,
    Offer,
    Propose,
    Reason,
    Refusal,
    Reject,
    State,
)
from tests.controller.negotiation.helpers import T0, one, proposal, world

pytestmark = pytest.mark.negotiation


def test_a_proposal_that_fits_is_offered_at_its_earliest_start_and_a_retry_answers_alike(
) -> None:
    engine = world()
    offer = one(engine, Propose(proposal(hi=4)))
    assert type(offer) is Offer
    assert (offer.count, offer.start, offer.end) == (4, T0 + 600, T0 + 4200)
    assert offer.expires_at == T0 + engine.policy.offer_ttl
    assert engine.negotiations[("a", "r1")].state is State.OFFERED
    assert one(engine, Propose(proposal(hi=4)), T0 + 5) == offer


def test_an_offer_is_at_most_the_tenants_share_of_the_release() -> None:
    engine = world(free=16)  # two tenants of equal weight: 8 each
    offer = one(engine, Propose(proposal(lo=1, hi=12)))
    assert isinstance(offer, Offer) and offer.count == 8


def test_accepting_makes_a_hold_kept_until_it_starts_and_a_retry_answers_alike() -> None:
    engine = world()
    offer = one(engine, Propose(proposal()))
    hold = one(engine, Accept("a", "r1", offer.offer_id), T0 + 10)
    assert isinstance(hold, Hold)
    assert (hold.count, hold.start, hold.end) == (offer.count, offer.start, offer.end)
    assert hold.expires_at == offer.start + 900
    assert engine.holds() == [hold]
    assert one(engine, Accept("a", "r1", offer.offer_id), T0 + 11) == hold
    # the hold's GPUs are out of the tenant's share for its window
    again = one(engine, Propose(proposal("r2", lo=1, hi=8)), T0 + 12)
    assert isinstance(again, Offer) and again.count == 8 - hold.count


def test_rejecting_closes_the_negotiation_and_frees_the_offer() -> None:
    engine = world()
    offer = one(engine, Propose(proposal(hi=8)))
    closed = one(engine, Reject("a", "r1", offer.offer_id))
    assert closed == Closed("r1", "a", State.REJECTED)
    assert one(engine, Reject("a", "r1", offer.offer_id)) == closed
    fresh = one(engine, Propose(proposal("r2", hi=8)))
    assert isinstance(fresh, Offer) and fresh.count == 8


def test_an_offer_not_answered_expires_and_its_gpus_return() -> None:
    engine = world()
    offer = one(engine, Propose(proposal(hi=8)))
    out, _ = engine.step([], offer.expires_at)
    assert out == [Closed("r1", "a", State.EXPIRED)]
    late = one(engine, Accept("a", "r1", offer.offer_id), offer.expires_at + 1)
    assert late.field == "offer_id" and "expired" in late.message
    assert engine.holds() == []


def test_a_tenants_counter_is_a_new_round_with_a_new_offer_id() -> None:
    engine = world()
    first = one(engine, Propose(proposal(hi=4)))
    second = one(engine, CounterProposal(first.offer_id, proposal(hi=6)))
    assert isinstance(second, Offer) and second.round == 2 and second.count == 6
    assert second.offer_id != first.offer_id
    # the first offer is gone: accepting it is refused, the second is held
    stale = one(engine, Accept("a", "r1", first.offer_id))
    assert stale.field == "offer_id"
    assert isinstance(one(engine, Accept("a", "r1", second.offer_id)), Hold)


def test_rounds_are_bounded() -> None:
    engine = world(max_rounds=2)
    offer = one(engine, Propose(proposal(hi=4)))
    offer = one(engine, CounterProposal(offer.offer_id, proposal(hi=5)))
    assert isinstance(offer, Offer)
    refused = one(engine, CounterProposal(offer.offer_id, proposal(hi=6)))
    assert refused == Refusal("r1", "a", Reason.ROUNDS)
    assert engine.negotiations[("a", "r1")].state is State.REFUSED


def test_more_than_the_share_is_refused_without_flexibility() -> None:
    engine = world(free=16)
    assert one(engine, Propose(proposal(lo=9, hi=10))) == Refusal("r1", "a",
                                                                 Reason.NO_CAPACITY)


def test_a_count_flexible_proposal_is_countered_with_fewer_gpus() -> None:
    engine = world(free=16)
    counter = one(engine, Propose(proposal(lo=9, hi=10, flex=Flexibility.COUNT)))
    assert isinstance(counter, Counter) and counter.departs == "count"
    assert (counter.count, counter.start) == (8, T0 + 600)
    assert engine.negotiations[("a", "r1")].state is State.COUNTERED
    assert isinstance(one(engine, Accept("a", "r1", counter.offer_id)), Hold)


def test_a_time_flexible_proposal_is_countered_after_the_tenants_own_hold_ends() -> None:
    engine = world(free=16)
    offer = one(engine, Propose(proposal(lo=8, hi=8)))
    one(engine, Accept("a", "r1", offer.offer_id))
    counter = one(engine, Propose(proposal("r2", lo=2, hi=2, flex=Flexibility.TIME)))
    assert isinstance(counter, Counter) and counter.departs == "time"
    assert counter.start == offer.end and counter.count == 2
    plain = one(engine, Propose(proposal("r3", lo=2, hi=2)))
    assert plain == Refusal("r3", "a", Reason.NO_CAPACITY)


def test_another_tenants_holds_never_change_an_offer() -> None:
    """Privacy and fairness at once: b's offer is a function of the release and b's own
    holds; a holding all it may changes nothing b is told."""
    alone, crowded = world(), world()
    offer = one(crowded, Propose(proposal("x", tenant="a", lo=8, hi=8)))
    one(crowded, Accept("a", "x", offer.offer_id))
    asked = proposal("r1", tenant="b", lo=1, hi=16)
    assert one(alone, Propose(asked)) == one(crowded, Propose(asked))
    assert crowded.load("p1", "h100", T0, T0 + 86400, T0) == 16  # and no more than the pool
