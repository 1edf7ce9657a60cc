"""``harmonaize-sim`` end to end on small traces: the table, the headline, the figures."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

import pytest

from sim import cli
from sim.regimes import EPSILON_SWEEP_INTERVAL, coarse_sweep, frontier, redacted, scaled

pytestmark = pytest.mark.sim


@pytest.fixture
def traces(tmp_path):
    rng = random.Random(2)
    start = datetime(2017, 10, 1)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for _ in range(160):
        when = start + timedelta(seconds=rng.uniform(0, 3 * 86400))
        duration = round(rng.expovariate(1 / 5000) + 60)
        gpus = rng.choice((1, 1, 1, 2, 4, 8))
        pool = rng.choice(("east", "west"))
        lines.append(f"{when:%Y-%m-%d %H:%M:%S},{duration},{gpus},{duration * gpus},{pool}")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("\n".join(lines) + "\n")
    events = []
    for node in range(6):
        t = rng.uniform(0, 2)
        events += [
            {"node_id": f"n{node}", "event_time": t, "event_type": "fault_start",
             "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU Lost"}},
            {"node_id": f"n{node}", "event_time": t + 0.1, "event_type": "fault_end",
             "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU Lost"}},
        ]
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(events))
    return jobs, faults


def test_cli_compares_regimes_and_writes_the_figures(traces, tmp_path, capsys):
    jobs, faults = traces
    out = tmp_path / "figs"
    rc = cli.main(["--jobs", str(jobs), "--faults", str(faults), "--seed", "3",
                   "--out", str(out), "--workers", "1", "--json", str(tmp_path / "r.json")])
    text = capsys.readouterr().out
    assert rc == 0
    for word in ("none", "redacted", "full", "mean JCT", "Share of full visibility",
                 "Sweep over the private feed", "attack: load"):
        assert word in text
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["privacy-frontier-epsilon.png", "privacy-frontier-tradeoff.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    report = json.loads((tmp_path / "r.json").read_text())
    others = [r for r in frontier() if r.redaction != redacted().redaction]
    assert len(report["outcomes"]) == 3 + len(others)
    assert {o["summary"]["jobs"] for o in report["outcomes"]} == {160}


def test_cli_sweeps_the_coarse_feed_on_request(traces, tmp_path, capsys):
    jobs, faults = traces
    out = tmp_path / "figs"
    rc = cli.main(["--jobs", str(jobs), "--faults", str(faults), "--sweep", "coarse",
                   "--out", str(out), "--workers", "1", "--json", str(tmp_path / "r.json")])
    assert rc == 0 and "Sweep over the coarse feed" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("*.png")) == [
        "sim-attack-vs-coarseness.png", "sim-outcome-vs-coarseness.png",
        "sim-privacy-utility-frontier.png"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["outcomes"]) == 3 + len(coarse_sweep())


def test_cli_is_deterministic_under_a_seed(traces, tmp_path, capsys):
    jobs, faults = traces
    args = ["--jobs", str(jobs), "--faults", str(faults), "--no-sweep", "--workers", "1"]
    cli.main(args)
    first = capsys.readouterr().out
    cli.main(args)
    second = capsys.readouterr().out
    strip = [line for line in first.splitlines() if not line.endswith(" s")]
    assert strip == [line for line in second.splitlines() if not line.endswith(" s")]


def test_cli_reports_a_bad_trace_line_and_exits_2(tmp_path, capsys):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-01 00:00:00,10,1,10,a\n2017-10-01 00:00:05,10,x,10,a\n")
    assert cli.main(["--jobs", str(jobs), "--faults", "none"]) == 2
    err = capsys.readouterr().err
    assert "jobs.csv:3" in err and "num_gpus" in err


def test_sweep_points_vary_one_knob_each():
    private = frontier()
    assert len({p.name for p in private}) == len(private)
    default = redacted().redaction
    for p in private:
        assert p.redaction.mode == default.mode
        if p.knob == "epsilon":
            assert p.redaction.release_interval == EPSILON_SWEEP_INTERVAL
        elif p.knob == "uniform":  # the plan before pools were sized, for comparison
            assert p.redaction.noise_share == 0.0
        elif p.knob == "noise_share":
            assert p.redaction.noise_share == p.value != default.noise_share
        elif p.knob == "job_hosts":
            assert p.redaction.unit == "job" and p.redaction.job_hosts == p.value
        else:
            assert p.knob == "interval" and p.redaction.epsilon_per_day == default.epsilon_per_day
    assert any(p.knob == "epsilon" and p.value <= 3 for p in private)  # the ε ≤ 3 frontier
    assert any(p.redaction == default for p in private)  # the default is on the frontier
    points = coarse_sweep()
    assert len({p.name for p in points}) == len(points)
    assert scaled((0, 1, 2, 4), 4) == (0, 4, 8, 16)
    assert scaled((0, 2, 4, 8), 0.5) == (0, 1, 2, 4)
    with pytest.raises(ValueError):
        scaled((0, 1, 8), 0.5)
    (previous,) = [p for p in points if p.name == "host x0.5"]
    assert previous.redaction.host_buckets[:4] == (0, 1, 2, 4)
    assert previous.redaction.gpu_buckets == points[0].redaction.gpu_buckets
    default = points[0].redaction
    for p in points[1:]:
        changed = [f for f in ("min_hosts", "min_interval", "host_buckets")
                   if getattr(p.redaction, f) != getattr(default, f)]
        assert len(changed) == 1
