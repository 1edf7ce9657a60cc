"""private-pools: what each pool keeps under the private feed, by pool size, before and
after pools were given their own release plans.

Scenarios: seeds 1..``--seeds`` x both fault sources, arrivals x1.0, on ``--jobs`` (the
Philly trace by default). Regimes: no feed, full visibility, and for each ε per day of
``--epsilons`` the private feed with every pool released every 900 s (``uniform``, the
plan before) and with its plan sized for the pool (``sized``, the default), plus the
job unit (``job_hosts`` 8) at the first ε. Per pool (100 finished jobs or more) and
regime: the median share of full visibility's mean-JCT benefit in that pool, over the
scenarios where full visibility beats no feed there by ``--margin-h`` hours (how many
in brackets); then the whole cluster's median and worst share. The last line is the
smallest per-pool median share, among pools of 32 GPUs or more, of the sized plan at
the first ε.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controller.redactionconfig import Unit
from sim import regimes
from sim.model import SimConfig
from sim.poolshares import ScenarioPools, overall, pool_shares
from sim.regimes import Regime
from sim.scenario import Scenario, build, evaluate
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS, JobTraceOptions, load_faults, load_jobs

SOURCES = ("trace", "model")
_PATHS: tuple[Path, Path] | None = None
_BUILT: dict[tuple[int, str], Scenario] = {}


def _init(paths: tuple[Path, Path]) -> None:
    global _PATHS  # noqa: PLW0603 - set once per worker process
    _PATHS = paths


def _task(task: tuple[int, str, Regime]) -> tuple[int, str, str, dict, float, dict]:
    seed, source, regime = task
    scenario = _BUILT.get((seed, source))
    if scenario is None:
        assert _PATHS is not None
        jobs = load_jobs(_PATHS[0], JobTraceOptions(seed=seed))
        _BUILT.clear()  # one scenario at a time per worker: they are large
        scenario = _BUILT[(seed, source)] = build(
            SimConfig(seed=seed, fault_source=source), jobs, load_faults(_PATHS[1]))
    out = evaluate(scenario, regime, score_runs=False)
    gpus = {p.name: p.nodes * scenario.cluster.gpus_per_node for p in scenario.cluster.pools}
    return seed, source, regime.name, gpus, out.summary.mean_jct_h, out.per_pool


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=Path, default=PHILLY_JOBS)
    p.add_argument("--faults", type=Path, default=INFINITEHBD_FAULTS)
    p.add_argument("--seeds", type=int, default=6, help="seeds 1..N (default %(default)s)")
    p.add_argument("--epsilons", default="12,3", help="ε per day, comma-separated")
    p.add_argument("--margin-h", type=float, default=0.25,
                   help="a share counts where full visibility gains this many hours")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args()
    try:
        epsilons = [float(e) for e in args.epsilons.split(",")]
    except ValueError:
        print(f"private-pools: --epsilons: not numbers: {args.epsilons}", file=sys.stderr)
        return 2
    if args.seeds < 1 or not epsilons or not all(0.01 <= e <= 10_000 for e in epsilons):
        print("private-pools: --seeds must be 1 or more, each ε within 0.01..10000",
              file=sys.stderr)
        return 2
    for path in (args.jobs, args.faults):
        if not path.exists():
            print(f"private-pools: trace not found: {path}", file=sys.stderr)
            return 2
    points = [regimes.none(), regimes.full()]
    for e in epsilons:
        points += [regimes.uniform(e, name=f"uniform eps {e:g}"),
                   regimes.redacted(e, name=f"sized eps {e:g}")]
    points.append(regimes.redacted(epsilons[0], unit=Unit.JOB, job_hosts=8,
                                   name=f"job unit 8 eps {epsilons[0]:g}"))
    tasks = [(seed, source, r) for source in SOURCES for seed in range(1, args.seeds + 1)
             for r in points]
    began = time.perf_counter()
    workers = min(len(tasks), args.workers or os.cpu_count() or 1)
    ctx = multiprocessing.get_context("fork" if "fork" in
                                      multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init, initargs=((args.jobs, args.faults),)) as pool:
        results = pool.map(_task, tasks, chunksize=1)
    runs: dict[tuple[int, str], dict] = {}
    for seed, source, name, gpus, mean_h, per_pool in results:
        run = runs.setdefault((seed, source), {"gpus": gpus, "mean": {}, "pools": {}})
        run["mean"][name], run["pools"][name] = mean_h, per_pool
    scenarios = [ScenarioPools(f"seed {s}, {src} faults", r["gpus"], r["mean"], r["pools"])
                 for (s, src), r in sorted(runs.items())]
    names = [r.name for r in points[2:]]
    table = {name: pool_shares(scenarios, name, args.margin_h) for name in names}
    print(f"Share of full visibility's benefit kept per pool ({len(scenarios)} scenarios: "
          f"seeds 1-{args.seeds} x both fault sources, arrivals x1.0; median over the "
          f"scenarios where full visibility gains {args.margin_h:g} h or more there):")
    print(f"  {'pool':<8} {'GPUs':>5}  " + "  ".join(f"{n:>20}" for n in names))
    for i, row in enumerate(table[names[0]]):
        cells = [table[n][i] for n in names]
        print(f"  {row.pool:<8} {row.gpus:>5}  " + "  ".join(
            f"{_pct(c.median) + f' ({c.defined}/{c.scenarios})':>20}" for c in cells))
    print("  whole cluster, median / worst (scenarios):")
    for name in names:
        median, worst, n = overall(scenarios, name, args.margin_h)
        print(f"    {name:<20} {_pct(median):>5} / {_pct(worst):>5} ({n})")
    sized = [c.median for c in table[f"sized eps {epsilons[0]:g}"]
             if c.gpus >= 32 and c.median is not None]
    print(f"\n{time.perf_counter() - began:.0f} s")
    print(f"private-pools {100 * min(sized, default=0.0):.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
