"""sim-energy: GPU energy saved against JCT stretched on the whole Philly trace, per slack.

Every tenant declares the same slack (0%, 5%, 10%); the agent's energy loop, run on the
power-throughput curves Zeus (NSDI '23) measured on an A40, decides each workload's
limit (sim/energy.py). Two cluster sizings: the simulator's default (each pool sized
for the 90th percentile of its demand: queues are long) and a roomy one (the 99th).
Seeds 1-3 (workloads given to jobs, faults, tenants). The figure is the median energy
saved at 5% slack; each line gives the median and range over the seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.energy import SLACKS, EnergyOutcome, evaluate_slacks, results_table
from sim.model import SimConfig
from sim.scenario import from_traces
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS


def spread(values: list[float], sign: str = "+") -> str:
    """Median [min, max] as percentages."""
    def f(v: float) -> str:
        return f"{v:{sign}.1%}"
    return f"{f(statistics.median(values))} [{f(min(values))}, {f(max(values))}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    began = time.perf_counter()
    saved_5: list[float] = []
    for sizing, quantile in (("default (p90 demand)", 0.9), ("roomy (p99 demand)", 0.99)):
        runs: list[list[EnergyOutcome]] = []
        for seed in range(1, args.seeds + 1):
            scenario = from_traces(SimConfig(seed=seed, demand_quantile=quantile),
                                   PHILLY_JOBS, INFINITEHBD_FAULTS)
            runs.append(evaluate_slacks(scenario, SLACKS, args.workers))
        print(f"{sizing}, seed 1:")
        print(results_table(runs[0]))
        for k, slack in enumerate(SLACKS):
            if slack == 0:
                continue
            saved = [1 - r[k].energy_mwh / r[0].energy_mwh for r in runs]
            jct = [r[k].mean_jct_h / r[0].mean_jct_h - 1 for r in runs]
            print(f"  slack {slack:.0%}: energy saved {spread(saved, '')}, mean JCT "
                  f"{spread(jct)} over {len(runs)} seeds")
            if slack == 0.05 and quantile == 0.9:
                saved_5 = saved
        print()
    print(f"({time.perf_counter() - began:.1f} s)")
    print(f"sim-energy {100 * statistics.median(saved_5):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
