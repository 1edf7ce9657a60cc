"""XID events, a lost GPU, hanging calls and shutdown, as the fake NVML gives them."""

from __future__ import annotations

import pynvml
import pytest

from testbed import fakegpu
from tests.testbed.test_fake_nvml import (
    XID,
    background,
    event_set,
    fake,
    handle,
    library,
    next_event,
    state_dir,
)

pytestmark = pytest.mark.gpu

# The fake library's fixtures, from the file of its basic tests: pytest finds a
# fixture by the module's names, hence the export.
__all__ = ["background", "fake", "library", "state_dir"]


def test_xid_events_arrive_once_in_order(fake, background):
    es = event_set(0, 1)
    try:
        pending = background.submit(next_event, es, 5000)
        with pytest.raises(TimeoutError):
            pending.result(timeout=0.2)
        first = fake.inject_xid(1, 79)
        assert pending.result(timeout=10) == (1, XID, 79)
        # The same XID again, under a new id, is a second event.
        second = fake.inject_xid(1, 79)
        fake.inject_xid(0, 48)
        assert second > first
        assert [next_event(es), next_event(es)] == [(1, XID, 79), (0, XID, 48)]
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(es, 50)
    finally:
        pynvml.nvmlEventSetFree(es)


def test_xid_events_only_for_registered_gpus_and_types(fake):
    xid_set = event_set(0)
    pstate_set = event_set(0, 1, types=pynvml.nvmlEventTypePState)
    try:
        fake.inject_xid(2, 31)
        fake.inject_xid(0, 63)
        assert next_event(xid_set) == (0, XID, 63)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(xid_set, 30)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(pstate_set, 30)
        supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle(0))
        assert supported & XID
    finally:
        pynvml.nvmlEventSetFree(xid_set)
        pynvml.nvmlEventSetFree(pstate_set)


def test_lost_gpu(fake, background):
    es = event_set(2)
    try:
        waiting = background.submit(next_event, es, 5000)
        h = handle(2)
        fake.lose(2)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            waiting.result(timeout=10)
        for call in (
            lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
            lambda: pynvml.nvmlDeviceGetFieldValues(h, [230]),
            lambda: pynvml.nvmlDeviceGetUUID(h),
            lambda: handle(2),
        ):
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                call()
        # The other GPUs still answer.
        assert pynvml.nvmlDeviceGetTemperature(handle(1), pynvml.NVML_TEMPERATURE_GPU) == 34
        fake.lose(2, lost=False)
        assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 34
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(es, 20)
    finally:
        pynvml.nvmlEventSetFree(es)


def test_hanging_call_blocks_until_released(fake, background):
    fake.set(1, temperature=77)
    h = handle(1)
    fake.hang(1, "nvmlDeviceGetTemperature")
    blocked = background.submit(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(TimeoutError):
        blocked.result(timeout=0.3)
    # Other calls, on this GPU and the others, are not held up by the hung one.
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 75000
    assert pynvml.nvmlDeviceGetTemperature(handle(0), pynvml.NVML_TEMPERATURE_GPU) == 34
    fake.release(1)
    assert blocked.result(timeout=10) == 77


def test_hang_everything_ends_with_shutdown(fake, background):
    h = handle(3)
    fake.hang(3)
    blocked = background.submit(pynvml.nvmlDeviceGetMemoryInfo, h)
    with pytest.raises(TimeoutError):
        blocked.result(timeout=0.3)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        blocked.result(timeout=10)


def test_calls_after_shutdown_are_uninitialized(fake):
    h = handle(0)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)


def test_no_state_file_is_driver_not_loaded(state_dir, monkeypatch):
    monkeypatch.delenv(fakegpu.STATE_ENV, raising=False)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    for path in (state_dir / "missing", state_dir):
        monkeypatch.setenv(fakegpu.STATE_ENV, str(path))
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()
