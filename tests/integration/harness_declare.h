/* harness_declare — the set-up the tests of declared datasets share (itest_declare.c,
 * itest_declare_cache.c): a daemon whose access.declare grant is the test's, a folder
 * of files whose every byte is known, reading it in order, a refused open, and the
 * declared cache as the daemon's directory and `status` show it. Built on harness.h. */
#ifndef LD_HARNESS_DECLARE_H
#define LD_HARNESS_DECLARE_H

#include <stddef.h>
#include <sys/types.h>

#include <cJSON.h>

#include "harness.h"
#include "loaderclient.h"

#define DECLARE_N_FILES 96          /* files in data/train (and rec, the configured dataset) */
#define DECLARE_FILE_SIZE 40
#define DECLARE_BATCH 16

/* A daemon (not started) with the configured dataset `records` and data/train
 * (DECLARE_N_FILES files) beneath <dir>/data; declare_fmt is the access.declare value,
 * DATA standing for <dir>/data and CACHE for <dir>/dcache (NULL: no access section);
 * server_extra the server section's body (NULL: two workers, 64 MiB). */
struct harness *harness_declare_new(const char *server_extra, const char *declare_fmt);
/* Opens `name` (NULL with a spec) for one in-order epoch of DECLARE_BATCH rows. */
int harness_declare_open(lc_client *c, const char *name, const char *spec, lc_stream **ret);
/* Reads the epoch; every row must be file `row` of the folder, in order. With
 * `restart`, that daemon is stopped and started again before batch `at`. Returns "" or
 * what was wrong (static). */
const char *harness_declare_read_epoch_restarting(lc_stream *s, struct harness *restart, int at);
const char *harness_declare_read_epoch(lc_stream *s);
/* The open of `spec` fails with `code` and a message containing `want`. */
void harness_declare_refused(lc_client *c, const char *name, const char *spec, int code, const char *want);
/* The one file in <dir>/dcache/<uid> whose name starts with `prefix` and ends in
 * .ldcache (its path in buf), or 0 when there is none; fails on two. */
int harness_declare_cache_file(struct harness *h, unsigned uid, const char *prefix, char *buf, size_t size);
/* The declared cache in status (NULL when there is none), as a cJSON the caller frees. */
cJSON *harness_declare_cache_status(struct harness *h);
/* Entries of /proc/<pid>/<what> (fd, task). */
int harness_proc_count(pid_t pid, const char *what);
/* Waits (on the daemon's state, up to 20 s) until no declared cache is listed and one
 * dataset (the configured one) is in memory; then its threads and descriptors are
 * those it had before. */
void harness_declare_gone(struct harness *h, int fds0, int threads0);
/* Reads epochs of `spec` until status counts hits of its cache (each epoch exactly the
 * files); returns the hits. */
double harness_declare_read_until_hits(lc_client *c, struct harness *h, const char *spec);

#endif
