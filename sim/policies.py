"""Tenant policies: what a tenant does with what its feed tells it.

One policy object per tenant. It knows its own jobs (it launched them) and nothing else
except the publications delivered to it. Under ``Mode.NONE`` nothing is delivered, so
every decision falls back to the fixed default noted below. The same code runs under
the redacted and the full feed; only what arrives differs.

Opportunities and rules:

* **Submission (when, at what size).** An elastic job with requested size ``n`` and
  range ``[lo, hi]``: if the pool shows at least ``n + reserve`` free GPUs it starts
  bigger (up to ``hi``, leaving ``reserve``); if it shows fewer than ``n`` but at least
  ``lo``, it starts now at what fits instead of queueing for ``n``. Default: ``n``.
* **Elasticity.** On each capacity update for a pool where the tenant runs elastic jobs:
  if the trend is not falling and more than ``reserve`` GPUs are free, grow jobs (oldest
  first) into the excess, at most one resize per job per ``dwell_s``. If the pool shows
  no free GPUs and a falling trend, hand back one job's opportunistic GPUs (the newest
  grown) before the provider reclaims them by force, which would cost the work since the
  job's last checkpoint. "No free GPUs" means the reading's upper edge is below
  ``reserve``: a private reading (a 90% range around a noisy value) whose lower edge is
  0 but whose upper edge is wide is not a full pool. Default: never resize.
* **Fault tolerance.** Checkpoint on every checkpoint advisory; otherwise every
  ``ckpt_interval`` (the engine's fixed schedule, in every regime). When a job's health
  names a degraded member and the pool shows room for the whole job, re-place it (a
  checkpoint, then a restart on other hosts). Default: stay put.
* **Collectives.** Pick the algorithm that is fastest at the congestion level the job's
  health reports (:func:`sim.model.best_algorithm`). Default: ring.

A policy reads capacity as the lower edge of the bucket it was given (conservative;
under the full feed the bucket is exact), and between updates subtracts what its own
actions took, so a burst of its own submissions does not reuse the same free GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from harmonaize.messages import JobAdvisory, JobHealth, Level, PoolCapacity, Trend
from sim.model import OPPORTUNITIES, best_algorithm


class JobView(Protocol):
    """What a tenant knows about its own job (the engine's job object satisfies it)."""

    name: str
    pool_name: str
    gpu_class: str
    n: int
    g: int
    lo_g: int
    hi_g: int
    elastic: bool
    last_resize: float
    running: bool


class Actions(Protocol):
    """What a tenant may ask of the provider for its own jobs."""

    def resize(self, job: JobView, gpus: int, now: float) -> bool: ...
    def checkpoint(self, job: JobView, now: float) -> bool: ...
    def replace(self, job: JobView, now: float) -> bool: ...
    def set_algorithm(self, job: JobView, algorithm: int, now: float) -> None: ...


_LEVEL_RANK = {Level.NONE: 0, Level.LOW: 1, Level.HIGH: 2}


@dataclass
class PoolView:
    """The tenant's latest capacity reading for one pool."""

    available: int      # lower edge of the published bucket
    trend: Trend
    estimate: int       # ``available`` less what this tenant took since
    hosts_up: int
    hosts_up_hi: int | None
    hosts_down: int
    available_hi: int | None
    at: float


@dataclass
class PolicyStats:
    grow_asks: int = 0
    grows: int = 0
    shrinks: int = 0
    checkpoints: int = 0
    replaces: int = 0
    sized_submissions: int = 0


def fit(gpus: int, per_node: int) -> int:
    """A usable size: anything on one node, whole nodes beyond."""
    return gpus if gpus <= per_node else per_node * (gpus // per_node)


def held(gpus: int, per_node: int) -> int:
    return gpus if gpus <= per_node else per_node * -(-gpus // per_node)


class TenantPolicy:
    def __init__(self, tenant: str, actions: Actions, *, per_node: int, reserve: int,
                 dwell_s: float, opportunities: Iterable[str] = OPPORTUNITIES) -> None:
        self.tenant = tenant
        self.on = frozenset(opportunities)
        self.actions = actions
        self.per_node = per_node
        self.reserve = reserve
        self.dwell_s = dwell_s
        self.views: dict[tuple[str, str], PoolView] = {}
        self.jobs: dict[str, JobView] = {}
        #: Running elastic jobs per pool, oldest first.
        self.elastic: dict[tuple[str, str], dict[str, JobView]] = {}
        self.stats = PolicyStats()

    # --- the tenant's own bookkeeping (no feed involved) ---------------------------------

    def started(self, job: JobView) -> None:
        self.jobs[job.name] = job
        if job.elastic:
            self.elastic.setdefault((job.pool_name, job.gpu_class), {})[job.name] = job

    def stopped(self, job: JobView) -> None:
        self.jobs.pop(job.name, None)
        if job.elastic:
            self.elastic.get((job.pool_name, job.gpu_class), {}).pop(job.name, None)

    # --- decisions ---------------------------------------------------------------------

    def submit_size(self, job: JobView) -> int:
        view = self.views.get((job.pool_name, job.gpu_class))
        if not job.elastic or view is None or "submit" not in self.on:
            return job.n
        est = view.estimate
        if est - self.reserve >= job.n:
            size = min(job.hi_g, fit(est - self.reserve, self.per_node))
        elif job.lo_g <= est < job.n:
            size = max(job.lo_g, fit(est, self.per_node))
        else:
            size = job.n
        size = max(size, job.lo_g)
        if size != job.n:
            self.stats.sized_submissions += 1
        view.estimate -= held(size, self.per_node)
        return size

    def on_pool(self, cap: PoolCapacity, now: float) -> None:
        key = (cap.pool, cap.gpu_class)
        lo = cap.gpus_available.lo
        view = PoolView(lo, cap.trend, lo, cap.hosts_up.lo, cap.hosts_up.hi, cap.hosts_down.lo,
                        cap.gpus_available.hi, now)
        self.views[key] = view
        jobs = self.elastic.get(key)
        if not jobs or "elastic" not in self.on:
            return
        if cap.trend is not Trend.FALLING and view.estimate > self.reserve:
            self._grow(jobs, view, now)
        elif cap.trend is Trend.FALLING and cap.gpus_available.hi is not None \
                and cap.gpus_available.hi < self.reserve:
            # Only when the reading is sure the pool is (nearly) full: a noisy range whose
            # lower edge is 0 but whose upper edge is wide says nothing of the kind.
            self._give_back(jobs, now)

    def _grow(self, jobs: dict[str, JobView], view: PoolView, now: float) -> None:
        for job in list(jobs.values()):
            spare = view.estimate - self.reserve
            if spare <= 0:
                return
            if job.g >= job.hi_g or now - job.last_resize < self.dwell_s:
                continue
            target = min(job.hi_g, fit(job.g + spare, self.per_node))
            if target <= job.g:
                continue
            self.stats.grow_asks += 1
            before = held(job.g, self.per_node)
            if self.actions.resize(job, target, now):
                self.stats.grows += 1
                view.estimate -= held(target, self.per_node) - before

    def _give_back(self, jobs: dict[str, JobView], now: float) -> None:
        for job in reversed(jobs.values()):
            if job.g > job.n:
                if self.actions.resize(job, job.n, now):
                    self.stats.shrinks += 1
                return

    def on_job_health(self, health: JobHealth, now: float) -> None:
        job = self.jobs.get(health.job)
        if job is None or not job.running:
            return  # ended since: nothing to do
        if "collective" in self.on:
            self.actions.set_algorithm(job, best_algorithm(_LEVEL_RANK[health.congestion]), now)
        if health.degraded and not health.lost and "replace" in self.on:
            # Only where the pool shows room for the whole job: a re-placement that has
            # to queue would stop a job that is merely slow.
            view = self.views.get((job.pool_name, job.gpu_class))
            need = held(job.g, self.per_node)
            if view is not None and view.estimate >= need and self.actions.replace(job, now):
                self.stats.replaces += 1
                view.estimate -= need

    def on_advisory(self, advisory: JobAdvisory, now: float) -> None:
        job = self.jobs.get(advisory.job)
        if "checkpoint" not in self.on or job is None or not job.running:
            return
        if self.actions.checkpoint(job, now):
            self.stats.checkpoints += 1
