"""One GPU's readings through NVML: counters in one call, telemetry less often.

Each reader records which call it is in and since when, so the sampler
(:mod:`agent.gpu.nvml`) can tell a call that does not return and mark its GPU
unresponsive. Runs on the sampler's thread.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent.gpu.types import (
    GpuCounters,
    GpuIdentity,
    GpuProcess,
    GpuSnapshot,
    GpuTelemetry,
)
from agent.kernel.nvml import VALUE_ATTRS, nvml_module

#: Versions of GPU readings, unique in the process (``next`` is atomic under the GIL):
#: a reader made after a reload never repeats a number an engine saw from the last one.
VERSIONS = itertools.count(1)

T = TypeVar("T")

#: Counter fields read every interval, in one call per GPU.
FIELDS: dict[str, int] = {
    "ecc_sbe_volatile": 3,
    "ecc_dbe_volatile": 4,
    "ecc_sbe_aggregate": 5,
    "ecc_dbe_aggregate": 6,
    "retired_sbe": 29,
    "retired_dbe": 30,
    "retired_pending": 31,
    "nvlink_crc_flit": 38,
    "nvlink_crc_data": 45,
    "nvlink_replay": 52,
    "nvlink_recovery": 59,
    "pcie_replay": 94,
    "remap_correctable": 142,
    "remap_uncorrectable": 143,
    "remap_pending": 144,
    "remap_failure": 145,
    "recovery_action": 230,
}


class GpuReader:
    """One GPU's NVML reads and latest results; run by whichever sampler thread owns it."""

    def __init__(self, identity: GpuIdentity, handle: Any,
                 on_change: Callable[[], None]) -> None:
        #: Bumped whenever counters, telemetry or the lost flag are replaced.
        self.version = next(VERSIONS)
        self.identity = identity
        self.handle = handle
        self.on_change = on_change
        self.counters: GpuCounters | None = None
        self.telemetry: GpuTelemetry | None = None
        self.lost = False
        self.error = ""
        #: The call in progress and when it began; set from the sampler thread.
        self.current_call: tuple[str, float] | None = None
        self.next_counters = 0.0
        self.next_telemetry = 0.0
        self._unsupported: set[str] = set()
        self._field_ids = list(FIELDS.values())

    def snapshot(self, now: float) -> GpuSnapshot:
        call = self.current_call
        return GpuSnapshot(
            self.identity, self.counters, self.telemetry, self.lost,
            call[0] if call else None, now - call[1] if call else 0.0, self.error,
            self.version,
        )

    def read(self, now: float, counter_interval: float, slow_interval: float,
             force: bool = False) -> None:
        try:
            if force or now >= self.next_counters:
                self._sample_counters()
                self.next_counters = now + counter_interval
            if now >= self.next_telemetry:
                self._sample_telemetry()
                self.next_telemetry = now + slow_interval
            self.error = ""
        except Exception as exc:
            self.error = str(exc) or type(exc).__name__

    def _call(self, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        """One NVML call; None if unsupported. GPU-is-lost marks the GPU and propagates."""
        if name in self._unsupported:
            return None
        nvml = nvml_module()
        self.current_call = (name, time.monotonic())
        try:
            return fn(self.handle, *args)
        except nvml.NVMLError_GpuIsLost:
            self.lost = True
            self.version = next(VERSIONS)
            self.error = "GPU is lost (fell off the bus)"
            self.on_change()
            raise
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            self._unsupported.add(name)
            return None
        finally:
            self.current_call = None

    def _sample_counters(self) -> None:
        nvml = nvml_module()
        values = self._call("fields", nvml.nvmlDeviceGetFieldValues, self._field_ids)
        counters: dict[str, int | None] = dict.fromkeys(FIELDS)
        if values is not None:
            for name, value in zip(FIELDS, values, strict=True):
                if value.nvmlReturn == 0:
                    attr = VALUE_ATTRS.get(value.valueType, "ullVal")
                    counters[name] = int(getattr(value.value, attr))
        reasons = self._call("clocks_event_reasons",
                             nvml.nvmlDeviceGetCurrentClocksEventReasons)
        fresh = GpuCounters(counters, reasons)
        if fresh == self.counters:
            return  # keep the old object: "nothing new" is then cheap to see
        changed = self.counters is not None
        self.counters = fresh
        self.version = next(VERSIONS)
        if changed:
            self.on_change()

    def _sample_telemetry(self) -> None:
        nvml = nvml_module()
        call = self._call
        power = call("power", nvml.nvmlDeviceGetPowerUsage)
        limit = call("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit)
        util = call("utilization", nvml.nvmlDeviceGetUtilizationRates)
        memory = call("memory", nvml.nvmlDeviceGetMemoryInfo)
        up = None
        if self.identity.nvlinks:
            states = [call(f"nvlink{link}", nvml.nvmlDeviceGetNvLinkState, link)
                      for link in range(self.identity.nvlinks)]
            up = sum(1 for s in states if s)
        listed = call("processes", nvml.nvmlDeviceGetComputeRunningProcesses)
        processes = listed or []
        fresh = GpuTelemetry(
            temperature_c=call("temperature", nvml.nvmlDeviceGetTemperature,
                               nvml.NVML_TEMPERATURE_GPU),
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            sm_clock_mhz=call("sm_clock", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
            max_sm_clock_mhz=call("max_sm_clock", nvml.nvmlDeviceGetMaxClockInfo,
                                  nvml.NVML_CLOCK_SM),
            mem_clock_mhz=call("mem_clock", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
            util_gpu=util.gpu if util is not None else None,
            util_mem=util.memory if util is not None else None,
            mem_total=memory.total if memory is not None else None,
            mem_used=memory.used if memory is not None else None,
            pcie_gen=call("pcie_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration),
            pcie_width=call("pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth),
            nvlinks_up=up,
            processes=tuple(GpuProcess(p.pid, p.usedGpuMemory or 0) for p in processes),
            processes_read=listed is not None,
        )
        if fresh != self.telemetry:
            self.telemetry = fresh
            self.version = next(VERSIONS)
