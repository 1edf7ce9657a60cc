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
the plugin does, so the tests use them as an oracle for the C code. The files
themselves are :mod:`agent.plugin.shm`'s.

This module is the one name for the layout; its parts live in
:mod:`agent.plugin.policy` (constants, rules, entries, the policy),
:mod:`agent.plugin.codec` (the policy's file image), :mod:`agent.plugin.reference`
(the plugin's decisions in Python) and :mod:`agent.plugin.stats` (the stats slots).
"""

from __future__ import annotations

from agent.plugin.codec import (
    checksum,
    decode_policy,
    encode_policy,
)
from agent.plugin.policy import (
    ANY,
    CHECKSUM_OFFSET,
    COMM_SIZE,
    COMMS_OFFSET,
    FLAG_PENDING,
    FNV64_BASIS,
    HEADER_SIZE,
    INT32_MAX,
    LAYOUT_VERSION,
    MAX_CHANNELS,
    MAX_COMMS,
    MAX_PREFS,
    MAX_RULES,
    MAX_RULESETS,
    NCCL_CAP_VERSION,
    NO_SET,
    POLICY_MAGIC,
    POLICY_SIZE,
    RECHECK_EVERY,
    REPLACED_EVERY,
    RULE_SIZE,
    RULESET_SIZE,
    RULESETS_OFFSET,
    SEQ_OFFSET,
    STATS_HEADER,
    STATS_HEADER_SIZE,
    STATS_MAGIC,
    STATS_SIZE,
    STATS_SLOT_SIZE,
    STATS_SLOTS,
    STATS_VERSION,
    U32_MAX,
    U64_MAX,
    WAIT,
    WRITTEN_OFFSET,
    Algo,
    Coll,
    CommEntry,
    Held,
    Policy,
    Pref,
    Proto,
    Rule,
    history_step,
    pseudo_comm_id,
    ruleset_hash,
    validate_job,
)
from agent.plugin.reference import (
    ReferenceContext,
    Verdict,
    apply,
    effective_channels,
    evaluate,
    value,
)
from agent.plugin.stats import (
    FLAG_CHANNELS,
    FLAG_DEFERRED,
    FLAG_HELD_PENDING,
    FLAG_INVALID,
    FLAG_LISTED,
    FLAG_MAPPED,
    FLAG_REFUSED,
    FLAG_WAITING,
    STATS_NAME,
    StatsSlot,
    StatsSlots,
    parse_slot,
)

__all__ = [
    "ANY",
    "CHECKSUM_OFFSET",
    "COMMS_OFFSET",
    "COMM_SIZE",
    "FLAG_CHANNELS",
    "FLAG_DEFERRED",
    "FLAG_HELD_PENDING",
    "FLAG_INVALID",
    "FLAG_LISTED",
    "FLAG_MAPPED",
    "FLAG_PENDING",
    "FLAG_REFUSED",
    "FLAG_WAITING",
    "FNV64_BASIS",
    "HEADER_SIZE",
    "INT32_MAX",
    "LAYOUT_VERSION",
    "MAX_CHANNELS",
    "MAX_COMMS",
    "MAX_PREFS",
    "MAX_RULES",
    "MAX_RULESETS",
    "NCCL_CAP_VERSION",
    "NO_SET",
    "POLICY_MAGIC",
    "POLICY_SIZE",
    "RECHECK_EVERY",
    "REPLACED_EVERY",
    "RULESETS_OFFSET",
    "RULESET_SIZE",
    "RULE_SIZE",
    "SEQ_OFFSET",
    "STATS_HEADER",
    "STATS_HEADER_SIZE",
    "STATS_MAGIC",
    "STATS_NAME",
    "STATS_SIZE",
    "STATS_SLOTS",
    "STATS_SLOT_SIZE",
    "STATS_VERSION",
    "U32_MAX",
    "U64_MAX",
    "WAIT",
    "WRITTEN_OFFSET",
    "Algo",
    "Coll",
    "CommEntry",
    "Held",
    "Policy",
    "Pref",
    "Proto",
    "ReferenceContext",
    "Rule",
    "StatsSlot",
    "StatsSlots",
    "Verdict",
    "apply",
    "checksum",
    "decode_policy",
    "effective_channels",
    "encode_policy",
    "evaluate",
    "history_step",
    "parse_slot",
    "pseudo_comm_id",
    "ruleset_hash",
    "validate_job",
    "value",
]
