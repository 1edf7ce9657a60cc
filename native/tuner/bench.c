/*
 * Microbenchmark for the tuner plugin's getCollInfo.
 *
 *   tuner_bench PLUGIN.so [RUNS [CALLS]]
 *
 * Writes a policy (a listed communicator, activation in the past, four
 * rules over AllReduce/AllGather/ReduceScatter), makes a stand-in NCCL 2.32
 * visible (libnccl-fake.so beside the plugin, so channel caps are applied as
 * on a release that takes them), dlopens the plugin, resolves
 * ncclTunerPlugin_v5 and calls getCollInfo CALLS times per run over a cycle of
 * eight realistic (collective, size) pairs with a 7x3 cost table. Each
 * iteration restores the table (84-byte memcpy) and *nChannels first; that
 * restore is INCLUDED in ns_per_call, and measured alone as restore_ns so a
 * reader can subtract it. Before timing, it checks that the policy is really
 * applied, so the figure is never that of an inert fast path.
 *
 * Output: "key value" lines; median_ns is the median over RUNS of the mean
 * ns per call in each run.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hz_shm.h"
#include "hz_tuner_abi.h"

#define COMM_ID 0x5EEDC0FFEE123457ull
#define NUM_ALGO 7
#define NUM_PROTO 3
#define N_CASES 8

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint8_t* put_rule(uint8_t* set, unsigned index, uint32_t coll_mask, uint32_t max_channels,
                         uint64_t min_bytes, uint64_t max_bytes, const uint8_t* prefs,
                         unsigned n_prefs) {
  uint8_t* r = set + 8 + index * HZP_RULE_SIZE;
  hz_st32(r + HZP_RULE_OFF_COLL_MASK, coll_mask);
  hz_st32(r + HZP_RULE_OFF_MAX_CHANNELS, max_channels);
  hz_st64(r + HZP_RULE_OFF_MIN_BYTES, min_bytes);
  hz_st64(r + HZP_RULE_OFF_MAX_BYTES, max_bytes);
  r[HZP_RULE_OFF_N_PREFS] = (uint8_t)n_prefs;
  memcpy(r + HZP_RULE_OFF_PREFS, prefs, n_prefs);
  return r;
}

#define PREF(a, p) ((uint8_t)(((a) << 4) | (p)))

static int write_policy(const char* dir, const char* job) {
  static uint8_t img[HZP_TOTAL_SIZE];
  memset(img, 0, sizeof img);
  hz_st32(img + HZP_OFF_MAGIC, HZP_MAGIC);
  hz_st16(img + HZP_OFF_VERSION, HZP_VERSION);
  hz_st16(img + HZP_OFF_HEADER_SIZE, HZP_HEADER_SIZE);
  hz_st64(img + HZP_OFF_SEQ, 2);
  hz_st32(img + HZP_OFF_POLICY_ID, 7);
  hz_st16(img + HZP_OFF_N_COMMS, 2);
  hz_st16(img + HZP_OFF_N_RULESETS, 2);
  /* Another communicator first, so the lookup is not trivially slot 0. */
  uint8_t* e = img + HZP_OFF_COMMS;
  hz_st64(e + HZP_COMM_OFF_ID, 0x1111);
  hz_st16(e + HZP_COMM_OFF_BEFORE, HZP_NO_SET);
  hz_st16(e + HZP_COMM_OFF_AFTER, 1);
  hz_st32(e + HZP_COMM_OFF_REVISION, 1);
  e += HZP_COMM_SIZE;
  hz_st64(e + HZP_COMM_OFF_ID, COMM_ID);
  hz_st64(e + HZP_COMM_OFF_AT, 0);
  hz_st16(e + HZP_COMM_OFF_BEFORE, 1);
  hz_st16(e + HZP_COMM_OFF_AFTER, 0);
  hz_st32(e + HZP_COMM_OFF_REVISION, 1);

  uint8_t* set = img + HZP_OFF_SETS;
  hz_st32(set, 4);
  const uint8_t small[] = {PREF(HZ_ALGO_NVLS, HZ_PROTO_LL), PREF(HZ_ALGO_RING, HZ_PROTO_LL),
                           PREF(HZP_ANY, HZ_PROTO_LL)};
  const uint8_t medium[] = {PREF(HZ_ALGO_RING, HZ_PROTO_LL128), PREF(HZP_ANY, HZP_ANY)};
  const uint8_t gather[] = {PREF(HZ_ALGO_PAT, HZ_PROTO_SIMPLE), PREF(HZ_ALGO_RING, HZP_ANY)};
  const uint8_t large[] = {PREF(HZ_ALGO_TREE, HZ_PROTO_SIMPLE)};
  put_rule(set, 0, 1u << HZ_FUNC_ALLREDUCE, 0, 0, 65536, small, 3);
  put_rule(set, 1, 1u << HZ_FUNC_ALLREDUCE, 16, 65537, 16u << 20, medium, 2);
  put_rule(set, 2, (1u << HZ_FUNC_ALLGATHER) | (1u << HZ_FUNC_REDUCESCATTER), 0, 0, UINT64_MAX,
           gather, 2);
  put_rule(set, 3, 0, 24, 0, UINT64_MAX, large, 1);
  uint8_t* set1 = img + HZP_OFF_SETS + HZP_SET_SIZE;
  hz_st32(set1, 1);
  put_rule(set1, 0, 0, 8, 0, UINT64_MAX, large, 1);
  hz_st32(img + HZP_OFF_CHECKSUM, hz_policy_checksum(img));

  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/%s/.policy.tmp", dir, job);
  snprintf(path, sizeof path, "%s/%s/policy", dir, job);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  ssize_t w = write(fd, img, sizeof img);
  close(fd);
  if (w != (ssize_t)sizeof img || rename(tmp, path) != 0) return -1;
  return 0;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN.so [RUNS [CALLS]]\n", argv[0]);
    return 2;
  }
  int runs = argc > 2 ? atoi(argv[2]) : 15;
  long calls = argc > 3 ? atol(argv[3]) : 1000000;
  if (runs < 1 || calls < 1) return 2;

  char dir[] = "/tmp/hz-tuner-bench-XXXXXX";
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  const char* job = "bench-job";
  setenv("HARMONAIZE_JOB", job, 1);
  setenv("HARMONAIZE_TUNER_DIR", dir, 1);
  setenv("HZ_FAKE_NCCL_VERSION", "23203", 1);
  int rc = 1;
  char policy[4200], jobdir[4096], fake[4096];
  snprintf(jobdir, sizeof jobdir, "%s/%s", dir, job);
  snprintf(policy, sizeof policy, "%s/policy", jobdir);
  snprintf(fake, sizeof fake, "%s", argv[1]);
  char* slash = strrchr(fake, '/');
  snprintf(slash != NULL ? slash + 1 : fake, sizeof fake - (size_t)(slash != NULL ? slash + 1 - fake : 0),
           "libnccl-fake.so");
  void* nccl = NULL;
  void* lib = NULL;
  void* ctx = NULL;
  const hz_tuner_v5_t* tuner = NULL;
  if (mkdir(jobdir, 0755) != 0 || write_policy(dir, job) != 0) {
    perror("write policy");
    goto out;
  }
  /* As NCCL itself would be: in the global scope, answering ncclGetVersion. */
  nccl = dlopen(fake, RTLD_NOW | RTLD_GLOBAL);
  if (nccl == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", fake, dlerror());
    goto out;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    goto out;
  }
  tuner = dlsym(lib, "ncclTunerPlugin_v5");
  if (tuner == NULL) {
    fprintf(stderr, "dlsym ncclTunerPlugin_v5: %s\n", dlerror());
    goto out;
  }
  if (tuner->init(&ctx, COMM_ID, 16, 2, NULL, NULL, NULL) != 0 || ctx == NULL) {
    fprintf(stderr, "plugin init failed or stayed inert\n");
    goto out;
  }

  /* Costs in µs as NCCL's model gives them for 16 ranks on 2 nodes; CollNet
   * and NVLS-Tree are unavailable (-1, NCCL_ALGO_PROTO_IGNORE). */
  static const float base[NUM_ALGO][NUM_PROTO] = {
      {18.5f, 22.0f, 41.0f},  /* TREE */
      {15.0f, 19.5f, 38.0f},  /* RING */
      {-1.0f, -1.0f, -1.0f},  /* COLLNET_DIRECT */
      {-1.0f, -1.0f, -1.0f},  /* COLLNET_CHAIN */
      {12.0f, -1.0f, 30.0f},  /* NVLS */
      {-1.0f, -1.0f, -1.0f},  /* NVLS_TREE */
      {25.0f, -1.0f, 44.0f},  /* PAT */
  };
  static const struct {
    int coll;
    size_t bytes;
    int zeroed; /* a*3+p expected at 0.0, or -1 */
    int channels;
  } cases[N_CASES] = {
      {HZ_FUNC_ALLREDUCE, 4096, 4 * 3 + 0, 0},
      {HZ_FUNC_ALLREDUCE, 1u << 20, 1 * 3 + 1, 16},
      {HZ_FUNC_ALLGATHER, 8u << 20, 6 * 3 + 2, 0},
      {HZ_FUNC_REDUCESCATTER, 64u << 10, 6 * 3 + 2, 0},
      {HZ_FUNC_ALLREDUCE, 256u << 20, 0 * 3 + 2, 24},
      {HZ_FUNC_BROADCAST, 1u << 20, 0 * 3 + 2, 24},
      {HZ_FUNC_ALLREDUCE, 65536, 4 * 3 + 0, 0},
      {HZ_FUNC_REDUCE, 512, 0 * 3 + 2, 24},
  };
  float table[NUM_ALGO][NUM_PROTO];
  int nch;

  for (int i = 0; i < N_CASES; i++) {
    memcpy(table, base, sizeof table);
    nch = 0;
    tuner->getCollInfo(ctx, cases[i].coll, cases[i].bytes, 1, (float**)table, NUM_ALGO, NUM_PROTO,
                       0, &nch);
    const float* t = &table[0][0];
    const float* b = &base[0][0];
    for (int k = 0; k < NUM_ALGO * NUM_PROTO; k++) {
      float want = k == cases[i].zeroed ? 0.0f : b[k];
      if (t[k] != want || nch != cases[i].channels) {
        fprintf(stderr, "policy not applied as expected in case %d (entry %d, channels %d)\n", i,
                k, nch);
        goto out;
      }
    }
  }

  double* per_run = calloc((size_t)runs, sizeof *per_run);
  double* restore = calloc((size_t)runs, sizeof *restore);
  if (per_run == NULL || restore == NULL) goto out;
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < calls; i++) {
      int k = (int)(i & (N_CASES - 1));
      memcpy(table, base, sizeof table);
      nch = 0;
      tuner->getCollInfo(ctx, cases[k].coll, cases[k].bytes, 1, (float**)table, NUM_ALGO,
                         NUM_PROTO, 0, &nch);
    }
    uint64_t t1 = now_ns();
    for (long i = 0; i < calls; i++) {
      memcpy(table, base, sizeof table);
      nch = 0;
      /* Keep the restore from being optimised away. */
      __asm__ volatile("" : : "r"(&table[0][0]), "r"(&nch) : "memory");
    }
    uint64_t t2 = now_ns();
    per_run[r] = (double)(t1 - t0) / (double)calls;
    restore[r] = (double)(t2 - t1) / (double)calls;
  }
  /* The policy must still be followed at the end. */
  memcpy(table, base, sizeof table);
  nch = 0;
  tuner->getCollInfo(ctx, cases[0].coll, cases[0].bytes, 1, (float**)table, NUM_ALGO, NUM_PROTO,
                     0, &nch);
  if (table[4][0] != 0.0f) {
    fprintf(stderr, "policy was no longer applied at the end of the benchmark\n");
    goto out;
  }
  qsort(per_run, (size_t)runs, sizeof *per_run, cmp_double);
  qsort(restore, (size_t)runs, sizeof *restore, cmp_double);
  printf("runs %d\ncalls %ld\n", runs, calls);
  printf("min_ns %.2f\nmax_ns %.2f\n", per_run[0], per_run[runs - 1]);
  printf("restore_ns %.2f\n", restore[runs / 2]);
  printf("median_ns %.2f\n", per_run[runs / 2]);
  free(per_run);
  free(restore);
  rc = 0;
out:
  if (tuner != NULL && ctx != NULL) tuner->finalize(ctx);
  if (lib != NULL) dlclose(lib);
  if (nccl != NULL) dlclose(nccl);
  unlink(policy);
  rmdir(jobdir);
  rmdir(dir);
  return rc;
}
