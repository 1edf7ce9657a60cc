"""``harmonaize-sim`` gives the same results in every process for one ``--seed``.

Python salts ``str`` hashes per process (``PYTHONHASHSEED``), so iterating a set of job
names orders things differently from one run to the next. The simulator once built the
redactor's placements that way; the job-health messages then went out in another order,
tenants acted on them in another order, and queues diverged. Each test runs the CLI in two
processes with different hash seeds (and a different number of workers) and compares the
JSON. Both scenarios are dense in degrading faults and shared hosts, where the order of
job-health messages matters: each caught the unsorted placements on its own.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from sim.traces import INFINITEHBD_FAULTS, PHILLY_JOBS

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], out: Path, hash_seed: int, workers: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    json_path = out / f"hash{hash_seed}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sim.cli", *args, "--no-sweep", "--workers", str(workers),
         "--out", str(out / "figs"), "--json", str(json_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(json_path.read_text())


def _same_in_two_processes(args: list[str], tmp_path: Path) -> None:
    first = _run(args, tmp_path, hash_seed=1, workers=1)
    second = _run(args, tmp_path, hash_seed=2, workers=2)
    assert len(first["outcomes"]) == 3
    for a, b in zip(first["outcomes"], second["outcomes"], strict=True):
        assert a == b, f"{a['regime']} differs between PYTHONHASHSEED=1 and 2"
    assert first == second


@pytest.fixture
def dense_traces(tmp_path: Path) -> tuple[Path, Path]:
    """1,500 jobs over three days on two pools, with ten faults on each of 80 trace nodes,
    most of them degrading (a host kept up but drained and slow)."""
    rng = random.Random(2)
    start = datetime(2017, 10, 1)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for _ in range(1500):
        when = start + timedelta(seconds=rng.uniform(0, 3 * 86400))
        duration = round(rng.expovariate(1 / 10000) + 60)
        gpus = rng.choice((1, 1, 1, 2, 4, 8, 16))
        pool = rng.choice(("east", "west"))
        lines.append(f"{when:%Y-%m-%d %H:%M:%S},{duration},{gpus},{duration * gpus},{pool}")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("\n".join(lines) + "\n")
    events = []
    for node in range(80):
        for _ in range(10):
            t = rng.uniform(0, 3)
            desc, cls = rng.choice((("GPU Temperature High", "GPU"), ("GPU Lost", "GPU"),
                                    ("NIC Link Speed low", "NIC")))
            kind = {"Level": "Hardware Failure", "Class": cls, "Desc": desc}
            events += [
                {"node_id": f"n{node}", "event_time": t, "event_type": "fault_start",
                 "fault_type": kind},
                {"node_id": f"n{node}", "event_time": t + rng.uniform(0.02, 0.2),
                 "event_type": "fault_end", "fault_type": kind},
            ]
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(events))
    return jobs, faults


def test_same_results_whatever_the_hash_seed(dense_traces, tmp_path):
    jobs, faults = dense_traces
    _same_in_two_processes(["--jobs", str(jobs), "--faults", str(faults)], tmp_path)


@pytest.mark.skipif(not (PHILLY_JOBS.exists() and INFINITEHBD_FAULTS.exists()),
                    reason="public traces not found at ../shared/data/traces "
                           "(outside the repository)")
def test_same_results_on_the_philly_trace_whatever_the_hash_seed(tmp_path):
    # The trace's first 30 days (8,760 jobs) with faults twenty times as often.
    _same_in_two_processes(["--days", "30", "--fault-time-scale", "0.05"], tmp_path)
