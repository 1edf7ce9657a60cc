"""sim-negotiation: the negotiation regime on the Philly trace beside none, private, full.

Per scenario (seeds 1-3, trace faults, arrivals x1.0 and x1.2 by default), six runs on the
same cluster, jobs and faults: no feed, the private feed, full visibility, the private
feed with gang jobs' tenants reserving through the controller's negotiation engine (a
day ahead, 10% no-shows; sim/negotiation.py states the model) and a prober, and the
private feed with degraded hosts' validation notices, notice-only against negotiated to
checkpoints. Printed: mean, median and p99 job wait and JCT, utilisation, Jain's index
over tenants, holds honoured, no-shows, maintenance done without lost work, and the
probing attack against the feed alone (sim/probing.py). The last line is the median over
scenarios of the median job wait saved against the private feed alone, in percent.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim import regimes
from sim.learned import REPEATS
from sim.model import SimConfig
from sim.negotiation import NegotiationPlan
from sim.negotiation_metrics import Figures, figures
from sim.probing import attack_rows, compare, seen_by_prober
from sim.scenario import from_traces, simulate
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS, JobTraceOptions, TraceError

PLAN = NegotiationPlan(probe=True)
REGIMES = ("none", "private", "full", "negotiated", "notice-only", "checkpoint")


def regime(name: str) -> regimes.Regime:
    return {
        "none": regimes.none,
        "private": lambda: regimes.redacted(name="private"),
        "full": regimes.full,
        "negotiated": lambda: regimes.negotiated(PLAN),
        "notice-only": lambda: regimes.negotiated(
            NegotiationPlan(reservations=False, maintenance="notice"), "notice-only"),
        "checkpoint": lambda: regimes.negotiated(
            NegotiationPlan(reservations=False, maintenance="checkpoint"), "checkpoint"),
    }[name]()


Task = tuple[int, float, str, dict]


def run(task: Task) -> tuple[int, float, Figures, object]:
    seed, scale, name, paths = task
    cfg = SimConfig(seed=seed)
    opts = JobTraceOptions(arrival_scale=scale, seed=seed, days=paths["days"],
                           pools=paths["pools"], max_jobs=paths["max_jobs"])
    scenario = from_traces(cfg, paths["jobs"], paths["faults"], opts)
    result = simulate(scenario, regime(name))
    rows = None
    if name == "negotiated":
        share = min(PLAN.max_share, 1 / len(cfg.tenants))
        tag = f"{seed}:{scale}:probe"
        rows = (attack_rows(result.records, cfg.sample_s, cfg.attack_window_s, tag),
                attack_rows(seen_by_prober(result.records, share), cfg.sample_s,
                            cfg.attack_window_s, tag))
    return seed, scale, figures(result, PLAN.gang_above), rows


def pct(a: float, b: float) -> str:
    return f"{100 * (1 - a / b):+.1f}%" if b else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--scales", default="1.0,1.2")
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--pools", default=None, help="comma-separated pools to keep")
    parser.add_argument("--max-jobs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--jobs", type=Path, default=PHILLY_JOBS)
    parser.add_argument("--faults", type=Path, default=INFINITEHBD_FAULTS)
    args = parser.parse_args()
    try:
        scales = [float(s) for s in args.scales.split(",")]
    except ValueError:
        print("sim-negotiation: --scales: comma-separated numbers", file=sys.stderr)
        return 2
    for p in (args.jobs, args.faults):
        if not p.exists():
            print(f"sim-negotiation: no trace at {p} (see docs/privacy-utility.md)",
                  file=sys.stderr)
            return 2
    began = time.perf_counter()
    paths = {"jobs": args.jobs, "faults": args.faults, "days": args.days,
             "pools": tuple(args.pools.split(",")) if args.pools else None,
             "max_jobs": args.max_jobs}
    tasks = [(seed, scale, name, paths) for seed in range(1, args.seeds + 1)
             for scale in scales for name in REGIMES]
    workers = min(len(tasks), args.workers or os.cpu_count() or 1)
    try:
        if workers <= 1:
            results = [run(t) for t in tasks]
        else:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                results = pool.map(run, tasks, chunksize=1)
    except (TraceError, ValueError) as exc:
        print(f"sim-negotiation: {exc}", file=sys.stderr)
        return 2
    by = {(s, sc, f.regime): f for s, sc, f, _ in results}
    scenarios = [(s, sc) for s in range(1, args.seeds + 1) for sc in scales]
    print(f"{'scenario / regime':26} {'wait mean':>9} {'median':>7} {'p99':>6} "
          f"{'gang':>6} {'JCT mean':>8} {'p99':>6} {'util':>5} {'Jain':>6}  (hours)")
    saved = []
    for s, sc in scenarios:
        for name in REGIMES[:4]:
            f = by[(s, sc, name)]
            print(f"seed {s} x{sc:g} {name:14} {f.mean_wait_h:9.2f} {f.median_wait_h:7.3f} "
                  f"{f.p99_wait_h:6.1f} {f.gang_mean_wait_h:6.1f} {f.mean_jct_h:8.2f} "
                  f"{f.p99_jct_h:6.1f} {f.utilization:5.3f} {f.jain:6.4f}")
        neg, priv = by[(s, sc, "negotiated")], by[(s, sc, "private")]
        c = neg.counters
        print(f"  holds {c['holds']:.0f} of {c['proposals']:.0f} proposals "
              f"(refused {c['refusals']:.0f}, above the release {c['errors']:.0f}): "
              f"honoured {c['honoured']:.0f}, not honoured {c['not_honoured']:.0f}, "
              f"no-shows {c['no_shows']:.0f}; against private: median wait "
              f"{pct(neg.median_wait_h, priv.median_wait_h)}, mean wait "
              f"{pct(neg.mean_wait_h, priv.mean_wait_h)}, gang jobs' mean wait "
              f"{pct(neg.gang_mean_wait_h, priv.gang_mean_wait_h)}")
        for name in ("notice-only", "checkpoint"):
            m = by[(s, sc, name)].counters
            print(f"  maintenance {name:11}: {m['maintained']:.0f} stops, "
                  f"{m['maintained_clean']:.0f} without lost work, "
                  f"{m['maintenance_lost_gpu_s'] / 3600:.1f} GPU-h lost, "
                  f"{m['maintenance_moot']:.0f} moot")
        if priv.median_wait_h > 0:
            saved.append(100 * (1 - neg.median_wait_h / priv.median_wait_h))
    probe_rows = [rows for _, _, _, rows in results if rows is not None]
    print("\nprobing (the attacker proposes and withdraws hourly in every pool), "
          "balanced accuracy [95% interval over test days]:")
    for feed, prober in compare([r[0] for r in probe_rows], [r[1] for r in probe_rows],
                                args.repeats):
        print(f"  {feed.attack:28}: feed alone {feed.accuracy:.3f} [{feed.low:.3f}, "
              f"{feed.high:.3f}], prober {prober.accuracy:.3f} [{prober.low:.3f}, "
              f"{prober.high:.3f}], difference {prober.accuracy - feed.accuracy:+.3f} "
              f"({feed.positives} positives)")
    print(f"\nscenarios: seeds 1-{args.seeds}, trace faults, arrivals x"
          f"{', x'.join(f'{s:g}' for s in scales)}; median wait saved per scenario: "
          f"{', '.join(f'{v:+.1f}%' for v in saved)}")
    print(f"({time.perf_counter() - began:.1f} s)")
    print(f"sim-negotiation {statistics.median(saved) if saved else 0.0:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
