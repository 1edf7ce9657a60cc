"""A host's GPU counts on the wire (harmonaize/messages/host.py): what the controller
adds up for capacity. ``total`` counts every state once; ``available`` offers only GPUs in
service (healthy or suspect) that no tenant's process holds, never fewer than none."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harmonaize.messages import GpuCounts, Health, HostSummary, decode, encode

pytestmark = [pytest.mark.foundation, pytest.mark.architecture]

counts = st.integers(min_value=0, max_value=64)


def test_a_hosts_gpu_counts_total_every_state_once() -> None:
    gpus = GpuCounts(healthy=1, suspect=2, validating=4, quarantined=8, lost=16, in_use=3)
    assert gpus.total == 31
    assert GpuCounts().total == 0


def test_only_idle_gpus_in_service_are_available() -> None:
    assert GpuCounts(healthy=4, suspect=2, validating=1, quarantined=1, lost=1).available == 6
    assert GpuCounts(healthy=4, suspect=2, in_use=5).available == 1
    # Busy GPUs may include quarantined ones: never below none.
    assert GpuCounts(healthy=1, quarantined=3, in_use=3).available == 0


@given(counts, counts, counts, counts, counts, counts)
@example(0, 0, 1, 1, 1, 3)
def test_gpu_counts_survive_the_wire_and_available_never_exceeds_total(
        healthy: int, suspect: int, validating: int, quarantined: int, lost: int,
        in_use: int) -> None:
    gpus = GpuCounts(healthy, suspect, validating, quarantined, lost, in_use)
    body = decode(encode(HostSummary(Health.HEALTHY, True, gpus), sender="h1")).body
    assert isinstance(body, HostSummary)
    assert body.gpus == gpus
    assert 0 <= gpus.available <= healthy + suspect <= gpus.total
