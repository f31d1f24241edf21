/* ld_log — the daemon's only way to print: level-filtered lines on stderr, safe to call
 * from any thread. Library code (proto/, client/) never logs. */
#ifndef LD_LOG_H
#define LD_LOG_H

enum ld_log_level { LD_LOG_ERROR = 0, LD_LOG_WARN = 1, LD_LOG_INFO = 2, LD_LOG_DEBUG = 3 };

void ld_log_set_level(int level);
int ld_log_level_from_name(const char *name); /* LD_LOG_* or -1 */
const char *ld_log_level_name(int level);
void ld_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
