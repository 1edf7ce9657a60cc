"""The file layouts the agent and the NCCL tuner plugin share (layout version 2). Pure.

A *policy* per job: for listed communicators, which algorithm/protocol NCCL
should prefer and how many channels it may use, per collective and message
size, switching from one ruleset to another at an exact collective index
(``at``) so every rank of a communicator switches on the same collective. An
entry may be *pending*: its change is armed but not confirmed, and a rank that
reaches ``at`` waits until the agent confirms or cancels it. Each entry carries
a revision that only rises. A *stats* file per process: per communicator what
it follows and where it switched.

Both layouts are fixed-size, little-endian and naturally aligned; the byte
offsets here and in ``native/tuner/hz_shm.h`` must agree. :func:`decode_policy`
accepts exactly what the plugin accepts, :func:`apply` computes exactly what
the plugin does to NCCL's cost table, and :func:`evaluate` decides exactly as
the plugin does, so the tests use them as an oracle for the C code. The
tuning loop imports only this module; the files themselves are
:mod:`agent.plugin.shm`'s.
"""

# Over 400 lines because it mirrors native/tuner/hz_shm.h and the plugin's semantics byte for
# byte (policy, stats, evaluate, apply); one file is what the C side is checked against.

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

POLICY_MAGIC = 0x50545A48  # "HZTP"


LAYOUT_VERSION = 2


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


WRITTEN_OFFSET = 16


CHECKSUM_OFFSET = 40


FLAG_PENDING = 0x1


STATS_MAGIC = 0x53545A48  # "HZTS"


STATS_VERSION = 2


STATS_SLOTS = 32


STATS_HEADER_SIZE = 64


STATS_SLOT_SIZE = 128


STATS_SIZE = STATS_HEADER_SIZE + STATS_SLOTS * STATS_SLOT_SIZE  # 4160


#: The first NCCL release that takes the tuner's channel count as a cap.
NCCL_CAP_VERSION = 23100


#: NCCL's most channels (MAXCHANNELS); the plugin never writes more.
MAX_CHANNELS = 64


#: Collective indices at which ranks look for a policy they do not map yet (multiples of
#: the first) and for one that replaced theirs (of the second).
RECHECK_EVERY = 256


REPLACED_EVERY = 1024


U32_MAX = 2**32 - 1


U64_MAX = 2**64 - 1


INT32_MAX = 2**31 - 1


FNV64_BASIS = 0xCBF29CE484222325


#: The value "wait here" in :func:`value` (an armed change not yet confirmed).
WAIT = -1


# magic, layout_version, header_size, seq, written_ns, reserved, policy_id,
# n_comms, n_rulesets, checksum, 20 reserved bytes
_HEADER = struct.Struct("<IHHQQQIHHI20x")


# comm_id, at, before, after, flags, reserved, revision, reserved
_COMM = struct.Struct("<QQHHHHII")


_SET_HEAD = struct.Struct("<II")  # n_rules, reserved


_RULE = struct.Struct("<IIQQBx4sH")  # mask, max_channels, min, max, n_prefs, prefs, reserved


# magic, version, n_slots, pid, nccl_version, tag, 40 reserved bytes
STATS_HEADER = struct.Struct("<IHHIIQ40x")


# comm_id, n_ranks, n_nodes, collectives, in_use, seq | flags, revision, at, before_hash,
# after_hash, last_switch, history, prev_history, switches, refused_revision, policy_dev,
# policy_ino, wait_at, fallbacks, refusals
_SLOT_HOT = struct.Struct("<QIIQII")


_SLOT_COLD = struct.Struct("<IIQQQQQQIIQQQII")


assert _HEADER.size == HEADER_SIZE and _COMM.size == COMM_SIZE and _RULE.size == RULE_SIZE


assert STATS_HEADER.size == STATS_HEADER_SIZE


assert _SLOT_HOT.size + _SLOT_COLD.size == STATS_SLOT_SIZE


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


def _fnv64(data: bytes, h: int = FNV64_BASIS) -> int:
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & U64_MAX
    return h


def ruleset_hash(rules: Sequence[Rule]) -> int:
    """The plugin's identity of a ruleset (what it decides): 0 for none or no rules."""
    if not rules:
        return 0
    h = _fnv64(struct.pack("<I", len(rules)))
    for rule in rules:
        h = _fnv64(struct.pack("<IIQQB", rule.coll_mask, rule.max_channels, rule.min_bytes,
                               rule.max_bytes, len(rule.prefs)), h)
        h = _fnv64(bytes(p.encode() for p in rule.prefs), h)
    return h or 1


def history_step(history: int, index: int, ruleset: int) -> int:
    """The plugin's switch history after a change of answer at ``index`` to ``ruleset``."""
    return _fnv64(struct.pack("<QQ", index, ruleset), history or FNV64_BASIS)


@dataclass(frozen=True)
class CommEntry:
    """A communicator under policy: ruleset ``before`` for collectives
    ``n < at``, ``after`` from then on (``None``: NCCL's choice). ``pending``:
    the change at ``at`` is armed, not confirmed; ranks reaching ``at`` wait."""

    comm_id: int
    at: int = 0
    before: int | None = None
    after: int | None = None
    revision: int = 1
    pending: bool = False

    def __post_init__(self) -> None:
        _check_int("comm_id", self.comm_id, 0, U64_MAX)
        _check_int("at", self.at, 0, U64_MAX)
        _check_int("revision", self.revision, 0, U32_MAX)
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "comms", tuple(self.comms))
        object.__setattr__(self, "rulesets", tuple(tuple(s) for s in self.rulesets))
        _check_int("policy_id", self.policy_id, 0, U32_MAX)
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

    def rules(self, index: int | None) -> tuple[Rule, ...]:
        return () if index is None else self.rulesets[index]

    def view(self, comm_id: int) -> Held:
        """What a context of ``comm_id`` holds once it took this policy."""
        entry = self.entry(comm_id)
        if entry is None:
            return Held()
        return Held(True, entry.at, ruleset_hash(self.rules(entry.before)),
                    ruleset_hash(self.rules(entry.after)), entry.revision, entry.pending)


@dataclass(frozen=True)
class Held:
    """A communicator's entry as a plugin context sees it (rulesets by hash)."""

    listed: bool = False
    at: int = 0
    before: int = 0
    after: int = 0
    revision: int = 0
    pending: bool = False


def value(entry: Held, index: int) -> int:
    """The ruleset (hash; 0 NCCL's own) ``entry`` answers at ``index``, or WAIT."""
    if not entry.listed:
        return 0
    if index < entry.at:
        return entry.before
    return WAIT if entry.pending else entry.after


def _same_at(held: Held, new: Held, index: int) -> bool:
    vh, vn = value(held, index), value(new, index)
    if vh != WAIT:
        return vh == vn
    if vn == WAIT:
        return (new.at, new.before, new.after) == (held.at, held.before, held.after)
    return vn in (held.before, held.after)


def _agree(held: Held, new: Held, lo: int, hi: int | None) -> bool:
    return all(_same_at(held, new, p) for p in (lo, held.at, new.at)
               if p >= lo and (hi is None or p < hi))


class Verdict(IntEnum):
    ACCEPT = 0
    DEFER = 1
    REFUSE = 2


def evaluate(held: Held, new: Held, n: int) -> tuple[Verdict, int | None]:
    """Whether a context holding ``held``, about to issue collective ``n``,
    takes ``new`` (and, when deferred, the index at which it looks again).

    The same rule as ``hz_evaluate`` in the plugin: revisions never go back; a
    copy that answers alike from ``n`` on is taken; one that differs only from
    its own ``at`` >= ``n`` on (and beyond the held entry's armed switch, if it
    holds one) is taken; one that could agree once this rank passed its held
    ``at`` waits for that index; anything else is refused.
    """
    if new.revision < held.revision:
        return Verdict.REFUSE, None
    if new.revision == held.revision:
        return (Verdict.ACCEPT if new == held else Verdict.REFUSE), None
    if _agree(held, new, n, None):
        return Verdict.ACCEPT, None
    # A new switch must lie beyond an armed one this rank holds: before it, the armed
    # change's outcome would be decided by nobody.
    if new.at >= n and (not held.pending or new.at > held.at) and _agree(held, new, n, new.at):
        return Verdict.ACCEPT, None
    if held.listed and n < held.at:
        return Verdict.DEFER, held.at
    return Verdict.REFUSE, None


@dataclass
class ReferenceContext:
    """A plugin context as the reference sees it: what it holds, a deferred copy, its
    switch record. ``see()`` a new copy of its entry (taken at its next call, as the
    plugin takes a new seq), then ``call()`` once per collective; a call the plugin
    would wait in (an armed switch reached) must not be made: ``would_wait()`` says."""

    held: Held = field(default_factory=Held)
    cand: Held | None = None
    defer_at: int | None = None
    unseen: Held | None = None
    n: int = 0
    current: int = 0
    switches: int = 0
    last_switch: int = 0
    history: int = 0
    prev_history: int = 0
    refused: int | None = None

    def see(self, copy: Held) -> None:
        self.unseen = copy

    def _judge(self, new: Held, n: int) -> None:
        verdict, retry = evaluate(self.held, new, n)
        if verdict is Verdict.ACCEPT:
            self.held, self.cand, self.defer_at, self.refused = new, None, None, None
        elif verdict is Verdict.DEFER:
            self.cand, self.defer_at, self.refused = new, retry, None
        else:
            self.cand, self.defer_at, self.refused = None, None, new.revision

    def _prepare(self, n: int) -> None:
        if self.unseen is not None:
            new, self.unseen = self.unseen, None
            self._judge(new, n)
        if self.defer_at is not None and self.defer_at <= n and self.cand is not None:
            self._judge(self.cand, n)

    def would_wait(self) -> bool:
        trial = dataclasses.replace(self)
        trial._prepare(self.n)
        return value(trial.held, self.n) == WAIT

    def call(self) -> int:
        """The ruleset (hash) this collective runs with."""
        n = self.n
        self._prepare(n)
        answer = value(self.held, n)
        if answer == WAIT:
            raise RuntimeError(f"the plugin would wait at collective {n}")
        if answer != self.current:
            self.prev_history = self.history
            self.history = history_step(self.history, n, answer)
            self.switches += 1
            self.last_switch = n
            self.current = answer
        self.n = n + 1
        return answer

    def slot(self, pid: int, comm_id: int, n_ranks: int, n_nodes: int,
             policy_file: tuple[int, int] = (0, 0)) -> StatsSlot:
        held = self.held
        flags = (FLAG_MAPPED if policy_file != (0, 0) else 0) | (
            FLAG_LISTED if held.listed else 0) | (FLAG_HELD_PENDING if held.pending else 0) | (
            FLAG_REFUSED if self.refused is not None else 0) | (
            FLAG_DEFERRED if self.defer_at is not None else 0)
        return StatsSlot(pid, comm_id, n_ranks, n_nodes, self.n, flags, held.revision, held.at,
                         held.before, held.after, self.last_switch, self.history,
                         self.prev_history, self.switches, self.refused or 0, policy_file)


def validate_job(job: str) -> str:
    """The plugin's rule for ``HARMONAIZE_JOB``; the name becomes a directory name."""
    if not _JOB.fullmatch(job) or job in (".", ".."):
        raise ValueError(f"job name must be 1-128 of [A-Za-z0-9._:@+-], got {job!r}")
    return job


def pseudo_comm_id(n_ranks: int, n_nodes: int) -> int:
    """The key the plugin uses for a communicator under the v3/v4 ABI, which
    has no commId: all ranks of a communicator compute the same one."""
    return (1 << 63 | n_ranks << 20 | n_nodes) & U64_MAX


def checksum(image: bytes | bytearray | memoryview) -> int:
    """FNV-1a 32 over bytes [32, 40) then [64, POLICY_SIZE) of a policy image."""
    def fnv32(data: bytes | memoryview, h: int) -> int:
        for byte in data:
            h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
        return h

    view = memoryview(image)
    return fnv32(view[HEADER_SIZE:POLICY_SIZE], fnv32(view[32:40], 0x811C9DC5))


def encode_policy(policy: Policy, *, seq: int = 0, written_ns: int = 0) -> bytes:
    """The full file image of ``policy``, checksum included."""
    image = bytearray(POLICY_SIZE)
    for i, entry in enumerate(policy.comms):
        _COMM.pack_into(
            image, COMMS_OFFSET + i * COMM_SIZE, entry.comm_id, entry.at,
            NO_SET if entry.before is None else entry.before,
            NO_SET if entry.after is None else entry.after,
            FLAG_PENDING if entry.pending else 0, 0, entry.revision, 0,
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
        image, 0, POLICY_MAGIC, LAYOUT_VERSION, HEADER_SIZE, seq, written_ns, 0,
        policy.policy_id, len(policy.comms), len(policy.rulesets), 0,
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
    written_ns are not part of the policy). Raises ValueError."""
    if len(image) < POLICY_SIZE:
        raise ValueError(f"policy image is {len(image)} bytes, needs {POLICY_SIZE}")
    image = bytes(image[:POLICY_SIZE])
    magic, version, header_size, _, _, _, policy_id, n_comms, n_sets, check = (
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
        comm_id, at, before, after, flags, _, revision, _ = _COMM.unpack_from(
            image, COMMS_OFFSET + i * COMM_SIZE
        )
        if (before != NO_SET and before >= n_sets) or (after != NO_SET and after >= n_sets):
            raise ValueError(f"communicator {comm_id:#x} names a missing ruleset")
        if flags & ~FLAG_PENDING:
            raise ValueError(f"communicator {comm_id:#x} has unknown flags {flags:#x}")
        comms.append(CommEntry(comm_id, at, None if before == NO_SET else before,
                               None if after == NO_SET else after, revision,
                               bool(flags & FLAG_PENDING)))
    rulesets = tuple(_decode_ruleset(image, s) for s in range(n_sets))
    return Policy(policy_id, tuple(comms), rulesets)


def effective_channels(cap: int, n_channels: int, nccl_version: int) -> int:
    """What the plugin leaves in ``*nChannels`` for a rule's cap on an NCCL release."""
    if cap <= 0 or nccl_version < NCCL_CAP_VERSION:
        return n_channels  # 2.22-2.30 use any non-zero value as the count: never touched
    cap = min(cap, MAX_CHANNELS)
    return cap if n_channels <= 0 or n_channels > cap else n_channels


def apply(  # noqa: PLR0917 -- mirrors getCollInfo's arguments
    policy: Policy,
    comm_id: int,
    n: int,
    coll: int,
    nbytes: int,
    table: Sequence[Sequence[float]],
    n_channels: int,
    nccl_version: int = 23203,
) -> tuple[list[list[float]], int]:
    """What the plugin does to NCCL's ``table[algo][proto]`` and channel count
    on collective number ``n`` of ``comm_id``, for a context that took
    ``policy`` (and is not waiting at a pending entry's ``at``).

    Returns new values; the inputs are not modified.
    """
    out = [list(row) for row in table]
    entry = policy.entry(comm_id)
    if entry is None:
        return out, n_channels
    index = entry.after if n >= entry.at else entry.before
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
    return out, effective_channels(rule.max_channels, n_channels, nccl_version)


FLAG_MAPPED = 0x1


FLAG_HELD_PENDING = 0x2


FLAG_WAITING = 0x4


FLAG_REFUSED = 0x8


FLAG_DEFERRED = 0x10


FLAG_CHANNELS = 0x20


FLAG_LISTED = 0x40


FLAG_INVALID = 0x80


@dataclass(frozen=True)
class StatsSlot:
    """One live tuner context (a rank of a communicator) in a tenant process."""

    pid: int
    comm_id: int
    n_ranks: int
    n_nodes: int
    #: Collectives this context has completed: the index of its next one.
    collectives: int
    flags: int = FLAG_MAPPED
    #: The entry it follows (revision 0: none, NCCL's own choices).
    revision: int = 0
    at: int = 0
    before_hash: int = 0
    after_hash: int = 0
    #: Where its answer last changed, how often, and a hash chain over every change.
    last_switch: int = 0
    history: int = 0
    prev_history: int = 0
    switches: int = 0
    refused_revision: int = 0
    #: The policy file it maps (device, inode); (0, 0) when none.
    policy_file: tuple[int, int] = (0, 0)
    wait_at: int = 0
    #: Calls with no policy to follow.
    fallbacks: int = 0
    refusals: int = 0
    nccl_version: int = 0
    #: Which process file (pid and random tag): tells apart pids of other namespaces.
    tag: int = 0

    @property
    def held(self) -> Held:
        return Held(bool(self.flags & FLAG_LISTED), self.at, self.before_hash,
                    self.after_hash, self.revision, bool(self.flags & FLAG_HELD_PENDING))

    @property
    def waiting(self) -> bool:
        return bool(self.flags & FLAG_WAITING)

    @property
    def refused(self) -> bool:
        return bool(self.flags & FLAG_REFUSED)

    @property
    def deferred(self) -> bool:
        return bool(self.flags & FLAG_DEFERRED)

    @property
    def mapped(self) -> bool:
        return bool(self.flags & FLAG_MAPPED)

    @property
    def key(self) -> tuple[int, int, int]:
        """This context among all of the host's (process, file, communicator)."""
        return (self.pid, self.tag, self.comm_id)


class StatsSlots(list[StatsSlot]):
    """The live slots of a job, plus how many stats files were malformed and how
    many were left by processes that died (removed as they are found); and of one
    bounded read: files over the caps (``excess``), files left to the next read
    (``deferred``), slots left mid-update (``stale``), file reads made (``reads``)."""

    def __init__(self, slots: Iterable[StatsSlot] = (), malformed: int = 0,
                 dead: int = 0) -> None:
        super().__init__(slots)
        self.malformed = malformed
        self.dead = dead
        self.excess = 0
        self.deferred = 0
        self.stale = 0
        self.reads = 0


STATS_NAME = re.compile(r"([0-9]{1,10})-([0-9a-f]{16})\.stats")


def parse_slot(data: bytes, offset: int, pid: int, nccl: int, tag: int) -> StatsSlot | None:
    comm_id, n_ranks, n_nodes, collectives, in_use, _ = _SLOT_HOT.unpack_from(data, offset)
    if in_use not in (0, 1):
        raise ValueError("in_use")
    if not in_use:
        return None
    (flags, revision, at, before, after, last_switch, history, prev_history, switches, refused,
     dev, ino, wait_at, fallbacks, refusals) = _SLOT_COLD.unpack_from(data, offset + _SLOT_HOT.size)
    return StatsSlot(pid, comm_id, n_ranks, n_nodes, collectives, flags, revision, at, before,
                     after, last_switch, history, prev_history, switches, refused, (dev, ino),
                     wait_at, fallbacks, refusals, nccl, tag)
