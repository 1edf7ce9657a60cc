"""A publication goes out as one fan-out, counted once: each subscriber's sent and
dropped still say who got what."""

from __future__ import annotations

import pytest

from controller.feed import Budgets, FeedHub
from controller.outputs import FanOut, tenant_sends
from harmonaize.messages import Subscribe

pytestmark = [pytest.mark.controller]


def hub_with(*subs: tuple[bytes, tuple[str, ...]]) -> FeedHub:
    hub = FeedHub(budgets=Budgets(request_rate=1.0, request_burst=100.0,
                                  replay_rate=1.0, replay_burst=100.0))
    for peer, prefixes in subs:
        hub.subscribe(peer, "alpha", Subscribe(prefixes), 0.0, {}, epoch=1)
    return hub


def counts(hub: FeedHub) -> dict[bytes, tuple[int, int]]:
    hub.settle()
    return {peer: (s.sent, s.dropped) for peer, s in sorted(hub.subscribers.items())}


def test_each_subscriber_is_counted_what_it_was_handed_less_what_did_not_fit() -> None:
    hub = hub_with((b"za", ("pool/",)), (b"zb", ("pool/",)), (b"zc", ("job/alpha/",)))
    assert hub.hand("pool/p/H200") == [b"za", b"zb"]
    hub.hand("pool/p/H200")
    hub.missed(b"zb")  # the second did not fit its queue
    assert counts(hub) == {b"za": (2, 0), b"zb": (1, 1), b"zc": (0, 0)}
    # A new subscriber changes who gets what: what was handed before is not its.
    hub.subscribe(b"zd", "alpha", Subscribe(("pool/",)), 1.0, {}, epoch=1)
    hub.hand("pool/p/H200")
    hub.hand("job/alpha/j/")
    assert counts(hub) == {b"za": (3, 0), b"zb": (2, 1), b"zc": (1, 0), b"zd": (1, 0)}
    # One that left is not counted what was handed to the peers it was among.
    hub.hand("pool/p/H200")
    hub.drop([b"za"])
    assert counts(hub) == {b"zb": (3, 1), b"zc": (1, 0), b"zd": (2, 0)}


def test_a_fan_out_names_every_peer_it_sends_to() -> None:
    out = FanOut([b"za", b"zb"], "pool/p/H200", b"frame", 7)
    assert [(s.peer, s.topic, s.frame, s.offset) for s in tenant_sends([out])] == [
        (b"za", "pool/p/H200", b"frame", 7), (b"zb", "pool/p/H200", b"frame", 7)]
