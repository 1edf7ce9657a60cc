"""NVML through pynvml, with no call able to stall the agent.

One sampler thread reads every GPU in turn; the agent's loop only ever reads
the latest snapshots. Each GPU's reader records which call it is in and since
when, so a call that does not return within ``call_timeout`` marks its GPU
unresponsive; the stuck thread is abandoned to the driver and a fresh sampler
carries on with the other GPUs (if the call ever returns, the GPU recovers).
Error counters are read in one ``nvmlDeviceGetFieldValues`` call per GPU,
every ``counter_interval`` and at once when an XID, ECC or retirement event
arrives; slower-moving telemetry (temperature, power, clocks, processes)
every ``slow_interval``. Events
arrive on a thread of their own through ``nvmlEventSetWait_v2``, and a
repeated identical XID is still a new event.

The library's loading and bounded calls are :mod:`agent.kernel.nvml`; one GPU's
readings :mod:`agent.gpu.reader`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.gpu.reader import FIELDS, VERSIONS, GpuReader
from agent.gpu.types import WANTED_EVENTS, GpuIdentity, GpuSnapshot, NvmlEvent
from agent.kernel.nvml import NvmlUnavailable, bounded, nvml_module, preload
from harmonaize.threads import set_os_thread_name

__all__ = ["FIELDS", "VERSIONS", "GpuReader", "Nvml", "NvmlUnavailable", "bounded", "preload"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class GpuSampler(threading.Thread):
    """Reads every GPU in turn on one thread: one wakeup a period, not one per GPU.

    A GPU stuck in a call holds this thread; :class:`Nvml` notices, retires it
    and starts a fresh sampler that skips GPUs still inside a call.
    """

    def __init__(self, readers: list[GpuReader], *, counter_interval: float,
                 slow_interval: float, generation: int) -> None:
        super().__init__(name=f"nvml-sampler{generation}", daemon=True)
        self.readers = readers
        self.counter_interval = counter_interval
        self.slow_interval = slow_interval
        self.retired = False
        self.current: GpuReader | None = None
        self._urgent: set[int] = set()
        self._poke = threading.Event()

    def poke(self, gpu: int | None = None) -> None:
        """Read now: one GPU's counters (an event arrived for it), or just wake."""
        if gpu is not None:
            self._urgent.add(gpu)
        self._poke.set()

    def stop(self) -> None:
        self.retired = True
        self._poke.set()

    def run(self) -> None:
        set_os_thread_name(self.name)
        while not self.retired:
            now = time.monotonic()
            urgent, self._urgent = self._urgent, set()
            for reader in self.readers:
                if self.retired:
                    return  # superseded while a call was stuck: the new sampler owns them
                if reader.lost or reader.current_call is not None:
                    continue  # gone, or stuck in a retired sampler's call
                self.current = reader
                reader.read(now, self.counter_interval, self.slow_interval,
                            force=reader.identity.index in urgent)
                self.current = None
            due = min((min(r.next_counters, r.next_telemetry) for r in self.readers
                       if not r.lost), default=now + self.slow_interval)
            self._poke.wait(max(0.0, due - time.monotonic()))
            self._poke.clear()


class EventWatcher(threading.Thread):
    """Waits on an NVML event set for XIDs and ECC/retirement events."""

    def __init__(self, handles: dict[int, Any], *, wait_ms: int,
                 on_event: Callable[[NvmlEvent], None],
                 on_lost: Callable[[], None]) -> None:
        super().__init__(name="nvml-events", daemon=True)
        self.handles = handles
        self.wait_ms = wait_ms
        self.on_event = on_event
        self.on_lost = on_lost
        self.registered: dict[int, int] = {}  # gpu -> event mask
        self.heartbeat = time.monotonic()
        self.error = ""
        self._halt = threading.Event()
        self._index = {ctypes.cast(h, ctypes.c_void_p).value: i for i, h in handles.items()}

    def stop(self) -> None:
        self._halt.set()

    def _register(self, exclude: set[int]) -> Any:
        nvml = nvml_module()
        event_set = nvml.nvmlEventSetCreate()
        self.registered = {}
        for index, handle in self.handles.items():
            if index in exclude:
                continue
            try:
                mask = nvml.nvmlDeviceGetSupportedEventTypes(handle) & WANTED_EVENTS
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    self.registered[index] = mask
            except nvml.NVMLError as exc:
                log.warning("gpu %d: cannot register for events: %s", index, exc)
        return event_set

    def run(self) -> None:
        set_os_thread_name(self.name)
        nvml = nvml_module()
        lost: set[int] = set()
        event_set = None
        try:
            event_set = self._register(lost)
            while not self._halt.is_set():
                self.heartbeat = time.monotonic()
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, self.wait_ms)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError_GpuIsLost:
                    # One of the registered GPUs is gone; the readers find out which.
                    self.on_lost()
                    time.sleep(0.2)
                    lost |= self._lost()
                    nvml.nvmlEventSetFree(event_set)
                    event_set = self._register(lost)
                    continue
                gpu = self._index.get(ctypes.cast(data.device, ctypes.c_void_p).value, -1)
                self.on_event(NvmlEvent(gpu, int(data.eventType), int(data.eventData),
                                        time.time()))
        except Exception as exc:
            self.error = f"event thread stopped: {exc}"
            log.error("NVML %s", self.error)
        finally:
            if event_set is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlEventSetFree(event_set)

    def _lost(self) -> set[int]:
        nvml = nvml_module()
        gone = set()
        for index, handle in self.handles.items():
            try:
                nvml.nvmlDeviceGetIndex(handle)
            except nvml.NVMLError_GpuIsLost:
                gone.add(index)
            except nvml.NVMLError:
                pass
        return gone


@dataclass
class Nvml:
    """The whole NVML session: init, one worker per GPU, the event thread."""

    interval: float
    slow_interval: float
    call_timeout: float
    event_wait_ms: int = 500
    on_change: Callable[[], None] = lambda: None
    driver_version: str = ""
    readers: list[GpuReader] = field(default_factory=list)
    sampler: GpuSampler | None = None
    #: Samplers abandoned while stuck in a call (they exit when it returns).
    retired: list[GpuSampler] = field(default_factory=list)
    events: deque[NvmlEvent] = field(default_factory=lambda: deque(maxlen=10_000))
    watcher: EventWatcher | None = None

    def start(self) -> None:
        try:
            nvml = nvml_module()
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from None
        timeout = self.call_timeout * 5  # the first init can be slow on a big host
        try:
            bounded(nvml.nvmlInit, timeout)
        except TimeoutError:
            raise RuntimeError(f"nvmlInit did not return within {timeout:g} s") from None
        except nvml.NVMLError_LibraryNotFound:
            raise NvmlUnavailable("no NVML library (NVIDIA driver not installed)") from None
        except nvml.NVMLError_DriverNotLoaded:
            raise NvmlUnavailable("NVIDIA driver not loaded") from None
        except nvml.NVMLError as exc:
            raise RuntimeError(f"nvmlInit failed: {exc}") from None
        try:
            count = bounded(nvml.nvmlDeviceGetCount, timeout)
            if count == 0:
                raise NvmlUnavailable("the NVIDIA driver reports no GPUs")
            with contextlib.suppress(nvml.NVMLError):
                self.driver_version = str(bounded(nvml.nvmlSystemGetDriverVersion, timeout))
            handles = {i: bounded(nvml.nvmlDeviceGetHandleByIndex, timeout, i)
                       for i in range(count)}
            for index, handle in handles.items():
                identity = bounded(self._identity, timeout, index, handle)
                self.readers.append(GpuReader(identity, handle, self.on_change))
        except BaseException:
            with contextlib.suppress(Exception):
                bounded(nvml.nvmlShutdown, self.call_timeout)
            raise
        self._new_sampler()
        self.watcher = EventWatcher(handles, wait_ms=self.event_wait_ms,
                                    on_event=self._on_event, on_lost=self._poke_all)
        self.watcher.start()

    @staticmethod
    def _identity(index: int, handle: Any) -> GpuIdentity:
        nvml = nvml_module()

        def optional(fn: Callable[..., T], *args: Any) -> T | None:
            try:
                return fn(handle, *args)
            except nvml.NVMLError:
                return None

        nvlinks = optional(nvml.nvmlDeviceGetFieldValues, [91])
        links = 0
        if nvlinks is not None and nvlinks[0].nvmlReturn == 0:
            links = int(nvlinks[0].value.uiVal)
        pci = optional(nvml.nvmlDeviceGetPciInfo)
        return GpuIdentity(
            index=index,
            uuid=str(optional(nvml.nvmlDeviceGetUUID) or f"gpu{index}"),
            name=str(optional(nvml.nvmlDeviceGetName) or "unknown"),
            pci_bus_id=str(pci.busId) if pci is not None else "",
            pcie_max_gen=optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration),
            pcie_max_width=optional(nvml.nvmlDeviceGetMaxPcieLinkWidth),
            nvlinks=min(links, 18),
        )

    def _new_sampler(self) -> None:
        self.sampler = GpuSampler(self.readers, counter_interval=self.interval,
                                  slow_interval=self.slow_interval,
                                  generation=len(self.retired))
        self.sampler.start()

    def _on_event(self, event: NvmlEvent) -> None:
        self.events.append(event)
        if self.sampler is not None and 0 <= event.gpu < len(self.readers):
            self.sampler.poke(event.gpu)  # re-read its counters now: they moved too
        self.on_change()

    def _poke_all(self) -> None:
        if self.sampler is not None:
            for reader in self.readers:
                self.sampler.poke(reader.identity.index)
        self.on_change()

    def snapshots(self) -> list[GpuSnapshot]:
        now = time.monotonic()
        sampler = self.sampler
        stuck = sampler.current if sampler is not None else None
        call = stuck.current_call if stuck is not None else None
        if sampler is not None and call is not None and now - call[1] >= self.call_timeout:
            # The sampler is stuck in this GPU's call: leave it there, carry on without it.
            log.warning("gpu %d: %s has not returned for %.1f s; sampling the others on a "
                        "new thread", stuck.identity.index, call[0], now - call[1])
            sampler.retired = True
            self.retired.append(sampler)
            self._new_sampler()
        self.retired = [s for s in self.retired if s.is_alive()]
        return [reader.snapshot(now) for reader in self.readers]

    def quiet_since(self, versions: tuple[int, ...]) -> bool:
        """Nothing new since ``versions``, no event waiting and no call in flight."""
        return (not self.events and versions == self.versions()
                and all(r.current_call is None for r in self.readers))

    def versions(self) -> tuple[int, ...]:
        return tuple(r.version for r in self.readers)

    def drain_events(self) -> list[NvmlEvent]:
        drained = []
        while self.events:
            drained.append(self.events.popleft())
        return drained

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.sampler is not None:
            self.sampler.stop()
        for thread in (self.watcher, self.sampler):
            if thread is not None:
                thread.join(timeout=self.call_timeout)
        with contextlib.suppress(Exception):
            bounded(nvml_module().nvmlShutdown, self.call_timeout)
