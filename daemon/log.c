/* The daemon's log: one line per call on stderr with a timestamp and level, filtered
 * by the configured level. A whole line is formatted first and written with one
 * write(2), so lines from worker threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = LD_LOG_INFO;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

void ld_log_set_level(int level)
{
    if (level >= LD_LOG_ERROR && level <= LD_LOG_DEBUG)
        atomic_store(&log_level, level);
}

int ld_log_level_from_name(const char *name)
{
    for (int i = 0; i <= LD_LOG_DEBUG; i++)
        if (strcasecmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

static const char *ld_log_level_name(int level)
{
    return level >= LD_LOG_ERROR && level <= LD_LOG_DEBUG ? level_names[level] : "?";
}

void ld_log(int level, const char *fmt, ...)
{
    if (level > atomic_load(&log_level))
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ loaderd %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, ld_log_level_name(level));
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void ld_require_fail(const char *file, int line, const char *func, const char *expr)
{
    /* ld_log at LD_LOG_ERROR is never filtered: the level cannot go below error. */
    ld_log(LD_LOG_ERROR, "%s:%d: %s: requirement failed: %s", file, line, func, expr);
    abort();
}
