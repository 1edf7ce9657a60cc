"""The fake libnvidia-ml.so.1 (native/fake_nvml), exercised through the real pynvml bindings."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
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
