"""The engine's state as the shell stores it: rows per tenant (and the view), joined
again into the engine that wrote them, and only the rows a change touched written."""

from __future__ import annotations

import json

import pytest

from controller import negotiationrows as rows
from controller.negotiation.plain import from_plain
from controller.negotiation.types import Propose
from tests.controller.negotiation.helpers import T0, one, proposal, world
from tests.controller.negotiation.test_plain import busy

pytestmark = pytest.mark.negotiation


def stored(engine: object, tenants: list[str]) -> dict[str, object]:
    """Every row through JSON, as the store keeps them."""
    return json.loads(json.dumps(rows.rows(engine, tenants, view=True)))  # type: ignore[arg-type]


def test_rows_join_into_the_engine_that_wrote_them() -> None:
    engine = busy()
    tenants = sorted(engine.policy.weights)
    restored = from_plain(engine.policy, rows.joined(stored(engine, tenants)))
    assert restored.negotiations == engine.negotiations
    assert (restored.view, restored.closed, restored.records) == (
        engine.view, engine.closed, engine.records)
    assert restored.maintenance.items == engine.maintenance.items
    assert restored.next_deadline() == engine.next_deadline()


def test_a_tenants_row_holds_only_its_own_and_goes_when_it_is_empty() -> None:
    engine = world()
    one(engine, Propose(proposal("r1", "a")))
    one(engine, Propose(proposal("r1", "b")))
    written = stored(engine, ["a"])
    assert set(written) == {"view", "tenant:a"}
    assert [n["proposal"]["tenant"] for n in written["tenant:a"]["negotiations"]] == ["a"]
    assert rows.rows(engine, ["c"], view=False) == {"tenant:c": None}  # nothing of c's


def test_an_expiry_names_the_tenants_it_may_change() -> None:
    engine = world(offer_ttl=60.0)
    one(engine, Propose(proposal("r1", "a")))
    one(engine, Propose(proposal("r2", "b")), T0 + 30)
    assert rows.tenants_due(engine, T0 + 59) == set()
    assert rows.tenants_due(engine, T0 + 60) == {"a"}
    assert rows.tenants_due(engine, T0 + 90) == {"a", "b"}
