"""A tenant is told on its own negotiation topic when an offer of its lapses and when a
hold of its ends unused (a no-show, with what it charged): a real controller over ZeroMQ,
the tenant's own client subscribed to its job topics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from harmonaize.tenant.client import FeedClient
from harmonaize.tenant.sequencer import FeedMessage
from tests.conftest import Spawn, needs_root
from tests.controller.negotiation.test_wire import CLASS, POOL, negotiating
from tests.daemons import tenant_feed

pytestmark = [pytest.mark.negotiation, needs_root]


def expired(feed: FeedClient) -> FeedMessage:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = feed.recv(timeout=1)
        if message is not None and isinstance(message.body, m.NegotiationExpired):
            return message
    raise AssertionError("no negotiation-expired came")


def test_a_lapsed_offer_and_an_unused_hold_are_told_to_their_tenant(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    with negotiating(spawn, workdir, ctx, "offer_ttl = 1.0\n") as (controller, _, acme, _), \
            tenant_feed(controller, ["job/acme/"], "acme", context=ctx) as mine, \
            tenant_feed(controller, ["job/globex/"], "globex", context=ctx) as other:
        now = time.time()
        soon = {"pool": POOL, "gpu_class": CLASS, "earliest_start": now + 2,
                "latest_start": now + 3, "duration": 2.0}
        offer = acme.propose("lapses", min_count=1, max_count=1, **soon)
        assert offer.outcome is m.Outcome.OFFER
        told = expired(mine)
        assert told.topic == "job/acme/@negotiation/"
        assert (told.body.request_id, told.body.expired, told.body.charged) == (
            "lapses", "offer", 0.0)
        assert told.body.at >= offer.expires_at
        # A hold nothing places ends at its no-show time (its window is 2 s long here).
        offer = acme.propose("unused", min_count=1, max_count=1,
                             **dict(soon, earliest_start=time.time() + 2,
                                    latest_start=time.time() + 3))
        held = acme.accept("unused", offer.offer_id)
        assert held.outcome is m.Outcome.HOLD
        told = expired(mine)
        assert (told.body.request_id, told.body.expired) == ("unused", "hold")
        assert told.body.charged == held.count * (held.end - held.start)
        assert told.body.at >= held.expires_at
        # Another tenant hears nothing of acme's.
        while (message := other.recv(timeout=0.2)) is not None:
            assert not isinstance(message.body, m.NegotiationExpired)
