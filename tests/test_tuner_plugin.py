"""The NCCL tuner plugin (native/tuner), driven through its C ABI with ctypes.

Each test loads ``libnccl-tuner-harmonaize.so``, calls the exported
``ncclTunerPlugin_vN`` structs' function pointers the way NCCL does (a
contiguous ``float[numAlgo][numProto]`` cast to ``float**``), and checks the
result against explicit expectations and against ``agent.tuning.shm.apply``,
the Python reference of the same semantics.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.tuning.shm import (
    CHECKSUM_OFFSET,
    HEARTBEAT_OFFSET,
    POLICY_SIZE,
    RULESET_SIZE,
    RULESETS_OFFSET,
    SEQ_OFFSET,
    STATS_SIZE,
    U64_MAX,
    Algo,
    Coll,
    CommEntry,
    Policy,
    PolicyFile,
    Pref,
    Proto,
    Rule,
    apply,
    checksum,
    decode_policy,
    encode_policy,
    policy_path,
    pseudo_comm_id,
    read_policy,
    read_stats,
    validate_job,
)

pytestmark = pytest.mark.tuning

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
JOB = "job-1"
COMM = 0x0123456789ABCDEF
N_RANKS, N_NODES = 16, 2
HOUR_NS = 3600 * 10**9
VERSIONS = (3, 4, 5, 6)

# ---- The ABI, mirrored with ctypes. ----

LOGGER = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p
)
INIT_V3 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
)
INIT_V5 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, ctypes.c_size_t,
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
)
COLLINFO_V3 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
    ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
)
COLLINFO_V4 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
)
DESTROY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
CHUNK_SIZE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
    ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
)


class TunerV3(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V3), ("getCollInfo", COLLINFO_V3),
                ("destroy", DESTROY)]


class TunerV4(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V3), ("getCollInfo", COLLINFO_V4),
                ("destroy", DESTROY)]


class TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V5), ("getCollInfo", COLLINFO_V4),
                ("finalize", DESTROY)]


class TunerV6(ctypes.Structure):
    _fields_ = [*TunerV5._fields_, ("getChunkSize", CHUNK_SIZE)]


STRUCTS: dict[int, type[ctypes.Structure]] = {3: TunerV3, 4: TunerV4, 5: TunerV5, 6: TunerV6}

Table = list[list[float]]
GUARD = [5.0, 6.0, 7.0, 8.0]


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


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
        flat = list(array)[:size]
        return [flat[a * num_proto:(a + 1) * num_proto] for a in range(num_algo)], channels.value

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


def publish(directory: Path, policy: Policy, heartbeat_ns: int | None = None) -> None:
    with PolicyFile(policy_path(directory, JOB)) as pf:
        pf.write(policy, heartbeat_ns)


def listed(key: int, before: int | None, after: int | None = None, activate_at: int = 0,
           *rulesets: tuple[Rule, ...], policy_id: int = 7, stale_after_ns: int = HOUR_NS
           ) -> Policy:
    return Policy(policy_id, (CommEntry(key, activate_at, before, after),), rulesets,
                  stale_after_ns)


# A policy that changes something for every call it applies to.
RULES = (
    Rule(frozenset({Coll.ALL_REDUCE}), 0, 1 << 20, (Pref(Algo.RING, Proto.LL128),)),
    Rule(frozenset(), 0, U64_MAX, (Pref(Algo.TREE, Proto.SIMPLE),), max_channels=4),
)


# ---- Exports. ----


def test_exports_v3_to_v6_and_not_v1_v2(lib):
    for version in VERSIONS:
        tuner = STRUCTS[version].in_dll(lib, f"ncclTunerPlugin_v{version}")
        assert tuner.name == b"HarmonAIze"
        assert tuner.init and tuner.getCollInfo
    # v2 cannot see the cost table, so it could make NCCL run a disabled
    # combination; it is deliberately not exported (nor v1).
    for version in (1, 2):
        with pytest.raises(ValueError):
            ctypes.c_void_p.in_dll(lib, f"ncclTunerPlugin_v{version}")
    # v6's chunk-size callback is NULL: NCCL keeps its own chunk size.
    assert not TunerV6.in_dll(lib, "ncclTunerPlugin_v6").getChunkSize


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_exports_nothing_else(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIBRARY)], capture_output=True,
                         text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == {f"ncclTunerPlugin_v{v}" for v in VERSIONS}


# ---- Following the policy. ----


@pytest.mark.parametrize("num_algo", [6, 7])
@pytest.mark.parametrize("version", VERSIONS)
def test_follows_policy(lib, workdir, version, num_algo):
    publish(workdir, listed(comm_key(version), 0, 0, 0, RULES))
    base = nccl_table(num_algo)
    with opened(lib, version, workdir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 4096, base) == (zeroed(base, Algo.RING, Proto.LL128), 0)
        assert ctx.call(Coll.ALL_GATHER, 8 << 20, base, 8) == (
            zeroed(base, Algo.TREE, Proto.SIMPLE), 4)
        # 2 MiB AllReduce is past the first rule's range: the catch-all applies.
        assert ctx.call(Coll.ALL_REDUCE, 2 << 20, base) == (
            zeroed(base, Algo.TREE, Proto.SIMPLE), 4)


def test_pat_preference_is_bounded_by_num_algo(lib, workdir):
    rules = (Rule(prefs=(Pref(Algo.PAT, Proto.SIMPLE), Pref(Algo.RING, Proto.SIMPLE))),)
    publish(workdir, listed(COMM, 0, 0, 0, rules))
    with opened(lib, 5, workdir) as ctx:
        # NCCL < 2.23 has 6 algorithms: PAT (6) is out of the table there.
        assert ctx.call(Coll.ALL_GATHER, 1024, nccl_table(6))[0] == zeroed(
            nccl_table(6), Algo.RING, Proto.SIMPLE)
        assert ctx.call(Coll.ALL_GATHER, 1024, nccl_table(7))[0] == zeroed(
            nccl_table(7), Algo.PAT, Proto.SIMPLE)


def test_preferences_are_bounded_by_num_proto(lib, workdir):
    rules = (Rule(prefs=(Pref(Algo.PAT, Proto.SIMPLE), Pref(Algo.TREE, Proto.SIMPLE),
                         Pref(Algo.RING, Proto.LL128))),)
    publish(workdir, listed(COMM, 0, 0, 0, rules))
    narrow = [row[:2] for row in nccl_table()]  # a table without a SIMPLE column
    with opened(lib, 5, workdir) as ctx:
        assert ctx.call(Coll.ALL_GATHER, 1024, narrow)[0] == zeroed(narrow, Algo.RING, Proto.LL128)


def test_wildcard_picks_the_cheapest_enabled_entry(lib, workdir):
    rules = (Rule(prefs=(Pref(None, Proto.LL),)), )
    publish(workdir, listed(COMM, 0, 0, 0, rules))
    with opened(lib, 6, workdir) as ctx:
        # LL column: TREE 18.5, RING 15.0, NVLS 12.0 (cheapest), PAT 25.0.
        assert ctx.call(Coll.ALL_REDUCE, 64, nccl_table())[0] == zeroed(
            nccl_table(), Algo.NVLS, Proto.LL)


def test_ties_go_to_the_first_entry_in_table_order(lib, workdir):
    base = nccl_table()
    base[Algo.TREE][Proto.LL128] = base[Algo.PAT][Proto.LL] = 3.0  # tied cheapest
    publish(workdir, listed(COMM, 0, 0, 0, (Rule(prefs=(Pref(),)),)))
    with opened(lib, 5, workdir) as ctx:
        out, _ = ctx.call(Coll.ALL_REDUCE, 1, base)
    # Every rank must pick alike; the rule is (algo, proto) row-major order.
    assert out == zeroed(base, Algo.TREE, Proto.LL128)
    assert out == apply(listed(COMM, 0, 0, 0, (Rule(prefs=(Pref(),)),)), COMM, 0,
                        Coll.ALL_REDUCE, 1, base, 0)[0]


def test_never_revives_an_ignored_entry(lib, workdir):
    base = nccl_table()
    base[Algo.RING][Proto.LL128] = -1.0
    rules = (
        Rule(frozenset({Coll.ALL_REDUCE}), prefs=(Pref(Algo.RING, Proto.LL128),
                                                  Pref(None, Proto.SIMPLE))),
        Rule(frozenset({Coll.BROADCAST}), prefs=(Pref(Algo.COLLNET_DIRECT, None),
                                                 Pref(Algo.NVLS_TREE, Proto.LL))),
    )
    publish(workdir, listed(COMM, 0, 0, 0, rules))
    with opened(lib, 5, workdir) as ctx:
        # First pref names a disabled entry: skipped; the second's cheapest
        # enabled SIMPLE entry (NVLS 30.0) wins.
        out, _ = ctx.call(Coll.ALL_REDUCE, 1 << 20, base)
        assert out == zeroed(base, Algo.NVLS, Proto.SIMPLE)
        assert out[Algo.RING][Proto.LL128] == -1.0
        # Every pref names only disabled entries: the table stays as it was.
        out, _ = ctx.call(Coll.BROADCAST, 1 << 20, base)
        assert table_bytes(out) == table_bytes(base)


@pytest.mark.parametrize(("given", "cap", "expected"), [
    (0, 4, 4),    # NCCL decides -> capped
    (8, 4, 4),    # lowered
    (2, 4, 2),    # never raised
    (4, 4, 4),
    (0, 0, 0),    # no cap: untouched
    (6, 0, 6),
])
def test_channels_only_ever_lowered(lib, workdir, given, cap, expected):
    publish(workdir, listed(COMM, 0, 0, 0, (Rule(max_channels=cap),)))
    with opened(lib, 5, workdir) as ctx:
        table, channels = ctx.call(Coll.ALL_REDUCE, 1 << 20, nccl_table(), given)
        assert channels == expected
        assert table == nccl_table()  # a rule without prefs leaves the table alone


@pytest.mark.parametrize("version", VERSIONS)
def test_switches_exactly_at_activate_at(lib, workdir, version):
    before = (Rule(prefs=(Pref(Algo.RING, Proto.SIMPLE),)),)
    after = (Rule(prefs=(Pref(Algo.TREE, Proto.LL),), max_channels=2),)
    publish(workdir, listed(comm_key(version), 0, 1, 5, before, after))
    base = nccl_table()
    with opened(lib, version, workdir) as ctx:
        results = [ctx.call(Coll.ALL_REDUCE, 4096, base) for _ in range(8)]
    assert results[4] == (zeroed(base, Algo.RING, Proto.SIMPLE), 0)  # n = activate_at - 1
    assert results[5] == (zeroed(base, Algo.TREE, Proto.LL), 2)  # n = activate_at
    assert results[:5] == [results[0]] * 5 and results[5:] == [results[5]] * 3


def test_no_ruleset_means_nccls_choice_until_activation(lib, workdir):
    publish(workdir, listed(COMM, None, 0, 3, RULES))
    base = nccl_table()
    with opened(lib, 6, workdir) as ctx:
        results = [ctx.call(Coll.ALL_REDUCE, 4096, base, 8) for _ in range(4)]
    assert results[:3] == [(base, 8)] * 3
    assert results[3] == (zeroed(base, Algo.RING, Proto.LL128), 8)


@pytest.mark.parametrize("version", VERSIONS)
def test_unlisted_communicator_untouched(lib, workdir, version):
    other = pseudo_comm_id(N_RANKS * 2, N_NODES) if version < 5 else COMM + 1
    publish(workdir, listed(other, 0, 0, 0, RULES))
    base = nccl_table()
    with opened(lib, version, workdir) as ctx:
        for coll, nbytes, given in [(Coll.ALL_REDUCE, 4096, 0), (Coll.ALL_GATHER, 1 << 24, 8)]:
            out, channels = ctx.call(coll, nbytes, base, given)
            assert table_bytes(out) == table_bytes(base) and channels == given


# ---- Anything wrong -> NCCL's own choice, byte for byte. ----


def _patch(offset: int, fmt: str, value: int, fix_checksum: bool = True
           ) -> Callable[[bytearray], bytes]:
    def mutate(image: bytearray) -> bytes:
        struct.pack_into(fmt, image, offset, value)
        if fix_checksum:
            struct.pack_into("<I", image, CHECKSUM_OFFSET, checksum(image))
        return bytes(image)
    return mutate


def _flip(offset: int) -> Callable[[bytearray], bytes]:
    def mutate(image: bytearray) -> bytes:
        image[offset] ^= 0x40
        return bytes(image)
    return mutate


def _heartbeat_ahead(image: bytearray) -> bytes:
    # Evaluated when the test runs: an hour in the future of that moment.
    struct.pack_into("<Q", image, HEARTBEAT_OFFSET, time.monotonic_ns() + HOUR_NS)
    return bytes(image)


RULE0 = RULESETS_OFFSET + 8  # first rule of ruleset 0

BROKEN: dict[str, Callable[[bytearray], bytes] | None] = {
    "missing": None,
    "wrong magic": _patch(0, "<I", 0x50545A49),
    "wrong version": _patch(4, "<H", 2),
    "wrong header size": _patch(6, "<H", 128),
    "bad checksum": _flip(RULE0 + 9),
    "checksum field": _flip(CHECKSUM_OFFSET),
    "truncated by one byte": lambda image: bytes(image[:POLICY_SIZE - 1]),
    "truncated to one page": lambda image: bytes(image[:4096]),
    "empty": lambda image: b"",
    "odd seq": _patch(SEQ_OFFSET, "<Q", 3, fix_checksum=False),
    # stale_after sits outside the checksum (like the heartbeat); 1 µs has
    # passed since the heartbeat by the time of the first call.
    "stale heartbeat": _patch(24, "<Q", 1000, fix_checksum=False),
    "heartbeat ahead": _heartbeat_ahead,
    "too many comms": _patch(36, "<H", 33),
    "too many rulesets": _patch(38, "<H", 17),
    "after index out of range": _patch(64 + 18, "<H", 5),
    "before index out of range": _patch(64 + 16, "<H", 1),
    "too many rules": _patch(RULESETS_OFFSET, "<I", 17),
    "too many prefs": _patch(RULE0 + 24, "<B", 5),
    "unknown algorithm": _patch(RULE0 + 26, "<B", 0x72),
    "unknown protocol": _patch(RULE0 + 26, "<B", 0x13),
    "unknown collective bit": _patch(RULE0, "<I", 1 << 9),
    "min above max": _patch(RULE0 + 8, "<Q", 1 << 40),
    "channels beyond int": _patch(RULE0 + 4, "<I", 1 << 31),
    "duplicate communicator": _patch(64 + 32, "<Q", COMM),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_unusable_policy_leaves_nccl_alone(lib, workdir, case):
    policy = Policy(3, (CommEntry(COMM, 0, None, 0), CommEntry(COMM + 1, 0, 0, 0)), (RULES,),
                    HOUR_NS)
    mutate = BROKEN[case]
    if mutate is not None:
        image = bytearray(encode_policy(policy, seq=2, heartbeat_ns=time.monotonic_ns()))
        policy_path(workdir, JOB).write_bytes(mutate(image))
    base = nccl_table()
    with opened(lib, 5, workdir) as ctx:
        for coll, nbytes, given in [(Coll.ALL_REDUCE, 4096, 0), (Coll.ALL_GATHER, 1 << 24, 8),
                                    (Coll.ALL_REDUCE, 4096, 0)]:
            out, channels = ctx.call(coll, nbytes, base, given)
            assert table_bytes(out) == table_bytes(base) and channels == given
        [slot] = read_stats(workdir, JOB)
        assert (slot.fallbacks, slot.policy_id_applied, slot.collectives) == (3, 0, 3)


def test_control_unbroken_policy_applies(lib, workdir):
    """The same image as above without the damage: the damage is what counts."""
    policy = Policy(3, (CommEntry(COMM, 0, None, 0), CommEntry(COMM + 1, 0, 0, 0)), (RULES,),
                    HOUR_NS)
    image = encode_policy(policy, seq=2, heartbeat_ns=time.monotonic_ns())
    policy_path(workdir, JOB).write_bytes(image)
    with opened(lib, 5, workdir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 4096, nccl_table())[0] != nccl_table()


def test_inert_without_a_valid_job(lib, workdir):
    publish(workdir, listed(COMM, 0, 0, 0, RULES))
    messages: list[tuple[int, bytes]] = []

    @LOGGER
    def logger(level, flags, file, line, fmt):
        messages.append((level, fmt))

    for job in (None, "", "a/b", "x" * 129, "has space", "tab\t"):
        messages.clear()
        with opened(lib, 5, workdir, job=job, logger=logger) as ctx:
            assert ctx.handle.value is None  # no context: nothing to do per call
            out, channels = ctx.call(Coll.ALL_REDUCE, 4096, nccl_table(), 8)
            assert (out, channels) == (nccl_table(), 8)
        assert len(messages) == 1 and b"HARMONAIZE_JOB" in messages[0][1]
    # The longest legal name works.
    with opened(lib, 5, workdir, job="J" * 128) as ctx:
        assert ctx.handle.value is not None


def test_odd_arguments_never_fail(lib, workdir):
    key = pseudo_comm_id(N_RANKS, N_NODES)
    publish(workdir, listed(key, 0, 0, 0, (Rule(prefs=(Pref(None, None),), max_channels=2),)))
    with opened(lib, 4, workdir) as ctx:
        tuner, handle = ctx.tuner, ctx.handle
        channels = ctypes.c_int(0)
        # NULL table: channels still capped.
        assert tuner.getCollInfo(handle, 4, 1, 1, None, 7, 3, 0, ctypes.byref(channels)) == 0
        assert channels.value == 2
        # NULL nChannels, empty or negative extents, collectives NCCL added later.
        zeroed_any = []
        for num_algo, num_proto, coll in [(0, 3, 4), (7, 0, 4), (-1, 3, 4), (7, 3, -1),
                                          (7, 3, 14), (7, 3, 1 << 30)]:
            array = (ctypes.c_float * 21)(*([1.0] * 21))
            assert tuner.getCollInfo(handle, coll, U64_MAX, 1, ctypes.cast(array, ctypes.c_void_p),
                                     num_algo, num_proto, 1, None) == 0
            zeroed_any.append(0.0 in list(array))
        # The catch-all rule (mask 0) matches any collType; bad extents skip the table.
        assert zeroed_any == [False, False, False, True, True, True]


# ---- Live updates. ----


def test_policy_written_after_init_is_picked_up(lib, workdir):
    base = nccl_table()
    with opened(lib, 6, workdir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 4096, base) == (base, 0)
        publish(workdir, listed(COMM, 0, 0, 0, RULES))
        # Reopening is amortised: init tried, the next try is on the 4096th
        # call, so call n = 4096 is the first to see the policy.
        results = [ctx.call(Coll.ALL_REDUCE, 4096, base) for _ in range(4096)]
    assert results[:4095] == [(base, 0)] * 4095
    assert results[4095] == (zeroed(base, Algo.RING, Proto.LL128), 0)


def test_policy_update_while_running_applies_on_the_next_call(lib, workdir):
    base = nccl_table()
    path = policy_path(workdir, JOB)
    with PolicyFile(path) as pf:
        pf.write(listed(COMM, 0, 0, 0, RULES, policy_id=1))
        second = (Rule(prefs=(Pref(Algo.PAT, None),)),)
        with opened(lib, 5, workdir) as ctx:
            assert ctx.call(Coll.ALL_REDUCE, 4096, base)[0] == zeroed(base, Algo.RING, Proto.LL128)
            seq = pf.seq
            pf.write(listed(COMM, 0, 0, 0, second, policy_id=2, stale_after_ns=10**9))
            assert pf.seq == seq + 2
            assert ctx.call(Coll.ALL_REDUCE, 4096, base)[0] == zeroed(base, Algo.PAT, Proto.LL)
            assert read_stats(workdir, JOB)[0].policy_id_applied == 2
            # Withdrawn (heartbeat stops): back to NCCL's choice.
            pf.heartbeat(time.monotonic_ns() - 2 * 10**9)
            assert ctx.call(Coll.ALL_REDUCE, 4096, base) == (base, 0)
            pf.heartbeat()
            assert ctx.call(Coll.ALL_REDUCE, 4096, base)[0] == zeroed(base, Algo.PAT, Proto.LL)


def test_mid_write_keeps_following_the_last_good_copy(lib, workdir):
    """Seq odd after a good copy: the agent is mid-write. The plugin keeps the
    copy it has (which the other ranks share) instead of NCCL's own choice."""
    base = nccl_table()
    path = policy_path(workdir, JOB)
    publish(workdir, listed(COMM, 0, 0, 0, RULES))
    following = (zeroed(base, Algo.RING, Proto.LL128), 0)
    with opened(lib, 5, workdir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 4096, base) == following
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, struct.pack("<Q", 3), SEQ_OFFSET)  # odd: a write has begun
            assert ctx.call(Coll.ALL_REDUCE, 4096, base) == following
            # The writer finishes with a body that fails validation: now NCCL decides.
            os.pwrite(fd, b"\xff", RULE0 + 9)
            os.pwrite(fd, struct.pack("<Q", 4), SEQ_OFFSET)
            assert ctx.call(Coll.ALL_REDUCE, 4096, base) == (base, 0)
        finally:
            os.close(fd)


def test_concurrent_rewrites_never_mix_policies(lib, workdir):
    """A writer thread republishes while getCollInfo runs (ctypes drops the
    GIL during the call): every call sees A, B, or NCCL's own choice."""
    base = nccl_table()
    policy_a = listed(COMM, 0, 0, 0, (Rule(prefs=(Pref(Algo.RING, Proto.LL),),
                                           max_channels=3),), policy_id=1)
    policy_b = listed(COMM, 0, 0, 0, (Rule(prefs=(Pref(Algo.TREE, Proto.SIMPLE),),
                                           max_channels=5),), policy_id=2)
    answers = {(table_bytes(base), 0),
               (table_bytes(zeroed(base, Algo.RING, Proto.LL)), 3),
               (table_bytes(zeroed(base, Algo.TREE, Proto.SIMPLE)), 5)}
    stop = threading.Event()
    with PolicyFile(policy_path(workdir, JOB)) as pf:
        pf.write(policy_a)

        def rewrite() -> None:
            while not stop.is_set():
                pf.write(policy_b)
                pf.write(policy_a)

        writer = threading.Thread(target=rewrite)
        with opened(lib, 5, workdir) as ctx:
            writer.start()
            try:
                for _ in range(2000):
                    out, channels = ctx.call(Coll.ALL_REDUCE, 4096, base)
                    assert (table_bytes(out), channels) in answers
            finally:
                stop.set()
                writer.join()
            pf.write(policy_b)
            assert ctx.call(Coll.ALL_REDUCE, 4096, base) == (
                zeroed(base, Algo.TREE, Proto.SIMPLE), 5)


def test_replaced_file_is_picked_up_once_the_old_one_is_stale(lib, workdir):
    base = nccl_table()
    publish(workdir, listed(COMM, 0, 0, 0, RULES, policy_id=1, stale_after_ns=10**9))
    with opened(lib, 5, workdir) as ctx:
        assert ctx.call(Coll.ALL_REDUCE, 4096, base)[0] == zeroed(base, Algo.RING, Proto.LL128)
        # The old agent's last heartbeat is long ago; a new agent replaced the file.
        with PolicyFile(policy_path(workdir, JOB)) as pf:
            pf.heartbeat(1)
        policy_path(workdir, JOB).unlink()
        publish(workdir, listed(COMM, 0, 0, 0, (Rule(prefs=(Pref(Algo.TREE, Proto.LL),)),),
                                policy_id=2))
        results = [ctx.call(Coll.ALL_REDUCE, 4096, base)[0] for _ in range(4097)]
        assert results[0] == base  # stale mapping: NCCL's choice
        assert results[-1] == zeroed(base, Algo.TREE, Proto.LL)  # reopened within 4096 calls


# ---- Stats. ----


def test_stats_show_counter_and_policy(lib, workdir):
    publish(workdir, listed(COMM, 0, 0, 0, RULES, policy_id=41))
    with opened(lib, 5, workdir) as a, opened(lib, 3, workdir, n_ranks=4, n_nodes=1) as b:
        for _ in range(10):
            a.call(Coll.ALL_REDUCE, 4096, nccl_table())
        b.call(Coll.ALL_REDUCE, 4096, nccl_table())
        slots = sorted(read_stats(workdir, JOB), key=lambda s: s.comm_id)
        stats_file = workdir / f"{JOB}.{os.getpid()}.stats"
        assert stat.S_IMODE(stats_file.stat().st_mode) == 0o644
        assert stats_file.stat().st_size == STATS_SIZE
    assert [(s.pid, s.comm_id, s.n_ranks, s.n_nodes, s.collectives, s.policy_id_applied,
             s.fallbacks) for s in slots] == [
        (os.getpid(), COMM, N_RANKS, N_NODES, 10, 41, 0),
        (os.getpid(), pseudo_comm_id(4, 1), 4, 1, 1, 41, 0),
    ]
    # The last context of the process removes the file.
    assert not stats_file.exists()
    assert read_stats(workdir, JOB) == []


def test_missing_directory_is_harmless(lib, workdir):
    missing = workdir / "absent"
    with opened(lib, 5, missing) as ctx:
        assert ctx.handle.value is not None
        assert ctx.call(Coll.ALL_REDUCE, 4096, nccl_table()) == (nccl_table(), 0)
    assert not missing.exists()


def test_read_stats_skips_malformed_files(workdir):
    good = bytearray(STATS_SIZE)
    struct.pack_into("<IHHII", good, 0, 0x53545A48, 1, 32, 1234, 0)
    struct.pack_into("<QIIQQQII", good, 16, 99, 8, 1, 5, 3, 0, 1, 0)
    (workdir / f"{JOB}.1234.stats").write_bytes(good)
    bad = {
        "1.stats": b"garbage",
        "2.stats": bytes(good[:-1]),
        "3.stats": bytes(good),  # header pid 1234 does not match the name
        "4.stats": bytes(good[:40]) + b"\x07" + bytes(good[41:]),  # in_use 7
    }
    for suffix, data in bad.items():
        (workdir / f"{JOB}.{suffix}").write_bytes(data)
    (workdir / f"{JOB}.99.stats").mkdir()  # not even a file
    (workdir / f"{JOB}x.5.stats").write_bytes(b"other job")
    slots = read_stats(workdir, JOB)
    assert [(s.pid, s.comm_id, s.collectives, s.policy_id_applied) for s in slots] == [
        (1234, 99, 5, 3)]
    assert slots.malformed == 5
    assert read_stats(workdir / "nope", JOB) == []


# ---- The Python side of the policy. ----


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Policy(1, tuple(CommEntry(i) for i in range(33))), "at most 32"),
    (lambda: Policy(1, (), ((),) * 17), "at most 16 rulesets"),
    (lambda: Policy(1, (), ((Rule(),) * 17,)), "at most 16"),
    (lambda: Policy(1, (CommEntry(1, 0, 1),), ((),)), "names ruleset 1"),
    (lambda: Policy(1, (CommEntry(1), CommEntry(1)), ()), "listed twice"),
    (lambda: Policy(2**32), "policy_id"),
    (lambda: Rule(min_bytes=10, max_bytes=9), "exceeds max_bytes"),
    (lambda: Rule(prefs=(Pref(),) * 5), "at most 4"),
    (lambda: Rule(max_channels=2**31), "max_channels"),
    (lambda: Rule(colls=frozenset({8})), "bad collective"),
    (lambda: Pref(7, None), "bad preference"),
    (lambda: CommEntry(-1), "comm_id"),
    (lambda: CommEntry(1, 0, 16), "before"),
])
def test_policy_validation(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_validate_job():
    assert validate_job("a.b:c@d+e-f_9") == "a.b:c@d+e-f_9"
    for bad in ("", "a/b", "x" * 129, "é"):
        with pytest.raises(ValueError, match="job name"):
            validate_job(bad)


def test_policy_file_round_trip_and_modes(workdir):
    path = workdir / "new" / f"{JOB}.policy"
    policy = listed(COMM, 0, 1, 9, RULES, (Rule(frozenset({Coll.SEND, Coll.RECV}), 5, 5),))
    old_umask = os.umask(0o077)
    try:
        pf = PolicyFile(path)
    finally:
        os.umask(old_umask)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
        assert read_policy(path) == Policy(0, stale_after_ns=0)  # created empty and stale
        pf.write(policy, heartbeat_ns=1234)
        assert read_policy(path) == policy
        assert pf.seq == 2
        assert struct.unpack_from("<Q", path.read_bytes(), HEARTBEAT_OFFSET)[0] == 1234
    finally:
        pf.remove()
    assert not path.exists()
    # An existing file is rewritten in place (same inode), so mappings follow it.
    with PolicyFile(path) as first:
        inode = path.stat().st_ino
        first.write(policy)
    with PolicyFile(path) as second:
        second.write(Policy(5))
        assert second.seq == 4
    assert path.stat().st_ino == inode and read_policy(path) == Policy(5)


def test_read_policy_rejects_what_the_plugin_rejects(workdir):
    path = workdir / "p.policy"
    image = bytearray(encode_policy(listed(COMM, 0, 0, 0, RULES), seq=2))
    for mutate, message in [(_patch(SEQ_OFFSET, "<Q", 5, False), "being rewritten"),
                            (_flip(RULE0 + 9), "checksum"),
                            (lambda i: bytes(i[:100]), "100 bytes"),
                            (_patch(RULE0 + 26, "<B", 0x72), "bad preference")]:
        path.write_bytes(mutate(bytearray(image)))
        with pytest.raises(ValueError, match=message):
            read_policy(path, attempts=2)


# ---- Property-based: the C plugin against the Python reference. ----

SIZES = st.sampled_from([0, 1, 1023, 1024, 4096, 65536, 1 << 20, 1 << 30, U64_MAX])
prefs_st = st.builds(Pref, st.none() | st.sampled_from(Algo), st.none() | st.sampled_from(Proto))


@st.composite
def rules_st(draw: st.DrawFn) -> Rule:
    low, high = sorted((draw(SIZES), draw(SIZES)))
    return Rule(draw(st.frozensets(st.sampled_from(Coll), max_size=3)), low, high,
                tuple(draw(st.lists(prefs_st, max_size=4))),
                draw(st.sampled_from([0, 0, 1, 2, 4, 8, 32])))


@st.composite
def policies_st(draw: st.DrawFn, key: int) -> Policy:
    rulesets = draw(st.lists(st.lists(rules_st(), max_size=4).map(tuple), max_size=3))
    index = st.none() | (st.integers(0, len(rulesets) - 1) if rulesets else st.nothing())
    others = draw(st.lists(st.integers(0, U64_MAX).filter(lambda c: c != key), max_size=2,
                           unique=True))
    ids = [key, *others] if draw(st.booleans()) or not others else others
    comms = [CommEntry(c, draw(st.integers(0, 6)), draw(index), draw(index)) for c in ids]
    return Policy(draw(st.integers(0, 2**32 - 1)), tuple(draw(st.permutations(comms))),
                  tuple(rulesets), HOUR_NS)


COSTS = st.one_of(st.just(-1.0), st.sampled_from([0.0, 1.0, 2.0]),
                  st.floats(0, 1e4, width=32))
tables_st = st.sampled_from([6, 7]).flatmap(
    lambda a: st.lists(st.lists(COSTS, min_size=3, max_size=3), min_size=a, max_size=a))
calls_st = st.lists(st.tuples(st.integers(0, 7), SIZES, st.sampled_from([0, 1, 2, 4, 8, 64]),
                              tables_st), min_size=1, max_size=9)


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hz-tuner-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_invariants(given: Table, out: Table, ch_in: int, ch_out: int) -> None:
    changed = [(a, p) for a in range(len(given)) for p in range(3)
               if struct.pack("<f", given[a][p]) != struct.pack("<f", out[a][p])]
    assert len(changed) <= 1
    for a, p in changed:
        assert given[a][p] >= 0 and out[a][p] == 0.0  # never revived, only zeroed
    assert ch_out == ch_in or (ch_out > 0 and (ch_in == 0 or ch_out < ch_in))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), version=st.sampled_from(VERSIONS), calls=calls_st)
def test_plugin_matches_reference(lib, data, version, calls):
    key = comm_key(version)
    policy = data.draw(policies_st(key))
    with scratch() as directory:
        publish(directory, policy)
        with opened(lib, version, directory) as ctx:
            for n, (coll, nbytes, channels, table) in enumerate(calls):
                given = [[f32(v) for v in row] for row in table]
                out, ch_out = ctx.call(coll, nbytes, given, channels)
                want, ch_want = apply(policy, key, n, coll, nbytes, given, channels)
                assert (table_bytes(out), ch_out) == (table_bytes(want), ch_want)
                check_invariants(given, out, channels, ch_out)


@st.composite
def damaged_st(draw: st.DrawFn) -> bytes:
    policy = draw(policies_st(COMM))
    image = bytearray(encode_policy(policy, seq=2, heartbeat_ns=time.monotonic_ns()))
    # A hostile writer may also fix the checksum up, which reaches the
    # structural checks; bias the flips towards the structured regions.
    region = draw(st.sampled_from([(0, 64), (64, RULESETS_OFFSET),
                                   (RULESETS_OFFSET, RULESETS_OFFSET + 3 * RULESET_SIZE),
                                   (0, POLICY_SIZE)]))
    for _ in range(draw(st.integers(0, 4))):
        image[draw(st.integers(region[0], region[1] - 1))] ^= draw(st.integers(1, 255))
    if draw(st.booleans()):
        struct.pack_into("<I", image, CHECKSUM_OFFSET, checksum(image))
    if draw(st.integers(0, 9)) == 0:
        image = image[:draw(st.integers(0, POLICY_SIZE - 1))]
    return bytes(image)


def freshness(heartbeat: int, stale_after: int, start: int, end: int) -> set[bool]:
    """Whether the plugin may have found the policy fresh (True) or stale
    (False) at some instant in [start, end]. Fresh at t iff (t - heartbeat)
    mod 2**64 <= stale_after: an arc, entered at `heartbeat` and left at
    `heartbeat + stale_after + 1`."""
    if stale_after == U64_MAX:
        return {True}

    def fresh(t: int) -> bool:
        return (t - heartbeat) % 2**64 <= stale_after

    def inside(t: int) -> bool:
        return 0 < (t - start) % 2**64 <= end - start

    states = {fresh(start), fresh(end)}
    if inside(heartbeat):
        states.add(True)
    if inside(heartbeat + stale_after + 1):
        states.add(False)
    return states


def usable_policy(image: bytes) -> Policy | None:
    """The policy the plugin accepts from this file, staleness aside."""
    if len(image) < POLICY_SIZE or struct.unpack_from("<Q", image, SEQ_OFFSET)[0] % 2:
        return None
    try:
        return decode_policy(image)
    except ValueError:
        return None


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(image=damaged_st(), calls=calls_st)
def test_damaged_policy_never_misleads(lib, image, calls):
    with scratch() as directory:
        policy_path(directory, JOB).write_bytes(image)
        with opened(lib, 6, directory) as ctx:
            start = time.monotonic_ns()
            results = []
            for coll, nbytes, channels, table in calls:
                given = [[f32(v) for v in row] for row in table]
                results.append((given, channels, ctx.call(coll, nbytes, given, channels)))
            end = time.monotonic_ns()
    policy = usable_policy(image)
    states = {False}
    if policy is not None:
        heartbeat = struct.unpack_from("<Q", image, HEARTBEAT_OFFSET)[0]
        states = freshness(heartbeat, policy.stale_after_ns, start, end)
    for n, ((coll, nbytes, _, _), (given, channels, got)) in enumerate(zip(calls, results,
                                                                            strict=True)):
        acceptable = []
        if False in states:
            acceptable.append((table_bytes(given), channels))
        if True in states:
            assert policy is not None
            want, ch_want = apply(policy, COMM, n, coll, nbytes, given, channels)
            acceptable.append((table_bytes(want), ch_want))
        out, ch_out = got
        assert (table_bytes(out), ch_out) in acceptable
        check_invariants(given, out, channels, ch_out)


@settings(max_examples=60, deadline=None)
@given(policy=policies_st(COMM))
def test_encode_decode_round_trip(policy):
    assert decode_policy(encode_policy(policy, seq=4, heartbeat_ns=9)) == policy
