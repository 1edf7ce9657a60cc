"""The NCCL tuner plugin (native/tuner), driven through its C ABI with ctypes.

Each test loads ``libnccl-tuner-harmonaize.so``, calls the exported
``ncclTunerPlugin_vN`` structs' function pointers the way NCCL does (a
contiguous ``float[numAlgo][numProto]`` cast to ``float**``), and checks the
result against explicit expectations and against ``agent.plugin.shm``'s
reference of the same semantics: :func:`apply` for the cost table and
:func:`evaluate` for which copy of its entry a context follows.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.plugin.layout import (
    CHECKSUM_OFFSET,
    POLICY_SIZE,
    RULESETS_OFFSET,
    SEQ_OFFSET,
    U64_MAX,
    Algo,
    Coll,
    CommEntry,
    Held,
    Policy,
    Pref,
    Proto,
    ReferenceContext,
    Rule,
    Verdict,
    apply,
    checksum,
    decode_policy,
    encode_policy,
    evaluate,
    history_step,
    pseudo_comm_id,
    ruleset_hash,
    validate_job,
)
from agent.plugin.shm import (
    PolicyFile,
    job_dir,
    policy_path,
    prepare_dirs,
    prepare_job_dir,
    read_policy,
    read_stats,
)
from testbed.plugin import LOGGER, STRUCTS

pytestmark = pytest.mark.tuning

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
PROBE = ROOT / "tests" / "bin" / "tuner_probe.py"
JOB = "job-1"
COMM = 0x0123456789ABCDEF
N_RANKS, N_NODES = 16, 2
VERSIONS = (3, 4, 5, 6)

Table = list[list[float]]
GUARD = [5.0, 6.0, 7.0, 8.0]


def table_bytes(table: Table) -> bytes:
    flat = [v for row in table for v in row]
    return struct.pack(f"<{len(flat)}f", *flat)


def nccl_table(num_algo: int = 7) -> Table:
    """Costs in µs as NCCL might give them; CollNet and NVLS-Tree disabled."""
    rows = [[18.5, 22.0, 41.0], [15.0, 19.5, 38.0], [-1.0] * 3, [-1.0] * 3,
            [12.0, -1.0, 30.0], [-1.0] * 3, [25.0, -1.0, 44.0]]
    return [list(r) for r in rows[:num_algo]]


def zeroed(table: Table, algo: int, proto: int) -> Table:
    out = [list(r) for r in table]
    out[algo][proto] = 0.0
    return out


class Context:
    """One tuner context, as NCCL holds it for a communicator."""

    def __init__(self, tuner: ctypes.Structure, version: int, handle: ctypes.c_void_p,
                 key: int) -> None:
        self.tuner, self.version, self.handle, self.key = tuner, version, handle, key
        self.n = 0

    def call(self, coll: int, nbytes: int, table: Table, n_channels: int = 0
             ) -> tuple[Table, int]:
        num_algo, num_proto = len(table), len(table[0])
        size = num_algo * num_proto
        # Guard entries past the table catch any write outside numAlgo x numProto.
        array = (ctypes.c_float * (size + len(GUARD)))(*[v for row in table for v in row], *GUARD)
        channels = ctypes.c_int(n_channels)
        as_pp = ctypes.cast(array, ctypes.c_void_p)  # float[A][P] passed as float**
        if self.version == 3:
            rc = self.tuner.getCollInfo(self.handle, coll, nbytes, 1, as_pp, num_algo, num_proto,
                                        ctypes.byref(channels))
        else:
            rc = self.tuner.getCollInfo(self.handle, coll, nbytes, 1, as_pp, num_algo, num_proto,
                                        0, ctypes.byref(channels))
        assert rc == 0, "getCollInfo must never return an error"
        assert list(array[size:]) == GUARD, "wrote outside the table"
        self.n += 1
        flat = list(array)[:size]
        return [flat[a * num_proto:(a + 1) * num_proto] for a in range(num_algo)], channels.value

    def calls(self, count: int) -> None:
        for _ in range(count):
            self.call(Coll.ALL_REDUCE, 4 << 20, nccl_table())

    def close(self) -> None:
        close = self.tuner.finalize if self.version >= 5 else self.tuner.destroy
        assert close(self.handle) == 0


@contextlib.contextmanager
def environ(**values: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    # make is a no-op when the library is current; building beats skipping.
    done = subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "tuner")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the tuner plugin failed:\n{done.stdout}{done.stderr}")
    return ctypes.CDLL(str(LIBRARY))


@pytest.fixture
def tuner_dir(workdir: Path) -> Path:
    prepare_dirs(workdir / "tuner")
    prepare_job_dir(workdir / "tuner", JOB, None)
    return workdir / "tuner"


def comm_key(version: int, comm_id: int = COMM, n_ranks: int = N_RANKS,
             n_nodes: int = N_NODES) -> int:
    return comm_id if version >= 5 else pseudo_comm_id(n_ranks, n_nodes)


@contextlib.contextmanager
def opened(lib: ctypes.CDLL, version: int, directory: Path | str | None, *, job: str | None = JOB,
           comm_id: int = COMM, n_ranks: int = N_RANKS, n_nodes: int = N_NODES,
           logger: object | None = None) -> Iterator[Context]:
    tuner = STRUCTS[version].in_dll(lib, f"ncclTunerPlugin_v{version}")
    handle = ctypes.c_void_p()
    log = ctypes.cast(logger, ctypes.c_void_p) if logger is not None else None
    with environ(HARMONAIZE_JOB=job,
                 HARMONAIZE_TUNER_DIR=None if directory is None else str(directory)):
        if version >= 5:
            rc = tuner.init(ctypes.byref(handle), comm_id, n_ranks, n_nodes, log, None, None)
        else:
            rc = tuner.init(n_ranks, n_nodes, log, ctypes.byref(handle))
    assert rc == 0, "init must never return an error"
    ctx = Context(tuner, version, handle, comm_key(version, comm_id, n_ranks, n_nodes))
    try:
        yield ctx
    finally:
        ctx.close()


def publish(directory: Path, policy: Policy) -> None:
    with PolicyFile(policy_path(directory, JOB)) as pf:
        pf.write(policy)


def listed(key: int, before: int | None, after: int | None = None, at: int = 0,
           *rulesets: tuple[Rule, ...], revision: int = 1, pending: bool = False,
           policy_id: int = 7) -> Policy:
    return Policy(policy_id, (CommEntry(key, at, before, after, revision, pending),), rulesets)


# A policy that changes something for every call it applies to.
RULES = (
    Rule(frozenset({Coll.ALL_REDUCE}), 0, 1 << 20, (Pref(Algo.RING, Proto.LL128),)),
    Rule(frozenset(), 0, U64_MAX, (Pref(Algo.TREE, Proto.SIMPLE),), max_channels=4),
)
TREE_SIMPLE = (Rule(prefs=(Pref(Algo.TREE, Proto.SIMPLE),)),)
RING_LL128 = (Rule(prefs=(Pref(Algo.RING, Proto.LL128),)),)


def choice(ctx: Context) -> tuple[int, int] | None:
    """Which entry the plugin zeroed for a 4 MiB AllReduce (None: NCCL's own)."""
    out, _ = ctx.call(Coll.ALL_REDUCE, 4 << 20, nccl_table())
    for a, row in enumerate(out):
        for p, v in enumerate(row):
            if v == 0.0:
                return a, p
    return None


# ---- Exports. ----


def test_exports_v3_to_v6_and_not_v1_v2(lib):
    for version in VERSIONS:
        tuner = STRUCTS[version].in_dll(lib, f"ncclTunerPlugin_v{version}")
        assert tuner.name == b"HarmonAIze"
    # v6's optional callback is absent, as NCCL allows (it keeps its own chunk size).
    v6 = STRUCTS[6].in_dll(lib, "ncclTunerPlugin_v6")
    assert ctypes.cast(v6.getChunkSize, ctypes.c_void_p).value is None
    for missing in ("ncclTunerPlugin_v1", "ncclTunerPlugin_v2"):
        with pytest.raises(ValueError):
            ctypes.c_void_p.in_dll(lib, missing)


def test_exports_nothing_else(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIBRARY)], capture_output=True,
                         text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert {n for n in names if not n.startswith("_")} == {
        f"ncclTunerPlugin_v{v}" for v in VERSIONS}


# ---- Following a policy. ----


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("num_algo", [6, 7])  # NCCL 2.22 has no PAT row
def test_follows_policy(lib, tuner_dir, version, num_algo):
    key = comm_key(version)
    publish(tuner_dir, listed(key, None, 0, 0, RULES))
    with opened(lib, version, tuner_dir) as ctx:
        small, _ = ctx.call(Coll.ALL_REDUCE, 4096, nccl_table(num_algo))
        assert small == zeroed(nccl_table(num_algo), Algo.RING, Proto.LL128)
        large, channels = ctx.call(Coll.ALL_GATHER, 1 << 24, nccl_table(num_algo), 8)
        assert large == zeroed(nccl_table(num_algo), Algo.TREE, Proto.SIMPLE)
        # No NCCL that takes a cap is loaded in this process: the count stays NCCL's.
        assert channels == 8


def test_pat_preference_is_bounded_by_num_algo(lib, tuner_dir):
    rules = (Rule(prefs=(Pref(Algo.PAT, Proto.SIMPLE), Pref(Algo.RING, Proto.SIMPLE))),)
    publish(tuner_dir, listed(COMM, None, 0, 0, rules))
    with opened(lib, 5, tuner_dir) as ctx:
        assert ctx.call(Coll.ALL_GATHER, 1 << 20, nccl_table(6))[0] == zeroed(
            nccl_table(6), Algo.RING, Proto.SIMPLE)
        assert ctx.call(Coll.ALL_GATHER, 1 << 20, nccl_table(7))[0] == zeroed(
            nccl_table(7), Algo.PAT, Proto.SIMPLE)


def test_preferences_are_bounded_by_num_proto(lib, tuner_dir):
    rules = (Rule(prefs=(Pref(Algo.TREE, Proto.SIMPLE), Pref(Algo.TREE, Proto.LL))),)
    publish(tuner_dir, listed(COMM, None, 0, 0, rules))
    two = [row[:2] for row in nccl_table()]
    with opened(lib, 5, tuner_dir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 1 << 20, two)[0] == zeroed(two, Algo.TREE, Proto.LL)


def test_wildcard_picks_the_cheapest_enabled_entry(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 0, (Rule(prefs=(Pref(None, Proto.SIMPLE),)),)))
    with opened(lib, 5, tuner_dir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 1 << 20, nccl_table())[0] == zeroed(
            nccl_table(), Algo.NVLS, Proto.SIMPLE)


def test_ties_go_to_the_first_entry_in_table_order(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 0, (Rule(prefs=(Pref(None, None),)),)))
    flat = [[7.0] * 3 for _ in range(7)]
    with opened(lib, 5, tuner_dir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 1 << 20, flat)[0] == zeroed(flat, 0, 0)


def test_never_revives_an_ignored_entry(lib, tuner_dir):
    rules = (Rule(prefs=(Pref(Algo.COLLNET_DIRECT, Proto.SIMPLE), Pref(Algo.NVLS, Proto.LL128),
                         Pref(Algo.NVLS_TREE, None))),)
    publish(tuner_dir, listed(COMM, None, 0, 0, rules))
    nan = [[float("nan")] * 3, *nccl_table()[1:]]
    with opened(lib, 5, tuner_dir) as ctx:
        for table in (nccl_table(), nan):
            out, _ = ctx.call(Coll.ALL_REDUCE, 1 << 20, table)
            assert table_bytes(out) == table_bytes(table)


@pytest.mark.parametrize("version", VERSIONS)
def test_switches_exactly_at_at(lib, tuner_dir, version):
    key = comm_key(version)
    publish(tuner_dir, listed(key, None, 0, 5, TREE_SIMPLE))
    with opened(lib, version, tuner_dir) as ctx:
        answers = [choice(ctx) for _ in range(10)]
        publish(tuner_dir, listed(key, 0, 1, 15, TREE_SIMPLE, RING_LL128, revision=2))
        answers += [choice(ctx) for _ in range(10)]
    assert answers == [None] * 5 + [(Algo.TREE, Proto.SIMPLE)] * 10 + [
        (Algo.RING, Proto.LL128)] * 5


def test_a_new_rank_never_starts_on_rules_others_reached_by_a_switch(lib, tuner_dir):
    """An entry whose rules before its switch are not NCCL's own describes ranks that
    switched earlier; a context that never followed it cannot join it without
    answering differently from them somewhere (NCCL < 2.28 reuses ids by size)."""
    publish(tuner_dir, listed(COMM, 0, 1, 5, RING_LL128, TREE_SIMPLE))
    with opened(lib, 5, tuner_dir) as ctx:
        assert [choice(ctx) for _ in range(8)] == [None] * 8
        [slot] = read_stats(tuner_dir, JOB)
        assert slot.refused and slot.revision == 0


def test_no_ruleset_means_nccls_choice_until_at(lib, tuner_dir):
    publish(tuner_dir, listed(COMM, None, 0, 3, TREE_SIMPLE))
    with opened(lib, 5, tuner_dir) as ctx:
        assert [choice(ctx) for _ in range(5)] == [None] * 3 + [(Algo.TREE, Proto.SIMPLE)] * 2


@pytest.mark.parametrize("version", VERSIONS)
def test_unlisted_communicator_untouched(lib, tuner_dir, version):
    publish(tuner_dir, listed(comm_key(version) ^ 1, None, 0, 0, RULES))
    with opened(lib, version, tuner_dir) as ctx:
        out, channels = ctx.call(Coll.ALL_GATHER, 1 << 24, nccl_table(), 8)
        assert (out, channels) == (nccl_table(), 8)


# ---- Channel counts per NCCL release. ----


def probe(workdir: Path, abi: int, version: int | None, cases: list[list[int]],
          find: str = "global") -> list[int]:
    done = subprocess.run([sys.executable, str(PROBE), str(workdir / f"p{abi}-{version}-{find}"),
                           str(abi), "none" if version is None else str(version), find,
                           json.dumps(cases)], capture_output=True, text=True, check=False,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# (given by NCCL, rule's cap): releases before 2.31 get NCCL's value back untouched,
# whatever the cap; from 2.31 the cap applies, never above 64 (8-bit field, MAXCHANNELS),
# never above a non-zero count NCCL passed in.
CASES = [[0, 4], [0, 200], [8, 4], [2, 4], [0, 0], [0, 127], [16, 64]]
UNTOUCHED = [0, 0, 8, 2, 0, 0, 16]
CAPPED = [4, 64, 4, 2, 0, 64, 16]


@pytest.mark.parametrize(("abi", "version", "expected"), [
    (3, 22203, UNTOUCHED),   # 2.22: v3 is the newest it loads
    (4, 22403, UNTOUCHED),   # 2.24
    (4, 22705, UNTOUCHED),   # 2.27
    (5, 22803, UNTOUCHED),   # 2.28.3: v5
    (6, 23007, UNTOUCHED),   # 2.30.7: v6, *nChannels still replaces NCCL's count
    (6, 23100, CAPPED),      # 2.31: a cap
    (6, 23203, CAPPED),      # 2.32
    (6, None, UNTOUCHED),    # no ncclGetVersion found: assume the older meaning
])
def test_channels_only_where_nccl_takes_a_cap(workdir, abi, version, expected):
    assert probe(workdir, abi, version, CASES) == expected


def test_nccl_found_through_its_logger_when_loaded_privately(workdir):
    """PyTorch loads NCCL out of the global scope; the logger NCCL passes says where it is."""
    assert probe(workdir, 6, 23203, CASES, find="logger") == CAPPED
    assert probe(workdir, 6, 22803, CASES, find="logger") == UNTOUCHED


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


def _patch(offset: int, fmt: str, val: int, fix_checksum: bool = True
           ) -> Callable[[bytearray], bytes]:
    def mutate(image: bytearray) -> bytes:
        struct.pack_into(fmt, image, offset, val)
        if fix_checksum:
            struct.pack_into("<I", image, CHECKSUM_OFFSET, checksum(image))
        return bytes(image)
    return mutate


def _flip(offset: int) -> Callable[[bytearray], bytes]:
    def mutate(image: bytearray) -> bytes:
        image[offset] ^= 0x40
        return bytes(image)
    return mutate


RULE0 = RULESETS_OFFSET + 8  # first rule of ruleset 0

BROKEN: dict[str, Callable[[bytearray], bytes] | None] = {
    "missing": None,
    "wrong magic": _patch(0, "<I", 0x50545A49),
    "wrong version": _patch(4, "<H", 1),
    "wrong header size": _patch(6, "<H", 128),
    "bad checksum": _flip(RULE0 + 9),
    "checksum field": _flip(CHECKSUM_OFFSET),
    "truncated by one byte": lambda image: bytes(image[:POLICY_SIZE - 1]),
    "truncated to one page": lambda image: bytes(image[:4096]),
    "empty": lambda image: b"",
    "odd seq": _patch(SEQ_OFFSET, "<Q", 3, fix_checksum=False),
    "too many comms": _patch(36, "<H", 33),
    "too many rulesets": _patch(38, "<H", 17),
    "after index out of range": _patch(64 + 18, "<H", 5),
    "before index out of range": _patch(64 + 16, "<H", 1),
    "unknown entry flag": _patch(64 + 20, "<H", 4),
    "too many rules": _patch(RULESETS_OFFSET, "<I", 17),
    "too many prefs": _patch(RULE0 + 24, "<B", 5),
    "unknown algorithm": _patch(RULE0 + 26, "<B", 0x72),
    "unknown protocol": _patch(RULE0 + 26, "<B", 0x13),
    "unknown collective bit": _patch(RULE0, "<I", 1 << 9),
    "min above max": _patch(RULE0 + 8, "<Q", 1 << 40),
    "channels beyond int": _patch(RULE0 + 4, "<I", 1 << 31),
    "duplicate communicator": _patch(64 + 32, "<Q", COMM),
}


def broken_image(case: str) -> bytes | None:
    policy = Policy(3, (CommEntry(COMM, 0, None, 0), CommEntry(COMM + 1, 0, 0, 0)), (RULES,))
    mutate = BROKEN[case]
    return None if mutate is None else mutate(bytearray(encode_policy(policy, seq=2)))


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


# ---- Which copy a rank follows: the plugin against layout.evaluate. ----


@pytest.mark.parametrize(("held", "new", "n", "verdict"), [
    # A switch ahead of the rank, agreeing before it: taken.
    (Held(), Held(True, 100, 0, 7, 1), 10, Verdict.ACCEPT),
    # The same switch once the rank passed it: refused (it would change the past).
    (Held(), Held(True, 100, 0, 7, 1), 101, Verdict.REFUSE),
    # An empty policy (a restarted agent that lost its state) never undoes an entry.
    (Held(True, 100, 0, 7, 3), Held(), 50, Verdict.REFUSE),
    # An older revision never replaces a newer one.
    (Held(True, 100, 0, 7, 3), Held(True, 100, 0, 7, 2), 50, Verdict.REFUSE),
    # The same revision must be the same entry.
    (Held(True, 100, 0, 7, 3), Held(True, 200, 0, 7, 3), 50, Verdict.REFUSE),
    # Confirming or cancelling an armed change, even at its switching index.
    (Held(True, 100, 0, 7, 3, True), Held(True, 100, 0, 7, 4), 100, Verdict.ACCEPT),
    (Held(True, 100, 0, 7, 3, True), Held(True, 100, 0, 0, 4), 100, Verdict.ACCEPT),
    # A third outcome of an armed change is no outcome of it.
    (Held(True, 100, 0, 7, 3, True), Held(True, 100, 0, 9, 4), 100, Verdict.REFUSE),
    # The next change written before this rank passed its own switch: judged there.
    (Held(True, 100, 0, 7, 3), Held(True, 300, 7, 9, 4), 50, Verdict.DEFER),
    (Held(True, 100, 0, 7, 3), Held(True, 300, 7, 9, 4), 150, Verdict.ACCEPT),
])
def test_evaluate_cases(held, new, n, verdict):
    assert evaluate(held, new, n)[0] is verdict


POOL = (None, TREE_SIMPLE, RING_LL128,
        (Rule(frozenset({Coll.ALL_REDUCE}), 1 << 10, U64_MAX, (Pref(None, Proto.SIMPLE),)),))
ANSWERS = {0: None, ruleset_hash(TREE_SIMPLE): (Algo.TREE, Proto.SIMPLE),
           ruleset_hash(RING_LL128): (Algo.RING, Proto.LL128),
           ruleset_hash(POOL[3]): (Algo.NVLS, Proto.SIMPLE)}


@st.composite
def entry_writes(draw: st.DrawFn) -> list[tuple[str, object]]:
    """A schedule: writes of the communicator's entry (revisions mostly rising) and
    runs of collectives."""
    steps: list[tuple[str, object]] = []
    revision = 0
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            revision = max(0, revision + draw(st.sampled_from([1, 1, 1, 2, 0, -1])))
            listed_entry = draw(st.integers(0, 9)) > 0
            entry = None
            if listed_entry:
                entry = (draw(st.integers(0, 400)), draw(st.integers(0, 3)),
                         draw(st.integers(0, 3)), max(1, revision), draw(st.booleans()))
            steps.append(("write", entry))
        else:
            steps.append(("calls", draw(st.integers(1, 120))))
    return steps


def held_of(entry: tuple[int, int, int, int, bool] | None) -> Held:
    if entry is None:
        return Held()
    at, before, after, revision, pending = entry
    return Held(True, at, ruleset_hash(POOL[before] or ()), ruleset_hash(POOL[after] or ()),
                revision, pending)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=entry_writes())
def test_plugin_follows_the_reference(lib, tmp_path_factory, steps):
    directory = tmp_path_factory.mktemp("ref")
    prepare_job_dir(directory, JOB, None)
    sets = tuple(rules for rules in POOL[1:])  # ruleset i+1 of POOL is index i
    model = ReferenceContext()
    with PolicyFile(policy_path(directory, JOB)) as handle, \
            opened(lib, 5, directory) as ctx:
        for kind, arg in steps:
            if kind == "write":
                if arg is None:
                    handle.write(Policy(1, (), sets))
                else:
                    at, before, after, revision, pending = arg  # type: ignore[misc]
                    handle.write(Policy(1, (CommEntry(
                        COMM, at, None if before == 0 else before - 1,
                        None if after == 0 else after - 1, revision, pending),), sets))
                model.see(held_of(arg))  # type: ignore[arg-type]
                continue
            for _ in range(arg):  # type: ignore[arg-type]
                if model.would_wait():
                    break  # the plugin would wait here for an outcome: next write
                n = model.n
                expected = ANSWERS[model.call()]
                assert choice(ctx) == expected, f"collective {n}"
            [slot] = read_stats(directory, JOB)
            assert slot.revision == model.held.revision
            assert (slot.switches, slot.history) == (model.switches, model.history)
            assert slot.refused == (model.refused is not None)


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


# ---- Files, modes and the Python side. ----


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Policy(0, (CommEntry(1), CommEntry(1))), "listed twice"),
    (lambda: Policy(0, (CommEntry(1, before=0),)), "names ruleset 0"),
    (lambda: Policy(0, rulesets=((),) * 17), "at most 16 rulesets"),
    (lambda: Rule(prefs=(Pref(),) * 5), "at most 4 preferences"),
    (lambda: Rule(min_bytes=2, max_bytes=1), "exceeds max_bytes"),
    (lambda: CommEntry(-1), "comm_id"),
    (lambda: CommEntry(1, revision=2**32), "revision"),
])
def test_policy_validation(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_validate_job():
    assert validate_job("a.b:c@d+e-f_") == "a.b:c@d+e-f_"
    for bad in ("", ".", "..", "a/b", "x" * 129, "sp ace"):
        with pytest.raises(ValueError):
            validate_job(bad)


def test_directories_and_modes(workdir):
    if os.geteuid() != 0:
        pytest.skip("needs root for ownership")
    directory = workdir / "tuner"
    prepare_dirs(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o711
    folder = prepare_job_dir(directory, JOB, 4321)
    info = folder.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o1770, 0, 4321)
    with PolicyFile(policy_path(directory, JOB)) as handle:
        handle.write(listed(COMM, None, 0, 0, TREE_SIMPLE))
    info = policy_path(directory, JOB).stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o640, 0, 4321)
    root_only = prepare_job_dir(directory, "other", None)
    assert stat.S_IMODE(root_only.stat().st_mode) == 0o700


def test_read_policy_rejects_what_the_plugin_rejects(tuner_dir):
    path = policy_path(tuner_dir, JOB)
    for case in BROKEN:
        image = broken_image(case)
        if image is None or len(image) < POLICY_SIZE or case == "odd seq":
            continue
        path.write_bytes(image)
        with pytest.raises(ValueError):
            read_policy(path, attempts=2)


@st.composite
def rules_st(draw: st.DrawFn) -> Rule:
    low = draw(st.integers(0, 1 << 30))
    return Rule(frozenset(draw(st.sets(st.sampled_from(list(Coll)), max_size=3))), low,
                draw(st.integers(low, U64_MAX)),
                tuple(draw(st.lists(st.builds(Pref, st.one_of(st.none(), st.sampled_from(
                    list(Algo))), st.one_of(st.none(), st.sampled_from(list(Proto)))),
                    max_size=4))), draw(st.integers(0, 128)))


@st.composite
def policies_st(draw: st.DrawFn) -> Policy:
    sets = draw(st.lists(st.lists(rules_st(), max_size=3).map(tuple), max_size=3))
    comms = []
    for i in range(draw(st.integers(0, 3))):
        pick = st.one_of(st.none(), st.integers(0, len(sets) - 1)) if sets else st.none()
        comms.append(CommEntry(COMM + i, draw(st.integers(0, 1 << 40)), draw(pick), draw(pick),
                               draw(st.integers(0, 2**32 - 1)), draw(st.booleans())))
    return Policy(draw(st.integers(0, 2**32 - 1)), tuple(comms), tuple(sets))


@settings(max_examples=200, deadline=None)
@given(policy=policies_st())
def test_encode_decode_round_trip(policy):
    assert decode_policy(encode_policy(policy)) == policy


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=policies_st(), calls=st.lists(st.tuples(
    st.sampled_from(list(Coll)), st.integers(0, 1 << 34), st.sampled_from([0, 2, 8, 64])),
    min_size=1, max_size=6))
def test_table_matches_reference(lib, tmp_path_factory, policy, calls):
    """For a fresh context that takes the policy at once, every answer is layout.apply's."""
    directory = tmp_path_factory.mktemp("apply")
    prepare_job_dir(directory, JOB, None)
    # Only entries the fresh context takes at collective 0 without waiting.
    comms = tuple(c for c in policy.comms if not c.pending)
    policy = Policy(policy.policy_id, comms, policy.rulesets)
    with PolicyFile(policy_path(directory, JOB)) as handle:
        handle.write(policy)
    for entry in policy.comms or (CommEntry(COMM),):
        with opened(lib, 5, directory, comm_id=entry.comm_id) as ctx:
            view = policy.view(entry.comm_id)
            for i, (coll, nbytes, given_channels) in enumerate(calls):
                if evaluate(Held(), view, 0)[0] is not Verdict.ACCEPT:
                    break
                out, channels = ctx.call(coll, nbytes, nccl_table(), given_channels)
                want, _ = apply(policy, entry.comm_id, i, coll, nbytes, nccl_table(),
                                given_channels)
                assert table_bytes(out) == table_bytes(want)
                assert channels == given_channels  # no capping NCCL in this process


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
