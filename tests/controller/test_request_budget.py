"""Item 9, as a property of the core alone: whatever a tenant sends (valid requests,
invalid ones, frames that are not frames), in whatever rhythm, it gets no more answers
than its request budget allows, and every request it did not get an answer to is
counted as throttled. Over real sockets: tests/controller/test_tenant_requests.py."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core import ControllerCore
from controller.outputs import AnswerTenant, BadFrame, TenantPeer
from harmonaize import messages as m
from harmonaize.messages import TENANT_KINDS, Envelope, WireError, decode, encode
from tests.controller.test_core_with_outbox import config

pytestmark = pytest.mark.hardening

RATE, BURST = 5.0, 20.0
PEER = TenantPeer(b"z1", "acme")


def frame(kind: str, number: int) -> bytes:
    """One request of the tenant's, valid or not, as it comes off the wire."""
    if kind == "subscribe":
        return encode(m.Subscribe(("pool/", "job/acme/")), sender="t", seq=number)
    if kind == "declaration":
        return encode(m.JobDeclaration("job-1", 1), sender="t", seq=number)
    if kind == "bad-body":
        return encode(m.Subscribe(("pool/",)), sender="t", seq=number).replace(b"topics",
                                                                                b"topicz")
    if kind == "unknown-kind":
        return msgpack.packb(["hz", 1, "no-such-kind", "t", number, 1.0, {}])
    return b"\xc1 not msgpack"


def decoded(data: bytes) -> Envelope | BadFrame:
    """What the shell hands the core (controller/sockets.py's decoded)."""
    try:
        return decode(data, allowed=TENANT_KINDS, strict=True)
    except WireError as exc:
        return BadFrame("invalid", str(exc), exc.seq, exc.readable)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["subscribe", "declaration", "bad-body",
                                           "unknown-kind", "garbage"]),
                          st.sampled_from([0.0, 0.0, 0.001, 0.05, 0.3, 2.0])),
                min_size=1, max_size=400))
def test_no_request_valid_or_not_is_answered_beyond_the_budget(
        requests: list[tuple[str, float]]) -> None:
    core = ControllerCore(config(feed={"request_rate": RATE, "request_burst": BURST}), 0.0)
    now, answers = 0.0, 0
    for number, (kind, pause) in enumerate(requests, 1):
        now += pause
        out = core.receive(PEER, decoded(frame(kind, number)), now)
        answers += sum(1 for o in out if isinstance(o, AnswerTenant) and o.peer == PEER.peer)
    stats = core.feed.stats
    assert stats["requests"] == len(requests)
    assert answers == len(requests) - stats["throttled_requests"]
    assert answers <= BURST + RATE * now
