/* sweep — removes the files a dead process left behind: the shared-memory rings of a
 * crashed daemon (ring_sweep) and the temporary files of a builder killed mid-build
 * (cache_sweep_temps). Both name their files with the owner's pid; the caller says how
 * to read the pid from a name, and this module decides whether that owner is gone and
 * removes the file, in one way for both.
 *
 * A pid proves nothing across machines: a directory swept here must not be shared with
 * processes on other hosts. A pid that has been reused by a new process keeps its old
 * files until that process is gone too, which costs space, never data. */
#ifndef LD_SWEEP_H
#define LD_SWEEP_H

#include <stdbool.h>
#include <sys/types.h>

/* The pid that owns the file `name` (a name in the swept directory), or 0 when the
 * name is not one of the caller's files. Called once per directory entry. */
typedef pid_t (*sweep_owner_fn)(const char *name, void *ctx);

/* True only when no process `pid` exists on this machine: kill(pid, 0) failed with
 * ESRCH. EPERM means a process of another user has it, which is alive. */
bool sweep_pid_dead(pid_t pid);

/* Removes, in directory `dir`, every regular file (a link is not followed, nor
 * removed) whose owner(name, ctx) is a dead pid; files of live processes (this one
 * included) are kept. Each removal is logged at debug ("WHAT 'DIR': removed 'NAME',
 * left by dead process PID"; the caller logs the count), each failed one at warn.
 * Returns how many were removed, or a negative code when dir cannot be read (errbuf,
 * LD_ERRMSG_MAX bytes, names it; errbuf may be NULL). */
int sweep_dead_owners(const char *dir, sweep_owner_fn owner, void *ctx, const char *what, char *errbuf);

#endif
