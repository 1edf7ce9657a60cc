"""What a tenant learns of its job's energy: a coarse share the controller rebuilds from the
job's own hosts' aggregates, never a host's figure (sans-I/O; end to end with the daemons
in tests/agent/energy/test_agent.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.redaction import Redactor
from controller.redactionconfig import Mode, RedactionConfig
from controller.types import HostState, Member, Placement
from harmonaize.messages import Bucket, JobEnergy, JobHealth

pytestmark = pytest.mark.energy

CFG = RedactionConfig(mode=Mode.REDACTED, min_hosts=1, min_interval=0, jitter=0)
PLACED = Placement("job-7", "acme", (Member("0", "h1"), Member("1", "h2")))


def host(host_id: str, *energy: JobEnergy) -> HostState:
    return HostState(host_id, "p", "H200", alive=True, energy=energy)


def health(hosts: list[HostState], cfg: RedactionConfig = CFG) -> JobHealth:
    redactor = Redactor(cfg, random.Random(1))
    redactor.place(PLACED)
    redactor.observe(hosts, 0.0)
    (pub,) = [p for p in redactor.due(0.0) if isinstance(p.body, JobHealth)]
    assert pub.tenant == "acme" and pub.topic == "job/acme/job-7/"
    return pub.body


def test_the_share_is_summed_over_the_jobs_hosts_and_told_as_a_range() -> None:
    body = health([host("h1", JobEnergy("job-7", 900, 60)),
                   host("h2", JobEnergy("job-7", 1000, 40), JobEnergy("other", 5, 5000))])
    assert body.energy == Bucket(5, 9)  # 100 of 2000 kJ: 5%
    assert "900" not in repr(body) and "h1" not in repr(body)


@pytest.mark.parametrize(("saved", "bucket"), [
    (0, Bucket(0, 1)), (30, Bucket(2, 4)), (150, Bucket(10, 19)), (700, Bucket(50, None))])
def test_the_ranges(saved: int, bucket: Bucket) -> None:
    assert health([host("h1", JobEnergy("job-7", 1000 - saved, saved))]).energy == bucket


def test_a_host_the_job_is_not_placed_on_does_not_count() -> None:
    body = health([host("h1", JobEnergy("job-7", 1000, 0)),
                   host("h9", JobEnergy("job-7", 0, 100_000))])
    assert body.energy == Bucket(0, 1)


def test_too_little_measured_or_nothing_declared_tells_nothing() -> None:
    assert health([host("h1", JobEnergy("job-7", 400, 50))]).energy is None
    assert health([host("h1"), host("h2")]).energy is None


def test_a_new_range_is_a_new_revision_and_the_same_range_is_not() -> None:
    redactor = Redactor(CFG, random.Random(1))
    redactor.place(PLACED)
    seen = []
    for saved in (50, 60, 150):  # 5%, 6% (the same range), 15%
        redactor.observe([host("h1", JobEnergy("job-7", 1000 - saved, saved))], 0.0)
        seen += [p.body for p in redactor.due(0.0) if isinstance(p.body, JobHealth)]
    assert [(b.energy, b.revision) for b in seen] == [(Bucket(5, 9), 1), (Bucket(10, 19), 2)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h1", "h2", "h3"]),
                          st.sampled_from(["job-7", "job-8"]),
                          st.integers(0, 10**9), st.integers(0, 10**9)), max_size=8))
def test_the_tenant_gets_one_of_the_ranges_from_its_own_hosts_only(reports) -> None:
    per_host: dict[str, list[JobEnergy]] = {}
    for host_id, job, used, saved in reports:
        per_host.setdefault(host_id, []).append(JobEnergy(job, used, saved))
    body = health([host(h, *e) for h, e in per_host.items()])
    used = sum(e.used_kj for h, es in per_host.items() if h in ("h1", "h2") for e in es
               if e.job == "job-7")
    saved = sum(e.saved_kj for h, es in per_host.items() if h in ("h1", "h2") for e in es
                if e.job == "job-7")
    if used + saved < CFG.energy_min_kj:
        assert body.energy is None
    else:
        assert body.energy is not None and body.energy.lo in CFG.energy_buckets
        assert 100 * saved // (used + saved) in body.energy
