"""tuning-divergence: fault schedules in which any two ranks of a communicator disagreed.

Two parts, every schedule drawn at random (all fault kinds alike, random
timing, skews and rates):

* **compressed time** (``--fast``, default 420): the real plugin (one thread
  per rank), the real agent service on real files and the real controller
  agreement with its snapshots, a simulated clock, links and network
  (testbed/tuningsim.py): up to 3 hosts x 3 ranks, 10 to 10,000
  collectives/s, skews up to 1 s, switching margins from 2 collectives;
* **end to end** (``--e2e``, default 100): real agents in network namespaces,
  the real controller, stand-in ranks of unprivileged users loading the real
  plugin, real signals, cut links and real congestion
  (testbed/tuninge2e.py), one lab for every schedule.

Then the windows no protocol closes, measured (``--windows``, default 5
rounds each): a host cut off right after arming (its ranks pause; for how
long, and how soon the tenant's job-health says ``paused``), and a change
written on one host only by something that is not the agent (how soon the
controller and the tenant's job-health say ``diverged``).

Prints a line per part, the schedules run, and last
``tuning-divergence N schedules`` with N the schedules in which two ranks
answered differently at some collective index (target 0).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import percentile  # noqa: E402
from testbed import tuninge2e, tuningsim  # noqa: E402


def spread(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"median {statistics.median(values):.2f}, p99 {percentile(values, 99):.2f}, "
            f"max {max(values):.2f}")


def part(name: str, count: int, first: int, *, draw: Callable[[int], Any],
         play: Callable[[Any], Any], every: int) -> tuple[int, int]:
    """Play ``count`` schedules drawn from seeds ``first``...; report and count them."""
    diverged = stuck = switches = 0
    waiting, seconds = [], []
    kinds: collections.Counter[str] = collections.Counter()
    for seed in range(first, first + count):
        schedule = draw(seed)
        result = play(schedule)
        kinds.update(f.kind for f in schedule.faults)
        switches += result.switches
        seconds.append(result.seconds)
        waiting.append(getattr(result, "waiting", 0.0))
        if result.diverged:
            diverged += 1
            print(f"  DIVERGED: {result.diverged} -- {schedule.describe()}", flush=True)
        if result.stuck:
            stuck += 1
            print(f"  STUCK: {result.stuck} rank(s) -- {schedule.describe()}", flush=True)
        if (seed - first + 1) % every == 0:
            print(f"  {name}: {seed - first + 1} of {count}", flush=True)
    print(f"{name}: {count} schedules, {diverged} diverged, {stuck} with ranks left waiting; "
          f"{switches} switches; rank-seconds waiting per schedule {spread(waiting)}; "
          f"real seconds per schedule {spread(seconds)}; faults: "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())), flush=True)
    return diverged, stuck


def windows(campaign: tuninge2e.Campaign, rounds: int) -> int:
    pauses, told, detected_controller, detected_tenant = [], [], [], []
    diverged = 0
    for i in range(rounds):
        cut = 1.0 + i % 3
        paused, disagreed, to_tenant = campaign.cut_after_arm(i, cut)
        pauses.append(paused)
        told.append(to_tenant)
        diverged += bool(disagreed)
        controller, tenant = campaign.detection(i)
        detected_controller.append(controller)
        detected_tenant.append(tenant)
    print(f"host cut off right after arming (1-3 s): its ranks paused {spread(pauses)} s, "
          f"{diverged} of {rounds} rounds with ranks disagreeing; tenant told 'paused' "
          f"{spread(told)} s after the first rank waited", flush=True)
    print(f"a change written on one host by another writer: the controller named the job "
          f"diverged {spread(detected_controller)} s, the tenant's job-health "
          f"{spread(detected_tenant)} s after the first rank's switch (target <= 1 s)",
          flush=True)
    return diverged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", type=int, default=420)
    parser.add_argument("--e2e", type=int, default=100)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="first seed of each part")
    args = parser.parse_args()
    if os.geteuid() != 0 and (args.e2e or args.windows):
        print("tuning-divergence needs root for its end-to-end part (network namespaces, "
              "other users' ranks); run with --e2e 0 --windows 0 otherwise", file=sys.stderr)
        return 1
    began = time.monotonic()
    diverged, stuck = part("compressed time", args.fast, args.seed,
                           draw=tuningsim.random_schedule, play=tuningsim.run, every=50)
    if args.e2e or args.windows:
        workdir = Path(tempfile.mkdtemp(prefix="hz-bench-tuning-"))
        workdir.chmod(0o755)
        with tuninge2e.Campaign(workdir) as campaign:
            if args.e2e:
                more, left = part("end to end", args.e2e, args.seed,
                                  draw=tuninge2e.random_schedule, play=campaign.run, every=10)
                diverged, stuck = diverged + more, stuck + left
            if args.windows:
                windows(campaign, args.windows)
    print(f"schedules run: {args.fast + args.e2e} ({args.e2e} end to end) in "
          f"{(time.monotonic() - began) / 60:.1f} min; {stuck} left ranks waiting")
    print(f"tuning-divergence {diverged} schedules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
