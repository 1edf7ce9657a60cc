/*
 * HarmonAIze NCCL tuner plugin.
 *
 * NCCL loads this library inside the tenant's training process. On every
 * collective, getCollInfo follows the host agent's policy for its
 * communicator (<dir>/<job>/policy, mapped read-only, layout in hz_shm.h)
 * and nudges NCCL's cost table: the preferred enabled algorithm/protocol
 * gets cost 0.0, and on NCCL releases that take it as a cap, the channel
 * count may be lowered. Every entry point returns success, because NCCL
 * turns a tuner error into a failed communicator or collective.
 *
 * The one property everything here serves: every rank of a communicator
 * gives the same answer at every collective index, whatever fails. So
 *
 * - nothing depends on a clock. A context that follows an entry keeps
 *   following it while the agent is dead, stopped or slow; only a new copy of
 *   its entry changes what it does, and only from an index on.
 * - a context follows one entry (its *held* copy) and accepts a new one only
 *   if the two give the same answer for every collective up to the new one's
 *   switching point, which must not lie behind the rank (see hz_evaluate). A
 *   copy that would change the past is refused and reported; one that can
 *   only be judged once this rank passes its own pending switch is deferred
 *   to that index. Revisions only rise, so an agent that lost its state
 *   (an empty or older policy) cannot undo what ranks follow.
 * - a change armed but not yet confirmed (PENDING) makes a rank that reaches
 *   its switching index wait, polling, until the agent confirms or cancels
 *   it. Ranks on a host cut off between arming and confirmation therefore
 *   pause instead of disagreeing with ranks elsewhere. This is the only path
 *   that sleeps; it is never taken while the agent answers in time.
 * - the file is looked for (appeared, replaced) at collective indices that
 *   are multiples of HZ_RECHECK_EVERY / HZ_REPLACED_EVERY, the same on every
 *   rank, never on a timer.
 *
 * getCollInfo does not allocate, lock or make a system call on the steady
 * path: one acquire load of the policy's seq, one relaxed store of the
 * collective count. A stat() every HZ_REPLACED_EVERY calls looks for a
 * replaced file.
 *
 * Channel counts: NCCL 2.22-2.30 pass *nChannels as 0 and use any non-zero
 * value as the count itself, unclamped on the CollNet/NVLS paths; only from
 * 2.31 is it a cap. The plugin asks the process's NCCL for its version
 * (ncclGetVersion) at init and touches *nChannels only on 2.31 and later,
 * never above 64 (NCCL's MAXCHANNELS; the field is an 8-bit bitfield) and
 * never above a non-zero value NCCL passed in.
 *
 * Exported: ncclTunerPlugin_v6, _v5, _v4, _v3. v2 is deliberately absent: it
 * returns an algorithm and protocol without seeing NCCL's cost table, so the
 * plugin could not tell which combinations NCCL disabled.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hz_shm.h"
#include "hz_tuner_abi.h"

#define HZ_EXPORT __attribute__((visibility("default")))
/* Off the per-call path: kept out of line so the hot path stays small. */
#define HZ_COLD __attribute__((noinline, cold))
#define HZ_NAME "HarmonAIze"
#define HZ_DEFAULT_DIR "/run/harmonaize/tuner"
#define HZ_JOB_MAX 128
/* Collective indices at which a rank looks for its policy and stats file while it
 * has none (multiples of the first), and for a file that replaced its mapped one
 * (multiples of the second): the same indices on every rank. A failed open costs
 * about 1 us, so a rank without a policy pays ~4 ns per collective for it. */
#define HZ_RECHECK_EVERY 256u
#define HZ_REPLACED_EVERY 1024u
/* Seqlock copy attempts per call before giving up for that call. */
#define HZ_COPY_ATTEMPTS 2
/* A waiting rank polls the policy this often, and looks for a replaced file
 * every HZ_WAIT_REMAP polls. */
#define HZ_WAIT_POLL_NS 1000000L
#define HZ_WAIT_REMAP 100
#define HZ_WAIT_WARN_POLLS 1000
/* NCCL's most channels, and the first release that takes *nChannels as a cap. */
#define HZ_MAX_CHANNELS 64
#define HZ_NCCL_CAP_VERSION 23100
#define HZ_STATS_FILES 4
#define HZ_NO_INDEX UINT64_MAX
/* The answer "wait here": an armed change not yet confirmed. */
#define HZ_WAIT_VALUE UINT64_MAX

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

/* One communicator's entry as a context holds it. Unlisted means NCCL's own
 * choice at every index (revision 0). A hash of 0 is NCCL's own choice. */
struct hz_entry {
  uint64_t at;
  uint64_t before_hash;
  uint64_t after_hash;
  uint32_t revision;
  uint8_t listed;
  uint8_t pending;
  struct hz_set before;
  struct hz_set after;
};

enum hz_verdict { HZ_ACCEPT, HZ_DEFER, HZ_REFUSE };

struct hz_stats_file {
  char path[PATH_MAX];
  uint8_t* map;
  int guard; /* its entry in g_guard, or -1 */
  int fd; /* kept open: its shared lock tells the agent the process lives */
  int refs;
  pid_t pid;
  int gone; /* someone removed it: contexts move to a new file at their next recheck */
};

/* One per communicator. NCCL calls a communicator's getCollInfo from one
 * thread at a time, so nothing here is shared between threads except the
 * stats files (guarded at init/destroy by g_stats_lock). */
struct hz_ctx {
  /* Hot fields first. */
  uint64_t n;         /* index of the next collective */
  const uint8_t* map; /* policy mapping (HZP_TOTAL_SIZE bytes) or NULL */
  uint64_t seq;       /* seq of the last copy examined */
  int seq_known;
  uint64_t defer_at;  /* index at which `cand` is judged again, or HZ_NO_INDEX */
  uint64_t cur_hash;  /* the ruleset the previous call used */
  uint8_t* slot;      /* stats slot or NULL */
  uint32_t fallbacks;
  int channels_ok;    /* this NCCL takes *nChannels as a cap */
  struct hz_entry held;

  uint64_t comm_id;
  size_t n_ranks, n_nodes;
  hz_logger_t log;
  dev_t map_dev;
  ino_t map_ino;
  int map_guard; /* the policy mapping's entry in g_guard, or -1 */
  uint64_t history;
  uint64_t prev_history;
  uint64_t last_switch;
  uint32_t switches;
  uint32_t refusals;
  uint32_t refused_rev;
  uint32_t flags; /* HZS_FLAG_* as last published */
  int logged_refusal;
  struct hz_stats_file* stats;
  struct hz_entry cand;
  char dir[PATH_MAX];
  char job[HZ_JOB_MAX + 1];
  char policy_path[PATH_MAX];
  uint64_t image[HZP_TOTAL_SIZE / 8]; /* private copy of the policy */
};

#define HZ_LOG(log, level, ...)                                                           \
  do {                                                                                    \
    if ((log) != NULL) (log)((level), HZ_LOGSYS_TUNING, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/* ---- The process's NCCL ---- */

typedef int (*hz_get_version_fn)(int*);

/* ncclGetVersion of the NCCL that loaded us: from the global scope, or from
 * the library that holds NCCL's logger (PyTorch loads NCCL privately, out of
 * the global scope). 0 when neither says. */
static int hz_nccl_version(hz_logger_t log) {
  hz_get_version_fn get = (hz_get_version_fn)dlsym(RTLD_DEFAULT, "ncclGetVersion");
  void* handle = NULL;
  if (get == NULL && log != NULL) {
    Dl_info info;
    if (dladdr((void*)log, &info) != 0 && info.dli_fname != NULL) {
      handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
      if (handle != NULL) get = (hz_get_version_fn)dlsym(handle, "ncclGetVersion");
    }
  }
  int version = 0;
  if (get == NULL || get(&version) != 0 || version < 0) version = 0;
  if (handle != NULL) dlclose(handle);
  return version;
}

/* ---- Stats files: one per process and job directory, shared by its contexts ---- */

static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hz_stats_file g_stats[HZ_STATS_FILES];

/* ---- Mappings that cannot fault ----
 * A mapped file that shrinks underneath (truncated in place: root can, and the
 * owner of a stats file) raises SIGBUS at the next touch of a page past its new
 * end, which would kill the rank. A SIGBUS handler, installed with the first
 * mapping, turns a fault inside one of our mappings into private zero-filled
 * memory over the whole mapping, and marks it torn: reads see zeros (a policy
 * copy that is invalid, so it changes nothing the rank follows), writes go
 * nowhere, and the next index-tied recheck drops the mapping and maps the file
 * anew (or a new stats file). The hot path pays nothing. A fault anywhere else
 * goes to the handler there was before, or to the default action (the fault
 * repeats with it restored). A program that installs its own SIGBUS handler
 * after us, without chaining, loses this protection and nothing else. */
#define HZ_GUARDED (2 * HZ_STATS_FILES + 64)
struct hz_guard {
  uintptr_t start; /* 0: free */
  size_t len;
  int prot;
  int torn;
};
static struct hz_guard g_guard[HZ_GUARDED];
static struct sigaction g_prev_bus;
static pthread_once_t g_bus_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_guard_lock = PTHREAD_MUTEX_INITIALIZER;

static void hz_on_sigbus(int sig, siginfo_t* si, void* uc) {
  uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; i < HZ_GUARDED; i++) {
    uintptr_t s = __atomic_load_n(&g_guard[i].start, __ATOMIC_ACQUIRE);
    size_t len = __atomic_load_n(&g_guard[i].len, __ATOMIC_RELAXED);
    if (s == 0 || a < s || a >= s + len) continue;
    int saved = errno;
    void* m = mmap((void*)s, len, g_guard[i].prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    errno = saved;
    if (m != MAP_FAILED) {
      __atomic_store_n(&g_guard[i].torn, 1, __ATOMIC_RELEASE);
      return; /* the faulting read or write is retried on the zeros */
    }
    break;
  }
  if ((g_prev_bus.sa_flags & SA_SIGINFO) && g_prev_bus.sa_sigaction != NULL) {
    g_prev_bus.sa_sigaction(sig, si, uc);
  } else if (!(g_prev_bus.sa_flags & SA_SIGINFO) && g_prev_bus.sa_handler != SIG_DFL &&
             g_prev_bus.sa_handler != SIG_IGN) {
    g_prev_bus.sa_handler(sig);
  } else {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL); /* the fault repeats and takes its default course */
  }
}

static void hz_bus_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = hz_on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_prev_bus);
}

/* Registers a mapping for the handler; returns its entry (-1: none free, then a
 * shrinking file could still fault, as without this). */
static int hz_guard_add(const void* start, size_t len, int prot) {
  pthread_once(&g_bus_once, hz_bus_install);
  pthread_mutex_lock(&g_guard_lock);
  int found = -1;
  for (int i = 0; i < HZ_GUARDED && found < 0; i++) {
    if (g_guard[i].start != 0) continue;
    g_guard[i].len = len;
    g_guard[i].prot = prot;
    __atomic_store_n(&g_guard[i].torn, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_guard[i].start, (uintptr_t)start, __ATOMIC_RELEASE);
    found = i;
  }
  pthread_mutex_unlock(&g_guard_lock);
  return found;
}

static void hz_guard_drop(int i) {
  if (i < 0) return;
  __atomic_store_n(&g_guard[i].start, 0, __ATOMIC_RELEASE);
}

static int hz_guard_torn(int i) {
  return i >= 0 && __atomic_load_n(&g_guard[i].torn, __ATOMIC_ACQUIRE);
}
static int g_nccl_version = -1;

static inline void hz_store64(uint8_t* p, uint64_t v) {
  __atomic_store_n((uint64_t*)p, v, __ATOMIC_RELAXED);
}

static inline void hz_store32(uint8_t* p, uint32_t v) {
  __atomic_store_n((uint32_t*)p, v, __ATOMIC_RELAXED);
}

static uint64_t hz_random64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
  }
  return v;
}

/* Creates <dir>/<job>/<pid>-<tag>.stats: written and locked under a hidden
 * name first, then renamed, so the agent never sees (and never takes for the
 * file of a dead process) one that is not yet locked. O_EXCL and the random
 * tag keep processes of other pid namespaces sharing the directory apart. */
static int hz_stats_create(struct hz_stats_file* f, const char* jobdir) {
  uint64_t tag = hz_random64();
  char tmp[PATH_MAX];
  int n1 = snprintf(f->path, sizeof f->path, "%s/%ld-%016llx.stats", jobdir, (long)getpid(),
                    (unsigned long long)tag);
  int n2 = snprintf(tmp, sizeof tmp, "%s/.%ld-%016llx.tmp", jobdir, (long)getpid(),
                    (unsigned long long)tag);
  if (n1 < 0 || n2 < 0 || (size_t)n1 >= sizeof f->path || (size_t)n2 >= sizeof tmp) return 0;
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0640);
  if (fd < 0) return 0;
  uint8_t* map = NULL;
  /* The job's group (the directory's), so the agent and only the job's other ranks
   * may read it; independent of the tenant's umask and primary group. */
  struct stat dir;
  if (stat(jobdir, &dir) == 0 && fchown(fd, (uid_t)-1, dir.st_gid) != 0) {
    /* not a member of the job's group: the file keeps this process's group */
  }
  (void)fchmod(fd, 0640);
  if (flock(fd, LOCK_SH | LOCK_NB) == 0 && ftruncate(fd, HZS_TOTAL_SIZE) == 0) {
    void* m = mmap(NULL, HZS_TOTAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) map = m;
  }
  if (map != NULL) {
    hz_st32(map + HZS_OFF_MAGIC, HZS_MAGIC);
    hz_st16(map + HZS_OFF_VERSION, HZS_VERSION);
    hz_st16(map + HZS_OFF_N_SLOTS, HZS_N_SLOTS);
    hz_st32(map + HZS_OFF_PID, (uint32_t)getpid());
    hz_st32(map + HZS_OFF_NCCL_VERSION, (uint32_t)(g_nccl_version > 0 ? g_nccl_version : 0));
    hz_st64(map + HZS_OFF_TAG, tag);
    if (rename(tmp, f->path) != 0) {
      munmap(map, HZS_TOTAL_SIZE);
      map = NULL;
    }
  }
  if (map == NULL) {
    unlink(tmp);
    close(fd);
    return 0;
  }
  f->map = map;
  f->guard = hz_guard_add(map, HZS_TOTAL_SIZE, PROT_READ | PROT_WRITE);
  f->fd = fd;
  f->refs = 0;
  f->pid = getpid();
  return 1;
}

static void hz_stats_release(struct hz_stats_file* f) {
  if (--f->refs > 0) return;
  /* Last context of the process in this job: the file describes nothing. */
  hz_guard_drop(f->guard);
  munmap(f->map, HZS_TOTAL_SIZE);
  unlink(f->path);
  close(f->fd);
  memset(f, 0, sizeof *f);
}

/* Publishes the context's cold fields under the slot's seqlock. */
static void hz_slot_publish(struct hz_ctx* c) {
  uint8_t* s = c->slot;
  if (s == NULL) return;
  uint32_t* seq = (uint32_t*)(s + HZS_SLOT_OFF_SEQ);
  uint32_t v = __atomic_load_n(seq, __ATOMIC_RELAXED);
  __atomic_store_n(seq, v + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  uint32_t flags = c->flags;
  flags = c->map != NULL ? flags | HZS_FLAG_MAPPED : flags & ~HZS_FLAG_MAPPED;
  flags = c->held.listed ? flags | HZS_FLAG_LISTED : flags & ~HZS_FLAG_LISTED;
  flags = c->held.pending ? flags | HZS_FLAG_PENDING : flags & ~HZS_FLAG_PENDING;
  flags = c->channels_ok ? flags | HZS_FLAG_CHANNELS : flags & ~HZS_FLAG_CHANNELS;
  c->flags = flags;
  hz_store32(s + HZS_SLOT_OFF_FLAGS, flags);
  hz_store32(s + HZS_SLOT_OFF_REVISION, c->held.revision);
  hz_store64(s + HZS_SLOT_OFF_AT, c->held.at);
  hz_store64(s + HZS_SLOT_OFF_BEFORE_HASH, c->held.before_hash);
  hz_store64(s + HZS_SLOT_OFF_AFTER_HASH, c->held.after_hash);
  hz_store64(s + HZS_SLOT_OFF_LAST_SWITCH, c->last_switch);
  hz_store64(s + HZS_SLOT_OFF_HISTORY, c->history);
  hz_store64(s + HZS_SLOT_OFF_PREV_HISTORY, c->prev_history);
  hz_store32(s + HZS_SLOT_OFF_SWITCHES, c->switches);
  hz_store32(s + HZS_SLOT_OFF_REFUSED_REV, c->refused_rev);
  hz_store64(s + HZS_SLOT_OFF_POLICY_DEV, c->map != NULL ? (uint64_t)c->map_dev : 0);
  hz_store64(s + HZS_SLOT_OFF_POLICY_INO, c->map != NULL ? (uint64_t)c->map_ino : 0);
  hz_store32(s + HZS_SLOT_OFF_REFUSALS, c->refusals);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(seq, v + 2, __ATOMIC_RELEASE);
}

/* Claims a slot for c in its job's stats file; 0 when stats are unavailable
 * (no directory yet, no permission, all slots taken). */
static int hz_stats_attach(struct hz_ctx* c) {
  char jobdir[PATH_MAX];
  int len = snprintf(jobdir, sizeof jobdir, "%s/%s", c->dir, c->job);
  if (len < 0 || (size_t)len >= sizeof jobdir) return 0;
  pthread_mutex_lock(&g_stats_lock);
  struct hz_stats_file* f = NULL;
  pid_t pid = getpid();
  size_t dirlen = (size_t)len;
  for (int i = 0; i < HZ_STATS_FILES && f == NULL; i++) {
    struct hz_stats_file* g = &g_stats[i];
    /* A file inherited across fork() belongs to the parent: never reuse it. */
    if (g->map != NULL && g->pid == pid && !g->gone && strncmp(g->path, jobdir, dirlen) == 0 &&
        g->path[dirlen] == '/')
      f = g;
  }
  for (int i = 0; i < HZ_STATS_FILES && f == NULL; i++) {
    struct hz_stats_file* g = &g_stats[i];
    if (g->map == NULL || g->pid != pid) {
      if (g->map != NULL) memset(g, 0, sizeof *g); /* the parent's: leave its mapping be */
      if (hz_stats_create(g, jobdir)) f = g;
      break;
    }
  }
  if (f != NULL) {
    for (unsigned i = 0; i < HZS_N_SLOTS; i++) {
      uint8_t* s = f->map + HZS_HEADER_SIZE + i * HZS_SLOT_SIZE;
      if (__atomic_load_n((uint32_t*)(s + HZS_SLOT_OFF_IN_USE), __ATOMIC_RELAXED) != 0) continue;
      memset(s, 0, HZS_SLOT_SIZE);
      hz_store64(s + HZS_SLOT_OFF_COMM_ID, c->comm_id);
      hz_st32(s + HZS_SLOT_OFF_N_RANKS,
              c->n_ranks > UINT32_MAX ? UINT32_MAX : (uint32_t)c->n_ranks);
      hz_st32(s + HZS_SLOT_OFF_N_NODES,
              c->n_nodes > UINT32_MAX ? UINT32_MAX : (uint32_t)c->n_nodes);
      hz_store64(s + HZS_SLOT_OFF_COLLECTIVES, c->n);
      hz_store32(s + HZS_SLOT_OFF_FALLBACKS, c->fallbacks);
      c->slot = s;
      c->stats = f;
      f->refs++;
      hz_slot_publish(c);
      __atomic_store_n((uint32_t*)(s + HZS_SLOT_OFF_IN_USE), 1u, __ATOMIC_RELEASE);
      break;
    }
    if (c->slot == NULL && f->refs == 0) {
      f->refs = 1;
      hz_stats_release(f);
    }
  }
  pthread_mutex_unlock(&g_stats_lock);
  return c->slot != NULL;
}

static void hz_stats_detach(struct hz_ctx* c) {
  if (c->slot == NULL) return;
  pthread_mutex_lock(&g_stats_lock);
  /* A context inherited across fork() writes nothing: the slot is the parent's. */
  if (c->stats->pid == getpid()) {
    __atomic_store_n((uint32_t*)(c->slot + HZS_SLOT_OFF_IN_USE), 0u, __ATOMIC_RELEASE);
    hz_stats_release(c->stats);
  }
  c->slot = NULL;
  c->stats = NULL;
  pthread_mutex_unlock(&g_stats_lock);
}

/* ---- Policy mapping and validation ---- */

static void hz_unmap(struct hz_ctx* c) {
  if (c->map != NULL) {
    hz_guard_drop(c->map_guard);
    munmap((void*)c->map, HZP_TOTAL_SIZE);
  }
  c->map_guard = -1;
  c->map = NULL;
  c->seq_known = 0;
}

/* (Re)maps the policy file. Maps only a regular file at least
 * HZP_TOTAL_SIZE long owned by root or by this process's user (anyone else
 * could have planted it), so reading the mapping cannot run past its end.
 * The agent replaces the file only by rename and never truncates it. The
 * held entry is kept: a new file's copy is judged like any other. */
static void hz_map(struct hz_ctx* c) {
  int fd = open(c->policy_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= (off_t)HZP_TOTAL_SIZE &&
      (st.st_uid == 0 || st.st_uid == geteuid())) {
    void* m = mmap(NULL, HZP_TOTAL_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      hz_unmap(c);
      c->map = m;
      c->map_guard = hz_guard_add(m, HZP_TOTAL_SIZE, PROT_READ);
      c->map_dev = st.st_dev;
      c->map_ino = st.st_ino;
    }
  }
  close(fd);
}

/* Canonical identity of a ruleset: what it decides, not how it is stored.
 * An empty ruleset is NCCL's own choice, like no ruleset (hash 0). */
static uint64_t hz_set_hash(const struct hz_set* s) {
  if (s->n_rules == 0) return 0;
  uint64_t h = hz_fnv64(HZ_FNV64_BASIS, &s->n_rules, 4);
  for (uint32_t r = 0; r < s->n_rules; r++) {
    const struct hz_rule* x = &s->rules[r];
    h = hz_fnv64(h, &x->coll_mask, 4);
    h = hz_fnv64(h, &x->max_channels, 4);
    h = hz_fnv64(h, &x->min_bytes, 8);
    h = hz_fnv64(h, &x->max_bytes, 8);
    h = hz_fnv64(h, &x->n_prefs, 1);
    for (unsigned k = 0; k < x->n_prefs; k++) {
      uint8_t b = (uint8_t)(x->algo[k] << 4 | x->proto[k]);
      h = hz_fnv64(h, &b, 1);
    }
  }
  return h == 0 ? 1 : h;
}

/* Validates one raw ruleset and, when out is non-NULL, unpacks it. */
static int hz_set_decode(const uint8_t* raw, struct hz_set* out) {
  uint32_t n_rules = hz_ld32(raw);
  if (n_rules > HZP_MAX_RULES) return 0;
  if (out != NULL) memset(out, 0, sizeof *out);
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

/* Validates the private copy in c->image and unpacks this context's entry
 * into *e. Every byte is untrusted: all indices are checked before use. */
static int hz_decode(struct hz_ctx* c, struct hz_entry* e) {
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
    const uint8_t* x = img + HZP_OFF_COMMS + i * HZP_COMM_SIZE;
    unsigned b = hz_ld16(x + HZP_COMM_OFF_BEFORE), a = hz_ld16(x + HZP_COMM_OFF_AFTER);
    if ((b != HZP_NO_SET && b >= n_sets) || (a != HZP_NO_SET && a >= n_sets)) return 0;
    if ((hz_ld16(x + HZP_COMM_OFF_FLAGS) & ~HZP_FLAGS_VALID) != 0) return 0;
    uint64_t id = hz_ld64(x + HZP_COMM_OFF_ID);
    for (unsigned j = 0; j < i; j++)
      if (hz_ld64(img + HZP_OFF_COMMS + j * HZP_COMM_SIZE) == id) return 0; /* ambiguous */
    if (id == c->comm_id) mine = (int)i;
  }
  for (unsigned s = 0; s < n_sets; s++)
    if (!hz_set_decode(img + HZP_OFF_SETS + s * HZP_SET_SIZE, NULL)) return 0;

  memset(e, 0, sizeof *e);
  if (mine < 0) return 1; /* unlisted: NCCL's own choice, revision 0 */
  const uint8_t* x = img + HZP_OFF_COMMS + (unsigned)mine * HZP_COMM_SIZE;
  unsigned b = hz_ld16(x + HZP_COMM_OFF_BEFORE), a = hz_ld16(x + HZP_COMM_OFF_AFTER);
  e->listed = 1;
  e->at = hz_ld64(x + HZP_COMM_OFF_AT);
  e->revision = hz_ld32(x + HZP_COMM_OFF_REVISION);
  e->pending = (hz_ld16(x + HZP_COMM_OFF_FLAGS) & HZP_FLAG_PENDING) != 0;
  if (b != HZP_NO_SET) hz_set_decode(img + HZP_OFF_SETS + b * HZP_SET_SIZE, &e->before);
  if (a != HZP_NO_SET) hz_set_decode(img + HZP_OFF_SETS + a * HZP_SET_SIZE, &e->after);
  e->before_hash = hz_set_hash(&e->before);
  e->after_hash = hz_set_hash(&e->after);
  return 1;
}

/* ---- Whether a new copy of the entry may replace the held one ---- */

/* What entry e answers at index i: a ruleset hash, or HZ_WAIT_VALUE. */
static uint64_t hz_value(const struct hz_entry* e, uint64_t i) {
  if (!e->listed) return 0;
  if (i < e->at) return e->before_hash;
  return e->pending ? HZ_WAIT_VALUE : e->after_hash;
}

/* Do h (held) and x (new) agree at index i? Where h waits for its armed
 * change, either outcome of it agrees (the new copy confirms or cancels),
 * and so does the same armed change. */
static int hz_same_at(const struct hz_entry* h, const struct hz_entry* x, uint64_t i) {
  uint64_t vh = hz_value(h, i), vx = hz_value(x, i);
  if (vh != HZ_WAIT_VALUE) return vh == vx;
  if (vx == HZ_WAIT_VALUE)
    return x->at == h->at && x->before_hash == h->before_hash && x->after_hash == h->after_hash;
  return vx == h->before_hash || vx == h->after_hash;
}

/* Agreement on every index of [lo, hi): both answers change only at their
 * own `at`, so those points and lo cover every piece. */
static int hz_agree(const struct hz_entry* h, const struct hz_entry* x, uint64_t lo,
                    uint64_t hi) {
  const uint64_t points[3] = {lo, h->at, x->at};
  for (int k = 0; k < 3; k++) {
    uint64_t p = points[k];
    if (p >= lo && p < hi && !hz_same_at(h, x, p)) return 0;
  }
  return 1;
}

/* The rule, for a rank about to issue collective n (agent/plugin/shm.py's
 * evaluate() is its reference):
 * - an older revision never replaces a newer one; the same revision must
 *   carry the same entry;
 * - a copy that answers like the held one from n on is taken at once;
 * - one that differs only from its own switching point `at` >= n on (beyond
 *   the held entry's armed switch, if it holds one), and answers like the held
 *   one before it, is taken: every rank that takes it before reaching `at`
 *   then switches at `at`;
 * - one that could agree once this rank passed its own held `at` is judged
 *   again at that index (deferred);
 * - anything else would change what this rank already did, or skip what it
 *   must do: refused, and reported in the stats slot. */
static enum hz_verdict hz_evaluate(const struct hz_entry* h, const struct hz_entry* x,
                                   uint64_t n, uint64_t* retry) {
  if (x->revision < h->revision) return HZ_REFUSE;
  if (x->revision == h->revision) {
    int same = x->listed == h->listed && x->at == h->at && x->pending == h->pending &&
               x->before_hash == h->before_hash && x->after_hash == h->after_hash;
    return same ? HZ_ACCEPT : HZ_REFUSE;
  }
  if (hz_agree(h, x, n, HZ_NO_INDEX)) return HZ_ACCEPT;
  /* A new switch must lie beyond an armed one the rank holds: before it, nothing
   * would decide the armed change's outcome. */
  if (x->at >= n && (!h->pending || x->at > h->at) && hz_agree(h, x, n, x->at)) return HZ_ACCEPT;
  if (h->listed && n < h->at) {
    *retry = h->at;
    return HZ_DEFER;
  }
  return HZ_REFUSE;
}

static void hz_take(struct hz_ctx* c, const struct hz_entry* x) {
  c->held = *x;
  c->defer_at = HZ_NO_INDEX;
  c->flags &= ~(HZS_FLAG_REFUSED | HZS_FLAG_DEFERRED | HZS_FLAG_INVALID);
}

HZ_COLD static void hz_judge(struct hz_ctx* c, const struct hz_entry* x, uint64_t n) {
  uint64_t retry = HZ_NO_INDEX;
  enum hz_verdict v = hz_evaluate(&c->held, x, n, &retry);
  if (v == HZ_ACCEPT) {
    hz_take(c, x);
  } else if (v == HZ_DEFER) {
    c->cand = *x;
    c->defer_at = retry;
    c->flags = (c->flags | HZS_FLAG_DEFERRED) & ~(HZS_FLAG_REFUSED | HZS_FLAG_INVALID);
  } else {
    c->defer_at = HZ_NO_INDEX;
    c->refusals++;
    c->refused_rev = x->revision;
    c->flags = (c->flags | HZS_FLAG_REFUSED) & ~(HZS_FLAG_DEFERRED | HZS_FLAG_INVALID);
    if (!c->logged_refusal) {
      c->logged_refusal = 1;
      HZ_LOG(c->log, HZ_LOG_WARN,
             HZ_NAME " tuner: comm 0x%016llx refused revision %u of its policy at collective "
                     "%llu (it would change what this rank already did); keeping revision %u",
             (unsigned long long)c->comm_id, x->revision, (unsigned long long)n,
             c->held.revision);
    }
  }
  hz_slot_publish(c);
}

/* Seqlock read of the whole policy into c->image; `seen` is the seq the
 * caller just loaded. Returns 0 when no consistent copy could be taken on
 * this call (writer active or a write raced the copy); bounded, never spins. */
static int hz_copy(struct hz_ctx* c, uint64_t seen) {
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
    c->seq_known = 1;
    return 1;
  }
  return 0;
}

/* A new seq in the mapping: take a consistent copy and judge this context's
 * entry in it. An invalid copy changes nothing (it is reported). */
HZ_COLD static void hz_consider(struct hz_ctx* c, uint64_t seq, uint64_t n) {
  if (!hz_copy(c, seq)) return; /* mid-write: the next call looks again */
  struct hz_entry x;
  if (!hz_decode(c, &x)) {
    if (!(c->flags & HZS_FLAG_INVALID)) {
      c->flags |= HZS_FLAG_INVALID;
      hz_slot_publish(c);
    }
    return;
  }
  hz_judge(c, &x, n);
}

static void hz_poll(struct hz_ctx* c, uint64_t n) {
  if (c->map == NULL) return;
  uint64_t seq = __atomic_load_n((const uint64_t*)c->map + HZP_OFF_SEQ / 8, __ATOMIC_ACQUIRE);
  if (!c->seq_known || seq != c->seq) hz_consider(c, seq, n);
}

/* At indices tied to the collective count: attach stats if not yet, map
 * the policy if not yet, and follow a file that replaced the mapped one. */
/* Whether this context's stats file was removed (by an operator, or a runtime
 * directory wiped): then it moves to a new one, so the agent sees it again. */
static void hz_stats_check(struct hz_ctx* c) {
  pthread_mutex_lock(&g_stats_lock);
  struct stat st;
  int gone = c->stats != NULL && c->stats->pid == getpid() &&
             (c->stats->gone || hz_guard_torn(c->stats->guard) ||
              (fstat(c->stats->fd, &st) == 0 &&
               (st.st_nlink == 0 || st.st_size < (off_t)HZS_TOTAL_SIZE)));
  if (gone) c->stats->gone = 1;
  pthread_mutex_unlock(&g_stats_lock);
  if (gone) hz_stats_detach(c);
}

HZ_COLD static void hz_recheck(struct hz_ctx* c, uint64_t n) {
  if (c->slot != NULL) hz_stats_check(c);
  if (c->slot == NULL && hz_stats_attach(c)) {
    hz_store64(c->slot + HZS_SLOT_OFF_COLLECTIVES, n);
  }
  if (c->map != NULL && !hz_guard_torn(c->map_guard)) {
    struct stat st;
    if (stat(c->policy_path, &st) != 0 || (st.st_dev == c->map_dev && st.st_ino == c->map_ino))
      return; /* removed (the job is done here) or unchanged: keep what is mapped */
  }
  if (c->map != NULL && hz_guard_torn(c->map_guard)) {
    hz_unmap(c); /* shrunk underneath: what it held stays held; map it again below */
    hz_slot_publish(c);
  }
  const uint8_t* before = c->map;
  hz_map(c);
  if (c->map != before) {
    hz_slot_publish(c);
    hz_poll(c, n);
  }
}

/* The rank reached the switching index of an armed change: wait, polling,
 * until a copy confirms or cancels it. Other ranks reach the same index and
 * wait too, or have already been told the outcome, which every host gets
 * alike; no rank passes the index with an answer the others may not give. */
HZ_COLD static void hz_wait(struct hz_ctx* c, uint64_t n) {
  if (c->slot != NULL) {
    c->flags |= HZS_FLAG_WAITING;
    hz_store64(c->slot + HZS_SLOT_OFF_WAIT_AT, n);
    hz_slot_publish(c);
  }
  struct timespec pause = {0, HZ_WAIT_POLL_NS};
  unsigned long polls = 0;
  while (c->held.listed && c->held.pending && n >= c->held.at) {
    nanosleep(&pause, NULL);
    polls++;
    if (polls % HZ_WAIT_REMAP == 0) hz_recheck(c, n);
    hz_poll(c, n);
    if (c->defer_at <= n) hz_judge(c, &c->cand, n);
    if (polls == HZ_WAIT_WARN_POLLS)
      HZ_LOG(c->log, HZ_LOG_WARN,
             HZ_NAME " tuner: comm 0x%016llx waits at collective %llu for the host agent to "
                     "confirm revision %u (every rank of it waits at the same index)",
             (unsigned long long)c->comm_id, (unsigned long long)n, c->held.revision);
  }
  if (polls >= HZ_WAIT_WARN_POLLS)
    HZ_LOG(c->log, HZ_LOG_INFO, HZ_NAME " tuner: comm 0x%016llx resumed at collective %llu",
           (unsigned long long)c->comm_id, (unsigned long long)n);
  if (c->slot != NULL) {
    c->flags &= ~HZS_FLAG_WAITING;
    hz_slot_publish(c);
  }
}

/* ---- The per-call path ---- */

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

HZ_COLD static void hz_switched(struct hz_ctx* c, uint64_t n, uint64_t hash) {
  uint64_t pair[2] = {n, hash};
  c->prev_history = c->history;
  c->history = hz_fnv64(c->history == 0 ? HZ_FNV64_BASIS : c->history, pair, sizeof pair);
  c->last_switch = n;
  c->switches++;
  c->cur_hash = hash;
  hz_slot_publish(c);
}

static void hz_collinfo(struct hz_ctx* c, int coll, size_t nBytes, float** table, int numAlgo,
                        int numProto, int* nChannels) {
  if (c == NULL) return; /* inert context */
  uint64_t n = c->n;
  if ((n % HZ_RECHECK_EVERY) == 0 &&
      (c->map == NULL || c->slot == NULL || (n % HZ_REPLACED_EVERY) == 0))
    hz_recheck(c, n);
  if (c->map != NULL) {
    uint64_t seq =
        __atomic_load_n((const uint64_t*)c->map + HZP_OFF_SEQ / 8, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!c->seq_known || seq != c->seq, 0)) hz_consider(c, seq, n);
  } else if (!c->held.listed && c->fallbacks != UINT32_MAX) {
    c->fallbacks++;
    if (c->slot != NULL) hz_store32(c->slot + HZS_SLOT_OFF_FALLBACKS, c->fallbacks);
  }
  if (__builtin_expect(c->defer_at <= n, 0)) hz_judge(c, &c->cand, n);

  const struct hz_set* set = NULL;
  uint64_t hash = 0;
  if (c->held.listed) {
    if (n >= c->held.at && c->held.pending) hz_wait(c, n);
    if (c->held.listed) {
      if (n < c->held.at) {
        set = &c->held.before;
        hash = c->held.before_hash;
      } else {
        set = &c->held.after;
        hash = c->held.after_hash;
      }
    }
  }
  if (__builtin_expect(hash != c->cur_hash, 0)) hz_switched(c, n, hash);
  if (set != NULL && set->n_rules > 0) {
    const struct hz_rule* rule = NULL;
    for (uint32_t i = 0; i < set->n_rules; i++) {
      const struct hz_rule* r = &set->rules[i];
      int coll_ok = r->coll_mask == 0 || ((unsigned)coll < 32 && ((r->coll_mask >> coll) & 1u));
      if (coll_ok && (uint64_t)nBytes >= r->min_bytes && (uint64_t)nBytes <= r->max_bytes) {
        rule = r;
        break;
      }
    }
    if (rule != NULL) {
      if (table != NULL && numAlgo > 0 && numProto > 0)
        hz_apply_prefs(rule, (float*)table, numAlgo, numProto);
      if (c->channels_ok && nChannels != NULL && rule->max_channels > 0) {
        int cap = rule->max_channels > HZ_MAX_CHANNELS ? HZ_MAX_CHANNELS : (int)rule->max_channels;
        /* A cap, never a raise: a non-zero value NCCL passed stays the upper bound. */
        if (*nChannels <= 0 || *nChannels > cap) *nChannels = cap;
      }
    }
  }
  c->n = n + 1;
  if (c->slot != NULL) hz_store64(c->slot + HZS_SLOT_OFF_COLLECTIVES, n + 1);
}

/* ---- Init and teardown ---- */

static int hz_job_valid(const char* job) {
  size_t len = 0;
  for (; job[len] != '\0'; len++) {
    char ch = job[len];
    int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
             strchr("._:@+-", ch) != NULL;
    if (!ok || len >= HZ_JOB_MAX) return 0;
  }
  /* "." and ".." would name a directory that is not the job's. */
  return len > 0 && strcmp(job, ".") != 0 && strcmp(job, "..") != 0;
}

static struct hz_ctx* hz_open(uint64_t comm_id, size_t nRanks, size_t nNodes, hz_logger_t log) {
  const char* job = getenv("HARMONAIZE_JOB");
  int from_slurm = 0;
  if (job == NULL) {
    /* A rank launched by Slurm's srun names its job itself, by the id the placement
       (harmonaize-slurm) and the agent (the job's cgroup) use: no variable of ours. */
    job = getenv("SLURM_JOB_ID");
    from_slurm = job != NULL;
  }
  if (job == NULL) {
    HZ_LOG(log, HZ_LOG_INFO,
           HZ_NAME " tuner: neither HARMONAIZE_JOB nor SLURM_JOB_ID is set; "
                   "leaving NCCL's choices");
    return NULL;
  }
  if (!hz_job_valid(job)) {
    if (from_slurm) {
      HZ_LOG(log, HZ_LOG_WARN,
             HZ_NAME " tuner: SLURM_JOB_ID is not 1-128 of [A-Za-z0-9._:@+-]; "
                     "leaving NCCL's choices");
    } else {
      HZ_LOG(log, HZ_LOG_WARN,
             HZ_NAME " tuner: HARMONAIZE_JOB is not 1-128 of [A-Za-z0-9._:@+-]; "
                     "leaving NCCL's choices");
    }
    return NULL;
  }
  const char* dir = getenv("HARMONAIZE_TUNER_DIR");
  if (dir == NULL || dir[0] == '\0') dir = HZ_DEFAULT_DIR;
  struct hz_ctx* c = calloc(1, sizeof *c);
  if (c == NULL) {
    HZ_LOG(log, HZ_LOG_WARN, HZ_NAME " tuner: out of memory; leaving NCCL's choices");
    return NULL;
  }
  c->map_guard = -1;
  int len = snprintf(c->policy_path, sizeof c->policy_path, "%s/%s/policy", dir, job);
  int dlen = snprintf(c->dir, sizeof c->dir, "%s", dir);
  if (len < 0 || (size_t)len >= sizeof c->policy_path || dlen < 0 ||
      (size_t)dlen >= sizeof c->dir) {
    HZ_LOG(log, HZ_LOG_WARN, HZ_NAME " tuner: policy path too long; leaving NCCL's choices");
    free(c);
    return NULL;
  }
  memcpy(c->job, job, strlen(job) + 1);
  c->comm_id = comm_id;
  c->n_ranks = nRanks;
  c->n_nodes = nNodes;
  c->log = log;
  c->defer_at = HZ_NO_INDEX;
  pthread_mutex_lock(&g_stats_lock);
  if (g_nccl_version < 0) g_nccl_version = hz_nccl_version(log);
  int version = g_nccl_version;
  pthread_mutex_unlock(&g_stats_lock);
  c->channels_ok = version >= HZ_NCCL_CAP_VERSION;
  hz_map(c);
  int stats = hz_stats_attach(c);
  if (c->map != NULL) hz_poll(c, 0);
  HZ_LOG(log, HZ_LOG_INFO,
         HZ_NAME " tuner: job %s comm 0x%016llx policy %s (%s), stats %s; NCCL %d: %s", job,
         (unsigned long long)comm_id, c->policy_path, c->map != NULL ? "mapped" : "not yet",
         stats ? "on" : "off", version,
         c->channels_ok ? "channel caps applied" : "channel counts left to NCCL");
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
