/*
 * LD_PRELOAD for slurmd (and the slurmstepd it starts) in the Slurm testbed, only where
 * the testbed runs Slurm's cgroup/v2 plugin on a hybrid host (cgroup v1 controllers
 * mounted beside an empty cgroup2): it makes the daemon's own /proc/self/cgroup read as
 * its unified ("0::") line alone.
 *
 * Why: Slurm 22.05's cgroup/v2 plugin refuses to start when /proc/self/cgroup holds any
 * v1 line ("Hybrid mode is not supported"), although it then only ever uses the unified
 * hierarchy, which the v1 hierarchies do not touch. Everything else is real: the kernel's
 * cgroup2, the job and step cgroups Slurm makes in it, cgroup.freeze, and the job's
 * tasks (the preload is not in their environment, and they read their own cgroup whole).
 * On a host with cgroup v2 only it is not loaded at all.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SELF_CGROUP "/proc/self/cgroup"

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

/* A memfd holding the unified line of our real /proc/self/cgroup (all of it if none). */
static int unified_view(void)
{
    static open_fn real_open;
    if (!real_open)
        real_open = (open_fn)dlsym(RTLD_NEXT, "open");
    int fd = real_open(SELF_CGROUP, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fd;
    char buf[16384];
    size_t used = 0;
    ssize_t got;
    while (used < sizeof buf - 1 && (got = read(fd, buf + used, sizeof buf - 1 - used)) > 0)
        used += (size_t)got;
    close(fd);
    buf[used] = '\0';
    const char *line = strncmp(buf, "0::", 3) == 0 ? buf : strstr(buf, "\n0::");
    if (line == NULL)
        line = buf;
    else if (line != buf)
        line++;
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
    int view = memfd_create("unified-cgroup", MFD_CLOEXEC);
    if (view < 0)
        return view;
    if (write(view, line, len) != (ssize_t)len || lseek(view, 0, SEEK_SET) != 0) {
        close(view);
        return -1;
    }
    return view;
}

static int mode_of(int flags, va_list args)
{
    return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(args, int) : 0;
}

__attribute__((visibility("default"))) int open(const char *path, int flags, ...)
{
    va_list args;
    va_start(args, flags);
    int mode = mode_of(flags, args);
    va_end(args);
    if (strcmp(path, SELF_CGROUP) == 0)
        return unified_view();
    static open_fn real;
    if (!real)
        real = (open_fn)dlsym(RTLD_NEXT, "open");
    return real(path, flags, mode);
}

__attribute__((visibility("default"))) int open64(const char *path, int flags, ...)
{
    va_list args;
    va_start(args, flags);
    int mode = mode_of(flags, args);
    va_end(args);
    if (strcmp(path, SELF_CGROUP) == 0)
        return unified_view();
    static open_fn real;
    if (!real)
        real = (open_fn)dlsym(RTLD_NEXT, "open64");
    return real(path, flags, mode);
}

__attribute__((visibility("default"))) int openat(int dir, const char *path, int flags, ...)
{
    va_list args;
    va_start(args, flags);
    int mode = mode_of(flags, args);
    va_end(args);
    if (strcmp(path, SELF_CGROUP) == 0)
        return unified_view();
    static openat_fn real;
    if (!real)
        real = (openat_fn)dlsym(RTLD_NEXT, "openat");
    return real(dir, path, flags, mode);
}
