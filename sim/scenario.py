"""A scenario (cluster, jobs, faults) built from traces, and running regimes over it."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sim.cluster import (
    Cluster,
    CongestionSpec,
    FaultSpec,
    congestion_episodes,
    map_trace_faults,
    model_faults,
    size_cluster,
)
from sim.engine import RunResult, Simulation
from sim.learned import AttackData, LearnedScore, failure_data, load_data, score
from sim.metrics import Summary, per_pool_jct, summarize
from sim.model import SimConfig
from sim.regimes import Regime
from sim.traces import (
    INFINITEHBD_FAULTS,
    PHILLY_JOBS,
    FaultTrace,
    JobSpec,
    JobTraceOptions,
    load_faults,
    read_jobs,
    select_jobs,
    sizing_jobs,
    with_tenants,
)


@dataclass(frozen=True)
class Scenario:
    cfg: SimConfig
    cluster: Cluster
    jobs: tuple[JobSpec, ...]
    faults: tuple[FaultSpec, ...]
    congestion: tuple[CongestionSpec, ...]


@dataclass(frozen=True)
class Outcome:
    """One regime's results, small enough to send back from a worker process."""

    regime: Regime
    summary: Summary
    #: The learned attacks on this run alone (sim.learned); a run's failure attack rests
    #: on few positives, so reports pool runs' ``*_data`` with :func:`sim.learned.score`.
    load_attack: LearnedScore
    failure_attack: LearnedScore
    counters: dict[str, int]
    policy: dict[str, int] = field(default_factory=dict)
    breakdown_gpu_h: dict[str, float] = field(default_factory=dict)
    #: Per pool: (jobs finished, mean JCT in hours).
    per_pool: dict[str, tuple[int, float]] = field(default_factory=dict)
    load_data: AttackData | None = None
    failure_data: AttackData | None = None
    #: ε each pool spent over the run's busiest 24 hours (private mode; 0 otherwise).
    epsilon_day_max: float = 0.0
    #: Per pool: its GPUs (the cluster as sized, the same in every regime).
    pool_gpus: dict[str, int] = field(default_factory=dict)


def build(cfg: SimConfig, jobs: Sequence[JobSpec], faults: FaultTrace | None,
          sizing: Sequence[JobSpec] | None = None) -> Scenario:
    """Size the cluster for ``sizing`` (default: ``jobs``), give jobs owners, and lay the
    faults on the nodes.

    Pass the jobs at the trace's own arrival times as ``sizing`` when ``jobs`` had their
    arrivals scaled (sim.traces.sizing_jobs): the cluster is then the same at every scale
    and only the load on it changes.
    """
    owned = with_tenants(jobs, cfg.tenants, cfg.seed)
    cluster = size_cluster(owned if sizing is None else sizing, cfg)
    # Random processes run until well past the last job's expected end.
    horizon = max((j.arrival + 3 * j.duration for j in owned), default=0.0)
    fault_specs: list[FaultSpec] = []
    if faults is not None and cfg.fault_source == "trace":
        fault_specs = map_trace_faults(faults, cluster, cfg, horizon)
    elif faults is not None and cfg.fault_source == "model":
        fault_specs = model_faults(faults, cluster, cfg, horizon)
    return Scenario(cfg, cluster, tuple(owned), tuple(fault_specs),
                    tuple(congestion_episodes(cluster, cfg, horizon)))


def from_traces(cfg: SimConfig, jobs_path: Path | str = PHILLY_JOBS,
                faults_path: Path | str | None = INFINITEHBD_FAULTS,
                opts: JobTraceOptions | None = None) -> Scenario:
    raw = read_jobs(jobs_path)
    faults = None if faults_path is None or cfg.fault_source == "none" else load_faults(
        faults_path)
    return build(cfg, select_jobs(raw, opts), faults, sizing_jobs(raw, opts))


def simulate(scenario: Scenario, regime: Regime) -> RunResult:
    return Simulation(scenario.cfg, scenario.cluster, scenario.jobs, regime,
                      faults=scenario.faults, congestion=scenario.congestion).run()


def evaluate(scenario: Scenario, regime: Regime, *, score_runs: bool = True) -> Outcome:
    """Simulate and measure; ``score_runs``: also run the learned attacks on this run alone
    (the evaluation pools many runs' attack data instead, sim.evaluation)."""
    result = simulate(scenario, regime)
    cfg = scenario.cfg
    policy: dict[str, int] = {}
    for stats in result.policy_stats.values():
        for k, v in stats.items():
            policy[k] = policy.get(k, 0) + v
    breakdown = {f"rollback {k}": v / 3600 for k, v in result.rollback_gpu_s.items()}
    breakdown.update({f"pause {k}": v / 3600 for k, v in result.pause_gpu_s.items()})
    tag = f"{cfg.seed}:{regime.name}"
    loads = load_data(result.records, cfg.sample_s, tag)
    failures = failure_data(result.records, cfg.attack_window_s, cfg.sample_s, tag)
    unscored = LearnedScore("not scored", 0.5, 0.5, 0.5, 0.5, 0, 0, "", 0, 0)
    return Outcome(regime, summarize(result),
                   score("others' load above median", [loads], cfg.seed) if score_runs
                   else unscored,
                   score("a host failed in the window", [failures], cfg.seed) if score_runs
                   else unscored,
                   dict(result.counters), policy, breakdown, per_pool_jct(result),
                   loads, failures, result.epsilon_day_max,
                   {p.name: p.nodes * scenario.cluster.gpus_per_node
                    for p in scenario.cluster.pools})


_SHARED: Scenario | None = None


def _init(scenario: Scenario) -> None:
    global _SHARED  # noqa: PLW0603 - one scenario per worker process, set once
    _SHARED = scenario


def _evaluate_shared(regime: Regime) -> Outcome:
    assert _SHARED is not None
    return evaluate(_SHARED, regime)


def evaluate_all(scenario: Scenario, regimes: Sequence[Regime],
                 workers: int | None = None) -> list[Outcome]:
    """Evaluate each regime, in parallel worker processes when there are several CPUs.

    Each run is deterministic from the scenario's seed, so the split changes nothing.
    """
    workers = min(len(regimes), workers or os.cpu_count() or 1)
    if workers <= 1:
        return [evaluate(scenario, r) for r in regimes]
    ctx = multiprocessing.get_context("fork" if "fork" in
                                      multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(scenario,)) as pool:
        return pool.map(_evaluate_shared, regimes, chunksize=1)
