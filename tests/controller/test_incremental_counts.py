"""What the controller keeps as hosts change (each pool's counts, each host's deadline)
against the same computed from scratch, over random sequences of changes: tenants must
be told byte for byte what a count of every host gives, and hosts counted down exactly
when a look at every host would count them down."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cluster import Cluster, Down
from controller.poolredaction import shaped_capacities, true_counts
from controller.pooltally import PoolTally, counted
from controller.redaction import Redactor
from controller.redactionconfig import (
    Mode,
    PoolNames,
    RedactionConfig,
    bucket,
    exact,
    pool_topic,
)
from controller.types import HostState, Member, Placement
from harmonaize import messages as m
from harmonaize.messages import (
    GpuCounts,
    Health,
    Level,
    LinkHealth,
    PoolCapacity,
    Trend,
    TuningStatus,
)
from harmonaize.schema import to_plain

pytestmark = [pytest.mark.controller, pytest.mark.cluster]

HOSTS = [f"h{i:02d}" for i in range(24)]
#: "odd" and "X" are names no operator declared: hosts reporting them are held back.
POOLS = ["p", "q", "odd"]
CLASSES = ["H200", "X"]
NAMES = PoolNames.of(["p", "q"], ["H200"])


def a_view(rng: random.Random, host_id: str) -> HostState:
    healthy = rng.randint(0, 8)
    return HostState(host_id, rng.choice(POOLS), rng.choice(CLASSES), rng.random() < 0.8,
                     rng.random() < 0.9, rng.choice(list(Health)),
                     GpuCounts(healthy=healthy, suspect=rng.randint(0, 2),
                               quarantined=rng.randint(0, 1), in_use=rng.randint(0, 9)),
                     (LinkHealth("data", 4, 0, rng.choice(list(Level)), Level.NONE),))


# --- the counts as they were computed before they were kept: from every host --------------


def named_as_before(hosts: list[HostState], names: PoolNames | None
                    ) -> tuple[list[HostState], Counter[tuple[str, str]]]:
    if names is None:
        return hosts, Counter()
    named, held = [], Counter[tuple[str, str]]()
    for h in hosts:
        own = names.own(h.pool, h.gpu_class)
        if own is None:
            held[(h.pool, h.gpu_class)] += 1
        else:
            named.append(replace(h, pool=own[0], gpu_class=own[1]))
    return named, held


def shaped_as_before(cfg: RedactionConfig, hosts: list[HostState]
                     ) -> list[tuple[str, PoolCapacity]]:
    pools: dict[tuple[str, str], list[HostState]] = {}
    for h in hosts:
        pools.setdefault((h.pool, h.gpu_class), []).append(h)
    full, out = cfg.mode is Mode.FULL, []
    for (pool, gpu_class), members in sorted(pools.items()):
        if not full and len(members) < cfg.min_hosts:
            continue
        up = sum(1 for h in members if h.available)
        gpus = sum(h.gpus.available for h in members if h.available)
        def shape(n: int, edges: tuple[int, ...]) -> m.Bucket:
            return exact(n) if full else bucket(n, edges)
        out.append((pool_topic(pool, gpu_class), PoolCapacity(
            pool, gpu_class, shape(up, cfg.host_buckets),
            shape(len(members) - up, cfg.host_buckets), shape(gpus, cfg.gpu_buckets),
            Trend.STEADY, 0)))
    return out


def truth_as_before(cfg: RedactionConfig, hosts: list[HostState]
                    ) -> dict[str, tuple[str, str, int, int, int]]:
    acc: dict[tuple[str, str], list[int]] = {}
    for h in hosts:
        c = acc.setdefault((h.pool, h.gpu_class), [0, 0, 0])
        c[2] += 1
        if h.available:
            c[0] += min(h.gpus.available, cfg.host_gpus)
            c[1] += 1
    return {pool_topic(p, g): (p, g, gpus, up, n - up) for (p, g), (gpus, up, n) in acc.items()
            if n >= cfg.min_hosts}


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60)
def test_kept_counts_are_what_a_count_of_every_host_gives(seed: int) -> None:
    rng = random.Random(seed)
    tally, hosts = PoolTally(), {}
    names: PoolNames | None = NAMES
    cap = 8
    for _ in range(120):
        draw = rng.random()
        if draw < 0.05:
            names = rng.choice([NAMES, None, PoolNames.of(["p", "odd"], ["H200", "X"])])
        elif draw < 0.1:
            cap = rng.choice([1, 4, 8])
        changed = [a_view(rng, h) for h in rng.sample(HOSTS, rng.randint(0, 4))]
        hosts.update((v.host_id, v) for v in changed)
        tally.update(changed, names, cap)
        everyone = list(hosts.values())
        assert tally.pools == counted(everyone, cap, names)
        named, held = named_as_before(everyone, names)
        assert tally.held_back == held
        for mode in (Mode.REDACTED, Mode.FULL):
            cfg = RedactionConfig(mode=mode, min_hosts=rng.randint(1, 6), host_gpus=cap)
            assert shaped_capacities(cfg, tally.pools) == shaped_as_before(cfg, named)
        cfg = RedactionConfig(min_hosts=rng.randint(1, 6), host_gpus=cap)
        assert true_counts(cfg, tally.pools) == truth_as_before(cfg, named)


def encoded(pubs: list) -> list[bytes]:
    return [msgpack.packb([p.topic, p.tenant, p.at, to_plain(p.body)]) for p in pubs]


def a_redactor(cfg: RedactionConfig, seed: int) -> Redactor:
    noise = random.Random(seed)
    redactor = Redactor(cfg, random.Random(seed),
                        sampler=lambda value, scale: value + noise.randint(-2, 2))
    redactor.names = NAMES
    return redactor


def jobs_change(rng: random.Random, redactors: tuple[Redactor, ...]) -> None:
    """A job placed (anew, or moved), ended or retuned, alike at every redactor."""
    job, draw = f"job-{rng.randint(0, 5)}", rng.random()
    if draw < 0.15:
        hosts = rng.sample(HOSTS[:6], rng.randint(1, 3))  # jobs share hosts: order shows
        placement = Placement(job, rng.choice(["acme", "zeta"]),
                              tuple(Member(f"r{i}", h) for i, h in enumerate(hosts)))
        for redactor in redactors:
            redactor.place(placement)
    elif draw < 0.2:
        for redactor in redactors:
            if job in redactor.placements:
                redactor.remove_job(job)
    elif draw < 0.3:
        choice, status = rng.choice(["default", "ring"]), rng.choice(list(TuningStatus))
        for redactor in redactors:
            redactor.tuning(job, choice, status)
    elif draw < 0.32:
        for redactor in redactors:  # a reload of the rules
            redactor.cfg = replace(redactor.cfg,
                                   job_congestion=not redactor.cfg.job_congestion)


@pytest.mark.parametrize("mode", [Mode.PRIVATE, Mode.REDACTED, Mode.FULL])
@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=25)
def test_tenants_are_told_the_same_whether_counts_are_kept_or_made_anew(mode: Mode,
                                                                     seed: int) -> None:
    """The core's path (only the changed hosts, and the jobs on them or placed or
    retuned since: :meth:`Redactor.observe_changes`) and every host and job at each step
    (:meth:`Redactor.observe`): the same publications, byte for byte, in the same order,
    with the same noise drawn."""
    cfg = RedactionConfig(mode=mode, min_hosts=2, min_interval=5.0, jitter=1.0,
                          release_interval=30.0, stale_after=90.0 if seed % 2 else 0.0)
    kept, anew = a_redactor(cfg, seed), a_redactor(cfg, seed)
    rng = random.Random(seed)
    hosts: dict[str, HostState] = {}
    now, told, jobs_told = 0.0, 0, 0
    for _ in range(150):
        now += rng.choice([0.0, 0.5, 3.0, 20.0])
        for _ in range(rng.randint(0, 2)):  # two in a step: the order they are judged in
            jobs_change(rng, (kept, anew))
        changed = [a_view(rng, h) for h in rng.sample(HOSTS, rng.randint(0, 5))]
        hosts.update((v.host_id, v) for v in changed)
        kept.observe_changes(changed, now)
        anew.observe(list(hosts.values()), now)
        got, want = encoded(kept.due(now)), encoded(anew.due(now))
        assert got == want
        told += len(got)
        jobs_told += sum(1 for topic in got if b"job/" in topic)
        assert kept.next_due() == anew.next_due()
        assert kept.held_back == anew.held_back
    assert told > 10  # the runs said something to compare
    assert jobs_told > 3  # jobs' health among it


# --- liveness: the heap of deadlines against a look at every host ---------------------------


def silent_by_walk(cluster: Cluster, now: float) -> set[str]:
    return {h.host_id for h in cluster.hosts.values()
            if h.alive and now - h.last_seen > cluster.missed_heartbeats * h.heartbeat}


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60)
def test_hosts_are_counted_down_when_a_look_at_every_host_would(seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(missed_heartbeats=3)
    now = 0.0
    for _ in range(200):
        now += rng.choice([0.0, 0.1, 0.5, 1.0, 2.5])
        host = rng.choice(HOSTS[:10])
        draw = rng.random()
        if draw < 0.15:  # a hello, perhaps with another heartbeat interval
            hello = m.Hello(pool="p", gpu_class="H200", gpus=8, version="1", epoch=1,
                            acked=0, heartbeat=rng.choice([0.5, 1.0, 2.0]))
            cluster.receive(host.encode(), m.Envelope("hello", host, 0, now, hello), now)
        elif draw < 0.5:
            cluster.receive(host.encode(), m.Envelope("heartbeat", host, 0, now,
                                                      m.Heartbeat(1.0, 0)), now)
        elif draw < 0.6:
            cluster.heard([host, "nobody"], now)
        elif draw < 0.65:
            cluster.receive(host.encode(), m.Envelope("goodbye", host, 0, now,
                                                      m.Goodbye("bye")), now)
        elif draw < 0.68:
            cluster.missed_heartbeats = rng.choice([1, 2, 3, 4])
            cluster.reschedule()
        else:
            expected = silent_by_walk(cluster, now)
            assert cluster.silent_from <= min(
                (h.last_seen + cluster.missed_heartbeats * h.heartbeat
                 for h in cluster.hosts.values() if h.alive), default=float("inf"))
            assert set(cluster.tick(now)) == expected
            assert all(cluster.hosts[h].down_reason == Down.SILENT for h in expected)
            assert not silent_by_walk(cluster, now)
