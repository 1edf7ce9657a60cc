/*
 * Shared-memory layouts between the HarmonAIze agent and the tuner plugin:
 * the policy file (agent writes, plugin maps read-only) and the stats file
 * (plugin writes, agent reads). Little-endian, naturally aligned; the Python
 * side is agent/tuning/shm.py and must agree byte for byte.
 */
#ifndef HZ_SHM_H
#define HZ_SHM_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the HarmonAIze shared-memory layouts are little-endian"
#endif

/* Policy file, layout version 1. */
#define HZP_MAGIC 0x50545A48u /* "HZTP" */
#define HZP_VERSION 1u
#define HZP_HEADER_SIZE 64u
#define HZP_OFF_MAGIC 0
#define HZP_OFF_VERSION 4
#define HZP_OFF_HEADER_SIZE 6
#define HZP_OFF_SEQ 8
#define HZP_OFF_HEARTBEAT 16
#define HZP_OFF_STALE_AFTER 24
#define HZP_OFF_POLICY_ID 32
#define HZP_OFF_N_COMMS 36
#define HZP_OFF_N_RULESETS 38
#define HZP_OFF_CHECKSUM 40

#define HZP_MAX_COMMS 32u
#define HZP_COMM_SIZE 32u
#define HZP_OFF_COMMS HZP_HEADER_SIZE
#define HZP_COMM_OFF_ID 0
#define HZP_COMM_OFF_ACTIVATE_AT 8
#define HZP_COMM_OFF_BEFORE 16
#define HZP_COMM_OFF_AFTER 18
#define HZP_NO_SET 0xFFFFu

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

/* Stats file, version 1: one per process, one slot per tuner context. */
#define HZS_MAGIC 0x53545A48u /* "HZTS" */
#define HZS_VERSION 1u
#define HZS_N_SLOTS 32u
#define HZS_HEADER_SIZE 16u
#define HZS_SLOT_SIZE 48u
#define HZS_TOTAL_SIZE (HZS_HEADER_SIZE + HZS_N_SLOTS * HZS_SLOT_SIZE) /* 1552 */
#define HZS_SLOT_OFF_COMM_ID 0
#define HZS_SLOT_OFF_N_RANKS 8
#define HZS_SLOT_OFF_N_NODES 12
#define HZS_SLOT_OFF_COLLECTIVES 16
#define HZS_SLOT_OFF_POLICY_ID 24
#define HZS_SLOT_OFF_FALLBACKS 32
#define HZS_SLOT_OFF_IN_USE 40

_Static_assert(HZP_SET_SIZE == 520, "ruleset size");
_Static_assert(HZP_OFF_SETS == 1088, "ruleset offset");
_Static_assert(HZP_TOTAL_SIZE == 9408, "policy size");
_Static_assert(HZS_TOTAL_SIZE == 1552, "stats size");

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

#endif /* HZ_SHM_H */
