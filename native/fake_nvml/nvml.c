/*
 * The exported NVML subset. Every call takes g_lock, re-reads the state file
 * when it changed, copies what it needs and lets go; nothing sleeps while
 * holding the lock, so a thread blocked in nvmlEventSetWait_v2 or in a
 * "hang" never stalls the others.
 */
#include "fake_nvml.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_ENV "HARMONAIZE_FAKE_NVML_STATE"
#define HANG_POLL_NS 10000000L  /* 10 ms */
#define EVENT_POLL_NS 5000000L  /* 5 ms */
#define HANG_LIMIT_S 120        /* a test can never wedge for longer */
#define MAX_EVENT_SETS 64

struct nvmlDevice_st {
    char unused; /* identity is the address: &g_devices[i] is GPU i */
};

struct nvmlEventSet_st {
    int in_use;
    int watch_fd;                         /* inotify on the state file's directory, or -1 */
    int delivered_any;
    uint64_t last_id;                     /* highest XID id delivered */
    unsigned long long types[FAKE_MAX_GPUS]; /* registered event types per GPU */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_refcount;
static char g_path[4096];
static struct fake_state *g_state;
/*
 * The loaded file stays open: its inode cannot be reused while we hold it,
 * so a replacement written by rename always has a different identity.
 */
static int g_fd = -1;
static struct stat g_stat;
static struct nvmlDevice_st g_devices[FAKE_MAX_GPUS];
static struct nvmlEventSet_st g_sets[MAX_EVENT_SETS];
/* Power limits set through NVML (power.c), from "<state file>.power"; the file
 * stays open for the same reason as the state file. 0: none set. */
static char g_settings_path[sizeof(g_path) + 8];
static uint32_t g_limits[FAKE_MAX_GPUS];
static int g_settings_fd = -1;
static struct stat g_settings_stat;
/* GPU resets done by the testbed's nvidia-smi (testbed/fakesmi.py), from
 * "<state file>.reset": per GPU, the volatile ECC counts of the state file at its last
 * reset. A volatile counter counts from the last reset, as a real one does, so what
 * NVML reports is the state's value less that baseline. Read whenever it changes. */
static char g_reset_path[sizeof(g_path) + 8];
static uint64_t g_reset_base[FAKE_MAX_GPUS][2];
static struct stat g_reset_stat;

/* ---- state file ---- */

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Loads path; on success replaces the current state. Caller holds g_lock. */
static int load_locked(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return -1;
    /* O_NONBLOCK: the path may have been swapped for a FIFO since stat. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return -1;
    }
    struct fake_state *st = fake_state_parse(fd);
    if (!st) {
        close(fd);
        return -1;
    }
    fake_state_free(g_state);
    if (g_fd >= 0)
        close(g_fd);
    g_state = st;
    g_fd = fd;
    g_stat = sb;
    return 0;
}

/* Loads the set power limits when their file changed; a vanished file sets none. */
static void refresh_settings_locked(void)
{
    struct stat sb;
    if (stat(g_settings_path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        memset(g_limits, 0, sizeof(g_limits));
        if (g_settings_fd >= 0)
            close(g_settings_fd);
        g_settings_fd = -1;
        memset(&g_settings_stat, 0, sizeof(g_settings_stat));
        return;
    }
    if (g_settings_fd >= 0 && same_file(&sb, &g_settings_stat))
        return;
    int fd = open(g_settings_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return;
    }
    fake_settings_parse(fd, g_limits);
    if (g_settings_fd >= 0)
        close(g_settings_fd);
    g_settings_fd = fd;
    g_settings_stat = sb;
}

/* Loads the reset baselines when their file changed; a vanished file means no reset. */
static void refresh_resets_locked(void)
{
    struct stat sb;
    if (stat(g_reset_path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        memset(g_reset_base, 0, sizeof(g_reset_base));
        memset(&g_reset_stat, 0, sizeof(g_reset_stat));
        return;
    }
    if (same_file(&sb, &g_reset_stat))
        return;
    /* O_NONBLOCK and fstat: the path may have been swapped for a FIFO since stat. */
    int fd = open(g_reset_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return;
    FILE *in = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? fdopen(fd, "r") : NULL;
    if (!in) {
        close(fd);
        return;
    }
    memset(g_reset_base, 0, sizeof(g_reset_base));
    char line[256];
    while (fgets(line, sizeof(line), in)) {
        unsigned gpu;
        unsigned long long value;
        char kind[4];
        if (sscanf(line, " gpu.%u.ecc_%3[sd]be_volatile = %llu", &gpu, kind, &value) == 3 &&
            gpu < FAKE_MAX_GPUS)
            g_reset_base[gpu][kind[0] == 'd'] = value;
    }
    fclose(in);
    g_reset_stat = sb;
}

/* Re-reads the file when its identity changed; a vanished file keeps the last state. */
static void refresh_locked(void)
{
    struct stat sb;
    if (stat(g_path, &sb) == 0 && !same_file(&sb, &g_stat))
        load_locked(g_path);
    refresh_settings_locked();
    refresh_resets_locked();
}

/* An ECC count as NVML reports it: a volatile one counts from the GPU's last reset. */
static unsigned long long ecc_count(const struct fake_gpu *g, unsigned type, unsigned counter)
{
    unsigned long long value = g->ecc[type][counter];
    if (counter != 0 || !g_state)
        return value;
    size_t index = (size_t)(g - g_state->gpu);
    if (index >= FAKE_MAX_GPUS)
        return value;
    uint64_t base = g_reset_base[index][type];
    return value > base ? value - base : 0;
}

/* ---- time ---- */

static struct timespec deadline_after(unsigned long long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* Sleeps up to max_ns but not past the deadline; returns 0 once it has passed. */
static int sleep_until(const struct timespec *deadline, long max_ns)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long left = (long long)(deadline->tv_sec - now.tv_sec) * 1000000000LL +
                     (deadline->tv_nsec - now.tv_nsec);
    if (left <= 0)
        return 0;
    long long ns = left < max_ns ? left : max_ns;
    struct timespec d = {.tv_sec = 0, .tv_nsec = (long)ns};
    nanosleep(&d, NULL); /* EINTR just means an earlier poll */
    return 1;
}

/* Waits for a change in the watched directory, at most until the deadline;
 * returns 0 once the deadline has passed. The watch was set before the state
 * was last looked at, so a change in between is queued, not missed. */
static int wait_for_change(int watch_fd, const struct timespec *deadline)
{
    if (watch_fd < 0)
        return sleep_until(deadline, EVENT_POLL_NS);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long left_ms = (long long)(deadline->tv_sec - now.tv_sec) * 1000LL +
                        (deadline->tv_nsec - now.tv_nsec) / 1000000LL;
    if (left_ms <= 0)
        return 0;
    struct pollfd p = {.fd = watch_fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left_ms < 60000 ? left_ms : 60000)) > 0) {
        char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
        while (read(watch_fd, buf, sizeof(buf)) > 0) {
        } /* drain: one change is enough to look again */
    }
    return 1;
}

/* ---- device access ---- */

/* "name", "name_vN" (so nvmlDeviceGetMemoryInfo matches _v2), a comma list, or "*". */
static int hang_matches(const char *spec, const char *fn)
{
    size_t fn_len = strlen(fn), base_len = fn_len;
    const char *v = strrchr(fn, '_');
    if (v && v[1] == 'v' && v[2] != '\0' && strspn(v + 2, "0123456789") == strlen(v + 2))
        base_len = (size_t)(v - fn);
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ",");
        size_t tok = len;
        while (tok > 0 && p[tok - 1] == ' ')
            tok--;
        if (tok == 1 && p[0] == '*')
            return 1;
        if (tok > 0 && (tok == fn_len || tok == base_len) && memcmp(p, fn, tok) == 0)
            return 1;
        p += len;
    }
    return 0;
}

static int device_index(nvmlDevice_t dev, uint32_t *index)
{
    uintptr_t base = (uintptr_t)g_devices, at = (uintptr_t)dev;
    if (at < base || at >= base + sizeof(g_devices) || (at - base) % sizeof(g_devices[0]))
        return -1;
    *index = (uint32_t)((at - base) / sizeof(g_devices[0]));
    return 0;
}

/*
 * Enters a call on GPU index: waits out a matching "hang", then reports a lost
 * GPU. On NVML_SUCCESS g_lock is held and *gpu points at the GPU's state;
 * release it with leave(). An index past the current count gives `missing`.
 */
static nvmlReturn_t enter_index(const char *fn, uint32_t index, nvmlReturn_t missing,
                                const struct fake_gpu **gpu)
{
    struct timespec deadline = deadline_after(HANG_LIMIT_S * 1000ULL);
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        refresh_locked();
        if (index >= g_state->gpus) {
            pthread_mutex_unlock(&g_lock);
            return missing;
        }
        const struct fake_gpu *g = &g_state->gpu[index];
        if (!hang_matches(g->hang, fn)) {
            if (g->lost) {
                pthread_mutex_unlock(&g_lock);
                return NVML_ERROR_GPU_IS_LOST;
            }
            *gpu = g;
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&g_lock);
        if (!sleep_until(&deadline, HANG_POLL_NS))
            return NVML_ERROR_TIMEOUT;
    }
}

/* A handle for a GPU that has since left the count reads as fallen off the bus. */
static nvmlReturn_t enter_device(const char *fn, nvmlDevice_t dev, const struct fake_gpu **gpu)
{
    uint32_t index;
    if (device_index(dev, &index) != 0) {
        pthread_mutex_lock(&g_lock);
        nvmlReturn_t r = g_refcount ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
        pthread_mutex_unlock(&g_lock);
        return r;
    }
    return enter_index(fn, index, NVML_ERROR_GPU_IS_LOST, gpu);
}

static nvmlReturn_t leave(nvmlReturn_t r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Enters a call that needs no GPU. On NVML_SUCCESS g_lock is held. */
static nvmlReturn_t enter_system(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh_locked();
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (len < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* ---- init and system ---- */

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_ERROR_DRIVER_NOT_LOADED;
    const char *path = getenv(STATE_ENV);
    /* Re-read on every init so each test's own file wins over a leaked init. */
    if (path && path[0] && strlen(path) < sizeof(g_path) && load_locked(path) == 0) {
        snprintf(g_path, sizeof(g_path), "%s", path);
        snprintf(g_settings_path, sizeof(g_settings_path), "%s.power", path);
        snprintf(g_reset_path, sizeof(g_reset_path), "%s.reset", path);
        if (g_settings_fd >= 0)
            close(g_settings_fd);
        g_settings_fd = -1;
        refresh_settings_locked();
        memset(&g_reset_stat, 0, sizeof(g_reset_stat));
        refresh_resets_locked();
        g_refcount++;
        r = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_API nvmlReturn_t nvmlInit(void)
{
    return init();
}

FAKE_API nvmlReturn_t nvmlInit_v2(void)
{
    return init();
}

FAKE_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

FAKE_API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_ERROR_UNINITIALIZED;
    if (g_refcount > 0) {
        r = NVML_SUCCESS;
        if (--g_refcount == 0) {
            fake_state_free(g_state);
            g_state = NULL;
            if (g_fd >= 0)
                close(g_fd);
            g_fd = -1;
            memset(&g_stat, 0, sizeof(g_stat));
            g_path[0] = '\0';
            if (g_settings_fd >= 0)
                close(g_settings_fd);
            g_settings_fd = -1;
            memset(&g_settings_stat, 0, sizeof(g_settings_stat));
            memset(g_limits, 0, sizeof(g_limits));
            g_settings_path[0] = '\0';
            g_reset_path[0] = '\0';
            memset(g_reset_base, 0, sizeof(g_reset_base));
            memset(&g_reset_stat, 0, sizeof(g_reset_stat));
            memset(g_sets, 0, sizeof(g_sets));
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

FAKE_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = enter_system();
    return r ? r : leave(copy_string(version, length, g_state->driver_version));
}

FAKE_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = enter_system();
    return r ? r : leave(copy_string(version, length, g_state->nvml_version));
}

FAKE_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    nvmlReturn_t r = enter_system();
    if (r)
        return r;
    if (!version)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *version = g_state->cuda_driver_version;
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

FAKE_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t r = enter_system();
    if (r)
        return r;
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = g_state->gpus;
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

/* ---- handles ---- */

static nvmlReturn_t handle_by_index(const char *fn, unsigned int index, nvmlDevice_t *device)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_index(fn, index, NVML_ERROR_INVALID_ARGUMENT, &g);
    if (r)
        return r;
    if (!device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_devices[index];
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t r = enter_system();
    if (r)
        return r;
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    uint32_t found = FAKE_MAX_GPUS;
    for (uint32_t i = 0; i < g_state->gpus && found == FAKE_MAX_GPUS; i++)
        if (strcmp(g_state->gpu[i].uuid, uuid) == 0)
            found = i;
    leave(NVML_SUCCESS);
    if (found == FAKE_MAX_GPUS)
        return NVML_ERROR_NOT_FOUND;
    return handle_by_index(__func__, found, device);
}

FAKE_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!index)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)(g - g_state->gpu);
    return leave(NVML_SUCCESS);
}

/* ---- identity ---- */

/* Simple scalar getters share one shape: enter, check the pointer, copy, leave. */
#define SCALAR_GETTER(fn, type, expr)                                   \
    FAKE_API nvmlReturn_t fn(nvmlDevice_t device, type *out)            \
    {                                                                   \
        const struct fake_gpu *g;                                       \
        nvmlReturn_t r = enter_device(__func__, device, &g);            \
        if (r)                                                          \
            return r;                                                   \
        if (!out)                                                       \
            return leave(NVML_ERROR_INVALID_ARGUMENT);                  \
        *out = (expr);                                                  \
        return leave(NVML_SUCCESS);                                     \
    }

#define STRING_GETTER(fn, member)                                              \
    FAKE_API nvmlReturn_t fn(nvmlDevice_t device, char *out, unsigned int len) \
    {                                                                          \
        const struct fake_gpu *g;                                              \
        nvmlReturn_t r = enter_device(__func__, device, &g);                   \
        return r ? r : leave(copy_string(out, len, g->member));                \
    }

STRING_GETTER(nvmlDeviceGetName, name)
STRING_GETTER(nvmlDeviceGetUUID, uuid)
STRING_GETTER(nvmlDeviceGetSerial, serial)

/* Splits "DDDDDDDD:BB:DD.F"; an unparsable id leaves the numbers at 0. */
static void pci_numbers(const char *id, unsigned int *domain, unsigned int *bus, unsigned int *dev)
{
    unsigned int d = 0, b = 0, v = 0, f = 0;
    if (sscanf(id, "%8x:%2x:%2x.%1x", &d, &b, &v, &f) != 4)
        d = b = v = 0;
    *domain = d;
    *bus = b;
    *dev = v;
}

#define H200_PCI_DEVICE_ID 0x233510DEu
#define H200_PCI_SUBSYSTEM_ID 0x18BE10DEu

FAKE_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!pci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof(*pci));
    pci_numbers(g->pci_bus_id, &pci->domain, &pci->bus, &pci->device);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0",
             pci->domain & 0xffff, pci->bus, pci->device);
    snprintf(pci->busId, sizeof(pci->busId), "%s", g->pci_bus_id);
    pci->pciDeviceId = H200_PCI_DEVICE_ID;
    pci->pciSubSystemId = H200_PCI_SUBSYSTEM_ID;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t pci_info_legacy(const char *fn, nvmlDevice_t device, nvmlPciInfoLegacy_t *pci)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(fn, device, &g);
    if (r)
        return r;
    if (!pci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof(*pci));
    pci_numbers(g->pci_bus_id, &pci->domain, &pci->bus, &pci->device);
    snprintf(pci->busId, sizeof(pci->busId), "%04X:%02X:%02X.0", pci->domain & 0xffff, pci->bus,
             pci->device);
    pci->pciDeviceId = H200_PCI_DEVICE_ID;
    pci->pciSubSystemId = H200_PCI_SUBSYSTEM_ID;
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfoLegacy_t *pci)
{
    return pci_info_legacy(__func__, device, pci);
}

FAKE_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfoLegacy_t *pci)
{
    return pci_info_legacy(__func__, device, pci);
}

SCALAR_GETTER(nvmlDeviceGetArchitecture, unsigned int, NVML_DEVICE_ARCH_HOPPER)
SCALAR_GETTER(nvmlDeviceGetBrand, unsigned int, NVML_BRAND_NVIDIA)
SCALAR_GETTER(nvmlDeviceGetPersistenceMode, unsigned int, g->persistence_mode)
SCALAR_GETTER(nvmlDeviceGetComputeMode, unsigned int, g->compute_mode)

FAKE_API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current,
                                          unsigned int *pending)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!current || !pending)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = g->ecc_mode;
    return leave(NVML_SUCCESS);
}

/* ---- telemetry ---- */

FAKE_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensor,
                                              unsigned int *temp)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temperature;
    return leave(NVML_SUCCESS);
}

/* The GPU as its set power limit leaves it (power.c); caller holds g_lock. */
static struct fake_power power_of(const struct fake_gpu *g)
{
    struct fake_power p;
    fake_power_view(g, g_limits[g - g_state->gpu], &p);
    return p;
}

SCALAR_GETTER(nvmlDeviceGetPowerUsage, unsigned int, power_of(g).draw_mw)
SCALAR_GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, power_of(g).limit_mw)
SCALAR_GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, power_of(g).limit_mw)
SCALAR_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, unsigned int, g->power_default_mw)
SCALAR_GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, power_of(g).reasons)
SCALAR_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long,
              power_of(g).reasons)

FAKE_API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                                  unsigned int *min_limit,
                                                                  unsigned int *max_limit)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!min_limit || !max_limit)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *min_limit = g->power_min_mw;
    *max_limit = g->power_max_mw;
    return leave(NVML_SUCCESS);
}

/* Refused without permission (as for a non-root caller), outside the constraints, or
 * accepted and ignored by a GPU that says power_ignores; otherwise kept in the settings
 * file, where every process sharing the state sees it. */
FAKE_API nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!g->power_settable)
        return leave(NVML_ERROR_NO_PERMISSION);
    if (limit < g->power_min_mw || limit > g->power_max_mw)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g->power_ignores)
        return leave(NVML_SUCCESS);
    uint32_t index = (uint32_t)(g - g_state->gpu);
    uint32_t before = g_limits[index];
    g_limits[index] = limit;
    if (fake_settings_write(g_settings_path, g_limits) != 0) {
        g_limits[index] = before;
        return leave(NVML_ERROR_UNKNOWN);
    }
    return leave(NVML_SUCCESS);
}

/* Not NVML: the throughput the curve gives under the set limit, per million of the
 * unconstrained GPU's, for tests' simulated ranks. */
SCALAR_GETTER(fakeNvmlDeviceGetThroughput, unsigned int, power_of(g).throughput_ppm)

static nvmlReturn_t clock_info(const char *fn, nvmlDevice_t device, unsigned int type,
                               unsigned int *clock, int max)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(fn, device, &g);
    if (r)
        return r;
    if (!clock || type >= NVML_CLOCK_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *clock = max ? g->max_clock[type] : g->clock[type];
    if (!max && type <= 1) { /* graphics and SM follow the power limit */
        struct fake_power p = power_of(g);
        *clock = type == 0 ? p.clock_graphics : p.clock_sm;
    }
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type,
                                            unsigned int *clock)
{
    return clock_info(__func__, device, type, clock, 0);
}

FAKE_API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type,
                                               unsigned int *clock)
{
    return clock_info(__func__, device, type, clock, 1);
}

SCALAR_GETTER(nvmlDeviceGetUtilizationRates, nvmlUtilization_t,
              ((nvmlUtilization_t){.gpu = g->util_gpu, .memory = g->util_mem}))
SCALAR_GETTER(nvmlDeviceGetMemoryInfo, nvmlMemory_t,
              ((nvmlMemory_t){.total = g->mem_total, .free = g->mem_free, .used = g->mem_used}))

FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory->total = g->mem_total;
    memory->reserved = g->mem_reserved;
    memory->free = g->mem_free;
    memory->used = g->mem_used;
    return leave(NVML_SUCCESS);
}

/* ---- memory health ---- */

FAKE_API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int error_type,
                                                 unsigned int counter_type,
                                                 unsigned long long *count)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!count || error_type > 1 || counter_type > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = ecc_count(g, error_type, counter_type);
    return leave(NVML_SUCCESS);
}

/* All configured ECC errors are in device memory; other locations count none. */
FAKE_API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, unsigned int error_type,
                                                     unsigned int counter_type,
                                                     unsigned int location,
                                                     unsigned long long *count)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!count || error_type > 1 || counter_type > 1 || location >= NVML_MEMORY_LOCATION_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = location == NVML_MEMORY_LOCATION_DEVICE_MEMORY
                 ? ecc_count(g, error_type, counter_type)
                 : 0;
    return leave(NVML_SUCCESS);
}

/* Page k of cause c gets a stable, distinct address and timestamp. */
static nvmlReturn_t retired_pages(const char *fn, nvmlDevice_t device, unsigned int cause,
                                  unsigned int *count, unsigned long long *addresses,
                                  unsigned long long *timestamps)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(fn, device, &g);
    if (r)
        return r;
    if (!count || cause > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = g->retired[cause];
    if (*count < n || (n > 0 && !addresses)) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int k = 0; k < n; k++) {
        addresses[k] = ((unsigned long long)(cause + 1) << 32) | ((unsigned long long)k << 12);
        if (timestamps)
            timestamps[k] = 1700000000ull + k;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause,
                                               unsigned int *count, unsigned long long *addresses)
{
    return retired_pages(__func__, device, cause, count, addresses, NULL);
}

FAKE_API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, unsigned int cause,
                                                  unsigned int *count,
                                                  unsigned long long *addresses,
                                                  unsigned long long *timestamps)
{
    return retired_pages(__func__, device, cause, count, addresses, timestamps);
}

SCALAR_GETTER(nvmlDeviceGetRetiredPagesPendingStatus, unsigned int, g->retired_pending ? 1u : 0u)

FAKE_API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *correctable,
                                               unsigned int *uncorrectable, unsigned int *pending,
                                               unsigned int *failure)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (!correctable || !uncorrectable || !pending || !failure)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *correctable = g->remap[0];
    *uncorrectable = g->remap[1];
    *pending = g->remap[2];
    *failure = g->remap[3];
    return leave(NVML_SUCCESS);
}

/* ---- PCIe and NVLink ---- */

SCALAR_GETTER(nvmlDeviceGetPcieReplayCounter, unsigned int, g->pcie_replay)
SCALAR_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, g->pcie_gen)
SCALAR_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, g->pcie_max_gen)
SCALAR_GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, g->pcie_width)
SCALAR_GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, g->pcie_max_width)

static nvmlReturn_t enter_link(const char *fn, nvmlDevice_t device, unsigned int link,
                               const struct fake_gpu **gpu)
{
    nvmlReturn_t r = enter_device(fn, device, gpu);
    if (r)
        return r;
    if ((*gpu)->nvlinks == 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (*gpu)->nvlinks)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                              unsigned int *active)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_link(__func__, device, link, &g);
    if (r)
        return r;
    if (!active)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *active = g->link[link].state;
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                     unsigned int counter,
                                                     unsigned long long *value)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_link(__func__, device, link, &g);
    if (r)
        return r;
    if (!value || counter >= NVML_NVLINK_ERROR_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *value = g->link[link].counter[counter];
    return leave(NVML_SUCCESS);
}

/* ---- field values ---- */

/* Sum of one NVLink error counter over the GPU's links, as the *_TOTAL fields report. */
static unsigned long long nvlink_total(const struct fake_gpu *g, int counter)
{
    unsigned long long total = 0;
    for (uint32_t l = 0; l < g->nvlinks && l < FAKE_MAX_LINKS; l++)
        total += g->link[l].counter[counter];
    return total;
}

static void field_value(const struct fake_gpu *g, nvmlFieldValue_t *v, int64_t now_us)
{
    unsigned long long value = 0;
    unsigned int type = NVML_VALUE_TYPE_UNSIGNED_INT;
    nvmlReturn_t r = NVML_SUCCESS;
    switch (v->fieldId) {
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL: {
        /* ecc[type][counter]: SBE = corrected (0), DBE = uncorrected (1);
         * volatile counter 0, aggregate 1. */
        int offset = (int)v->fieldId - NVML_FI_DEV_ECC_SBE_VOL_TOTAL;
        value = ecc_count(g, (unsigned)offset % 2, (unsigned)offset / 2);
        type = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        break;
    }
    case NVML_FI_DEV_RETIRED_SBE:
        value = g->retired[0];
        break;
    case NVML_FI_DEV_RETIRED_DBE:
        value = g->retired[1];
        break;
    case NVML_FI_DEV_RETIRED_PENDING:
        value = g->retired_pending;
        break;
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
        if (g->nvlinks == 0) {
            r = NVML_ERROR_NOT_SUPPORTED;
            break;
        }
        value = nvlink_total(g, v->fieldId == NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL ? 2
                                : v->fieldId == NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL ? 3
                                : v->fieldId == NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL ? 0
                                : 1);
        type = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        break;
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        value = g->nvlinks;
        break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        value = g->pcie_replay;
        type = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        break;
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE:
        value = g->remap[v->fieldId - NVML_FI_DEV_REMAPPED_COR];
        break;
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        if (g->has_recovery_action)
            value = g->recovery_action;
        else
            r = NVML_ERROR_NOT_SUPPORTED;
        break;
    default:
        r = NVML_ERROR_NOT_SUPPORTED;
    }
    /* Zero the whole union: readers of uiVal and ullVal then agree. */
    memset(&v->value, 0, sizeof(v->value));
    if (type == NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
        v->value.ullVal = value;
    else
        v->value.uiVal = (unsigned int)value;
    v->valueType = type;
    v->nvmlReturn = r;
    v->timestamp = now_us;
    v->latencyUsec = 0;
}

FAKE_API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count,
                                              nvmlFieldValue_t *values)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    if (count < 0 || (count > 0 && !values))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t now_us = (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
    for (int k = 0; k < count; k++)
        field_value(g, &values[k], now_us);
    return leave(NVML_SUCCESS);
}

/* ---- processes ---- */

/* version 1: nvmlProcessInfo_v1_t, otherwise nvmlProcessInfo_t; graphics lists none. */
static nvmlReturn_t processes(const char *fn, nvmlDevice_t device, unsigned int *count,
                              void *infos, int version, int graphics)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(fn, device, &g);
    if (r)
        return r;
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = graphics ? 0 : g->nprocs;
    if (*count < n || (n > 0 && !infos)) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int k = 0; k < n; k++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + k;
            p->pid = g->procs[k].pid;
            p->usedGpuMemory = g->procs[k].used;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + k;
            p->pid = g->procs[k].pid;
            p->usedGpuMemory = g->procs[k].used;
            p->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

#define PROCESS_GETTER(fn, version, graphics)                                    \
    FAKE_API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, void *infos) \
    {                                                                            \
        return processes(__func__, device, count, infos, version, graphics);     \
    }

PROCESS_GETTER(nvmlDeviceGetComputeRunningProcesses, 1, 0)
PROCESS_GETTER(nvmlDeviceGetComputeRunningProcesses_v2, 2, 0)
PROCESS_GETTER(nvmlDeviceGetComputeRunningProcesses_v3, 3, 0)
PROCESS_GETTER(nvmlDeviceGetGraphicsRunningProcesses, 1, 1)
PROCESS_GETTER(nvmlDeviceGetGraphicsRunningProcesses_v2, 2, 1)
PROCESS_GETTER(nvmlDeviceGetGraphicsRunningProcesses_v3, 3, 1)

/* ---- events ---- */

SCALAR_GETTER(nvmlDeviceGetSupportedEventTypes, unsigned long long, FAKE_SUPPORTED_EVENTS)

static struct nvmlEventSet_st *event_set(nvmlEventSet_t set)
{
    uintptr_t base = (uintptr_t)g_sets, at = (uintptr_t)set;
    if (at < base || at >= base + sizeof(g_sets) || (at - base) % sizeof(g_sets[0]))
        return NULL;
    return set->in_use ? set : NULL; /* caller holds g_lock */
}

/* An inotify descriptor watching the state file's directory (the file is
 * replaced by rename), so a waiting event set sleeps until the file changes
 * instead of polling it; -1 where inotify is unavailable. */
static int watch_state_dir(void)
{
    char dir[sizeof(g_path)];
    snprintf(dir, sizeof(dir), "%s", g_path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0)
        return -1;
    if (inotify_add_watch(fd, dir, IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE | IN_ATTRIB) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

FAKE_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t r = enter_system();
    if (r)
        return r;
    if (!set)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int k = 0; k < MAX_EVENT_SETS; k++) {
        if (!g_sets[k].in_use) {
            memset(&g_sets[k], 0, sizeof(g_sets[k]));
            g_sets[k].in_use = 1;
            g_sets[k].watch_fd = watch_state_dir();
            *set = &g_sets[k];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_MEMORY);
}

FAKE_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t r = enter_system();
    if (r)
        return r;
    struct nvmlEventSet_st *s = event_set(set);
    if (!s)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    s->in_use = 0;
    if (s->watch_fd >= 0)
        close(s->watch_fd);
    s->watch_fd = -1;
    return leave(NVML_SUCCESS);
}

FAKE_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                              nvmlEventSet_t set)
{
    const struct fake_gpu *g;
    nvmlReturn_t r = enter_device(__func__, device, &g);
    if (r)
        return r;
    struct nvmlEventSet_st *s = event_set(set);
    if (!s)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~FAKE_SUPPORTED_EVENTS)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    s->types[g - g_state->gpu] |= types;
    return leave(NVML_SUCCESS);
}

/*
 * Delivers the lowest-id XID above the set's last delivered id for a GPU
 * registered for XID events; then, with nothing pending, reports a lost
 * registered GPU. Sleeps (without the lock) until the state file changes or
 * the deadline passes; where inotify is unavailable it polls every 5 ms.
 */
static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *out, unsigned int timeout_ms)
{
    struct timespec deadline = deadline_after(timeout_ms);
    for (;;) {
        nvmlReturn_t r = enter_system();
        if (r)
            return r;
        struct nvmlEventSet_st *s = event_set(set);
        if (!s)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        const struct fake_state *st = g_state;
        for (size_t k = 0; k < st->nxids; k++) {
            const struct fake_xid *x = &st->xids[k];
            if (s->delivered_any && x->id <= s->last_id)
                continue;
            if (x->gpu >= st->gpus || !(s->types[x->gpu] & NVML_EVENT_XID_CRITICAL))
                continue;
            s->delivered_any = 1;
            s->last_id = x->id;
            out->device = &g_devices[x->gpu];
            out->eventType = NVML_EVENT_XID_CRITICAL;
            out->eventData = x->xid;
            return leave(NVML_SUCCESS);
        }
        for (uint32_t i = 0; i < st->gpus; i++) {
            if (s->types[i] && st->gpu[i].lost) {
                out->device = &g_devices[i];
                return leave(NVML_ERROR_GPU_IS_LOST);
            }
        }
        int watch_fd = s->watch_fd;
        leave(NVML_SUCCESS);
        if (!wait_for_change(watch_fd, &deadline))
            return NVML_ERROR_TIMEOUT;
    }
}

FAKE_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                         unsigned int timeout_ms)
{
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t got;
    memset(&got, 0, sizeof(got));
    nvmlReturn_t r = event_wait(set, &got, timeout_ms);
    if (r == NVML_SUCCESS || r == NVML_ERROR_GPU_IS_LOST) {
        got.gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
        got.computeInstanceId = 0xFFFFFFFFu;
        *data = got;
    }
    return r;
}

FAKE_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data,
                                      unsigned int timeout_ms)
{
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t got;
    memset(&got, 0, sizeof(got));
    nvmlReturn_t r = event_wait(set, &got, timeout_ms);
    if (r == NVML_SUCCESS || r == NVML_ERROR_GPU_IS_LOST) {
        data->device = got.device;
        data->eventType = got.eventType;
        data->eventData = got.eventData;
    }
    return r;
}
