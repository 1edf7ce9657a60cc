"""What tenants may know: aggregation and redaction, with no I/O.

The controller and the privacy-utility simulator both use this module, so the
simulator measures the very rules the controller enforces. Inputs are the
provider's view (every host's state, every job's placement, advisories from
agents); outputs are :class:`Publication` s, each a tenant-visible message
with its topic, the tenant allowed to receive it (None: any tenant), and the
earliest time it may go out.

Rules, each with a documented default in :class:`RedactionConfig`:

* Pool capacity (per pool and GPU class) is published only when it covers at
  least ``min_hosts`` hosts, with counts as coarse buckets, a trend that is
  the direction of the last bucket move, and no faster than one update per
  ``min_interval`` seconds plus a random ``jitter``, so the timing of a
  change does not point at one host.
* Job-scoped messages (checkpoint advice, which members are degraded or
  lost, congestion on the job's paths) go to the owning tenant only, naming
  members in the tenant's own terms and never a host or an address.

``Mode.FULL`` (exact counts, every pool, no delay) and ``Mode.NONE`` (nothing
at all) exist for the simulator's comparison.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, ClassVar

from controller.types import HostState, Placement, Publication
from harmonaize.messages import (
    Advice,
    Bucket,
    Health,
    JobAdvisory,
    JobHealth,
    Level,
    Message,
    PoolCapacity,
    Trend,
    TuningStatus,
    Urgency,
    ValidationNotice,
)
from harmonaize.schema import Len, Num


class Mode(StrEnum):
    FULL = "full"          # exact values, no delay: the simulator's upper bound
    REDACTED = "redacted"  # the product
    NONE = "none"          # no feed: the simulator's lower bound


Edges = Annotated[tuple[Annotated[int, Num(0, 2**40)], ...], Len(64, min_len=1)]


@dataclass(frozen=True)
class RedactionConfig:
    STRICT_KEYS: ClassVar[bool] = True
    mode: Mode = Mode.REDACTED
    #: An aggregate is published only when it covers at least this many hosts.
    min_hosts: Annotated[int, Num(1, 1_000_000)] = 5
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
    #: The longest validation pause a tenant may be told of for a job whose tenant
    #: declared nothing to the controller (an operator allowed it on the host); with a
    #: declaration, its ``max_validation_pause`` is the bound.
    undeclared_max_pause: Annotated[float, Num(0.0, 86400.0)] = 1800.0

    def __post_init__(self) -> None:
        for name in ("host_buckets", "gpu_buckets"):
            edges = getattr(self, name)
            if edges[0] != 0 or any(b <= a for a, b in itertools.pairwise(edges)):
                raise ValueError(f"{name} must start at 0 and increase strictly")


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

    # --- inputs ---------------------------------------------------------------------

    def place(self, placement: Placement) -> None:
        self.placements[placement.job] = placement

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
        self._capacity(hosts, now)
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
        placement = self.placements.get(advisory.job)
        if self.cfg.mode is Mode.NONE:
            return None
        if placement is None:
            return "unplaced"  # a job we do not know of: no tenant to tell
        here = [m.name for m in placement.members if m.host_id == host_id]
        if not here:
            return "not_placed_here"
        named = set(advisory.ranks if isinstance(advisory, JobAdvisory) else advisory.members)
        ranks = tuple(sorted(n for n in here if n in named) or sorted(here))
        body: Message
        if isinstance(advisory, JobAdvisory):
            if advisory.reason not in ADVISORY_REASONS:
                return "unknown_reason"
            body = JobAdvisory(placement.job, Advice(advisory.advice), advisory.reason,
                               Urgency(advisory.urgency), ranks)
        else:
            bound = self.cfg.undeclared_max_pause if max_pause is None else max_pause
            if not 0 < advisory.pause_seconds <= bound:
                return "pause_not_allowed"
            starts = min(max(float(advisory.starts_at), wall), wall + NOTICE_HORIZON)
            body = ValidationNotice(placement.job, ranks, int(advisory.pause_seconds),
                                    round(starts, 3))
        self._out.append(Publication(job_topic(placement.tenant, placement.job), body,
                                     placement.tenant, now))
        return None

    # --- outputs --------------------------------------------------------------------

    def due(self, now: float) -> list[Publication]:
        """Everything that may be published now (immediate messages and due conditions)."""
        out, self._out = self._out, []
        for topic, state in self._topics.items():
            if state.pending is not None and state.pending_at <= now:
                state.current, state.pending = state.pending, None
                state.last_published = now
                out.append(Publication(topic, state.current, self._tenant_of(topic), now))
        return out

    def next_due(self) -> float | None:
        times = [s.pending_at for s in self._topics.values() if s.pending is not None]
        return min(times, default=None)

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
            topic = pool_topic(pool, gpu_class)
            state = self._topics.get(topic)
            latest = None if state is None else (state.pending or state.current)
            trend = self._trend.get(topic, Trend.STEADY)
            if isinstance(latest, PoolCapacity):
                before = (latest.gpus_available.lo, latest.hosts_up.lo)
                after = (available.lo, hosts_up.lo)
                if after != before:
                    trend = Trend.RISING if after > before else Trend.FALLING
            self._trend[topic] = trend
            self._schedule(topic, PoolCapacity(pool, gpu_class, hosts_up, hosts_down, available,
                                               trend, 0), now, immediate=False)

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
                         tuning_choice=choice, tuning=status)
        # The tenant's own members: no other host hides behind this, so no delay.
        self._schedule(job_topic(placement.tenant, placement.job), body, now, immediate=True)


def _content(body: Message) -> object:
    """What subscribers see of a condition, without its revision."""
    if isinstance(body, PoolCapacity):
        return (body.hosts_up, body.hosts_down, body.gpus_available)
    if isinstance(body, JobHealth):
        return (body.degraded, body.lost, body.congestion, body.tuning_choice, body.tuning)
    return body


def _with_revision(body: Message, revision: int) -> Message:
    if isinstance(body, PoolCapacity):
        return PoolCapacity(body.pool, body.gpu_class, body.hosts_up, body.hosts_down,
                            body.gpus_available, body.trend, revision)
    if isinstance(body, JobHealth):
        return JobHealth(body.job, body.degraded, body.lost, body.congestion, revision,
                         body.tuning_choice, body.tuning)
    return body
