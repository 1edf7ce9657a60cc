"""The wire vocabulary: round trips, limits, and hostile input."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harmonaize import messages as m
from harmonaize.messages import WireError, decode, encode
from harmonaize.schema import validated

pytestmark = pytest.mark.foundation

CONDITION = m.Condition("MemoryPressure", m.Status.TRUE, "LowAvailableMemory", "3% free",
                        m.Severity.WARNING, 1_700_000_000.0)
SAMPLES: list[m.Message] = [
    m.Hello(pool="p1", gpu_class="H200", gpus=8, version="0.1.0", epoch=12, acked=3,
            heartbeat=1.0),
    m.Heartbeat(uptime=12.5, last_seq=4),
    m.HostSummary(m.Health.DEGRADED, True, m.GpuCounts(6, 1, 0, 1, 0, 4), (CONDITION,),
                  (m.LinkHealth("data", 4, 1, m.Level.HIGH, m.Level.LOW),)),
    m.JobAdvisory("job-7", m.Advice.CHECKPOINT_NOW, "gpu-memory", m.Urgency.HIGH, ("3", "4")),
    m.JobHealth("job-7", ("3",), ("4", "5"), m.Level.LOW, 2, "congested",
                m.TuningStatus.PAUSED),
    m.HostEvent("XidObserved", m.Severity.CRITICAL, "xid 79"),
    m.Goodbye("stopping"),
    m.ValidationNotice("job-7", ("3",), 120, 1_700_000_030.0, "vn-00ff", 1_700_000_030.0,
                       m.NoticeStatus.SCHEDULED, 600.0),
    m.ValidationDecision("v18c-3", "job-7", approve=True),
    m.ValidationDecision("v18c-4", "job-7", start=1_700_001_800.0),
    m.ValidationNotice("job-7", ("3",), 120, 1_700_000_030.0, "v18c-4", 1_700_000_030.0,
                       cause=m.ValidationCause.UNCORRECTABLE_MEMORY),
    m.JobDeclaration("job-7", 300.0, revision=3, checkpoint_every=1800.0,
                     last_checkpoint=1_700_000_000.0),
    m.ValidationAnswer("vn-00ff", m.NoticeAction.DEFER, 300.0),
    m.Ack(41),
    m.JobDeclaration("job-7", 300.0, (m.TuningRange(
        (m.Collective.ALLREDUCE,), (m.Algorithm.RING, m.Algorithm.TREE),
        (m.Protocol.SIMPLE,), 1 << 20, 1 << 30, 2, 16),), m.BulkTraffic(1000.0, (443,), (8,)), 2),
    m.TuningArm("job-7", 4, "congested", "0123abcd", (m.Activation(17, 12_000),)),
    m.TuningResolve("job-7", 4, True, (m.Activation(17, 12_000),)),
    m.TuningReport("job-7", "0123abcd", "congested", 2, (m.CommReport(
        17, 8, 2, 4, 11_400, 11_500, 40.0, "default", 0, False,
        m.SwitchState(1, 2**61, 7, 9000, 11_500), m.SwitchState(), 0, 0, False),)),
    m.TuningAck("job-7", 4, m.AckPhase.ARMED, "", ()),
    m.Subscribe(("pool/", "job/acme/"), (m.Position("pool/p1/H200", 41),)),
    m.Subscribed("acme", ("pool/",), (m.Refusal("job/", "too broad", "too-broad"),),
                 (m.Position("pool/p1/H200", 42),), 30.0),
    m.Reply(3, False, "no job 'j' of yours is placed", "not-placed"),
    m.Resync("who are you"),
    m.PoolCapacity("p1", "H200", m.Bucket(4, 7), m.Bucket(0, 0), m.Bucket(32, 63),
                   m.Trend.RISING, 3),
    m.JobRankProgress("job-7", (m.CommProgress(
        17, 8, 4, 1200, 1202, 3.5, m.Finding.HANG, m.Cause.PROCESS_NOT_RUNNING,
        (m.RankProgress("3", 1200, m.ProcessState.STOPPED, m.Cause.PROCESS_NOT_RUNNING),),
        12.5),), 10.0),
    m.JobProgress("job-7", 17, m.Finding.HANG, m.ProgressState.ACTIVE, ("3",),
                  m.Cause.PROCESS_NOT_RUNNING, 1201, 1_700_000_030.0),
    m.ApplicationXid("job-7", 31, m.Fault.MEMORY_MANAGEMENT, ("3",), False, 12.0),
    m.NegotiationPropose("r1", "p1", "H200", 2, 4, 1_700_000_600.0, 1_700_003_600.0, 3600.0,
                         m.Flexible.COUNT),
    m.NegotiationCounter("r1", "of-0123", "p1", "H200", 1, 2, 1_700_000_600.0,
                         1_700_003_600.0, 1800.0),
    m.NegotiationAccept("r1", "of-0123"),
    m.NegotiationReject("r1", "of-0123"),
    m.NegotiationRelease("r1"),
    m.NegotiationList(),
    m.MaintenanceCounter("vn-00ff", (1_700_001_800.0, 1_700_005_400.0)),
    m.NegotiationExpired("r1", "hold", 1_700_004_500.0, 28_800.0),
    m.Reply(5, True, negotiation=(m.Negotiated(
        m.Outcome.COUNTER, "r1", "of-0123", 2, 1_700_000_600.0, 1_700_004_200.0,
        1_700_000_120.0, 1, departs="count"),)),
]


def test_every_kind_has_a_sample() -> None:
    assert {s.KIND for s in SAMPLES} == set(m.kinds())


@pytest.mark.parametrize("body", SAMPLES, ids=lambda b: b.KIND)
def test_round_trip(body: m.Message) -> None:
    envelope = decode(encode(body, sender="host-1", seq=7, now=1000.0))
    assert envelope.body == body
    assert (envelope.kind, envelope.sender, envelope.seq, envelope.time) == (
        body.KIND, "host-1", 7, 1000.0)
    assert validated(body) == body


def test_categories_separate_conditions_from_events() -> None:
    assert m.HostSummary.CATEGORY is m.Category.CONDITION
    assert m.PoolCapacity.CATEGORY is m.Category.CONDITION
    assert m.HostEvent.CATEGORY is m.Category.EVENT
    assert m.Heartbeat.CATEGORY is m.Category.CONTROL


def frame(*parts: object) -> bytes:
    return msgpack.packb(list(parts), use_bin_type=True)


GOOD_BODY = {"reason": "x"}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty frame"),
        (b"\xc1", "not a valid msgpack"),
        (b"\x92\x01", "not a valid msgpack"),
        (frame("hz", 1, "goodbye", "h", 0, 1.0, GOOD_BODY) + b"\x00", "not a valid msgpack"),
        (msgpack.packb({"a": 1}), "7-element envelope"),
        (frame("xx", 1, "goodbye", "h", 0, 1.0, GOOD_BODY), "bad magic"),
        (frame("hz", 2, "goodbye", "h", 0, 1.0, GOOD_BODY), "unsupported wire version"),
        (frame("hz", True, "goodbye", "h", 0, 1.0, GOOD_BODY), "unsupported wire version"),
        (frame("hz", 1, "launch-missiles", "h", 0, 1.0, {}), "unknown message kind"),
        (frame("hz", 1, "goodbye", "", 0, 1.0, GOOD_BODY), "envelope.sender"),
        (frame("hz", 1, "goodbye", "h/../x", 0, 1.0, GOOD_BODY), "envelope.sender"),
        (frame("hz", 1, "goodbye", "h", -1, 1.0, GOOD_BODY), "envelope.seq"),
        (frame("hz", 1, "goodbye", "h", 0, math.nan, GOOD_BODY), "envelope.time"),
        (frame("hz", 1, "goodbye", "h", 0, 1.0, [1]), "expected a map"),
        (frame("hz", 1, "ack", "h", 0, 1.0, {}), "ack.seq: required field is missing"),
        (frame("hz", 1, "ack", "h", 0, 1.0, {"seq": "1"}), "ack.seq: expected an integer"),
        (frame("hz", 1, "ack", "h", 0, 1.0, {"seq": True}), "ack.seq: expected an integer"),
        (frame("hz", 1, "ack", "h", 0, 1.0, {"seq": 2**63}), "above the maximum"),
        (frame("hz", 1, "goodbye", "h", 0, 1.0, {"reason": "x" * 2000}), "string too long"),
        (frame("hz", 1, "goodbye", "h", 0, 1.0, {"reason": b"bytes"}), "not a valid msgpack"),
        (frame("hz", 1, "goodbye", "h", 0, 1.0, {"reason": "x", "extra": [[[[[[[[[1]]]]]]]]]}),
         "nested deeper"),
        (frame("hz", 1, "host-summary", "h", 1, 1.0,
               {"health": "melting", "schedulable": True}),
         "host-summary.health: 'melting' is not one of"),
        (frame("hz", 1, "host-summary", "h", 1, 1.0,
               {"health": "healthy", "schedulable": True,
                "conditions": [{"type": "A", "status": "True"}] * 65}),
         "list too long"),
        (frame("hz", 1, "host-summary", "h", 1, 1.0,
               {"health": "healthy", "schedulable": True,
                "conditions": [{"type": "A", "status": "maybe"}]}),
         "host-summary.conditions[0].status"),
        (frame("hz", 1, "pool-capacity", "c", 1, 1.0,
               {"pool": "p", "gpu_class": "g", "hosts_up": {"lo": 5, "hi": 1},
                "hosts_down": {"lo": 0, "hi": 0}, "gpus_available": {"lo": 0, "hi": None},
                "trend": "steady", "revision": 1}),
         "upper bound"),
        (msgpack.packb(["hz", 1, "goodbye", "h", 0, 1.0, {"reason": "x" * 5000}]),
         "not a valid msgpack"),
        (msgpack.packb(list(range(2000))), "not a valid msgpack"),
        (b"\xd4\x01\x01", "not a valid msgpack"),  # an ext type
    ],
)
def test_rejects_with_a_clear_message(data: bytes, needle: str) -> None:
    with pytest.raises(WireError, match=None) as info:
        decode(data)
    assert needle in str(info.value)


def test_rejects_oversized_frames_before_parsing() -> None:
    with pytest.raises(WireError, match="exceeds"):
        decode(b"\x00" * (m.MAX_FRAME + 1))


def test_allowed_kinds_are_enforced() -> None:
    data = encode(m.Ack(1), sender="controller")
    assert decode(data, allowed={"ack"}).body == m.Ack(1)
    with pytest.raises(WireError, match="not accepted here"):
        decode(data, allowed=m.AGENT_KINDS)


def test_unknown_fields_from_a_newer_peer_are_ignored() -> None:
    data = frame("hz", 1, "ack", "c", 0, 1.0, {"seq": 3, "future_field": {"a": [1, 2]}})
    assert decode(data).body == m.Ack(3)


def test_encode_refuses_frames_over_the_limit() -> None:
    huge = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(), tuple(
        m.Condition(f"C{i}", m.Status.TRUE, message="x" * 1000) for i in range(300)))
    with pytest.raises(WireError, match="exceeds"):
        encode(huge, sender="h")


def test_bucket_rendering() -> None:
    assert str(m.Bucket(0, 0)) == "0"
    assert str(m.Bucket(4, 7)) == "4-7"
    assert str(m.Bucket(64, None)) == "64+"
    assert 5 in m.Bucket(4, 7) and 8 not in m.Bucket(4, 7)


def _decode_only_wire_errors(data: bytes) -> None:
    try:
        envelope = decode(data)
    except WireError:
        return
    assert envelope.kind in m.kinds()
    # Whatever decodes must survive a round trip unchanged.
    assert decode(encode(envelope.body, sender=envelope.sender, seq=envelope.seq,
                         now=envelope.time)).body == envelope.body


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_wire_errors(data: bytes) -> None:
    _decode_only_wire_errors(data)


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(m.kinds())),
    st.dictionaries(st.text(max_size=15), plain, max_size=8),
    plain,
)
def test_random_structures_raise_only_wire_errors(kind: str, body: dict, noise: object) -> None:
    _decode_only_wire_errors(frame("hz", 1, kind, "h", 1, 1.0, body))
    _decode_only_wire_errors(frame("hz", 1, kind, noise, 1, 1.0, body))
    _decode_only_wire_errors(msgpack.packb(noise, use_bin_type=True))


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 10_000),
)
def test_mutated_frames_raise_only_wire_errors(
    body: m.Message, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(encode(body, sender="host-1", seq=3, now=5.0))
    for position, value in flips:
        data[position % len(data)] = value
    _decode_only_wire_errors(bytes(data))
    _decode_only_wire_errors(bytes(data[: cut % (len(data) + 1)]))
