"""What redaction is configured with and the names it publishes under.

The ``[redaction]`` settings (:class:`RedactionConfig`), the shapes counts are told in
(:func:`bucket`), the topics (:func:`pool_topic`, :func:`job_topic`) and the pool and
class names an operator declared (:class:`PoolNames`). The rules that use them are in
controller/redaction.py (scheduling), controller/poolredaction.py (pool capacity) and
controller/jobredaction.py (a job's own messages).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar

from controller.privacy import DAY
from harmonaize.messages import Bucket
from harmonaize.schema import Len, Num


class Unit(StrEnum):
    """Whose day private mode's ε protects (controller/privacy.py)."""

    HOST = "host"  # one host over any 24 hours
    JOB = "job"    # any ``job_hosts`` hosts together (a job spanning them) over 24 hours


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
    #: Private mode: the shortest time between two noisy releases of one pool: the plan
    #: of every pool large enough for it (data-independent).
    release_interval: Annotated[float, Num(1.0, 86400.0)] = 900.0
    #: Private mode: a pool is released less often, down to once every
    #: ``max_release_interval``, until its GPU noise's scale is at most this share of its
    #: GPUs (hosts it has had x ``host_gpus``): releases of a small pool are fewer and
    #: more precise, for the same ε per day. 0: every pool every ``release_interval``
    #: (noise of the same number of GPUs in every pool, 64 at the defaults). The default
    #: is read off the frontier on two traces (docs/privacy-utility.md): tenants that
    #: read a range's lower edge gain more from a precise count hours old than from a
    #: fresh one with wide noise.
    noise_share: Annotated[float, Num(0.0, 10.0)] = 0.05
    #: Private mode: the longest time between two releases of one pool under
    #: ``noise_share`` (never shorter than ``release_interval``).
    max_release_interval: Annotated[float, Num(1.0, 86400.0)] = 21600.0
    #: Private mode: between two releases of a pool, the latest is published again every
    #: ``release_interval`` with its GPU range widened in proportion to its age, by all
    #: the pool's GPUs at this age (seconds): an old count is read with less trust.
    #: Post-processing (no ε). 0: a release stands unchanged until the next.
    stale_after: Annotated[float, Num(0.0, 10 * 86400.0)] = 0.0
    #: Private mode: whose day ε protects: ``host`` (one host over any 24 hours) or
    #: ``job`` (any ``job_hosts`` hosts together, e.g. the hosts of one job: the noise
    #: is scaled for all of them changing at once, so a day of such a job is ε-DP).
    unit: Unit = Unit.HOST
    #: Private mode, ``unit = "job"``: the most hosts of one job whose day is protected
    #: together (a larger job is protected as ``k·ε`` for ``k`` groups of this size).
    job_hosts: Annotated[int, Num(1, 100_000)] = 8
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
    release_interval: float  # seconds between two releases under this pool's plan
    hosts: int               # the pool's inventory the plan is sized for
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


def pool_topic(pool: str, gpu_class: str) -> str:
    return f"pool/{pool}/{gpu_class}"


def job_topic(tenant: str, job: str) -> str:
    return f"job/{tenant}/{job}/"


def tenant_of(topic: str) -> str | None:
    """The tenant a job topic belongs to (None: a pool topic, for any tenant)."""
    parts = topic.split("/")
    return parts[1] if parts[0] == "job" and len(parts) > 2 else None


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
