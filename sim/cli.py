"""``harmonaize-sim``: tenants on no feed, the redacted feed and full visibility, on real traces.

Runs one scenario (deterministic from ``--seed``), prints a table comparing the regimes
and the headline numbers, sweeps the redaction's coarseness, and writes the
privacy-utility figures as PNGs. With ``--energy``, instead: the GPU energy saved against
the JCT stretched when every tenant declares each slack of ``--slack`` (sim/energy.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from sim import energy, regimes
from sim.model import OPPORTUNITIES, SimConfig
from sim.plots import frontier_figures, write_all
from sim.report import (
    ablation_table,
    by_name,
    frontier_rows,
    headline,
    pool_table,
    regime_table,
    scenario_line,
    seeds_table,
    sweep_table,
)
from sim.scenario import Outcome, Scenario, evaluate_all, from_traces
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS, JobTraceOptions, TraceError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harmonaize-sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=Path, default=PHILLY_JOBS,
                   help="job trace in the Philly/Sia CSV columns (default: the Philly trace)")
    p.add_argument("--faults", default=str(INFINITEHBD_FAULTS),
                   help="fault trace in InfiniteHBD's JSON shape, or 'none'")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1,
                   help="also rerun none/redacted/full with this many seeds in all")
    g = p.add_argument_group("subset and scale the job trace")
    g.add_argument("--start-day", type=float, default=0.0)
    g.add_argument("--days", type=float, default=None, help="keep this many days of arrivals")
    g.add_argument("--pools", default=None, help="comma-separated virtual clusters to keep")
    g.add_argument("--sample", type=float, default=1.0, help="keep each job with probability")
    g.add_argument("--max-jobs", type=int, default=None)
    g.add_argument("--arrival-scale", type=float, default=1.0,
                   help="multiply arrival times (below 1: more load)")
    g.add_argument("--duration-scale", type=float, default=1.0)
    m = p.add_argument_group("model")
    m.add_argument("--fault-source", choices=("trace", "model", "none"), default="trace")
    m.add_argument("--fault-time-scale", type=float, default=1.0,
                   help="simulated seconds per fault-trace second (below 1: more faults)")
    m.add_argument("--demand-quantile", type=float, default=0.9,
                   help="size each pool for this quantile of its demand")
    m.add_argument("--load-factor", type=float, default=1.0)
    m.add_argument("--precursor-fraction", type=float, default=0.5)
    e = p.add_argument_group("energy (instead of the feed's regimes)")
    e.add_argument("--energy", action="store_true",
                   help="GPU energy saved against JCT stretched, per slack tenants declare")
    e.add_argument("--slack", default="0,0.05,0.1",
                   help="comma-separated slowdowns every tenant declares (default %(default)s)")
    o = p.add_argument_group("output")
    o.add_argument("--no-sweep", action="store_true", help="only none, redacted and full")
    o.add_argument("--sweep", choices=("private", "coarse"), default="private",
                   help="vary the private feed's ε per day and interval (default), or the "
                   "coarse feed's knobs one at a time")
    o.add_argument("--ablation", action="store_true",
                   help="also run each tenant decision on its own")
    o.add_argument("--out", type=Path, default=Path("out/sim"), help="folder for the PNGs")
    o.add_argument("--json", type=Path, default=None, help="write every outcome as JSON")
    o.add_argument("--workers", type=int, default=None,
                   help="parallel runs (default: one per CPU); results do not depend on it")
    return p


def _outcome_json(o: Outcome) -> dict[str, object]:
    return {"regime": o.regime.name, "knob": o.regime.knob, "value": o.regime.value,
            "summary": o.summary.row(), "load_attack": asdict(o.load_attack),
            "failure_attack": asdict(o.failure_attack), "counters": o.counters,
            "policy": o.policy, "breakdown_gpu_h": o.breakdown_gpu_h, "per_pool": o.per_pool}


def _ablation(scenario: Scenario, workers: int | None) -> list[tuple[str, Outcome, Outcome,
                                                                     Outcome]]:
    rows = []
    for opportunity in OPPORTUNITIES:
        cfg = replace(scenario.cfg, opportunities=(opportunity,))
        only = replace(scenario, cfg=cfg)
        none, red, full = (
            replace(o, regime=replace(o.regime, name=f"{o.regime.name}, only {opportunity}"))
            for o in evaluate_all(only, regimes.main_regimes(), workers))
        rows.append((opportunity, none, red, full))
    return rows


def _slacks(text: str) -> list[float] | None:
    """``--slack`` as sorted slowdowns with 0 among them, or None after one line why."""
    try:
        slacks = sorted({float(s) for s in text.split(",")} | {0.0})
    except ValueError:
        print(f"harmonaize-sim: --slack: not numbers: {text}", file=sys.stderr)
        return None
    if not all(0.0 <= s <= 0.5 for s in slacks):
        print("harmonaize-sim: --slack: each slowdown must be within 0..0.5", file=sys.stderr)
        return None
    return slacks


def _energy(args: argparse.Namespace, scenario: Scenario, slacks: list[float]) -> int:
    began = time.perf_counter()
    print(f"scenario: {scenario_line(scenario)}")
    outcomes = energy.evaluate_slacks(scenario, slacks, args.workers)
    print()
    print("What the agent's energy loop settles on per workload (Zeus NSDI '23, A40):")
    print(energy.effects_table(outcomes))
    print()
    print("The whole trace, every tenant declaring the slack, no feed:")
    print(energy.results_table(outcomes))
    print()
    print(energy.headline(outcomes))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"scenario": scenario_line(scenario), "energy": [
            {"slack": o.slack, "energy_mwh": o.energy_mwh, "gpu_h": o.gpu_h,
             "mean_jct_h": o.mean_jct_h, "p99_jct_h": o.p99_jct_h, "finished": o.finished,
             "effects": {k: asdict(v) for k, v in o.effects.items()}}
            for o in outcomes]}, indent=1))
    print(f"\n{len(outcomes)} runs in {time.perf_counter() - began:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Arguments first: a bad one is told before minutes of reading a trace.
    slacks = _slacks(args.slack) if args.energy else []
    if slacks is None:
        return 2
    try:
        cfg = SimConfig(seed=args.seed, fault_source=args.fault_source,
                        fault_time_scale=args.fault_time_scale,
                        demand_quantile=args.demand_quantile, load_factor=args.load_factor,
                        precursor_fraction=args.precursor_fraction)
        opts = JobTraceOptions(
            start_day=args.start_day, days=args.days,
            pools=None if args.pools is None else tuple(args.pools.split(",")),
            sample=args.sample, max_jobs=args.max_jobs, arrival_scale=args.arrival_scale,
            duration_scale=args.duration_scale, seed=args.seed)
        faults = None if args.faults == "none" else Path(args.faults)
        scenario = from_traces(cfg, args.jobs, faults, opts)
    except (TraceError, ValueError) as exc:
        print(f"harmonaize-sim: {exc}", file=sys.stderr)
        return 2
    if not scenario.jobs:
        print("harmonaize-sim: no jobs left after subsetting", file=sys.stderr)
        return 2
    if args.energy:
        return _energy(args, scenario, slacks)
    began = time.perf_counter()
    print(f"scenario: {scenario_line(scenario)}")
    main_runs = evaluate_all(scenario, regimes.main_regimes(), args.workers)
    print()
    print(regime_table(main_runs))
    print()
    print(headline(main_runs))
    named = by_name(main_runs)
    print()
    print(f"Per pool (pools with 100 jobs or more; k = {regimes.redacted().redaction.min_hosts}):")
    print(pool_table(main_runs, scenario, regimes.redacted().redaction.min_hosts))
    everything = list(main_runs)
    if not args.no_sweep:
        if args.sweep == "coarse":
            sweep = regimes.coarse_sweep()
            points = evaluate_all(scenario, sweep, args.workers)
            everything += points
            print()
            print("Sweep over the coarse feed (one knob at a time from its default):")
            print(sweep_table(points, named["none"], named["full"]))
            paths = write_all(args.out, points, named["none"], named["full"])
        else:
            default = regimes.redacted().redaction
            sweep = [r for r in regimes.frontier() if r.redaction != default]
            # The default is no point of the hourly ε series: it is drawn on its own.
            points = [replace(named["redacted"], regime=regimes.redacted(
                knob="default", name=f"default (eps {default.epsilon_per_day:g}/day every "
                f"{default.release_interval:g}s)")),
                *evaluate_all(scenario, sweep, args.workers)]
            everything += points[1:]
            print()
            print("Sweep over the private feed (ε per pool per day, release interval; "
                  "one run: a failure attack on one run rests on few positives):")
            print(sweep_table(points, named["none"], named["full"]))
            paths = frontier_figures(args.out, frontier_rows(points, named["none"],
                                                             named["full"]))
        print()
        print("figures: " + ", ".join(str(p) for p in paths))
    if args.seeds > 1:
        runs = [(args.seed, main_runs)]
        for seed in range(args.seed + 1, args.seed + args.seeds):
            other = replace(scenario.cfg, seed=seed)
            rebuilt = from_traces(other, args.jobs, faults, replace(opts, seed=seed))
            outs = evaluate_all(rebuilt, regimes.main_regimes(), args.workers)
            runs.append((seed, outs))
            everything += [replace(o, regime=replace(o.regime, name=f"{o.regime.name}, seed "
                                                     f"{seed}")) for o in outs]
        print()
        print("Other seeds (tenants, elastic jobs, fault mapping, precursors, congestion):")
        print(seeds_table(runs))
    if args.ablation:
        rows = _ablation(scenario, args.workers)
        print()
        print("Each tenant decision on its own (the others at their defaults):")
        print(ablation_table(rows))
        for _, *outs in rows:
            everything += outs
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"scenario": scenario_line(scenario),
                                         "outcomes": [_outcome_json(o) for o in everything]},
                                        indent=1))
    print(f"\n{len(everything)} runs in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
