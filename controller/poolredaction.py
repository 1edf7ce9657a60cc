"""What a pool's capacity may say: coarse buckets (``redacted``), exact (``full``) or a
differentially private estimate (``private``, the product; controller/privacy.py), and
its trend. Pure functions of each pool's counts (controller/pooltally.py);
controller/redaction.py schedules what they build.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from controller.pooltally import Key, Sums
from controller.privacy import Plan, Sampler, margin
from controller.redactionconfig import Mode, RedactionConfig, bucket, exact, pool_topic
from harmonaize.messages import Bucket, PoolCapacity, Trend

#: A pool's true counts for a private release: pool, class, free GPUs, hosts up, down.
Truth = tuple[str, str, int, int, int]


def shaped_capacities(cfg: RedactionConfig,
                      pools: Mapping[Key, Sums]) -> list[tuple[str, PoolCapacity]]:
    """Redacted and full modes: each pool of at least ``min_hosts`` hosts (any pool in
    full mode), its counts in buckets (exact in full mode), by topic."""
    full = cfg.mode is Mode.FULL
    out = []
    for (pool, gpu_class), sums in sorted(pools.items()):
        if not full and sums.hosts < cfg.min_hosts:
            continue  # too few hosts to hide any one of them
        up, gpus = sums.up, sums.gpus
        shape = exact if full else None
        hosts_up = shape(up) if shape else bucket(up, cfg.host_buckets)
        hosts_down = shape(sums.hosts - up) if shape else bucket(
            sums.hosts - up, cfg.host_buckets)
        available = shape(gpus) if shape else bucket(gpus, cfg.gpu_buckets)
        out.append((pool_topic(pool, gpu_class), PoolCapacity(
            pool, gpu_class, hosts_up, hosts_down, available, Trend.STEADY, 0)))
    return out


def trend(latest: object, body: PoolCapacity, before: Trend) -> Trend:
    """The direction of the last move of (free GPUs, hosts up) as published (lower
    edges); unchanged counts keep the trend they had."""
    if isinstance(latest, PoolCapacity):
        was = (latest.gpus_available.lo, latest.hosts_up.lo)
        now = (body.gpus_available.lo, body.hosts_up.lo)
        if now != was:
            return Trend.RISING if now > was else Trend.FALLING
    return before


def true_counts(cfg: RedactionConfig, pools: Mapping[Key, Sums]) -> dict[str, Truth]:
    """Each pool's true counts from the latest hosts, a host's GPUs clamped to
    ``host_gpus`` (the sensitivity the noise is scaled for; the tally clamps them)."""
    return {pool_topic(pool, gpu_class): (pool, gpu_class, s.clamped, s.up, s.hosts - s.up)
            for (pool, gpu_class), s in pools.items() if s.hosts >= cfg.min_hosts}


def private_capacity(truth: Truth, plan: Plan, sample: Sampler) -> PoolCapacity:
    """One noisy release of a pool's counts."""
    pool, gpu_class, gpus, up, down = truth
    noisy_gpus = sample(gpus, plan.gpu_scale)
    if plan.host_scale is None:
        hosts_up = hosts_down = Bucket(0, None)
    else:
        hosts_up = around(sample(up, plan.host_scale), plan.host_scale)
        hosts_down = around(sample(down, plan.host_scale), plan.host_scale)
    # The range around the noisy value that holds the true count with 90%
    # probability: a tenant reading the lower edge is as cautious as with buckets.
    available = around(noisy_gpus, plan.gpu_scale)
    return PoolCapacity(pool, gpu_class, hosts_up, hosts_down, available, Trend.STEADY, 0)


def around(noisy: int, scale: float) -> Bucket:
    m = margin(scale)
    return Bucket(max(0, noisy - m), max(0, noisy + m))


def aged(body: PoolCapacity, gpus: int, age: float, stale_after: float) -> PoolCapacity:
    """A release's GPU range ``age`` seconds on, widened by up to the pool's ``gpus`` as it
    ages (all of them at ``stale_after``): a tenant that reads the lower edge trusts an
    old count less. A function of what was released, the pool's inventory and the clock
    only: post-processing, no ε. It makes no claim about the count now; it widens the
    claim about the count then."""
    extra = math.ceil(gpus * min(1.0, age / stale_after)) if stale_after > 0 else 0
    if extra <= 0:
        return body
    a = body.gpus_available
    wider = Bucket(max(0, a.lo - extra), None if a.hi is None else a.hi + extra)
    return replace(body, gpus_available=wider)
