"""Bad input: one Error naming the field, in one line, and nothing held or stored."""

from __future__ import annotations

import pytest

from controller.negotiation.engine import Engine
from controller.negotiation.maintenance import Cause, MaintenanceAnswer, MaintenanceProposal
from controller.negotiation.types import (
    Accept,
    Error,
    Flexibility,
    Hold,
    Offer,
    Proposal,
    Propose,
    Reject,
    Release,
)
from tests.controller.negotiation.helpers import T0, one, proposal, world

pytestmark = pytest.mark.negotiation


def refused(engine: Engine, item: object, field: str, now: float = T0) -> Error:
    before = dict(engine.negotiations)
    error = one(engine, item, now)
    assert isinstance(error, Error), error
    assert error.field == field, error
    assert "\n" not in str(error) and error.message
    assert engine.negotiations.keys() == before.keys()
    return error


@pytest.mark.parametrize(("changes", "field", "says"), [
    ({"latest": T0 + 100, "earliest": T0 + 200}, "latest_start", "before earliest"),
    ({"latest": T0 - 1, "earliest": T0 - 100}, "latest_start", "past"),
    ({"latest": T0 + 40 * 86400}, "latest_start", "days ahead"),
    ({"duration": 0.0}, "duration", "more than 0"),
    ({"duration": 8 * 86400.0}, "duration", "at most 7 days"),
    ({"duration": float("nan")}, "duration", "finite"),
    ({"lo": 0}, "min_count", "at least 1"),
    ({"lo": 5, "hi": 4}, "min_count", "above max_count"),
    ({"hi": 33}, "max_count", "the most this pool can hold (32)"),
    ({"pool": "nowhere"}, "pool", "no such pool"),
    ({"gpu_class": "a100"}, "gpu_class", "no such GPU class"),
    ({"request_id": "has space"}, "request_id", "1 to 64"),
    ({"request_id": "x" * 65}, "request_id", "1 to 64"),
    ({"tenant": "mallory"}, "tenant", "may negotiate"),
])
def test_an_impossible_proposal_is_refused_naming_its_field(changes: dict, field: str,
                                                            says: str) -> None:
    error = refused(world(), Propose(proposal(**changes)), field)
    assert says in error.message


def test_a_count_that_is_not_a_whole_number_is_refused() -> None:
    p = Proposal("r1", "a", "p1", "h100", 1, 2.5, T0, T0, 60.0,  # type: ignore[arg-type]
                 Flexibility.NONE)
    refused(world(), Propose(p), "max_count")


def test_a_replayed_id_with_another_proposal_is_refused() -> None:
    engine = world()
    one(engine, Propose(proposal(hi=4)))
    error = refused(engine, Propose(proposal(hi=5)), "request_id")
    assert "different proposal" in error.message


def test_another_tenants_offer_id_is_refused_and_nothing_is_held() -> None:
    engine = world()
    offer = one(engine, Propose(proposal()))
    assert isinstance(offer, Offer)
    refused(engine, Accept("b", "r1", offer.offer_id), "request_id")
    one(engine, Propose(proposal(tenant="b")))  # b's own r1
    error = refused(engine, Accept("b", "r1", offer.offer_id), "offer_id")
    assert error.message == "no such offer of yours"
    refused(engine, Reject("b", "r1", offer.offer_id), "offer_id")
    assert engine.holds() == []


def test_an_expired_offer_accepted_is_refused() -> None:
    engine = world()
    offer = one(engine, Propose(proposal()))
    out, _ = engine.step([Accept("a", "r1", offer.offer_id)], offer.expires_at)
    assert [type(o).__name__ for o in out] == ["Closed", "Error"]  # expiry comes first
    error = refused(engine, Accept("a", "r1", offer.offer_id), "offer_id", offer.expires_at)
    assert "expired" in error.message
    assert engine.holds() == []


def test_a_flood_of_proposals_stops_at_the_bound_on_open_negotiations() -> None:
    engine = world(max_open=3)
    for i in range(3):
        assert isinstance(one(engine, Propose(proposal(f"r{i}", lo=1, hi=1))), Offer)
    error = refused(engine, Propose(proposal("r3", lo=1, hi=1)), "request_id")
    assert "3 negotiations of yours are open" in error.message
    # b is not held back by a's flood
    assert isinstance(one(engine, Propose(proposal("r3", tenant="b"))), Offer)


def test_releasing_what_is_not_held_is_refused() -> None:
    engine = world()
    refused(engine, Release("a", "nope"), "request_id")
    one(engine, Propose(proposal()))
    error = refused(engine, Release("a", "r1"), "request_id")
    assert "no hold" in error.message


def test_one_bad_input_in_a_batch_leaves_the_others_answered() -> None:
    engine = world()
    out, _ = engine.step([Propose(proposal("r1")), Propose(proposal("r2", lo=0)),
                          Propose(proposal("r3"))], T0)
    assert [type(o) for o in out] == [Offer, Error, Offer]
    hold = one(engine, Accept("a", "r3", out[2].offer_id))
    assert isinstance(hold, Hold)


@pytest.mark.parametrize(("changes", "field"), [
    ({"earliest_start": "soon"}, "earliest_start"),
    ({"latest_start": None}, "latest_start"),
    ({"duration": True}, "duration"),
    ({"min_count": "2"}, "min_count"),
    ({"flexibility": "whatever"}, "flexibility"),
    ({"pool": None}, "pool"),
])
def test_a_field_of_the_wrong_type_is_named_not_a_traceback(changes: dict,
                                                            field: str) -> None:
    base = proposal().__dict__ | changes
    refused(world(), Propose(Proposal(**base)), field)


def test_a_maintenance_counter_that_is_not_times_is_refused() -> None:
    engine = world()
    one(engine, MaintenanceProposal("vn-1", "a", "j", Cause.ROUTINE, T0 + 7200, 60.0, T0))
    for windows in (("x",), (float("inf"),), None):
        error = one(engine, MaintenanceAnswer("a", "vn-1", windows))  # type: ignore[arg-type]
        assert isinstance(error, Error) and error.field == "windows"
