"""Whatever tenants do, in any order: the holds and offers of all tenants never exceed
the pool's release, no tenant's exceed its cap, and every state expires."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.negotiation import table
from controller.negotiation.capacity import peak
from controller.negotiation.engine import Engine, Policy
from controller.negotiation.maintenance import Cause, MaintenanceAnswer, MaintenanceProposal
from controller.negotiation.types import (
    Accept,
    Cancel,
    CapacityRelease,
    CounterProposal,
    Flexibility,
    Offer,
    Proposal,
    Propose,
    Reject,
    Release,
    Started,
    State,
)

pytestmark = pytest.mark.negotiation

T0 = 1_000_000.0
FREE, CEILING = 24, 32
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 1.0}
HORIZON = 40 * 86400.0

action = st.tuples(
    # the moves that need an open negotiation pick one of the tenant's (below)
    st.sampled_from(["propose"] * 3 + ["accept"] * 3 + ["reject", "counter", "release",
                                                       "start", "cancel", "notice",
                                                       "answer", "wait"]),
    st.sampled_from(sorted(WEIGHTS)),
    st.integers(0, 5),                    # request id
    st.integers(1, 14), st.integers(0, 6),  # min count, extra up to max
    st.integers(0, 7200), st.integers(0, 7200), st.integers(1, 14400),  # window
    st.sampled_from(list(Flexibility)),
    st.sampled_from([0, 1, 30, 300, 1000, 4000]),  # seconds until the next step
)


def make(engine: Engine, step: tuple, now: float) -> object:
    """The input a step stands for: a move on one of the tenant's own negotiations in a
    state it can take (an answer needs an offer, an end needs a hold; failing that, the
    step moves one state earlier), so that most steps move something."""
    kind, tenant, rid, low, extra, lead, spread, duration, flex, _ = step

    def mine(*states: State) -> list[str]:
        return sorted(r for (t, r), n in engine.negotiations.items()
                      if t == tenant and n.state in states)

    if kind in ("release", "start", "cancel") and not mine(State.HELD):
        kind = "accept"
    if kind in ("accept", "reject", "counter") and not mine(*table.ANSWERABLE):
        kind = "propose"
    pick = mine(State.HELD) if kind in ("release", "start", "cancel") else mine(
        *table.ANSWERABLE)
    request = pick[rid % len(pick)] if kind != "propose" and pick else f"r{rid}"
    if kind == "propose" and ((tenant, request) in engine.negotiations
                              or (tenant, request) in engine.closed):
        request = f"r{rid}-{now:.0f}"  # a new id (replays have their own tests)
    p = Proposal(request, tenant, "p1", "h100", low, low + extra, now + lead,
                 now + lead + spread, float(duration), flex)
    n = engine.negotiations.get((tenant, request))
    offer = n.offer.offer_id if n is not None and n.offer is not None else "of-none"
    notice_id = f"vn-{tenant}-{rid}"
    notices = sorted(i for i, item in engine.maintenance.items.items()
                     if item.proposal.tenant == tenant)
    if kind == "answer" and notices:
        notice_id = notices[rid % len(notices)]
    return {
        "propose": lambda: Propose(p),
        "accept": lambda: Accept(tenant, request, offer),
        "reject": lambda: Reject(tenant, request, offer),
        "counter": lambda: CounterProposal(offer, p),
        "release": lambda: Release(tenant, request),
        "start": lambda: Started(tenant, request),
        "cancel": lambda: Cancel(tenant, request),
        "notice": lambda: MaintenanceProposal(notice_id, tenant, "j", Cause.ROUTINE,
                                              now + 3600 + lead, 60.0, now),
        "answer": lambda: MaintenanceAnswer(tenant, notice_id, (now + 7200 + lead,)),
        "wait": lambda: None,
    }[kind]()


def check(engine: Engine, now: float) -> None:
    every = engine.spans(None, "p1", "h100", now)
    assert peak(every, now, now + HORIZON) <= FREE
    share_cap = math.floor(FREE * engine.policy.max_share)
    for tenant in WEIGHTS:
        mine = engine.spans(tenant, "p1", "h100", now)
        assert peak(mine, now, now + HORIZON) <= share_cap
    for n in engine.negotiations.values():
        assert now < n.until < math.inf
        if n.state in table.ANSWERABLE:
            assert n.offer is not None and n.offer.expires_at == n.until


@settings(max_examples=200, deadline=None)
@given(st.lists(action, max_size=60))
def test_holds_stay_within_the_release_and_the_caps_and_every_state_expires(
        steps: list[tuple]) -> None:
    engine = Engine(Policy(weights=dict(WEIGHTS), max_open=4, offer_ttl=900.0))
    now = T0
    engine.step([CapacityRelease("p1", "h100", FREE, CEILING, now)], now)
    for step in steps:
        item = make(engine, step, now)
        out, deadline = engine.step([item] if item is not None else [], now)
        for answer in out:
            if isinstance(answer, Offer):
                assert answer.count >= 1 and answer.expires_at > now
        check(engine, now)
        assert deadline is None or deadline > now
        now += step[-1]
    # nothing lives for ever: the deadlines lead to an empty engine
    for _ in range(len(steps) * 4 + 8):
        _, deadline = engine.step([], now)
        if deadline is None:
            break
        now = deadline
    assert engine.negotiations == {} and engine.closed == {}
    assert engine.maintenance.items == {}
