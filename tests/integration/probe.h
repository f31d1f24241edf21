/* probe — what a process holds, read from /proc, and what loaderd says it holds, for the
 * tests that prove nothing leaks over many kills and restarts (itest_killloop): open
 * file descriptors, resident memory, mappings of loaderd's shared-memory rings, and
 * the daemon's own count of clients, streams, leased slots and ring memory.
 *
 * The /proc readers return -1 when the process is gone (or /proc is unreadable), so a
 * caller can tell "none" from "cannot see". */
#ifndef LD_PROBE_H
#define LD_PROBE_H

#include <stdint.h>
#include <sys/types.h>

struct lc_client;

/* Entries of /proc/PID/fd. */
int probe_fd_count(pid_t pid);
/* VmRSS of /proc/PID/status, in KiB. */
long probe_rss_kib(pid_t pid);
/* Lines of /proc/PID/maps that map a loaderd ring ("/dev/shm/loaderd."), deleted or not,
 * or a hand-off's queues (a memfd, "/memfd:loaderd-handoff"). */
int probe_ring_maps(pid_t pid);

/* The daemon's view, from one `status` request. */
struct probe_status {
    int clients;           /* connections, the asking one included */
    int streams;
    int leased;            /* slots leased to clients */
    int filling;           /* slots being filled by workers */
    int64_t memory_used;   /* bytes of ring memory */
};
/* Sends `status` over c. 0, or the client library's error code. */
int probe_status(struct lc_client *c, struct probe_status *ret);

#endif
