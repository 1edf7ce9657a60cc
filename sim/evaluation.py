"""The privacy-utility evaluation: many seeds, both fault sources, three arrival scales.

A *scenario* is (seed, fault source, arrival scale) on one job trace. Every regime runs on
every scenario of its grid, each run in a worker process (deterministic from its seed,
so the split changes nothing). Utility is per scenario: the share of full visibility's
mean-JCT benefit a regime keeps, ``(none - regime) / (none - full)``, beside the absolute
differences in hours (the share is unstable where ``none - full`` is small). Leakage is
pooled per regime over the scenarios' test spans (sim.learned), with 95% intervals.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.learned import LearnedScore, score
from sim.model import SimConfig
from sim.regimes import Regime
from sim.scenario import Outcome, build, evaluate
from sim.traces import JobTraceOptions, load_faults, load_jobs

SOURCES = ("trace", "model")
SCALES = (0.8, 1.0, 1.2)


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
        jobs = load_jobs(jobs_path, JobTraceOptions(arrival_scale=spec.scale, seed=spec.seed))
        faults = None if faults_path is None else load_faults(faults_path)
        _CACHE.clear()  # one scenario at a time per worker: they are large
        scenario = _CACHE[spec] = build(cfg, jobs, faults)
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

@dataclass(frozen=True)
class Utility:
    spec: Spec
    none_h: float
    full_h: float
    regime_h: float

    @property
    def share(self) -> float | None:
        gap = self.none_h - self.full_h
        return None if abs(gap) < 1e-9 else (self.none_h - self.regime_h) / gap

    @property
    def gained_h(self) -> float:
        return self.none_h - self.regime_h


def utilities(runs: Sequence[Run], regime: str) -> list[Utility]:
    by = {(r.spec, r.outcome.regime.name): r.outcome.summary.mean_jct_h for r in runs}
    specs = sorted({r.spec for r in runs if r.outcome.regime.name == regime},
                   key=lambda s: (s.source, s.scale, s.seed))
    return [Utility(s, by[(s, "none")], by[(s, "full")], by[(s, regime)]) for s in specs
            if (s, "none") in by and (s, "full") in by]


@dataclass(frozen=True)
class UtilitySummary:
    n: int
    median: float
    worst: float
    worst_spec: Spec
    median_gained_h: float
    median_full_gained_h: float


def summarize_utility(us: Sequence[Utility]) -> UtilitySummary | None:
    rows = [u for u in us if u.share is not None]
    if not rows:
        return None
    worst = min(rows, key=lambda u: u.share or 0.0)
    return UtilitySummary(len(rows), statistics.median(u.share or 0.0 for u in rows),
                          worst.share or 0.0, worst.spec,
                          statistics.median(u.gained_h for u in rows),
                          statistics.median(u.none_h - u.full_h for u in rows))


def attacks(runs: Sequence[Run], regime: str,
            sources: Sequence[str] = SOURCES) -> tuple[LearnedScore, LearnedScore]:
    """The two learned attacks on a regime, pooled over its runs (of these sources)."""
    mine = [r.outcome for r in runs if r.outcome.regime.name == regime
            and r.spec.source in sources]
    load = score("others' load above median", [o.load_data for o in mine if o.load_data])
    failed = score("a host failed in the window",
                   [o.failure_data for o in mine if o.failure_data])
    return load, failed


def epsilon_day(runs: Sequence[Run], regime: str) -> float:
    return max((r.outcome.epsilon_day_max for r in runs if r.outcome.regime.name == regime),
               default=0.0)
