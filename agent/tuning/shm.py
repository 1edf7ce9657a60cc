"""Shared memory between the agent and the NCCL tuner plugin.

The agent publishes a *policy* per job in ``<dir>/<job>.policy``: for listed
communicators, which algorithm/protocol NCCL should prefer and how many
channels it may use, per collective and message size, switching from one
ruleset to another at an exact collective index (``activate_at``) so every
rank of a communicator switches on the same collective. The plugin
(``native/tuner/plugin.c``) maps the file read-only in the tenant's process
and reads it on every collective without locks, through a seqlock. It
reports per-communicator counters in ``<dir>/<job>.<pid>.stats``.

Both layouts are fixed-size, little-endian and naturally aligned; the byte
offsets here and in ``native/tuner/hz_shm.h`` must agree. :func:`decode_policy`
accepts exactly what the plugin accepts, and :func:`apply` computes exactly
what the plugin does to NCCL's cost table, so the tests use both as an
oracle for the C code.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

DEFAULT_DIR = Path("/run/harmonaize/tuner")

POLICY_MAGIC = 0x50545A48  # "HZTP"
LAYOUT_VERSION = 1
HEADER_SIZE = 64
MAX_COMMS = 32
MAX_RULESETS = 16
MAX_RULES = 16
MAX_PREFS = 4
NO_SET = 0xFFFF
ANY = 0xF
COMM_SIZE = 32
RULE_SIZE = 32
RULESET_SIZE = 8 + MAX_RULES * RULE_SIZE
COMMS_OFFSET = HEADER_SIZE
RULESETS_OFFSET = COMMS_OFFSET + MAX_COMMS * COMM_SIZE
POLICY_SIZE = RULESETS_OFFSET + MAX_RULESETS * RULESET_SIZE  # 9408
SEQ_OFFSET = 8
HEARTBEAT_OFFSET = 16
CHECKSUM_OFFSET = 40

STATS_MAGIC = 0x53545A48  # "HZTS"
STATS_VERSION = 1
STATS_SLOTS = 32
STATS_SIZE = 16 + STATS_SLOTS * 48  # 1552

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1

# magic, layout_version, header_size, seq, heartbeat_ns, stale_after_ns,
# policy_id, n_comms, n_rulesets, checksum, 20 reserved bytes
_HEADER = struct.Struct("<IHHQQQIHHI20x")
_COMM = struct.Struct("<QQHHIQ")  # comm_id, activate_at, before, after, reserved x2
_SET_HEAD = struct.Struct("<II")  # n_rules, reserved
_RULE = struct.Struct("<IIQQBx4sH")  # mask, max_channels, min, max, n_prefs, prefs, reserved
_STATS_HEADER = struct.Struct("<IHHII")  # magic, version, n_slots, pid, reserved
# comm_id, n_ranks, n_nodes, collectives, policy_id_applied, fallbacks, in_use, reserved
_STATS_SLOT = struct.Struct("<QIIQQQII")

assert _HEADER.size == HEADER_SIZE and _COMM.size == COMM_SIZE and _RULE.size == RULE_SIZE
assert _STATS_HEADER.size + STATS_SLOTS * _STATS_SLOT.size == STATS_SIZE

_JOB = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")


class Coll(IntEnum):
    """``ncclFunc_t``: bit k of a rule's collective mask is value k."""

    BROADCAST = 0
    REDUCE = 1
    ALL_GATHER = 2
    REDUCE_SCATTER = 3
    ALL_REDUCE = 4
    SEND_RECV = 5
    SEND = 6
    RECV = 7


class Algo(IntEnum):
    """Row of NCCL's cost table (PAT exists from NCCL 2.23)."""

    TREE = 0
    RING = 1
    COLLNET_DIRECT = 2
    COLLNET_CHAIN = 3
    NVLS = 4
    NVLS_TREE = 5
    PAT = 6


class Proto(IntEnum):
    """Column of NCCL's cost table."""

    LL = 0
    LL128 = 1
    SIMPLE = 2


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class Pref:
    """One preferred algorithm/protocol pair; ``None`` matches any."""

    algo: Algo | None = None
    proto: Proto | None = None

    def __post_init__(self) -> None:
        # Plain ints are accepted and normalised, so values read back compare equal.
        try:
            if self.algo is not None:
                object.__setattr__(self, "algo", Algo(self.algo))
            if self.proto is not None:
                object.__setattr__(self, "proto", Proto(self.proto))
        except ValueError as exc:
            raise ValueError(f"bad preference {self.algo!r}/{self.proto!r}: {exc}") from None

    def encode(self) -> int:
        algo = ANY if self.algo is None else int(self.algo)
        proto = ANY if self.proto is None else int(self.proto)
        return algo << 4 | proto

    @classmethod
    def decode(cls, byte: int) -> Pref:
        algo, proto = byte >> 4, byte & 0xF
        try:
            return cls(None if algo == ANY else Algo(algo), None if proto == ANY else Proto(proto))
        except ValueError:
            raise ValueError(f"bad preference byte {byte:#04x}") from None


@dataclass(frozen=True)
class Rule:
    """Applies to a collective in ``colls`` (empty: every one) of
    ``min_bytes..max_bytes`` (inclusive). The first preference that names an
    entry NCCL enabled wins; ``max_channels`` > 0 caps the channel count."""

    colls: frozenset[Coll] = frozenset()
    min_bytes: int = 0
    max_bytes: int = U64_MAX
    prefs: tuple[Pref, ...] = ()
    max_channels: int = 0

    def __post_init__(self) -> None:
        try:
            colls = frozenset(Coll(c) for c in self.colls)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad collective in {self.colls!r}: {exc}") from None
        object.__setattr__(self, "colls", colls)
        object.__setattr__(self, "prefs", tuple(self.prefs))
        _check_int("min_bytes", self.min_bytes, 0, U64_MAX)
        _check_int("max_bytes", self.max_bytes, 0, U64_MAX)
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"min_bytes {self.min_bytes} exceeds max_bytes {self.max_bytes}")
        if len(self.prefs) > MAX_PREFS:
            raise ValueError(f"a rule has at most {MAX_PREFS} preferences, got {len(self.prefs)}")
        if not all(isinstance(p, Pref) for p in self.prefs):
            raise ValueError("prefs must be Pref instances")
        _check_int("max_channels", self.max_channels, 0, INT32_MAX)

    @property
    def coll_mask(self) -> int:
        mask = 0
        for coll in self.colls:
            mask |= 1 << coll
        return mask

    def matches(self, coll: int, nbytes: int) -> bool:
        mask = self.coll_mask
        coll_ok = mask == 0 or (0 <= coll < 32 and bool(mask >> coll & 1))
        return coll_ok and self.min_bytes <= nbytes <= self.max_bytes


@dataclass(frozen=True)
class CommEntry:
    """A communicator under policy: ruleset ``before`` for collectives
    ``n < activate_at``, ``after`` from then on (``None``: NCCL's choice)."""

    comm_id: int
    activate_at: int = 0
    before: int | None = None
    after: int | None = None

    def __post_init__(self) -> None:
        _check_int("comm_id", self.comm_id, 0, U64_MAX)
        _check_int("activate_at", self.activate_at, 0, U64_MAX)
        for name in ("before", "after"):
            index = getattr(self, name)
            if index is not None:
                _check_int(f"{name} ruleset index", index, 0, MAX_RULESETS - 1)


@dataclass(frozen=True)
class Policy:
    """Everything the agent publishes for one job."""

    policy_id: int
    comms: tuple[CommEntry, ...] = ()
    rulesets: tuple[tuple[Rule, ...], ...] = ()
    #: The plugin ignores the policy once its heartbeat is older than this.
    stale_after_ns: int = 10_000_000_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "comms", tuple(self.comms))
        object.__setattr__(self, "rulesets", tuple(tuple(s) for s in self.rulesets))
        # policy_id 0 is legal but reads as "none" in the stats file.
        _check_int("policy_id", self.policy_id, 0, U32_MAX)
        _check_int("stale_after_ns", self.stale_after_ns, 0, U64_MAX)
        if len(self.comms) > MAX_COMMS:
            raise ValueError(f"at most {MAX_COMMS} communicators, got {len(self.comms)}")
        if len(self.rulesets) > MAX_RULESETS:
            raise ValueError(f"at most {MAX_RULESETS} rulesets, got {len(self.rulesets)}")
        for i, rules in enumerate(self.rulesets):
            if len(rules) > MAX_RULES:
                raise ValueError(f"ruleset {i} has {len(rules)} rules, at most {MAX_RULES}")
            if not all(isinstance(r, Rule) for r in rules):
                raise ValueError(f"ruleset {i} must hold Rule instances")
        seen: set[int] = set()
        for entry in self.comms:
            if not isinstance(entry, CommEntry):
                raise ValueError("comms must hold CommEntry instances")
            # The plugin would have to guess which entry counts; it refuses.
            if entry.comm_id in seen:
                raise ValueError(f"communicator {entry.comm_id:#x} is listed twice")
            seen.add(entry.comm_id)
            for index in (entry.before, entry.after):
                if index is not None and index >= len(self.rulesets):
                    raise ValueError(
                        f"communicator {entry.comm_id:#x} names ruleset {index}, "
                        f"but there are {len(self.rulesets)}"
                    )

    def entry(self, comm_id: int) -> CommEntry | None:
        return next((c for c in self.comms if c.comm_id == comm_id), None)


def validate_job(job: str) -> str:
    """The plugin's rule for ``HARMONAIZE_JOB``; the name becomes a file name."""
    if not _JOB.fullmatch(job):
        raise ValueError(f"job name must be 1-128 of [A-Za-z0-9._:@+-], got {job!r}")
    return job


def policy_path(directory: str | os.PathLike[str], job: str) -> Path:
    return Path(directory) / f"{validate_job(job)}.policy"


def pseudo_comm_id(n_ranks: int, n_nodes: int) -> int:
    """The key the plugin uses for a communicator under the v3/v4 ABI, which
    has no commId: all ranks of a communicator compute the same one."""
    return (1 << 63 | n_ranks << 20 | n_nodes) & U64_MAX


def _fnv1a(data: bytes | memoryview, h: int = 0x811C9DC5) -> int:
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def checksum(image: bytes | bytearray | memoryview) -> int:
    """FNV-1a 32 over bytes [32, 40) then [64, POLICY_SIZE) of a policy image."""
    view = memoryview(image)
    return _fnv1a(view[HEADER_SIZE:POLICY_SIZE], _fnv1a(view[32:40]))


def encode_policy(policy: Policy, *, seq: int = 0, heartbeat_ns: int = 0) -> bytes:
    """The full file image of ``policy``, checksum included."""
    image = bytearray(POLICY_SIZE)
    for i, entry in enumerate(policy.comms):
        _COMM.pack_into(
            image, COMMS_OFFSET + i * COMM_SIZE, entry.comm_id, entry.activate_at,
            NO_SET if entry.before is None else entry.before,
            NO_SET if entry.after is None else entry.after, 0, 0,
        )
    for s, rules in enumerate(policy.rulesets):
        base = RULESETS_OFFSET + s * RULESET_SIZE
        _SET_HEAD.pack_into(image, base, len(rules), 0)
        for r, rule in enumerate(rules):
            prefs = bytes(p.encode() for p in rule.prefs).ljust(MAX_PREFS, b"\0")
            _RULE.pack_into(
                image, base + 8 + r * RULE_SIZE, rule.coll_mask, rule.max_channels,
                rule.min_bytes, rule.max_bytes, len(rule.prefs), prefs, 0,
            )
    _HEADER.pack_into(
        image, 0, POLICY_MAGIC, LAYOUT_VERSION, HEADER_SIZE, seq, heartbeat_ns,
        policy.stale_after_ns, policy.policy_id, len(policy.comms), len(policy.rulesets), 0,
    )
    struct.pack_into("<I", image, CHECKSUM_OFFSET, checksum(image))
    return bytes(image)


def _decode_ruleset(image: bytes, index: int) -> tuple[Rule, ...]:
    base = RULESETS_OFFSET + index * RULESET_SIZE
    n_rules, _ = _SET_HEAD.unpack_from(image, base)
    if n_rules > MAX_RULES:
        raise ValueError(f"ruleset {index} claims {n_rules} rules")
    rules = []
    for r in range(n_rules):
        mask, max_channels, low, high, n_prefs, prefs, _ = _RULE.unpack_from(
            image, base + 8 + r * RULE_SIZE
        )
        if mask & ~0xFF:
            raise ValueError(f"ruleset {index} rule {r}: unknown collective bits {mask:#x}")
        if n_prefs > MAX_PREFS:
            raise ValueError(f"ruleset {index} rule {r}: {n_prefs} preferences")
        try:
            decoded = tuple(Pref.decode(b) for b in prefs[:n_prefs])
            rules.append(Rule(frozenset(c for c in Coll if mask >> c & 1), low, high, decoded,
                              max_channels))
        except ValueError as exc:
            raise ValueError(f"ruleset {index} rule {r}: {exc}") from None
    return tuple(rules)


def decode_policy(image: bytes) -> Policy:
    """Parse and validate a policy image exactly as the plugin does (seq and
    heartbeat are not part of the policy). Raises ValueError."""
    if len(image) < POLICY_SIZE:
        raise ValueError(f"policy image is {len(image)} bytes, needs {POLICY_SIZE}")
    image = bytes(image[:POLICY_SIZE])
    magic, version, header_size, _, _, stale_after, policy_id, n_comms, n_sets, check = (
        _HEADER.unpack_from(image)
    )
    if magic != POLICY_MAGIC:
        raise ValueError(f"bad magic {magic:#x}")
    if version != LAYOUT_VERSION or header_size != HEADER_SIZE:
        raise ValueError(f"unsupported layout version {version} / header size {header_size}")
    if n_comms > MAX_COMMS or n_sets > MAX_RULESETS:
        raise ValueError(f"{n_comms} communicators / {n_sets} rulesets exceed the limits")
    if check != checksum(image):
        raise ValueError("checksum mismatch")
    comms = []
    for i in range(n_comms):
        comm_id, activate_at, before, after, _, _ = _COMM.unpack_from(
            image, COMMS_OFFSET + i * COMM_SIZE
        )
        if (before != NO_SET and before >= n_sets) or (after != NO_SET and after >= n_sets):
            raise ValueError(f"communicator {comm_id:#x} names a missing ruleset")
        comms.append(CommEntry(comm_id, activate_at, None if before == NO_SET else before,
                               None if after == NO_SET else after))
    rulesets = tuple(_decode_ruleset(image, s) for s in range(n_sets))
    return Policy(policy_id, tuple(comms), rulesets, stale_after)


class PolicyFile:
    """The agent's writable handle on ``<dir>/<job>.policy``.

    The file is created whole (written to a temporary name, then renamed), so
    the plugin never maps a short file; afterwards it is only ever rewritten
    in place under the seqlock, never truncated, so live mappings stay valid.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._ensure_file()
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            self._map = mmap.mmap(fd, POLICY_SIZE, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # 8-byte views: assigning an item is one aligned 8-byte store, so the
        # plugin's atomic loads of seq and heartbeat never see a torn value
        # (struct.pack_into stores little-endian integers byte by byte).
        self._words = memoryview(self._map).cast("Q")

    def _ensure_file(self) -> None:
        parent = self.path.parent
        if not parent.is_dir():
            parent.mkdir(parents=True, exist_ok=True)
            parent.chmod(0o755)
        with contextlib.suppress(FileNotFoundError):
            info = self.path.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_size == POLICY_SIZE:
                return  # rewritten in place by write(): live mappings follow it
        # An empty policy with heartbeat 0 is valid but stale: the plugin
        # stays inert until the first write().
        tmp = parent / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, encode_policy(Policy(0, stale_after_ns=0)))
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    @property
    def seq(self) -> int:
        return self._words[SEQ_OFFSET // 8]

    def write(self, policy: Policy, heartbeat_ns: int | None = None) -> None:
        """Publish ``policy`` under the seqlock, then refresh the heartbeat.

        Order: seq made odd, body, checksum, seq made even. Each step is a
        store the interpreter performs in program order, and x86-64 keeps
        stores in order (TSO), so a reader that sees the even seq sees the
        whole body. A weakly ordered CPU (arm64, POWER) would need a store
        fence after the odd seq and before the even seq (e.g. a release
        store through a small C helper), which Python cannot issue.
        """
        image = encode_policy(policy)
        seq = self.seq
        odd = seq + 1 if seq % 2 == 0 else seq + 2  # a dead writer may have left it odd
        self._words[SEQ_OFFSET // 8] = odd & U64_MAX
        self._map[0:SEQ_OFFSET] = image[0:SEQ_OFFSET]
        self._map[24:CHECKSUM_OFFSET] = image[24:CHECKSUM_OFFSET]
        self._map[CHECKSUM_OFFSET + 4:POLICY_SIZE] = image[CHECKSUM_OFFSET + 4:POLICY_SIZE]
        self._map[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 4] = image[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 4]
        self._words[SEQ_OFFSET // 8] = (odd + 1) & U64_MAX
        self.heartbeat(heartbeat_ns)

    def heartbeat(self, now_ns: int | None = None) -> None:
        """Mark the policy live as of ``now_ns`` (CLOCK_MONOTONIC, the
        plugin's clock); outside the seqlock, one 8-byte store."""
        self._words[HEARTBEAT_OFFSET // 8] = time.monotonic_ns() if now_ns is None else now_ns

    def close(self) -> None:
        if not self._map.closed:
            self._words.release()
            self._map.close()

    def remove(self) -> None:
        """Withdraw the policy: plugins keep their mapping of the unlinked
        file, whose heartbeat goes stale, and fall back to NCCL's choice."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> PolicyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_policy(path: str | os.PathLike[str], attempts: int = 100) -> Policy:
    """Read and validate a policy file as the plugin would (ValueError if it
    would not use it). Reads with pread, not mmap: a short file cannot fault."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        for _ in range(attempts):
            before = os.pread(fd, 8, SEQ_OFFSET)
            image = os.pread(fd, POLICY_SIZE, 0)
            after = os.pread(fd, 8, SEQ_OFFSET)
            if len(image) < POLICY_SIZE:
                raise ValueError(f"policy file is {len(image)} bytes, needs {POLICY_SIZE}")
            if before == after and int.from_bytes(before, "little") % 2 == 0:
                return decode_policy(image)
            time.sleep(0.001)
    finally:
        os.close(fd)
    raise ValueError("policy file is being rewritten (seq odd or changing)")


def apply(  # noqa: PLR0917 -- mirrors getCollInfo's arguments
    policy: Policy,
    comm_id: int,
    n: int,
    coll: int,
    nbytes: int,
    table: Sequence[Sequence[float]],
    n_channels: int,
) -> tuple[list[list[float]], int]:
    """What the plugin does to NCCL's ``table[algo][proto]`` and channel count
    on collective number ``n`` of ``comm_id``, given a live (fresh) policy.

    Returns new values; the inputs are not modified.
    """
    out = [list(row) for row in table]
    entry = policy.entry(comm_id)
    if entry is None:
        return out, n_channels
    index = entry.after if n >= entry.activate_at else entry.before
    if index is None:
        return out, n_channels
    rule = next((r for r in policy.rulesets[index] if r.matches(coll, nbytes)), None)
    if rule is None:
        return out, n_channels
    num_algo = len(out)
    num_proto = len(out[0]) if out else 0
    for pref in rule.prefs:
        algos = range(num_algo) if pref.algo is None else [pref.algo]
        protos = range(num_proto) if pref.proto is None else [pref.proto]
        best: tuple[int, int] | None = None
        for a in algos:
            for p in protos:
                if a >= num_algo or p >= num_proto:
                    continue
                cost = out[a][p]
                # Negative means NCCL disabled it: never a candidate (NaN neither).
                if cost >= 0 and (best is None or cost < out[best[0]][best[1]]):
                    best = (a, p)
        if best is not None:
            out[best[0]][best[1]] = 0.0
            break
    if rule.max_channels > 0 and (n_channels == 0 or n_channels > rule.max_channels):
        n_channels = rule.max_channels
    return out, n_channels


@dataclass(frozen=True)
class StatsSlot:
    """One live tuner context (communicator) in a tenant process."""

    pid: int
    comm_id: int
    n_ranks: int
    n_nodes: int
    #: Collectives this communicator has issued so far.
    collectives: int
    #: Id of the policy the context last found live, 0 if none yet.
    policy_id_applied: int
    #: Calls on which the policy was missing, stale, torn or invalid.
    fallbacks: int


class StatsSlots(list[StatsSlot]):
    """The live slots of a job, plus how many stats files were malformed."""

    def __init__(self, slots: Iterable[StatsSlot] = (), malformed: int = 0) -> None:
        super().__init__(slots)
        self.malformed = malformed


def _parse_stats(data: bytes, pid: int) -> list[StatsSlot] | None:
    if len(data) != STATS_SIZE:
        return None
    magic, version, n_slots, file_pid, _ = _STATS_HEADER.unpack_from(data)
    if (magic, version, n_slots, file_pid) != (STATS_MAGIC, STATS_VERSION, STATS_SLOTS, pid):
        return None
    slots = []
    for i in range(STATS_SLOTS):
        comm_id, n_ranks, n_nodes, colls, policy_id, fallbacks, in_use, _ = (
            _STATS_SLOT.unpack_from(data, _STATS_HEADER.size + i * _STATS_SLOT.size)
        )
        if in_use not in (0, 1):
            return None
        if in_use:
            slots.append(StatsSlot(pid, comm_id, n_ranks, n_nodes, colls, policy_id, fallbacks))
    return slots


def read_stats(directory: str | os.PathLike[str], job: str) -> StatsSlots:
    """Every live slot in ``<directory>/<job>.<pid>.stats`` files.

    The files are written by tenant processes, so their content is untrusted:
    a malformed file is skipped and counted in ``malformed``, never raised.
    Files left by processes that died without finalizing remain (the pid may
    be in another pid namespace, so it cannot be checked here).
    """
    pattern = re.compile(re.escape(validate_job(job)) + r"\.([0-9]{1,10})\.stats")
    result = StatsSlots()
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return result
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        try:
            fd = os.open(Path(directory) / name,
                         os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone since the listing (process exited), or not ours to read
        try:
            data = os.pread(fd, STATS_SIZE + 1, 0)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        slots = _parse_stats(data, int(match.group(1)))
        if slots is None:
            result.malformed += 1
        else:
            result.extend(slots)
    return result

