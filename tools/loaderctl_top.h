/* loaderctl_top — `loaderctl top`: a refreshing view of the open streams, worst data
 * stall first. */
#ifndef LD_LOADERCTL_TOP_H
#define LD_LOADERCTL_TOP_H

#include <stdbool.h>

#include "loaderclient.h"

#define CTL_TOP_USAGE                                                                              \
    "  top [--once] [--interval S] [--count N] [--json]\n"                                          \
    "                         the open streams, worst data stall first, refreshed every S\n"        \
    "                         seconds (default 1) until interrupted or N times; --once: one\n"      \
    "                         view, no screen clearing (for scripts and tests)\n"

/* Runs the command on a connected client: argv[0] is "top". Returns the exit status
 * (0, 1 when a request failed, 2 for a bad argument, after printing why). */
int ctl_top(lc_client *c, int argc, char **argv, bool json);

#endif
