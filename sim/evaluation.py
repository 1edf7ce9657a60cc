"""The privacy-utility evaluation: many seeds, both fault sources, three arrival scales.

A *scenario* is (seed, fault source, arrival scale) on one job trace. Every regime runs on
every scenario of its grid, each run in a worker process (deterministic from its seed,
so the split changes nothing). The cluster is sized from the trace at its own arrival
times, so every arrival scale of a seed runs on the same cluster (sim.traces.sizing_jobs).

Utility, pre-registered (fixed before any run of this evaluation, and the same for every
trace): per scenario, the share of full visibility's mean-JCT benefit a regime keeps,
``(none - regime) / (none - full)``, is *defined* only where full visibility beats no
feed by at least :data:`MARGIN_H` hours of mean JCT **and** :data:`MARGIN_REL` of no
feed's mean JCT. Elsewhere the denominator is noise (one early decision reorders a
queue), so those scenarios are reported in hours only and never enter a median or a
worst case. The same rule applies per pool, on the pool's own mean JCT.

Leakage is pooled per regime over the scenarios' test spans (sim.learned: a fixed
protocol, repeated, independent of the runs' order), with chance measured by the same
protocol on the no-feed regime's rows.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sim.learned import REPEATS, LearnedScore, score
from sim.model import SimConfig
from sim.regimes import Regime
from sim.scenario import Outcome, build, evaluate
from sim.traces import JobTraceOptions, load_faults, read_jobs, select_jobs, sizing_jobs

SOURCES = ("trace", "model")
SCALES = (0.8, 1.0, 1.2)
#: The pre-registered margin: full visibility must beat no feed by this many hours of
#: mean JCT...
MARGIN_H = 0.25
#: ...and by this share of no feed's mean JCT, for a share of its benefit to be defined.
MARGIN_REL = 0.05


@dataclass(frozen=True)
class Spec:
    seed: int
    source: str
    scale: float

    def label(self) -> str:
        return f"seed {self.seed}, {self.source} faults, arrivals x{self.scale:g}"


@dataclass(frozen=True)
class Run:
    spec: Spec
    outcome: Outcome


def grid(seeds: Sequence[int], sources: Sequence[str] = SOURCES,
         scales: Sequence[float] = SCALES) -> list[Spec]:
    return [Spec(seed, source, scale) for source in sources for scale in scales
            for seed in seeds]


_CACHE: dict[Spec, object] = {}
_PATHS: tuple[Path, Path | None] | None = None


def _scenario(spec: Spec):  # noqa: ANN202 - a sim.scenario.Scenario
    scenario = _CACHE.get(spec)
    if scenario is None:
        assert _PATHS is not None
        jobs_path, faults_path = _PATHS
        cfg = SimConfig(seed=spec.seed, fault_source=spec.source)
        raw = read_jobs(jobs_path)
        opts = JobTraceOptions(arrival_scale=spec.scale, seed=spec.seed)
        faults = None if faults_path is None else load_faults(faults_path)
        _CACHE.clear()  # one scenario at a time per worker: they are large
        scenario = _CACHE[spec] = build(cfg, select_jobs(raw, opts), faults,
                                        sizing_jobs(raw, opts))
    return scenario


def _init(paths: tuple[Path, Path | None]) -> None:
    global _PATHS  # noqa: PLW0603 - set once per worker process
    _PATHS = paths


def _task(task: tuple[Spec, Regime]) -> Run:
    spec, regime = task
    return Run(spec, evaluate(_scenario(spec), regime, score_runs=False))


def run_all(tasks: Sequence[tuple[Spec, Regime]], jobs_path: Path, faults_path: Path | None,
            workers: int | None = None) -> list[Run]:
    """Every (scenario, regime), grouped by scenario so a worker builds each once."""
    ordered = sorted(tasks, key=lambda t: (t[0].source, t[0].scale, t[0].seed))
    workers = min(len(ordered), workers or os.cpu_count() or 1)
    paths = (jobs_path, faults_path)
    if workers <= 1:
        _init(paths)
        return [_task(t) for t in ordered]
    ctx = multiprocessing.get_context("fork" if "fork" in
                                      multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(paths,)) as pool:
        return pool.map(_task, ordered, chunksize=1)


# --- what the runs say -------------------------------------------------------------------

def share_defined(none_h: float, full_h: float) -> bool:
    """Whether full visibility beats no feed by the pre-registered margin (both parts)."""
    gap = none_h - full_h
    return gap >= MARGIN_H and gap >= MARGIN_REL * none_h


def kept_share(none_h: float, regime_h: float, full_h: float) -> float | None:
    """The share of full visibility's benefit kept, or None where it is not defined."""
    if not share_defined(none_h, full_h):
        return None
    return (none_h - regime_h) / (none_h - full_h)


@dataclass(frozen=True)
class Utility:
    spec: Spec
    none_h: float
    full_h: float
    regime_h: float

    @property
    def share(self) -> float | None:
        return kept_share(self.none_h, self.regime_h, self.full_h)

    @property
    def gained_h(self) -> float:
        return self.none_h - self.regime_h

    @property
    def full_gained_h(self) -> float:
        return self.none_h - self.full_h


def _by_regime(runs: Sequence[Run]) -> dict[tuple[Spec, str], Outcome]:
    return {(r.spec, r.outcome.regime.name): r.outcome for r in runs}


def _specs(runs: Sequence[Run], regime: str) -> list[Spec]:
    return sorted({r.spec for r in runs if r.outcome.regime.name == regime},
                  key=lambda s: (s.source, s.scale, s.seed))


def utilities(runs: Sequence[Run], regime: str) -> list[Utility]:
    by = _by_regime(runs)
    return [Utility(s, by[(s, "none")].summary.mean_jct_h, by[(s, "full")].summary.mean_jct_h,
                    by[(s, regime)].summary.mean_jct_h)
            for s in _specs(runs, regime) if (s, "none") in by and (s, "full") in by]


@dataclass(frozen=True)
class UtilitySummary:
    #: Scenarios where the share is defined, and those left to hours.
    n: int
    excluded: tuple[Utility, ...]
    median: float
    worst: float
    worst_spec: Spec
    median_gained_h: float
    median_full_gained_h: float


def summarize_utility(us: Sequence[Utility]) -> UtilitySummary | None:
    """Median and worst share over the scenarios where it is defined (None: there are
    none); the hours are medians over the same scenarios."""
    rows = [u for u in us if u.share is not None]
    excluded = tuple(u for u in us if u.share is None)
    if not rows:
        return None
    worst = min(rows, key=lambda u: u.share if u.share is not None else 0.0)
    return UtilitySummary(len(rows), excluded,
                          statistics.median(u.share for u in rows if u.share is not None),
                          worst.share if worst.share is not None else 0.0, worst.spec,
                          statistics.median(u.gained_h for u in rows),
                          statistics.median(u.full_gained_h for u in rows))


@dataclass(frozen=True)
class PoolUtility:
    """One pool over the scenarios: its size, and the share kept where it is defined."""

    pool: str
    gpus: int
    #: Scenarios with a defined share for this pool, and all scenarios with the pool.
    n: int
    scenarios: int
    median: float | None
    worst: float | None
    median_gained_h: float
    median_full_gained_h: float


def pool_utilities(runs: Sequence[Run], regime: str) -> list[PoolUtility]:
    """Per pool, smallest first: the share of full visibility's benefit kept on the
    pool's own mean JCT, under the same pre-registered margin."""
    by = _by_regime(runs)
    shares: dict[str, list[float]] = {}
    gained: dict[str, list[tuple[float, float]]] = {}
    gpus: dict[str, int] = {}
    for s in _specs(runs, regime):
        if (s, "none") not in by or (s, "full") not in by:
            continue
        none, full, mine = by[(s, "none")], by[(s, "full")], by[(s, regime)]
        gpus.update(mine.pool_gpus)
        for pool, (_, regime_h) in mine.per_pool.items():
            if pool not in none.per_pool or pool not in full.per_pool:
                continue
            none_h, full_h = none.per_pool[pool][1], full.per_pool[pool][1]
            gained.setdefault(pool, []).append((none_h - regime_h, none_h - full_h))
            share = kept_share(none_h, regime_h, full_h)
            if share is not None:
                shares.setdefault(pool, []).append(share)
    out = []
    for pool, hours in gained.items():
        mine_s = shares.get(pool, [])
        out.append(PoolUtility(pool, gpus.get(pool, 0), len(mine_s), len(hours),
                               statistics.median(mine_s) if mine_s else None,
                               min(mine_s) if mine_s else None,
                               statistics.median(h for h, _ in hours),
                               statistics.median(f for _, f in hours)))
    return sorted(out, key=lambda p: (p.gpus, p.pool))


Scores = tuple[LearnedScore, LearnedScore]


def attacks(runs: Sequence[Run], regime: str, sources: Sequence[str] = SOURCES,
            repeats: int = REPEATS, baseline: Scores | None = None) -> Scores:
    """The two learned attacks on a regime, pooled over its runs (of these sources), each
    with its chance level measured: the same protocol on the no-feed regime's runs
    (``baseline``, when already scored: :func:`chance_baseline`)."""
    mine = _attack_scores(runs, regime, sources, repeats)
    base = baseline or chance_baseline(runs, sources, repeats)
    return (replace(mine[0], chance=base[0].accuracy),
            replace(mine[1], chance=base[1].accuracy))


def chance_baseline(runs: Sequence[Run], sources: Sequence[str] = SOURCES,
                    repeats: int = REPEATS) -> Scores:
    """Both attacks on the no-feed regime: what the protocol scores with nothing to learn
    from (a collapsed learner scores exactly 0.5 and says so)."""
    base = _attack_scores(runs, "none", sources, repeats)
    return replace(base[0], chance=base[0].accuracy), replace(base[1], chance=base[1].accuracy)


def _attack_scores(runs: Sequence[Run], regime: str, sources: Sequence[str],
                   repeats: int) -> Scores:
    mine = [r.outcome for r in runs if r.outcome.regime.name == regime
            and r.spec.source in sources]
    load = score("others' load above median", [o.load_data for o in mine if o.load_data],
                 repeats=repeats)
    failed = score("a host failed in the window",
                   [o.failure_data for o in mine if o.failure_data], repeats=repeats)
    return load, failed


def epsilon_day(runs: Sequence[Run], regime: str) -> float:
    return max((r.outcome.epsilon_day_max for r in runs if r.outcome.regime.name == regime),
               default=0.0)
