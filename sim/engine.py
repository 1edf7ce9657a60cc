"""The discrete-event engine: a heap of timed events over pools of 8-GPU nodes.

Events: job arrivals (merged from the sorted trace), job completions, fault starts and
ends, fault precursors (the agent's advisory), congestion starts and ends per rack,
feed observations (batched per pool), feed releases (when the redactor holds a delayed
update) and ground-truth samples for the leakage attack.

Jobs progress analytically between events. A running job alternates ``ckpt_interval``
seconds of computing with a ``ckpt_cost`` checkpoint; its progress is saved when a
checkpoint completes. Completion times follow from the rate, so periodic checkpoints
cost no events. Anything that changes a job's rate (congestion, a degraded member, a new
algorithm or size) advances it to now and reschedules its completion; stale completion
events are skipped by version.

The provider's scheduler is FIFO per pool with backfill (the first ``backfill_depth``
queued jobs that fit start); single-node requests go to the fullest node that fits,
multi-node requests take whole free nodes. Restarts after a fault or preemption go to
the front of the queue. GPUs an elastic job holds beyond its requested size are
opportunistic: when jobs wait, the provider reclaims them (the job restarts at its
requested size from its last checkpoint).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.actions import TenantActions
from sim.cluster import Cluster, CongestionSpec, FaultSpec
from sim.events import (
    CAUSES,
    CONG_END,
    CONG_START,
    FAULT_END,
    FAULT_START,
    FINISH,
    FLUSH,
    HOLD_DUE,
    MAINTAIN,
    NEGOTIATE,
    PRECURSOR,
    RELEASE,
    SAMPLE,
)
from sim.feed import UP, FeedBridge
from sim.hazards import Hazards
from sim.jobs import RUNNING, Job, advance, finish_time
from sim.model import NO_CONGESTION, SimConfig, comm_factor, speed
from sim.negotiating import Negotiating
from sim.observing import Observing
from sim.placement import Placement
from sim.policies import TenantPolicy
from sim.regimes import Regime
from sim.scheduling import Scheduling
from sim.traces import JobSpec


@dataclass
class Records:
    """What the leakage attack needs: ground truth and the attacker's feed."""

    pools: list[str]
    #: (time, pool, other tenants' GPUs held, attacker's own GPUs held, view or None),
    #: view = (hosts_up lo, hosts_up hi, GPUs available lo, GPUs available hi).
    samples: list[tuple[float, int, int, int, tuple[int, int | None, int, int | None] | None]]
    #: Times a host of each pool stopped being plainly healthy (a fault started).
    failures: list[list[float]]
    #: The attacker's pool publications: (time, pool, hosts_up lo, hi, hosts_down lo, hi,
    #: GPUs available lo, hi); a hi of None is an open range.
    feed: list[tuple[float, int, int, int | None, int, int | None, int, int | None]]
    horizon: float
    #: The prober's answers (negotiation regime): (time, pool, GPUs offered; 0: refused).
    probes: list[tuple[float, int, int]] = field(default_factory=list)


@dataclass
class RunResult:
    regime: Regime
    jobs: list[Job]
    records: Records
    horizon: float
    end: float
    #: Integrals over [0, horizon] (utilization) and over the whole run (conservation).
    alloc_gpu_s_horizon: float
    cap_gpu_s_horizon: float
    alloc_gpu_s_total: float
    cap_gpu_s_total: float
    rollback_gpu_s: dict[str, float]
    pause_gpu_s: dict[str, float]
    counters: dict[str, int]
    policy_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The most ε any pool's feed spent over 24 hours (private mode; 0 otherwise).
    epsilon_day_max: float = 0.0
    #: The negotiation regime's counts (sim.negotiation.NegotiationCounters).
    negotiation: dict[str, float] = field(default_factory=dict)


class Simulation(Placement, Scheduling, TenantActions, Hazards, Observing, Negotiating):
    """The event loop and the simulation's state; each model step is a part of its own
    (sim/placement.py, scheduling.py, actions.py, hazards.py, observing.py,
    negotiating.py)."""

    def __init__(self, cfg: SimConfig, cluster: Cluster, jobs: Sequence[JobSpec],
                 regime: Regime, *, faults: Sequence[FaultSpec] = (),
                 congestion: Sequence[CongestionSpec] = (),
                 max_time: float | None = None) -> None:
        self.cfg, self.cluster, self.regime = cfg, cluster, regime
        self.gpn = gpn = cluster.gpus_per_node
        self.I = cfg.ckpt_interval
        self.T = cfg.ckpt_interval + cfg.ckpt_cost
        pools = cluster.pools
        by_name = cluster.pool_by_name()
        tenant_idx = {t: i for i, t in enumerate(cfg.tenants)}
        count = cluster.node_count
        self.node_pool = [0] * count
        for p in pools:
            for n in p.node_range:
                self.node_pool[n] = p.index
        self.state = [UP] * count
        self.free = [gpn] * count
        self.cong = [NO_CONGESTION] * count
        self.cong_active = [[0, 0, 0] for _ in range(count)]  # episodes per level
        self.hard = [0] * count
        self.soft = [0] * count
        self.node_jobs: list[dict[int, Job]] = [{} for _ in range(count)]
        self.free_sets: list[list[set[int]]] = []
        for p in pools:
            sets: list[set[int]] = [set() for _ in range(gpn + 1)]
            sets[gpn].update(p.node_range)
            self.free_sets.append(sets)
        self.pool_free = [p.nodes * gpn for p in pools]
        self.queue: list[list[Job]] = [[] for _ in pools]
        self.grown: list[dict[int, Job]] = [{} for _ in pools]
        self.held_by = [[0] * len(cfg.tenants) for _ in pools]

        # Jobs, elastic choice seeded and independent of the regime.
        rng = random.Random(f"{cfg.seed}:elastic")
        self.jobs: list[Job] = []
        for position, spec in enumerate(jobs):
            pool = by_name[spec.pool]
            if spec.tenant is None or spec.tenant not in tenant_idx:
                raise ValueError(f"job {spec.index}: tenant {spec.tenant!r} is not one of "
                                 f"{', '.join(cfg.tenants)}")
            draw = rng.random()
            elastic = spec.duration >= cfg.elastic_min_duration and draw < cfg.elastic_fraction
            cap = pool.nodes * gpn
            n = spec.gpus
            hi = min(cap, 2 * n if 2 * n <= gpn else gpn * max(1, (2 * n) // gpn))
            hi = max(hi, n) if n <= cap else n
            self.jobs.append(Job(spec, position, pool=pool.index, pool_name=pool.name,
                                 gpu_class=pool.gpu_class, tenant_idx=tenant_idx[spec.tenant],
                                 tenant=spec.tenant, elastic=elastic, lo_g=max(1, n // 2),
                                 hi_g=hi))
        if regime.energy is not None:
            regime.energy.assign(self.jobs)
        self.by_name = {j.name: j for j in self.jobs}
        self.pool_index = {p.name: p.index for p in pools}
        self.arrivals = sorted(self.jobs, key=lambda j: (j.arrival, j.index))
        self.horizon = self.arrivals[-1].arrival if self.arrivals else 0.0
        longest = max((j.work for j in self.jobs), default=0.0)
        self.max_time = max_time if max_time is not None else (
            self.horizon + 4 * longest + 365 * 86400.0)

        self.faults = list(faults)
        self.episodes = list(congestion)
        self.feed = FeedBridge(cluster, regime.redaction, cfg.seed)
        self.policies = [TenantPolicy(t, self, per_node=gpn, reserve=cfg.reserve_gpus,
                                      dwell_s=cfg.dwell_s, opportunities=cfg.opportunities)
                         for t in cfg.tenants]
        self.policy_of = {t: self.policies[i] for i, t in enumerate(cfg.tenants)}
        self.attacker = self.policies[cfg.attacker]

        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.flush_pending = [False] * len(pools)
        self.release_at: list[float | None] = [None] * len(pools)
        # Accounting.
        self.alloc_now = 0
        self.cap_now = count * gpn
        self.last_tick = 0.0
        self.acc_alloc_h = self.acc_cap_h = self.acc_alloc = self.acc_cap = 0.0
        self.rollback = dict.fromkeys(CAUSES, 0.0)
        self.pauses = dict.fromkeys(CAUSES, 0.0)
        self.counters = dict.fromkeys(
            ("faults", "fault_kills", "precursors", "advisories_sent", "publications_pool",
             "publications_job", "reclaims", "algorithm_switches", "rejected", "events"), 0)
        self.records = Records([p.name for p in pools], [],
                               [[] for _ in pools], [], self.horizon)
        self.unresolved = len(self.jobs)
        self._nego_init()

    def _push(self, t: float, kind: int, arg: int = 0, version: int = 0) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, arg, version))

    def _initial_events(self) -> None:
        for i, f in enumerate(self.faults):
            if f.start > self.max_time:
                continue
            self._push(f.start, FAULT_START, i)
            if f.lead is not None and f.start - f.lead >= 0:
                self._push(f.start - f.lead, PRECURSOR, i)
        for i, c in enumerate(self.episodes):
            if c.start <= self.max_time:
                self._push(c.start, CONG_START, i)
        if self.horizon > 0:
            self._push(0.0, SAMPLE)
        if self.feed.active:
            self.feed.prime(self.state, self.free, self.cong)
            for p in self.cluster.pools:
                self._mark(p.index)
        self._nego_events()

    def run(self) -> RunResult:
        self._initial_events()
        arrivals, n_arr, ai = self.arrivals, len(self.arrivals), 0
        heap = self.heap
        pop = heapq.heappop
        events = 0
        inf = math.inf
        while self.unresolved > 0:
            t_arr = arrivals[ai].arrival if ai < n_arr else inf
            t_ev = heap[0][0] if heap else inf
            if min(t_arr, t_ev) > self.max_time:
                if t_arr < inf or t_ev < inf:
                    self.now = self.max_time  # stopped: what is left is reported unfinished
                break
            events += 1
            if t_arr <= t_ev:
                job = arrivals[ai]
                ai += 1
                self.now = t_arr
                self._arrive(job)
                continue
            t, _, kind, arg, version = pop(heap)
            self.now = t
            if kind == FINISH:
                job = self.jobs[arg]
                if job.version == version and job.state == RUNNING:
                    self._finish(job)
            elif kind == FLUSH:
                self._flush(arg)
            elif kind == RELEASE:
                self._release(arg)
            elif kind == FAULT_START:
                self._fault(arg, +1)
            elif kind == FAULT_END:
                self._fault(arg, -1)
            elif kind == PRECURSOR:
                self._precursor(arg)
            elif kind == CONG_START:
                self._congestion(arg, True)
            elif kind == CONG_END:
                self._congestion(arg, False)
            elif kind == SAMPLE:
                self._sample()
            elif kind == NEGOTIATE:
                self._negotiate(arg)
            elif kind == HOLD_DUE:
                self._hold_due(arg, version)
            elif kind == MAINTAIN:
                self._maintain(arg)
        for j in self.jobs:
            if j.state == RUNNING:
                self._advance(j, self.now)
        self._tick(self.now)
        self.counters["events"] = events
        return RunResult(
            self.regime, self.jobs, self.records, self.horizon, self.now,
            self.acc_alloc_h, self.acc_cap_h, self.acc_alloc, self.acc_cap,
            self.rollback, self.pauses, self.counters,
            {p.tenant: vars(p.stats).copy() for p in self.policies},
            max((r.ledger.peak for r in self.feed.redactors), default=0.0),
            self.nego_counters())

    def _tick(self, now: float) -> None:
        last = self.last_tick
        if now <= last:
            return
        dt = now - last
        self.acc_alloc += self.alloc_now * dt
        self.acc_cap += self.cap_now * dt
        if last < self.horizon:
            dh = min(now, self.horizon) - last
            self.acc_alloc_h += self.alloc_now * dh
            self.acc_cap_h += self.cap_now * dh
        self.last_tick = now

    def _advance(self, j: Job, t: float) -> None:
        advance(j, t, self.I, self.T)

    def _schedule_finish(self, j: Job) -> None:
        j.version += 1
        self._push(finish_time(j, self.I, self.T), FINISH, j.index, j.version)

    def _rate(self, j: Job) -> float:
        r = speed(j.g, j.n, self.cfg.speed_alpha) * j.thr
        if j.degraded:
            r *= self.cfg.straggler_factor
        if len(j.nodes) > 1:
            level = max(self.cong[n] for n in j.nodes)
            r *= comm_factor(level, j.algo, self.cfg.comm_fraction)
        return r

    def _rerate(self, j: Job) -> None:
        self._advance(j, self.now)
        j.rate = self._rate(j)
        self._schedule_finish(j)
