/* ld_format — numbers as people read them in logs, errors and loaderctl's tables. One
 * formatter for the daemon and loaderctl alike, so "512.0 MiB" means the same thing in
 * a log line and in `loaderctl status`. Library code: no allocation, no printing. */
#ifndef LD_FORMAT_H
#define LD_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* Room for any ld_format_bytes() result, NUL included (the longest is "1023.9 PiB"). */
#define LD_FORMAT_BYTES_MAX 32

/* `bytes` in binary units (these are memory and file sizes): "0 B" .. "1023 B", then
 * one decimal with KiB, MiB, GiB, TiB, PiB or EiB ("1.5 MiB"). Writes at most `size`
 * bytes into buf (cut to fit, always NUL-terminated when size > 0) and returns buf. */
char *ld_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif
