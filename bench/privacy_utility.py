"""privacy-utility: the private feed's frontier and its default over the evaluation grid,
on any job trace in the documented CSV format (``--jobs FILE``; default: Philly).

Two parts, in one process pool (one worker per CPU):

* **Frontier** (``--frontier-seeds``, both fault sources, arrivals x1.0): no feed, full
  visibility, the coarse feed of before, and the private feed at each ε per pool per day
  of ``sim.regimes.EPSILONS`` and each release interval of ``sim.regimes.INTERVALS``.
* **Grid** (``--seeds``, both fault sources, arrivals x0.8 / x1.0 / x1.2 on one cluster):
  no feed, full visibility and the default private feed (the controller's defaults).

Per regime, the same table for every trace: the share of full visibility's mean-JCT
benefit kept (median and worst over the scenarios where it is defined under the
pre-registered margin of sim.evaluation; the others listed in hours), the hours gained,
both learned attacks pooled over the regime's runs (mean of the repeats, 95% interval,
the repeats' spread, chance measured on the no-feed regime, collapsed learners flagged),
the most ε any pool spent in 24 hours, and per pool (smallest first, with its GPUs) the
share kept. Writes ``privacy-utility.json`` and the frontier PNGs under ``--out``. The
last line is the default feed's median share kept over the grid (``nan`` where no
scenario has a defined share).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one learner thread per worker process

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim import regimes
from sim.cluster import size_cluster
from sim.evaluation import (
    MARGIN_H,
    MARGIN_REL,
    SCALES,
    SOURCES,
    Run,
    Scores,
    attacks,
    chance_baseline,
    epsilon_day,
    grid,
    pool_utilities,
    run_all,
    summarize_utility,
    utilities,
)
from sim.learned import REPEATS, LearnedScore
from sim.model import SimConfig
from sim.plots import frontier_figures
from sim.traces import (
    INFINITEHBD_FAULTS,
    PHILLY_JOBS,
    TraceError,
    load_faults,
    read_jobs,
    select_jobs,
)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _attack(s: LearnedScore) -> dict[str, object]:
    return asdict(s) | {"enough": s.enough, "collapsed_all": s.is_collapsed}


def summary_rows(runs: Sequence[Run], names: Sequence[str], sources: Sequence[str] = SOURCES,
                 repeats: int = REPEATS, baseline: Scores | None = None) -> list[dict]:
    baseline = baseline or chance_baseline(runs, sources, repeats)
    rows = []
    for name in names:
        us = [u for u in utilities(runs, name) if u.spec.source in sources]
        summ = summarize_utility(us)
        load, failed = baseline if name == "none" else attacks(runs, name, sources, repeats,
                                                               baseline)
        mine = [r for r in runs if r.spec.source in sources]
        rows.append({
            "regime": name, "scenarios": len(us),
            "defined": 0 if summ is None else summ.n,
            "benefit_median": None if summ is None else summ.median,
            "benefit_worst": None if summ is None else summ.worst,
            "worst_scenario": None if summ is None else summ.worst_spec.label(),
            "gained_h_median": None if summ is None else summ.median_gained_h,
            "full_gained_h_median": None if summ is None else summ.median_full_gained_h,
            "load": _attack(load), "failure": _attack(failed),
            "epsilon_day_max": epsilon_day(runs, name),
            "per_scenario": [{"scenario": u.spec.label(), "none_h": u.none_h,
                              "full_h": u.full_h, "regime_h": u.regime_h, "share": u.share}
                             for u in us],
            "per_pool": [asdict(p) for p in pool_utilities(mine, name)],
        })
    return rows


def _acc(a: dict) -> str:
    if a["model"] in ("one class only", "no data"):
        return f"{'no score: ' + a['model']:<28}"
    if a["collapsed_all"]:
        return f"{'collapsed':<22}"
    return f"{a['accuracy']:.2f} [{a['low']:.2f}, {a['high']:.2f}] ±{_half(a):<6}"


def _half(a: dict) -> str:
    """Half the repeats' range: how much a score owes to the learner's seed."""
    return f"{(a['spread_high'] - a['spread_low']) / 2:.3f}"


def print_rows(title: str, rows: Sequence[dict]) -> None:
    print(title)
    print(f"  {'regime':<22} {'n':>5} {'kept median':>11} {'worst':>6} {'gain h':>7} "
          f"{'full gain h':>11}  {'load attack [95%] ±repeats':<28} {'chance':>6}  "
          f"{'failure attack [95%] ±repeats':<28} {'chance':>6} {'n+':>5} {'eps/day':>7}")
    for r in rows:
        la, fa = r["load"], r["failure"]
        g, fg = r["gained_h_median"], r["full_gained_h_median"]
        n = f"{r['defined']}/{r['scenarios']}"
        print(f"  {r['regime']:<22} {n:>5} {_pct(r['benefit_median']):>11} "
              f"{_pct(r['benefit_worst']):>6} {'-' if g is None else f'{g:.2f}':>7} "
              f"{'-' if fg is None else f'{fg:.2f}':>11}  {_acc(la):<28} "
              f"{la['chance']:>6.2f}  {_acc(fa):<28} {fa['chance']:>6.2f} "
              f"{fa['positives']:>5}{'' if fa['enough'] else '(few)'} "
              f"{r['epsilon_day_max']:>7.1f}")
        if r["worst_scenario"]:
            print(f"    worst: {_pct(r['benefit_worst'])} ({r['worst_scenario']})")
        for u in r["per_scenario"]:
            if u["share"] is None:
                print(f"    not a share (full beats none by {u['none_h'] - u['full_h']:+.3f} h): "
                      f"{u['scenario']}: gain {u['none_h'] - u['regime_h']:+.2f} h; none "
                      f"{u['none_h']:.2f} h, full {u['full_h']:.2f} h, this "
                      f"{u['regime_h']:.2f} h")


def print_pools(rows: Sequence[dict]) -> None:
    for r in rows:
        print(f"  per pool, {r['regime']} (smallest first; share where the pool's own "
              "mean JCT meets the margin):")
        print(f"    {'pool':<14} {'GPUs':>5} {'n':>7} {'kept median':>11} {'worst':>6} "
              f"{'gain h':>7} {'full gain h':>11}")
        for p in r["per_pool"]:
            n = f"{p['n']}/{p['scenarios']}"
            print(f"    {p['pool']:<14} {p['gpus']:>5} {n:>7} {_pct(p['median']):>11} "
                  f"{_pct(p['worst']):>6} {p['median_gained_h']:>7.2f} "
                  f"{p['median_full_gained_h']:>11.2f}")


def _trace_line(jobs: Path) -> str:
    """What the trace is, and the cluster the simulator sizes for it (every seed's)."""
    selected = select_jobs(read_jobs(jobs))
    if not selected:
        raise TraceError(f"{jobs.name}: no jobs after the header")
    cluster = size_cluster(selected, SimConfig())
    gpus = sorted(p.nodes * cluster.gpus_per_node for p in cluster.pools)
    days = (selected[-1].arrival - selected[0].arrival) / 86400 if selected else 0.0
    return (f"trace {jobs.name}: {len(selected):,} jobs over {days:.0f} days, "
            f"{len(cluster.pools)} pools, {sum(gpus)} GPUs (pools of {gpus[0]}-{gpus[-1]}"
            f" GPUs; {sum(g < 128 for g in gpus)} under 128)")


def _points(text: str | None) -> list[regimes.Regime]:
    if text is None:
        return [regimes.coarse(), *regimes.frontier()]
    return [regimes.redacted(epsilon_per_day=float(e), release_interval=float(i),
                             name=f"eps {float(e):g}/day every {float(i):g}s")
            for e, i in (pt.split(":") for pt in text.split(","))]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=Path, default=PHILLY_JOBS,
                   help="job trace CSV (docs/privacy-utility.md, 'The job trace format')")
    p.add_argument("--faults", default=str(INFINITEHBD_FAULTS),
                   help="fault trace in InfiniteHBD's JSON shape, or 'none'")
    p.add_argument("--seeds", type=int, default=10, help="grid seeds 1..N")
    p.add_argument("--frontier-seeds", type=int, default=4, help="frontier seeds 1..N (0: none)")
    p.add_argument("--no-grid", action="store_true")
    p.add_argument("--points", default=None,
                   help="instead of the frontier's points, these private ones: "
                   "EPS:INTERVAL,... (e.g. 6:900,24:900)")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help="repeats of the attacks' training protocol (shuffle and seed each)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--out", type=Path, default=Path("out/privacy"))
    return p


def _check(args: argparse.Namespace) -> str | None:
    """Every input read once here, so a bad one is one line before any run starts."""
    if args.seeds < 1 and args.no_grid is False:
        return "--seeds must be at least 1"
    if args.frontier_seeds < 0 or args.repeats < 1:
        return "--frontier-seeds must be >= 0 and --repeats >= 1"
    try:
        _points(args.points)
    except ValueError:
        return f"--points: expected EPS:INTERVAL,... with numbers, got {args.points!r}"
    try:
        print(_trace_line(args.jobs))
        if args.faults != "none":
            load_faults(args.faults)
    except TraceError as exc:
        return str(exc)
    return None


def main() -> int:
    args = _parser().parse_args()
    problem = _check(args)
    if problem is not None:
        print(f"privacy-utility: {problem}", file=sys.stderr)
        return 2
    faults = None if args.faults == "none" else Path(args.faults)
    print(f"A share of full visibility's benefit is defined only where full visibility beats "
          f"no feed by >= {MARGIN_H:g} h and >= {100 * MARGIN_REL:g}% of mean JCT; attacks: "
          f"{args.repeats} repeats of the training protocol, chance from the no-feed regime.")
    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"trace": args.jobs.name, "margin_h": MARGIN_H,
                                 "margin_rel": MARGIN_REL, "repeats": args.repeats}
    base = [regimes.none(), regimes.full()]
    if args.frontier_seeds:
        points = _points(args.points)
        specs = grid(range(1, args.frontier_seeds + 1), SOURCES, (1.0,))
        runs = run_all([(s, r) for s in specs for r in base + points], args.jobs,
                       faults, args.workers)
        rows = summary_rows(runs, [r.name for r in points], repeats=args.repeats)
        for row, point in zip(rows, points, strict=True):
            row["default"] = point.redaction == regimes.redacted().redaction
        print_rows(f"\nFrontier ({len(specs)} scenarios: seeds 1-{args.frontier_seeds}, both "
                   "fault sources, arrivals x1.0):", rows)
        result["frontier"] = rows
        for path in frontier_figures(args.out, rows):
            print(f"  figure: {path}")
        print(f"  ({time.perf_counter() - began:.0f} s so far)")
    median = None
    if not args.no_grid:
        default = regimes.redacted(name="private default")
        specs = grid(range(1, args.seeds + 1), SOURCES, SCALES)
        runs = run_all([(s, r) for s in specs for r in [*base, default]], args.jobs,
                       faults, args.workers)
        rows = summary_rows(runs, ["none", default.name], repeats=args.repeats)
        print_rows(f"\nDefault private feed over the grid ({len(specs)} scenarios: seeds "
                   f"1-{args.seeds} x both fault sources x arrivals "
                   f"{'/'.join(f'x{s:g}' for s in SCALES)}, one cluster):", rows[1:])
        print(f"  no feed's own attack scores (the chance levels): load "
              f"{_acc(rows[0]['load']).strip()}, failure {_acc(rows[0]['failure']).strip()}")
        cells = []
        for source in SOURCES:
            for scale in SCALES:
                us = [u for u in utilities(runs, default.name)
                      if u.spec.source == source and u.spec.scale == scale]
                summ = summarize_utility(us)
                cell = {"source": source, "scale": scale, "scenarios": len(us),
                        "defined": 0 if summ is None else summ.n,
                        "median": None if summ is None else summ.median,
                        "worst": None if summ is None else summ.worst,
                        "gained_h": None if summ is None else summ.median_gained_h,
                        "full_gained_h": None if summ is None else summ.median_full_gained_h}
                cells.append(cell)
                hours = ("" if summ is None else f"; median hours gained "
                         f"{summ.median_gained_h:.2f} (full {summ.median_full_gained_h:.2f})")
                print(f"  {source:<6} x{scale:<4g} {cell['defined']}/{len(us)} defined, kept "
                      f"median {_pct(cell['median']):>5}, worst {_pct(cell['worst']):>5}{hours}")
        print_pools(rows[1:])
        per_source = {}
        for src in SOURCES:
            (row,) = summary_rows(runs, [default.name], (src,), args.repeats)
            per_source[src] = row
            print(f"  {src} faults only: load {_acc(row['load']).strip()} (chance "
                  f"{row['load']['chance']:.2f}), failure {_acc(row['failure']).strip()} "
                  f"(chance {row['failure']['chance']:.2f}; {row['failure']['positives']} "
                  "positives)")
        result["grid"] = {"rows": rows, "cells": cells, "per_source": per_source}
        median = rows[1]["benefit_median"]
    (args.out / "privacy-utility.json").write_text(json.dumps(result, indent=1))
    print(f"\n{time.perf_counter() - began:.0f} s in all")
    if not args.no_grid:
        value = math.nan if median is None else 100 * median
        print(f"privacy-utility {value:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
