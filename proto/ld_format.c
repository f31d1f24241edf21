/* ld_format — human-readable sizes, shared by the daemon (ring and stream messages) and
 * loaderctl (status and cache tables); see ld_format.h. */
#include "ld_format.h"

#include <inttypes.h>
#include <stdio.h>

char *ld_format_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (!buf || size == 0)
        return buf;
    if (bytes < 1024) {
        snprintf(buf, size, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes;
    size_t u = 0;
    /* 1023.95 KiB would print as "1024.0 KiB": move up while the rounded value
     * reaches the next unit. */
    while (v >= 1023.95 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}
