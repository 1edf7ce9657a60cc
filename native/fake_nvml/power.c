/*
 * Power limits of the fake GPUs: what a limit does to clocks, draw and
 * throughput, and the file that keeps limits set through NVML.
 *
 * The curve. The state file describes a GPU running its workload unconstrained:
 * it draws D = power_mw at SM clock f0 = clock_sm_mhz, of which S =
 * power_static_mw does not scale with the clock (leakage, memory, fans). The
 * dynamic part scales with f * V^2, and in the DVFS range the voltage follows
 * the clock about linearly, so it goes with the cube of the clock:
 *
 *     P(f) = S + (D - S) * (f / f0)^3
 *
 * A limit L below D makes the GPU run at the clock where P(f) = L:
 *
 *     f = f0 * ((L - S) / (D - S))^(1/3),
 *
 * never below min_clock_sm_mhz (the draw then stays above the limit, as a real
 * GPU's does at its lowest clock). The graphics clock scales alike. A share c
 * (compute_share, percent) of the work is bound by the SM clock, the rest (memory,
 * communication) is not, so a step that took 1 at f0 takes c * f0 / f + (1 - c):
 *
 *     throughput = 1 / (c * f0 / f + 1 - c)
 *
 * This is a model for tests, not a measurement; the simulator uses a measured
 * power-throughput relation (sim/energy.py).
 *
 * Limits set through nvmlDeviceSetPowerManagementLimit outlive the process, as
 * a real GPU's do until a reset: they are kept in "<state file>.power", one
 * "gpu.<i>.power_limit_mw = N" per line, written atomically, read by every
 * process that loads the same state. Without a set limit the state file's
 * values are returned as they are.
 */
#include "fake_nvml.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SETTINGS_MAX_BYTES (1u << 20)
#define SW_POWER_CAP 0x4ull /* nvmlClocksEventReasonSwPowerCap */

void fake_power_view(const struct fake_gpu *g, uint32_t set_limit_mw, struct fake_power *out)
{
    out->limit_mw = set_limit_mw ? set_limit_mw : g->power_limit_mw;
    out->draw_mw = g->power_mw;
    out->clock_sm = g->clock[1];
    out->clock_graphics = g->clock[0];
    out->reasons = g->clocks_event_reasons;
    out->throughput_ppm = 1000000u;
    if (!set_limit_mw || set_limit_mw >= g->power_mw || g->clock[1] == 0)
        return;
    double d = g->power_mw, s = g->power_static_mw, l = set_limit_mw;
    double f0 = g->clock[1];
    double ratio = 0.0; /* f / f0 */
    if (d > s && l > s)
        ratio = cbrt((l - s) / (d - s));
    double floor_ratio = g->min_clock_sm_mhz < g->clock[1] ? g->min_clock_sm_mhz / f0 : 1.0;
    if (ratio < floor_ratio)
        ratio = floor_ratio;
    if (ratio > 1.0)
        ratio = 1.0;
    double draw = d > s ? s + (d - s) * ratio * ratio * ratio : d;
    double c = (g->compute_share > 100 ? 100 : g->compute_share) / 100.0;
    double thr = ratio > 0.0 ? 1.0 / (c / ratio + 1.0 - c) : 0.0;
    out->draw_mw = (uint32_t)lround(draw);
    out->clock_sm = (uint32_t)lround(f0 * ratio);
    out->clock_graphics = (uint32_t)lround(g->clock[0] * ratio);
    out->reasons = (g->clocks_event_reasons & ~0x1ull) | SW_POWER_CAP;
    out->throughput_ppm = (uint32_t)lround(thr * 1e6);
}

/* "gpu.<i>.power_limit_mw = N" lines; anything else is ignored, as in the state file. */
void fake_settings_parse(int fd, uint32_t limits[FAKE_MAX_GPUS])
{
    memset(limits, 0, sizeof(uint32_t) * FAKE_MAX_GPUS);
    char *buf = malloc(SETTINGS_MAX_BYTES + 1);
    if (!buf)
        return;
    size_t n = 0;
    for (;;) {
        ssize_t got = read(fd, buf + n, SETTINGS_MAX_BYTES - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        n += (size_t)got;
        if (n == SETTINGS_MAX_BYTES)
            break;
    }
    buf[n] = '\0';
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned int gpu;
        unsigned long long value;
        char tail;
        if (sscanf(line, " gpu.%u.power_limit_mw = %llu %c", &gpu, &value, &tail) == 2 &&
            gpu < FAKE_MAX_GPUS && value > 0 && value <= UINT32_MAX)
            limits[gpu] = (uint32_t)value;
    }
    free(buf);
}

/* Writes the limits to path through a temporary file and a rename. */
int fake_settings_write(const char *path, const uint32_t limits[FAKE_MAX_GPUS])
{
    char tmp[4200];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -1;
    FILE *out = fdopen(fd, "w");
    if (!out) {
        close(fd);
        unlink(tmp);
        return -1;
    }
    fprintf(out, "# Power limits set through NVML (native/fake_nvml/power.c).\n");
    for (uint32_t i = 0; i < FAKE_MAX_GPUS; i++)
        if (limits[i])
            fprintf(out, "gpu.%u.power_limit_mw = %u\n", i, limits[i]);
    if (fclose(out) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}
