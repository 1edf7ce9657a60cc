"""What the negotiation regime is measured by (sim/negotiation.py), per run: job wait and
completion time (mean, median, p99; gang jobs' mean wait apart), utilisation, Jain's
fairness index across tenants, and the regime's own counts."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.engine import RunResult
from sim.jobs import DONE
from sim.metrics import percentile

#: Bounded slowdown's floor (seconds): a one-minute job waiting ten minutes is not
#: eleven times worse off than a day-long one waiting a day and ten minutes.
SLOWDOWN_FLOOR = 600.0


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


@dataclass(frozen=True)
class Figures:
    regime: str
    mean_wait_h: float
    median_wait_h: float
    p99_wait_h: float
    mean_jct_h: float
    p99_jct_h: float
    gang_mean_wait_h: float
    utilization: float
    #: Jain's index over tenants of 1 / (their jobs' mean bounded slowdown).
    jain: float
    counters: dict[str, float] = field(default_factory=dict)


def figures(result: RunResult, gang_above: int = 8) -> Figures:
    waits, jcts, gang = [], [], []
    slow: dict[str, list[float]] = {}
    for j in result.jobs:
        if j.state != DONE:
            continue
        wait = j.first_start - j.arrival
        jct = j.finish - j.arrival
        waits.append(wait)
        jcts.append(jct)
        if j.n > gang_above:
            gang.append(wait)
        slow.setdefault(j.tenant, []).append(
            max(jct, SLOWDOWN_FLOOR) / max(j.work, SLOWDOWN_FLOOR))
    h = 3600.0
    service = [1.0 / statistics.fmean(v) for _, v in sorted(slow.items())]
    return Figures(
        result.regime.name,
        statistics.fmean(waits) / h if waits else 0.0,
        statistics.median(waits) / h if waits else 0.0,
        percentile(waits, 99) / h,
        statistics.fmean(jcts) / h if jcts else 0.0,
        percentile(jcts, 99) / h,
        statistics.fmean(gang) / h if gang else 0.0,
        result.alloc_gpu_s_horizon / result.cap_gpu_s_horizon
        if result.cap_gpu_s_horizon else 0.0,
        jain(service),
        dict(result.negotiation))
