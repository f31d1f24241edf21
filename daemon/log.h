/* ld_log — the daemon's only way to print: level-filtered lines on stderr, safe to call
 * from any thread. Library code (proto/, client/) never logs.
 *
 * ld_require(expr) is the daemon's check of an invariant whose breach means memory is
 * no longer safe to use (a reference count below zero, a state table that contradicts
 * its counts): it logs file:line, the function and the expression, then aborts, so a
 * core dump or the journal says which promise broke. A check that one request or one
 * file is wrong is not a requirement: it fails that request with an LD_E* code and the
 * daemon keeps serving. */
#ifndef LD_LOG_H
#define LD_LOG_H

enum ld_log_level { LD_LOG_ERROR = 0, LD_LOG_WARN = 1, LD_LOG_INFO = 2, LD_LOG_DEBUG = 3 };

void ld_log_set_level(int level);
int ld_log_level_from_name(const char *name); /* LD_LOG_* or -1 */
void ld_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Always checked (NDEBUG does not remove it); expr is evaluated exactly once. */
#define ld_require(expr) \
    (__builtin_expect(!!(expr), 1) ? (void)0 : ld_require_fail(__FILE__, __LINE__, __func__, #expr))
/* Logs "FILE:LINE: FUNC: requirement failed: EXPR" at error level (never filtered out)
 * and aborts. Called by ld_require() only. */
_Noreturn void ld_require_fail(const char *file, int line, const char *func, const char *expr);

#endif
