"""The condition behind a validation, named from the GPU domain's reason for it (the
finding that made the GPU suspect or quarantined it), so the controller bounds the
maintenance window by that condition's urgency rather than a routine check's
(harmonaize/maintenancetables.py). Sans-I/O."""

from __future__ import annotations

import re

from harmonaize.maintenancetables import ValidationCause as Cause

#: The GPU rules' finding types (agent/gpu/rules.py), by the condition they mean.
FINDINGS: dict[str, Cause] = {
    "EccUncorrectable": Cause.UNCORRECTABLE_MEMORY,
    "RowRemapPending": Cause.UNCORRECTABLE_MEMORY,
    "RowRemapFailure": Cause.UNCORRECTABLE_MEMORY,
    "PageRetirementPending": Cause.UNCORRECTABLE_MEMORY,
    "RetiredPagesLimit": Cause.UNCORRECTABLE_MEMORY,
    "EccCorrectableRate": Cause.CORRECTABLE_TREND,
    "ThermalSlowdown": Cause.THERMAL,
    "PowerSlowdown": Cause.THERMAL,
    "PcieReplayRate": Cause.LINK_DEGRADED,
    "PcieLinkDegraded": Cause.LINK_DEGRADED,
    "NvlinkErrors": Cause.LINK_DEGRADED,
    "NvlinkDown": Cause.LINK_DEGRADED,
    "RecoveryAction": Cause.GPU_FAULT,
    "GpuUnresponsive": Cause.GPU_FAULT,
    "GpuLost": Cause.GPU_FAULT,
}
#: XIDs whose class is not a GPU fault as such: memory (a double-bit error, a row remap,
#: contained or uncontained ECC), excessive single-bit errors, an NVLink error.
XIDS: dict[int, Cause] = {
    48: Cause.UNCORRECTABLE_MEMORY, 63: Cause.UNCORRECTABLE_MEMORY,
    64: Cause.UNCORRECTABLE_MEMORY, 94: Cause.UNCORRECTABLE_MEMORY,
    95: Cause.UNCORRECTABLE_MEMORY, 92: Cause.CORRECTABLE_TREND, 74: Cause.LINK_DEGRADED,
}
_ORDER = list(Cause)  # from the most urgent
_XID = re.compile(r"\bxid (\d+)\b")


def cause_of(state: str, why: str, trigger: str) -> Cause:
    """The condition behind validating a GPU in ``state`` for the reason ``why`` (the
    GPU domain's "Finding: message"), planned for ``trigger``."""
    if trigger in ("operator", "schedule") or state == "healthy":
        return Cause.ROUTINE
    if why.startswith("validation failed"):
        return Cause.GPU_FAULT  # a failed check: the GPU is validated again after repair
    finding = why.split(":", 1)[0].strip()
    if finding == "Xid":
        found = [XIDS.get(int(n), Cause.GPU_FAULT) for n in _XID.findall(why)]
        return min(found, key=_ORDER.index, default=Cause.GPU_FAULT)
    return FINDINGS.get(finding, Cause.ROUTINE)
