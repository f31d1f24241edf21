/* mapguard — reading a file mapping that may shrink under us, without dying of SIGBUS.
 *
 * A mapped file (a cache, a `packed` file, a `token_windows` corpus) can be truncated
 * or overwritten in place by someone else while the daemon reads it; touching a page
 * past the new end raises SIGBUS, which would kill the daemon and every client with
 * it. The copies out of such mappings run inside a guard instead: a SIGBUS raised on
 * the guarding thread while it is armed jumps back (siglongjmp) and the copy returns
 * LD_EIO, so only the request that read the shrunk file fails. A SIGBUS anywhere else
 * keeps its old meaning (the previous handler, or death).
 *
 * Cost: one sigsetjmp (no system call: the signal mask is not saved) and two
 * thread-local stores per guarded call; the copy itself runs at memcpy's speed. The
 * first guarded call on a thread unblocks SIGBUS there (one system call per thread).
 * Any thread may use the guard; guards do not nest (an inner call would disarm the
 * outer one early). The functions called inside a guard must not take locks or
 * allocate, since they may be abandoned halfway. */
#ifndef LD_MAPGUARD_H
#define LD_MAPGUARD_H

#include <stddef.h>
#include <stdint.h>

/* Installs the SIGBUS handler unless it is in place (idempotent, thread-safe). Called
 * by whoever maps a file that can change, before the first guarded read. 0 or a
 * negative LD_* code (sigaction failed). */
int mapguard_init(void);
/* memcpy(dst, src, n), or LD_EIO when src (or dst) stopped being backed by a file. */
int mapguard_copy(void *dst, const void *src, size_t n);
/* Runs fn(arg) under the guard: its return value, or LD_EIO when it faulted. */
int mapguard_run(int (*fn)(void *arg), void *arg);

#endif
