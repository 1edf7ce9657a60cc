"""Ranks wait at an armed switch; new and replaced files are found at indices tied to the count."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from agent.plugin.layout import Algo, Policy, Proto
from agent.plugin.shm import policy_path, prepare_dirs, prepare_job_dir, read_stats
from tests.plugin.test_tuner_abi import (
    COMM,
    JOB,
    RING_LL128,
    TREE_SIMPLE,
    Context,
    choice,
    listed,
    opened,
    publish,
)

pytestmark = pytest.mark.tuning


# ---- Waiting at an armed switch. ----


def run_in_thread(ctx: Context, count: int) -> tuple[threading.Thread, list[object]]:
    answers: list[object] = []

    def run() -> None:
        for _ in range(count):
            answers.append(choice(ctx))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answers


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("commit", [True, False])
def test_rank_waits_at_an_armed_switch_until_it_is_resolved(lib, tuner_dir, commit):
    publish(tuner_dir, listed(COMM, None, 0, 5, TREE_SIMPLE, revision=1, pending=True))
    with opened(lib, 5, tuner_dir) as ctx:
        thread, answers = run_in_thread(ctx, 8)
        wait_for(lambda: any(s.waiting for s in read_stats(tuner_dir, JOB)))
        time.sleep(0.2)
        assert answers == [None] * 5 and thread.is_alive()  # held at collective 5
        [slot] = read_stats(tuner_dir, JOB)
        assert (slot.wait_at, slot.collectives) == (5, 5)
        after = 0 if commit else None
        publish(tuner_dir, listed(COMM, None, after, 5, TREE_SIMPLE, revision=2))
        thread.join(5)
        assert not thread.is_alive()
    tail = (Algo.TREE, Proto.SIMPLE) if commit else None
    assert answers == [None] * 5 + [tail] * 3


def test_waiting_rank_follows_a_recreated_file(lib, tuner_dir):
    """An agent restarted into a new file (a new inode) still resolves a waiting rank."""
    publish(tuner_dir, listed(COMM, None, 0, 3, TREE_SIMPLE, revision=1, pending=True))
    with opened(lib, 5, tuner_dir) as ctx:
        thread, answers = run_in_thread(ctx, 5)
        wait_for(lambda: any(s.waiting for s in read_stats(tuner_dir, JOB)))
        path = policy_path(tuner_dir, JOB)
        path.unlink()
        publish(tuner_dir, listed(COMM, None, 0, 3, TREE_SIMPLE, revision=2))
        thread.join(5)
        assert not thread.is_alive()
    assert answers == [None] * 3 + [(Algo.TREE, Proto.SIMPLE)] * 2


def test_an_empty_policy_does_not_release_a_waiting_rank(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 2, TREE_SIMPLE, revision=4, pending=True))
    with opened(lib, 5, tuner_dir) as ctx:
        thread, answers = run_in_thread(ctx, 3)
        wait_for(lambda: any(s.waiting for s in read_stats(tuner_dir, JOB)))
        publish(tuner_dir, Policy(9))  # what a restarted agent without state would write
        time.sleep(0.3)
        assert thread.is_alive() and answers == [None, None]
        [slot] = read_stats(tuner_dir, JOB)
        assert slot.refused and slot.waiting
        publish(tuner_dir, listed(COMM, None, 0, 2, TREE_SIMPLE, revision=5))
        thread.join(5)
    assert answers == [None, None, (Algo.TREE, Proto.SIMPLE)]


# ---- Files appear, are replaced, at collective indices tied to the count. ----


def test_policy_appearing_later_is_found_at_a_multiple_of_256(lib, tuner_dir):
    with opened(lib, 5, tuner_dir) as ctx:
        ctx.calls(10)
        publish(tuner_dir, listed(COMM, None, 0, 1500, TREE_SIMPLE))
        ctx.calls(245)  # through collective 254
        [slot] = read_stats(tuner_dir, JOB)
        assert not slot.mapped
        ctx.calls(1)  # collective 255 ... 256 maps it
        assert choice(ctx) is None
        assert read_stats(tuner_dir, JOB)[0].mapped
        ctx.calls(1500 - ctx.n)
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)


def test_stats_attach_once_the_job_directory_exists(lib, workdir):
    directory = workdir / "later"
    prepare_dirs(directory)
    with opened(lib, 5, directory) as ctx:
        ctx.calls(5)
        prepare_job_dir(directory, JOB, None)
        assert read_stats(directory, JOB) == []
        ctx.calls(256)
        [slot] = read_stats(directory, JOB)
        assert slot.collectives == ctx.n


def test_replaced_file_is_judged_like_any_copy(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 0, TREE_SIMPLE, revision=3))
    with opened(lib, 5, tuner_dir) as ctx:
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)
        path = policy_path(tuner_dir, JOB)
        path.unlink()
        publish(tuner_dir, Policy(1))  # a fresh, empty file: revision 0 for this entry
        ctx.calls(1100)
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)
        [slot] = read_stats(tuner_dir, JOB)
        assert slot.refused and slot.revision == 3
        path.unlink()
        publish(tuner_dir, listed(COMM, 0, 1, 3000, TREE_SIMPLE, RING_LL128, revision=4))
        ctx.calls(2049 - ctx.n)  # the recheck at collective 2048 maps the new file
        assert read_stats(tuner_dir, JOB)[0].revision == 4
        ctx.calls(3000 - ctx.n)
        assert choice(ctx) == (Algo.RING, Proto.LL128)
