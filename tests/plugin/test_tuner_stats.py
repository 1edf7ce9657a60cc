"""The plugin's stats files: attached, recorded, dropped with a dead process, made again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.plugin.layout import history_step, ruleset_hash
from agent.plugin.shm import job_dir, policy_path, read_stats
from tests.plugin.test_tuner_abi import (
    COMM,
    JOB,
    N_NODES,
    N_RANKS,
    ROOT,
    TREE_SIMPLE,
    listed,
    opened,
    publish,
)

pytestmark = pytest.mark.tuning


# ---- Stats. ----


def test_stats_record_switches_and_the_process_lives(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 4, TREE_SIMPLE, revision=2))
    with opened(lib, 5, tuner_dir) as ctx:
        ctx.calls(10)
        [slot] = read_stats(tuner_dir, JOB)
        assert (slot.comm_id, slot.n_ranks, slot.n_nodes) == (COMM, N_RANKS, N_NODES)
        assert (slot.collectives, slot.revision, slot.at, slot.switches, slot.last_switch) == (
            10, 2, 4, 1, 4)
        assert slot.history == history_step(0, 4, ruleset_hash(TREE_SIMPLE))
        assert slot.policy_file == (os.stat(policy_path(tuner_dir, JOB)).st_dev,
                                    os.stat(policy_path(tuner_dir, JOB)).st_ino)
        [name] = [p.name for p in job_dir(tuner_dir, JOB).iterdir() if p.suffix == ".stats"]
        assert name.startswith(f"{os.getpid()}-")
    assert read_stats(tuner_dir, JOB) == []  # the last context removed its file
    assert not [p for p in job_dir(tuner_dir, JOB).iterdir() if p.suffix == ".stats"]


def test_stats_of_a_dead_process_are_dropped(lib, tuner_dir):
    code = (
        f"import os, sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from testbed.plugin import Rank\n"
        f"r = Rank(7, 2, 1, job={JOB!r}, directory={str(tuner_dir)!r})\n"
        "r.call(); os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    slots = read_stats(tuner_dir, JOB)
    assert slots == [] and slots.dead == 1
    assert not [p for p in job_dir(tuner_dir, JOB).iterdir() if p.suffix == ".stats"]


def test_a_removed_stats_file_is_made_again(lib, tuner_dir):
    """Someone removed the counters (a wiped runtime directory): the rank makes a new
    file at its next recheck, with its whole record, so the agent sees it again."""
    publish(tuner_dir, listed(COMM, None, 0, 3, TREE_SIMPLE, revision=2))
    with opened(lib, 5, tuner_dir) as ctx:
        ctx.calls(10)
        for path in job_dir(tuner_dir, JOB).glob("*.stats"):
            path.unlink()
        assert read_stats(tuner_dir, JOB) == []
        ctx.calls(1024 - ctx.n + 1)
        [slot] = read_stats(tuner_dir, JOB)
        assert (slot.collectives, slot.revision, slot.switches, slot.last_switch) == (
            1025, 2, 1, 3)


def test_read_stats_skips_malformed_files(tuner_dir):
    folder = job_dir(tuner_dir, JOB)
    for name, data in [("1-0000000000000001.stats", b"short"),
                       ("2-0000000000000002.stats", b"\0" * 4160)]:
        path = folder / name
        path.write_bytes(data)
    keep = open(folder / "1-0000000000000001.stats", "rb")  # noqa: SIM115 - held open below
    try:
        import fcntl  # noqa: PLC0415

        fcntl.flock(keep, fcntl.LOCK_SH)
        other = open(folder / "2-0000000000000002.stats", "rb")  # noqa: SIM115
        fcntl.flock(other, fcntl.LOCK_SH)
        slots = read_stats(tuner_dir, JOB)
        assert slots == [] and slots.malformed == 2
        other.close()
    finally:
        keep.close()
