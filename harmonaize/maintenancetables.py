"""The conditions behind a validation and how long each may wait: one table that the
host (which names the condition and checks a moved start against it) and the controller
(which negotiates the window within it) both read (docs/operator-guide.md, "Maintenance
windows"; docs/tenant-guide.md repeats the bounds)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ValidationCause(StrEnum):
    """The condition behind a validation, as coarse as the tenant may know it."""

    GPU_FAULT = "gpu-fault"                        # a fatal XID, a driver asking for recovery
    UNCORRECTABLE_MEMORY = "uncorrectable-memory"  # double-bit ECC, a row remap pending
    THERMAL = "thermal"                            # throttling that recurs
    LINK_DEGRADED = "link-degraded"                # an NVLink or PCIe link losing lanes
    CORRECTABLE_TREND = "correctable-trend"        # correctable ECC errors rising
    ROUTINE = "routine"                            # a periodic check, nothing seen


@dataclass(frozen=True)
class Urgency:
    #: The window starts at most this long after the notice was issued ...
    most_wait: float
    #: ... and at least this long after it is settled (the tenant's time to checkpoint).
    least_notice: float


HOUR = 3600.0
#: How long each condition may wait, ordered from the most urgent.
URGENCY: dict[ValidationCause, Urgency] = {
    ValidationCause.GPU_FAULT: Urgency(1 * HOUR, 300.0),
    ValidationCause.UNCORRECTABLE_MEMORY: Urgency(4 * HOUR, 600.0),
    ValidationCause.THERMAL: Urgency(12 * HOUR, 900.0),
    ValidationCause.LINK_DEGRADED: Urgency(24 * HOUR, 1800.0),
    ValidationCause.CORRECTABLE_TREND: Urgency(72 * HOUR, HOUR),
    ValidationCause.ROUTINE: Urgency(168 * HOUR, HOUR),
}
#: Seconds a negotiable notice gives beyond its condition's least notice: the controller
#: reads the lead on its own clock, after the notice's way to it, and a notice that
#: arrives with less than the least notice left is not negotiated.
NOTICE_MARGIN = 60.0
#: The longest lead a host gives a negotiable notice (the most patient condition's).
LONGEST_LEAD = max(u.least_notice for u in URGENCY.values()) + NOTICE_MARGIN
