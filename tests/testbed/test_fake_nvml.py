"""The fake libnvidia-ml.so.1 (native/fake_nvml), exercised through the real pynvml bindings."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pynvml
import pytest

from testbed import fakegpu
from testbed.fakegpu import FakeNvml

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
XID = pynvml.nvmlEventTypeXidCriticalError
GiB = 1 << 30


@pytest.fixture(scope="module", autouse=True)
def library() -> ctypes.CDLL:
    # make is a no-op when the library is current, and keeps a stale one from being tested.
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "fake_nvml")], check=True)
    return fakegpu.preload()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hz-fake-nvml-") as name:
        yield Path(name)


@pytest.fixture
def fake(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    state = FakeNvml(state_dir / "nvml.state", gpus=4)
    monkeypatch.setenv(fakegpu.STATE_ENV, str(state.path))
    pynvml.nvmlInit()
    yield state
    # Shutting down also frees any call still blocked in a hang or an event wait.
    with contextlib.suppress(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


@pytest.fixture
def background(fake: FakeNvml) -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=4)
    yield pool
    # Not waiting: a call still blocked returns once `fake` shuts NVML down after this.
    pool.shutdown(wait=False, cancel_futures=True)


def handle(index: int) -> pynvml.c_nvmlDevice_t:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def event_set(*gpus: int, types: int = XID) -> pynvml.c_nvmlEventSet_t:
    es = pynvml.nvmlEventSetCreate()
    for gpu in gpus:
        pynvml.nvmlDeviceRegisterEvents(handle(gpu), types, es)
    return es


def next_event(es: pynvml.c_nvmlEventSet_t, timeout_ms: int = 2000) -> tuple[int, int, int]:
    data = pynvml.nvmlEventSetWait_v2(es, timeout_ms)
    return pynvml.nvmlDeviceGetIndex(data.device), data.eventType, data.eventData


def test_pynvml_loads_the_fake(fake, library):
    # The bare soname pynvml dlopens is our object, and no other libnvidia-ml is mapped.
    bare = ctypes.CDLL(fakegpu.SONAME, mode=os.RTLD_NOLOAD)
    assert bare._handle == library._handle
    mapped = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "libnvidia-ml" in line
    }
    assert mapped == {str(fakegpu.library_path().resolve())}


def test_identity_per_gpu(fake):
    fake.set(2, name="NVIDIA H200 NVL", uuid="GPU-0badc0de-0000-4000-8000-000000000002")
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    buses = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"]
    for i, bus_id in enumerate(buses):
        h = handle(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetName(h) == ("NVIDIA H200 NVL" if i == 2 else "NVIDIA H200")
        expected_uuid = f"GPU-fa4e0000-0000-0000-0000-{i:012x}"
        assert uuid == ("GPU-0badc0de-0000-4000-8000-000000000002" if i == 2 else expected_uuid)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert pci.busId == bus_id
        assert (pci.domain, pci.bus, pci.device) == (0, int(bus_id[9:11], 16), 0)
        assert pci.busIdLegacy == bus_id[4:]
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
        assert pynvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
        assert pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-not-here")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(4)


def test_every_value_round_trips(fake):
    values = {
        "serial": "1650000000042",
        "pci_bus_id": "00000001:9A:00.0",
        "temperature": 71,
        "power_mw": 512345,
        "power_limit_mw": 650000,
        "clock_graphics_mhz": 1740,
        "clock_sm_mhz": 1755,
        "clock_mem_mhz": 2619,
        "max_clock_graphics_mhz": 1985,
        "max_clock_sm_mhz": 1990,
        "max_clock_mem_mhz": 3200,
        "util_gpu": 97,
        "util_mem": 61,
        "mem_total": 100 * GiB,
        "mem_used": 60 * GiB,
        "mem_free": 39 * GiB,
        "mem_reserved": GiB,
        "clocks_event_reasons": 0x24,
        "ecc_mode": 0,
        "persistence_mode": 0,
        "compute_mode": 3,
    }
    fake.set(1, **values)
    h = handle(1)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    got = {
        "serial": pynvml.nvmlDeviceGetSerial(h),
        "pci_bus_id": pci.busId,
        "temperature": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "power_mw": pynvml.nvmlDeviceGetPowerUsage(h),
        "power_limit_mw": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "clock_graphics_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS),
        "clock_sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "clock_mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "max_clock_graphics_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS),
        "max_clock_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        "max_clock_mem_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "util_gpu": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "util_mem": pynvml.nvmlDeviceGetUtilizationRates(h).memory,
        "mem_total": v2.total,
        "mem_used": v2.used,
        "mem_free": v2.free,
        "mem_reserved": v2.reserved,
        "clocks_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "ecc_mode": pynvml.nvmlDeviceGetEccMode(h)[0],
        "persistence_mode": pynvml.nvmlDeviceGetPersistenceMode(h),
        "compute_mode": pynvml.nvmlDeviceGetComputeMode(h),
    }
    assert got == values
    assert (pci.domain, pci.bus) == (1, 0x9A)
    assert (v1.total, v1.used, v1.free) == (100 * GiB, 60 * GiB, 39 * GiB)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 650000
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0x24
    # GPU 0 keeps the defaults of a healthy idle H200 with 141 GiB.
    h0 = handle(0)
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 34
    assert pynvml.nvmlDeviceGetMemoryInfo(h0).total == 141 * GiB
    assert pynvml.nvmlDeviceGetEccMode(h0) == [1, 1]
    assert pynvml.nvmlDeviceGetPowerUsage(h0) < pynvml.nvmlDeviceGetEnforcedPowerLimit(h0)


def test_file_is_reread_after_each_change(fake):
    h = handle(0)
    # Same size every time, so mtime or inode must tell the library the file changed.
    for celsius in range(40, 60):
        fake.set(0, temperature=celsius)
        assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == celsius
    # Even with the old mtime put back (one coarse clock tick), the new inode is noticed, also
    # after two writes between reads, where ext4 would hand the second file the inode of the
    # one the library loaded, were the library not holding that one open.
    for celsius in range(60, 70, 2):
        before = fake.path.stat()
        fake.set(0, temperature=celsius)
        fake.set(0, temperature=celsius + 1)
        os.utime(fake.path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert fake.path.stat().st_size == before.st_size
        assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == celsius + 1
    h3 = handle(3)
    fake.set_system(gpus=2)
    assert pynvml.nvmlDeviceGetCount() == 2
    # A handle whose GPU left the count reads as fallen off the bus, until it is back.
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(h3)
    fake.set_system(gpus=4)
    assert pynvml.nvmlDeviceGetName(h3) == "NVIDIA H200"


def test_memory_health_and_pcie(fake):
    fake.set(
        3,
        ecc_sbe_volatile=5,
        ecc_dbe_volatile=1,
        ecc_sbe_aggregate=120,
        ecc_dbe_aggregate=2,
        retired_sbe=3,
        retired_dbe=2,
        retired_pending=1,
        remap_correctable=4,
        remap_uncorrectable=1,
        remap_pending=1,
        remap_failure=0,
        pcie_replay=17,
        pcie_gen=4,
        pcie_max_gen=5,
        pcie_width=8,
        pcie_max_width=16,
    )
    h = handle(3)
    sbe, dbe = pynvml.NVML_SINGLE_BIT_ECC, pynvml.NVML_DOUBLE_BIT_ECC
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    counts = {
        (e, c): pynvml.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (sbe, dbe) for c in (vol, agg)
    }
    assert counts == {(sbe, vol): 5, (dbe, vol): 1, (sbe, agg): 120, (dbe, agg): 2}
    dram = pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY
    assert pynvml.nvmlDeviceGetMemoryErrorCounter(h, dbe, agg, dram) == 2
    l1 = pynvml.NVML_MEMORY_LOCATION_L1_CACHE
    assert pynvml.nvmlDeviceGetMemoryErrorCounter(h, dbe, agg, l1) == 0
    multi_sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe_cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    sbe_pages = pynvml.nvmlDeviceGetRetiredPages(h, multi_sbe)
    dbe_pages = pynvml.nvmlDeviceGetRetiredPages_v2(h, dbe_cause)
    assert len(set(sbe_pages)) == 3
    assert len(dbe_pages) == 2
    assert not set(sbe_pages) & {page["address"] for page in dbe_pages}
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (4, 1, 1, 0)
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 17
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 4
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == 8
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) == 16
    # A healthy GPU reports none of it.
    h0 = handle(0)
    assert pynvml.nvmlDeviceGetRetiredPages(h0, dbe_cause) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h0) == 0
    assert pynvml.nvmlDeviceGetRemappedRows(h0) == (0, 0, 0, 0)


def test_nvlink_state_and_counters(fake):
    fake.set(0, nvlinks=4)
    fake.set_link(0, 2, state=0, crc_flit=11, crc_data=12, replay=13, recovery=14)
    fake.set(1, nvlinks=0)
    h = handle(0)
    assert [pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(4)] == [1, 1, 0, 1]
    counters = {
        counter: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 2, counter)
        for counter in (
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        )
    }
    assert list(counters.values()) == [11, 12, 13, 14]
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(h, 4)
    h1 = handle(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(h1, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(h1, 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
    # The default is 18 active links.
    assert pynvml.nvmlDeviceGetNvLinkState(handle(2), 17) == 1


def test_field_values(fake):
    fake.set(0, recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT, pcie_replay=9)
    fake.set(0, remap_correctable=3, remap_uncorrectable=2, remap_pending=1, remap_failure=1)
    ids = [
        pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0),
        9999,
    ]
    values = pynvml.nvmlDeviceGetFieldValues(handle(0), ids)
    assert [v.fieldId for v in values] == [230, 142, 143, 144, 145, 94, 9999]
    returns = [v.nvmlReturn for v in values]
    assert returns == [pynvml.NVML_SUCCESS] * 6 + [pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert [v.value.ullVal for v in values[:6]] == [2, 3, 2, 1, 1, 9]
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert values[0].value.uiVal == 2
    assert all(v.timestamp > 0 for v in values)
    # Without the key, the recovery action field is not supported on that GPU.
    (absent,) = pynvml.nvmlDeviceGetFieldValues(handle(1), [230])
    assert absent.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.set(0, recovery_action=None)
    (removed,) = pynvml.nvmlDeviceGetFieldValues(handle(0), [230])
    assert removed.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_running_processes(fake):
    fake.set(0, processes={1234: GiB, 5678: 2 * GiB})
    h = handle(0)
    for query in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
    ):
        procs = query(h)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1234, GiB), (5678, 2 * GiB)]
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle(1)) == []
    # Without mem_used, used memory is what the processes hold.
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 3 * GiB
    fake.set(0, processes={})
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_abi_edge_cases(fake, library):
    h = handle(0)
    small = ctypes.create_string_buffer(4)
    assert library.nvmlDeviceGetName(h, small, 4) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert library.nvmlDeviceGetPowerUsage(h, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    bogus = ctypes.c_void_p(16)
    assert library.nvmlDeviceGetIndex(bogus, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = 1
    mismatch = library.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(memory))
    assert mismatch == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    # The unversioned process query fills the older 16-byte record.
    fake.set(0, processes={42: 7})
    count = ctypes.c_uint(2)
    records = (ctypes.c_ulonglong * 4)()
    assert library.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(count), records) == 0
    assert (count.value, records[0] & 0xFFFFFFFF, records[1]) == (1, 42, 7)
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


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


GARBAGE = b"""\
# a comment = with an equals sign
gpus = 3
no equals sign here
= 5
gpu.0.temperature = hot
gpu.0.power_mw = 123456
gpu.0.power_mw = -5
gpu.0.util_gpu = 99999999999999999999999
gpu.1.temperature = 0x30
gpu.1.name = \xff\xfe broken \xc3 utf-8 \x01
gpu.1.clock_sm_mhz = 1500 MHz
gpu.99.temperature = 1
gpu.x.temperature = 1
gpu.2.nvlink.40.state = 0
gpu.2.nvlink.1.state = 0
gpu.2.processes = 1:2, nonsense, :5, 7:, 3:4
gpu.2.mem_total
xid.abc = 0:79
xid.7 = 0:
xid.9 = 1:43
xid.8 = 0:13
unknown.key = 1
"""


def test_garbage_does_not_crash(fake):
    junk = GARBAGE + b"gpu.0.name = " + b"A" * 50000 + b"\n" + b"\x00" * 100 + b"gpu.2.serial=S\n"
    tmp = fake.path.with_name("garbage")
    tmp.write_bytes(junk)
    os.replace(tmp, fake.path)
    assert pynvml.nvmlDeviceGetCount() == 3
    h0, h1, h2 = handle(0), handle(1), handle(2)
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 34
    assert pynvml.nvmlDeviceGetPowerUsage(h0) == 75000
    assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 0
    assert pynvml.nvmlDeviceGetName(h0) == "NVIDIA H200"
    assert pynvml.nvmlDeviceGetTemperature(h1, pynvml.NVML_TEMPERATURE_GPU) == 0x30
    assert pynvml.nvmlDeviceGetName(h1) == "?? broken ? utf-8 ?"
    assert pynvml.nvmlDeviceGetClockInfo(h1, pynvml.NVML_CLOCK_SM) == 345
    assert pynvml.nvmlDeviceGetNvLinkState(h2, 1) == 0
    assert pynvml.nvmlDeviceGetSerial(h2) == "S"
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h2)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1, 2), (3, 4)]
    # Events are delivered in id order, whatever the order in the file.
    es = event_set(0, 1)
    try:
        assert [next_event(es), next_event(es)] == [(0, XID, 13), (1, XID, 43)]
    finally:
        pynvml.nvmlEventSetFree(es)


def test_random_bytes_never_crash(fake):
    rng = random.Random(20240611)
    alphabet = b"gpu.0123456789xid=:#,\n \t" + bytes(range(256))
    h = handle(0)
    for n in range(200):
        size = rng.randrange(0, 3000)
        data = bytes(rng.choice(alphabet) for _ in range(size))
        tmp = fake.path.with_name(f"fuzz{n}")
        tmp.write_bytes(data)
        os.replace(tmp, fake.path)
        count = pynvml.nvmlDeviceGetCount()
        assert 0 <= count <= 64
        if count:
            # Any outcome but a crash is fine; the handle may point past a shrunken count.
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlDeviceGetName(h)
                pynvml.nvmlDeviceGetComputeRunningProcesses(h)


CHILD = """
import json, pathlib, pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
print(json.dumps({
    "names": [pynvml.nvmlDeviceGetName(h) for h in handles],
    "temperature": pynvml.nvmlDeviceGetTemperature(handles[1], 0),
    "library": sorted({line.split()[-1] for line in maps if "libnvidia-ml" in line}),
}))
"""


def test_subprocess_loads_the_fake_through_ld_library_path(fake):
    fake.set(1, name="NVIDIA H200 (child)", temperature=66)
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**os.environ, **fakegpu.environment(fake.path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(result.stdout)
    assert seen == {
        "names": ["NVIDIA H200", "NVIDIA H200 (child)", "NVIDIA H200", "NVIDIA H200"],
        "temperature": 66,
        "library": [str(fakegpu.library_path().resolve())],
    }


def test_helper_rejects_mistakes(fake):
    with pytest.raises(KeyError):
        fake.set(0, temprature=50)
    with pytest.raises(ValueError):
        fake.set(0, temperature=-1)
    with pytest.raises(ValueError):
        fake.set(0, name="two\nlines")
    with pytest.raises(ValueError):
        fake.set(64, temperature=1)
    # Numbering continues past the events an earlier writer left in the file.
    last = fake.inject_xid(0, 79)
    assert FakeNvml(fake.path, gpus=4).inject_xid(0, 79) == last + 1
