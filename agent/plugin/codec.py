"""A policy's file image: :func:`encode_policy` and :func:`decode_policy`, which accepts
exactly what the plugin accepts (checksum, bounds, references). Pure.
"""

from __future__ import annotations

import struct

from agent.plugin.policy import (
    _COMM,
    _HEADER,
    _RULE,
    _SET_HEAD,
    CHECKSUM_OFFSET,
    COMM_SIZE,
    COMMS_OFFSET,
    FLAG_PENDING,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAX_COMMS,
    MAX_PREFS,
    MAX_RULES,
    MAX_RULESETS,
    NO_SET,
    POLICY_MAGIC,
    POLICY_SIZE,
    RULE_SIZE,
    RULESET_SIZE,
    RULESETS_OFFSET,
    Coll,
    CommEntry,
    Policy,
    Pref,
    Rule,
)


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

