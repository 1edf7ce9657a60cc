"""The Node.js client (tests/clients/node), written from the docs and the spec alone,
negotiates a reservation in rounds with a real controller: every answer read off the reply
as the spec describes it (and checked against its schemas), a bad one refused with its
field named."""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

import pytest
import zmq

from tests.conftest import needs_root
from tests.controller.negotiation.test_wire import heartbeats
from tests.controller.test_feed import SUMMARY, Sender
from tests.daemons import FakeAgent, start_controller
from tests.daemons import wait_until as wait
from tests.nodefeed import CLIENT, NodeFeed, no_violations

pytestmark = [pytest.mark.tenant, pytest.mark.negotiation, needs_root]


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with the client's packages installed by ./scripts/setup."""
    binary = shutil.which("node")
    if binary is None or not (CLIENT / "node_modules" / "zeromq").is_dir():
        pytest.fail("the Node.js client is not installed: run ./scripts/setup", pytrace=False)
    return binary


def test_the_node_client_negotiates_a_reservation_in_rounds(
    spawn, node: str, workdir: Any, ctx: zmq.Context
) -> None:
    """propose → counter → counter back → offer → accept → hold."""
    controller = start_controller(spawn, workdir,
                                  "[negotiation]\nweights = { acme = 1.0, globex = 1.0 }\n")
    sender = Sender(FakeAgent(ctx, controller, "h1"))
    sender.send(SUMMARY)
    stop = threading.Event()  # the host stays up while the tenant negotiates
    beating = threading.Thread(target=heartbeats, args=(sender, stop), daemon=True)
    beating.start()
    try:
        negotiate_in_rounds(spawn, node, controller)
    finally:
        stop.set()
        beating.join(timeout=10)


def negotiate_in_rounds(spawn: Any, node: str, controller: Any) -> None:
    wait(lambda: controller.request("capacity"), 30, "the pool's release")
    ours = NodeFeed(spawn, node, controller, ["pool/"])
    ours.wait_for("subscribed")
    start = time.time() + 7200
    window = {"pool": "p", "gpu_class": "H200", "earliest_start": start,
              "latest_start": start + 3600, "duration": 3600}
    first = ours.ask("propose", cmd="negotiate", step="propose", body={
        "request_id": "n1", "min_count": 12, "max_count": 15, "flexibility": "count",
        **window})
    assert first["ok"] is True, (first["code"], first["error"])
    (counter,) = first["negotiation"]
    assert counter["outcome"] == "counter" and counter["departs"] == "count"
    share = counter["count"]
    assert 1 <= share < 12
    second = ours.ask("counter", cmd="negotiate", step="counter", body={
        "request_id": "n1", "offer_id": counter["offer_id"], "min_count": 1,
        "max_count": share, **window})
    (offer,) = second["negotiation"]
    assert (offer["outcome"], offer["count"], offer["round"]) == ("offer", share, 2)
    held = ours.ask("accept", cmd="negotiate", step="accept", body={
        "request_id": "n1", "offer_id": offer["offer_id"]})
    assert [(h["outcome"], h["count"]) for h in held["negotiation"]] == [("hold", share)]
    listed = ours.ask("list", cmd="negotiate", step="list", body={})
    assert [(n["request_id"], n["outcome"]) for n in listed["negotiation"]] == [("n1", "hold")]
    assert [h["id"] for h in controller.request("holds")] == ["acme/n1"]
    bad = ours.ask("bad", cmd="negotiate", step="accept", body={
        "request_id": "n1", "offer_id": counter["offer_id"]})
    assert (bad["ok"], bad["code"]) == (False, "invalid")
    assert bad["error"] == "negotiation-accept.offer_id: no such offer of yours"
    no_violations(ours.quit())
