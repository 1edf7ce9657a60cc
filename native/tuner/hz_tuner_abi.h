/*
 * The NCCL tuner plugin ABI, versions 3 to 6, as HarmonAIze uses it.
 *
 * Written from the documented layout (shared/research/nccl.md, section 1):
 * field order, argument order and enum values are what NCCL expects; the
 * names are ours. NCCL passes its enums by value, so they appear here as int.
 * Only the versions this plugin exports are declared.
 */
#ifndef HZ_TUNER_ABI_H
#define HZ_TUNER_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ncclResult_t: the plugin only ever returns success. */
typedef int hz_result_t;
#define HZ_SUCCESS 0

/* ncclDebugLogLevel values used by the plugin. */
#define HZ_LOG_WARN 2
#define HZ_LOG_INFO 3
/* Debug subsystem flags: the tuner's own subsystem, plus init. */
#define HZ_LOGSYS_INIT 0x1UL
#define HZ_LOGSYS_TUNING 0x40UL

typedef void (*hz_logger_t)(int level, unsigned long flags, const char* file, int line,
                            const char* fmt, ...);

/* ncclFunc_t values named by the policy's coll_mask (newer NCCL adds more). */
enum {
  HZ_FUNC_BROADCAST = 0,
  HZ_FUNC_REDUCE = 1,
  HZ_FUNC_ALLGATHER = 2,
  HZ_FUNC_REDUCESCATTER = 3,
  HZ_FUNC_ALLREDUCE = 4,
  HZ_FUNC_SENDRECV = 5,
  HZ_FUNC_SEND = 6,
  HZ_FUNC_RECV = 7,
};

/* Algorithm and protocol indices into the cost table. NCCL had 6 algorithms
 * before 2.23 and 7 from then on, so the table's extent is always taken from
 * the numAlgo/numProto arguments, never from these. */
enum { HZ_ALGO_TREE = 0, HZ_ALGO_RING = 1, HZ_ALGO_COLLNET_DIRECT = 2, HZ_ALGO_COLLNET_CHAIN = 3,
       HZ_ALGO_NVLS = 4, HZ_ALGO_NVLS_TREE = 5, HZ_ALGO_PAT = 6 };
enum { HZ_PROTO_LL = 0, HZ_PROTO_LL128 = 1, HZ_PROTO_SIMPLE = 2 };

/* v5+ init arguments. The plugin does not read them; they are declared so the
 * function type is exact. */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} hz_nvl_domain_info_t;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} hz_tuner_constants_t;

/* v3 (NCCL 2.22): cost table replaces the algorithm/protocol outputs. */
typedef struct {
  const char* name;
  hz_result_t (*init)(size_t nRanks, size_t nNodes, hz_logger_t logFunction, void** context);
  hz_result_t (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps,
                             float** collCostTable, int numAlgo, int numProto, int* nChannels);
  hz_result_t (*destroy)(void* context);
} hz_tuner_v3_t;

/* v4 (NCCL 2.24): getCollInfo gains regBuff before nChannels. */
typedef struct {
  const char* name;
  hz_result_t (*init)(size_t nRanks, size_t nNodes, hz_logger_t logFunction, void** context);
  hz_result_t (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps,
                             float** collCostTable, int numAlgo, int numProto, int regBuff,
                             int* nChannels);
  hz_result_t (*destroy)(void* context);
} hz_tuner_v4_t;

/* v5 (NCCL 2.28.3): init takes the communicator id; destroy becomes finalize. */
typedef hz_result_t (*hz_init_v5_fn)(void** context, uint64_t commId, size_t nRanks,
                                     size_t nNodes, hz_logger_t logFunction,
                                     hz_nvl_domain_info_t* nvlDomainInfo,
                                     hz_tuner_constants_t* constants);
typedef hz_result_t (*hz_getcollinfo_v4_fn)(void* context, int collType, size_t nBytes,
                                            int numPipeOps, float** collCostTable, int numAlgo,
                                            int numProto, int regBuff, int* nChannels);

typedef struct {
  const char* name;
  hz_init_v5_fn init;
  hz_getcollinfo_v4_fn getCollInfo;
  hz_result_t (*finalize)(void* context);
} hz_tuner_v5_t;

/* v6 (NCCL 2.30.3): v5 plus an optional chunk-size callback; NCCL checks it
 * for NULL before calling it. */
typedef struct {
  const char* name;
  hz_init_v5_fn init;
  hz_getcollinfo_v4_fn getCollInfo;
  hz_result_t (*finalize)(void* context);
  hz_result_t (*getChunkSize)(void* context, int collType, size_t nBytes, int algo, int proto,
                              int nChannels, size_t* chunkSize);
} hz_tuner_v6_t;

#endif /* HZ_TUNER_ABI_H */
