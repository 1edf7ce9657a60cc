"""The XID catalog: what each XID means for the GPU, the job on it, and the operator.

Built from NVIDIA's published XID catalog and its immediate-action buckets.
An XID not in the catalog is reported as an event and left to the counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent.conditions import Action


class Effect(StrEnum):
    """What the XID does to the GPU's health state."""

    NONE = "none"              # the application's problem; the GPU is fine
    SUSPECT = "suspect"        # watch it, validate it
    QUARANTINE = "quarantine"  # take it out of service
    LOST = "lost"              # it is gone (off the bus)


class Reason(StrEnum):
    """Coarse reason classes: all a tenant ever learns of why."""

    APPLICATION = "application"
    GPU_MEMORY = "gpu-memory"
    GPU_FAILURE = "gpu-failure"
    INTERCONNECT = "interconnect"
    THERMAL = "thermal"


@dataclass(frozen=True)
class XidInfo:
    xid: int
    meaning: str
    action: Action
    effect: Effect
    reason: Reason


_CATALOG = [
    XidInfo(13, "graphics engine exception", Action.RESTART_APP, Effect.NONE,
            Reason.APPLICATION),
    XidInfo(31, "GPU memory page fault", Action.RESTART_APP, Effect.NONE, Reason.APPLICATION),
    XidInfo(43, "GPU stopped processing", Action.NONE, Effect.NONE, Reason.APPLICATION),
    XidInfo(45, "preemptive cleanup after an earlier error", Action.NONE, Effect.NONE,
            Reason.APPLICATION),
    XidInfo(46, "GPU timeout", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE),
    XidInfo(48, "double-bit ECC error", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_MEMORY),
    XidInfo(61, "PMU breakpoint", Action.RESET_GPU, Effect.SUSPECT, Reason.GPU_FAILURE),
    XidInfo(62, "PMU halt", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE),
    XidInfo(63, "row remap or page retirement recorded", Action.RESET_GPU, Effect.SUSPECT,
            Reason.GPU_MEMORY),
    XidInfo(64, "row remap or page retirement failed", Action.RMA, Effect.QUARANTINE,
            Reason.GPU_MEMORY),
    XidInfo(74, "NVLink error", Action.RESET_GPU, Effect.SUSPECT, Reason.INTERCONNECT),
    XidInfo(79, "GPU fell off the bus", Action.REBOOT_NODE, Effect.LOST, Reason.GPU_FAILURE),
    XidInfo(92, "excessive single-bit ECC interrupts", Action.NONE, Effect.SUSPECT,
            Reason.GPU_MEMORY),
    XidInfo(94, "contained ECC error", Action.RESTART_APP, Effect.NONE, Reason.GPU_MEMORY),
    XidInfo(95, "uncontained ECC error", Action.RESET_GPU, Effect.QUARANTINE,
            Reason.GPU_MEMORY),
    XidInfo(109, "context switch timeout", Action.RESET_GPU, Effect.QUARANTINE,
            Reason.GPU_FAILURE),
    XidInfo(119, "GSP RPC timeout", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE),
    XidInfo(120, "GSP error", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE),
    XidInfo(140, "unrecovered ECC error", Action.RESET_GPU, Effect.QUARANTINE,
            Reason.GPU_MEMORY),
    XidInfo(154, "GPU recovery action changed", Action.NONE, Effect.NONE, Reason.GPU_FAILURE),
]
CATALOG = {info.xid: info for info in _CATALOG}


def lookup(xid: int) -> XidInfo:
    return CATALOG.get(xid) or XidInfo(xid, "not in the catalog", Action.NONE, Effect.NONE,
                                       Reason.GPU_FAILURE)
