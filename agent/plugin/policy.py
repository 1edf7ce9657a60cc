"""The policy layout the agent and the NCCL tuner plugin share (layout version 2):
its constants and byte formats, the rules (:class:`Rule`), a communicator's entry
(:class:`CommEntry`), a job's :class:`Policy` and what a plugin context holds of it
(:class:`Held`). Pure; the offsets must agree with ``native/tuner/hz_shm.h``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
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


def validate_job(job: str) -> str:
    """The plugin's rule for ``HARMONAIZE_JOB``; the name becomes a directory name."""
    if not _JOB.fullmatch(job) or job in (".", ".."):
        raise ValueError(f"job name must be 1-128 of [A-Za-z0-9._:@+-], got {job!r}")
    return job


def pseudo_comm_id(n_ranks: int, n_nodes: int) -> int:
    """The key the plugin uses for a communicator under the v3/v4 ABI, which
    has no commId: all ranks of a communicator compute the same one."""
    return (1 << 63 | n_ranks << 20 | n_nodes) & U64_MAX

