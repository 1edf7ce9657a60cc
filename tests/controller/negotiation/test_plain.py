"""The engine's state survives to_plain/from_plain (through JSON, as it is stored): the
restored engine holds the same, and answers the next inputs alike."""

from __future__ import annotations

import json

import pytest

from controller.negotiation.engine import Engine
from controller.negotiation.maintenance import Cause, MaintenanceAnswer, MaintenanceProposal
from controller.negotiation.plain import from_plain, to_plain
from controller.negotiation.types import (
    Accept,
    Cancel,
    CounterProposal,
    Flexibility,
    Propose,
    Reject,
    Release,
    Started,
)
from tests.controller.negotiation.helpers import T0, one, proposal, world

pytestmark = pytest.mark.negotiation


def busy() -> Engine:
    """An engine with a negotiation in every kind of state and a record."""
    engine = world(offer_ttl=1000.0)
    early = T0 - 8000
    gone = one(engine, Propose(proposal("gone", lo=1, hi=1, earliest=early + 600,
                                        latest=early + 600)), early)
    engine.step([], gone.expires_at)
    engine.step([], gone.expires_at + 3600)  # forgotten: a closed id
    offered = one(engine, Propose(proposal("offered")))
    one(engine, Propose(proposal("countered", lo=9, hi=9, flex=Flexibility.COUNT)))
    one(engine, Propose(proposal("refused", lo=9, hi=9)))
    held = one(engine, Propose(proposal("held", tenant="b")))
    one(engine, Accept("b", "held", held.offer_id))
    for name, end in (("rejected", Reject), ("released", Release), ("started", Started),
                      ("cancelled", Cancel)):
        offer = one(engine, Propose(proposal(name, tenant="b", lo=1, hi=1)))
        if end is Reject:
            one(engine, Reject("b", name, offer.offer_id))
            continue
        one(engine, Accept("b", name, offer.offer_id))
        one(engine, end("b", name), T0 + 700 if end is Started else T0 + 1)
    one(engine, CounterProposal(offered.offer_id, proposal("offered", hi=3)), T0 + 2)
    one(engine, MaintenanceProposal("vn-1", "a", "j", Cause.THERMAL, T0 + 7200, 60.0, T0,
                                    3600.0, T0 - 100))
    one(engine, MaintenanceProposal("vn-2", "b", "j", Cause.ROUTINE, T0 + 7200, 60.0, T0))
    one(engine, MaintenanceAnswer("b", "vn-2", (T0 + 9000,)), T0 + 3)
    return engine


def test_the_state_round_trips_through_json() -> None:
    engine = busy()
    plain = to_plain(engine)
    assert {n["state"] for n in plain["negotiations"]} == {
        "offered", "countered", "refused", "held", "rejected", "released", "started",
        "cancelled"}
    assert plain["closed"] and plain["records"]
    assert len(plain["maintenance"]) == 2
    restored = from_plain(engine.policy, json.loads(json.dumps(plain)))
    assert to_plain(restored) == plain
    assert restored.negotiations == engine.negotiations
    assert restored.maintenance == engine.maintenance
    assert restored.records == engine.records and restored.closed == engine.closed


def test_a_restored_engine_answers_retries_and_next_steps_alike() -> None:
    engine = busy()
    restored = from_plain(engine.policy, json.loads(json.dumps(to_plain(engine))))
    now = T0 + 705
    retries = [Propose(proposal("offered", hi=3)), Accept("b", "held", "of-x"),
               Propose(proposal("gone", lo=1, hi=1)), Propose(proposal("new", lo=1)),
               MaintenanceAnswer("a", "vn-1", ())]
    assert engine.step(retries, now) == restored.step(retries, now)
    for later in (now + 3600, now + 86400, now + 3 * 86400):
        assert engine.step([], later) == restored.step([], later)
    assert to_plain(engine) == to_plain(restored)


def test_a_stored_state_of_another_version_is_refused() -> None:
    plain = to_plain(world())
    plain["version"] = 0
    with pytest.raises(ValueError, match="version 0"):
        from_plain(world().policy, plain)
