"""What tenants may know: the redaction rules, and leakage properties over random clusters."""

from __future__ import annotations

import random
import re

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.redaction import Redactor
from controller.redactionconfig import Mode, RedactionConfig, bucket
from controller.types import HostState, Member, Placement, Publication
from harmonaize.messages import (
    Advice,
    Bucket,
    GpuCounts,
    Health,
    JobAdvisory,
    JobHealth,
    Level,
    LinkHealth,
    PoolCapacity,
    Urgency,
    ValidationNotice,
)
from harmonaize.schema import to_plain

pytestmark = pytest.mark.controller

#: The coarse feed's rules (its defaults: 10 s apart, 2 s jitter) with its k of 5; the
#: private mode's are in tests/sim/test_privacy.py.
CFG = RedactionConfig(mode=Mode.REDACTED, min_hosts=5)


def host(i: int, pool: str = "p", *, alive: bool = True, healthy: int = 8,
         in_use: int = 0, health: Health = Health.HEALTHY,
         congestion: Level = Level.NONE) -> HostState:
    return HostState(f"node-{i:04d}", pool, "H200", alive, True, health,
                     GpuCounts(healthy=healthy, in_use=in_use),
                     (LinkHealth("data", 4, 0, congestion, Level.NONE),))


def run(redactor: Redactor, hosts: list[HostState], now: float) -> list[Publication]:
    redactor.observe(hosts, now)
    return redactor.due(now)


def test_buckets_hide_exact_counts() -> None:
    assert bucket(0, CFG.gpu_buckets) == Bucket(0, 0)
    assert bucket(9, CFG.gpu_buckets) == Bucket(8, 15)
    assert bucket(40_000, CFG.gpu_buckets) == Bucket(32768, None)
    # One host down reads as none down: a single failure is not an event tenants see.
    assert bucket(0, CFG.host_buckets) == bucket(1, CFG.host_buckets) == Bucket(0, 1)
    assert bucket(5, CFG.host_buckets) == Bucket(4, 7)
    assert bucket(9000, CFG.host_buckets) == Bucket(8192, None)


def test_a_pool_below_k_hosts_is_never_published() -> None:
    redactor = Redactor(CFG, random.Random(1))
    assert run(redactor, [host(i) for i in range(4)], 0.0) == []
    assert redactor.next_due() is None
    redactor.observe([host(i) for i in range(5)], 1.0)
    due = redactor.next_due()
    assert due is not None and 1.0 <= due <= 1.0 + CFG.jitter
    (pub,) = redactor.due(due)
    assert isinstance(pub.body, PoolCapacity) and pub.tenant is None
    assert pub.body.hosts_up == Bucket(4, 7) and pub.body.gpus_available == Bucket(32, 63)


def test_one_hosts_change_inside_a_bucket_is_invisible_and_updates_are_spaced() -> None:
    redactor = Redactor(CFG, random.Random(2))
    hosts = [host(i) for i in range(6)]
    redactor.observe(hosts, 0.0)
    first = redactor.due(10.0)
    assert len(first) == 1
    # One host loses a GPU: 48 -> 47 available, still in 32-63: nothing to say.
    hosts[3] = host(3, healthy=7)
    assert run(redactor, hosts, 11.0) == []
    # Two hosts go down: 6 -> 4 up (bucket 4-7 still), GPUs 47 -> 31 (bucket moves).
    hosts[4], hosts[5] = host(4, alive=False), host(5, alive=False)
    assert run(redactor, hosts, 12.0) == []  # held back: the last update was at 10 s
    due = redactor.next_due()
    assert due is not None and 10.0 + CFG.min_interval <= due <= 10.0 + CFG.min_interval + 2
    (update,) = redactor.due(due)
    assert update.body.gpus_available == Bucket(16, 31) and update.body.trend.value == "falling"


def test_a_change_undone_before_it_was_told_is_never_told() -> None:
    redactor = Redactor(CFG, random.Random(3))
    hosts = [host(i) for i in range(8)]
    redactor.observe(hosts, 0.0)
    redactor.due(5.0)
    down = [*hosts[:4], *(host(i, alive=False) for i in range(4, 8))]
    redactor.observe(down, 6.0)
    redactor.observe(hosts, 7.0)  # back before the interval ran out
    assert redactor.due(100.0) == []


def test_job_messages_go_to_their_owner_only_in_its_own_terms() -> None:
    redactor = Redactor(CFG, random.Random(4))
    redactor.place(Placement("job-1", "acme", (Member("0", "node-0001"), Member("1", "node-0002"))))
    redactor.place(Placement("job-2", "globex", (Member("0", "node-0003"),)))
    hosts = [host(1, health=Health.DEGRADED), host(2, alive=False),
             host(3, congestion=Level.HIGH)]
    pubs = {p.topic: p for p in run(redactor, hosts, 0.0)}
    assert set(pubs) == {"job/acme/job-1/", "job/globex/job-2/"}
    acme = pubs["job/acme/job-1/"]
    assert acme.tenant == "acme"
    assert acme.body == JobHealth("job-1", ("0",), ("1",), Level.NONE, 1)
    assert pubs["job/globex/job-2/"].body.congestion is Level.HIGH
    assert redactor.advisory("node-0001", JobAdvisory(
        "job-1", Advice.CHECKPOINT_NOW, "gpu-memory", Urgency.HIGH, ("0",)), 1.0, 1e9) is None
    assert redactor.advisory("node-0001", ValidationNotice(  # nobody's job
        "job-9", ("0",), 60, 2.0), 1.0, 1e9, max_pause=600) == "unplaced"
    (advice,) = redactor.due(1.0)
    assert (advice.topic, advice.tenant) == ("job/acme/job-1/", "acme")


def test_full_and_no_feed_modes_for_the_simulator() -> None:
    hosts = [host(i, in_use=i) for i in range(3)]
    full = Redactor(RedactionConfig(mode=Mode.FULL), random.Random(5))
    (pub,) = run(full, hosts, 0.0)
    assert pub.body.gpus_available == Bucket(21, 21) and pub.body.hosts_up == Bucket(3, 3)
    none = Redactor(RedactionConfig(mode=Mode.NONE), random.Random(5))
    none.place(Placement("j", "t", (Member("0", "node-0000"),)))
    assert run(none, hosts, 0.0) == []


# --- leakage, over random clusters and event streams ------------------------------------

TENANTS = ("tenant-alpha", "tenant-beta", "tenant-gamma")
HOST_ID = re.compile(rb"node-\d{4}")
ADDRESS = re.compile(rb"\d+\.\d+\.\d+\.\d+|[0-9a-f]{1,4}:[0-9a-f]{1,4}:")

hosts_st = st.lists(
    st.builds(
        lambda i, pool, alive, healthy, quarantined, in_use, health, congestion: HostState(
            f"node-{i:04d}", pool, "H200", alive, True, health,
            GpuCounts(healthy=healthy, quarantined=quarantined, in_use=min(in_use, healthy)),
            (LinkHealth("data", 2, 0, congestion, Level.NONE),)),
        st.integers(0, 9999), st.sampled_from(["east", "west"]), st.booleans(),
        st.integers(0, 8), st.integers(0, 2), st.integers(0, 8),
        st.sampled_from(list(Health)), st.sampled_from(list(Level))),
    min_size=1, max_size=30, unique_by=lambda h: h.host_id)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[HostState], list[Placement], list[tuple]]:
    hosts = draw(hosts_st)
    placements = []
    for j in range(draw(st.integers(0, 4))):
        members = draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=4))
        placements.append(Placement(f"job-{j}", draw(st.sampled_from(TENANTS)), tuple(
            Member(f"rank{r}", h.host_id) for r, h in enumerate(members))))
    # Steps: (time advance, indexes of hosts that flip alive, advisory for a job index).
    steps = draw(st.lists(st.tuples(
        st.floats(0.0, 30.0), st.lists(st.integers(0, len(hosts) - 1), max_size=3),
        st.one_of(st.none(), st.integers(0, 6))), max_size=12))
    return hosts, placements, steps


def encoded(pub: Publication) -> bytes:
    return pub.topic.encode() + msgpack.packb(to_plain(pub.body))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(1, 8), st.integers(0, 2**32))
def test_no_publication_leaks_and_every_aggregate_covers_k_hosts(
    scenario: tuple, k: int, seed: int
) -> None:
    hosts, placements, steps = scenario
    cfg = RedactionConfig(mode=Mode.REDACTED, min_hosts=k)
    redactor = Redactor(cfg, random.Random(seed))
    owner = {p.job: p.tenant for p in placements}
    for placement in placements:
        redactor.place(placement)
    now, published = 0.0, []
    pool_sizes: dict[str, int] = {}
    for pool in {h.pool for h in hosts}:
        pool_sizes[f"pool/{pool}/H200"] = sum(1 for h in hosts if h.pool == pool)
    last_at: dict[str, float] = {}
    for advance, flips, job in [(0.0, [], None), *steps]:
        now += advance
        for i in flips:
            h = hosts[i]
            hosts[i] = HostState(h.host_id, h.pool, h.gpu_class, not h.alive, h.schedulable,
                                 h.health, h.gpus, h.links)
        if job is not None:
            placement = redactor.placements.get(f"job-{job}")
            sender = placement.members[0].host_id if placement else hosts[0].host_id
            redactor.advisory(sender, JobAdvisory(f"job-{job}", Advice.CHECKPOINT_NOW,
                                                  "thermal", Urgency.ELEVATED, ("rank0",)),
                              now, now)
        redactor.observe(hosts, now)
        for pub in redactor.due(now):
            published.append(pub)
            if pub.topic.startswith("pool/"):
                assert now - last_at.get(pub.topic, -1e9) >= cfg.min_interval
                last_at[pub.topic] = now
    published += redactor.due(now + 1e6)
    for pub in published:
        data = encoded(pub)
        assert not HOST_ID.search(data), f"host id in {pub}"
        assert not ADDRESS.search(data), f"address in {pub}"
        if pub.topic.startswith("pool/"):
            assert pub.tenant is None
            assert not any(t.encode() in data for t in TENANTS), f"a tenant in {pub}"
            assert pool_sizes[pub.topic] >= k, f"aggregate of fewer than {k} hosts: {pub}"
            body = pub.body
            assert isinstance(body, PoolCapacity)
            for count, edges in ((body.hosts_up, cfg.host_buckets),
                                 (body.hosts_down, cfg.host_buckets),
                                 (body.gpus_available, cfg.gpu_buckets)):
                assert count.lo in edges, f"a raw count, not a bucket: {count}"
        else:
            assert isinstance(pub.body, JobHealth | JobAdvisory | ValidationNotice)
            job = pub.body.job
            assert pub.tenant == owner[job] and pub.topic == f"job/{owner[job]}/{job}/"
            others = [t for t in TENANTS if t != owner[job]]
            assert not any(t.encode() in data for t in others), f"another tenant in {pub}"
