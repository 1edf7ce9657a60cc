"""The XID catalog: what each XID means for the GPU, the job on it, and the operator.

Built from NVIDIA's published XID catalog and its immediate-action buckets
(:data:`CATALOG_URL`), and, for whose fault an XID can be, the possible causes NVIDIA
lists per XID (hardware, driver, user application, system memory, bus, thermal, frame
buffer) in its XID error listing (:data:`LISTING_URL`). Each entry's ``cites`` says in
our words what those pages give for it. An XID not in the catalog is reported as an
event, attributed to the hardware, and left to the counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent.conditions import Action
from harmonaize.messages.jobhealth import Fault


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


class Attribution(StrEnum):
    """Whose fault an XID can be, as NVIDIA's catalog lists its causes."""

    HARDWARE = "hardware"        # the GPU, its memory, its bus or links: never the job's
    APPLICATION = "application"  # a user application is the usual cause (also driver/HW)
    EITHER = "either"            # the application and the hardware are both listed causes


#: NVIDIA's XID catalog for Ampere and newer (immediate-action buckets), and its older
#: error listing with the possible causes of each XID.
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
LISTING_URL = "https://docs.nvidia.com/deploy/xid-errors/index.html"


@dataclass(frozen=True)
class XidInfo:
    xid: int
    meaning: str
    action: Action
    effect: Effect
    reason: Reason
    attribution: Attribution = Attribution.HARDWARE
    #: What NVIDIA's catalog (CATALOG_URL, LISTING_URL) gives for this XID.
    cites: str = ""


H, A = Attribution.HARDWARE, Attribution.APPLICATION
_CATALOG = [
    XidInfo(13, "graphics engine exception", Action.RESTART_APP, Effect.NONE,
            Reason.APPLICATION, A, "listing: user application the usual cause (array out "
            "of bounds, illegal instruction), rarely driver or hardware; RESTART_APP"),
    XidInfo(31, "GPU memory page fault", Action.RESTART_APP, Effect.NONE, Reason.APPLICATION,
            A, "listing: MMU fault, usually an illegal address access by the application, "
            "possibly a driver or hardware bug; RESTART_APP"),
    XidInfo(43, "GPU stopped processing", Action.NONE, Effect.NONE, Reason.APPLICATION, A,
            "listing: causes driver error or user application error; the GPU carries on"),
    XidInfo(45, "preemptive cleanup after an earlier error", Action.NONE, Effect.NONE,
            Reason.APPLICATION, A, "listing: preemptive cleanup due to previous errors "
            "(a context torn down, as when its process ends); causes driver or user app"),
    XidInfo(46, "GPU timeout", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE, H,
            "listing: GPU stopped processing; causes driver error, system memory corruption"),
    XidInfo(48, "double-bit ECC error", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_MEMORY,
            H, "listing: DBE; cause hardware error"),
    XidInfo(61, "PMU breakpoint", Action.RESET_GPU, Effect.SUSPECT, Reason.GPU_FAILURE, H,
            "listing: internal micro-controller breakpoint/warning; causes hardware, driver"),
    XidInfo(62, "PMU halt", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE, H,
            "listing: internal micro-controller halt; causes hardware, driver, thermal"),
    XidInfo(63, "row remap or page retirement recorded", Action.RESET_GPU, Effect.SUSPECT,
            Reason.GPU_MEMORY, H, "listing: ECC page retirement or row remapping recorded; "
            "cause hardware error"),
    XidInfo(64, "row remap or page retirement failed", Action.RMA, Effect.QUARANTINE,
            Reason.GPU_MEMORY, H, "listing: ECC page retirement or row remapper failure; "
            "cause hardware error"),
    XidInfo(74, "NVLink error", Action.RESET_GPU, Effect.SUSPECT, Reason.INTERCONNECT, H,
            "listing: NVLink error; causes hardware, bus"),
    XidInfo(79, "GPU fell off the bus", Action.REBOOT_NODE, Effect.LOST, Reason.GPU_FAILURE, H,
            "listing: GPU has fallen off the bus; causes hardware, driver, system memory, "
            "bus, thermal"),
    XidInfo(92, "excessive single-bit ECC interrupts", Action.NONE, Effect.SUSPECT,
            Reason.GPU_MEMORY, H, "listing: high single-bit ECC error rate; cause hardware"),
    XidInfo(94, "contained ECC error", Action.RESTART_APP, Effect.NONE, Reason.GPU_MEMORY, H,
            "listing: contained memory error (the GPU's memory; only the affected "
            "application must restart); cause hardware"),
    XidInfo(95, "uncontained ECC error", Action.RESET_GPU, Effect.QUARANTINE,
            Reason.GPU_MEMORY, H, "listing: uncontained memory error; cause hardware"),
    # The listing names the application among 109's causes, but its action is a GPU
    # reset and no fault class tells a job's owner of it: an "either" the agent keeps as
    # the hardware's (in doubt, hardware).
    XidInfo(109, "context switch timeout", Action.RESET_GPU, Effect.QUARANTINE,
            Reason.GPU_FAILURE, H, "listing: context switch timeout error; causes hardware, "
            "driver, user application, system memory, bus, thermal, frame buffer"),
    XidInfo(119, "GSP RPC timeout", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE, H,
            "catalog: GSP RPC timeout; RESET_GPU"),
    XidInfo(120, "GSP error", Action.RESET_GPU, Effect.QUARANTINE, Reason.GPU_FAILURE, H,
            "catalog: GSP error; RESET_GPU"),
    XidInfo(140, "unrecovered ECC error", Action.RESET_GPU, Effect.QUARANTINE,
            Reason.GPU_MEMORY, H, "catalog: unrecovered ECC error; RESET_GPU"),
    XidInfo(154, "GPU recovery action changed", Action.NONE, Effect.NONE, Reason.GPU_FAILURE, H,
            "catalog: the recovery action NVML reports changed (the action it names counts)"),
]
CATALOG = {info.xid: info for info in _CATALOG}


def lookup(xid: int) -> XidInfo:
    return CATALOG.get(xid) or XidInfo(xid, "not in the catalog", Action.NONE, Effect.NONE,
                                       Reason.GPU_FAILURE)


#: What a job's owner is told of an XID judged its own process's (the controller's
#: table is the same): an XID with none here is never judged the application's.
FAULTS = {13: Fault.GRAPHICS_EXCEPTION, 31: Fault.MEMORY_MANAGEMENT,
          43: Fault.STOPPED_PROCESSING, 45: Fault.CLEANUP_AFTER_ERROR,
          94: Fault.CONTAINED_MEMORY_ERROR}
