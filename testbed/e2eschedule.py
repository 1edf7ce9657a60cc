"""The end-to-end divergence campaign's schedules: which hosts, ranks, congestion and
faults a seed draws, and what a schedule's run found."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from testbed.cluster import SMALL_CLUSTER

HOSTS = ("h0", "h1", "h2")
SPEED = 20  # Mb/s the agents are told their data link carries
GROUP = 61100  # the jobs' Unix group; ranks run as uids 61101...
FAULTS = ("agent-kill", "agent-kill-onset", "agent-stop", "agent-recreate", "agent-corrupt",
          "agent-lost", "controller-kill", "cut", "late-declaration", "rank-stall")
LINKS = ('[observers.links]\ninclude = ["eth0"]\nmode = "proc"\n'
         f"speeds = {{ eth0 = {SPEED} }}\n")
AGENT_TUNING = ("hold = 1.0\nmax_changes_per_minute = 30\nreport_interval = 0.5\n"
                "activation_margin = 16\nactivation_lead = 0.3\n")
CONTROLLER = SMALL_CLUSTER + ("[tuning]\nhold = 1.5\nlead = 0.6\nmargin = 16\n"
                              "arm_timeout = 1.0\nresend = 0.25\nreport_ttl = 5.0\n"
                              "max_decisions_per_minute = 30\n")
SETTLE = 10.0


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    host: str = ""
    duration: float = 0.0
    rank: int = 0


@dataclass(frozen=True)
class E2ESchedule:
    seed: int
    hosts: tuple[str, ...]
    ranks_per_host: int
    rate: float
    skew: float
    duration: float
    congestion: tuple[tuple[float, float, str, int], ...]  # start, end, host, rate Mb/s
    faults: tuple[Event, ...]

    def describe(self) -> str:
        faults = ", ".join(f"{f.kind}@{f.at:.1f}s({f.host},{f.duration:.1f}s)"
                           for f in self.faults)
        return (f"e2e seed {self.seed}: {len(self.hosts)} hosts x {self.ranks_per_host} "
                f"rank(s), {self.rate:.0f}/s, skew {self.skew:.2f}s; {faults}")


def random_schedule(seed: int, duration: float = 10.0) -> E2ESchedule:
    rng = random.Random(seed)
    hosts = tuple(sorted(rng.sample(HOSTS, rng.choice((2, 2, 3)))))
    congestion = []
    t = rng.uniform(0.5, 1.5)
    while t < duration - 1.5:
        length = rng.uniform(1.5, 3.5)
        congestion.append((t, t + length, rng.choice(hosts), rng.choice((13, 19))))
        t += length + rng.uniform(1.0, 2.5)
    faults = []
    for _ in range(rng.choice((1, 1, 2))):
        kind = rng.choice(FAULTS)
        at = 0.0 if kind == "late-declaration" else rng.uniform(0.5, duration - 1.5)
        if kind == "agent-kill-onset" and congestion:
            start, _, host, _ = rng.choice(congestion)
            faults.append(Event(start + rng.uniform(0.0, 0.4), kind, host,
                                rng.uniform(0.5, 3.0)))
            continue
        faults.append(Event(at, kind, rng.choice(hosts), rng.uniform(0.3, 3.0),
                            rng.randrange(2)))
    return E2ESchedule(seed, hosts, rng.choice((1, 2)), round(10 ** rng.uniform(1.7, 3.0)),
                       rng.choice((0.0, 0.01, 0.2, 1.0)) * rng.random(), duration,
                       tuple(congestion), tuple(sorted(faults, key=lambda f: f.at)))


@dataclass
class E2EResult:
    schedule: E2ESchedule
    diverged: str = ""
    stuck: int = 0
    switches: int = 0
    collectives: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
