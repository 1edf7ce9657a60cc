"""privacy-utility: the private feed's frontier and its default over the evaluation grid.

Two parts, in one process pool (one worker per CPU):

* **Frontier** (``--frontier-seeds``, both fault sources, arrivals x1.0): no feed, full
  visibility, the coarse feed of before, and the private feed at each ε per pool per day
  of ``sim.regimes.EPSILONS`` and each release interval of ``sim.regimes.INTERVALS``.
* **Grid** (``--seeds``, both fault sources, arrivals x0.8 / x1.0 / x1.2): no feed, full
  visibility and the default private feed (the controller's defaults).

Per regime: the share of full visibility's mean-JCT benefit kept (median and worst over
scenarios) with the hours gained, both learned attacks pooled over the regime's runs with
95% intervals, and the most ε any pool spent in 24 hours. Writes ``privacy-utility.json``
and the frontier PNGs under ``--out``. The last line is the default feed's median share
of the benefit kept over the grid.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one learner thread per worker process

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim import regimes
from sim.evaluation import (
    SCALES,
    SOURCES,
    attacks,
    epsilon_day,
    grid,
    run_all,
    summarize_utility,
    utilities,
)
from sim.plots import frontier_figures
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def summary_rows(runs, names, sources=SOURCES):
    rows = []
    for name in names:
        us = [u for u in utilities(runs, name) if u.spec.source in sources]
        summ = summarize_utility(us)
        load, failed = attacks(runs, name, sources)
        rows.append({
            "regime": name, "scenarios": len(us),
            "benefit_median": None if summ is None else summ.median,
            "benefit_worst": None if summ is None else summ.worst,
            "worst_scenario": None if summ is None else summ.worst_spec.label(),
            "gained_h_median": None if summ is None else summ.median_gained_h,
            "full_gained_h_median": None if summ is None else summ.median_full_gained_h,
            "load": vars(load) | {"enough": load.enough},
            "failure": vars(failed) | {"enough": failed.enough},
            "epsilon_day_max": epsilon_day(runs, name),
            "per_scenario": [{"scenario": u.spec.label(), "none_h": u.none_h,
                              "full_h": u.full_h, "regime_h": u.regime_h, "share": u.share}
                             for u in us],
        })
    return rows


def print_rows(title: str, rows) -> None:
    print(title)
    print(f"  {'regime':<16} {'n':>3} {'kept median':>11} {'worst':>6} {'gain h':>7} "
          f"{'full gain h':>11}  {'load attack [95%]':<24} {'failure attack [95%]':<28} "
          f"{'eps/day':>7}")
    for r in rows:
        la, fa = r["load"], r["failure"]
        g = r["gained_h_median"]
        fg = r["full_gained_h_median"]
        print(f"  {r['regime']:<16} {r['scenarios']:>3} {_pct(r['benefit_median']):>11} "
              f"{_pct(r['benefit_worst']):>6} {'-' if g is None else f'{g:.2f}':>7} "
              f"{'-' if fg is None else f'{fg:.2f}':>11}  "
              f"{la['accuracy']:.2f} [{la['low']:.2f}, {la['high']:.2f}] n+={la['positives']:<5} "
              f"{fa['accuracy']:.2f} [{fa['low']:.2f}, {fa['high']:.2f}] n+={fa['positives']:<5}"
              f"{'' if fa['enough'] else '(few)':<5} {r['epsilon_day_max']:>7.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=Path, default=PHILLY_JOBS)
    p.add_argument("--faults", type=Path, default=INFINITEHBD_FAULTS)
    p.add_argument("--seeds", type=int, default=10, help="grid seeds 1..N")
    p.add_argument("--frontier-seeds", type=int, default=4, help="frontier seeds 1..N (0: none)")
    p.add_argument("--no-grid", action="store_true")
    p.add_argument("--points", default=None,
                   help="instead of the frontier's points, these private ones: "
                   "EPS:INTERVAL,... (e.g. 6:900,24:900)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--out", type=Path, default=Path("out/privacy"))
    args = p.parse_args()
    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {}
    base = [regimes.none(), regimes.full()]
    if args.frontier_seeds:
        points = [regimes.coarse(), *regimes.frontier()] if args.points is None else [
            regimes.redacted(epsilon_per_day=float(e), release_interval=float(i),
                             name=f"eps {float(e):g}/day every {float(i):g}s")
            for e, i in (pt.split(":") for pt in args.points.split(","))]
        specs = grid(range(1, args.frontier_seeds + 1), SOURCES, (1.0,))
        runs = run_all([(s, r) for s in specs for r in base + points], args.jobs,
                       args.faults, args.workers)
        rows = summary_rows(runs, [r.name for r in points])
        for row, point in zip(rows, points, strict=True):
            row["default"] = point.redaction == regimes.redacted().redaction
        print_rows(f"Frontier ({len(specs)} scenarios: seeds 1-{args.frontier_seeds}, both "
                   "fault sources, arrivals x1.0):", rows)
        result["frontier"] = rows
        for path in frontier_figures(args.out, rows):
            print(f"  figure: {path}")
        print(f"  ({time.perf_counter() - began:.0f} s so far)")
    if not args.no_grid:
        default = regimes.redacted(name="private default")
        specs = grid(range(1, args.seeds + 1), SOURCES, SCALES)
        runs = run_all([(s, r) for s in specs for r in [*base, default]], args.jobs,
                       args.faults, args.workers)
        rows = summary_rows(runs, [default.name])
        print_rows(f"\nDefault private feed over the grid ({len(specs)} scenarios: seeds "
                   f"1-{args.seeds} x both fault sources x arrivals "
                   f"{'/'.join(f'x{s:g}' for s in SCALES)}):", rows)
        cells = []
        for source in SOURCES:
            for scale in SCALES:
                us = [u for u in utilities(runs, default.name)
                      if u.spec.source == source and u.spec.scale == scale]
                summ = summarize_utility(us)
                if summ is None:
                    continue
                cells.append({"source": source, "scale": scale, "median": summ.median,
                              "worst": summ.worst, "gained_h": summ.median_gained_h,
                              "full_gained_h": summ.median_full_gained_h})
                print(f"  {source:<6} x{scale:<4g} kept median {_pct(summ.median):>5}, worst "
                      f"{_pct(summ.worst):>5}; median hours gained {summ.median_gained_h:.2f} "
                      f"(full {summ.median_full_gained_h:.2f})")
        per_source = {src: summary_rows(runs, [default.name], (src,))[0] for src in SOURCES}
        for src, row in per_source.items():
            la, fa = row["load"], row["failure"]
            print(f"  {src} faults only: load {la['accuracy']:.2f} [{la['low']:.2f}, "
                  f"{la['high']:.2f}], failure {fa['accuracy']:.2f} [{fa['low']:.2f}, "
                  f"{fa['high']:.2f}] ({fa['positives']} positives)")
        result["grid"] = {"rows": rows, "cells": cells, "per_source": per_source}
        (args.out / "privacy-utility.json").write_text(json.dumps(result, indent=1))
        print(f"\n{time.perf_counter() - began:.0f} s in all")
        print(f"privacy-utility {100 * (rows[0]['benefit_median'] or 0):.0f} %")
        return 0
    (args.out / "privacy-utility.json").write_text(json.dumps(result, indent=1))
    print(f"\n{time.perf_counter() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
