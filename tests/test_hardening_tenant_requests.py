"""A tenant's requests against a real controller: every request, valid or not, spends
the tenant's budget before it is read (item 9 of the second outside attack); what the
answers say of the request they answer and of nobody else (item 11, the docs' gaps)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from harmonaize import messages as m
from harmonaize.messages import decode, encode
from tests.conftest import Spawn, needs_root
from tests.daemons import Controller, curve_dealer, keyring, start_controller, wait_until
from tests.sse import CurlStream
from tests.test_tenant_http import bearer, gateway, token

pytestmark = [pytest.mark.hardening, needs_root]

#: A small budget, so that a flood is mostly over it.
RATE, BURST = 5.0, 20.0
BUDGET = f"[feed]\nrequest_rate = {RATE}\nrequest_burst = {BURST}\n"


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def tenant_socket(ctx: zmq.Context, controller: Controller, tenant: str) -> zmq.Socket:
    """A raw DEALER on the feed with the tenant's key, once the controller has read it."""
    ring = keyring(controller.workdir)
    creds = ring.tenant(tenant)
    filed = len(list((ring.root / "tenants").glob("*.key")))
    wait_until(lambda: controller.request("status")["auth"].get("tenants_allowed", filed)
               >= filed, 30, f"the controller to read tenant {tenant}'s key")
    return curve_dealer(ctx, controller, creds, controller.feed, {zmq.RCVHWM: 0})


def answers(sock: zmq.Socket, quiet: float = 1.0) -> list[m.Message]:
    """Every answer (topic frame empty) until the socket has been quiet for a while."""
    got: list[m.Message] = []
    while sock.poll(int(quiet * 1000)):
        topic, frame = sock.recv_multipart()
        if not topic:
            got.append(decode(frame).body)
    return got


def start(spawn: Spawn, workdir: Path) -> Controller:
    return start_controller(spawn, workdir, BUDGET)


def feed_stats(controller: Controller) -> dict[str, int]:
    return controller.request("status")["feed_stats"]


def test_invalid_subscribes_over_zeromq_spend_the_request_budget(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start(spawn, workdir)
    sock = tenant_socket(ctx, controller, "acme")
    before = feed_stats(controller)
    invalid = [encode(m.Subscribe(("job/acme/",)), sender="t", seq=n)
               .replace(b"topics", b"topicz") for n in range(1, 301)]
    garbage = [b"\x93not a frame", msgpack.packb(["hz", 1, "subscribe"])] * 50
    began = time.monotonic()
    for frame in invalid + garbage:
        sock.send(frame)
    flood = len(invalid) + len(garbage)
    wait_until(lambda: feed_stats(controller).get("requests", 0)
               - before.get("requests", 0) >= flood, 30, "the controller to read the flood")
    elapsed = time.monotonic() - began  # an upper bound on the controller's time for it
    got = answers(sock)
    after = feed_stats(controller)
    throttled = after.get("throttled_requests", 0) - before.get("throttled_requests", 0)
    assert after["requests"] - before.get("requests", 0) == flood
    assert len(got) == flood - throttled  # every request answered or counted throttled
    assert len(got) <= BURST + RATE * elapsed + 1
    assert throttled >= flood - (BURST + RATE * elapsed + 1)
    assert all(isinstance(a, m.Reply) and not a.ok for a in got)


def test_invalid_http_declarations_spend_the_request_budget(spawn: Spawn,
                                                            workdir: Path) -> None:
    controller, url = gateway(spawn, workdir, BUDGET)
    secret = token(controller, "acme")
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    bodies = [json.dumps({"job": "j", "revision": 1, "nonsense": n}) for n in range(150)]
    bodies += ["{not json"] * 50 + [json.dumps([1, 2])] * 50
    statuses: list[int] = []
    before = feed_stats(controller)
    began = time.monotonic()
    try:
        for body in bodies:
            connection.request("POST", "/v1/declarations", body, headers)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        connection.close()
    elapsed = time.monotonic() - began
    after = feed_stats(controller)
    throttled = after.get("throttled_requests", 0) - before.get("throttled_requests", 0)
    refused = statuses.count(400)
    assert statuses.count(429) == throttled and refused + throttled == len(bodies)
    assert refused <= BURST + RATE * elapsed + 1
    assert after["requests"] - before.get("requests", 0) == len(bodies)


def test_subscribed_names_its_request_so_a_dropped_subscribe_cannot_confuse_a_client(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start(spawn, workdir)
    sock = tenant_socket(ctx, controller, "acme")
    for number in range(1, int(BURST) + 40):  # past the burst: some are dropped
        sock.send(encode(m.Subscribe(("pool/",)), sender="t", seq=number))
    got = answers(sock)
    numbers = [a.request for a in got if isinstance(a, m.Subscribed)]
    assert len(got) == len(numbers) and 0 < len(numbers) < int(BURST) + 39
    assert numbers == sorted(set(numbers)) and numbers[0] == 1
    # The next answer is to the request it names, whatever was dropped before it (the
    # budget refilled while the socket was quiet).
    sock.send(encode(m.Subscribe(("pool/",)), sender="t", seq=5000))
    assert [a.request for a in answers(sock)] == [5000]


def test_the_subscribed_event_id_over_http_counts_nobody_elses_requests(
        spawn: Spawn, workdir: Path) -> None:
    controller, url = gateway(spawn, workdir)
    mine, theirs = token(controller, "acme"), token(controller, "other")
    ids = []
    for _ in range(3):
        stream = CurlStream(spawn, f"{url}/feed?topic=pool/", *bearer(mine))
        try:
            subscribed = stream.next()
        finally:
            stream.close()
        assert subscribed.kind == "subscribed" and subscribed.id is None
        ids.append(subscribed.data["id"])
        for _ in range(3):  # another tenant's requests between ours
            other = CurlStream(spawn, f"{url}/feed?topic=pool/", *bearer(theirs))
            other.next()
            other.close()
    assert len(set(ids)) == 3
    # Random, not a count: nothing in them moves with the requests made between.
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
