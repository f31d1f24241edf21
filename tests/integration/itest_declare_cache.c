/* itest_declare_cache — the caches of datasets a trainer declares, against a real
 * loaderd: built in the grant's cache_dir (mode 0600, in the user's directory of mode
 * 0700) and reused by the next open of the same spec, never through a link planted in
 * the way (not even one to a valid copy), refused when cache_dir or the user's
 * directory is open to others or a link, each user's apart, kept within the quota, and
 * gone with the last stream (no thread or descriptor left). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "harness.h"
#include "harness_declare.h"
#include "loaderclient.h"

/* Built on first use in the grant's cache_dir, reused by the same spec (the file not
 * built again), rebuilt over a link planted in its place (its target untouched),
 * refused through a link planted for the user's directory, the oldest removed for a
 * new one within the quota, not built above it; and nothing left once the last
 * stream is gone. */
static void test_declared_cache(void **state)
{
    (void)state;
    /* A cache of data/train: 4096 + 96 * 64 + 96 * 32 + 64 = 13376 bytes; the quota
     * holds one such, not two. */
    struct harness *h = harness_declare_new(NULL, "[{roots: [DATA], caches: true, cache_dir: CACHE, "
                                              "cache_quota: 20KiB}]");
    harness_gen_files(h, "data/other", DECLARE_N_FILES, DECLARE_FILE_SIZE, 0, false);
    harness_gen_files(h, "data/big", 300, DECLARE_FILE_SIZE, 0, false);
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "cacher");
    /* Warm: what a stream starts once (the workers, ...) is running before counting. */
    lc_stream *s = NULL;
    assert_int_equal(harness_declare_open(c, "records", NULL, &s), 0);
    assert_string_equal(harness_declare_read_epoch(s), "");
    lc_stream_close(s);
    harness_flush_releases(c);
    int fds0 = harness_proc_count(h->pid, "fd"), threads0 = harness_proc_count(h->pid, "task");

    const char *spec = "{\"kind\":\"files\",\"path\":\"train\",\"pattern\":\"*\",\"cache\":{}}";
    char file[PATH_MAX], aside[PATH_MAX + 8], reason[PATH_MAX + 16], top[PATH_MAX], victim[PATH_MAX];
    char cdir[PATH_MAX], moved[PATH_MAX], out[4096];
    /* First use: read from the source while the cache is built; then read from it. */
    harness_declare_read_until_hits(c, h, spec);
    assert_int_equal(harness_declare_cache_file(h, 0, "train-", file, sizeof file), 1);
    struct stat st0, st1;
    assert_int_equal(lstat(file, &st0), 0);
    assert_true(S_ISREG(st0.st_mode));
    assert_int_equal(st0.st_mode & 0777, 0600); /* only the daemon reads it */
    harness_declare_gone(h, fds0, threads0);

    /* The same spec again, its keys in another order (and its on_error, which does not
     * change what is cached): the same file. */
    assert_true(harness_declare_read_until_hits(c, h, "{\"pattern\":\"*\",\"on_error\":\"replace\",\"cache\":"
                                                "{\"mode\":\"auto\"},\"path\":\"train\",\"kind\":\"files\"}") > 0);
    assert_int_equal(lstat(file, &st1), 0);
    assert_int_equal(st1.st_ino, st0.st_ino);
    char *log = harness_log(h);
    const char *first = strstr(log, "building the cache");
    assert_non_null(first);
    assert_null(strstr(first + 1, "building the cache"));
    free(log);
    harness_declare_gone(h, fds0, threads0);

    /* A link planted where the cache goes is set aside, never followed: not even to a
     * valid copy of the same cache, which it would serve if it followed the link. */
    snprintf(victim, sizeof victim, "%s/victim", h->dir);
    assert_int_equal(rename(file, victim), 0);
    assert_int_equal(symlink(victim, file), 0);
    assert_true(harness_declare_read_until_hits(c, h, spec) > 0);
    assert_int_equal(lstat(file, &st1), 0);
    assert_true(S_ISREG(st1.st_mode));
    assert_true(st1.st_ino != st0.st_ino);
    snprintf(aside, sizeof aside, "%s.bad", file);
    assert_int_equal(lstat(aside, &st1), 0);
    assert_true(S_ISLNK(st1.st_mode));
    snprintf(reason, sizeof reason, "%s.bad.reason", file);
    char why[1024] = "";
    FILE *f = fopen(reason, "r");
    assert_non_null(f);
    size_t got = fread(why, 1, sizeof why - 1, f);
    why[got] = '\0';
    fclose(f);
    if (!strstr(why, "is a symbolic link, which a cache written beneath its directory never is: not followed"))
        fail_msg("the reason set aside with the link: '%s'", why);
    assert_int_equal(stat(victim, &st1), 0);
    assert_int_equal(st1.st_ino, st0.st_ino);
    assert_int_equal(st1.st_size, st0.st_size);
    assert_int_equal(st1.st_mtim.tv_nsec, st0.st_mtim.tv_nsec);
    harness_declare_gone(h, fds0, threads0);
    assert_int_equal(unlink(aside), 0);
    assert_int_equal(unlink(reason), 0);
    assert_int_equal(unlink(victim), 0);

    /* A link in place of the user's directory: refused, nothing written where it leads. */
    snprintf(cdir, sizeof cdir, "%s/dcache/0", h->dir);
    snprintf(moved, sizeof moved, "%s/dcache/moved", h->dir);
    assert_int_equal(rename(cdir, moved), 0);
    assert_int_equal(symlink(h->dir, cdir), 0);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "dcache/0' is not a directory (a symbolic link is not followed)");
    assert_int_equal(unlink(cdir), 0);
    assert_int_equal(rename(moved, cdir), 0);

    /* The user's directory open to others (even without their writing it): refused. */
    assert_int_equal(chmod(cdir, 0750), 0);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "dcache/0' belongs to uid 0 with mode 0750: the daemon "
                            "writes declared caches only in a directory of its own that nobody else may enter");
    assert_int_equal(chmod(cdir, 0700), 0);

    /* cache_dir itself: writable by others, or a link in its place, refused. */
    snprintf(top, sizeof top, "%s/dcache", h->dir);
    assert_int_equal(chmod(top, 0777), 0);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "dcache' of the access.declare grant belongs to uid 0 with "
                            "mode 0777: it must be the daemon's");
    assert_int_equal(chmod(top, 0700), 0);
    snprintf(moved, sizeof moved, "%s/dcache-moved", h->dir);
    assert_int_equal(rename(top, moved), 0);
    assert_int_equal(symlink(moved, top), 0);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "dcache' of the access.declare grant is not a directory "
                            "(a symbolic link is not followed)");
    assert_int_equal(unlink(top), 0);
    assert_int_equal(rename(moved, top), 0);

    /* A cache of another tree: the older one goes to make room within the quota. */
    harness_declare_read_until_hits(c, h, "{\"kind\":\"files\",\"path\":\"other\",\"cache\":{}}");
    assert_int_equal(harness_declare_cache_file(h, 0, "other-", moved, sizeof moved), 1);
    assert_int_equal(harness_declare_cache_file(h, 0, "train-", file, sizeof file), 0);
    harness_declare_gone(h, fds0, threads0);

    /* One larger than the quota is not built; the stream reads the source. */
    assert_int_equal(harness_declare_open(c, NULL, "{\"kind\":\"files\",\"path\":\"big\",\"cache\":{}}", &s), 0);
    uint64_t rows = 0;
    lc_batch *b = NULL;
    while (lc_stream_next(s, 20000, &b) == 0) {
        rows += lc_batch_rows(b);
        lc_batch_release(b);
    }
    assert_int_equal(rows, 300);
    cJSON *dc = NULL;
    for (int i = 0; i < 1000; i++) {
        dc = harness_declare_cache_status(h);
        assert_non_null(dc);
        if (strcmp(cJSON_GetObjectItemCaseSensitive(dc, "state")->valuestring, "failed") == 0)
            break;
        cJSON_Delete(dc);
        dc = NULL;
        usleep(20000);
    }
    assert_non_null(dc);
    const char *error = cJSON_GetObjectItemCaseSensitive(dc, "error")->valuestring;
    if (!strstr(error, "needs 32.2 KiB, more than the 20.0 KiB of caches its user may keep"))
        fail_msg("over the quota: '%s'", error);
    cJSON_Delete(dc);
    assert_int_equal(harness_declare_cache_file(h, 0, "big-", file, sizeof file), 0);
    lc_stream_close(s);
    harness_flush_releases(c);
    harness_declare_gone(h, fds0, threads0);

    /* The trainer never names the file. */
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"cache\":{\"path\":\"/etc/passwd\"}}",
                   LC_EDENIED, "spec.cache.path: the daemon places a declared dataset's cache");
    assert_int_equal(harness_ctl(h, out, sizeof out, "status", NULL), 0);
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* The declared caches in status in state `state`. */
static int declared_in_state(struct harness *h, const char *state)
{
    char out[65536];
    assert_int_equal(harness_ctl(h, out, sizeof out, "--json", "status", NULL), 0);
    cJSON *st = cJSON_Parse(out);
    assert_non_null(st);
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(st, "caches")) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, "state");
        n += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "declared")) && cJSON_IsString(s) &&
             strcmp(s->valuestring, state) == 0;
    }
    cJSON_Delete(st);
    return n;
}

/* Waits (up to 20 s) until `n` declared caches are in state `state`. */
static void wait_declared(struct harness *h, const char *state, int n)
{
    int i = 0, got = 0;
    for (; i < 1000 && (got = declared_in_state(h, state)) != n; i++)
        usleep(20000);
    if (got != n)
        fail_msg("%d declared caches %s, expected %d", got, state, n);
}

/* Occurrences of `what` in the daemon's log. */
static int log_count(struct harness *h, const char *what)
{
    char *log = harness_log(h);
    int n = 0;
    for (const char *p = strstr(log, what); p; p = strstr(p + 1, what))
        n++;
    free(log);
    return n;
}

/* The same spec opened by three ranks at once: its keepers take turns in the user's
 * directory (the test holds the directory's build lock first, as a build of another
 * cache would), and once it is free the cache is built once, the two other keepers
 * serving what it wrote; a temporary file left by a dead build, though named after a
 * live pid (the daemon's own), is removed under the lock rather than held against the
 * quota (with it the cache would not fit). */
static void test_same_spec_at_once(void **state)
{
    (void)state;
    struct harness *h = harness_declare_new(NULL, "[{roots: [DATA], caches: true, cache_dir: CACHE, "
                                                  "cache_quota: 20KiB}]");
    char dir[PATH_MAX], tmp[PATH_MAX + 64], file[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/dcache", h->dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(dir, sizeof dir, "%s/dcache/0", h->dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    harness_start(h);
    snprintf(tmp, sizeof tmp, "%s/train-0123456789abcdef.ldcache.tmp.%d.0123456789abcdef", dir, (int)h->pid);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 10000), 0);
    close(fd);
    int lock = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(lock >= 0);
    assert_int_equal(flock(lock, LOCK_EX), 0);

    lc_client *c = harness_connect(h, 5000, "ranks");
    const char *spec = "{\"kind\":\"files\",\"path\":\"train\",\"cache\":{}}";
    lc_stream *s[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        assert_int_equal(harness_declare_open(c, NULL, spec, &s[i]), 0);
    /* All three wait for the directory, and nothing is written meanwhile. */
    wait_declared(h, "building", 3);
    assert_int_equal(harness_declare_cache_file(h, 0, "train-", file, sizeof file), 0);
    assert_int_equal(access(tmp, F_OK), 0);
    close(lock);

    wait_declared(h, "ready", 3);
    assert_int_equal(log_count(h, "cache built ("), 1);
    assert_int_equal(log_count(h, "was built meanwhile for the same spec"), 2);
    assert_int_equal(log_count(h, "the temporary file of a build that did not finish"), 1);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(harness_declare_cache_file(h, 0, "train-", file, sizeof file), 1);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(harness_declare_read_epoch(s[i]), "");
        lc_stream_close(s[i]);
    }
    harness_flush_releases(c);
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared_cache),
        cmocka_unit_test(test_same_spec_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
