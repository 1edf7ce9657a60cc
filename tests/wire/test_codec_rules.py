"""The wire codec at its limits and in its words: exact boundaries, and the one
line each kind of bad frame is refused with."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pytest

from harmonaize import messages as m
from harmonaize.messages import MAX_FRAME, MAX_MAP, WireError, core, decode, encode

pytestmark = [pytest.mark.foundation, pytest.mark.hardening]


def frame(kind: str, body: object, *, seq: int = 5, magic: str = "hz") -> bytes:
    return msgpack.packb([magic, 1, kind, "host-1", seq, 1000.0, body], use_bin_type=True)


def refused(data: object, **kwargs: object) -> str:
    with pytest.raises(WireError) as caught:
        decode(data, **kwargs)  # type: ignore[arg-type]
    return str(caught.value)


def subscribe_of_size(size: int) -> m.Subscribe:
    """A subscription whose frame is exactly ``size`` bytes (topics grown a byte at a time,
    all below 256 characters, so each added character adds one byte)."""
    lengths = [200] * 1024

    def build() -> m.Subscribe:
        return m.Subscribe(("pool/",), tuple(m.Position(f"{i:04d}" + "t" * (n - 4), i)
                                              for i, n in enumerate(lengths)))

    short = size - len(encode(build(), sender="h", seq=1, now=1.0))
    assert 0 <= short <= 1024 * 50, short
    for i in range(short):
        lengths[i % 1024] += 1
    body = build()
    assert len(encode(body, sender="h", seq=1, now=1.0)) == size
    return body


def test_the_frame_limit_is_exact_both_ways() -> None:
    at_limit = subscribe_of_size(MAX_FRAME)
    data = encode(at_limit, sender="h", seq=1, now=1.0)
    assert len(data) == MAX_FRAME
    assert decode(data).body == at_limit
    bigger = m.Subscribe(at_limit.topics, (*at_limit.since[:-1], m.Position(
        at_limit.since[-1].topic + "y", at_limit.since[-1].seq)))
    with pytest.raises(WireError, match=f"frame of {MAX_FRAME + 1} bytes exceeds {MAX_FRAME}"):
        encode(bigger, sender="h", seq=1, now=1.0)
    assert refused(data + b"\0") == f"frame of {MAX_FRAME + 1} bytes exceeds {MAX_FRAME}"


def test_each_bad_frame_has_its_own_line() -> None:
    assert refused("text") == "frame must be bytes"
    assert refused(b"") == "empty frame"
    assert refused(msgpack.packb([1, 2, 3])) == "frame is not a 7-element envelope"
    assert refused(frame("ack", {"seq": 1}, magic="xx")) == "bad magic: not a HarmonAIze frame"
    assert refused(frame("no-such", {})) == "unknown message kind 'no-such'"
    assert refused(frame("ack", {"seq": 1}), allowed={"hello"}) == (
        "message kind 'ack' is not accepted here")
    # Keys that are not strings, bytes, and oversized maps stop in the msgpack layer.
    assert refused(frame("ack", {1: 1})).startswith("not a valid msgpack frame")
    assert refused(frame("goodbye", {"reason": b"x"})).startswith("not a valid msgpack frame")
    wide = {"seq": 1, **{f"k{i}": 0 for i in range(MAX_MAP)}}
    assert refused(frame("ack", wide)).startswith("not a valid msgpack frame")


def test_a_body_error_carries_the_frames_sequence_number() -> None:
    with pytest.raises(WireError) as caught:
        decode(frame("job-declaration", {"job": "j", "max_validation_pause": -1}, seq=42))
    assert caught.value.seq == 42 and "max_validation_pause" in str(caught.value)
    with pytest.raises(WireError) as header:
        decode(msgpack.packb(["hz", 1, "ack", "", 7, 1.0, {"seq": 1}]))
    assert header.value.seq == 0  # the envelope itself was unreadable


def test_strict_decoding_decodes_what_is_known_and_names_what_is_not() -> None:
    declaration = m.JobDeclaration("j", 60.0, revision=3)
    data = encode(declaration, sender="t", seq=9, now=5.0)
    envelope = decode(data, strict=True)
    assert (envelope.body, envelope.seq, envelope.sender) == (declaration, 9, "t")
    typo = frame("job-declaration", {"job": "j", "max_validation_paus": 1})
    assert decode(typo).body == m.JobDeclaration("j")  # lenient: a newer peer's field
    assert refused(typo, strict=True) == "job-declaration.max_validation_paus: unknown key"


def test_buckets_include_both_edges() -> None:
    span = m.Bucket(4, 7)
    assert [v in span for v in (3, 4, 7, 8)] == [False, True, True, False]
    assert 10**9 in m.Bucket(8192, None) and 8191 not in m.Bucket(8192, None)


def test_tuning_ranges_say_what_is_wrong() -> None:
    def tuning_range(**kwargs: object) -> m.TuningRange:
        args = {"collectives": (m.Collective.ALLREDUCE,), "algorithms": (m.Algorithm.RING,),
                "protocols": (m.Protocol.SIMPLE,), **kwargs}
        return m.TuningRange(**args)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=r"^max_bytes must be above min_bytes$"):
        tuning_range(min_bytes=4096, max_bytes=4096)
    with pytest.raises(ValueError, match=r"^max_channels must be at least min_channels$"):
        tuning_range(min_channels=4, max_channels=3)
    assert tuning_range(min_channels=4, max_channels=4).max_channels == 4
    with pytest.raises(ValueError, match=r"^algorithms lists a value twice$"):
        tuning_range(algorithms=(m.Algorithm.RING, m.Algorithm.RING))


def test_a_kind_is_registered_once_with_its_category(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "_REGISTRY", dict(core._REGISTRY))

    @m.message("test-probe", m.Category.EVENT)
    @dataclass(frozen=True)
    class Probe(m.Message):
        n: int = 0

    assert (Probe.KIND, Probe.CATEGORY) == ("test-probe", m.Category.EVENT)
    assert m.kinds()["test-probe"] is Probe
    assert decode(encode(Probe(3), sender="h")).body == Probe(3)
    with pytest.raises(ValueError, match=r"^message kind 'test-probe' registered twice$"):
        m.message("test-probe", m.Category.EVENT)(Probe)
