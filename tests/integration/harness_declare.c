/* harness_declare — the set-up the tests of declared datasets share (see
 * harness_declare.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness_declare.h"

struct harness *harness_declare_new(const char *server_extra, const char *declare_fmt)
{
    struct harness *h = harness_new();
    char declare[1024] = "";
    size_t n_decl = 0;
    for (const char *q = declare_fmt; q && *q && n_decl + 1 < sizeof declare;) {
        if (strncmp(q, "DATA", 4) == 0) {
            n_decl += (size_t)snprintf(declare + n_decl, sizeof declare - n_decl, "%s/data", h->dir);
            q += 4;
        } else if (strncmp(q, "CACHE", 5) == 0) {
            n_decl += (size_t)snprintf(declare + n_decl, sizeof declare - n_decl, "%s/dcache", h->dir);
            q += 5;
        } else {
            declare[n_decl++] = *q++;
        }
        declare[n_decl < sizeof declare ? n_decl : sizeof declare - 1] = '\0';
    }
    char data[PATH_MAX];
    snprintf(data, sizeof data, "%s/data", h->dir);
    assert_int_equal(mkdir(data, 0755), 0);
    harness_gen_files(h, "rec", DECLARE_N_FILES, DECLARE_FILE_SIZE, 0, false);
    harness_gen_files(h, "data/train", DECLARE_N_FILES, DECLARE_FILE_SIZE, 0, false);
    char datasets[2048];
    int n = snprintf(datasets, sizeof datasets, "  records:\n    kind: files\n    path: rec\n");
    if (declare_fmt)
        snprintf(datasets + n, sizeof datasets - (size_t)n, "access:\n  declare: %s\n", declare);
    harness_write_config(h, server_extra ? server_extra : "  workers: 2\n  memory_budget: 64MiB\n", datasets);
    return h;
}

int harness_declare_open(lc_client *c, const char *name, const char *spec, lc_stream **ret)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = DECLARE_BATCH;
    o.shuffle = 0;
    o.epochs = 1;
    o.spec = spec;
    return lc_stream_open(c, name, &o, ret);
}

const char *harness_declare_read_epoch_restarting(lc_stream *s, struct harness *restart, int at)
{
    static char why[256];
    uint64_t rows = 0;
    for (int k = 0;; k++) {
        if (restart && k == at) {
            assert_int_equal(harness_stop(restart), 0);
            harness_start(restart);
        }
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 20000, &b);
        if (r == LC_EEND)
            break;
        if (r < 0) {
            snprintf(why, sizeof why, "next: %s", lc_strerror(r));
            return why;
        }
        lc_field f;
        if (lc_batch_field_by_name(b, "data", &f) < 0) {
            lc_batch_release(b);
            return "no field 'data'";
        }
        for (uint32_t i = 0; i < lc_batch_rows(b); i++, rows++)
            if (!harness_file_matches(rows, (const uint8_t *)f.data + (size_t)i * DECLARE_FILE_SIZE, DECLARE_FILE_SIZE, DECLARE_FILE_SIZE,
                                      false)) {
                snprintf(why, sizeof why, "row %" PRIu64 " is not file %" PRIu64, rows, rows);
                lc_batch_release(b);
                return why;
            }
        lc_batch_release(b);
    }
    if (rows != DECLARE_N_FILES) {
        snprintf(why, sizeof why, "read %" PRIu64 " rows of %d", rows, DECLARE_N_FILES);
        return why;
    }
    return "";
}

const char *harness_declare_read_epoch(lc_stream *s)
{
    return harness_declare_read_epoch_restarting(s, NULL, 0);
}

void harness_declare_refused(lc_client *c, const char *name, const char *spec, int code, const char *want)
{
    lc_stream *s = NULL;
    int r = harness_declare_open(c, name, spec, &s);
    if (r != code || !strstr(lc_client_error(c), want))
        fail_msg("open of %s: got %d (%s) '%s', expected %d with '%s'", spec, r, lc_strerror(r), lc_client_error(c),
                 code, want);
    assert_null(s);
}

int harness_declare_cache_file(struct harness *h, unsigned uid, const char *prefix, char *buf, size_t size)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/dcache/%u", h->dir, uid);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && len > 8 && strcmp(e->d_name + len - 8, ".ldcache") == 0) {
            int w = snprintf(buf, size, "%s/%s", dir, e->d_name);
            assert_true(w > 0 && (size_t)w < size);
            n++;
        }
    }
    closedir(d);
    assert_true(n <= 1);
    return n;
}

cJSON *harness_declare_cache_status(struct harness *h)
{
    char out[65536];
    assert_int_equal(harness_ctl(h, out, sizeof out, "--json", "status", NULL), 0);
    cJSON *st = cJSON_Parse(out);
    assert_non_null(st);
    const cJSON *it;
    cJSON *found = NULL;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(st, "caches"))
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "declared")))
            found = cJSON_Duplicate(it, true);
    cJSON_Delete(st);
    return found;
}

int harness_proc_count(pid_t pid, const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

void harness_declare_gone(struct harness *h, int fds0, int threads0)
{
    cJSON *dc = NULL;
    int i = 0;
    for (; i < 1000 && ((dc = harness_declare_cache_status(h)) || harness_status_num(h, "datasets_in_memory", NULL) != 1);
         i++) {
        cJSON_Delete(dc);
        usleep(20000);
    }
    assert_true(i < 1000);
    int fds = 0, threads = 0;
    for (i = 0; i < 500 && ((fds = harness_proc_count(h->pid, "fd")) != fds0 || (threads = harness_proc_count(h->pid, "task")) != threads0);
         i++)
        usleep(20000);
    if (i == 500)
        fail_msg("after the declared dataset went: %d descriptors (%d before), %d threads (%d before)", fds, fds0,
                 threads, threads0);
}

double harness_declare_read_until_hits(lc_client *c, struct harness *h, const char *spec)
{
    lc_stream *s = NULL;
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = DECLARE_BATCH;
    o.shuffle = 0;
    o.spec = spec;
    if (lc_stream_open(c, NULL, &o, &s) < 0)
        fail_msg("declared open with a cache: %s", lc_client_error(c));
    double hits = 0;
    for (int epoch = 0; epoch < 200 && hits == 0; epoch++) {
        for (uint64_t row = 0; row < DECLARE_N_FILES;) {
            lc_batch *b = NULL;
            int r = lc_stream_next(s, 20000, &b);
            if (r < 0)
                fail_msg("declared stream with a cache, epoch %d: next: %s", epoch, lc_strerror(r));
            lc_field f;
            assert_int_equal(lc_batch_field_by_name(b, "data", &f), 0);
            for (uint32_t i = 0; i < lc_batch_rows(b); i++, row++)
                if (!harness_file_matches(row, (const uint8_t *)f.data + (size_t)i * DECLARE_FILE_SIZE, DECLARE_FILE_SIZE,
                                          DECLARE_FILE_SIZE, false))
                    fail_msg("declared stream with a cache, epoch %d: row %" PRIu64 " is not that file", epoch, row);
            lc_batch_release(b);
        }
        harness_flush_releases(c);
        cJSON *dc = harness_declare_cache_status(h);
        assert_non_null(dc);
        hits = cJSON_GetObjectItemCaseSensitive(dc, "hits")->valuedouble;
        cJSON_Delete(dc);
    }
    lc_stream_close(s);
    harness_flush_releases(c);
    return hits;
}
