/*
 * HarmonAIze NCCL tuner plugin.
 *
 * NCCL loads this library inside the tenant's training process. On every
 * collective, getCollInfo reads the host agent's current policy from a
 * read-only shared mapping (<dir>/<job>.policy, layout in hz_shm.h) and nudges
 * NCCL's cost table: the preferred enabled algorithm/protocol gets cost 0.0,
 * and the channel count may be lowered. Whatever goes wrong (no job, no file,
 * a stale, corrupt or foreign policy) the table and *nChannels stay exactly
 * as NCCL gave them, and every entry point returns success, because NCCL
 * turns a tuner error into a failed communicator or collective. One
 * exception: while the agent is mid-write (seq odd, or changing under the
 * copy), a context that already holds a valid copy keeps following it; see
 * hz_collinfo for why.
 *
 * getCollInfo does not allocate, lock or block. Its only system interaction
 * on the steady path is one clock_gettime(CLOCK_MONOTONIC), served by the
 * vDSO without entering the kernel, for the staleness check. Open/mmap
 * happen in init and, while the policy is unusable, at most once per 4096
 * calls of a context (about 5 µs each time, so ~1 ns per call amortised).
 *
 * Exported: ncclTunerPlugin_v6, _v5, _v4, _v3. v2 is deliberately absent: it
 * returns an algorithm and protocol without seeing NCCL's cost table, so the
 * plugin could not tell which combinations NCCL disabled (NCCL_ALGO/PROTO,
 * no NVLS/CollNet) and the v2 adapter writes table[a][p] = 0.0 for whatever
 * it returns, which would revive a disabled entry.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hz_shm.h"
#include "hz_tuner_abi.h"

#define HZ_EXPORT __attribute__((visibility("default")))
#define HZ_NAME "HarmonAIze"
#define HZ_DEFAULT_DIR "/run/harmonaize/tuner"
#define HZ_JOB_MAX 128
/* Calls between attempts to (re)open the policy while it is unusable. */
#define HZ_RECHECK_EVERY 4096u
/* Seqlock copy attempts per call before giving up for that call. */
#define HZ_COPY_ATTEMPTS 2

/* A validated rule, unpacked for the hot path. */
struct hz_rule {
  uint64_t min_bytes;
  uint64_t max_bytes;
  uint32_t coll_mask;
  uint32_t max_channels;
  uint8_t n_prefs;
  uint8_t algo[HZP_MAX_PREFS];
  uint8_t proto[HZP_MAX_PREFS];
};

struct hz_set {
  uint32_t n_rules;
  struct hz_rule rules[HZP_MAX_RULES];
};

enum hz_state { HZ_UNKNOWN = 0, HZ_VALID, HZ_INVALID };

/* One per communicator. NCCL calls a communicator's getCollInfo from one
 * thread at a time, so nothing here is shared between threads except the
 * stats mapping (guarded at init/destroy by g_stats_lock). */
struct hz_ctx {
  /* Hot fields first. */
  uint64_t n;         /* index of the next collective */
  const uint8_t* map; /* policy mapping (HZP_TOTAL_SIZE bytes) or NULL */
  int state;          /* what the copy taken at `seq` turned out to be */
  int listed;         /* this communicator has an entry in the policy */
  uint64_t seq;       /* seq of the cached copy */
  uint64_t stale_after_ns;
  uint64_t activate_at;
  const struct hz_set* before; /* NULL: NCCL's own choice */
  const struct hz_set* after;
  uint32_t policy_id;
  uint32_t recheck; /* unusable calls left before the next open attempt */
  uint8_t* slot;    /* stats slot or NULL */
  uint64_t fallbacks;
  uint64_t applied_id; /* last policy id published in the slot */

  uint64_t comm_id;
  hz_logger_t log;
  struct hz_set sets[2]; /* storage for before/after */
  char policy_path[PATH_MAX];
  uint64_t image[HZP_TOTAL_SIZE / 8]; /* private copy of the policy */
};

/* ---- Stats file: one per process, shared by its contexts. ---- */

static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t* g_stats_map;
static int g_stats_refs;
static char g_stats_path[PATH_MAX];

static inline void hz_slot_store64(uint8_t* slot, unsigned off, uint64_t v) {
  __atomic_store_n((uint64_t*)(slot + off), v, __ATOMIC_RELAXED);
}

static uint8_t* hz_stats_create(const char* path) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) return NULL;
  uint8_t* map = NULL;
  (void)fchmod(fd, 0644); /* independent of the tenant's umask */
  /* Truncating first drops whatever a dead process with our pid left. */
  if (ftruncate(fd, 0) == 0 && ftruncate(fd, HZS_TOTAL_SIZE) == 0) {
    void* m = mmap(NULL, HZS_TOTAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) map = m;
  }
  close(fd);
  if (map == NULL) {
    unlink(path);
    return NULL;
  }
  hz_st32(map + 0, HZS_MAGIC);
  hz_st16(map + 4, HZS_VERSION);
  hz_st16(map + 6, HZS_N_SLOTS);
  hz_st32(map + 8, (uint32_t)getpid());
  hz_st32(map + 12, 0);
  return map;
}

/* Claims a slot for ctx; returns 0 when stats are unavailable. */
static int hz_stats_attach(struct hz_ctx* c, const char* dir, const char* job, size_t nRanks,
                           size_t nNodes) {
  char path[PATH_MAX];
  int len = snprintf(path, sizeof path, "%s/%s.%ld.stats", dir, job, (long)getpid());
  if (len < 0 || (size_t)len >= sizeof path) return 0;
  pthread_mutex_lock(&g_stats_lock);
  if (g_stats_map != NULL && strcmp(g_stats_path, path) != 0) {
    /* Another directory/job is live in this process (or we forked): skip. */
    pthread_mutex_unlock(&g_stats_lock);
    return 0;
  }
  if (g_stats_map == NULL) {
    g_stats_map = hz_stats_create(path);
    if (g_stats_map == NULL) {
      pthread_mutex_unlock(&g_stats_lock);
      return 0;
    }
    memcpy(g_stats_path, path, (size_t)len + 1);
  }
  for (unsigned i = 0; i < HZS_N_SLOTS; i++) {
    uint8_t* s = g_stats_map + HZS_HEADER_SIZE + i * HZS_SLOT_SIZE;
    if (__atomic_load_n((uint32_t*)(s + HZS_SLOT_OFF_IN_USE), __ATOMIC_RELAXED) != 0) continue;
    hz_slot_store64(s, HZS_SLOT_OFF_COMM_ID, c->comm_id);
    hz_st32(s + HZS_SLOT_OFF_N_RANKS, nRanks > UINT32_MAX ? UINT32_MAX : (uint32_t)nRanks);
    hz_st32(s + HZS_SLOT_OFF_N_NODES, nNodes > UINT32_MAX ? UINT32_MAX : (uint32_t)nNodes);
    hz_slot_store64(s, HZS_SLOT_OFF_COLLECTIVES, 0);
    hz_slot_store64(s, HZS_SLOT_OFF_POLICY_ID, 0);
    hz_slot_store64(s, HZS_SLOT_OFF_FALLBACKS, 0);
    hz_st32(s + HZS_SLOT_OFF_IN_USE + 4, 0);
    __atomic_store_n((uint32_t*)(s + HZS_SLOT_OFF_IN_USE), 1u, __ATOMIC_RELEASE);
    c->slot = s;
    g_stats_refs++;
    break;
  }
  if (c->slot == NULL && g_stats_refs == 0) {
    munmap(g_stats_map, HZS_TOTAL_SIZE);
    unlink(g_stats_path);
    g_stats_map = NULL;
  }
  pthread_mutex_unlock(&g_stats_lock);
  return c->slot != NULL;
}

static void hz_stats_detach(struct hz_ctx* c) {
  if (c->slot == NULL) return;
  pthread_mutex_lock(&g_stats_lock);
  __atomic_store_n((uint32_t*)(c->slot + HZS_SLOT_OFF_IN_USE), 0u, __ATOMIC_RELEASE);
  c->slot = NULL;
  if (--g_stats_refs == 0) {
    /* Last context of the process: the file describes nothing any more. */
    munmap(g_stats_map, HZS_TOTAL_SIZE);
    unlink(g_stats_path);
    g_stats_map = NULL;
  }
  pthread_mutex_unlock(&g_stats_lock);
}

/* ---- Policy mapping and validation. ---- */

static void hz_unmap(struct hz_ctx* c) {
  if (c->map != NULL) munmap((void*)c->map, HZP_TOTAL_SIZE);
  c->map = NULL;
  c->state = HZ_UNKNOWN;
}

/* (Re)maps the policy file. Maps only a file at least HZP_TOTAL_SIZE long,
 * so reading the mapping cannot run past its end (SIGBUS). The agent replaces
 * the file by rename and never truncates it in place; a truncation after the
 * size check would still fault, which a library cannot defend against without
 * a process-wide signal handler. Opening anew rather than comparing inodes
 * also picks up a file the agent recreated after a restart. */
static void hz_map(struct hz_ctx* c) {
  hz_unmap(c);
  int fd = open(c->policy_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return;
  off_t size = lseek(fd, 0, SEEK_END); /* -1 for pipes and the like */
  if (size >= (off_t)HZP_TOTAL_SIZE) {
    void* m = mmap(NULL, HZP_TOTAL_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) c->map = m;
  }
  close(fd);
}

/* Validates one raw ruleset and, when out is non-NULL, unpacks it. */
static int hz_set_decode(const uint8_t* raw, struct hz_set* out) {
  uint32_t n_rules = hz_ld32(raw);
  if (n_rules > HZP_MAX_RULES) return 0;
  for (uint32_t r = 0; r < n_rules; r++) {
    const uint8_t* rr = raw + 8 + r * HZP_RULE_SIZE;
    uint32_t mask = hz_ld32(rr + HZP_RULE_OFF_COLL_MASK);
    uint32_t max_channels = hz_ld32(rr + HZP_RULE_OFF_MAX_CHANNELS);
    uint64_t min_bytes = hz_ld64(rr + HZP_RULE_OFF_MIN_BYTES);
    uint64_t max_bytes = hz_ld64(rr + HZP_RULE_OFF_MAX_BYTES);
    uint8_t n_prefs = rr[HZP_RULE_OFF_N_PREFS];
    if ((mask & ~HZP_COLL_MASK_VALID) != 0 || max_channels > INT_MAX || min_bytes > max_bytes ||
        n_prefs > HZP_MAX_PREFS)
      return 0;
    for (unsigned k = 0; k < n_prefs; k++) {
      unsigned a = rr[HZP_RULE_OFF_PREFS + k] >> 4, p = rr[HZP_RULE_OFF_PREFS + k] & 0xF;
      if ((a != HZP_ANY && a >= HZP_NUM_ALGOS) || (p != HZP_ANY && p >= HZP_NUM_PROTOS)) return 0;
    }
    if (out != NULL) {
      struct hz_rule* dst = &out->rules[r];
      dst->coll_mask = mask;
      dst->max_channels = max_channels;
      dst->min_bytes = min_bytes;
      dst->max_bytes = max_bytes;
      dst->n_prefs = n_prefs;
      for (unsigned k = 0; k < n_prefs; k++) {
        dst->algo[k] = rr[HZP_RULE_OFF_PREFS + k] >> 4;
        dst->proto[k] = rr[HZP_RULE_OFF_PREFS + k] & 0xF;
      }
    }
  }
  if (out != NULL) out->n_rules = n_rules;
  return 1;
}

/* Validates the private copy in c->image and caches what this context needs.
 * Every byte is untrusted: all indices are checked before use. */
static int hz_adopt(struct hz_ctx* c) {
  const uint8_t* img = (const uint8_t*)c->image;
  if (hz_ld32(img + HZP_OFF_MAGIC) != HZP_MAGIC || hz_ld16(img + HZP_OFF_VERSION) != HZP_VERSION ||
      hz_ld16(img + HZP_OFF_HEADER_SIZE) != HZP_HEADER_SIZE)
    return 0;
  unsigned n_comms = hz_ld16(img + HZP_OFF_N_COMMS);
  unsigned n_sets = hz_ld16(img + HZP_OFF_N_RULESETS);
  if (n_comms > HZP_MAX_COMMS || n_sets > HZP_MAX_SETS) return 0;
  if (hz_ld32(img + HZP_OFF_CHECKSUM) != hz_policy_checksum(img)) return 0;
  int mine = -1;
  for (unsigned i = 0; i < n_comms; i++) {
    const uint8_t* e = img + HZP_OFF_COMMS + i * HZP_COMM_SIZE;
    unsigned b = hz_ld16(e + HZP_COMM_OFF_BEFORE), a = hz_ld16(e + HZP_COMM_OFF_AFTER);
    if ((b != HZP_NO_SET && b >= n_sets) || (a != HZP_NO_SET && a >= n_sets)) return 0;
    uint64_t id = hz_ld64(e + HZP_COMM_OFF_ID);
    for (unsigned j = 0; j < i; j++)
      if (hz_ld64(img + HZP_OFF_COMMS + j * HZP_COMM_SIZE) == id) return 0; /* ambiguous */
    if (id == c->comm_id) mine = (int)i;
  }
  for (unsigned s = 0; s < n_sets; s++)
    if (!hz_set_decode(img + HZP_OFF_SETS + s * HZP_SET_SIZE, NULL)) return 0;

  c->policy_id = hz_ld32(img + HZP_OFF_POLICY_ID);
  c->stale_after_ns = hz_ld64(img + HZP_OFF_STALE_AFTER);
  c->listed = mine >= 0;
  c->before = c->after = NULL;
  if (mine >= 0) {
    const uint8_t* e = img + HZP_OFF_COMMS + (unsigned)mine * HZP_COMM_SIZE;
    unsigned b = hz_ld16(e + HZP_COMM_OFF_BEFORE), a = hz_ld16(e + HZP_COMM_OFF_AFTER);
    c->activate_at = hz_ld64(e + HZP_COMM_OFF_ACTIVATE_AT);
    if (b != HZP_NO_SET) {
      hz_set_decode(img + HZP_OFF_SETS + b * HZP_SET_SIZE, &c->sets[0]);
      c->before = &c->sets[0];
    }
    if (a != HZP_NO_SET) {
      hz_set_decode(img + HZP_OFF_SETS + a * HZP_SET_SIZE, &c->sets[1]);
      c->after = &c->sets[1];
    }
  }
  return 1;
}

/* Seqlock read of the whole policy into c->image; `seen` is the seq the
 * caller just loaded. Returns 0 when no consistent copy could be taken on
 * this call (writer active or a write raced the copy); bounded, never spins. */
static int hz_refresh(struct hz_ctx* c, uint64_t seen) {
  const uint64_t* live = (const uint64_t*)c->map;
  const uint64_t* seq = live + HZP_OFF_SEQ / 8;
  for (int attempt = 0; attempt < HZ_COPY_ATTEMPTS; attempt++) {
    uint64_t s1 = attempt == 0 ? seen : __atomic_load_n(seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) return 0;
    /* Word-wise relaxed atomic loads: racing the writer is expected here,
     * and this keeps the racy reads well-defined; seq decides validity. */
    for (unsigned i = 0; i < HZP_TOTAL_SIZE / 8; i++)
      c->image[i] = __atomic_load_n(live + i, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(seq, __ATOMIC_RELAXED) != s1) continue;
    c->seq = s1;
    c->state = hz_adopt(c) ? HZ_VALID : HZ_INVALID;
    return 1;
  }
  return 0;
}

/* ---- The per-call path. ---- */

/* The policy could not be used on this call: count it, and now and then try
 * to (re)open the file. */
static void hz_fallback(struct hz_ctx* c) {
  c->fallbacks++;
  if (c->slot != NULL) hz_slot_store64(c->slot, HZS_SLOT_OFF_FALLBACKS, c->fallbacks);
  if (--c->recheck == 0) {
    c->recheck = HZ_RECHECK_EVERY;
    hz_map(c);
  }
}

static void hz_apply_prefs(const struct hz_rule* r, float* t, int numAlgo, int numProto) {
  for (unsigned k = 0; k < r->n_prefs; k++) {
    int a0 = 0, a1 = numAlgo, p0 = 0, p1 = numProto;
    if (r->algo[k] != HZP_ANY) {
      a0 = r->algo[k];
      a1 = a0 + 1;
      if (a1 > numAlgo) continue;
    }
    if (r->proto[k] != HZP_ANY) {
      p0 = r->proto[k];
      p1 = p0 + 1;
      if (p1 > numProto) continue;
    }
    int best = -1;
    float best_cost = 0.0f;
    for (int a = a0; a < a1; a++) {
      for (int p = p0; p < p1; p++) {
        float v = t[a * numProto + p];
        /* Negative (NCCL_ALGO_PROTO_IGNORE) and NaN are never candidates. */
        if (v >= 0.0f && (best < 0 || v < best_cost)) {
          best = a * numProto + p;
          best_cost = v;
        }
      }
    }
    if (best >= 0) {
      t[best] = 0.0f;
      return;
    }
  }
}

static void hz_collinfo(struct hz_ctx* c, int coll, size_t nBytes, float** table, int numAlgo,
                        int numProto, int* nChannels) {
  if (c == NULL) return; /* inert context */
  uint64_t n = c->n++;
  if (c->slot != NULL) hz_slot_store64(c->slot, HZS_SLOT_OFF_COLLECTIVES, n + 1);
  if (c->map == NULL) {
    hz_fallback(c);
    return;
  }
  const uint64_t* live = (const uint64_t*)c->map;
  uint64_t seq = __atomic_load_n(live + HZP_OFF_SEQ / 8, __ATOMIC_ACQUIRE);
  /* No consistent copy this call (agent mid-write): if an earlier copy was
   * valid, keep following it rather than NCCL's own choice. Other ranks are
   * following that same copy or the new one, which agree on every collective
   * before the new activate_at; NCCL's choice could differ from both, and
   * ranks that disagree on algorithm/protocol hang. */
  if ((c->state == HZ_UNKNOWN || seq != c->seq) && !hz_refresh(c, seq) && c->state != HZ_VALID) {
    hz_fallback(c);
    return;
  }
  if (c->state != HZ_VALID) {
    hz_fallback(c);
    return;
  }
  /* Load the heartbeat before reading the clock, so a live agent's
   * heartbeat is never ahead of `now`; one that is (a bogus writer) wraps
   * the unsigned difference and reads as stale. */
  uint64_t heartbeat = __atomic_load_n(live + HZP_OFF_HEARTBEAT / 8, __ATOMIC_ACQUIRE);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  if (now - heartbeat > c->stale_after_ns) {
    hz_fallback(c);
    return;
  }
  if (c->slot != NULL && c->applied_id != c->policy_id) {
    c->applied_id = c->policy_id;
    hz_slot_store64(c->slot, HZS_SLOT_OFF_POLICY_ID, c->policy_id);
  }
  if (!c->listed) return;
  const struct hz_set* set = n >= c->activate_at ? c->after : c->before;
  if (set == NULL) return;
  const struct hz_rule* rule = NULL;
  for (uint32_t i = 0; i < set->n_rules; i++) {
    const struct hz_rule* r = &set->rules[i];
    int coll_ok = r->coll_mask == 0 || ((unsigned)coll < 32 && ((r->coll_mask >> coll) & 1u));
    if (coll_ok && (uint64_t)nBytes >= r->min_bytes && (uint64_t)nBytes <= r->max_bytes) {
      rule = r;
      break;
    }
  }
  if (rule == NULL) return;
  if (table != NULL && numAlgo > 0 && numProto > 0)
    hz_apply_prefs(rule, (float*)table, numAlgo, numProto);
  if (nChannels != NULL && rule->max_channels > 0) {
    int cap = (int)rule->max_channels;
    /* Lower only: 0 means NCCL decides, so it is replaced; a non-zero value
     * NCCL passed in is never raised. */
    if (*nChannels == 0 || *nChannels > cap) *nChannels = cap;
  }
}

/* ---- Init and teardown. ---- */

static int hz_job_valid(const char* job) {
  size_t len = 0;
  for (; job[len] != '\0'; len++) {
    char ch = job[len];
    int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
             strchr("._:@+-", ch) != NULL;
    if (!ok || len >= HZ_JOB_MAX) return 0;
  }
  return len > 0;
}

#define HZ_LOG(log, level, ...) \
  do {                                                                              \
    if ((log) != NULL) (log)((level), HZ_LOGSYS_TUNING, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static struct hz_ctx* hz_open(uint64_t comm_id, size_t nRanks, size_t nNodes, hz_logger_t log) {
  const char* job = getenv("HARMONAIZE_JOB");
  if (job == NULL) {
    HZ_LOG(log, HZ_LOG_INFO, HZ_NAME " tuner: HARMONAIZE_JOB is not set; leaving NCCL's choices");
    return NULL;
  }
  if (!hz_job_valid(job)) {
    HZ_LOG(log, HZ_LOG_WARN,
           HZ_NAME " tuner: HARMONAIZE_JOB is not 1-128 of [A-Za-z0-9._:@+-]; "
                   "leaving NCCL's choices");
    return NULL;
  }
  const char* dir = getenv("HARMONAIZE_TUNER_DIR");
  if (dir == NULL || dir[0] == '\0') dir = HZ_DEFAULT_DIR;
  struct hz_ctx* c = calloc(1, sizeof *c);
  if (c == NULL) {
    HZ_LOG(log, HZ_LOG_WARN, HZ_NAME " tuner: out of memory; leaving NCCL's choices");
    return NULL;
  }
  int len = snprintf(c->policy_path, sizeof c->policy_path, "%s/%s.policy", dir, job);
  if (len < 0 || (size_t)len >= sizeof c->policy_path) {
    HZ_LOG(log, HZ_LOG_WARN, HZ_NAME " tuner: policy path too long; leaving NCCL's choices");
    free(c);
    return NULL;
  }
  c->comm_id = comm_id;
  c->log = log;
  c->recheck = HZ_RECHECK_EVERY;
  hz_map(c);
  int stats = hz_stats_attach(c, dir, job, nRanks, nNodes);
  HZ_LOG(log, HZ_LOG_INFO, HZ_NAME " tuner: job %s comm 0x%016llx policy %s (%s), stats %s", job,
         (unsigned long long)comm_id, c->policy_path, c->map != NULL ? "mapped" : "not yet",
         stats ? "on" : "off");
  return c;
}

static hz_result_t hz_init_v3(size_t nRanks, size_t nNodes, hz_logger_t log, void** context) {
  if (context == NULL) return HZ_SUCCESS;
  /* No communicator id before v5: a key every rank of the communicator
   * computes alike; bit 63 keeps it apart from NCCL's random commIds only
   * by convention, which the agent mirrors (pseudo_comm_id in shm.py). */
  uint64_t key = (1ull << 63) | ((uint64_t)nRanks << 20) | (uint64_t)nNodes;
  *context = hz_open(key, nRanks, nNodes, log);
  return HZ_SUCCESS;
}

static hz_result_t hz_init_v5(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                              hz_logger_t log, hz_nvl_domain_info_t* nvl,
                              hz_tuner_constants_t* constants) {
  (void)nvl;
  (void)constants; /* NCCL's cost model constants are left as they are */
  if (context == NULL) return HZ_SUCCESS;
  *context = hz_open(commId, nRanks, nNodes, log);
  return HZ_SUCCESS;
}

static hz_result_t hz_destroy(void* context) {
  struct hz_ctx* c = context;
  if (c == NULL) return HZ_SUCCESS;
  hz_stats_detach(c);
  hz_unmap(c);
  free(c);
  return HZ_SUCCESS;
}

static hz_result_t hz_getcollinfo_v3(void* context, int collType, size_t nBytes, int numPipeOps,
                                     float** table, int numAlgo, int numProto, int* nChannels) {
  (void)numPipeOps;
  hz_collinfo(context, collType, nBytes, table, numAlgo, numProto, nChannels);
  return HZ_SUCCESS;
}

static hz_result_t hz_getcollinfo_v4(void* context, int collType, size_t nBytes, int numPipeOps,
                                     float** table, int numAlgo, int numProto, int regBuff,
                                     int* nChannels) {
  (void)numPipeOps;
  (void)regBuff;
  hz_collinfo(context, collType, nBytes, table, numAlgo, numProto, nChannels);
  return HZ_SUCCESS;
}

HZ_EXPORT const hz_tuner_v3_t ncclTunerPlugin_v3 = {
    .name = HZ_NAME,
    .init = hz_init_v3,
    .getCollInfo = hz_getcollinfo_v3,
    .destroy = hz_destroy,
};

HZ_EXPORT const hz_tuner_v4_t ncclTunerPlugin_v4 = {
    .name = HZ_NAME,
    .init = hz_init_v3,
    .getCollInfo = hz_getcollinfo_v4,
    .destroy = hz_destroy,
};

HZ_EXPORT const hz_tuner_v5_t ncclTunerPlugin_v5 = {
    .name = HZ_NAME,
    .init = hz_init_v5,
    .getCollInfo = hz_getcollinfo_v4,
    .finalize = hz_destroy,
};

/* getChunkSize stays NULL: NCCL checks for NULL and keeps its own chunk size. */
HZ_EXPORT const hz_tuner_v6_t ncclTunerPlugin_v6 = {
    .name = HZ_NAME,
    .init = hz_init_v5,
    .getCollInfo = hz_getcollinfo_v4,
    .finalize = hz_destroy,
    .getChunkSize = NULL,
};
