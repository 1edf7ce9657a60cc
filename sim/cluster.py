"""The simulated cluster: pools of 8-GPU nodes sized from the job trace, and its faults.

Sizing. If every job started on arrival (multi-node jobs rounded up to whole nodes), a
pool's demand would be a step function of time. Each pool (a Philly virtual cluster)
gets ``ceil(load_factor * q / 8)`` nodes, where ``q`` is the ``demand_quantile`` of that
demand over the trace window, time-weighted, and never fewer nodes than its largest job
needs. Philly's demand is bursty (peaks are 4 to 25 times the mean), so sizing for the
peak would leave the cluster idle and sizing for the mean would queue for weeks; with
the default 0.9 quantile, a pool's demand fits 90% of the time and bursts queue.

Faults. The fault trace covers ``trace_nodes`` servers (400), of which only those that
failed appear in it. Those ids plus fault-free placeholders fill ``trace_nodes`` slots,
shuffled with the seed; simulated node ``i`` replays slot ``i mod trace_nodes`` (a second
pass over the slots, when the cluster is larger, is shifted in time so it is not a copy).
Trace days become simulated seconds times ``fault_time_scale`` from the job trace's start
(below 1 the trace is replayed faster, and repeats for as long as the run needs it).
Alternatively a Poisson model fitted to the trace (its rate per node-day; types and
durations resampled from it) runs to a given horizon.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from sim.model import HIGH, LOW, SimConfig, has_precursor_class, is_soft
from sim.traces import DAY, FaultTrace, JobSpec

#: Shift of each further pass over the fault slots, as a share of the trace's span.
_CYCLE_SHIFT = 0.618


@dataclass(frozen=True)
class Pool:
    index: int
    name: str
    gpu_class: str
    first_node: int
    nodes: int

    @property
    def node_range(self) -> range:
        return range(self.first_node, self.first_node + self.nodes)


@dataclass(frozen=True)
class Cluster:
    pools: tuple[Pool, ...]
    gpus_per_node: int

    @property
    def node_count(self) -> int:
        return sum(p.nodes for p in self.pools)

    def pool_by_name(self) -> dict[str, Pool]:
        return {p.name: p for p in self.pools}

    @staticmethod
    def host_name(node: int) -> str:
        return f"host-{node:05d}"


def nodes_for(gpus: int, per_node: int) -> int:
    return max(1, math.ceil(gpus / per_node))


def allocation(gpus: int, per_node: int) -> int:
    """GPUs a job of this size holds: its own count on one node, whole nodes beyond."""
    return gpus if gpus <= per_node else per_node * nodes_for(gpus, per_node)


def demand_quantile(jobs: Sequence[JobSpec], per_node: int, q: float) -> dict[str, int]:
    """Per pool, the ``q`` quantile (time-weighted, over the arrival window) of the GPUs
    its jobs would hold if every job ran from its arrival; ``q`` = 1 is the peak."""
    events: dict[str, list[tuple[float, int]]] = {}
    window = max((j.arrival for j in jobs), default=0.0)
    for job in jobs:
        held = allocation(job.gpus, per_node)
        ev = events.setdefault(job.pool, [])
        ev.append((job.arrival, held))
        ev.append((job.arrival + job.duration, -held))
    out = {}
    for pool, ev in events.items():
        ev.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
        level, last, peak = 0, 0.0, 0
        spans: dict[int, float] = {}
        for t, delta in ev:
            if t > last and last < window:
                spans[level] = spans.get(level, 0.0) + min(t, window) - last
            last = max(last, t)
            level += delta
            peak = max(peak, level)
        total = sum(spans.values())
        if q >= 1.0 or total <= 0:
            out[pool] = peak
            continue
        acc = 0.0
        out[pool] = peak
        for value in sorted(spans):
            acc += spans[value]
            if acc >= q * total:
                out[pool] = value
                break
    return out


def size_cluster(jobs: Sequence[JobSpec], cfg: SimConfig) -> Cluster:
    per_node = cfg.gpus_per_node
    peaks = demand_quantile(jobs, per_node, cfg.demand_quantile)
    largest: dict[str, int] = {}
    for job in jobs:
        largest[job.pool] = max(largest.get(job.pool, 0), nodes_for(job.gpus, per_node))
    fixed = dict(cfg.nodes_per_pool)
    names = sorted(set(peaks) | set(fixed))
    pools, first = [], 0
    for index, name in enumerate(names):
        if name in fixed:
            count = fixed[name]
        else:
            count = max(largest.get(name, 1),
                        math.ceil(cfg.load_factor * peaks.get(name, 0) / per_node), 1)
        gpu_class = cfg.gpu_classes[index % len(cfg.gpu_classes)]
        pools.append(Pool(index, name, gpu_class, first, count))
        first += count
    return Cluster(tuple(pools), per_node)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault on one simulated node, on the simulation clock."""

    node: int
    start: float
    end: float
    #: Degrades the host (slow, drained) rather than taking it down.
    soft: bool
    #: Seconds of warning the host agent has, or None when it does not see it coming.
    lead: float | None
    fault_class: str
    desc: str


def _with_precursors(raw: list[tuple[int, float, float, str, str]],
                     cfg: SimConfig) -> list[FaultSpec]:
    raw.sort(key=lambda f: (f[1], f[0]))
    rng = random.Random(f"{cfg.seed}:precursor")
    out = []
    for node, start, end, fault_class, desc in raw:
        # Both draws always happen, so the config does not shift later faults' luck.
        seen, lead = rng.random(), rng.uniform(*cfg.precursor_lead)
        visible = has_precursor_class(fault_class, desc) and seen < cfg.precursor_fraction
        out.append(FaultSpec(node, start, end, is_soft(desc), lead if visible else None,
                             fault_class, desc))
    return out


def map_trace_faults(trace: FaultTrace, cluster: Cluster, cfg: SimConfig,
                     until: float = 0.0) -> list[FaultSpec]:
    """Replay the fault trace on the simulated nodes (see the module docstring); when the
    scaled trace is shorter than ``until``, it repeats."""
    known = trace.nodes
    slots: list[str | None] = [*known, *([None] * max(0, cfg.trace_nodes - len(known)))]
    random.Random(f"{cfg.seed}:faultmap").shuffle(slots)
    by_node: dict[str, list[tuple[float, float, str, str]]] = {}
    for r in trace.records:
        by_node.setdefault(r.node, []).append((r.start_day, r.end_day, r.fault_class, r.desc))
    span = max(trace.span_days, 1e-9)
    scale = DAY * cfg.fault_time_scale
    repeats = max(1, math.ceil(until / (span * scale)))
    raw = []
    for node in range(cluster.node_count):
        slot = slots[node % len(slots)] if slots else None
        if slot is None:
            continue
        shift = (node // len(slots)) * _CYCLE_SHIFT * span
        for start, end, fault_class, desc in by_node[slot]:
            begin = (start + shift) % span if shift else start
            for rep in range(repeats):
                offset = rep * span
                raw.append((node, (offset + begin) * scale, (offset + begin + end - start) * scale,
                            fault_class, desc))
    return _with_precursors(raw, cfg)


def model_faults(trace: FaultTrace, cluster: Cluster, cfg: SimConfig,
                 horizon: float) -> list[FaultSpec]:
    """Poisson faults at the trace's rate per node-day, types and durations resampled."""
    if not trace.records:
        return []
    rate = len(trace.records) / (cfg.trace_nodes * trace.span_days * DAY * cfg.fault_time_scale)
    rng = random.Random(f"{cfg.seed}:faultmodel")
    scale = DAY * cfg.fault_time_scale
    raw = []
    for node in range(cluster.node_count):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= horizon:
                break
            r = trace.records[rng.randrange(len(trace.records))]
            raw.append((node, t, t + (r.end_day - r.start_day) * scale, r.fault_class, r.desc))
    return _with_precursors(raw, cfg)


@dataclass(frozen=True, slots=True)
class CongestionSpec:
    """Congestion on the data links of ``nodes`` (one rack's uplink) from start to end."""

    nodes: tuple[int, ...]
    start: float
    end: float
    #: sim.model.LOW or sim.model.HIGH.
    level: int


def racks(cluster: Cluster, rack_size: int) -> list[tuple[int, ...]]:
    """Consecutive nodes of a pool share an uplink, ``rack_size`` at a time."""
    out = []
    for p in cluster.pools:
        nodes = list(p.node_range)
        out += [tuple(nodes[i:i + rack_size]) for i in range(0, len(nodes), rack_size)]
    return out


def congestion_episodes(cluster: Cluster, cfg: SimConfig, until: float) -> list[CongestionSpec]:
    """No public trace has link congestion: per rack, episodes arrive as a Poisson process
    (``congestion_per_rack_day``), last an exponential time (mean ``congestion_mean_s``)
    and are high with probability ``congestion_high_share``, else low."""
    if cfg.congestion_per_rack_day <= 0:
        return []
    gap_rate = cfg.congestion_per_rack_day / DAY
    out = []
    for index, rack in enumerate(racks(cluster, cfg.rack_size)):
        rng = random.Random(f"{cfg.seed}:congestion:{index}")
        t = rng.expovariate(gap_rate)
        while t < until:
            level = HIGH if rng.random() < cfg.congestion_high_share else LOW
            end = t + rng.expovariate(1.0 / cfg.congestion_mean_s)
            out.append(CongestionSpec(rack, t, end, level))
            t = end + rng.expovariate(gap_rate)
    return out
