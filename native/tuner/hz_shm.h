/*
 * Shared-memory layouts between the HarmonAIze agent and the tuner plugin:
 * the policy file (agent writes, plugin maps read-only) and the stats file
 * (plugin writes, agent reads). Little-endian, naturally aligned; the Python
 * side is agent/plugin/shm.py and must agree byte for byte.
 *
 * Layout version 2. A job's files live in its own directory,
 * <dir>/<job>/policy and <dir>/<job>/<pid>-<tag>.stats, so file modes can
 * keep one tenant's processes out of another's job.
 */
#ifndef HZ_SHM_H
#define HZ_SHM_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the HarmonAIze shared-memory layouts are little-endian"
#endif

/* ---- Policy file ---- */
#define HZP_MAGIC 0x50545A48u /* "HZTP" */
#define HZP_VERSION 2u
#define HZP_HEADER_SIZE 64u
#define HZP_OFF_MAGIC 0
#define HZP_OFF_VERSION 4
#define HZP_OFF_HEADER_SIZE 6
#define HZP_OFF_SEQ 8
/* When the agent last wrote (its CLOCK_MONOTONIC, ns): for operators only.
 * The plugin never reads it: no choice may depend on a clock. */
#define HZP_OFF_WRITTEN 16
#define HZP_OFF_POLICY_ID 32
#define HZP_OFF_N_COMMS 36
#define HZP_OFF_N_RULESETS 38
#define HZP_OFF_CHECKSUM 40

/* One entry per communicator: ruleset `before` for collectives n < at,
 * `after` from at on. PENDING: the change at `at` is armed but not yet
 * confirmed; a rank that reaches `at` waits until the agent resolves it.
 * `revision` rises with every change of the entry. */
#define HZP_MAX_COMMS 32u
#define HZP_COMM_SIZE 32u
#define HZP_OFF_COMMS HZP_HEADER_SIZE
#define HZP_COMM_OFF_ID 0
#define HZP_COMM_OFF_AT 8
#define HZP_COMM_OFF_BEFORE 16
#define HZP_COMM_OFF_AFTER 18
#define HZP_COMM_OFF_FLAGS 20
#define HZP_COMM_OFF_REVISION 24
#define HZP_NO_SET 0xFFFFu
#define HZP_FLAG_PENDING 0x1u
#define HZP_FLAGS_VALID 0x1u

#define HZP_MAX_SETS 16u
#define HZP_MAX_RULES 16u
#define HZP_RULE_SIZE 32u
#define HZP_SET_SIZE (8u + HZP_MAX_RULES * HZP_RULE_SIZE) /* 520 */
#define HZP_OFF_SETS (HZP_OFF_COMMS + HZP_MAX_COMMS * HZP_COMM_SIZE) /* 1088 */
#define HZP_RULE_OFF_COLL_MASK 0
#define HZP_RULE_OFF_MAX_CHANNELS 4
#define HZP_RULE_OFF_MIN_BYTES 8
#define HZP_RULE_OFF_MAX_BYTES 16
#define HZP_RULE_OFF_N_PREFS 24
#define HZP_RULE_OFF_PREFS 26
#define HZP_MAX_PREFS 4u
#define HZP_ANY 0xFu
#define HZP_NUM_ALGOS 7u  /* algorithm nibbles 0..6 name an algorithm, 0xF any */
#define HZP_NUM_PROTOS 3u /* protocol nibbles 0..2 name a protocol, 0xF any */
#define HZP_COLL_MASK_VALID 0xFFu /* bits 0..7: Broadcast .. Recv */

#define HZP_TOTAL_SIZE (HZP_OFF_SETS + HZP_MAX_SETS * HZP_SET_SIZE) /* 9408 */

/* ---- Stats file: one per process, one slot per tuner context ---- */
#define HZS_MAGIC 0x53545A48u /* "HZTS" */
#define HZS_VERSION 2u
#define HZS_N_SLOTS 32u
#define HZS_HEADER_SIZE 64u
#define HZS_SLOT_SIZE 128u
#define HZS_TOTAL_SIZE (HZS_HEADER_SIZE + HZS_N_SLOTS * HZS_SLOT_SIZE) /* 4160 */
#define HZS_OFF_MAGIC 0
#define HZS_OFF_VERSION 4
#define HZS_OFF_N_SLOTS 6
#define HZS_OFF_PID 8
#define HZS_OFF_NCCL_VERSION 12 /* ncclGetVersion() of the process, 0: unknown */
#define HZS_OFF_TAG 16

/* Hot fields, stored outside the slot's seqlock. */
#define HZS_SLOT_OFF_COMM_ID 0
#define HZS_SLOT_OFF_N_RANKS 8
#define HZS_SLOT_OFF_N_NODES 12
#define HZS_SLOT_OFF_COLLECTIVES 16 /* calls completed = the next collective's index */
#define HZS_SLOT_OFF_IN_USE 24
#define HZS_SLOT_OFF_SEQ 28 /* odd while the fields below change */
/* Cold fields, consistent under the slot's seq. */
#define HZS_SLOT_OFF_FLAGS 32
#define HZS_SLOT_OFF_REVISION 36 /* the held entry: what the context follows */
#define HZS_SLOT_OFF_AT 40
#define HZS_SLOT_OFF_BEFORE_HASH 48
#define HZS_SLOT_OFF_AFTER_HASH 56
#define HZS_SLOT_OFF_LAST_SWITCH 64 /* index of the last change of answer */
#define HZS_SLOT_OFF_HISTORY 72     /* hash chain over every (index, ruleset) change */
#define HZS_SLOT_OFF_PREV_HISTORY 80 /* the chain before the last change */
#define HZS_SLOT_OFF_SWITCHES 88
#define HZS_SLOT_OFF_REFUSED_REV 92
#define HZS_SLOT_OFF_POLICY_DEV 96 /* the policy file this context maps */
#define HZS_SLOT_OFF_POLICY_INO 104
#define HZS_SLOT_OFF_WAIT_AT 112
#define HZS_SLOT_OFF_FALLBACKS 120 /* hot, outside the seqlock; saturates */
#define HZS_SLOT_OFF_REFUSALS 124

#define HZS_FLAG_MAPPED 0x1u   /* the policy file is mapped */
#define HZS_FLAG_PENDING 0x2u  /* the held entry's change is armed, not confirmed */
#define HZS_FLAG_WAITING 0x4u  /* the rank waits at wait_at for that confirmation */
#define HZS_FLAG_REFUSED 0x8u  /* the newest copy was refused (refused_rev) */
#define HZS_FLAG_DEFERRED 0x10u /* the newest copy applies once this rank passes `at` */
#define HZS_FLAG_CHANNELS 0x20u /* this NCCL takes a channel count as a cap */
#define HZS_FLAG_LISTED 0x40u  /* the held entry lists this communicator */
#define HZS_FLAG_INVALID 0x80u /* the newest copy failed validation */

_Static_assert(HZP_SET_SIZE == 520, "ruleset size");
_Static_assert(HZP_OFF_SETS == 1088, "ruleset offset");
_Static_assert(HZP_TOTAL_SIZE == 9408, "policy size");
_Static_assert(HZS_TOTAL_SIZE == 4160, "stats size");

/* Unaligned-safe little-endian accessors over byte buffers. */
static inline uint16_t hz_ld16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t hz_ld32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t hz_ld64(const uint8_t* p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void hz_st16(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }
static inline void hz_st32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
static inline void hz_st64(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }

/* FNV-1a 32 over the policy's checksummed bytes: [32,40) then [64,total). */
static inline uint32_t hz_fnv1a(uint32_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

static inline uint32_t hz_policy_checksum(const uint8_t* image) {
  uint32_t h = hz_fnv1a(2166136261u, image + HZP_OFF_POLICY_ID, 8);
  return hz_fnv1a(h, image + HZP_HEADER_SIZE, HZP_TOTAL_SIZE - HZP_HEADER_SIZE);
}

/* FNV-1a 64, for ruleset identities and the switch history. */
#define HZ_FNV64_BASIS 0xCBF29CE484222325ull
static inline uint64_t hz_fnv64(uint64_t h, const void* data, size_t n) {
  const uint8_t* p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

#endif /* HZ_SHM_H */
