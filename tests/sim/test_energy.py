"""The simulator's energy study: the agent's loop on the published power curves, and energy
saved against JCT stretched per slack tenants declare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import cli, regimes
from sim.energy import (
    CURVES,
    MEASURED,
    SLACKS,
    best_within,
    charged_seconds,
    evaluate_slacks,
    loop_effect,
)
from sim.engine import Simulation
from sim.model import SimConfig
from sim.scenario import from_traces
from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS, JobTraceOptions

pytestmark = [pytest.mark.energy, pytest.mark.sim]


def test_the_curves_are_the_measurements_relative_to_the_default_limit() -> None:
    assert len(MEASURED) == 6
    for name, c in CURVES.items():
        assert c.limits[-1] == 300 and c.at(300) == (1.0, 1.0), name
        assert all(0 < t <= 1 and 0 < p <= 1 for t, p in zip(c.throughput, c.power,
                                                              strict=True))
    # Between measured points (sentiment140: every 50 W) the relation is linear.
    s = CURVES["sentiment140/bert-base b128"]
    assert s.at(275) == pytest.approx(((1 + s.at(250)[0]) / 2, (1 + s.at(250)[1]) / 2))


@pytest.mark.parametrize("slack", [0.05, 0.10])
def test_the_loop_never_settles_slower_than_the_slack_and_never_costs_energy(slack) -> None:
    for name, c in CURVES.items():
        e = loop_effect(c, slack)
        # Time-averaged after settling, re-probes and hourly baselines included.
        assert e.throughput >= 1 - slack, name
        assert e.energy <= 1.005, name
        assert 0 < e.settle_s < 600, name
    assert loop_effect(CURVES["imagenet/resnet50 b256"], slack).energy < 0.9


@pytest.mark.parametrize("slack", [0.05, 0.10])
def test_the_loop_comes_near_the_best_limit_in_hindsight(slack) -> None:
    gaps = []
    for c in CURVES.values():
        e, best = loop_effect(c, slack), best_within(c, slack)
        assert e.energy >= best.energy - 0.002  # no better than knowing the curve
        gaps.append(e.energy - best.energy)
    assert sum(g < 0.01 for g in gaps) >= 5, gaps


def test_no_slack_changes_nothing() -> None:
    e = loop_effect(CURVES["imagenet/resnet50 b256"], 0.0)
    assert (e.throughput, e.power, e.settle_s) == (1.0, 1.0, 0.0)


def test_full_power_is_charged_until_the_loop_settles() -> None:
    assert charged_seconds(100, 30, 0.5) == 30 + 70 * 0.5
    assert charged_seconds(20, 30, 0.5) == 20


#: The Philly and InfiniteHBD traces live beside the repository, not in it.
traces_present = pytest.mark.skipif(
    not (PHILLY_JOBS.exists() and INFINITEHBD_FAULTS.exists()),
    reason="public traces not found at ../shared/data/traces (outside the repository)")


@pytest.fixture(scope="module")
def small() -> object:
    opts = JobTraceOptions(days=4, max_jobs=3000, seed=1)
    return from_traces(SimConfig(seed=1, demand_quantile=0.99), PHILLY_JOBS,
                       INFINITEHBD_FAULTS, opts)


@traces_present
def test_on_the_philly_trace_more_slack_saves_more_and_stretches_run_times_within_it(
        small) -> None:
    outcomes = evaluate_slacks(small, SLACKS, workers=1)
    base, five, ten = outcomes
    assert base.slack == 0 and base.finished == five.finished == ten.finished
    assert base.energy_mwh > five.energy_mwh > ten.energy_mwh
    assert 0.03 < 1 - five.energy_mwh / base.energy_mwh < 1 - ten.energy_mwh / base.energy_mwh
    before = {i: r for i, _, r in base.jct}
    for o in (five, ten):
        stretch = [r / before[i] - 1 for i, _, r in o.jct if before[i] > 0]
        # Jobs' own run times stretch by no more than the slack (faults aside, on average).
        assert 0 < sum(stretch) / len(stretch) <= o.slack
    # Deterministic from the seed.
    again = evaluate_slacks(small, (0.05,), workers=1)[0]
    assert again.energy_mwh == five.energy_mwh and again.jct == five.jct


@traces_present
def test_the_cli_reports_energy_saved_per_slack(tmp_path, capsys) -> None:
    rc = cli.main(["--energy", "--max-jobs", "400", "--days", "2", "--faults", "none",
                   "--fault-source", "none", "--workers", "1", "--slack", "0.05,0.1",
                   "--json", str(tmp_path / "e.json")])
    text = capsys.readouterr().out
    assert rc == 0
    for word in ("slack 5%", "slack 10%", "GPU energy MWh", "mean run time",
                 "imagenet/resnet50 b256", "GPU energy saved"):
        assert word in text
    report = json.loads(Path(tmp_path / "e.json").read_text())
    assert [e["slack"] for e in report["energy"]] == [0.0, 0.05, 0.1]


@pytest.mark.parametrize("slack", ["x", "0.9"])
def test_a_bad_slack_is_one_line(slack, capsys) -> None:
    rc = cli.main(["--energy", "--max-jobs", "10", "--faults", "none", "--fault-source",
                   "none", "--slack", slack])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--slack" in err


@traces_present
def test_the_feed_regimes_run_as_before_without_power_limits(small) -> None:
    result = Simulation(small.cfg, small.cluster, small.jobs, regimes.none()).run()
    assert all(j.thr == 1.0 and j.watts == 0.0 and j.energy == 0.0 for j in result.jobs)
    assert all(r.energy is None for r in regimes.main_regimes())
