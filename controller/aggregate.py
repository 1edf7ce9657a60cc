"""Sans-I/O aggregation of host state into what tenants may see.

Input is the controller's view of each host; output is tenant-visible
conditions that name no host and give counts only as coarse buckets. A
condition is (re)issued with a new revision only when its visible content
changes, so a host flapping inside a bucket is invisible.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controller.config import AggregationSection
from harmonaize.messages import Bucket, Health, PoolCapacity, Trend


def bucket(value: int, edges: Sequence[int]) -> Bucket:
    """The bucket of ``value`` for lower edges ``edges`` (first edge 0)."""
    i = bisect.bisect_right(edges, value) - 1
    lo = edges[max(i, 0)]
    hi = edges[i + 1] - 1 if i + 1 < len(edges) else None
    return Bucket(lo, hi)


@dataclass(frozen=True)
class HostView:
    """What aggregation needs to know of one host."""

    pool: str
    gpu_class: str
    alive: bool
    schedulable: bool
    health: Health
    #: GPUs in service and idle on this host.
    gpus_available: int

    @property
    def available(self) -> bool:
        return self.alive and self.schedulable and self.health is not Health.UNHEALTHY


def topic_of(capacity: PoolCapacity) -> str:
    return f"pool/{capacity.pool}/{capacity.gpu_class}"


class CapacityAggregator:
    def __init__(self, cfg: AggregationSection) -> None:
        self.cfg = cfg
        self._current: dict[tuple[str, str], PoolCapacity] = {}

    def step(self, hosts: Iterable[HostView]) -> list[PoolCapacity]:
        """Recompute every pool; return the conditions whose visible content changed."""
        totals: dict[tuple[str, str], list[int]] = {}
        for host in hosts:
            up, down, gpus = totals.setdefault((host.pool, host.gpu_class), [0, 0, 0])
            if host.available:
                totals[(host.pool, host.gpu_class)] = [up + 1, down, gpus + host.gpus_available]
            else:
                totals[(host.pool, host.gpu_class)] = [up, down + 1, gpus]
        changed: list[PoolCapacity] = []
        for (pool, gpu_class), (up, down, gpus) in sorted(totals.items()):
            previous = self._current.get((pool, gpu_class))
            hosts_up = bucket(up, self.cfg.host_buckets)
            gpus_available = bucket(gpus, self.cfg.gpu_buckets)
            visible = (hosts_up, bucket(down, self.cfg.host_buckets), gpus_available)
            if previous is not None and visible == (
                previous.hosts_up, previous.hosts_down, previous.gpus_available
            ):
                continue
            capacity = PoolCapacity(
                pool=pool,
                gpu_class=gpu_class,
                hosts_up=visible[0],
                hosts_down=visible[1],
                gpus_available=visible[2],
                trend=_trend(previous, hosts_up, gpus_available),
                revision=(previous.revision + 1) if previous else 1,
            )
            self._current[(pool, gpu_class)] = capacity
            changed.append(capacity)
        return changed

    def current(self) -> list[PoolCapacity]:
        return [self._current[key] for key in sorted(self._current)]


def _trend(previous: PoolCapacity | None, hosts_up: Bucket, gpus: Bucket) -> Trend:
    """Direction of the last visible change (bucket movement, never exact counts)."""
    if previous is None:
        return Trend.STEADY
    before = (previous.gpus_available.lo, previous.hosts_up.lo)
    after = (gpus.lo, hosts_up.lo)
    if after > before:
        return Trend.RISING
    if after < before:
        return Trend.FALLING
    return Trend.STEADY
