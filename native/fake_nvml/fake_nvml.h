/*
 * Fake NVML for tests: the ABI subset that pynvml calls, answered from a
 * plain-text state file (see state.c for the format).
 *
 * The types below are written from pynvml's ctypes declarations; sizes are
 * checked at compile time against what ctypes.sizeof reports for them.
 */
#ifndef FAKE_NVML_H
#define FAKE_NVML_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_API __attribute__((visibility("default")))

/* Return codes (pynvml: NVML_SUCCESS, NVML_ERROR_*). */
typedef unsigned int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* Opaque handles: pointers into static tables inside the library. */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* pynvml nvmlPciInfo_t (used by nvmlDeviceGetPciInfo_v3). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* pynvml nvmlPciInfo_v2_t: the legacy layout of _v1 and _v2. */
typedef struct {
    char busId[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int reserved[4];
} nvmlPciInfoLegacy_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2_VERSION 0x02000028u

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* The unversioned process query predates the MIG instance ids. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* pynvml c_nvmlProcessInfo_v2_t, also used for _v3. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} nvmlEventData_v1_t;

/* pynvml c_nvmlEventData_t (nvmlEventSetWait_v2). */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    uint32_t fieldId;
    uint32_t scopeId;
    int64_t timestamp;
    int64_t latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlPciInfoLegacy_t) == 52, "nvmlPciInfo_v2_t layout");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t layout");

/* Enumerations used by the subset. */
enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_CLOCK_COUNT = 4 };          /* graphics, sm, mem, video */
enum { NVML_MEMORY_LOCATION_DEVICE_MEMORY = 2, NVML_MEMORY_LOCATION_COUNT = 8 };
enum { NVML_NVLINK_ERROR_COUNT = 5 };   /* replay, recovery, crc flit, crc data, ecc data */
enum { NVML_DEVICE_ARCH_HOPPER = 9 };
enum { NVML_BRAND_NVIDIA = 14 };
enum {
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
};
enum {
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3,
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4,
    NVML_FI_DEV_ECC_SBE_AGG_TOTAL = 5,
    NVML_FI_DEV_ECC_DBE_AGG_TOTAL = 6,
    NVML_FI_DEV_RETIRED_SBE = 29,
    NVML_FI_DEV_RETIRED_DBE = 30,
    NVML_FI_DEV_RETIRED_PENDING = 31,
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59,
    NVML_FI_DEV_NVLINK_LINK_COUNT = 91,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94,
    NVML_FI_DEV_REMAPPED_COR = 142,
    NVML_FI_DEV_REMAPPED_UNC = 143,
    NVML_FI_DEV_REMAPPED_PENDING = 144,
    NVML_FI_DEV_REMAPPED_FAILURE = 145,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230,
};

#define NVML_EVENT_SINGLE_BIT_ECC 0x1ull
#define NVML_EVENT_DOUBLE_BIT_ECC 0x2ull
#define NVML_EVENT_PSTATE 0x4ull
#define NVML_EVENT_XID_CRITICAL 0x8ull
#define NVML_EVENT_CLOCK 0x10ull
#define FAKE_SUPPORTED_EVENTS                                                        \
    (NVML_EVENT_SINGLE_BIT_ECC | NVML_EVENT_DOUBLE_BIT_ECC | NVML_EVENT_PSTATE |     \
     NVML_EVENT_XID_CRITICAL | NVML_EVENT_CLOCK)

/* ---- Parsed state (state.c) ---- */

#define FAKE_MAX_GPUS 64
#define FAKE_MAX_LINKS 18
#define FAKE_MAX_PROCS 64
#define FAKE_MAX_RETIRED 4096 /* per cause: pynvml allocates 2n+5 entries */
#define FAKE_MAX_XIDS 100000
#define FAKE_DEFAULT_GPUS 8

struct fake_link {
    uint32_t state;
    uint64_t counter[NVML_NVLINK_ERROR_COUNT]; /* indexed like nvmlNvLinkErrorCounter_t */
};

struct fake_proc {
    uint32_t pid;
    uint64_t used;
};

struct fake_gpu {
    char name[96];
    char uuid[96];
    char serial[30];
    char pci_bus_id[32];
    uint32_t temperature;
    uint32_t power_mw;
    uint32_t power_limit_mw;
    uint32_t clock[NVML_CLOCK_COUNT]; /* indexed like nvmlClockType_t */
    uint32_t max_clock[NVML_CLOCK_COUNT];
    uint32_t util_gpu;
    uint32_t util_mem;
    uint64_t mem_total;
    uint64_t mem_used;
    uint64_t mem_free;
    uint64_t mem_reserved;
    uint64_t clocks_event_reasons;
    uint64_t ecc[2][2]; /* [nvmlMemoryErrorType_t][nvmlEccCounterType_t] */
    uint32_t retired[2]; /* [nvmlPageRetirementCause_t] */
    uint32_t retired_pending;
    uint32_t remap[4]; /* correctable, uncorrectable, pending, failure */
    uint32_t pcie_replay;
    uint32_t pcie_gen;
    uint32_t pcie_max_gen;
    uint32_t pcie_width;
    uint32_t pcie_max_width;
    uint32_t nvlinks;
    struct fake_link link[FAKE_MAX_LINKS];
    uint32_t has_recovery_action;
    uint32_t recovery_action;
    uint32_t ecc_mode;
    uint32_t persistence_mode;
    uint32_t compute_mode;
    uint32_t lost;
    char hang[256]; /* comma-separated function names, or "*" */
    uint32_t nprocs;
    struct fake_proc procs[FAKE_MAX_PROCS];
    /* Power management (power.c): constraints, default limit, the curve's inputs,
     * and whether a set call is refused or silently ignored. */
    uint32_t power_min_mw;
    uint32_t power_max_mw;
    uint32_t power_default_mw;
    uint32_t power_static_mw;
    uint32_t min_clock_sm_mhz;
    uint32_t compute_share; /* percent of the work bound by the SM clock */
    uint32_t power_settable;
    uint32_t power_ignores;
};

struct fake_xid {
    uint64_t id;
    uint64_t xid;
    uint32_t gpu;
};

struct fake_state {
    uint32_t gpus;
    int32_t cuda_driver_version;
    char driver_version[80];
    char nvml_version[80];
    struct fake_gpu gpu[FAKE_MAX_GPUS];
    struct fake_xid *xids; /* sorted by id */
    size_t nxids;
};

/* What a GPU reports under a power limit set through NVML (0: none set). */
struct fake_power {
    uint32_t limit_mw;
    uint32_t draw_mw;
    uint32_t clock_sm;
    uint32_t clock_graphics;
    uint64_t reasons;
    uint32_t throughput_ppm; /* relative to the unconstrained GPU, per million */
};

void fake_power_view(const struct fake_gpu *g, uint32_t set_limit_mw, struct fake_power *out);
void fake_settings_parse(int fd, uint32_t limits[FAKE_MAX_GPUS]);
int fake_settings_write(const char *path, const uint32_t limits[FAKE_MAX_GPUS]);

/* Parses the open state file; NULL only when memory runs out. */
struct fake_state *fake_state_parse(int fd);
void fake_state_free(struct fake_state *state);

#endif
