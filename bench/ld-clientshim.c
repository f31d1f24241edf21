/* ld-clientshim — bench-only: stands between the Python client's extension and the C
 * library for bench_python's per-batch measurements.
 *
 * The extension (loaderclient._speedups) calls lc_stream_next_info_sized and
 * lc_batch_release straight from C, at the addresses it was given (set_library); the
 * package's Python path calls them through its ctypes binding. bench_python hands both
 * this library's functions instead (set_library, and a binding whose two functions are
 * these through ctypes: the call's own cost stays the package's on either path), which
 * either
 *
 * - time each call to the real function (wall and this thread's CPU time, added up), so
 *   that what remains of a loop's time is the Python side's; or
 * - answer at once with batches already in hand, taken in turn (described by the real
 *   lc_batch_describe_sized), and release nothing: a loop then runs only the Python side
 *   (no socket, no daemon, no context switch).
 *
 * One thread at a time (the bench's); nothing here is used outside the bench.
 */
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

typedef int (*shim_next_fn)(void *stream, int timeout_ms, void **ret_batch, void *ret_info, size_t info_size);
typedef int (*shim_next_batch_fn)(void *stream, int timeout_ms, void **ret_batch);
typedef int (*shim_release_fn)(void *batch);
typedef int (*shim_describe_fn)(const void *batch, void *ret_info, size_t info_size);

static shim_next_fn shim_real_next;
static shim_next_batch_fn shim_real_next_batch;
static shim_release_fn shim_real_release;
static shim_describe_fn shim_real_describe;

/* Batches in hand (the "ready" mode when shim_held_count > 0). */
#define SHIM_HELD_MAX 64
static void *shim_held[SHIM_HELD_MAX];
static size_t shim_held_count, shim_held_at;

static uint64_t shim_wall, shim_cpu;   /* ns inside the real calls, added up */

static uint64_t shim_now(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The real library's functions (their addresses): lc_stream_next_info_sized,
 * lc_batch_release, lc_batch_describe_sized and lc_stream_next. */
SHIM_EXPORT void ld_shim_set(void *next, void *release, void *describe, void *next_batch);
SHIM_EXPORT void ld_shim_set(void *next, void *release, void *describe, void *next_batch)
{
    shim_real_next = (shim_next_fn)next;
    shim_real_release = (shim_release_fn)release;
    shim_real_describe = (shim_describe_fn)describe;
    shim_real_next_batch = (shim_next_batch_fn)next_batch;
}

/* Answers from these batches in turn (count 0: time the real calls). Returns 0, or -1
 * when count is over SHIM_HELD_MAX. */
SHIM_EXPORT int ld_shim_hold(void *const *batches, size_t count);
SHIM_EXPORT int ld_shim_hold(void *const *batches, size_t count)
{
    if (count > SHIM_HELD_MAX)
        return -1;
    for (size_t i = 0; i < count; i++)
        shim_held[i] = batches[i];
    shim_held_count = count;
    shim_held_at = 0;
    return 0;
}

/* The time inside the real calls since the last reset, in ns. */
SHIM_EXPORT void ld_shim_times(uint64_t *wall_ns, uint64_t *cpu_ns);
SHIM_EXPORT void ld_shim_times(uint64_t *wall_ns, uint64_t *cpu_ns)
{
    *wall_ns = shim_wall;
    *cpu_ns = shim_cpu;
}

SHIM_EXPORT void ld_shim_reset(void);
SHIM_EXPORT void ld_shim_reset(void)
{
    shim_wall = shim_cpu = 0;
}

static int shim_nothing(void *batch)
{
    (void)batch;
    return 0;
}

static int shim_timed_release(shim_release_fn fn, void *batch)
{
    uint64_t w = shim_now(CLOCK_MONOTONIC), c = shim_now(CLOCK_THREAD_CPUTIME_ID);
    int rc = fn(batch);
    shim_cpu += shim_now(CLOCK_THREAD_CPUTIME_ID) - c;
    shim_wall += shim_now(CLOCK_MONOTONIC) - w;
    return rc;
}

SHIM_EXPORT int ld_shim_next(void *stream, int timeout_ms, void **ret_batch, void *ret_info, size_t info_size);
SHIM_EXPORT int ld_shim_next(void *stream, int timeout_ms, void **ret_batch, void *ret_info, size_t info_size)
{
    if (shim_held_count > 0) {
        void *b = shim_held[shim_held_at];
        shim_held_at = (shim_held_at + 1) % shim_held_count;
        *ret_batch = b;
        int rc = shim_real_describe(b, ret_info, info_size);
        return rc < 0 ? rc : 0;
    }
    uint64_t w = shim_now(CLOCK_MONOTONIC), c = shim_now(CLOCK_THREAD_CPUTIME_ID);
    int rc = shim_real_next(stream, timeout_ms, ret_batch, ret_info, info_size);
    shim_cpu += shim_now(CLOCK_THREAD_CPUTIME_ID) - c;
    shim_wall += shim_now(CLOCK_MONOTONIC) - w;
    return rc;
}

/* lc_stream_next in the same two ways (a package from before lc_stream_next_info). */
SHIM_EXPORT int ld_shim_next_batch(void *stream, int timeout_ms, void **ret_batch);
SHIM_EXPORT int ld_shim_next_batch(void *stream, int timeout_ms, void **ret_batch)
{
    if (shim_held_count > 0) {
        *ret_batch = shim_held[shim_held_at];
        shim_held_at = (shim_held_at + 1) % shim_held_count;
        return 0;
    }
    uint64_t w = shim_now(CLOCK_MONOTONIC), c = shim_now(CLOCK_THREAD_CPUTIME_ID);
    int rc = shim_real_next_batch(stream, timeout_ms, ret_batch);
    shim_cpu += shim_now(CLOCK_THREAD_CPUTIME_ID) - c;
    shim_wall += shim_now(CLOCK_MONOTONIC) - w;
    return rc;
}

SHIM_EXPORT int ld_shim_release(void *batch);
SHIM_EXPORT int ld_shim_release(void *batch)
{
    if (shim_held_count > 0)
        return 0;
    return shim_timed_release(shim_real_release, batch);
}

/* The timing's own cost per call that falls outside the time added up (as bench_python
 * measures its Python wrapper's): n timed calls of a function that does nothing, their
 * whole time less what they added up, per call; in ns, wall and CPU. */
SHIM_EXPORT void ld_shim_probe(size_t n, double *wall_ns, double *cpu_ns);
SHIM_EXPORT void ld_shim_probe(size_t n, double *wall_ns, double *cpu_ns)
{
    uint64_t w0 = shim_wall, c0 = shim_cpu;
    uint64_t tw = shim_now(CLOCK_MONOTONIC), tc = shim_now(CLOCK_THREAD_CPUTIME_ID);
    for (size_t i = 0; i < n; i++)
        shim_timed_release(shim_nothing, NULL);
    uint64_t cpu = shim_now(CLOCK_THREAD_CPUTIME_ID) - tc, wall = shim_now(CLOCK_MONOTONIC) - tw;
    *wall_ns = n ? ((double)wall - (double)(shim_wall - w0)) / (double)n : 0;
    *cpu_ns = n ? ((double)cpu - (double)(shim_cpu - c0)) / (double)n : 0;
    shim_wall = w0;
    shim_cpu = c0;
}
