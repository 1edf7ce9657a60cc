"""The discrete-event engine on small hand-made traces, with outcomes computed by hand."""

from __future__ import annotations

import random

import pytest

from sim import regimes
from sim.cluster import CongestionSpec, FaultSpec, congestion_episodes, size_cluster
from sim.engine import Simulation
from sim.feed import FeedBridge
from sim.jobs import DONE
from sim.metrics import summarize
from sim.model import HIGH, LOW, SimConfig, comm_factor
from sim.regimes import Regime
from sim.scenario import Scenario, evaluate, evaluate_all
from sim.traces import JobSpec

pytestmark = pytest.mark.sim

NO_CKPT = 1e12  # a checkpoint interval no job reaches


def config(nodes=1, **kw) -> SimConfig:
    base = {"nodes_per_pool": (("p", nodes),), "congestion_per_rack_day": 0.0,
            "observe_batch_s": 0.0, "elastic_fraction": 0.0, "tenants": ("a", "b")}
    base.update(kw)
    return SimConfig(**base)


def job(i, arrival, duration, gpus, tenant="a", pool="p") -> JobSpec:
    return JobSpec(i, float(arrival), float(duration), gpus, pool, tenant)


def run(cfg, jobs, regime: Regime, faults=(), congestion=(), max_time=None):
    cluster = size_cluster(jobs, cfg)
    return Simulation(cfg, cluster, jobs, regime, faults=faults, congestion=congestion,
                      max_time=max_time).run()


def finish_times(result) -> list[float]:
    return [j.finish for j in result.jobs]


def test_fifo_on_one_node():
    cfg = config()
    result = run(cfg, [job(0, 0, 100, 8), job(1, 10, 50, 8)], regimes.none())
    assert finish_times(result) == [100.0, 150.0]
    summary = summarize(result)
    assert summary.mean_jct_h == pytest.approx((100 + 140) / 2 / 3600)
    assert summary.mean_queue_h == pytest.approx(90 / 2 / 3600)
    assert summary.finished == 2 and summary.unfinished == 0
    assert summary.goodput == pytest.approx(1.0)


def test_backfill_lets_a_small_job_past_a_big_one():
    cfg = config(nodes=2)
    jobs = [job(0, 0, 100, 8), job(1, 1, 100, 16), job(2, 2, 10, 4)]
    result = run(cfg, jobs, regimes.none())
    # The 16-GPU job waits for both nodes; the 4-GPU job fits beside the first at once.
    assert finish_times(result) == [100.0, 200.0, 12.0]


def test_periodic_checkpoints_cost_time():
    cfg = config(ckpt_interval=3600, ckpt_cost=60)
    result = run(cfg, [job(0, 0, 10000, 1)], regimes.none())
    assert finish_times(result) == [pytest.approx(10000 + 2 * 60)]


# A GPU fault at 5000 s with a 600 s warning, the host back at 6000 s. By hand:
# none: checkpoints at compute 3600 (done at 3660); at 5000 progress is 4940, saved 3600;
#   restart at 6000 + 300 s reload, 6400 s of work left = 3600 + 60 + 2800 -> 12760.
# advisory at 4400: progress 4340 saved by 4460; 540 s lost at 5000; restart 6300 with
#   5660 left = 3600 + 60 + 2060 -> 12020.
FAULT = FaultSpec(0, 5000.0, 6000.0, soft=False, lead=600.0, fault_class="GPU",
                  desc="GPU Lost")


@pytest.mark.parametrize(("regime", "finish", "lost"), [
    (regimes.none(), 12760.0, 1340.0),
    (regimes.full(), 12020.0, 540.0),
    (regimes.coarse(), 12020.0, 540.0),  # advisories are the job owner's: no k, no delay
])
def test_fault_loses_work_since_the_last_checkpoint(regime, finish, lost):
    cfg = config(ckpt_interval=3600, ckpt_cost=60, restart_cost=300)
    result = run(cfg, [job(0, 0, 10000, 8)], regime, faults=[FAULT])
    assert finish_times(result) == [pytest.approx(finish)]
    assert result.rollback_gpu_s["fault"] == pytest.approx(lost * 8)
    assert result.pause_gpu_s["fault"] == pytest.approx(300 * 8)
    assert result.jobs[0].kills == 1


# A soft fault (the job's host degraded, drained) from 1000 s to 3000 s:
# none: 1000 s at full speed, 2000 s at 0.6 (1200), then 7800 s -> 10800.
# full: the tenant sees its member degraded and room elsewhere, checkpoints and restarts on
#   the other host: 60 + 300 s pause from 1000, then 9000 s -> 10360.
SOFT = FaultSpec(0, 1000.0, 3000.0, soft=True, lead=None, fault_class="NIC",
                 desc="NIC Link Speed low")


@pytest.mark.parametrize(("regime", "finish"), [
    (regimes.none(), 10800.0),
    (regimes.full(), 10360.0),
    # Two hosts are fewer than k = 5: no capacity is published, so the tenant does not
    # know there is room elsewhere and stays (where the redacted feed falls short).
    (regimes.coarse(), 10800.0),
    (regimes.coarse(min_hosts=1), 10360.0),
])
def test_degraded_member_is_replaced_when_the_feed_shows_room(regime, finish):
    cfg = config(nodes=2, ckpt_interval=NO_CKPT, ckpt_cost=60, restart_cost=300)
    result = run(cfg, [job(0, 0, 10000, 1)], regime, faults=[SOFT])
    assert finish_times(result) == [pytest.approx(finish)]


# High congestion on both hosts of a 16-GPU job from 1000 s to 3000 s:
# none (ring): 2000 s at 1/(0.7 + 0.3 * 3.0) = 0.625 -> 1250, then 7750 s -> 10750.
# full (tree while congested): 2000 s at 1/(0.7 + 0.3 * 1.9) -> 10000 - 2000 * that + 3000.
CONGESTION = CongestionSpec((0, 1), 1000.0, 3000.0, HIGH)


def test_collective_algorithm_follows_the_congestion_level():
    cfg = config(nodes=2, ckpt_interval=NO_CKPT)
    none = run(cfg, [job(0, 0, 10000, 16)], regimes.none(), congestion=[CONGESTION])
    assert finish_times(none) == [pytest.approx(10750.0)]
    full = run(cfg, [job(0, 0, 10000, 16)], regimes.full(), congestion=[CONGESTION])
    tree = 1 / (0.7 + 0.3 * 1.9)
    assert finish_times(full) == [pytest.approx(3000 + 10000 - (1000 + 2000 * tree))]
    assert comm_factor(HIGH, 1, 0.3) == pytest.approx(tree)
    # A single-host job does not use the network for its collectives.
    single = run(cfg, [job(0, 0, 10000, 8)], regimes.none(), congestion=[CONGESTION])
    assert finish_times(single) == [pytest.approx(10000.0)]


def test_overlapping_congestion_takes_the_worst_level():
    cfg = config(nodes=2, ckpt_interval=NO_CKPT)
    episodes = [CongestionSpec((0, 1), 1000.0, 3000.0, LOW),
                CongestionSpec((0,), 2000.0, 2500.0, HIGH)]
    result = run(cfg, [job(0, 0, 10000, 16)], regimes.none(), congestion=episodes)
    low, high = comm_factor(LOW, 0, 0.3), comm_factor(HIGH, 0, 0.3)
    done = 1000 + 1500 * low + 500 * high
    assert finish_times(result) == [pytest.approx(3000 + 10000 - done)]


def test_elastic_job_grows_into_free_capacity_it_is_told_about():
    # 16 GPUs, one 4-GPU elastic job. With the feed it sees 12 free, keeps 8 in reserve and
    # grows to 8 at once (checkpoint 60 s + restart 120 s), then runs at 2 ** 0.8.
    cfg = config(nodes=2, ckpt_interval=NO_CKPT, elastic_fraction=1.0, elastic_min_duration=0)
    jobs = [job(0, 0, 10000, 4)]
    assert finish_times(run(cfg, jobs, regimes.none())) == [10000.0]
    full = run(cfg, jobs, regimes.full())
    assert finish_times(full) == [pytest.approx(180 + 10000 / 2 ** 0.8)]
    assert full.jobs[0].g == 8


def test_opportunistic_gpus_are_reclaimed_when_jobs_wait():
    # The elastic job grows to 8 at t=0; a rigid 16-GPU job arrives at 1000 and the
    # provider takes the extra GPUs back: the elastic job restarts at 4 from its last
    # checkpoint (the one it took to grow), losing 820 s of work at 2 ** 0.8.
    cfg = config(nodes=2, ckpt_interval=NO_CKPT, elastic_fraction=1.0,
                 elastic_min_duration=600, restart_cost=300)  # the short job is rigid
    jobs = [job(0, 0, 10000, 4), job(1, 1000, 500, 12, tenant="b")]
    result = run(cfg, jobs, regimes.full())
    assert result.rollback_gpu_s["preempt"] == pytest.approx(820 * 2 ** 0.8 * 4)
    assert all(j.state == DONE for j in result.jobs)


def test_unfinished_and_impossible_jobs_are_reported():
    cfg = config()
    result = run(cfg, [job(0, 0, 100, 8), job(1, 0, 50, 16)], regimes.none(), max_time=60)
    summary = summarize(result)
    assert (summary.finished, summary.unfinished, summary.rejected) == (0, 1, 1)
    assert summary.useful_gpu_h == pytest.approx(60 * 8 / 3600)


def random_scenario(seed: int, n_jobs: int = 300) -> Scenario:
    rng = random.Random(seed)
    cfg = config(nodes=3, nodes_per_pool=(("p", 6), ("q", 5)), elastic_fraction=0.7,
                 elastic_min_duration=0, ckpt_interval=900, congestion_per_rack_day=20.0,
                 rack_size=2, seed=seed, dwell_s=300)
    jobs = [job(i, rng.uniform(0, 5 * 86400), rng.expovariate(1 / 7200) + 1,
                rng.choice((1, 1, 2, 4, 8, 16)), rng.choice(("a", "b")), rng.choice("pq"))
            for i in range(n_jobs)]
    jobs.sort(key=lambda j: j.arrival)
    jobs = [JobSpec(i, j.arrival, j.duration, j.gpus, j.pool, j.tenant)
            for i, j in enumerate(jobs)]
    cluster = size_cluster(jobs, cfg)
    faults = []
    for _ in range(40):
        start = rng.uniform(0, 6 * 86400)
        soft = rng.random() < 0.3
        faults.append(FaultSpec(rng.randrange(cluster.node_count), start,
                                start + rng.expovariate(1 / 20000), soft,
                                None if soft or rng.random() < 0.5 else rng.uniform(60, 1800),
                                "GPU", "x"))
    return Scenario(cfg, cluster, tuple(jobs), tuple(faults),
                    tuple(congestion_episodes(cluster, cfg, 8 * 86400)))


@pytest.mark.parametrize("regime", [regimes.none(), regimes.coarse(min_hosts=1),
                                    regimes.full()], ids=lambda r: r.name)
def test_conservation_under_faults_congestion_and_elasticity(regime):
    s = random_scenario(7)
    sim = Simulation(s.cfg, s.cluster, s.jobs, regime, faults=s.faults, congestion=s.congestion)
    result = sim.run()  # the engine refuses to over-commit any node
    assert result.alloc_gpu_s_total <= result.cap_gpu_s_total + 1e-6
    assert result.alloc_gpu_s_horizon <= result.cap_gpu_s_horizon + 1e-6
    summary = summarize(result)
    assert summary.finished + summary.unfinished + summary.rejected == len(s.jobs)
    assert summary.finished == len(s.jobs)
    assert summary.allocated_gpu_h == pytest.approx(result.alloc_gpu_s_total / 3600)
    for j in result.jobs:
        assert j.arrival <= j.first_start <= j.finish
        assert j.work == j.P and not j.nodes
    # Everything given back: every node whole again, and in its free set when up.
    for n in range(s.cluster.node_count):
        assert sim.free[n] == 8 and not sim.node_jobs[n]
    assert sim.alloc_now == 0
    assert sum(result.rollback_gpu_s.values()) >= 0
    if regime.name != "none":
        assert result.counters["publications_job"] > 0


def test_runs_are_deterministic_under_a_seed():
    s = random_scenario(3, n_jobs=200)
    red = regimes.coarse(min_hosts=1)  # uses the release jitter RNG
    first, second = evaluate(s, red), evaluate(s, red)
    assert first == second
    in_parallel = evaluate_all(s, [regimes.none(), red], workers=2)
    assert in_parallel[1] == first
    other = random_scenario(4, n_jobs=200)
    assert evaluate(other, red).summary != first.summary


def test_job_feeds_reach_only_the_owner():
    s = random_scenario(5, n_jobs=200)
    sim = Simulation(s.cfg, s.cluster, s.jobs, regimes.full(), faults=s.faults,
                     congestion=s.congestion)
    seen: list[tuple[str, str]] = []
    for policy in sim.policies:
        for name in ("on_job_health", "on_advisory"):
            original = getattr(policy, name)

            def spy(body, now, original=original, tenant=policy.tenant):
                seen.append((tenant, sim.by_name[body.job].tenant))
                return original(body, now)

            setattr(policy, name, spy)
    sim.run()
    assert seen
    assert all(receiver == owner for receiver, owner in seen)


def test_pools_below_k_hosts_publish_nothing():
    cfg = config(nodes=2)
    jobs = [job(0, 0, 100, 8)]
    assert run(cfg, jobs, regimes.coarse()).counters["publications_pool"] == 0
    assert run(cfg, jobs, regimes.full()).counters["publications_pool"] > 0
    assert run(cfg, jobs, regimes.none()).counters["publications_pool"] == 0


@pytest.mark.parametrize("regime", [regimes.coarse(min_hosts=1), regimes.full()],
                         ids=lambda r: r.name)
def test_narrowed_observations_change_no_outcome(monkeypatch, regime):
    # The bridge hands the redactor only the jobs whose health can have changed; handing
    # it every placement on every observation must give the same outcomes.
    s = random_scenario(9, n_jobs=150)
    fast = evaluate(s, regime)
    original = FeedBridge.flush

    def flush_everything(self, pool, now, *args):
        self._health_jobs[pool].update(self.redactors[pool].placements)
        return original(self, pool, now, *args)

    monkeypatch.setattr(FeedBridge, "flush", flush_everything)
    slow = evaluate(s, regime)
    assert slow.counters["publications_job"] > fast.counters["publications_job"]
    assert slow.summary == fast.summary
    assert slow.load_attack == fast.load_attack
