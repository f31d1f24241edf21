/* mapguard — SIGBUS from a shrunk file mapping becomes an error code of the one read.
 *
 * Databases that map their files do the same (a jump buffer per thread, armed around
 * the access): the alternative, pread() into the batch slot, costs a system call per
 * sample on the fast path of every mapped kind. The handler is installed with
 * SA_NODEFER because the jump does not restore the signal mask (sigsetjmp(…, 0) keeps
 * the fast path free of system calls): SIGBUS must stay unblocked for the next fault
 * on that thread. A handler run by a sanitizer's own handler may still have SIGBUS
 * blocked, so after a jump the thread unblocks it again (a system call on the error
 * path only). See mapguard.h for the contract. */
#include "mapguard.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <string.h>

#include "ld_error.h"

/* The armed guard of this thread, or NULL. Initial-exec TLS (the daemon links this
 * module statically), so reading it in a signal handler is safe. */
static _Thread_local sigjmp_buf *guard_jb;
/* SIGBUS is unblocked on this thread. A fault signal that is blocked kills the process
 * whatever its handler (the worker pool starts its threads with every signal blocked,
 * so that SIGTERM reaches the loop thread): the first guard on a thread unblocks it. */
static _Thread_local bool thread_ready;

static void thread_prepare(void)
{
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
    thread_ready = true;
}

static struct sigaction previous;
static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *jb = guard_jb;
    if (jb) {
        guard_jb = NULL;
        siglongjmp(*jb, 1);
    }
    /* Not a guarded read: give SIGBUS its old meaning. A fault re-executes the
     * instruction and faults again under the old disposition; a sent signal is sent
     * again. */
    sigaction(SIGBUS, &previous, NULL);
    if (si && si->si_code <= 0)
        raise(sig);
    (void)uc;
}

/* Installs the handler unless it is in place: a test framework (or anything else)
 * that set its own since the last call is put behind ours as the one chained to. */
int mapguard_init(void)
{
    int r = 0;
    pthread_mutex_lock(&install_lock);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) < 0) {
        r = ld_from_errno(errno);
    } else if (!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_sigbus) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &previous) < 0)
            r = ld_from_errno(errno);
    }
    pthread_mutex_unlock(&install_lock);
    return r;
}

int mapguard_copy(void *dst, const void *src, size_t n)
{
    if (!thread_ready)
        thread_prepare();
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        atomic_signal_fence(memory_order_seq_cst);
        thread_prepare(); /* the jump left the handler's mask in place */
        return LD_EIO;
    }
    guard_jb = &jb;
    atomic_signal_fence(memory_order_seq_cst); /* armed before the first byte is read */
    memcpy(dst, src, n);
    atomic_signal_fence(memory_order_seq_cst); /* every byte read before disarming */
    guard_jb = NULL;
    return 0;
}

int mapguard_run(int (*fn)(void *arg), void *arg)
{
    if (!thread_ready)
        thread_prepare();
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        atomic_signal_fence(memory_order_seq_cst);
        thread_prepare(); /* the jump left the handler's mask in place */
        return LD_EIO;
    }
    guard_jb = &jb;
    atomic_signal_fence(memory_order_seq_cst);
    int r = fn(arg);
    atomic_signal_fence(memory_order_seq_cst);
    guard_jb = NULL;
    return r;
}
