"""A takeover's restore builds each distinct host summary once: the stored hosts and the
host records of the commits since the snapshot decode equal summaries to one shared
(frozen) object, equal to what was written. Before, every host and every record
checked and built its own, which dominated a large region's restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.bus import codec
from controller.cluster import HostRecord
from controller.outputs import Writes
from controller.store import Store
from harmonaize import messages as m

pytestmark = pytest.mark.cluster


def _summary(healthy: int) -> m.HostSummary:
    return m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=healthy,
                                                             suspect=8 - healthy))


def _records(count: int) -> tuple[HostRecord, ...]:
    # Distinct objects, two distinct values: as a region's agents send them.
    return tuple(HostRecord(f"h{i}", "p", "H200", 8, "t", 1, i, alive=True,
                            summary=_summary(8 - i % 2)) for i in range(count))


def test_a_commits_equal_summaries_decode_to_one_object() -> None:
    written = _records(6)
    read = codec.decode(codec.encode(codec.Commit(Writes(hosts=written), 7))).writes.hosts
    assert read == written
    assert len({id(r.summary) for r in read}) == 2
    assert {r.summary for r in read} == {_summary(8), _summary(7)}


def test_stored_equal_summaries_load_as_one_object(tmp_path: Path) -> None:
    store = Store(tmp_path / "mirror.db", durable=False)
    try:
        store.commit(Writes(hosts=_records(6)))
        loaded = sorted(store.load_hosts(), key=lambda r: r.host_id)
        assert [r.summary for r in loaded] == [r.summary for r in _records(6)]
        assert len({id(r.summary) for r in loaded}) == 2
    finally:
        store.close()


def test_a_summary_that_fails_its_check_is_not_remembered() -> None:
    bad = codec.encode(codec.Commit(Writes(hosts=_records(1)), 1)).replace(
        b"\xa7healthy", b"\xa7healthx")
    for _ in range(2):  # raised each time, not taken from a memo the second
        with pytest.raises(codec.CodecError):
            codec.decode(bad)
