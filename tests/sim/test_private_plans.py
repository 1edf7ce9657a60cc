"""Pools' release plans: small pools get fewer, more precise releases for the same ε.

What docs/privacy-utility.md proves, checked: a plan spends its day's ε exactly (by
OpenDP's own privacy map) with noise within its share of the pool; the schedule alone,
with no accountant to catch it, never puts more than ε into any 24 hours, across
restarts, hosts added and plans reloaded; the job unit scales every sensitivity; and a
small pool's published count is several times nearer the truth than under the uniform
plan at the same ε (which this test would fail with).
"""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controller.privacy import (
    DAY,
    Ledger,
    _laplace,
    margin,
    release_epsilon,
    seeded_sampler,
    sized_plan,
)
from controller.redaction import Redactor
from controller.redactionconfig import Mode, RedactionConfig, Unit
from controller.types import HostState
from harmonaize.messages import Bucket, GpuCounts, PoolCapacity
from sim.poolshares import ScenarioPools, overall, pool_shares

pytestmark = pytest.mark.sim


def pool(n: int, in_use: int = 0, name: str = "p", down: int = 0) -> list[HostState]:
    return [HostState(f"{name}-h{i}", name, "H200", alive=i >= down,
                      gpus=GpuCounts(healthy=8, in_use=in_use)) for i in range(n)]


def private(**kw: object) -> RedactionConfig:
    return RedactionConfig(mode=Mode.PRIVATE, **kw)  # type: ignore[arg-type]


# --- a plan ----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(eps=st.floats(0.1, 100.0), hosts=st.integers(1, 400),
       share=st.sampled_from([0.0, 0.05, 0.25, 1.0]),
       fastest=st.sampled_from([60.0, 900.0, 3600.0]),
       slowest=st.sampled_from([900.0, 21600.0, 86400.0]),
       group=st.sampled_from([1, 8, 64]), gpu_share=st.sampled_from([1.0, 0.8]))
def test_a_plan_spends_its_day_exactly_with_noise_within_its_share(eps, hosts, share,
                                                                   fastest, slowest, group,
                                                                   gpu_share):
    plan = sized_plan(epsilon_per_day=eps, fastest=fastest, slowest=slowest, host_gpus=8,
                      gpu_share=gpu_share, noise_share=share, group=group, hosts=hosts)
    per_day = plan.releases_per_day
    assert plan.release_interval * per_day == pytest.approx(DAY)
    assert fastest * (1 - 1e-9) <= plan.release_interval <= max(slowest, fastest) * (1 + 1e-9)
    # OpenDP's privacy map, composed over a day's releases, is the day's budget.
    assert per_day * release_epsilon(plan) == pytest.approx(eps, rel=1e-6)
    # The unit's sensitivity: a group of hosts moves the GPU count by 8 each.
    assert plan.gpu_scale == pytest.approx(8 * group * per_day / (gpu_share * eps))
    most, fewest = math.floor(DAY / fastest + 1e-9), math.ceil(DAY / max(slowest, fastest)
                                                                - 1e-9)
    if share > 0 and fewest < per_day < most:
        # As many releases as keep the noise within the share, and not one more.
        assert plan.gpu_scale <= share * 8 * hosts * (1 + 1e-9)
        assert 8 * group * (per_day + 1) / (gpu_share * eps) > share * 8 * hosts * (1 - 1e-9)
    if share == 0:
        assert per_day == min(most, max(1, most))


def test_a_k_host_change_costs_k_times_a_host_s_and_the_job_unit_pays_for_it():
    host = sized_plan(epsilon_per_day=12.0, fastest=900.0, slowest=21600.0, host_gpus=8,
                      gpu_share=1.0, noise_share=0.0, group=1, hosts=100)
    laplace = _laplace(host.gpu_scale)
    # Group privacy, exactly (the discrete Laplace's loss is linear in the distance): a job
    # on 8 hosts is protected at 8 x ε per day under the host unit, on 64 at 64 x ε.
    for k in (1, 8, 64):
        assert laplace.map(8 * k) == pytest.approx(k * release_epsilon(host))
    job = sized_plan(epsilon_per_day=12.0, fastest=900.0, slowest=21600.0, host_gpus=8,
                     gpu_share=1.0, noise_share=0.0, group=8, hosts=100)
    assert job.gpu_scale == pytest.approx(8 * host.gpu_scale)
    assert _laplace(job.gpu_scale).map(8 * 8) * job.releases_per_day == pytest.approx(12.0)


def test_the_default_plans_by_pool_size():
    red = Redactor(private(), sampler=seeded_sampler("sizes"))
    red.observe(pool(4, name="small") + pool(10, name="mid") + pool(40, name="big"), 0.0)
    plans = {t: red.plan(t) for t in ("pool/small/H200", "pool/mid/H200", "pool/big/H200")}
    # 12 x 0.05 x hosts releases a day: 2 (then the 6 h cap's 4), 6 and 24.
    assert [p.release_interval for p in plans.values()] == pytest.approx([21600.0, 14400.0,
                                                                          3600.0])
    assert [p.gpu_scale for p in plans.values()] == pytest.approx([8 / 3, 4.0, 16.0])
    # A pool of 160 hosts or more is released every 900 s, with noise of scale 64.
    red.observe(pool(160, name="huge"), 0.0)
    assert red.plan("pool/huge/H200").release_interval == 900.0
    # The plan before pools were sized: 64 GPUs of noise in every pool.
    flat = Redactor(private(noise_share=0.0))
    flat.observe(pool(4, name="small"), 0.0)
    assert flat.plan("pool/small/H200").gpu_scale == pytest.approx(64.0)


# --- the schedule, with nothing to catch it ---------------------------------------------------

class Blind(Ledger):
    """An accountant that refuses nothing and notes every charge in a log kept across
    processes: what the schedule alone would spend."""

    def __init__(self, log: list[tuple[float, float]]) -> None:
        super().__init__()
        self.log = log

    def charge(self, topic: str, now: float, eps: float, budget: float) -> bool:
        self.log.append((now, eps))
        return True


def _most_in_a_day(log: list[tuple[float, float]]) -> float:
    # The busiest window (t - 24 h, t] ends at a release.
    return max((sum(e for u, e in log if t - DAY < u <= t) for t, _ in log), default=0.0)


@settings(max_examples=80, deadline=None)
@given(
    eps=st.floats(1.0, 50.0),
    share=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    slowest=st.sampled_from([3600.0, 21600.0, 86400.0]),
    steps=st.lists(st.tuples(st.floats(60.0, 20000.0), st.integers(0, 3), st.booleans(),
                             st.booleans()), min_size=5, max_size=80),
    unit=st.sampled_from([Unit.HOST, Unit.JOB]),
    seed=st.integers(0, 10**6),
)
@example(eps=12.0, share=0.25, slowest=21600.0, unit=Unit.HOST, seed=0,
         # A pool of one host (a 6 h plan, ε 3 a release) released just before a restart,
         # grown to 33 hosts (900 s, ε 0.125) before the new process first looks.
         steps=[(600.0, 0, False, False), (21600.0, 0, False, False),
                (100.0, 3, True, False)] + [(900.0, 0, False, False)] * 100)
@example(eps=12.0, share=0.25, slowest=17280.0, unit=Unit.HOST, seed=0,
         # Five releases a day (ε 2.4 each) for one host, then 33 hosts (96 a day) right
         # after the fourth: the first at 900 s would come one interval of the old plan
         # after it, putting 12.1 into a day; the plan change waits both intervals.
         steps=[(100.0, 0, False, False)] + [(17280.0, 0, False, False)] * 4
         + [(1.0, 3, False, False), (17279.0, 0, False, False)]
         + [(900.0, 0, False, False)] * 40)
def test_the_schedule_alone_never_puts_more_than_the_budget_into_a_day(eps, share, slowest,
                                                                      steps, unit, seed):
    cfg = private(epsilon_per_day=eps, noise_share=share, max_release_interval=slowest,
                  unit=unit, job_hosts=2)
    log: list[tuple[float, float]] = []
    hosts = 1
    red = Redactor(cfg, sampler=seeded_sampler(str(seed)), ledger=Blind(log))
    now = 0.0
    for i, (dt, grow, restart, reload) in enumerate(steps):
        now += dt
        # Hosts join the pool (inventory only grows: hosts are never forgotten).
        hosts += (0, 1, 5, 32)[grow]
        if restart:  # a new process: the store gives back every host, nothing else; a
            # host may join before the process first looks
            red = Redactor(cfg, sampler=seeded_sampler(f"{seed}:{i}"), ledger=Blind(log))
            red.restore_inventory(pool(hosts - (0, 1, 5, 32)[grow]))
        if reload:  # the operator changes the plan's shape in place (not ε), and the file
            cfg = private(epsilon_per_day=eps, noise_share=cfg.noise_share / 2,
                          max_release_interval=slowest, unit=unit, job_hosts=2)
            red.cfg = cfg
        red.observe(pool(hosts, in_use=i % 9, down=i % 2), now)
        red.due(now)
    assert _most_in_a_day(log) <= eps * (1 + 1e-9)


# --- small pools, against the plan before --------------------------------------------------

def _readings(cfg: RedactionConfig, seed: str, truth_in_use: int,
              days: float = 4.0) -> tuple[list[int], list[tuple[int, int]]]:
    """What a tenant holds every 900 s: the latest range's midpoint (the noisy count, when
    not cut at 0), and the ranges released."""
    red = Redactor(cfg, sampler=seeded_sampler(seed))
    hs = pool(4, in_use=truth_in_use)
    latest: PoolCapacity | None = None
    held, ranges = [], []
    for k in range(1, int(days * 96) + 1):
        now = 900.0 * k
        red.observe(hs, now)
        for pub in red.due(now):
            if isinstance(pub.body, PoolCapacity):
                latest = pub.body
                ranges.append((pub.body.gpus_available.lo, pub.body.gpus_available.hi or 0))
        if latest is not None:
            a = latest.gpus_available
            held.append((a.lo + (a.hi or 0)) // 2)
    return held, ranges


def test_a_small_pool_s_count_is_several_times_nearer_the_truth_than_under_the_uniform_plan():
    truth = 4 * (8 - 3)  # 20 of the pool's 32 GPUs free, all along
    errors = {}
    for name, cfg in (("uniform", private(noise_share=0.0)), ("sized", private())):
        held, ranges = _readings(cfg, f"small:{name}", 3)
        errors[name] = statistics.fmean(abs(h - truth) for h in held)
        if name == "sized":
            plan_scale = 8.0  # 12 releases a day for 4 hosts at ε 12: within 0.25 x 32
            assert all(hi - lo <= 2 * margin(plan_scale) for lo, hi in ranges)
            inside = sum(lo <= truth <= hi for lo, hi in ranges) / len(ranges)
            assert 0.75 <= inside <= 1.0  # 48 releases, each holding it nine times in ten
    # The uniform plan's noise has a scale of 64 GPUs on a 32-GPU pool: its midpoint is
    # off by tens of GPUs; the sized plan's by a few.
    assert errors["uniform"] > 30
    assert errors["sized"] < 8
    assert errors["uniform"] > 4 * errors["sized"]


def test_a_sized_plan_s_noise_has_the_scale_the_proof_gives():
    cfg = private(release_interval=60.0, max_release_interval=60.0, epsilon_per_day=1440.0,
                  noise_share=0.0)  # ε 1 per release: scale 8
    red = Redactor(cfg, sampler=seeded_sampler("scale"))
    hs = pool(40, in_use=0)  # 320 free: far from 0, so no range is cut
    noisy = []
    for k in range(1, 1441):
        red.observe(hs, 60.0 * k)
        noisy += [p.body.gpus_available.hi - margin(8.0) for p in red.due(60.0 * k)
                  if isinstance(p.body, PoolCapacity)]
    a = math.exp(-1 / 8.0)
    assert statistics.pvariance(noisy) == pytest.approx(2 * a / (1 - a) ** 2, rel=0.15)
    assert abs(statistics.fmean(noisy) - 320) < 1.0


# --- reproducible ----------------------------------------------------------------------------

def _run(seed: str, unit: Unit) -> list:
    red = Redactor(private(unit=unit), sampler=seeded_sampler(seed))
    out = []
    for k in range(1, 3 * 96):
        red.observe(pool(4, in_use=k % 9) + pool(12, in_use=k % 5, name="q"), 900.0 * k)
        out += [(p.at, p.topic, p.body.gpus_available) for p in red.due(900.0 * k)]
    return out


def test_sized_and_job_unit_releases_come_out_the_same_from_the_same_seed():
    for unit in Unit:
        assert _run("a", unit) == _run("a", unit)
        assert _run("a", unit) != _run("b", unit)
    assert len(_run("a", Unit.JOB)) < len(_run("a", Unit.HOST))  # fewer, for 8 hosts at once


# --- the per-pool measure the private-pools bench prints ------------------------------------

def test_pool_shares_leave_out_pools_where_full_visibility_gains_too_little():
    def run(label: str, none: float, full: float, mine: float) -> ScenarioPools:
        pools = {"none": {"a": (200, none), "b": (200, 5.0), "c": (50, 9.0)},
                 "full": {"a": (200, full), "b": (200, 5.1), "c": (50, 1.0)},
                 "x": {"a": (200, mine), "b": (200, 4.0), "c": (50, 1.0)}}
        return ScenarioPools(label, {"a": 32, "b": 800, "c": 8},
                             {"none": none, "full": full, "x": mine}, pools)

    runs = [run("1", 10.0, 6.0, 8.0), run("2", 10.0, 6.0, 7.0), run("3", 10.0, 9.9, 12.0)]
    a, b = pool_shares(runs, "x", margin_h=0.25)  # c: too few jobs
    assert (a.pool, a.gpus, a.defined, a.scenarios) == ("a", 32, 2, 3)
    assert a.median == pytest.approx(0.625)  # 50% and 75%; 3's gap of 0.1 h is left out
    assert b.median is None and b.defined == 0  # full visibility worse than none there
    assert overall(runs, "x", 0.25) == (pytest.approx(0.625), pytest.approx(0.5), 2)


def test_an_aging_release_is_published_again_wider_and_costs_nothing():
    # A 4-host pool under a quarter's noise: released every 2 h, scale 8.
    cfg = private(stale_after=7200.0, noise_share=0.25)
    red = Redactor(cfg, sampler=lambda value, scale: value)  # no noise: see the widening
    hs = pool(4, in_use=3)  # 20 free of 32
    seen = {}
    for k in range(1, 18):
        now = 900.0 * k
        red.observe(hs, now)
        seen.update((p.at, p.body.gpus_available) for p in red.due(now)
                    if isinstance(p.body, PoolCapacity))
    m = margin(8.0)
    assert seen[8100.0] == Bucket(max(0, 20 - m), 20 + m)  # first seen at 900, + 2 h
    # 15 minutes on, wider by 32 GPUs x 900/7200; the next release narrows it again.
    assert seen[9000.0] == Bucket(max(0, 20 - m - 4), 20 + m + 4)
    assert seen[9900.0] == Bucket(max(0, 20 - m - 8), 20 + m + 8)
    assert seen[15300.0] == Bucket(max(0, 20 - m), 20 + m)
    assert len(red.ledger.history("pool/p/H200")) == 2  # two releases charged, no more
    assert red.next_due() == 16200.0
