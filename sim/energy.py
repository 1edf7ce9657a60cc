"""Energy saved against JCT stretched, on the Philly trace, for tenants that declare slack.

**The power-throughput relation** is a published measurement: the power trace of Zeus
(J. You, J.-W. Chung, M. Chowdhury, "Zeus: Understanding and Optimizing GPU Energy
Consumption of DNN Training", NSDI '23; the trace ``summary_power_a40.csv`` of the
paper's artifact). For six DNN training workloads on an NVIDIA A40 (300 W default
limit) it gives, per power limit from 100 W to 300 W in 25 W steps, the time one epoch
took and the GPU's average power. :data:`MEASURED` holds the six at the batch size Zeus
starts each workload from (its ``b_0``). Throughput at a limit is the epoch time at
300 W over the epoch time at that limit; power is the average power's ratio likewise.
The measurements are as they are, but for one physical bound: a lower limit
never makes a GPU faster or draw more, so the few points measured so (NCF on
MovieLens barely loads the GPU, and its epoch times scatter by a few percent
whatever the limit) count as equal to the default limit's. Between two measured
limits (sentiment140 was measured every 50 W) the relation is taken as linear.

**What a tenant's slack buys** is decided by the agent's own energy loop
(agent/energy/engine.py) with its default settings, one step being one measured point
(25 W), run against each workload's curve in simulated time (:func:`plan`). Its
progress signal is the workload's measured throughput, with the scatter the
measurements have. From its trajectory over :data:`HORIZON` seconds come the time
until it first settles and the time-averaged throughput and power after (its tries
lower after a hold, and its hourly baselines at the GPU's own limit, included).

**In the cluster simulation** (sim/engine.py) every job of the trace gets one of the
six workloads (seeded, uniformly, the same in every run). A job whose tenant declared
slack runs its compute at the settled throughput from its start (which overstates the
stretch) and draws full power for the first settling time of each run on its GPUs
(which understates the saving); checkpoints, restarts and queueing are as in every
other run, so a stretched job also delays the jobs queued behind it. Energy is GPU
time allocated times the workload's measured power at the limit, in the A40's watts.
"""

from __future__ import annotations

import bisect
import multiprocessing
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.energy.engine import (
    EnergyGpu,
    EnergyLoop,
    EnergyObservation,
    Phase,
    PowerInfo,
    RankProgress,
    ReadPower,
    SetLimit,
)
from agent.energy.settings import EnergySection
from harmonaize.messages import EnergyAllowance
from harmonaize.tables import table
from sim.engine import RunResult, Simulation
from sim.jobs import DONE, RUNNING, Job
from sim.metrics import percentile
from sim.regimes import Regime, none
from sim.scenario import Scenario

#: Zeus NSDI '23 power trace, NVIDIA A40: workload (dataset/model at batch size b_0) ->
#: (power limit W, seconds per epoch, average power W) for every limit measured.
MEASURED: dict[str, tuple[tuple[int, float, float], ...]] = {
    "cifar100/shufflenetv2 b1024": (
        (100, 27.13, 106.9), (125, 16.85, 119.0), (150, 11.09, 141.6), (175, 9.175, 160.7),
        (200, 8.8, 181.8), (225, 8.755, 201.1), (250, 8.605, 209.2), (275, 8.605, 216.9),
        (300, 8.525, 218.9)),
    "imagenet/resnet50 b256": (
        (100, 10606.19, 120.7), (125, 9639.82, 125.5), (150, 6326.84, 144.6),
        (175, 4705.61, 160.2), (200, 4123.52, 177.6), (225, 3909.47, 196.4),
        (250, 3864.98, 214.6), (275, 3857.81, 230.8), (300, 3847.48, 235.2)),
    "squad/bert-base b32": (
        (100, 3699.82, 105.9), (125, 2381.73, 122.9), (150, 1586.22, 145.4),
        (175, 1156.77, 167.1), (200, 1028.09, 188.6), (225, 967.36, 210.0),
        (250, 934.88, 232.1), (275, 913.33, 251.2), (300, 909.47, 267.0)),
    "librispeech/deepspeech2 b192": (
        (100, 24866.22, 106.9), (125, 20707.22, 115.9), (150, 13033.01, 128.5),
        (175, 11342.55, 142.2), (200, 10628.14, 155.1), (225, 9923.82, 161.7),
        (250, 9758.08, 164.4), (275, 9692.81, 168.7), (300, 9730.15, 167.8)),
    "movielens-1m/ncf b1024": (
        (100, 20.67, 83.4), (125, 21.0, 86.0), (150, 20.4, 83.7), (175, 20.66, 85.1),
        (200, 19.14, 84.6), (225, 20.31, 85.3), (250, 20.96, 84.9), (275, 19.19, 83.0),
        (300, 20.34, 83.6)),
    "sentiment140/bert-base b128": (
        (100, 8836.89, 103.9), (150, 3334.48, 150.3), (200, 2226.9, 196.1),
        (250, 2079.35, 241.5), (300, 2002.34, 274.6)),
}
DEFAULT_LIMIT_W = 300
MIN_LIMIT_W = 100
#: The agent's loop with its defaults, one step a measured point (25 W of 300 W).
LOOP = EnergySection(step=25 / DEFAULT_LIMIT_W)
#: Simulated seconds the loop runs against each curve.
HORIZON = 6 * 3600.0
#: Progress units per second at full speed (the plugin's collectives, say).
BASE_RATE = 100.0
SLACKS = (0.0, 0.05, 0.10)


@dataclass(frozen=True)
class Curve:
    limits: tuple[int, ...]
    throughput: tuple[float, ...]
    power: tuple[float, ...]
    full_watts: float

    def at(self, watts: float) -> tuple[float, float]:
        """(throughput, power) relative to the default limit, linear between points."""
        i = bisect.bisect_left(self.limits, watts)
        if i < len(self.limits) and self.limits[i] == watts:
            return self.throughput[i], self.power[i]
        i = min(max(i, 1), len(self.limits) - 1)
        lo, hi = self.limits[i - 1], self.limits[i]
        w = (watts - lo) / (hi - lo)
        return (self.throughput[i - 1] + w * (self.throughput[i] - self.throughput[i - 1]),
                self.power[i - 1] + w * (self.power[i] - self.power[i - 1]))


def curve(points: Sequence[tuple[int, float, float]]) -> Curve:
    """Relative to the default limit. A lower limit never makes a GPU faster or draw more:
    points measured so (the scatter of a workload that barely loads the GPU) count as
    equal to the default's."""
    full_time, full_power = next((t, p) for w, t, p in points if w == DEFAULT_LIMIT_W)
    return Curve(tuple(w for w, _, _ in points),
                 tuple(min(1.0, full_time / t) for _, t, _ in points),
                 tuple(min(1.0, p / full_power) for _, _, p in points), full_power)


CURVES = {name: curve(points) for name, points in MEASURED.items()}


@dataclass(frozen=True)
class Effect:
    """What the loop made of one workload at one slack."""

    settle_s: float      # until it first held (full power is charged for this long)
    throughput: float    # time-averaged after, relative to the GPU's own limit
    power: float
    limit_w: float       # the limit it held most of the time

    @property
    def energy(self) -> float:
        """Energy per unit of work, relative."""
        return self.power / self.throughput


def loop_effect(c: Curve, slack: float, horizon: float = HORIZON,
                cfg: EnergySection = LOOP) -> Effect:
    """Run the agent's energy loop against a measured curve in simulated time."""
    if slack <= 0:
        return Effect(0.0, 1.0, 1.0, DEFAULT_LIMIT_W)
    loop = EnergyLoop(cfg)
    power = PowerInfo(MIN_LIMIT_W * 1000, DEFAULT_LIMIT_W * 1000, DEFAULT_LIMIT_W * 1000,
                      DEFAULT_LIMIT_W * 1000)
    limit = float(DEFAULT_LIMIT_W)
    known = False
    t = progress = 0.0
    settled: float | None = None
    thr_time = pow_time = 0.0
    at_limit: dict[float, float] = {}
    jobs = {"j": EnergyAllowance(slack)}
    while t < horizon:
        thr, pw = c.at(limit)
        obs = EnergyObservation((EnergyGpu(
            0, "GPU-0", "j", round(limit * 1000), round(pw * c.full_watts * 1000), None, 100,
            power if known else None, RankProgress(int(progress), 1)),), jobs)
        actions = loop.step(obs, t)
        for action in actions:
            if isinstance(action, ReadPower):
                known = True
            elif isinstance(action, SetLimit):
                limit = action.limit_mw / 1000
                loop.applied(action, t)
        job = loop.jobs.get("j")
        if settled is None and job is not None and job.phase is Phase.HOLD:
            settled = t
        deadline = loop.next_deadline()
        nxt = min(deadline if deadline is not None and deadline > t else t + 1.0, horizon)
        thr, pw = c.at(limit)
        progress += BASE_RATE * thr * (nxt - t)
        if settled is not None:
            thr_time += thr * (nxt - t)
            pow_time += pw * (nxt - t)
            at_limit[limit] = at_limit.get(limit, 0.0) + nxt - t
        t = nxt
    if settled is None or horizon - settled <= 0:
        return Effect(horizon, 1.0, 1.0, DEFAULT_LIMIT_W)
    span = horizon - settled
    return Effect(settled, thr_time / span, pow_time / span, max(at_limit, key=at_limit.get))


def best_within(c: Curve, slack: float) -> Effect:
    """In hindsight: of the limits the loop can set (25 W apart, down to its floor), the one
    with the least energy per unit of work no slower than the slack allows (what a loop
    that knew the curve would pick)."""
    floor = LOOP.min_share * DEFAULT_LIMIT_W
    points = [(w, *c.at(w)) for w in range(DEFAULT_LIMIT_W, MIN_LIMIT_W - 1, -25)
              if w >= floor]
    w, t, p = min(((w, t, p) for w, t, p in points if t >= 1 - slack),
                  key=lambda x: (x[2] / x[1], -x[0]))
    return Effect(0.0, t, p, w)


@dataclass(frozen=True)
class Plan:
    """A slack every tenant declares, and what it does to each workload."""

    slack: float
    effects: dict[str, Effect]
    seed: int

    def assign(self, jobs: Sequence[Job]) -> None:
        """Give each job its workload (seeded, the same for every slack) and its effect."""
        rng = random.Random(f"{self.seed}:workload")
        names = sorted(MEASURED)
        for j in sorted(jobs, key=lambda j: j.index):
            name = names[rng.randrange(len(names))]
            effect = self.effects[name]
            j.thr, j.pw, j.conv = effect.throughput, effect.power, effect.settle_s
            j.watts = CURVES[name].full_watts
            j.workload = name


def plan(slack: float, seed: int) -> Plan:
    return Plan(slack, {name: loop_effect(c, slack) for name, c in CURVES.items()}, seed)


def energy_regime(slack: float, seed: int) -> Regime:
    """No feed (the energy effect alone), every tenant declaring ``slack``."""
    return replace(none(), name=f"slack {slack:.0%}", energy=plan(slack, seed))


def charged_seconds(seconds: float, settle: float, power: float) -> float:
    """Full-power-equivalent seconds of a run of ``seconds`` on its GPUs."""
    return min(seconds, settle) + max(0.0, seconds - settle) * power


@dataclass(frozen=True)
class EnergyOutcome:
    name: str
    slack: float
    energy_mwh: float
    gpu_h: float
    mean_jct_h: float
    p99_jct_h: float
    finished: int
    mean_queue_h: float
    #: Per finished job: (index, JCT seconds, seconds from its first start to its end),
    #: to compare runs job by job.
    jct: tuple[tuple[int, float, float], ...]
    effects: dict[str, Effect]


def summarize_energy(result: RunResult, plan_: Plan) -> EnergyOutcome:
    joules = gpu_s = 0.0
    jct = []
    for j in result.jobs:
        joules += j.energy
        gpu_s += j.alloc_gpu_s
        if j.state == RUNNING and j.alloc:
            seg = result.end - j.alloc_since
            joules += j.alloc * j.watts * charged_seconds(seg, j.conv, j.pw)
            gpu_s += j.alloc * seg
        if j.state == DONE:
            jct.append((j.index, j.finish - j.arrival, j.finish - j.first_start))
    times = [t for _, t, _ in jct]
    queue = [t - r for _, t, r in jct]
    return EnergyOutcome(result.regime.name, plan_.slack, joules / 3.6e9, gpu_s / 3600,
                         sum(times) / len(times) / 3600 if times else 0.0,
                         percentile(times, 99) / 3600, len(jct),
                         sum(queue) / len(queue) / 3600 if queue else 0.0, tuple(jct),
                         plan_.effects)


def evaluate_energy(scenario: Scenario, regime: Regime) -> EnergyOutcome:
    assert regime.energy is not None
    result = Simulation(scenario.cfg, scenario.cluster, scenario.jobs, regime,
                        faults=scenario.faults, congestion=scenario.congestion).run()
    return summarize_energy(result, regime.energy)


_SHARED: Scenario | None = None


def _init(scenario: Scenario) -> None:
    global _SHARED  # noqa: PLW0603 - one scenario per worker process, set once
    _SHARED = scenario


def _evaluate_shared(regime: Regime) -> EnergyOutcome:
    assert _SHARED is not None
    return evaluate_energy(_SHARED, regime)


def evaluate_slacks(scenario: Scenario, slacks: Sequence[float] = SLACKS,
                    workers: int | None = None) -> list[EnergyOutcome]:
    regimes = [energy_regime(s, scenario.cfg.seed) for s in slacks]
    workers = min(len(regimes), workers or os.cpu_count() or 1)
    if workers <= 1:
        return [evaluate_energy(scenario, r) for r in regimes]
    ctx = multiprocessing.get_context("fork" if "fork" in
                                      multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(scenario,)) as pool:
        return pool.map(_evaluate_shared, regimes, chunksize=1)


# --- the report ---------------------------------------------------------------------


def effects_table(outcomes: Sequence[EnergyOutcome]) -> str:
    """Per workload and slack: where the loop settled (time-averaged after it settled),
    and the best measured limit within the slack in hindsight."""
    rows = []
    columns = [("workload", "workload (Zeus A40 trace)")]
    for o in outcomes:
        if o.slack > 0:
            columns += [(f"s{o.slack}", f"slack {o.slack:.0%}: the loop"),
                        (f"b{o.slack}", "best within it")]
    for name in sorted(MEASURED):
        row: dict[str, str] = {"workload": name}
        for o in outcomes:
            e, b = o.effects[name], best_within(CURVES[name], o.slack)
            row[f"s{o.slack}"] = (f"{e.limit_w:.0f} W: -{1 - e.energy:.1%} energy, "
                                  f"-{1 - e.throughput:.1%} speed")
            row[f"b{o.slack}"] = f"{b.limit_w:.0f} W: -{1 - b.energy:.1%}"
        rows.append(row)
    return table(rows, columns)


def results_table(outcomes: Sequence[EnergyOutcome]) -> str:
    base = next((o for o in outcomes if o.slack == 0), outcomes[0])
    before = {i: (t, r) for i, t, r in base.jct}
    rows = []
    for o in outcomes:
        run = [r / before[i][1] - 1 for i, _, r in o.jct if before.get(i, (0, 0))[1] > 0]
        rows.append({
            "slack": f"{o.slack:.0%}", "mwh": f"{o.energy_mwh:,.1f}",
            "saved": f"{1 - o.energy_mwh / base.energy_mwh:.1%}",
            "gpuh": f"{o.gpu_h:,.0f}", "jct": f"{o.mean_jct_h:.2f}",
            "djct": f"{o.mean_jct_h / base.mean_jct_h - 1:+.1%}",
            "queue": f"{o.mean_queue_h:.2f}",
            "run": f"{sum(run) / len(run):+.1%}" if run else "-",
            "p99": f"{o.p99_jct_h:.1f}", "done": str(o.finished),
        })
    return table(rows, [
        ("slack", "slack"), ("mwh", "GPU energy MWh"), ("saved", "saved"),
        ("gpuh", "GPU-h"), ("jct", "mean JCT h"), ("djct", "mean JCT"),
        ("queue", "mean queue h"), ("run", "mean run time"), ("p99", "p99 JCT h"),
        ("done", "finished")])


def headline(outcomes: Sequence[EnergyOutcome]) -> str:
    base = next((o for o in outcomes if o.slack == 0), outcomes[0])
    return "; ".join(
        f"slack {o.slack:.0%}: {1 - o.energy_mwh / base.energy_mwh:.1%} GPU energy saved, "
        f"mean JCT {o.mean_jct_h / base.mean_jct_h - 1:+.1%}"
        for o in outcomes if o is not base)
