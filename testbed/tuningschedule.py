"""The in-process divergence campaign's schedules: hosts, ranks, rates, skews, congestion
and faults a seed draws, and what playing one found.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from harmonaize.messages import (
    Algorithm,
    Collective,
    JobDeclaration,
    Protocol,
    TuningRange,
)

JOB = "campaign"
CONTROLLER = "controller"
TICK = 0.01
AGENT_INTERVAL = 0.1
CONTROLLER_INTERVAL = 0.05
LATENCY = 0.001
#: Seconds without faults at the end, for every change in flight to settle.
SETTLE = 8.0
DECLARATION = JobDeclaration(JOB, revision=1, tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE),
    (Protocol.LL, Protocol.SIMPLE), 0, 1 << 40, 2, 16),))
UTILIZATION = {0: 0.10, 1: 0.75, 2: 0.97}

FAULT_KINDS = (
    "agent-kill", "agent-stop", "agent-recreate", "agent-corrupt", "agent-lost",
    "agent-kill-armed", "controller-kill", "controller-kill-midsend", "delay", "drop",
    "partition", "late-declaration", "rank-stall",
)


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    host: int = 0
    duration: float = 0.0
    rank: int = 0


@dataclass(frozen=True)
class Schedule:
    seed: int
    hosts: int
    ranks_per_host: int
    rate: float
    skew: float
    duration: float
    congestion: tuple[tuple[float, float, int, int], ...]  # start, end, host, level
    faults: tuple[Fault, ...]
    #: How far ahead switching points are set: at least ``margin`` collectives, and
    #: ``lead`` seconds of them. Safety may not depend on either (small ones make
    #: races between arming and ranks passing ``at`` common); only liveness does.
    margin: int = 32
    lead: float = 0.5
    #: Real seconds an agent is descheduled before each policy write.
    pause: float = 0.0

    def describe(self) -> str:
        faults = ", ".join(f"{f.kind}@{f.at:.1f}s(h{f.host},{f.duration:.1f}s)"
                           for f in self.faults)
        return (f"seed {self.seed}: {self.hosts} host(s) x {self.ranks_per_host} rank(s), "
                f"{self.rate:.0f}/s, skew {self.skew:.2f}s, margin {self.margin}, lead "
                f"{self.lead:g}s, pause {self.pause * 1000:g}ms, {self.duration:.0f}s; {faults}")


def random_schedule(seed: int, *, max_rate: float = 10_000.0, duration: float = 12.0,
                    kinds: tuple[str, ...] = FAULT_KINDS) -> Schedule:
    """A schedule drawn from ``seed``: every fault kind is as likely, timing random."""
    rng = random.Random(seed)
    hosts = rng.choice((1, 2, 2, 3))
    ranks = rng.choice((1, 2, 3))
    rate = round(10 ** rng.uniform(1.0, math.log10(max_rate)), 1)
    skew = rng.choice((0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 1.0)) * rng.random()
    congestion = []
    t = rng.uniform(0.5, 2.0)
    while t < duration - 1.0:
        length = rng.uniform(1.0, 4.0)
        congestion.append((t, t + length, rng.randrange(hosts), rng.choice((1, 2))))
        t += length + rng.uniform(0.5, 3.0)
    faults = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choice(kinds)
        if kind == "late-declaration":
            faults.append(Fault(kind, 0.0, rng.randrange(hosts), rng.uniform(0.2, 3.0)))
            continue
        faults.append(Fault(kind, rng.uniform(0.5, duration - 1.0), rng.randrange(hosts),
                            rng.choice((0.2, 0.5, 1.5, 3.0, 6.0)) * rng.uniform(0.5, 1.0),
                            rng.randrange(ranks)))
    margin = rng.choice((2, 4, 8, 32, 64))
    lead = rng.choice((0.0, 0.01, 0.05, 0.2, 0.5, 1.0))
    pause = rng.choice((0.0, 0.0, 0.0005, 0.002, 0.01))
    return Schedule(seed, hosts, ranks, rate, skew, duration, tuple(congestion),
                    tuple(sorted(faults, key=lambda f: f.at)), margin, lead, pause)


@dataclass
class Result:
    schedule: Schedule
    diverged: str = ""
    #: Ranks still waiting at an unconfirmed switch once every fault had healed.
    stuck: int = 0
    switches: int = 0
    #: Rank-seconds (simulated) spent waiting at unconfirmed switches.
    waiting: float = 0.0
    cancelled: int = 0
    collectives: int = 0
    seconds: float = 0.0
