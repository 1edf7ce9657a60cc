"""What tenants may know: aggregation and redaction, with no I/O.

The controller and the privacy-utility simulator both use this module, so the
simulator measures the very rules the controller enforces. Inputs are the
provider's view (every host's state, every job's placement, advisories from
agents); outputs are :class:`Publication` s, each a tenant-visible message
with its topic, the tenant allowed to receive it (None: any tenant), and the
earliest time it may go out.

Rules, each with a documented default in :class:`RedactionConfig`:

* Pool capacity, in the default ``private`` mode, is released under differential
  privacy (:mod:`controller.privacy`): one noisy estimate per pool every
  ``release_interval`` seconds on a fixed schedule, within a budget of
  ``epsilon_per_day`` per pool over any 24 hours, for pools of any size.
* Pool capacity in ``redacted`` mode (the rule before, kept for comparison) is
  published only when it covers at least ``min_hosts`` hosts, with counts as coarse
  buckets, a trend that is the direction of the last bucket move, and no faster than
  one update per ``min_interval`` seconds plus a random ``jitter``, so the timing of a
  change does not point at one host.
* Pool and GPU-class names are the operator's (:class:`PoolNames`, from the
  controller's ``[pools]``): a host whose agent reports any other name is left out of
  every pool's capacity, so no name an agent made up becomes a tenant's topic.
* Job-scoped messages (checkpoint advice, which members are degraded or
  lost, congestion on the job's paths) go to the owning tenant only, naming
  members in the tenant's own terms and never a host or an address.

``Mode.FULL`` (exact counts, every pool, no delay) and ``Mode.NONE`` (nothing
at all) exist for the simulator's comparison.
"""

# Over 400 lines because every rule of what a tenant may see is here, in one module the
# controller and the simulator share; the privacy mechanism itself is controller/privacy.py.

from __future__ import annotations

import bisect
import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, ClassVar

from controller.privacy import (
    DAY,
    Ledger,
    Plan,
    Sampler,
    margin,
    opendp_sampler,
    release_epsilon,
)
from controller.types import HostState, Placement, Publication
from harmonaize.messages import (
    Advice,
    Bucket,
    Health,
    JobAdvisory,
    JobHealth,
    Level,
    Message,
    NoticeStatus,
    PoolCapacity,
    Trend,
    TuningStatus,
    Urgency,
    ValidationNotice,
)
from harmonaize.schema import Len, Num


class Mode(StrEnum):
    PRIVATE = "private"    # the product: differentially private capacity (controller.privacy)
    REDACTED = "redacted"  # coarse buckets, k hosts at least, delay and jitter; no guarantee
    FULL = "full"          # exact values, no delay: the simulator's upper bound
    NONE = "none"          # no feed: the simulator's lower bound


Edges = Annotated[tuple[Annotated[int, Num(0, 2**40)], ...], Len(64, min_len=1)]


@dataclass(frozen=True)
class RedactionConfig:
    STRICT_KEYS: ClassVar[bool] = True
    mode: Mode = Mode.PRIVATE
    #: An aggregate is published only when it covers at least this many hosts. The
    #: private mode's guarantee holds for a pool of any size, so it publishes every pool
    #: by default; ``redacted`` mode relied on this (it used to be 5).
    min_hosts: Annotated[int, Num(1, 1_000_000)] = 1
    #: Private mode: ε per pool over any 24 hours, for everything one host did in them
    #: (controller/privacy.py). With the interval below, ε 0.125 per release: noise of
    #: scale 64 GPUs. docs/privacy-utility.md chose it from the frontier: the most useful
    #: point whose learned failure attack stayed at chance (upper 95% bound 0.54 over 20
    #: scenarios); at ε 24 the attacker reached 0.57 [0.56, 0.58] over 60.
    epsilon_per_day: Annotated[float, Num(0.01, 10_000.0)] = 12.0
    #: Private mode: seconds between two noisy releases of one pool (data-independent).
    release_interval: Annotated[float, Num(1.0, 86400.0)] = 900.0
    #: Private mode: the most GPUs one host adds to a pool's count (the sensitivity).
    host_gpus: Annotated[int, Num(1, 1024)] = 8
    #: Private mode: the share of each release's ε spent on the free-GPU count; the rest
    #: goes to the host counts (1.0: host counts are not released, they read 0+). One
    #: host moves a host count by 1 and the GPU count by up to 8, so in pools of a few
    #: hosts noisy host counts say little; the default spends everything on GPUs.
    gpu_share: Annotated[float, Num(0.05, 1.0)] = 1.0
    #: Lower edges of the buckets host counts are reported in. They start 0, 2 so that
    #: "no host down" and "one host down" read the same (0-1). With the edges that began
    #: 0, 1, 2, 4, an attacking tenant in the simulator (docs/privacy-utility.md) told
    #: whether a host of a pool failed in a given hour with 0.84-0.96 balanced accuracy
    #: over seeds 1-5 (median 0.91); with these, 0.55-0.75 (median 0.71), and mean JCT
    #: within 0.03 h of the old edges on every seed of 1-10. Doubling the GPU edges as
    #: well hid no more and kept less of the benefit (median 84% against 96%), so they
    #: stay as they are.
    host_buckets: Edges = (0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192)
    #: Lower edges of the buckets GPU counts are reported in.
    gpu_buckets: Edges = (0, 1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 32768)
    #: Seconds between two updates of one pool's capacity.
    min_interval: Annotated[float, Num(0.0, 86400.0)] = 10.0
    #: Up to this many seconds of random delay on each capacity update.
    jitter: Annotated[float, Num(0.0, 86400.0)] = 2.0
    #: Publish how congested each job's paths are (a coarse level).
    job_congestion: bool = True
    #: Lower edges (percent) of the ranges a job's energy saved is told in.
    energy_buckets: Edges = (0, 2, 5, 10, 20, 30, 50)
    #: A job's energy saved is told once its hosts measured this many kJ (used and
    #: saved): a share of the first minutes says nothing.
    energy_min_kj: Annotated[int, Num(0, 2**40)] = 500
    #: The longest validation pause a tenant may be told of for a job whose tenant
    #: declared nothing to the controller (an operator allowed it on the host); with a
    #: declaration, its ``max_validation_pause`` is the bound.
    undeclared_max_pause: Annotated[float, Num(0.0, 86400.0)] = 1800.0

    def __post_init__(self) -> None:
        if self.release_interval > DAY:
            raise ValueError("release_interval must be at most a day")
        for name in ("host_buckets", "gpu_buckets", "energy_buckets"):
            edges = getattr(self, name)
            if edges[0] != 0 or any(b <= a for a, b in itertools.pairwise(edges)):
                raise ValueError(f"{name} must start at 0 and increase strictly")


@dataclass(frozen=True)
class PoolPrivacy:
    """One pool's privacy budget as ``harmonctl -C privacy`` shows it."""

    pool: str
    gpu_class: str
    budget: float            # ε per 24 hours
    spent: float             # ε spent in the last 24 hours
    releases: int            # releases in the last 24 hours
    epsilon_per_release: float
    gpu_noise_scale: float   # GPUs (discrete Laplace scale)
    host_noise_scale: float | None
    next_release_in: float | None


def bucket(value: int, edges: Sequence[int]) -> Bucket:
    """The bucket of ``value`` for lower edges ``edges`` (first edge 0)."""
    i = bisect.bisect_right(edges, value) - 1
    lo = edges[max(i, 0)]
    hi = edges[i + 1] - 1 if i + 1 < len(edges) else None
    return Bucket(lo, hi)


def exact(value: int) -> Bucket:
    return Bucket(value, value)


#: The reason classes a tenant may be told (an advisory naming any other is refused).
ADVISORY_REASONS = frozenset({"gpu-memory", "gpu-failure", "interconnect", "thermal"})
#: A validation notice never announces a start further ahead than this (seconds).
NOTICE_HORIZON = 3600.0


def pool_topic(pool: str, gpu_class: str) -> str:
    return f"pool/{pool}/{gpu_class}"


def job_topic(tenant: str, job: str) -> str:
    return f"job/{tenant}/{job}/"


@dataclass(frozen=True)
class PoolNames:
    """The pool and GPU-class names an operator declared: the only ones a tenant sees,
    and always as these strings (never the agent's own)."""

    pools: Mapping[str, str]
    classes: Mapping[str, str]

    @classmethod
    def of(cls, pools: Iterable[str], classes: Iterable[str]) -> PoolNames:
        return cls({p: p for p in pools}, {c: c for c in classes})

    def own(self, pool: str, gpu_class: str) -> tuple[str, str] | None:
        """The declared names for what an agent reported; None: not declared."""
        ours = self.pools.get(pool), self.classes.get(gpu_class)
        return None if ours[0] is None or ours[1] is None else (ours[0], ours[1])

    def declares(self, topic: str) -> bool:
        """Whether a pool topic (``pool/<pool>/<class>``) is of declared names."""
        parts = topic.split("/")
        return len(parts) == 3 and self.own(parts[1], parts[2]) is not None


@dataclass
class _Topic:
    current: Message | None = None       # what subscribers have been told
    pending: Message | None = None       # the newest content not yet published
    pending_at: float = 0.0              # when it may go out
    last_published: float = float("-inf")
    revision: int = 0


@dataclass
class Redactor:
    cfg: RedactionConfig = field(default_factory=RedactionConfig)
    rng: random.Random = field(default_factory=random.Random)
    placements: dict[str, Placement] = field(default_factory=dict)
    _topics: dict[str, _Topic] = field(default_factory=dict)
    _trend: dict[str, Trend] = field(default_factory=dict)
    _out: list[Publication] = field(default_factory=list)
    #: Each multi-host job's tuning as the controller's agreement sees it.
    _tuning: dict[str, tuple[str, TuningStatus]] = field(default_factory=dict)
    #: Private mode: the noise (None: OpenDP's secure sampler), the accountant, the
    #: latest hosts, the pools seen and when each pool topic's next release is planned.
    sampler: Sampler | None = None
    ledger: Ledger = field(default_factory=Ledger)
    _hosts: list[HostState] = field(default_factory=list)
    _pools: set[tuple[str, str]] = field(default_factory=set)
    _next_release: dict[str, float] = field(default_factory=dict)
    #: The names tenants may see (None: every name, as the simulator's own hosts have).
    names: PoolNames | None = None
    #: Hosts left out of capacity at the last observation, by the (pool, class) their
    #: agents reported.
    held_back: Counter[tuple[str, str]] = field(default_factory=Counter)

    # --- inputs ---------------------------------------------------------------------

    def place(self, placement: Placement) -> None:
        self.placements[placement.job] = placement

    def restore(self, topic: str, body: Message) -> None:
        """A condition tenants were told before a restart: what is new is judged against
        it, and its revision goes on from there (never back to 1)."""
        if isinstance(body, PoolCapacity | JobHealth):
            self._topics[topic] = _Topic(current=body, revision=body.revision)
        if isinstance(body, PoolCapacity):
            self._trend[topic] = body.trend

    def tuning(self, job: str, choice: str, status: TuningStatus) -> bool:
        """The choice in force for a job and whether its ranks agree (from the
        controller's own comparison of every host's records, never an agent's words).
        Returns whether it changed (then observe() again publishes it)."""
        changed = self._tuning.get(job) != (choice, status)
        self._tuning[job] = (choice, status)
        return changed

    def remove_job(self, job: str) -> None:
        self.placements.pop(job, None)
        self._tuning.pop(job, None)
        for topic in [t for t in self._topics if t.startswith("job/") and
                      t.endswith(f"/{job}/")]:
            del self._topics[topic]

    def observe(self, hosts: Iterable[HostState], now: float,
                jobs: Iterable[str] | None = None) -> None:
        """Recompute every aggregate from the hosts' current states.

        ``jobs``: the placed jobs whose health may have changed, in the order to look
        at them (None: every placed job). A caller that knows which hosts changed (the
        simulator) passes the jobs on them; the health of any other job would come out
        as it is, and an unchanged condition publishes nothing anyway.
        """
        if self.cfg.mode is Mode.NONE:
            return
        hosts = list(hosts)
        named = self._named(hosts)
        if self.cfg.mode is Mode.PRIVATE:
            self._private_truth(named, now)
        else:
            self._capacity(named, now)
        by_id = {h.host_id: h for h in hosts}
        placements = self.placements.values() if jobs is None else [
            p for job in jobs if (p := self.placements.get(job)) is not None]
        for placement in placements:
            self._job_health(placement, by_id, now)

    def advisory(self, host_id: str, advisory: JobAdvisory | ValidationNotice, now: float,
                 wall: float, max_pause: float | None = None) -> str | None:
        """Advice or notice from a host for one job, rebuilt for its owner; why not, if not.

        Only a host the job is placed on may speak for it, and nothing in its
        message reaches the tenant as it came: the ranks are the placement's
        own members on that host (of those the agent named, or all of them), the
        reason one of :data:`ADVISORY_REASONS`, a pause at most the job's
        declared ``max_validation_pause`` (``max_pause``; None: no declaration, so
        ``undeclared_max_pause``) and its start within
        :data:`NOTICE_HORIZON` seconds of ``wall`` (the controller's clock).
        """
        if self.cfg.mode is Mode.NONE:
            return None
        if isinstance(advisory, ValidationNotice):
            rebuilt = self.notice(host_id, advisory, now, wall, max_pause)
            return rebuilt if isinstance(rebuilt, str) else None
        found = self._members_here(host_id, advisory.job, advisory.ranks)
        if isinstance(found, str):
            return found
        placement, ranks = found
        if advisory.reason not in ADVISORY_REASONS:
            return "unknown_reason"
        body = JobAdvisory(placement.job, Advice(advisory.advice), advisory.reason,
                           Urgency(advisory.urgency), ranks)
        self._out.append(Publication(job_topic(placement.tenant, placement.job), body,
                                     placement.tenant, now))
        return None

    def notice(self, host_id: str, notice: ValidationNotice, now: float, wall: float,
               max_pause: float | None = None, *, notice_id: str = "",
               defer_seconds: float = 0.0, max_defer: float = 0.0) -> ValidationNotice | str:
        """A host's validation notice rebuilt for the job's owner (and published), or why
        not. ``notice_id`` is the controller's id of it and ``defer_seconds`` what the
        tenant may still defer it by, both the controller's own; a start deferred may lie
        ``max_defer`` (the declaration's) beyond :data:`NOTICE_HORIZON`."""
        if self.cfg.mode is Mode.NONE:
            return "no_feed"
        found = self._members_here(host_id, notice.job, notice.members)
        if isinstance(found, str):
            return found
        placement, ranks = found
        bound = self.cfg.undeclared_max_pause if max_pause is None else max_pause
        if not 0 < notice.pause_seconds <= bound:
            return "pause_not_allowed"
        announced = notice.not_before or notice.starts_at
        starts = round(min(max(float(announced), wall),
                           wall + NOTICE_HORIZON + max_defer), 3)
        body = ValidationNotice(placement.job, ranks, int(notice.pause_seconds), starts,
                                notice_id, starts, NoticeStatus(notice.status),
                                defer_seconds if notice.status is NoticeStatus.SCHEDULED
                                else 0.0)
        self._out.append(Publication(job_topic(placement.tenant, placement.job), body,
                                     placement.tenant, now))
        return body

    def _members_here(self, host_id: str, job: str, named: Iterable[str]
                      ) -> tuple[Placement, tuple[str, ...]] | str:
        """The job's placement and its members on the host (those named, or all of them),
        or why the host may not speak for the job."""
        placement = self.placements.get(job)
        if placement is None:
            return "unplaced"  # a job we do not know of: no tenant to tell
        here = [m.name for m in placement.members if m.host_id == host_id]
        if not here:
            return "not_placed_here"
        wanted = set(named)
        return placement, tuple(sorted(n for n in here if n in wanted) or sorted(here))

    def forget_undeclared(self) -> list[str]:
        """Drop every pool topic whose names are not declared (any more); their topics."""
        if self.names is None:
            return []
        gone = []
        for topic in [t for t in set(self._topics) | set(self._next_release)
                      if t.startswith("pool/")]:
            if not self.names.declares(topic):
                gone.append(topic)
                self._topics.pop(topic, None)
                self._trend.pop(topic, None)
                self._next_release.pop(topic, None)
        self._pools = {key for key in self._pools if self.names.own(*key) is not None}
        return sorted(gone)

    def _named(self, hosts: list[HostState]) -> list[HostState]:
        """The hosts whose pool and class are declared, under the declared strings."""
        if self.names is None:
            return hosts
        named, self.held_back = [], Counter()
        for host in hosts:
            own = self.names.own(host.pool, host.gpu_class)
            if own is None:
                self.held_back[(host.pool, host.gpu_class)] += 1
            else:
                named.append(replace(host, pool=own[0], gpu_class=own[1]))
        return named

    # --- outputs --------------------------------------------------------------------

    def due(self, now: float) -> list[Publication]:
        """Everything that may be published now (immediate messages and due conditions)."""
        out, self._out = self._out, []
        if self.cfg.mode is Mode.PRIVATE:
            self._private_releases(now)
        for topic, state in self._topics.items():
            if state.pending is not None and state.pending_at <= now:
                state.current, state.pending = state.pending, None
                state.last_published = now
                out.append(Publication(topic, state.current, self._tenant_of(topic), now))
        return out

    def next_due(self) -> float | None:
        times = [s.pending_at for s in self._topics.values() if s.pending is not None]
        if self.cfg.mode is Mode.PRIVATE:
            times += self._next_release.values()
        return min(times, default=None)

    def plan(self) -> Plan:
        c = self.cfg
        return Plan(c.epsilon_per_day, c.release_interval, c.host_gpus, c.gpu_share)

    def privacy(self, now: float) -> list[PoolPrivacy]:
        """Each private pool's budget and spending over the last 24 hours."""
        plan = self.plan()
        eps = release_epsilon(plan)
        out = []
        for topic in sorted(set(self._next_release) | set(self.ledger.topics())):
            _, pool, gpu_class = topic.split("/", 2)
            nxt = self._next_release.get(topic)
            out.append(PoolPrivacy(
                pool, gpu_class, plan.epsilon_per_day, self.ledger.spent(topic, now),
                self.ledger.releases(topic, now), eps, plan.gpu_scale, plan.host_scale,
                None if nxt is None else max(0.0, nxt - now)))
        return out

    def current(self, prefix: str = "") -> list[Publication]:
        """The conditions subscribers have been told, for late joiners and republishing."""
        return [
            Publication(topic, state.current, self._tenant_of(topic), state.last_published)
            for topic, state in sorted(self._topics.items())
            if state.current is not None and topic.startswith(prefix)
        ]

    @staticmethod
    def _tenant_of(topic: str) -> str | None:
        parts = topic.split("/")
        return parts[1] if parts[0] == "job" and len(parts) > 2 else None

    # --- rules ----------------------------------------------------------------------

    def _schedule(self, topic: str, body: Message, now: float, immediate: bool) -> None:
        state = self._topics.setdefault(topic, _Topic())
        if (state.pending is not None and state.current is not None
                and _content(state.current) == _content(body)):
            state.pending = None  # it changed back before anyone was told: nothing to say
            return
        latest = state.pending if state.pending is not None else state.current
        if latest is not None and _content(latest) == _content(body):
            return  # nothing visible changed
        state.revision += 1
        body = _with_revision(body, state.revision)
        if immediate or self.cfg.mode is Mode.FULL:
            at = now
        elif state.pending is not None:
            at = state.pending_at  # already waiting: the newer content replaces it
        else:
            at = max(now, state.last_published + self.cfg.min_interval)
            at += self.rng.uniform(0.0, self.cfg.jitter) if self.cfg.jitter else 0.0
        state.pending, state.pending_at = body, at

    def _capacity(self, hosts: list[HostState], now: float) -> None:
        pools: dict[tuple[str, str], list[HostState]] = {}
        for host in hosts:
            pools.setdefault((host.pool, host.gpu_class), []).append(host)
        full = self.cfg.mode is Mode.FULL
        for (pool, gpu_class), members in sorted(pools.items()):
            if not full and len(members) < self.cfg.min_hosts:
                continue  # too few hosts to hide any one of them
            up = sum(1 for h in members if h.available)
            gpus = sum(h.gpus.available for h in members if h.available)
            shape = exact if full else None
            hosts_up = shape(up) if shape else bucket(up, self.cfg.host_buckets)
            hosts_down = shape(len(members) - up) if shape else bucket(
                len(members) - up, self.cfg.host_buckets)
            available = shape(gpus) if shape else bucket(gpus, self.cfg.gpu_buckets)
            self._capacity_message(pool_topic(pool, gpu_class), PoolCapacity(
                pool, gpu_class, hosts_up, hosts_down, available, Trend.STEADY, 0), now,
                immediate=False)

    def _capacity_message(self, topic: str, body: PoolCapacity, now: float,
                          immediate: bool) -> None:
        """Schedule a pool's new capacity with its trend: the direction of the last move
        of (free GPUs, hosts up) as published (lower edges)."""
        state = self._topics.get(topic)
        latest = None if state is None else (state.pending or state.current)
        trend = self._trend.get(topic, Trend.STEADY)
        if isinstance(latest, PoolCapacity):
            before = (latest.gpus_available.lo, latest.hosts_up.lo)
            after = (body.gpus_available.lo, body.hosts_up.lo)
            if after != before:
                trend = Trend.RISING if after > before else Trend.FALLING
        self._trend[topic] = trend
        self._schedule(topic, replace(body, trend=trend), now, immediate=immediate)

    def _private_truth(self, hosts: list[HostState], now: float) -> None:
        """Private mode: keep the hosts for the next planned release (counted only then)."""
        self._hosts = hosts
        for key in {(h.pool, h.gpu_class) for h in hosts} - self._pools:
            self._pools.add(key)
            # A pool first seen by this process waits one whole interval: releases are
            # never closer than that, across restarts too (controller/privacy.py).
            self._next_release.setdefault(pool_topic(*key), now + self.cfg.release_interval)

    def _counts(self) -> dict[str, tuple[str, str, int, int, int]]:
        """Each pool's true counts from the latest hosts, a host's GPUs clamped to
        ``host_gpus`` (the sensitivity the noise is scaled for)."""
        cap = self.cfg.host_gpus
        acc: dict[tuple[str, str], list[int]] = {}
        for h in self._hosts:
            c = acc.setdefault((h.pool, h.gpu_class), [0, 0, 0])
            c[2] += 1
            if h.available:
                c[0] += min(h.gpus.available, cap)
                c[1] += 1
        return {pool_topic(pool, gpu_class): (pool, gpu_class, g, up, n - up)
                for (pool, gpu_class), (g, up, n) in acc.items()
                if n >= self.cfg.min_hosts}

    def _private_releases(self, now: float) -> None:
        if not any(at <= now for at in self._next_release.values()):
            return
        plan = self.plan()
        eps = release_epsilon(plan)
        sample = self.sampler or opendp_sampler
        counts = self._counts()
        for topic, at in sorted(self._next_release.items()):
            if at > now:
                continue
            self._next_release[topic] = now + plan.release_interval
            truth = counts.get(topic)
            if truth is None or not self.ledger.charge(topic, now, eps, plan.epsilon_per_day):
                continue
            pool, gpu_class, gpus, up, down = truth
            noisy_gpus = sample(gpus, plan.gpu_scale)
            if plan.host_scale is None:
                hosts_up = hosts_down = Bucket(0, None)
            else:
                hosts_up = _around(sample(up, plan.host_scale), plan.host_scale)
                hosts_down = _around(sample(down, plan.host_scale), plan.host_scale)
            # The range around the noisy value that holds the true count with 90%
            # probability: a tenant reading the lower edge is as cautious as with buckets.
            available = _around(noisy_gpus, plan.gpu_scale)
            self._capacity_message(topic, PoolCapacity(
                pool, gpu_class, hosts_up, hosts_down, available, Trend.STEADY, 0), now,
                immediate=True)

    def _job_health(self, placement: Placement, hosts: dict[str, HostState],
                    now: float) -> None:
        degraded, lost, congestion = [], [], Level.NONE
        for member in placement.members:
            host = hosts.get(member.host_id)
            if host is None or not host.alive or host.health is Health.UNHEALTHY:
                lost.append(member.name)
                continue
            if (host.health is Health.DEGRADED or not host.schedulable
                    or host.gpus.quarantined or host.gpus.lost):
                degraded.append(member.name)
            if self.cfg.job_congestion:
                for link in host.links:
                    if link.link_class == "data" and link.congestion.rank > congestion.rank:
                        congestion = link.congestion
        choice, status = self._tuning.get(placement.job, ("default", TuningStatus.STEADY))
        body = JobHealth(placement.job, tuple(sorted(degraded)), tuple(sorted(lost)), congestion,
                         tuning_choice=choice, tuning=status,
                         energy=self._energy(placement, hosts))
        # The tenant's own members: no other host hides behind this, so no delay.
        self._schedule(job_topic(placement.tenant, placement.job), body, now, immediate=True)


    def _energy(self, placement: Placement, hosts: dict[str, HostState]) -> Bucket | None:
        """The share of energy the job's GPUs saved, in percent, as a range: summed over
        the hosts it is placed on (what other hosts say of it is not its), told once
        enough is measured; never a host's figure or a raw count."""
        used = saved = 0
        for host_id in placement.hosts:
            host = hosts.get(host_id)
            for entry in host.energy if host is not None else ():
                if entry.job == placement.job:
                    used += entry.used_kj
                    saved += entry.saved_kj
        if used + saved < max(self.cfg.energy_min_kj, 1):
            return None
        return bucket(min(100, 100 * saved // (used + saved)), self.cfg.energy_buckets)


def _around(noisy: int, scale: float) -> Bucket:
    m = margin(scale)
    return Bucket(max(0, noisy - m), max(0, noisy + m))


def _content(body: Message) -> object:
    """What subscribers see of a condition, without its revision."""
    if isinstance(body, PoolCapacity):
        return (body.hosts_up, body.hosts_down, body.gpus_available)
    if isinstance(body, JobHealth):
        return (body.degraded, body.lost, body.congestion, body.tuning_choice, body.tuning,
                body.energy)
    return body


def _with_revision(body: Message, revision: int) -> Message:
    if isinstance(body, PoolCapacity):
        return PoolCapacity(body.pool, body.gpu_class, body.hosts_up, body.hosts_down,
                            body.gpus_available, body.trend, revision)
    if isinstance(body, JobHealth):
        return JobHealth(body.job, body.degraded, body.lost, body.congestion, revision,
                         body.tuning_choice, body.tuning, body.energy)
    return body
