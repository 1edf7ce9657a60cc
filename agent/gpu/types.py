"""The GPU domain's plain data: what NVML says of a GPU, what the observer hands on,
and whose processes run on it. No I/O here: the engine and views import this, the
NVML reader and the observer fill it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.kernel.kmsgformat import KernelXid

#: NVML event types (nvml.h's nvmlEventType*).
XID_EVENT = 0x8
SBE_EVENT = 0x1
DBE_EVENT = 0x2
RETIREMENT_EVENTS = 0x400 | 0x800
RECOVERY_EVENT = 0x8000
WANTED_EVENTS = XID_EVENT | SBE_EVENT | DBE_EVENT | RETIREMENT_EVENTS | RECOVERY_EVENT


@dataclass(frozen=True)
class JobRef:
    job: str
    rank: str | None = None


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    pcie_max_gen: int | None
    pcie_max_width: int | None
    nvlinks: int


@dataclass(frozen=True)
class GpuCounters:
    """Monotonic counters and flags; None where the GPU does not support one."""

    values: dict[str, int | None]
    clocks_event_reasons: int | None

    def get(self, name: str) -> int | None:
        return self.values.get(name)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int


@dataclass(frozen=True)
class GpuTelemetry:
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    util_gpu: int | None
    util_mem: int | None
    mem_total: int | None
    mem_used: int | None
    pcie_gen: int | None
    pcie_width: int | None
    nvlinks_up: int | None
    processes: tuple[GpuProcess, ...] = ()
    #: False when NVML could not list the processes (``processes`` is then empty but
    #: says nothing: remediation never resets such a GPU).
    processes_read: bool = True


@dataclass(frozen=True)
class GpuSnapshot:
    identity: GpuIdentity
    counters: GpuCounters | None = None
    telemetry: GpuTelemetry | None = None
    lost: bool = False
    #: The NVML call this GPU's worker is stuck in, and for how long (seconds).
    hung_call: str | None = None
    hung_for: float = 0.0
    error: str = ""
    #: The reader's version: it rises whenever counters, telemetry or loss changed, so
    #: an equal version is the same readings (engines compare this, not objects).
    version: int = 0


@dataclass(frozen=True)
class NvmlEvent:
    gpu: int
    type: int
    data: int
    time: float


def gpu_class_of(name: str) -> str:
    """A GPU class from the model name: "NVIDIA H200" -> "H200"."""
    words = [w for w in re.split(r"[^A-Za-z0-9.+-]+", name) if w]
    words = [w for w in words if w.upper() not in ("NVIDIA", "TESLA", "GEFORCE", "QUADRO")]
    return "-".join(words[:2]) or "unknown"


@dataclass(frozen=True)
class GpuSample:
    gpus: tuple[GpuSnapshot, ...]
    events: tuple[NvmlEvent, ...]
    #: Per GPU index, the jobs (as the provider labels them) of its processes.
    jobs: dict[int, tuple[JobRef, ...]] = field(default_factory=dict)
    #: Seconds after which a GPU stuck in one NVML call counts as unresponsive.
    call_timeout: float = 2.0
    #: The observer's number for this observation: a repeated number is the same one
    #: (nothing read since), a new number may carry news and carries new events.
    seq: int = 0
    #: Per pid of a GPU process, its job (processes of no job are absent).
    owners: dict[int, JobRef] = field(default_factory=dict)
    #: GPU processes (and processes the kernel's XID lines name) that /proc shows
    #: exiting, a zombie or gone; read only when the sample carries XIDs.
    exiting: frozenset[int] = frozenset()
    #: The driver's XID lines the kernel logged since the last observation.
    kernel_xids: tuple[KernelXid, ...] = ()


