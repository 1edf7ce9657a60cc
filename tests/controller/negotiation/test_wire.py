"""Negotiation against a real controller process, over real ZeroMQ (the Python client)
and real HTTP (curl): a reservation in rounds, every bad input the issue lists, an
operator's cancel, and a restart that keeps a hold and an open offer.

One host of 8 free GPUs in pool ``p`` (class H200); tenants acme and globex with equal
weights, so each may hold half of the released lower edge of the pool's free GPUs."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from harmonaize import messages as m
from harmonaize.tenant.client import FeedClient, RequestError
from tests.conftest import Spawn, free_port, needs_root
from tests.controller.test_feed import Sender
from tests.daemons import Controller, FakeAgent, start_controller, tenant_feed, wait_until
from tests.sse import curl
from tests.tenant.test_http import bearer, summary, token

pytestmark = [pytest.mark.negotiation, needs_root]

POOL, CLASS = "p", "H200"
HOUR = 3600.0


def settings(gateway_port: int, extra: str = "") -> str:
    return (f'[gateway]\nlisten = "127.0.0.1:{gateway_port}"\n'
            "[negotiation]\nweights = { acme = 1.0, globex = 1.0 }\n" + extra)


@contextmanager
def negotiating(spawn: Spawn, workdir: Path, ctx: zmq.Context, extra: str = ""
                ) -> Iterator[tuple[Controller, str, FeedClient, int]]:
    """A controller whose pool was released, its gateway's URL, acme's client, and the
    GPUs acme may hold (its share of the release)."""
    port = free_port()
    controller = start_controller(spawn, workdir, settings(port, extra))
    sender = Sender(FakeAgent(ctx, controller))
    sender.send(summary(0))
    stop = threading.Event()
    beating = threading.Thread(target=heartbeats, args=(sender, stop), daemon=True)
    beating.start()
    try:
        with tenant_feed(controller, ["pool/"], "acme", context=ctx) as acme:
            released = wait_until(lambda: next(
                (msg.body for msg in iter(lambda: acme.recv(timeout=0.2), None)
                 if isinstance(msg.body, m.PoolCapacity)), None), what="the pool's release")
            share = released.gpus_available.lo // 2
            assert share >= 2, released
            yield controller, f"http://127.0.0.1:{port}/v1", acme, share
    finally:
        stop.set()
        beating.join(timeout=10)


def heartbeats(sender: Sender, stop: threading.Event) -> None:
    """The host stays up (its socket is this thread's from here on)."""
    started = time.monotonic()
    while not stop.wait(0.3):
        sender.agent.send(m.Heartbeat(time.monotonic() - started, sender.seq))
        while sender.agent.sock.poll(0):
            sender.agent.sock.recv()


def window(now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    # Two hours ahead: a release now is more than an hour before the start (free).
    return {"pool": POOL, "gpu_class": CLASS, "earliest_start": now + 2 * HOUR,
            "latest_start": now + 3 * HOUR, "duration": HOUR}


def holds(controller: Controller) -> list[dict[str, Any]]:
    return controller.request("holds")


def test_a_reservation_in_rounds_over_zeromq_and_http(spawn, workdir: Path,
                                                      ctx: zmq.Context) -> None:
    with negotiating(spawn, workdir, ctx) as (controller, url, acme, share):
        w = window()
        # Round 1: more than the share, fewer allowed: a counter with what there is.
        first = acme.propose("r1", min_count=share + 1, max_count=share + 2,
                             flexibility="count", **w)
        assert (first.outcome, first.departs, first.count) == (m.Outcome.COUNTER, "count",
                                                               share)
        assert first.start == w["earliest_start"] and first.round == 1
        # Round 2: the tenant counters within its share: an offer.
        second = acme.counter("r1", first.offer_id, min_count=1, max_count=share - 1, **w)
        assert (second.outcome, second.count, second.round) == (m.Outcome.OFFER, share - 1, 2)
        assert second.offer_id != first.offer_id
        held = acme.accept("r1", second.offer_id)
        assert (held.outcome, held.count, held.start) == (m.Outcome.HOLD, share - 1,
                                                          second.start)
        assert acme.accept("r1", second.offer_id) == held  # a retry: the same answer
        assert [(h["id"], h["count"]) for h in holds(controller)] == [("acme/r1", share - 1)]
        listed = acme.negotiations()
        assert [(n.request_id, n.outcome) for n in listed] == [("r1", m.Outcome.HOLD)]
        # What acme holds is out of its own share: more than what is left beside it is
        # refused in a window that must start with the hold; a wider window is offered
        # where the hold has ended.
        during = dict(w, latest_start=w["earliest_start"])
        refused = acme.propose("r2", min_count=2, max_count=2, **during)
        assert (refused.outcome, refused.reason) == (m.Outcome.REFUSAL, "no-capacity")
        after = acme.propose("r3", min_count=2, max_count=2, **w)
        assert (after.outcome, after.start) == (m.Outcome.OFFER, held.end)
        acme.reject("r3", after.offer_id)

        # globex over HTTP, the same rounds: its share is its own (acme's holds are not in it).
        auth = bearer(token(controller, "globex"))
        status, body, _ = curl("POST", f"{url}/negotiations/propose", *auth, body={
            "request_id": "g1", "min_count": share, "max_count": share, **w})
        assert status == 200, body
        (offer,) = body["negotiation"]
        assert (offer["outcome"], offer["count"]) == ("offer", share)
        status, body, _ = curl("POST", f"{url}/negotiations/accept", *auth, body={
            "request_id": "g1", "offer_id": offer["offer_id"]})
        assert status == 200 and body["negotiation"][0]["outcome"] == "hold", body
        status, body, _ = curl("GET", f"{url}/negotiations", *auth)
        assert [n["request_id"] for n in body["negotiation"]] == ["g1"]
        assert {h["id"] for h in holds(controller)} == {"acme/r1", "globex/g1"}

        # acme releases its hold more than an hour ahead: free, and out of the list.
        released = acme.release("r1")
        assert (released.outcome, released.state, released.charged) == (
            m.Outcome.CLOSED, "released", 0.0)
        assert {h["id"] for h in holds(controller)} == {"globex/g1"}
        # An operator cancels globex's: the tenant's list says so.
        assert controller.request("holds-cancel", {"tenant": "globex", "request_id": "g1"}
                                  ) == {"id": "globex/g1", "state": "cancelled"}
        assert holds(controller) == []
        status, body, _ = curl("GET", f"{url}/negotiations", *auth)
        assert [(n["request_id"], n["state"]) for n in body["negotiation"]] == [
            ("g1", "cancelled")]


def refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(RequestError) as caught:
        call()
    return caught.value.code, str(caught.value)


def test_bad_input_is_refused_with_its_field_named_and_nothing_held(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    # Offers stand eight seconds here: long enough to replay and accept one, and for a
    # flood's first 17 proposals to be answered while the first 16 stand, on a loaded
    # machine too (two seconds was tight there); short enough to let one expire. A small
    # request budget, so a flood meets it.
    extra = "offer_ttl = 8.0\n[feed]\nrequest_rate = 5.0\nrequest_burst = 40.0\n"
    with negotiating(spawn, workdir, ctx, extra) as (controller, url, acme, _share):
        w = window()
        cases = {
            "impossible window": (dict(w, latest_start=w["earliest_start"] - 1),
                                  "negotiation-propose.latest_start: before earliest_start"),
            "a window already past": (dict(w, earliest_start=1000.0, latest_start=2000.0),
                                      "negotiation-propose.latest_start: already past"),
            "no duration": (dict(w, duration=0), "negotiation-propose.duration:"),
            "above any pool": ({**w, "max_count": 10_000},
                               "negotiation-propose.max_count: 10000 is above the most"),
            "min above max": ({**w, "min_count": 3, "max_count": 2},
                              "negotiation-propose.min_count: 3 is above max_count 2"),
            "no such pool": ({**w, "pool": "elsewhere"}, "negotiation-propose.pool:"),
        }
        for what, (fields, expected) in cases.items():
            proposal = {"min_count": 1, "max_count": 2, **fields}
            code, text = refusal(lambda p=proposal: acme.propose("bad", **p))
            assert (code, text[:len(expected)]) == ("invalid", expected), what
        # The same over HTTP: 400, the field named.
        auth = bearer(token(controller, "acme"))
        status, body, _ = curl("POST", f"{url}/negotiations/propose", *auth, body={
            "request_id": "bad", "min_count": 1, "max_count": 10_000, **w})
        assert (status, body["error"]["code"], body["error"]["field"]) == (
            400, "invalid", "negotiation-propose.max_count"), body
        status, body, _ = curl("POST", f"{url}/negotiations/propose", *auth, body={
            "request_id": "bad", "min_count": 1, "max_count": 2, "colour": "red", **w})
        assert (status, body["error"]["code"]) == (400, "invalid") and \
            "colour" in body["error"]["message"], body
        status, body, _ = curl("POST", f"{url}/negotiations/haggle", *auth, body={})
        assert (status, body["error"]["code"]) == (404, "not-found"), body

        # A replayed request id: the same proposal gets the same answer, another is refused.
        offer = acme.propose("r1", min_count=1, max_count=1, **w)
        assert acme.propose("r1", min_count=1, max_count=1, **w) == offer
        code, text = refusal(lambda: acme.propose("r1", min_count=1, max_count=2, **w))
        assert text == "negotiation-propose.request_id: already used for a different proposal"
        # Another tenant's offer id is no offer of its own (the same answer as none).
        with tenant_feed(controller, ["pool/"], "globex", context=ctx) as globex:
            code, text = refusal(lambda: globex.accept("r1", offer.offer_id))
            assert text == "negotiation-accept.request_id: no such negotiation of yours"
            mine = globex.propose("r1", min_count=1, max_count=1, **w)
            code, text = refusal(lambda: globex.accept("r1", offer.offer_id))
            assert text == "negotiation-accept.offer_id: no such offer of yours"
            globex.reject("r1", mine.offer_id)
        # An expired offer accepted: the offer of r1 lapses (the core's own deadline).
        def states() -> list[str]:
            time.sleep(0.5)  # asked twice a second: within the request budget
            return [n.state for n in acme.negotiations()]
        wait_until(lambda: states() == ["expired"], 60, "r1's offer to expire")
        code, text = refusal(lambda: acme.accept("r1", offer.offer_id))
        assert text.startswith("negotiation-accept.offer_id: expired at "), text
        assert holds(controller) == []

        # A flood of proposals: the request budget drops what is over it unanswered, the
        # bound on open negotiations refuses by name what it let through beyond 16 open
        # (offers lapse after eight seconds and make room again), and nothing is held.
        # (A window as wide as allowed: every proposal fits somewhere, none is refused.)
        wide = dict(w, latest_start=w["earliest_start"] + 20 * 86400)
        answered, refused_open, unanswered = 0, 0, 0
        for i in range(60):
            try:
                acme.propose(f"f{i}", min_count=1, max_count=1, timeout=0.5, **wide)
                answered += 1
            except RequestError as exc:
                if exc.code == "":
                    unanswered += 1
                else:
                    assert str(exc).endswith("negotiations of yours are open; let one "
                                             "close first"), exc
                    refused_open += 1
        assert answered >= 16 and refused_open >= 1 and unanswered >= 1, (
            answered, refused_open, unanswered)
        assert holds(controller) == []
        assert not (controller.proc.poll())  # still serving


def test_a_restart_keeps_a_hold_and_an_open_offer(spawn, workdir: Path,
                                                  ctx: zmq.Context) -> None:
    extra = "offer_ttl = 600.0\n"
    with negotiating(spawn, workdir, ctx, extra) as (controller, _url, acme, _share):
        w = window()
        offer = acme.propose("r1", min_count=1, max_count=1, **w)
        held = acme.accept("r1", offer.offer_id)
        pending = acme.propose("r2", min_count=1, max_count=1, **w)
        assert pending.outcome is m.Outcome.OFFER
    controller.proc.send_signal(signal.SIGTERM)
    controller.proc.wait(timeout=30)
    restarted = start_controller(spawn, workdir, settings(free_port(), extra))
    assert [(h["id"], h["count"], h["start"]) for h in holds(restarted)] == [
        ("acme/r1", 1, held.start)]
    with tenant_feed(restarted, ["pool/"], "acme", context=ctx) as acme:
        assert {n.request_id: n.outcome for n in acme.negotiations()} == {
            "r1": m.Outcome.HOLD, "r2": m.Outcome.OFFER}
        # The offer made before the restart is accepted after it.
        assert acme.accept("r2", pending.offer_id).outcome is m.Outcome.HOLD
    assert {h["id"] for h in holds(restarted)} == {"acme/r1", "acme/r2"}


def test_a_placement_that_names_its_hold_starts_it(spawn, workdir: Path,
                                                   ctx: zmq.Context) -> None:
    with negotiating(spawn, workdir, ctx) as (controller, _url, acme, _share):
        w = window()
        offer = acme.propose("r1", min_count=2, max_count=2, **w)
        acme.accept("r1", offer.offer_id)
        members = [{"name": str(i), "host": "h1"} for i in range(2)]
        placed = controller.request("place", {"job": "j1", "tenant": "acme",
                                              "members": members, "hold": "r1"})
        assert placed["hold"] == "started", placed
        assert holds(controller) == []  # used: no longer held, never a no-show
        (started,) = acme.negotiations()
        assert (started.request_id, started.state, started.charged) == ("r1", "started", 0.0)
        # A placement naming no hold of the tenant's stands, and says so.
        again = controller.request("place", {"job": "j2", "tenant": "acme",
                                             "members": members, "hold": "r9"})
        assert again["hold"] == "not started: request_id: no such negotiation of yours"
        assert {j["job"] for j in controller.request("jobs")} == {"j1", "j2"}
