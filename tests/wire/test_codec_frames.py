"""The codec of the wire (harmonaize/messages/codec.py): what a frame carries, how a refusal
names the request it refuses, and the audit of what tenants are sent (the suite's check
against the published spec rests on it)."""

from __future__ import annotations

import msgpack
import pytest

from harmonaize import messages as m
from harmonaize.messages import WireError, codec, decode, encode
from harmonaize.schema import to_plain

pytestmark = [pytest.mark.foundation, pytest.mark.architecture]


def frame(kind: object, body: object, *, seq: int = 5) -> bytes:
    return msgpack.packb(["hz", 1, kind, "host-1", seq, 1000.0, body], use_bin_type=True)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, object]] = []

    def __call__(self, kind: str, sender: str, plain: object) -> None:
        self.seen.append((kind, sender, plain))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    hook = Recorder()
    monkeypatch.setattr(codec, "audit_hook", hook)
    return hook


def test_a_frame_carries_its_kind_sender_number_and_time() -> None:
    body = m.Goodbye("bye")
    envelope = decode(encode(body, sender="h1", seq=7, now=1234.5))
    assert (envelope.kind, envelope.sender, envelope.seq, envelope.time) == (
        "goodbye", "h1", 7, 1234.5)
    assert envelope.category is m.Category.CONTROL and envelope.body == body
    assert decode(encode(body, sender="h1")).seq == 0  # unnumbered unless told


def test_a_refused_kind_names_the_request_it_refuses() -> None:
    for data, allowed in ((frame("no-such", {}, seq=11), None),
                          (frame("ack", {"seq": 1}, seq=11), {"hello"})):
        with pytest.raises(WireError) as caught:
            decode(data, allowed=allowed)
        assert (caught.value.seq, caught.value.readable) == (11, True)
    with pytest.raises(WireError) as unreadable:
        decode(b"\xc1")
    assert (unreadable.value.seq, unreadable.value.readable) == (0, False)


def test_a_kind_that_is_not_a_string_is_an_unknown_kind() -> None:
    for kind in ([1], {"k": 1}, 7, None):
        with pytest.raises(WireError, match="unknown message kind") as caught:
            decode(frame(kind, {}, seq=3))
        assert caught.value.seq == 3


def test_only_what_tenants_send_or_receive_is_audited(recorder: Recorder) -> None:
    capacity = m.PoolCapacity("p", "h100", m.Bucket(1, 1), m.Bucket(0, 0), m.Bucket(8, 8),
                              m.Trend.STEADY, 1)
    encode(capacity, sender="controller", seq=1)
    encode(m.Heartbeat(1.0, 1), sender="h1", seq=2)  # agent to controller: not tenants'
    encode(m.Subscribe(("pool/",)), sender="tenant", seq=3)
    assert recorder.seen == [("pool-capacity", "controller", to_plain(capacity)),
                             ("subscribe", "tenant", {"topics": ["pool/"], "since": [],
                                                      "epoch": 0})]
    assert codec.auditing()
    codec.audit("cloudevent", "gateway", {"id": "1"})
    assert recorder.seen[-1] == ("cloudevent", "gateway", {"id": "1"})


def test_with_no_audit_hook_nothing_is_recorded_and_encoding_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "audit_hook", None)
    assert not codec.auditing()
    codec.audit("cloudevent", "gateway", {"id": "1"})  # a no-op, not an error
    assert decode(encode(m.Subscribe(("pool/",)), sender="t")).kind == "subscribe"
