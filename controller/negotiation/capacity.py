"""A tenant's share of a pool and the windows it fits in (pure functions).

Privacy (docs/tenant-guide.md, "Negotiating capacity and maintenance"): what a tenant is
offered is a function of the pool's private release (its free GPUs' lower edge), the
operator's configured weights, and the tenant's own holds and record, nothing else. So
an offer is post-processing of a release the tenant already received, and spends no
privacy budget; another tenant's holds never change it. The tenants' shares of a pool
add up to at most one, so the holds of all tenants together never exceed the release
they were made against.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.negotiation.table import COUNTER_HORIZON
from controller.negotiation.types import Flexibility, Proposal

#: A span of GPUs held: (start, end, count).
Span = tuple[float, float, int]

#: A tenant's record fades with this half-life: last month's no-shows matter little.
HALF_LIFE = 7 * 86400.0
#: GPU-seconds of good record every tenant starts with (one GPU-day): one early no-show
#: does not halve a newcomer's share.
PRIOR = 86400.0
#: A tenant's share never falls below this part of its weight's.
FLOOR = 0.25


def shares(weights: Mapping[str, float], max_share: float) -> dict[str, float]:
    """Each tenant's part of every pool: its weight over all weights, at most
    ``max_share`` (the per-tenant cap). They add up to at most one."""
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return {t: 0.0 for t in weights}
    return {t: min(max_share, max(w, 0.0) / total) for t, w in weights.items()}


@dataclass
class Record:
    """A tenant's held-and-used record, in GPU-seconds, decayed to ``at``."""

    used: float = 0.0
    no_show: float = 0.0
    at: float = 0.0

    def decayed(self, now: float) -> Record:
        if now <= self.at:
            return Record(self.used, self.no_show, self.at)
        keep = 0.5 ** ((now - self.at) / HALF_LIFE)
        return Record(self.used * keep, self.no_show * keep, now)

    def factor(self, now: float) -> float:
        """The part of its share a tenant may hold: one for a clean record, down to
        :data:`FLOOR` as its no-shows outweigh what it held and used."""
        r = self.decayed(now)
        return max(FLOOR, (r.used + PRIOR) / (r.used + r.no_show + PRIOR))


def allowance(free: int, share: float, factor: float) -> int:
    """GPUs a tenant may hold at any one time in a pool whose release says ``free``."""
    return max(0, math.floor(free * share * factor + 1e-9))


def peak(spans: Iterable[Span], start: float, end: float) -> int:
    """The most GPUs the spans hold at any instant of ``[start, end)``."""
    inside = [s for s in spans if s[0] < end and s[1] > start]
    points = {start} | {s for s, _, _ in inside if s > start}
    return max((sum(c for s, e, c in inside if s <= t < e) for t in points), default=0)


def _starts(spans: list[Span], first: float, last: float) -> list[float]:
    """Where a window can start: ``first``, and wherever a span ends in ``(first, last]``
    (the load only falls there)."""
    return sorted({first} | {e for _, e, _ in spans if first < e <= last})


def fit(p: Proposal, allowed: int, spans: list[Span], now: float
        ) -> tuple[int, float, str] | None:
    """(count, start, departs) for the earliest window that fits the proposal within
    ``allowed`` beside the tenant's own ``spans``; ``departs`` is empty for an offer, or
    says how a counter departs from the proposal ("count" or "time", where its
    flexibility allows). None: nothing fits."""
    first = max(p.earliest_start, now)

    def room(start: float) -> int:
        return allowed - peak(spans, start, start + p.duration)

    inside = _starts(spans, first, p.latest_start)
    for start in inside:
        if (free := room(start)) >= p.min_count:
            return min(p.max_count, free), start, ""
    if p.flexibility in (Flexibility.COUNT, Flexibility.ANY):
        # fewer GPUs in the tenant's own window: the most any start gives, earliest first
        best = max(((room(s), -s) for s in inside), default=(0, 0.0))
        if best[0] >= 1:
            return best[0], -best[1], "count"
    if p.flexibility in (Flexibility.TIME, Flexibility.ANY):
        later = _starts(spans, p.latest_start, p.latest_start + COUNTER_HORIZON)
        for start in later:
            if start > p.latest_start and (free := room(start)) >= p.min_count:
                return min(p.max_count, free), start, "time"
    return None
