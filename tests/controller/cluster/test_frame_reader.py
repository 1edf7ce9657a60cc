"""The leader's frame reader: a body repeating the host's last one is taken from it, and
nothing is let through that the wire's decode would refuse."""

from __future__ import annotations

import msgpack
import pytest

from controller.bus.frames import FrameReader
from harmonaize import messages as m
from harmonaize.messages import WireError, decode, encode

pytestmark = pytest.mark.cluster

SUMMARY = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8))


def test_a_repeated_summary_is_the_last_ones_message_under_its_own_envelope() -> None:
    reader = FrameReader()
    first = reader.read("h1", encode(SUMMARY, sender="h1", seq=1, now=10.0))
    again = reader.read("h1", encode(SUMMARY, sender="h1", seq=2, now=11.0))
    assert again.body is first.body and reader.reused == 1
    assert (again.seq, again.time, again.sender) == (2, 11.0, "h1")
    changed = m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=7, suspect=1))
    third = reader.read("h1", encode(changed, sender="h1", seq=3, now=12.0))
    assert third.body == changed and reader.reused == 1
    # Another host's frame with the same body is decoded for that host.
    other = reader.read("h2", encode(SUMMARY, sender="h2", seq=1, now=12.0))
    assert other.body == SUMMARY and reader.reused == 1


def test_what_decode_refuses_is_refused_on_the_repeated_path_too() -> None:
    reader = FrameReader()
    frame = encode(SUMMARY, sender="h1", seq=1, now=10.0)
    reader.read("h1", frame)
    whole = msgpack.unpackb(frame, raw=False)
    bad_seq = msgpack.packb([*whole[:4], -1, *whole[5:]], use_bin_type=True)
    tenant_kind = encode(m.Subscribe(topics=("capacity",)), sender="h1", seq=2)
    extra = frame + b"\x00"  # one more msgpack value after the envelope
    for data in (bad_seq, tenant_kind, extra):
        with pytest.raises(WireError):
            decode(data, allowed=m.AGENT_KINDS)
        with pytest.raises(WireError):
            reader.read("h1", data)
