/* cpus — how many CPUs this process may really use, for `server.workers: auto`.
 *
 * The number of online cores overstates it in a container or a systemd slice: the
 * process's affinity mask (taskset, cpuset) and its cgroup's CPU quota (cgroup v2
 * cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us, the tightest on the way up to the
 * root) both bound it. */
#ifndef LD_CPUS_H
#define LD_CPUS_H

struct cpus_info {
    unsigned online;                /* sysconf(_SC_NPROCESSORS_ONLN) */
    unsigned affinity;              /* CPUs in the affinity mask */
    double quota;                   /* CPUs' worth of the cgroup quota; 0: none */
    unsigned usable;                /* min(affinity, ceil(quota)), at least 1 */
};

/* The quota, in CPUs, that the cgroup files under `root` ("" for this system; a test
 * directory otherwise) give the cgroup named in `proc_cgroup` (the text of
 * /proc/self/cgroup): the smallest along the path up to the root; 0 when none is set or
 * nothing can be read. */
double cpus_cgroup_quota(const char *root, const char *proc_cgroup);
/* min(affinity, ceil(quota)) (quota 0: none), at least 1. */
unsigned cpus_usable(unsigned affinity, double quota);
/* This process's numbers (root "" and /proc/self/cgroup). */
void cpus_probe(struct cpus_info *ret);

#endif
