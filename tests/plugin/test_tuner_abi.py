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
import os
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.plugin.layout import (
    CHECKSUM_OFFSET,
    POLICY_SIZE,
    RULESETS_OFFSET,
    SEQ_OFFSET,
    U64_MAX,
    Algo,
    Coll,
    CommEntry,
    Policy,
    Pref,
    Proto,
    Rule,
    checksum,
    encode_policy,
    pseudo_comm_id,
)
from agent.plugin.shm import (
    PolicyFile,
    policy_path,
    prepare_dirs,
    prepare_job_dir,
    read_stats,
)
from testbed.plugin import STRUCTS

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


# Broken copies of a policy image: the damaged-files tests and the Python reader's share them.
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
