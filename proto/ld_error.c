/* The error table's three views (sentence, wire name, reverse lookup), generated from
 * LD_ERROR_MAP so that the daemon and every client agree on what a code means. */
#include "ld_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"

const char *ld_strerror(int code)
{
    switch (code) {
    case 0: return "success";
#define LD_ERROR_MSG(name, value, wire, msg) case (value): return msg;
    LD_ERROR_MAP(LD_ERROR_MSG)
#undef LD_ERROR_MSG
    default: break;
    }
    if (code < 0 && code > -4000)
        return strerror(-code); /* glibc returns static strings for known errno values */
    return "unknown error";
}

const char *ld_error_name(int code)
{
    switch (code) {
    case 0: return "ok";
#define LD_ERROR_WIRE(name, value, wire, msg) case (value): return wire;
    LD_ERROR_MAP(LD_ERROR_WIRE)
#undef LD_ERROR_WIRE
    default: return "unknown_error";
    }
}

int ld_error_from_name(const char *name)
{
    if (!name)
        return LD_EPROTO;
    if (strcmp(name, "ok") == 0)
        return 0;
#define LD_ERROR_LOOKUP(n, value, wire, msg) if (strcmp(name, wire) == 0) return (value);
    LD_ERROR_MAP(LD_ERROR_LOOKUP)
#undef LD_ERROR_LOOKUP
    return LD_EPROTO;
}

void ld_errorf(char *errbuf, const char *fmt, ...)
{
    if (!errbuf)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, LD_ERRMSG_MAX, fmt, ap);
    va_end(ap);
}
