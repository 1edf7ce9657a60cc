"""The leakage attacks on planted signals: high under full visibility, chance with no feed."""

from __future__ import annotations

import random

import pytest

from sim import regimes
from sim.attack import balanced, failure_attack, fit_table, fit_threshold, load_attack
from sim.cluster import FaultSpec, size_cluster
from sim.engine import Simulation
from sim.model import SimConfig
from sim.traces import JobSpec

pytestmark = pytest.mark.sim

HOUR = 3600.0
HOURS = 24 * 30


def planted(seed: int = 11):
    """Eight hosts. The victim (tenant b) holds 0 to 4 whole hosts, chosen at random every
    hour; hosts fail at random hours. The attacker (tenant a) runs nothing."""
    rng = random.Random(seed)
    jobs: list[JobSpec] = []
    for h in range(HOURS):
        for _ in range(rng.randint(0, 4)):
            # Off the sampling grid by a second, so a sample never races an arrival.
            jobs.append(JobSpec(len(jobs), h * HOUR + 1, HOUR - 2, 8, "p", "b"))
    faults = [FaultSpec(rng.randrange(8), h * HOUR + 100, h * HOUR + 1900, False, None,
                        "GPU", "GPU Lost")
              for h in range(HOURS) if rng.random() < 0.2]
    cfg = SimConfig(nodes_per_pool=(("p", 8),), tenants=("a", "b"), attacker=0,
                    congestion_per_rack_day=0.0, elastic_fraction=0.0, observe_batch_s=0.0)
    return cfg, jobs, faults


@pytest.fixture(scope="module")
def outcomes():
    cfg, jobs, faults = planted()
    cluster = size_cluster(jobs, cfg)
    out = {}
    for regime in (regimes.none(), regimes.redacted(), regimes.full()):
        result = Simulation(cfg, cluster, jobs, regime, faults=faults).run()
        out[regime.name] = (load_attack(result.records, 8),
                            failure_attack(result.records, cfg.attack_window_s))
    return out


def test_full_visibility_gives_the_planted_signals_away(outcomes):
    load, failed = outcomes["full"]
    assert load.accuracy > 0.95
    assert failed.accuracy > 0.95
    assert failed.positives > 30 and load.positives > 300


def test_no_feed_leaves_the_attacker_at_chance(outcomes):
    load, failed = outcomes["none"]
    assert load.accuracy == pytest.approx(0.5)
    assert failed.accuracy == pytest.approx(0.5)
    assert load.chance == failed.chance == 0.5


def test_redacted_feed_sits_between(outcomes):
    # Buckets blur the victim's load; the first host down is still told exactly (edges 0, 1).
    load, failed = outcomes["redacted"]
    assert 0.5 < load.accuracy <= outcomes["full"][0].accuracy
    assert failed.accuracy > 0.9


def test_balanced_accuracy_and_rules():
    assert balanced([True, False, False, False], [True, False, False, False]) == 1.0
    assert balanced([True] * 4, [True, False, False, False]) == 0.5
    assert balanced([True], [True]) is None
    cut = fit_threshold([1, 2, 3, 10, 11, 12], [False, False, False, True, True, True])
    assert 3 <= cut < 10
    assert fit_threshold([5, 5, 5, 5], [True, False, True, False]) == float("-inf")
    table = fit_table(["x", "x", "y", "y", "y"], [True, True, False, False, True])
    assert table == {"x": True, "y": False}
