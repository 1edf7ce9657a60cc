"""What the fake reports per GPU: memory, health, PCIe, NVLink, fields, processes, ABI edges."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from tests.testbed.test_fake_nvml import GiB, background, fake, handle, library, state_dir

pytestmark = pytest.mark.gpu

# The fake library's fixtures, from the file of its basic tests: pytest finds a
# fixture by the module's names, hence the export.
__all__ = ["background", "fake", "library", "state_dir"]


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
