"""hang-localization: one rank of eight stops; how soon its job's owner is told which.

The hang lab (testbed/hanglab.py): eight coupled stand-in ranks (the real tuner plugin,
each blocking until every rank issued a collective, as NCCL ranks do), four on each of
two hosts in network namespaces, as unprivileged users of the job's group; real agents,
the real controller and a real tenant watcher; job health at the shipped defaults
(``hang_after`` 3 s).

* **Localization** (``--rounds``, default 24): a rank is SIGSTOPped (hosts alternating,
  each host's four ranks in turn); the time from the signal to the tenant's reading of
  the ``job-progress`` that names it (a hang) is one sample. Then it is continued, the
  finding is withdrawn, and the job runs on before the next round. Each message must
  name that rank alone: any other is counted as mislocalized.
* **False findings** (``--scenarios``, default 210): scenarios in which nothing hangs,
  several jobs at once in the same lab (``--jobs``, default 6; each its own placement,
  communicator and ranks): every rank pausing together (evaluation, a checkpoint,
  input; each pause longer than ``hang_after``, a few longer than ``stall_after``) and
  one rank slow within the straggler margin for longer than the straggler window. Any
  finding told to those jobs' owner is a false finding.

Prints a line per part and last ``hang-localization <p99> s``.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import percentile  # noqa: E402
from harmonaize.progress import ProgressSettings  # noqa: E402
from testbed.hangjob import HOSTS, N_RANKS, RANKS_PER_HOST, RATE, LabJob  # noqa: E402
from testbed.hanglab import HangLab  # noqa: E402
from testbed.ranks import issued  # noqa: E402

DEFAULTS = ProgressSettings()
#: Seconds a round waits for the tenant's message before it counts as missed.
PATIENCE = 30.0
#: Pauses: kind -> (shortest, longest) seconds; all past hang_after.
PAUSES = {"evaluation": (8.0, 20.0), "checkpoint": (4.0, 12.0),
          "input": (DEFAULTS.hang_after + 0.2, 6.0)}
#: Of the evaluations, this share lasts past stall_after (a stall, for operators only).
LONG_EVALUATION = 0.04
#: Collectives between two pauses of one communicator (at RATE a second).
GAP = (30, 60)
PAUSES_PER_COMM = 8
#: A slow rank's extra seconds per collective: one collective's lag at most (coupled),
#: which stays under straggler_margin seconds of the communicator's pace.
SLOW = (0.05, 1.5)
SLOW_SHARE = 0.2


# --- localization -------------------------------------------------------------------------


def victims(rounds: int) -> list[int]:
    """Alternate hosts; on each, its ranks in turn."""
    return [(i % len(HOSTS)) * RANKS_PER_HOST + (i // len(HOSTS)) % RANKS_PER_HOST
            for i in range(rounds)]


def localize(lab: HangLab, rounds: int) -> tuple[list[float], int, collections.Counter[str]]:
    job = lab.first
    comm = job.start()
    job.running()
    latencies: list[float] = []
    misnamed = 0
    causes: collections.Counter[str] = collections.Counter()
    for victim in victims(rounds):
        since = lab.mark()
        began = time.monotonic()
        job.signal(victim, signal.SIGSTOP)
        try:
            at, body = lab.wait_progress(
                lambda b: b["state"] == "active" and b["finding"] == "hang", PATIENCE,
                f"rank {victim}'s hang", comm=comm, since=since)
        finally:
            job.signal(victim, signal.SIGCONT)
        lab.wait_progress(lambda b: b["state"] == "withdrawn", PATIENCE, "the withdrawal",
                          comm=comm, since=since)
        told = [b for _, b in lab.progress(comm=comm, since=since) if b["state"] == "active"]
        if body["ranks"] != [str(victim)] or len(told) != 1:
            misnamed += 1
        else:
            latencies.append(at - began)
        causes[body["cause"]] += 1
        job.running(collectives=40)  # the job runs on before the next round
    job.stop()
    return latencies, misnamed, causes


# --- false findings -----------------------------------------------------------------------


@dataclass
class Unit:
    """One communicator's life: a series of pauses, or a slow rank for a while."""

    pauses: list[tuple[str, int, float]] = field(default_factory=list)  # kind, index, secs
    slow: tuple[int, float] | None = None  # rank, seconds per collective
    seconds: float = 0.0  # how long it is planned to run

    @property
    def scenarios(self) -> int:
        return len(self.pauses) or 1


def plan(count: int, rng: random.Random) -> list[Unit]:
    units: list[Unit] = []
    slow_left = round(count * SLOW_SHARE)
    pauses_left = count - slow_left
    kinds = list(PAUSES)
    while pauses_left > 0:
        unit, index = Unit(), 0
        for _ in range(min(PAUSES_PER_COMM, pauses_left)):
            kind = kinds[len([p for u in units for p in u.pauses] + unit.pauses) % len(kinds)]
            low, high = PAUSES[kind]
            if kind == "evaluation" and rng.random() < LONG_EVALUATION:
                low, high = DEFAULTS.stall_after + 2.0, DEFAULTS.stall_after + 15.0
            index += rng.randint(*GAP)
            unit.pauses.append((kind, index, round(rng.uniform(low, high), 2)))
        pauses_left -= len(unit.pauses)
        unit.seconds = (index + GAP[1]) / RATE + sum(p[2] for p in unit.pauses)
        units.append(unit)
    for i in range(slow_left):
        rank = victims(slow_left)[i]
        units.append(Unit(slow=(rank, round(rng.uniform(*SLOW), 3)),
                          seconds=DEFAULTS.straggler_window + 6.0))
    rng.shuffle(units)
    return units


@dataclass
class Outcome:
    scenarios: collections.Counter[str] = field(default_factory=collections.Counter)
    comms: dict[int, str] = field(default_factory=dict)  # comm -> "pause" / "slow"
    notes: list[str] = field(default_factory=list)


def play(job: LabJob, units: list[Unit], out: Outcome, lock: threading.Lock) -> None:
    for unit in units:
        try:
            if unit.slow is not None:
                rank, extra = unit.slow
                comm = job.start(slow={rank: extra})
                with lock:
                    out.comms[comm] = "slow"
                job.running(collectives=2, timeout=60)
                time.sleep(unit.seconds)
                job.stop()
                with lock:
                    out.scenarios["slow"] += 1
                continue
            comm = job.start(pauses={i: s for _, i, s in unit.pauses})
            with lock:
                out.comms[comm] = "pause"
            job.running(collectives=2, timeout=60)
            last = unit.pauses[-1][1]
            deadline = time.monotonic() + 2 * unit.seconds + 60
            while time.monotonic() < deadline and not all(
                    (v := job.view(h)) and v["collectives_min"] > last + 20 for h in HOSTS):
                time.sleep(0.5)
            logs = [r.log for r in job.ranks]
            job.stop()
            done = min((issued(log) or 0) for log in logs)
            with lock:
                for kind, index, _ in unit.pauses:
                    if index < done:
                        out.scenarios[kind] += 1
                    else:
                        out.notes.append(f"{job.name}: the pause at {index} was not reached")
        except Exception as exc:  # a wait ran out, a request failed: say so, go on
            with lock:
                out.notes.append(f"{job.name}: {exc}")
            job.stop()


def false_findings(lab: HangLab, count: int, jobs: int,
                   seed: int) -> tuple[Outcome, list[dict[str, Any]]]:
    units = plan(count, random.Random(seed))
    slots: list[list[Unit]] = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for unit in sorted(units, key=lambda u: -u.seconds):  # the longest first, least loaded
        slot = load.index(min(load))
        slots[slot].append(unit)
        load[slot] += unit.seconds
    placed = [lab.place(f"train-ff-{i}") for i in range(jobs)]
    names = {job.name for job in placed}
    since = lab.mark()
    out, lock = Outcome(), threading.Lock()
    threads = [threading.Thread(target=play, args=(job, slot, out, lock))
               for job, slot in zip(placed, slots, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(2 * DEFAULTS.hang_after)  # anything judged at the very end arrives
    told = [b for _, b in lab.progress(since=since) if b["job"] in names
            and b["state"] == "active"]
    return out, told


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--scenarios", type=int, default=210)
    parser.add_argument("--jobs", type=int, default=6, help="jobs at once for false findings")
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("hang-localization needs root (network namespaces, other users' ranks)",
              file=sys.stderr)
        return 1
    if args.rounds < 1 or args.scenarios < 0 or args.jobs < 1:
        print("hang-localization: --rounds and --jobs must be at least 1, --scenarios 0 or "
              "more", file=sys.stderr)
        return 2
    began = time.monotonic()
    with HangLab(tag="hbench") as lab:
        latencies, misnamed, causes = localize(lab, args.rounds)
        out, told = false_findings(lab, args.scenarios, args.jobs, args.seed)
        history = lab.cluster.admin_request("job-findings")["history"]
    if not latencies:
        print(f"hang-localization: no round named its rank ({misnamed} mislocalized)",
              file=sys.stderr)
        return 1
    p99 = percentile(latencies, 99)
    print(f"localization: {len(latencies)} of {args.rounds} rounds named the stopped rank "
          f"alone ({misnamed} mislocalized; causes: "
          + ", ".join(f"{c} {n}" for c, n in causes.most_common()) + "); from SIGSTOP to "
          f"the tenant's message: median {statistics.median(latencies):.2f} s, p99 "
          f"{p99:.2f} s, spread {min(latencies):.2f}-{max(latencies):.2f} s "
          f"(hang_after {DEFAULTS.hang_after:g} s, {N_RANKS} ranks on {len(HOSTS)} hosts)")
    scenarios = sum(out.scenarios.values())
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(out.scenarios.items()))
    stalls = sum(1 for e in history if e["event"] == "stall" and e["state"] == "active"
                 and e["job"].startswith("train-ff-"))
    by_kind = collections.Counter(f"{b['finding']} in a {out.comms.get(b['comm'], '?')} "
                                  "scenario" for b in told)
    print(f"false findings: {len(told)} told to the owner over {scenarios} scenarios "
          f"({kinds}; {args.jobs} jobs at once)" + (": " + ", ".join(
              f"{n} {k}" for k, n in by_kind.most_common()) if told else "")
          + f"; operators saw {stalls} stall(s) of paused jobs")
    for note in out.notes[:10]:
        print(f"  note: {note}")
    print(f"ran {(time.monotonic() - began) / 60:.1f} min")
    print(f"hang-localization {p99:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
