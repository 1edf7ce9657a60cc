"""Bad input, named by its field: each check raises :class:`BadInput` with one line, and
the engine changes nothing for it."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping

from controller.negotiation.table import MAX_DURATION, MAX_HORIZON
from controller.negotiation.types import BadInput, CapacityRelease, Flexibility, Proposal

#: Request and offer ids: short, printable, no spaces (they come back in logs and URLs).
ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def check_id(field: str, value: object) -> str:
    if not isinstance(value, str) or not ID.fullmatch(value):
        raise BadInput(field, "1 to 64 of A-Z a-z 0-9 . _ : -")
    return value


def check_tenant(tenant: object, tenants: Collection[str]) -> str:
    if not isinstance(tenant, str) or tenant not in tenants:
        raise BadInput("tenant", "not a tenant that may negotiate")
    return tenant


def _count(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(field, "a whole number of GPUs, at least 1")
    return value


def _time(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value):
        raise BadInput(field, "a finite number of seconds")
    return float(value)


def check_proposal(p: Proposal, tenants: Collection[str],
                   view: Mapping[tuple[str, str], CapacityRelease], now: float) -> None:
    """Everything about a proposal that makes it impossible, whatever the capacity."""
    check_id("request_id", p.request_id)
    check_tenant(p.tenant, tenants)
    pools = {pool for pool, _ in view}
    if p.pool not in pools:
        raise BadInput("pool", "no such pool in the released view")
    released = view.get((p.pool, p.gpu_class))
    if released is None:
        raise BadInput("gpu_class", f"pool {p.pool} has no such GPU class in the released "
                       "view")
    low, high = _count("min_count", p.min_count), _count("max_count", p.max_count)
    if low > high:
        raise BadInput("min_count", f"{low} is above max_count {high}")
    if high > released.ceiling:
        raise BadInput("max_count", f"{high} is above the most this pool can hold "
                       f"({released.ceiling})")
    earliest = _time("earliest_start", p.earliest_start)
    latest = _time("latest_start", p.latest_start)
    duration = _time("duration", p.duration)
    if latest < earliest:
        raise BadInput("latest_start", "before earliest_start")
    if latest < now:
        raise BadInput("latest_start", "already past")
    if latest > now + MAX_HORIZON:
        raise BadInput("latest_start", f"more than {MAX_HORIZON / 86400:.0f} days ahead")
    if not 0 < duration <= MAX_DURATION:
        raise BadInput("duration", f"more than 0 and at most {MAX_DURATION / 86400:.0f} "
                       "days")
    if not isinstance(p.flexibility, Flexibility):
        raise BadInput("flexibility", "one of " + ", ".join(f.value for f in Flexibility))
