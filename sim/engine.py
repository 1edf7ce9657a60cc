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

# Over 400 lines because the discrete-event simulator's scheduler, jobs and failure handling
# share one event queue and clock; split, every part would reach into the queue.

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.types import Publication
from harmonaize.messages import JobAdvisory, JobHealth, PoolCapacity
from sim.cluster import Cluster, CongestionSpec, FaultSpec, allocation
from sim.feed import DEGRADED, DOWN, UP, FeedBridge, member_name
from sim.jobs import DONE, QUEUED, REJECTED, RUNNING, Job, advance, finish_time
from sim.model import HIGH, LOW, NO_CONGESTION, RING, SimConfig, comm_factor, speed
from sim.policies import JobView, TenantPolicy
from sim.regimes import Regime
from sim.traces import JobSpec

# Event kinds (heap entries are (time, seq, kind, arg, version)).
FINISH, FAULT_START, FAULT_END, PRECURSOR, CONG_START, CONG_END, FLUSH, RELEASE, SAMPLE = (
    range(9))
# Causes of pauses and rollbacks, for the GPU-hour breakdown.
CAUSES = ("fault", "preempt", "advisory-ckpt", "rescale", "replace")
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


class Simulation:
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

    # --- set-up ------------------------------------------------------------------------

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

    # --- main loop ---------------------------------------------------------------------

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
            max((r.ledger.peak for r in self.feed.redactors), default=0.0))

    # --- accounting ----------------------------------------------------------------------

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

    # --- job progress ------------------------------------------------------------------

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

    # --- placement -----------------------------------------------------------------------

    def _find(self, pool: int, g: int) -> tuple[list[int], int] | None:
        gpn = self.gpn
        sets = self.free_sets[pool]
        if g <= gpn:
            for k in range(g, gpn + 1):
                s = sets[k]
                if s:
                    return [next(iter(s))], g
            return None
        m = -(-g // gpn)
        whole = sets[gpn]
        if len(whole) < m:
            return None
        return list(itertools.islice(whole, m)), gpn

    def _take(self, j: Job, nodes: list[int], per: int) -> None:
        self._tick(self.now)
        pool = j.pool
        sets = self.free_sets[pool]
        feed = self.feed.active
        for n in nodes:
            before = self.free[n]
            if before < per:
                raise AssertionError(f"node {n} over-committed: {per} > {before} free")
            self.free[n] = before - per
            if self.state[n] == UP:
                sets[before].discard(n)
                sets[before - per].add(n)
                self.pool_free[pool] -= per
            self.node_jobs[n][j.index] = j
            if feed:
                self.feed.node_changed(n, False)
        j.nodes, j.per = nodes, per
        j.alloc = per * len(nodes)
        self.alloc_now += j.alloc
        self.held_by[pool][j.tenant_idx] += j.alloc
        j.alloc_since = self.now
        if feed:
            self._mark(pool)

    def _give(self, j: Job) -> None:
        self._tick(self.now)
        pool = j.pool
        sets = self.free_sets[pool]
        feed = self.feed.active
        per = j.per
        for n in j.nodes:
            before = self.free[n]
            self.free[n] = before + per
            if self.state[n] == UP:
                sets[before].discard(n)
                sets[before + per].add(n)
                self.pool_free[pool] += per
            del self.node_jobs[n][j.index]
            if feed:
                self.feed.node_changed(n, False)
        self.alloc_now -= j.alloc
        self.held_by[pool][j.tenant_idx] -= j.alloc
        held = self.now - j.alloc_since
        j.alloc_gpu_s += j.alloc * held
        if j.watts:  # energy runs (sim/energy.py): full power until the loop settles
            j.energy += j.alloc * j.watts * (min(held, j.conv) + max(0.0, held - j.conv) * j.pw)
        j.nodes, j.per, j.alloc = [], 0, 0
        if feed:
            self._mark(pool)

    def _start(self, j: Job, spot: tuple[list[int], int], pause: float, cause: str) -> None:
        """Put ``j`` on ``spot`` and let it run after ``pause`` seconds (charged to ``cause``)."""
        now = self.now
        nodes, per = spot
        self._take(j, nodes, per)
        j.state = RUNNING
        j.t0 = now
        j.pause_until = now + pause
        j.phase = 0.0
        j.pending_save = -1.0
        if j.first_start < 0:
            j.first_start = now
        j.degraded = sum(1 for n in nodes if self.state[n] == DEGRADED)
        j.rate = self._rate(j)
        self._schedule_finish(j)
        if pause > 0 and cause:
            self.pauses[cause] += j.alloc * pause
        if j.g > j.n:
            self.grown[j.pool][j.index] = j
        else:
            self.grown[j.pool].pop(j.index, None)
        if self.feed.active:
            # The redactor's first health message for a placement says "all clear" unless a
            # host is congested or unhealthy; the tenant only acts on it if it set another
            # algorithm before. Skipping it otherwise changes nothing (see sim.feed).
            watch = j.algo != RING or any(self.cong[n] or self.state[n] != UP for n in nodes)
            self.feed.place(j.pool, j.name, j.tenant, nodes, watch)
        self.policies[j.tenant_idx].started(j)

    def _stop(self, j: Job) -> None:
        """Take ``j`` off its hosts (it finishes, or waits to restart)."""
        self._give(j)
        self.grown[j.pool].pop(j.index, None)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        self.policies[j.tenant_idx].stopped(j)

    # --- scheduling ----------------------------------------------------------------------

    def _arrive(self, j: Job) -> None:
        pool = self.cluster.pools[j.pool]
        if allocation(j.n, self.gpn) > pool.nodes * self.gpn:
            j.state = REJECTED  # it can never fit this pool
            self.counters["rejected"] += 1
            self.unresolved -= 1
            return
        j.g = self.policies[j.tenant_idx].submit_size(j)
        j.state = QUEUED
        self.queue[j.pool].append(j)
        self._schedule(j.pool)

    def _schedule(self, pool: int) -> None:
        queue = self.queue[pool]
        while queue:
            if self.pool_free[pool] > 0:
                keep: list[Job] = []
                started = False
                depth = self.cfg.backfill_depth
                for i, j in enumerate(queue):
                    if i >= depth or self.pool_free[pool] == 0:
                        keep.extend(queue[i:])
                        break
                    spot = self._find(pool, j.g)
                    if spot is None:
                        keep.append(j)
                        continue
                    pause, cause = (self.cfg.restart_cost, j.restart) if j.restart else (0.0, "")
                    j.restart = ""
                    self._start(j, spot, pause, cause)
                    started = True
                if started:
                    self.queue[pool] = queue = keep
            grown = self.grown[pool]
            if not queue or not grown:
                return
            # Jobs wait: reclaim the newest opportunistic GPUs, then look again.
            victim = grown[next(reversed(grown))]
            self.counters["reclaims"] += 1
            self._resize(victim, victim.n, forced=True)

    def _requeue_front(self, j: Job, cause: str) -> None:
        j.state = QUEUED
        j.restart = cause
        j.g = min(j.g, j.n)  # the opportunistic part is gone with the allocation
        self.queue[j.pool].insert(0, j)

    def _finish(self, j: Job) -> None:
        self._advance(j, self.now)
        j.P = j.work
        j.state = DONE
        j.finish = self.now
        self._stop(j)
        self.unresolved -= 1
        self._schedule(j.pool)

    def _kill(self, j: Job, cause: str) -> None:
        """The job's host failed (or its GPUs were reclaimed): back to its last checkpoint."""
        self._advance(j, self.now)
        lost = j.P - j.S
        self.rollback[cause] += lost * j.n
        j.P = j.S
        j.pending_save = -1.0
        j.kills += 1
        self._stop(j)
        self._requeue_front(j, cause)

    # --- what tenants may ask (sim.policies.Actions) ----------------------------------------

    def resize(self, job: JobView, gpus: int, now: float) -> bool:
        j = self.by_name[job.name]
        if j.state != RUNNING or gpus == j.g or not j.lo_g <= gpus <= j.hi_g:
            return False
        if gpus > j.g and self.queue[j.pool]:
            return False  # waiting jobs come first
        return self._resize(j, gpus, forced=False)

    def _resize(self, j: Job, gpus: int, forced: bool) -> bool:
        """Restart ``j`` on ``gpus`` GPUs; forced: a reclaim (the caller reschedules the pool)."""
        nodes, per, old = j.nodes, j.per, j.g
        self._advance(j, self.now)
        self._give(j)
        spot = self._find(j.pool, gpus)
        if spot is None:
            if gpus > j.g:  # no room to grow: put it back as it was
                self._take(j, nodes, per)
                return False
            # Shrinking onto hosts it cannot stay on (drained): start over from the queue.
            self._kill_released(j, "preempt" if forced else "rescale")
            if not forced:
                self._schedule(j.pool)
            return True
        if forced:
            self.rollback["preempt"] += (j.P - j.S) * j.n
            j.P = j.S
            pause, cause = self.cfg.restart_cost, "preempt"
        else:
            j.S = j.P  # a graceful resize checkpoints first
            pause, cause = self.cfg.ckpt_cost + self.cfg.rescale_cost, "rescale"
        self.policies[j.tenant_idx].stopped(j)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        j.g = gpus
        j.last_resize = self.now
        self._start(j, spot, pause, cause)
        if gpus < old and not forced:
            self._schedule(j.pool)
        return True

    def _kill_released(self, j: Job, cause: str) -> None:
        if cause == "preempt":
            self.rollback[cause] += (j.P - j.S) * j.n
            j.P = j.S
        else:
            j.S = j.P
        self.grown[j.pool].pop(j.index, None)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        self.policies[j.tenant_idx].stopped(j)
        self._requeue_front(j, cause)

    def checkpoint(self, job: JobView, now: float) -> bool:
        j = self.by_name[job.name]
        if j.state != RUNNING:
            return False
        self._advance(j, self.now)
        if j.pause_until > self.now or j.phase >= self.I:
            return False  # already restarting or checkpointing
        j.pending_save = j.P
        j.pause_until = self.now + self.cfg.ckpt_cost
        j.phase = 0.0
        self.pauses["advisory-ckpt"] += j.alloc * self.cfg.ckpt_cost
        self._schedule_finish(j)
        return True

    def replace(self, job: JobView, now: float) -> bool:
        j = self.by_name[job.name]
        if j.state != RUNNING or not j.degraded:
            return False
        nodes, per = j.nodes, j.per
        self._advance(j, self.now)
        self._give(j)
        spot = self._find(j.pool, j.g)
        if spot is None:
            self._take(j, nodes, per)
            return False
        j.S = j.P
        self.policies[j.tenant_idx].stopped(j)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        self._start(j, spot, self.cfg.ckpt_cost + self.cfg.restart_cost, "replace")
        return True

    def set_algorithm(self, job: JobView, algorithm: int, now: float) -> None:
        j = self.by_name[job.name]
        if j.state != RUNNING or j.algo == algorithm:
            return
        j.algo = algorithm
        if len(j.nodes) > 1:  # only collectives across hosts feel the network
            self.counters["algorithm_switches"] += 1
            self._rerate(j)

    # --- faults and congestion -------------------------------------------------------------

    def _node_state(self, n: int) -> int:
        return DOWN if self.hard[n] else DEGRADED if self.soft[n] else UP

    def _fault(self, index: int, delta: int) -> None:
        f = self.faults[index]
        n = f.node
        if delta > 0:
            self.counters["faults"] += 1
            self._push(f.end, FAULT_END, index)
        if f.soft:
            self.soft[n] += delta
        else:
            self.hard[n] += delta
        before, after = self.state[n], self._node_state(n)
        if before == after:
            return
        pool = self.node_pool[n]
        if before == UP:
            self.free_sets[pool][self.free[n]].discard(n)
            self.pool_free[pool] -= self.free[n]
            self.records.failures[pool].append(self.now)
        self.state[n] = after
        if after == DOWN:
            self._tick(self.now)
            self.cap_now -= self.gpn
            for j in list(self.node_jobs[n].values()):
                self.counters["fault_kills"] += 1
                self._kill(j, "fault")
        elif before == DOWN:
            self._tick(self.now)
            self.cap_now += self.gpn
        if after == UP:
            self.free_sets[pool][self.free[n]].add(n)
            self.pool_free[pool] += self.free[n]
        if (after == DEGRADED) != (before == DEGRADED):
            step = 1 if after == DEGRADED else -1
            for j in list(self.node_jobs[n].values()):
                j.degraded += step
                self._rerate(j)
        if self.feed.active:
            self.feed.node_changed(n, True, (j.name for j in self.node_jobs[n].values()))
            self._mark(pool)
        self._schedule(pool)

    def _precursor(self, index: int) -> None:
        f = self.faults[index]
        self.counters["precursors"] += 1
        if not self.feed.active or self.state[f.node] == DOWN:
            return
        pool = self.node_pool[f.node]
        for j in list(self.node_jobs[f.node].values()):
            ranks = tuple(member_name(i) for i, n in enumerate(j.nodes) if n == f.node)
            self.feed.advisory(pool, j.name, f.node, ranks, self.now)
            self.counters["advisories_sent"] += 1
        self._deliver(self.feed.release(pool, self.now))
        self._plan_release(pool)

    def _congestion(self, index: int, starting: bool) -> None:
        episode = self.episodes[index]
        step = 1 if starting else -1
        if starting:
            self._push(episode.end, CONG_END, index)
        touched: dict[int, Job] = {}
        for n in episode.nodes:
            active = self.cong_active[n]
            active[episode.level] += step
            level = HIGH if active[HIGH] else LOW if active[LOW] else NO_CONGESTION
            if level == self.cong[n]:
                continue
            self.cong[n] = level
            touched.update(self.node_jobs[n])
            if self.feed.active:
                self.feed.node_changed(n, True, (j.name for j in self.node_jobs[n].values()))
                self._mark(self.node_pool[n])
        for j in touched.values():
            if len(j.nodes) > 1:
                self._rerate(j)

    # --- the feed ------------------------------------------------------------------------

    def _mark(self, pool: int) -> None:
        if not self.flush_pending[pool]:
            self.flush_pending[pool] = True
            self._push(self.now + self.cfg.observe_batch_s, FLUSH, pool)

    def _flush(self, pool: int) -> None:
        self.flush_pending[pool] = False
        pubs = self.feed.flush(pool, self.now, self.state, self.free, self.cong)
        self._deliver(pubs)
        self._plan_release(pool)

    def _release(self, pool: int) -> None:
        self.release_at[pool] = None
        self._deliver(self.feed.release(pool, self.now))
        self._plan_release(pool)

    def _plan_release(self, pool: int) -> None:
        due = self.feed.next_due(pool)
        if due is None:
            return
        planned = self.release_at[pool]
        if planned is None or due < planned:
            self.release_at[pool] = due
            self._push(max(due, self.now), RELEASE, pool)

    def _deliver(self, pubs: list[Publication]) -> None:
        now = self.now
        for pub in pubs:
            body = pub.body
            if pub.tenant is None:
                self.counters["publications_pool"] += 1
                if isinstance(body, PoolCapacity):
                    self._log_attacker(body)
                    for policy in self.policies:
                        policy.on_pool(body, now)
                continue
            self.counters["publications_job"] += 1
            owner = self.by_name.get(getattr(body, "job", ""))
            if owner is None or owner.tenant != pub.tenant:
                raise AssertionError(f"{pub.topic} addressed to {pub.tenant}, not the job's owner")
            policy = self.policy_of[pub.tenant]
            if isinstance(body, JobHealth):
                policy.on_job_health(body, now)
            elif isinstance(body, JobAdvisory):
                policy.on_advisory(body, now)

    # --- measurement ---------------------------------------------------------------------

    def _log_attacker(self, cap: PoolCapacity) -> None:
        self.records.feed.append((self.now, self.pool_index[cap.pool], cap.hosts_up.lo,
                                  cap.hosts_up.hi, cap.hosts_down.lo, cap.hosts_down.hi,
                                  cap.gpus_available.lo, cap.gpus_available.hi))

    def _sample(self) -> None:
        me = self.cfg.attacker
        views = self.attacker.views
        for p in self.cluster.pools:
            held = self.held_by[p.index]
            own = held[me]
            view = views.get((p.name, p.gpu_class))
            feature = None if view is None else (view.hosts_up, view.hosts_up_hi,
                                                 view.available, view.available_hi)
            self.records.samples.append((self.now, p.index, sum(held) - own, own, feature))
        nxt = self.now + self.cfg.sample_s
        if nxt <= self.horizon:
            self._push(nxt, SAMPLE)

