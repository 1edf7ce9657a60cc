"""The gateway writes each publication's CloudEvent once for all the streams it goes to:
a sharing path, so two tenants' streams must never be given each other's bytes."""

from __future__ import annotations

import json

import pytest

from controller.gateway.events import EventCache, cloudevent
from harmonaize.messages import codec, encode
from tests.controller.test_feed import advice

pytestmark = pytest.mark.tenant

SOURCE = "/harmonaize/feed"


def test_two_tenants_with_the_same_frame_get_their_own_events() -> None:
    """The same frame bytes on acme's and beta's job topics (same body, number and stamp:
    the worst case for a cache) are two events, each naming its own topic."""
    cache = EventCache()
    frame = encode(advice("j1", 0), sender="controller", seq=1, now=1000.0)
    acme = cache.get(frame, "job/acme/j1", SOURCE, 7)
    beta = cache.get(frame, "job/beta/j1", SOURCE, 7)
    assert json.loads(acme)["subject"] == "job/acme/j1"
    assert json.loads(beta)["subject"] == "job/beta/j1"
    assert acme == cloudevent(frame, "job/acme/j1", SOURCE, 7)
    assert beta == cloudevent(frame, "job/beta/j1", SOURCE, 7)
    # Each stream of one tenant gets the event written once, whatever the epoch says.
    assert cache.get(frame, "job/acme/j1", SOURCE, 7) is acme and cache.hits == 1
    assert json.loads(cache.get(frame, "job/acme/j1", SOURCE, 8))["id"].startswith("8:")


def test_a_bounded_cache_still_writes_what_it_evicted() -> None:
    cache = EventCache(size=2)
    frames = [encode(advice("j1", rank), sender="controller", seq=rank + 1, now=1000.0)
              for rank in range(4)]
    written = [cache.get(f, "job/acme/j1", SOURCE, 1) for f in frames]
    assert cache.get(frames[0], "job/acme/j1", SOURCE, 1) == written[0]
    assert cache.hits == 0  # evicted, written again (and the same)
    assert len({json.loads(w)["seq"] for w in written}) == 4


def test_every_send_is_audited_cached_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, object]] = []
    monkeypatch.setattr(codec, "audit_hook", lambda *args: seen.append(args))
    cache = EventCache()
    frame = encode(advice("j1", 0), sender="controller", seq=1, now=1000.0)
    seen.clear()
    for _ in range(3):
        cache.get(frame, "job/acme/j1", SOURCE, 1)
    assert [kind for kind, _, _ in seen] == ["cloudevent"] * 3
