"""sim-philly: the whole Philly trace with the fault trace, under all three regimes.

Loads the 82,247-job Philly trace and the InfiniteHBD fault trace, builds the default
scenario and simulates it with no feed, the default redacted feed and full visibility,
one after the other in this process. The figure is the wall time of all of it (loading,
building, the three runs and their metrics); the brief's bar is 60 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim import regimes
from sim.model import SimConfig
from sim.report import headline, regime_table, scenario_line
from sim.scenario import evaluate, from_traces
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=Path, default=PHILLY_JOBS)
    parser.add_argument("--faults", type=Path, default=INFINITEHBD_FAULTS)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for path in (args.jobs, args.faults):
        if not path.exists():
            raise SystemExit(f"sim-philly: trace not found: {path}")
    began = time.perf_counter()
    scenario = from_traces(SimConfig(seed=args.seed), args.jobs, args.faults)
    loaded = time.perf_counter()
    print(f"scenario: {scenario_line(scenario)} (built in {loaded - began:.1f} s)")
    outcomes = []
    for regime in regimes.main_regimes():
        t0 = time.perf_counter()
        outcome = evaluate(scenario, regime)
        outcomes.append(outcome)
        print(f"  {regime.name:<9} {time.perf_counter() - t0:5.1f} s  "
              f"{outcome.counters['events']} events, "
              f"{outcome.counters['publications_pool']} pool and "
              f"{outcome.counters['publications_job']} job publications")
    total = time.perf_counter() - began
    print()
    print(regime_table(outcomes))
    print()
    print(headline(outcomes))
    print(f"sim-philly {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
