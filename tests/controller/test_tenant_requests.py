"""A tenant's requests against a real controller: every request, valid or not, spends
the tenant's budget before it is read (item 9 of the second outside attack); what the
answers say of the request they answer and of nobody else (item 11, the docs' gaps)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from harmonaize import messages as m
from harmonaize.messages import decode, encode
from tests.conftest import Spawn, needs_root
from tests.controller.test_feed import Sender, advice, place
from tests.daemons import (
    Controller,
    FakeAgent,
    curve_dealer,
    keyring,
    start_controller,
    tenant_feed,
    wait_until,
)
from tests.sse import CurlStream, curl
from tests.tenant.test_http import bearer, gateway, token

pytestmark = [pytest.mark.hardening, needs_root]

#: A small budget, so that a flood is mostly over it.
RATE, BURST = 5.0, 20.0
BUDGET = f"[feed]\nrequest_rate = {RATE}\nrequest_burst = {BURST}\n"



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


def test_a_cursor_beyond_the_present_is_refused_in_one_clear_line(spawn: Spawn,
                                                                  workdir: Path) -> None:
    controller, url = gateway(spawn, workdir)
    secret = token(controller, "acme")
    stream = CurlStream(spawn, f"{url}/feed?topic=pool/", *bearer(secret))
    try:
        epoch = stream.next().data["data"]["epoch"]
    finally:
        stream.close()
    for beyond in (f"{epoch:x}-999-0", f"{epoch:x}-0-5"):
        status, body, _ = curl("GET", f"{url}/feed?topic=job/acme/", *bearer(secret),
                               "-H", f"Last-Event-ID: {beyond}")
        assert status == 400 and body["error"]["code"] == "invalid"
        assert body["error"]["message"] == (f"Last-Event-ID: {beyond} is beyond the present "
                                            f"({epoch:x}-0-0): resume from a cursor the feed "
                                            "gave, or without one")


def test_after_a_retention_reload_both_transports_say_the_same_is_lost(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir, "[feed]\nretention = 50\n")
    place(controller, "job-a", "alpha", *["h1"] * 20)
    sender = Sender(FakeAgent(ctx, controller))
    for rank in range(20):
        sender.send(advice("job-a", rank))
    controller.config.write_text(controller.config.read_text().replace(
        "retention = 50", "retention = 5"))
    controller.request("reload")
    sock = tenant_socket(ctx, controller, "alpha")
    topic = "job/alpha/job-a/"
    sock.send(encode(m.Subscribe(("job/alpha/",), (m.Position(topic, 0),), epoch=0),
                     sender="t", seq=1))
    over_zeromq: list[int] = []
    subscribed: m.Subscribed | None = None
    while sock.poll(1000):
        frame_topic, frame = sock.recv_multipart()
        envelope = decode(frame)
        if not frame_topic:
            subscribed = envelope.body
        else:
            over_zeromq.append(envelope.seq)
    assert subscribed is not None
    (newest,) = subscribed.positions
    kept = list(range(newest.seq - 4, newest.seq + 1))  # the new retention: 5
    assert subscribed.oldest == (m.Position(topic, kept[0]),)
    stream = CurlStream(spawn, f"{url}/feed?topic=job/alpha/",
                        *bearer(token(controller, "alpha")),
                        "-H", f"Last-Event-ID: {subscribed.epoch:x}-0-0")
    try:
        events = [stream.next() for _ in range(1 + 1 + len(kept))]
    finally:
        stream.close()
    assert [e.kind for e in events[:2]] == ["subscribed", "gap"]
    assert events[1].data["data"]["topics"] == [topic]
    over_http = [e.data["seq"] for e in events[2:]]
    assert over_zeromq == over_http == kept


def test_an_unplaced_jobs_health_is_not_sent_to_new_subscribers(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    fast = "[feed]\nrepublish = 0.5\n"
    controller = start_controller(spawn, workdir, fast)
    place(controller, "job-a", "acme", "h1")
    place(controller, "job-b", "acme", "h1")
    sender = Sender(FakeAgent(ctx, controller))
    sender.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8)))
    with tenant_feed(controller, ["job/acme/"], context=ctx) as feed:
        present = {feed.recv(timeout=20).topic for _ in range(2)}  # type: ignore[union-attr]
    assert present == {"job/acme/job-a/", "job/acme/job-b/"}
    controller.request("unplace", {"job": "job-a"})
    for restart in (False, True):
        if restart:  # what the database kept does not bring it back either
            ports = (int(controller.listen.rsplit(":", 1)[1]),
                     int(controller.feed.rsplit(":", 1)[1]))
            controller.proc.send_signal(signal.SIGTERM)
            controller.proc.wait(timeout=30)
            controller = start_controller(spawn, workdir, fast, ports=ports)
        sock = tenant_socket(ctx, controller, "acme")
        try:
            sock.send(encode(m.Subscribe(("job/acme/",)), sender="t", seq=1))
            assert sock.poll(10_000)
            assert sock.recv_multipart()[0] == b""  # subscribed, then the present
            topics = []
            for _ in range(3):  # the present, then republications: job-b's only
                assert sock.poll(10_000)
                topics.append(sock.recv_multipart()[0])
            assert topics == [b"job/acme/job-b/"] * 3
        finally:
            sock.close()


def test_a_readable_envelope_with_a_bad_body_is_invalid_even_as_request_0(
        spawn: Spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller = start_controller(spawn, workdir)
    sock = tenant_socket(ctx, controller, "acme")
    bad_body = encode(m.Subscribe(("pool/",)), sender="t", seq=0).replace(b"topics",
                                                                           b"topicz")
    unknown_kind = msgpack.packb(["hz", 1, "no-such-kind", "t", 7, 1.0, {}])
    for frame in (bad_body, unknown_kind, b"\xc1not msgpack"):
        sock.send(frame)
    replies = answers(sock)
    assert [(r.request, r.code) for r in replies] == [  # type: ignore[attr-defined]
        (0, "invalid"), (7, "invalid"), (0, "malformed")]


def test_a_notice_in_the_body_that_differs_from_the_path_is_refused(spawn: Spawn,
                                                                    workdir: Path) -> None:
    controller, url = gateway(spawn, workdir)
    secret = token(controller, "acme")
    status, body, _ = curl("POST", f"{url}/notices/vn-0123", *bearer(secret),
                           body={"action": "approve", "notice": "vn-4567"})
    assert status == 400 and body["error"] == {
        "code": "invalid", "field": "validation-answer.notice",
        "message": "validation-answer.notice: 'vn-4567' differs from the path's notice "
                   "'vn-0123': leave it out"}
    status, body, _ = curl("POST", f"{url}/notices/vn-0123", *bearer(secret),
                           body={"action": "approve", "notice": "vn-0123"})
    assert status == 404 and body["error"]["code"] == "no-such-notice"  # the same: fine


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "tenant-guide.md"


def test_the_stale_revision_refusal_in_the_guide_is_the_servers(spawn: Spawn,
                                                                workdir: Path) -> None:
    quoted = re.findall(r"`(revision (\d+) is older than revision (\d+) in force[^`]*)`",
                        " ".join(GUIDE.read_text().split()))  # as one line
    assert quoted, "the guide quotes the stale-revision refusal"
    controller, url = gateway(spawn, workdir)
    place(controller, "job-7", "acme", "h1")
    secret = token(controller, "acme")
    for text, older, newer in quoted:
        status, _, _ = curl("POST", f"{url}/declarations", *bearer(secret),
                            body={"job": "job-7", "revision": int(newer)})
        assert status == 200
        status, body, _ = curl("POST", f"{url}/declarations", *bearer(secret),
                               body={"job": "job-7", "revision": int(older)})
        assert status == 409 and body["error"]["message"] == text
