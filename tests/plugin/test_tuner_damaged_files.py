"""What a rank follows when its policy file is gone, damaged, rewritten or shrunk underneath it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agent.plugin.layout import (
    U64_MAX,
    Algo,
    Coll,
    CommEntry,
    Policy,
    Pref,
    Proto,
    Rule,
    encode_policy,
    pseudo_comm_id,
)
from agent.plugin.shm import PolicyFile, policy_path, read_stats
from testbed.plugin import LOGGER
from tests.plugin.test_tuner_abi import (
    BROKEN,
    COMM,
    JOB,
    N_NODES,
    N_RANKS,
    RING_LL128,
    ROOT,
    RULES,
    TREE_SIMPLE,
    broken_image,
    choice,
    listed,
    nccl_table,
    opened,
    publish,
    table_bytes,
)

pytestmark = pytest.mark.tuning


# ---- No clock: a policy is followed however long the agent is gone. ----


def test_followed_without_any_refresh(lib, tuner_dir):
    """Nothing ages: the same copy holds after any pause, and no stale_after exists."""
    publish(tuner_dir, listed(COMM, None, 0, 0, TREE_SIMPLE))
    with opened(lib, 5, tuner_dir) as ctx:
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)
        time.sleep(1.2)
        ctx.calls(3000)
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)


def test_removed_file_keeps_what_is_held(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 0, TREE_SIMPLE))
    with opened(lib, 5, tuner_dir) as ctx:
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)
        policy_path(tuner_dir, JOB).unlink()
        ctx.calls(2100)  # two index-tied rechecks find no file
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)


# ---- Unusable copies. ----


@pytest.mark.parametrize("case", list(BROKEN))
def test_unusable_policy_leaves_nccl_alone(lib, tuner_dir, case):
    image = broken_image(case)
    if image is not None:
        policy_path(tuner_dir, JOB).write_bytes(image)
    base = nccl_table()
    with opened(lib, 5, tuner_dir) as ctx:
        for coll, nbytes, given in [(Coll.ALL_REDUCE, 4096, 0), (Coll.ALL_GATHER, 1 << 24, 8),
                                    (Coll.ALL_REDUCE, 4096, 0)]:
            out, channels = ctx.call(coll, nbytes, base, given)
            assert table_bytes(out) == table_bytes(base) and channels == given
        [slot] = read_stats(tuner_dir, JOB)
        assert (slot.revision, slot.switches, slot.collectives) == (0, 0, 3)


@pytest.mark.parametrize("case", [c for c in BROKEN if c not in (
    "missing", "truncated by one byte", "truncated to one page", "empty")])
def test_damaged_copy_never_changes_what_a_rank_follows(lib, tuner_dir, case):
    """A rank that follows an entry keeps it when the file's next copy is damaged."""
    publish(tuner_dir, listed(COMM, None, 0, 0, TREE_SIMPLE))
    with opened(lib, 5, tuner_dir) as ctx:
        assert choice(ctx) == (Algo.TREE, Proto.SIMPLE)
        image = bytearray(broken_image(case) or b"")
        path = policy_path(tuner_dir, JOB)
        with open(path, "r+b") as f:  # in place, as a confused writer would
            f.write(image)
        assert [choice(ctx) for _ in range(3)] == [(Algo.TREE, Proto.SIMPLE)] * 3


def test_control_unbroken_policy_applies(lib, tuner_dir):
    """The same image as above without the damage: the damage is what counts."""
    policy = Policy(3, (CommEntry(COMM, 0, None, 0), CommEntry(COMM + 1, 0, 0, 0)), (RULES,))
    policy_path(tuner_dir, JOB).write_bytes(encode_policy(policy, seq=2))
    with opened(lib, 5, tuner_dir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 4096, nccl_table())[0] != nccl_table()


def test_file_of_another_user_is_not_mapped(lib, tuner_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file away")
    publish(tuner_dir, listed(COMM, None, 0, 0, TREE_SIMPLE))
    os.chown(policy_path(tuner_dir, JOB), 4242, 0)
    with opened(lib, 5, tuner_dir) as ctx:
        assert choice(ctx) is None
        [slot] = read_stats(tuner_dir, JOB)
        assert not slot.mapped


def test_inert_without_a_valid_job(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 0, RULES))
    messages: list[tuple[int, bytes]] = []

    @LOGGER
    def logger(level, flags, file, line, fmt):
        messages.append((level, fmt))

    for job in (None, "", "a/b", "x" * 129, "has space", "tab\t", ".", ".."):
        messages.clear()
        with opened(lib, 5, tuner_dir, job=job, logger=logger) as ctx:
            assert ctx.handle.value is None  # no context: nothing to do per call
            out, channels = ctx.call(Coll.ALL_REDUCE, 4096, nccl_table(), 8)
            assert (out, channels) == (nccl_table(), 8)
        assert len(messages) == 1 and b"HARMONAIZE_JOB" in messages[0][1]
    with opened(lib, 5, tuner_dir, job="J" * 128) as ctx:
        assert ctx.handle.value is not None


def test_odd_arguments_never_fail(lib, tuner_dir):
    key = pseudo_comm_id(N_RANKS, N_NODES)
    publish(tuner_dir, listed(key, None, 0, 0, (Rule(prefs=(Pref(None, None),),
                                                     max_channels=2),)))
    with opened(lib, 4, tuner_dir) as ctx:
        tuner, handle = ctx.tuner, ctx.handle
        channels = ctypes.c_int(0)
        assert tuner.getCollInfo(handle, 4, 1, 1, None, 7, 3, 0, ctypes.byref(channels)) == 0
        zeroed_any = []
        for num_algo, num_proto, coll in [(0, 3, 4), (7, 0, 4), (-1, 3, 4), (7, 3, -1),
                                          (7, 3, 14), (7, 3, 1 << 30)]:
            array = (ctypes.c_float * 21)(*([1.0] * 21))
            assert tuner.getCollInfo(handle, coll, U64_MAX, 1, ctypes.cast(array, ctypes.c_void_p),
                                     num_algo, num_proto, 1, None) == 0
            zeroed_any.append(0.0 in list(array))
        # The catch-all rule (mask 0) matches any collType; bad extents skip the table.
        assert zeroed_any == [False, False, False, True, True, True]


# ---- Concurrency. ----


def test_concurrent_rewrites_never_mix_policies(lib, tuner_dir):
    """A writer flipping between two entries; every answer is one of them, whole."""
    first = listed(COMM, None, 0, 0, TREE_SIMPLE, revision=1)
    publish(tuner_dir, first)
    stop = threading.Event()
    revision = [1]

    def writer() -> None:
        with PolicyFile(policy_path(tuner_dir, JOB)) as handle:
            while not stop.is_set():
                revision[0] += 1
                rules = TREE_SIMPLE if revision[0] % 2 else RING_LL128
                handle.write(listed(COMM, None, 0, 0, rules, revision=revision[0]))

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with opened(lib, 5, tuner_dir) as ctx:
            seen = set()
            for _ in range(3000):
                out, _ = ctx.call(Coll.ALL_REDUCE, 4 << 20, nccl_table())
                zeros = [(a, p) for a, row in enumerate(out) for p, v in enumerate(row)
                         if v == 0.0]
                assert len(zeros) == 1
                seen.add(zeros[0])
            assert seen <= {(Algo.TREE, Proto.SIMPLE), (Algo.RING, Proto.LL128)}
    finally:
        stop.set()
        thread.join(5)


# ---- Files that shrink underneath (hardening). ----

SHRINK = ROOT / "tests" / "bin" / "shrinking_files.py"


@pytest.mark.hardening
@pytest.mark.parametrize(("what", "size"), [("policy", 0), ("policy", 100), ("policy", 5000),
                                            ("stats", 0), ("stats", 64)])
def test_a_file_truncated_underneath_never_kills_the_rank(lib, workdir, what, size):
    done = subprocess.run([sys.executable, str(SHRINK), str(workdir / "tuner"), what, str(size)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"rank died ({done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout)
    tree, ring = [Algo.TREE, Proto.SIMPLE], [Algo.RING, Proto.LL128]
    # What the rank follows never changes because of the cut, and a new policy applies.
    assert (result["before"], result["cut"], result["rechecked"]) == (tree, tree, tree)
    assert result["republished"] == ring
    assert result["stats_files"] == 1  # a cut stats file is replaced by a whole one


@pytest.mark.hardening
def test_a_fault_outside_the_plugin_still_takes_its_course(lib, workdir):
    done = subprocess.run([sys.executable, str(SHRINK), str(workdir / "tuner"), "elsewhere",
                           "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr[-2000:])
