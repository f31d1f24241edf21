/* cpus — the CPUs this process may use: its affinity mask, bounded by its cgroup's CPU
 * quota. `server.workers: auto` starts one worker per usable CPU, so that a daemon in a
 * container limited to 2 CPUs on a 64-core host does not start 64 threads that the
 * kernel then throttles in turns (each would hold a batch's chunk while descheduled).
 *
 * cgroup v2: /proc/self/cgroup has a line "0::PATH" and the limit is
 * /sys/fs/cgroup/PATH/cpu.max, "QUOTA PERIOD" or "max PERIOD". cgroup v1: a line
 * "N:CONTROLLERS:PATH" whose controllers include cpu, and the limit is
 * cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us under the cpu controller's mount
 * (/sys/fs/cgroup/cpu,cpuacct or /sys/fs/cgroup/cpu). A limit set on an ancestor binds
 * too, so every directory from PATH up to the mount is read and the smallest quota
 * wins. Files that are missing or unreadable count as no limit: the answer is then the
 * affinity mask alone, never an error. */
#include "cpus.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPUS_PATH_MAX 4096

/* The first line of a small file, or "" (returns 0 then). */
static int cpus_read(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char *got = fgets(buf, (int)size, f);
    fclose(f);
    if (!got)
        return 0;
    buf[strcspn(buf, "\n")] = '\0';
    return 1;
}

/* cgroup v2's cpu.max in dir: CPUs, or 0 for none. */
static double cpus_v2(const char *dir)
{
    char path[CPUS_PATH_MAX + 16], line[128];
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    if (!cpus_read(path, line, sizeof line))
        return 0;
    char quota[32];
    unsigned long long period = 0;
    if (sscanf(line, "%31s %llu", quota, &period) != 2 || period == 0 || strcmp(quota, "max") == 0)
        return 0;
    char *end;
    double q = strtod(quota, &end);
    return *end || !(q > 0) ? 0 : q / (double)period;
}

/* cgroup v1's cpu.cfs_quota_us over cpu.cfs_period_us in dir: CPUs, or 0 for none. */
static double cpus_v1(const char *dir)
{
    char path[CPUS_PATH_MAX + 32], line[64];
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    if (!cpus_read(path, line, sizeof line))
        return 0;
    long long quota = strtoll(line, NULL, 10);
    snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
    if (quota <= 0 || !cpus_read(path, line, sizeof line))
        return 0;
    long long period = strtoll(line, NULL, 10);
    return period > 0 ? (double)quota / (double)period : 0;
}

/* The smallest quota from mount/path up to mount. */
static double cpus_walk(const char *mount, const char *path, double (*read_dir)(const char *dir))
{
    char dir[CPUS_PATH_MAX];
    double best = 0;
    if ((size_t)snprintf(dir, sizeof dir, "%s%s", mount, path) >= sizeof dir)
        return 0;
    size_t base = strlen(mount);
    for (;;) {
        size_t n = strlen(dir);
        while (n > base && dir[n - 1] == '/')
            dir[--n] = '\0';
        double q = read_dir(dir);
        if (q > 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (n <= base || !slash || (size_t)(slash - dir) < base)
            break;
        *slash = '\0';
    }
    return best;
}

static double cpus_min(double a, double b)
{
    return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

double cpus_cgroup_quota(const char *root, const char *proc_cgroup)
{
    double best = 0;
    const char *line = proc_cgroup;
    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char buf[CPUS_PATH_MAX];
        if (len < sizeof buf) {
            memcpy(buf, line, len);
            buf[len] = '\0';
            char *c1 = strchr(buf, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2) {
                *c1 = '\0';
                *c2 = '\0';
                const char *controllers = c1 + 1, *path = c2 + 1;
                char mount[CPUS_PATH_MAX];
                if (strcmp(buf, "0") == 0 && !*controllers) {
                    snprintf(mount, sizeof mount, "%s/sys/fs/cgroup", root);
                    best = cpus_min(best, cpus_walk(mount, path, cpus_v2));
                } else {
                    /* v1: "cpu" among the comma-separated controllers */
                    char list[256];
                    snprintf(list, sizeof list, ",%s,", controllers);
                    if (strstr(list, ",cpu,")) {
                        snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/cpu,cpuacct", root);
                        double q = cpus_walk(mount, path, cpus_v1);
                        snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/cpu", root);
                        best = cpus_min(best, cpus_min(q, cpus_walk(mount, path, cpus_v1)));
                    }
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return best;
}

unsigned cpus_usable(unsigned affinity, double quota)
{
    unsigned n = affinity ? affinity : 1;
    if (quota > 0) {
        double q = ceil(quota - 1e-9);
        if (q < n)
            n = q < 1 ? 1 : (unsigned)q;
    }
    return n;
}

void cpus_probe(struct cpus_info *ret)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    unsigned affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? (unsigned)CPU_COUNT(&set) : 0;
    if (affinity == 0)
        affinity = online > 0 ? (unsigned)online : 1;
    char text[8192] = "";
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    *ret = (struct cpus_info){
        .online = online > 0 ? (unsigned)online : 1,
        .affinity = affinity,
        .quota = cpus_cgroup_quota("", text),
    };
    ret->usable = cpus_usable(ret->affinity, ret->quota);
}
