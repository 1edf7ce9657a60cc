"""The learned leakage attacks on planted signals: high under full visibility, chance with
no feed, near chance under a small ε."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sim import regimes
from sim.cluster import FaultSpec, size_cluster
from sim.engine import Simulation
from sim.learned import MIN_POSITIVES, balanced, failure_data, load_data, score
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
    for regime in (regimes.none(), regimes.coarse(), regimes.full(),
                   regimes.redacted(epsilon_per_day=2.0, release_interval=3600.0,
                                    name="private")):
        result = Simulation(cfg, cluster, jobs, regime, faults=faults).run()
        out[regime.name] = (
            score("load", [load_data(result.records, cfg.sample_s, "t")]),
            score("failure", [failure_data(result.records, cfg.attack_window_s,
                                           cfg.sample_s, "t")]))
    return out


def test_full_visibility_gives_the_planted_signals_away(outcomes):
    load, failed = outcomes["full"]
    assert load.accuracy > 0.9 and load.low > 0.85
    assert failed.accuracy > 0.9
    assert load.positives > 10 and failed.positives > 30
    # Under MIN_POSITIVES positive test windows a score is flagged, not passed off.
    assert failed.positives < MIN_POSITIVES and not failed.enough
    assert "not an estimate" in failed.text()


def test_no_feed_leaves_the_attacker_at_chance(outcomes):
    load, failed = outcomes["none"]
    assert load.accuracy == pytest.approx(0.5) and failed.accuracy == pytest.approx(0.5)
    assert load.chance == failed.chance == 0.5
    assert load.low <= 0.5 <= load.high


def test_the_coarse_feed_gives_the_first_host_down_away(outcomes):
    # The coarse feed's first host bucket (0-1) hides one host down, not the GPUs it took.
    load, failed = outcomes["coarse"]
    assert 0.5 < load.accuracy <= outcomes["full"][0].accuracy + 0.02
    assert failed.accuracy > 0.6


def test_a_small_epsilon_leaves_both_attacks_near_chance(outcomes):
    load, failed = outcomes["private"]
    assert load.accuracy < outcomes["full"][0].accuracy - 0.2
    assert failed.low < 0.5 + 0.1 and failed.accuracy < outcomes["full"][1].accuracy - 0.2


def test_balanced_accuracy():
    t, f = True, False
    assert balanced(np.array([t, f, f, f]), np.array([t, f, f, f])) == 1.0
    assert balanced(np.array([t] * 4), np.array([t, f, f, f])) == 0.5
    assert balanced(np.array([t]), np.array([t])) is None
