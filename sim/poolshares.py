"""The share of full visibility's benefit each pool keeps, by pool size.

Per scenario and pool, the share is ``(none - regime) / (none - full)`` on the pool's
mean JCT, defined only where full visibility beats no feed in that pool by at least
``margin_h`` hours (elsewhere the share of a tiny or negative gap means nothing, and it
is left out, never counted as 0 or 100%). Per pool and regime: the median over the
scenarios where it is defined, and how many those are.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Per pool: (jobs finished, mean JCT in hours), as sim.metrics.per_pool_jct gives it.
PerPool = Mapping[str, tuple[int, float]]


@dataclass(frozen=True)
class ScenarioPools:
    """One scenario's per-pool results: each regime's, and the pools' sizes in GPUs."""

    label: str
    gpus: Mapping[str, int]
    #: Per regime name (``none`` and ``full`` among them): mean JCT over all jobs, hours.
    mean_h: Mapping[str, float]
    per_pool: Mapping[str, PerPool]


@dataclass(frozen=True)
class PoolShare:
    pool: str
    gpus: int
    regime: str
    median: float | None
    defined: int
    scenarios: int


def share(none_h: float, full_h: float, regime_h: float, margin_h: float) -> float | None:
    gap = none_h - full_h
    return None if gap < margin_h else (none_h - regime_h) / gap


def pool_shares(runs: Sequence[ScenarioPools], regime: str, margin_h: float,
                min_jobs: int = 100) -> list[PoolShare]:
    """Each pool's median share for ``regime`` (pools with ``min_jobs`` finished jobs),
    smallest pool first."""
    values: dict[str, list[float]] = {}
    seen: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for run in runs:
        none, full, mine = (run.per_pool.get(k, {}) for k in ("none", "full", regime))
        for pool, (jobs, none_h) in none.items():
            if jobs < min_jobs or pool not in full or pool not in mine:
                continue
            seen[pool] = seen.get(pool, 0) + 1
            gpus[pool] = run.gpus[pool]
            s = share(none_h, full[pool][1], mine[pool][1], margin_h)
            if s is not None:
                values.setdefault(pool, []).append(s)
    return [PoolShare(p, gpus[p], regime,
                      statistics.median(values[p]) if values.get(p) else None,
                      len(values.get(p, ())), seen[p])
            for p in sorted(seen, key=lambda p: (gpus[p], p))]


def overall(runs: Sequence[ScenarioPools], regime: str,
            margin_h: float) -> tuple[float | None, float | None, int]:
    """The whole cluster's share: median and worst over scenarios where it is defined,
    and how many those are."""
    shares = [s for r in runs if regime in r.mean_h
              if (s := share(r.mean_h["none"], r.mean_h["full"], r.mean_h[regime],
                             margin_h)) is not None]
    if not shares:
        return None, None, 0
    return statistics.median(shares), min(shares), len(shares)
