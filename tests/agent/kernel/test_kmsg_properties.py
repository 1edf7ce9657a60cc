"""Whatever a process manages to put in the kernel log source, the reader returns
without raising, within its bounds, and only the kernel's own XID records."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.kernel.kmsg import KmsgSource, kmsg_line

pytestmark = pytest.mark.jobhealth

XID_TEXT = st.builds("NVRM: Xid (PCI:0000:{:02x}:00): {}, pid={}, name=p, Ch 1".format,
                     st.integers(0, 255), st.integers(0, 200), st.integers(1, 1 << 22))


def read_all(data: bytes, **limits: int) -> tuple[list, KmsgSource]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kmsg"
        path.write_bytes(data)
        source = KmsgSource(str(path), from_start=True, **limits)
        source.open()
        try:
            found = []
            for _ in range(len(data) // 64 + 2):
                found += source.read()
        finally:
            source.close()
    return found, source


@given(st.binary(max_size=4096))
def test_any_bytes_read_without_raising(data: bytes) -> None:
    found, source = read_all(data, max_bytes=512, max_records=16)
    assert source.counts.errors == 0
    assert all(0 <= x.xid < 100_000 for x in found)


@given(st.lists(st.tuples(st.integers(0, 23), XID_TEXT), max_size=20), st.binary(max_size=64))
def test_only_records_of_the_kernels_facility_become_xids(
        records: list[tuple[int, str]], noise: bytes) -> None:
    text = "".join(kmsg_line(n + 1, message, facility=facility)
                   for n, (facility, message) in enumerate(records))
    found, source = read_all(b"#" + noise.replace(b"\n", b"") + b"\n" + text.encode())
    assert len(found) == sum(1 for facility, _ in records if facility == 0)
    assert source.counts.not_kernel == sum(1 for facility, _ in records if facility != 0)
