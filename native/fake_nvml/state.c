/*
 * State file parser. Format: UTF-8 text, one "key = value" per line; lines
 * whose first non-blank character is '#' are comments; blank lines, lines
 * without '=', unknown keys and lines over LINE_MAX_BYTES are ignored. A
 * value that does not parse leaves that key at its default. Nothing in the
 * file can make the parser fail: the worst case is a default healthy GPU.
 * Numbers are decimal or 0x-hex, unsigned.
 *
 * System: gpus (default 8, at most 64), driver_version, nvml_version,
 *   cuda_driver_version.
 * Per GPU, gpu.<i>.<key>: see gpu_fields[] below, plus processes =
 *   pid:bytes,pid:bytes. Power management (power.c): power_min_mw and
 *   power_max_mw (nvmlDeviceGetPowerManagementLimitConstraints), power_default_mw,
 *   power_static_mw, min_clock_sm_mhz and compute_share (the curve),
 *   power_settable = 0 (a set is refused with NVML_ERROR_NO_PERMISSION) and
 *   power_ignores = 1 (a set succeeds and changes nothing). hang = comma-separated NVML function names (a name
 *   also matches its _vN variants) or "*" for every call on the device,
 *   handle lookups included.
 * Per NVLink, gpu.<i>.nvlink.<L>.<key> (L < 18): state, replay, recovery,
 *   crc_flit, crc_data, ecc_data.
 * Events: xid.<id> = <gpu>:<xid>; delivered in id order whatever the order
 *   of the lines.
 */
#include "fake_nvml.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_MAX_BYTES (64u << 20)
#define LINE_MAX_BYTES 16384

/* ---- small parsing helpers ---- */

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static char *trim(char *s)
{
    while (is_space(*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && is_space(s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Decimal, or hexadecimal with 0x; no sign, no trailing text, no overflow. */
static int parse_u64(const char *s, uint64_t *out)
{
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
        char c = *s;
        if (!(is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return -1;
    } else if (!is_digit(*s)) {
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (parse_u64(s, &v) != 0 || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* A bounded decimal index followed by '.'; advances *s past the dot. */
static int parse_index(const char **s, uint32_t limit, uint32_t *out)
{
    const char *p = *s;
    uint32_t v = 0;
    int digits = 0;
    while (is_digit(*p)) {
        if (++digits > 6)
            return -1;
        v = v * 10 + (uint32_t)(*p - '0');
        p++;
    }
    if (digits == 0 || *p != '.' || v >= limit)
        return -1;
    *s = p + 1;
    *out = v;
    return 0;
}

/*
 * Copies text so that what pynvml decodes is valid UTF-8 without control
 * characters: invalid bytes become '?', and truncation never splits a
 * character. Returns -1 for an empty result so the caller keeps the default.
 */
static int copy_text(char *dst, size_t cap, const char *src)
{
    size_t out = 0;
    const unsigned char *s = (const unsigned char *)src;
    while (*s) {
        size_t len = 1;
        unsigned char c = s[0];
        int valid = 1;
        if (c < 0x20 || c == 0x7f) {
            valid = 0;
        } else if (c >= 0x80) {
            uint32_t cp;
            if (c >= 0xc2 && c <= 0xdf) {
                len = 2;
                cp = c & 0x1f;
            } else if (c >= 0xe0 && c <= 0xef) {
                len = 3;
                cp = c & 0x0f;
            } else if (c >= 0xf0 && c <= 0xf4) {
                len = 4;
                cp = c & 0x07;
            } else {
                len = 1;
                cp = 0;
                valid = 0;
            }
            for (size_t k = 1; valid && k < len; k++) {
                if ((s[k] & 0xc0) != 0x80)
                    valid = 0;
                else
                    cp = (cp << 6) | (s[k] & 0x3f);
            }
            /* Reject overlong forms, surrogates and values past U+10FFFF. */
            if (valid && ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
                          (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff))
                valid = 0;
            if (!valid)
                len = 1;
        }
        size_t emit = valid ? len : 1;
        if (out + emit + 1 > cap)
            break;
        if (valid)
            memcpy(dst + out, s, len);
        else
            dst[out] = '?';
        out += emit;
        s += len;
    }
    if (out == 0)
        return -1;
    dst[out] = '\0';
    return 0;
}

/* ---- defaults: a healthy, idle H200 ---- */

static const uint8_t default_bus[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static void gpu_defaults(struct fake_gpu *g, uint32_t i)
{
    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "NVIDIA H200");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-fa4e0000-0000-0000-0000-%012x", i);
    snprintf(g->serial, sizeof(g->serial), "1654924%06u", i);
    snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "%08X:%02X:00.0", i / 8, default_bus[i % 8]);
    g->temperature = 34;
    g->power_mw = 75000;
    g->power_limit_mw = 700000;
    g->clock[0] = 345;  /* graphics */
    g->clock[1] = 345;  /* sm */
    g->clock[2] = 3201; /* mem */
    g->clock[3] = 765;  /* video */
    g->max_clock[0] = 1980;
    g->max_clock[1] = 1980;
    g->max_clock[2] = 3201;
    g->max_clock[3] = 1755;
    g->mem_total = 141ull << 30;
    g->mem_reserved = 512ull << 20;
    g->clocks_event_reasons = 0x1; /* GPU idle */
    g->pcie_gen = 5;
    g->pcie_max_gen = 5;
    g->pcie_width = 16;
    g->pcie_max_width = 16;
    g->nvlinks = FAKE_MAX_LINKS;
    for (uint32_t l = 0; l < FAKE_MAX_LINKS; l++)
        g->link[l].state = 1;
    g->ecc_mode = 1;
    g->persistence_mode = 1;
    /* An H200 SXM's power management range (nvidia-smi -q -d POWER) and the curve's
     * inputs (power.c): idle draw does not scale with the clock. */
    g->power_min_mw = 200000;
    g->power_max_mw = 700000;
    g->power_default_mw = 700000;
    g->power_static_mw = 75000;
    g->min_clock_sm_mhz = 345;
    g->compute_share = 100;
    g->power_settable = 1;
    /* mem_used and mem_free are derived after parsing unless set. */
}

/* ---- per-GPU keys, table driven ---- */

enum ftype { F_U32, F_U64, F_STR };

struct field {
    const char *key;
    enum ftype type;
    size_t offset;
    size_t size;
};

#define FIELD(k, t, m) {k, t, offsetof(struct fake_gpu, m), sizeof(((struct fake_gpu *)0)->m)}

static const struct field gpu_fields[] = {
    FIELD("name", F_STR, name),
    FIELD("uuid", F_STR, uuid),
    FIELD("serial", F_STR, serial),
    FIELD("pci_bus_id", F_STR, pci_bus_id),
    FIELD("temperature", F_U32, temperature),
    FIELD("power_mw", F_U32, power_mw),
    FIELD("power_limit_mw", F_U32, power_limit_mw),
    FIELD("clock_graphics_mhz", F_U32, clock[0]),
    FIELD("clock_sm_mhz", F_U32, clock[1]),
    FIELD("clock_mem_mhz", F_U32, clock[2]),
    FIELD("clock_video_mhz", F_U32, clock[3]),
    FIELD("max_clock_graphics_mhz", F_U32, max_clock[0]),
    FIELD("max_clock_sm_mhz", F_U32, max_clock[1]),
    FIELD("max_clock_mem_mhz", F_U32, max_clock[2]),
    FIELD("max_clock_video_mhz", F_U32, max_clock[3]),
    FIELD("util_gpu", F_U32, util_gpu),
    FIELD("util_mem", F_U32, util_mem),
    FIELD("mem_total", F_U64, mem_total),
    FIELD("mem_used", F_U64, mem_used),
    FIELD("mem_free", F_U64, mem_free),
    FIELD("mem_reserved", F_U64, mem_reserved),
    FIELD("clocks_event_reasons", F_U64, clocks_event_reasons),
    FIELD("ecc_sbe_volatile", F_U64, ecc[0][0]),
    FIELD("ecc_dbe_volatile", F_U64, ecc[1][0]),
    FIELD("ecc_sbe_aggregate", F_U64, ecc[0][1]),
    FIELD("ecc_dbe_aggregate", F_U64, ecc[1][1]),
    FIELD("retired_sbe", F_U32, retired[0]),
    FIELD("retired_dbe", F_U32, retired[1]),
    FIELD("retired_pending", F_U32, retired_pending),
    FIELD("remap_correctable", F_U32, remap[0]),
    FIELD("remap_uncorrectable", F_U32, remap[1]),
    FIELD("remap_pending", F_U32, remap[2]),
    FIELD("remap_failure", F_U32, remap[3]),
    FIELD("pcie_replay", F_U32, pcie_replay),
    FIELD("pcie_gen", F_U32, pcie_gen),
    FIELD("pcie_max_gen", F_U32, pcie_max_gen),
    FIELD("pcie_width", F_U32, pcie_width),
    FIELD("pcie_max_width", F_U32, pcie_max_width),
    FIELD("nvlinks", F_U32, nvlinks),
    FIELD("recovery_action", F_U32, recovery_action),
    FIELD("ecc_mode", F_U32, ecc_mode),
    FIELD("persistence_mode", F_U32, persistence_mode),
    FIELD("compute_mode", F_U32, compute_mode),
    FIELD("lost", F_U32, lost),
    FIELD("hang", F_STR, hang),
    FIELD("power_min_mw", F_U32, power_min_mw),
    FIELD("power_max_mw", F_U32, power_max_mw),
    FIELD("power_default_mw", F_U32, power_default_mw),
    FIELD("power_static_mw", F_U32, power_static_mw),
    FIELD("min_clock_sm_mhz", F_U32, min_clock_sm_mhz),
    FIELD("compute_share", F_U32, compute_share),
    FIELD("power_settable", F_U32, power_settable),
    FIELD("power_ignores", F_U32, power_ignores),
};

/* nvlink.L.<name> → index into fake_link.counter, or -1 for the state. */
static const struct {
    const char *key;
    int counter;
} link_fields[] = {
    {"state", -1}, {"replay", 0}, {"recovery", 1}, {"crc_flit", 2}, {"crc_data", 3}, {"ecc_data", 4},
};

struct parse {
    struct fake_state *st;
    struct fake_gpu defaults[FAKE_MAX_GPUS];
    uint8_t mem_used_set[FAKE_MAX_GPUS];
    uint8_t mem_free_set[FAKE_MAX_GPUS];
    size_t xid_cap;
};

static void set_gpu_field(struct parse *p, uint32_t i, const struct field *f, const char *value)
{
    struct fake_gpu *g = &p->st->gpu[i];
    char *dst = (char *)g + f->offset;
    int ok = -1;
    if (f->type == F_U32) {
        uint32_t v;
        ok = parse_u32(value, &v);
        if (ok == 0)
            memcpy(dst, &v, sizeof(v));
    } else if (f->type == F_U64) {
        uint64_t v;
        ok = parse_u64(value, &v);
        if (ok == 0)
            memcpy(dst, &v, sizeof(v));
    } else if (f->type == F_STR) {
        ok = copy_text(dst, f->size, value);
    }
    if (ok != 0) /* a bad value means the default, even after an earlier good one */
        memcpy(dst, (const char *)&p->defaults[i] + f->offset, f->size);

    if (f->offset == offsetof(struct fake_gpu, recovery_action))
        g->has_recovery_action = ok == 0;
    else if (f->offset == offsetof(struct fake_gpu, mem_used))
        p->mem_used_set[i] = ok == 0;
    else if (f->offset == offsetof(struct fake_gpu, mem_free))
        p->mem_free_set[i] = ok == 0;
}

/* "pid:bytes,pid:bytes"; malformed entries are skipped. */
static void set_processes(struct fake_gpu *g, char *value)
{
    g->nprocs = 0;
    char *save = NULL;
    for (char *tok = strtok_r(value, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (!colon)
            continue;
        *colon = '\0';
        uint32_t pid;
        uint64_t used;
        if (parse_u32(trim(tok), &pid) != 0 || parse_u64(trim(colon + 1), &used) != 0)
            continue;
        if (g->nprocs >= FAKE_MAX_PROCS)
            break;
        g->procs[g->nprocs].pid = pid;
        g->procs[g->nprocs].used = used;
        g->nprocs++;
    }
}

static void parse_gpu_key(struct parse *p, const char *rest, char *value)
{
    uint32_t i;
    if (parse_index(&rest, FAKE_MAX_GPUS, &i) != 0)
        return;
    struct fake_gpu *g = &p->st->gpu[i];

    if (strncmp(rest, "nvlink.", 7) == 0) {
        rest += 7;
        uint32_t l;
        if (parse_index(&rest, FAKE_MAX_LINKS, &l) != 0)
            return;
        for (size_t k = 0; k < sizeof(link_fields) / sizeof(link_fields[0]); k++) {
            if (strcmp(rest, link_fields[k].key) != 0)
                continue;
            int c = link_fields[k].counter;
            if (c < 0) {
                uint32_t v;
                g->link[l].state = parse_u32(value, &v) == 0 ? v : 1;
            } else {
                uint64_t v;
                g->link[l].counter[c] = parse_u64(value, &v) == 0 ? v : 0;
            }
            return;
        }
        return;
    }
    if (strcmp(rest, "processes") == 0) {
        set_processes(g, value);
        return;
    }
    for (size_t k = 0; k < sizeof(gpu_fields) / sizeof(gpu_fields[0]); k++) {
        if (strcmp(rest, gpu_fields[k].key) == 0) {
            set_gpu_field(p, i, &gpu_fields[k], value);
            return;
        }
    }
}

/* xid.N = gpu:xid */
static void parse_xid(struct parse *p, const char *id_text, char *value)
{
    struct fake_state *st = p->st;
    uint64_t id, xid;
    uint32_t gpu;
    char *colon = strchr(value, ':');
    if (!colon || !is_digit(*id_text) || parse_u64(id_text, &id) != 0)
        return;
    *colon = '\0';
    if (parse_u32(trim(value), &gpu) != 0 || gpu >= FAKE_MAX_GPUS ||
        parse_u64(trim(colon + 1), &xid) != 0)
        return;
    if (st->nxids == p->xid_cap) {
        if (p->xid_cap >= FAKE_MAX_XIDS)
            return;
        size_t cap = p->xid_cap ? p->xid_cap * 2 : 64;
        if (cap > FAKE_MAX_XIDS)
            cap = FAKE_MAX_XIDS;
        struct fake_xid *grown = realloc(st->xids, cap * sizeof(*grown));
        if (!grown)
            return;
        st->xids = grown;
        p->xid_cap = cap;
    }
    st->xids[st->nxids++] = (struct fake_xid){.id = id, .xid = xid, .gpu = gpu};
}

static void parse_line(struct parse *p, char *line)
{
    char *eq = strchr(line, '=');
    if (!eq)
        return;
    *eq = '\0';
    char *key = trim(line);
    char *value = trim(eq + 1);
    struct fake_state *st = p->st;

    if (key[0] == '#')
        return;
    if (strcmp(key, "gpus") == 0) {
        uint32_t v;
        st->gpus = parse_u32(value, &v) == 0 ? v : FAKE_DEFAULT_GPUS;
        if (st->gpus > FAKE_MAX_GPUS)
            st->gpus = FAKE_MAX_GPUS;
    } else if (strcmp(key, "driver_version") == 0) {
        if (copy_text(st->driver_version, sizeof(st->driver_version), value) != 0)
            snprintf(st->driver_version, sizeof(st->driver_version), "550.54.15");
    } else if (strcmp(key, "nvml_version") == 0) {
        if (copy_text(st->nvml_version, sizeof(st->nvml_version), value) != 0)
            snprintf(st->nvml_version, sizeof(st->nvml_version), "12.550.54.15");
    } else if (strcmp(key, "cuda_driver_version") == 0) {
        uint32_t v;
        st->cuda_driver_version = parse_u32(value, &v) == 0 && v <= INT32_MAX ? (int32_t)v : 12040;
    } else if (strncmp(key, "gpu.", 4) == 0) {
        parse_gpu_key(p, key + 4, value);
    } else if (strncmp(key, "xid.", 4) == 0) {
        parse_xid(p, key + 4, value);
    }
}

static int by_id(const void *a, const void *b)
{
    const struct fake_xid *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Reads the whole file (bounded); NULL when memory runs out. */
static char *read_all(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= FILE_MAX_BYTES)
                break;
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                return NULL;
            }
            buf = grown;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break; /* a read error parses what arrived so far */
        n += (size_t)got;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

struct fake_state *fake_state_parse(int fd)
{
    struct parse *p = calloc(1, sizeof(*p));
    struct fake_state *st = calloc(1, sizeof(*st));
    size_t len = 0;
    char *text = p && st ? read_all(fd, &len) : NULL;
    if (!text) {
        free(p);
        free(st);
        return NULL;
    }
    p->st = st;
    st->gpus = FAKE_DEFAULT_GPUS;
    st->cuda_driver_version = 12040;
    snprintf(st->driver_version, sizeof(st->driver_version), "550.54.15");
    snprintf(st->nvml_version, sizeof(st->nvml_version), "12.550.54.15");
    for (uint32_t i = 0; i < FAKE_MAX_GPUS; i++) {
        gpu_defaults(&p->defaults[i], i);
        st->gpu[i] = p->defaults[i];
    }

    /* NUL bytes would hide the rest of a line from strchr: make them end it. */
    for (size_t k = 0; k < len; k++)
        if (text[k] == '\0')
            text[k] = '\n';
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        *end = '\0';
        if (end - line <= LINE_MAX_BYTES)
            parse_line(p, line);
        line = end + 1;
    }
    free(text);

    for (uint32_t i = 0; i < FAKE_MAX_GPUS; i++) {
        struct fake_gpu *g = &st->gpu[i];
        if (g->nvlinks > FAKE_MAX_LINKS)
            g->nvlinks = FAKE_MAX_LINKS;
        for (int c = 0; c < 2; c++)
            if (g->retired[c] > FAKE_MAX_RETIRED)
                g->retired[c] = FAKE_MAX_RETIRED;
        if (!p->mem_used_set[i]) {
            g->mem_used = 0;
            for (uint32_t k = 0; k < g->nprocs; k++)
                g->mem_used += g->procs[k].used;
        }
        if (!p->mem_free_set[i]) {
            uint64_t taken = g->mem_reserved + g->mem_used;
            g->mem_free = g->mem_total > taken ? g->mem_total - taken : 0;
        }
    }
    if (st->nxids > 1)
        qsort(st->xids, st->nxids, sizeof(st->xids[0]), by_id);
    free(p);
    return st;
}

void fake_state_free(struct fake_state *state)
{
    if (!state)
        return;
    free(state->xids);
    free(state);
}
