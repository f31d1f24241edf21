/* cache_quota — keeps the files of one directory within a byte budget before a cache
 * is built there: a trainer's declared caches, each user's in a directory of their own
 * (declare_cache.h), the grant's cache_quota for each. The oldest caches make room for a
 * new one; a build that cannot fit is refused, and the stream reads its source. A
 * directory's builds take turns (cache_quota_lock), so the quota counts every byte a
 * build has reserved, and the same cache asked for by many opens at once (one per rank
 * of a job) is written once. */
#include "cache_quota.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ld_error.h"
#include "ld_format.h"
#include "log.h"

struct cache_quota_file {
    char name[256];
    uint64_t bytes;
    int64_t mtime_ns;
};

static int cache_quota_older(const void *a, const void *b)
{
    const struct cache_quota_file *x = a, *y = b;
    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* Makes room for a build of `need` bytes in a declared cache's directory, its build
 * lock held: the files there (this user's caches, set-aside ones) may take quota bytes
 * in all, the file being replaced not counted; temporary files are dead builds' and go;
 * the oldest other caches (by modification time: when they were built) are removed
 * until the new one fits. LD_EDENIED with a message when it cannot fit. */
int cache_quota_make_room(int dirfd, const char *keep, const char *shown, uint64_t quota, uint64_t need,
                          char *errbuf)
{
    char q[LD_FORMAT_BYTES_MAX], n[LD_FORMAT_BYTES_MAX], u[LD_FORMAT_BYTES_MAX];
    ld_format_bytes(quota, q, sizeof q);
    ld_format_bytes(need, n, sizeof n);
    if (need > quota) {
        ld_errorf(errbuf, "cache %s: needs %s, more than the %s of caches its user may keep (the cache_quota of "
                  "the access.declare grant): not built, the stream reads the source", shown, n, q);
        return LD_EDENIED;
    }
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        ld_errorf(errbuf, "cache %s: cannot list its directory: %s", shown, strerror(e));
        return ld_from_errno(e);
    }
    struct cache_quota_file *files = NULL;
    size_t n_files = 0, cap = 0;
    uint64_t used = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        struct stat st;
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            strcmp(de->d_name, keep) == 0)
            continue;
        if (strstr(de->d_name, ".tmp.")) {
            /* Under the directory's build lock no build is writing one: this is a dead
             * builder's (its pid perhaps another process's by now), never a cache. */
            if (unlinkat(fd, de->d_name, 0) == 0) {
                ld_log(LD_LOG_INFO, "removed '%s' (%" PRIu64 " bytes) beside %s: the temporary file of a build "
                       "that did not finish", de->d_name, (uint64_t)st.st_size, shown);
                continue;
            }
        }
        used += (uint64_t)st.st_size;
        if (strstr(de->d_name, ".tmp.") || strlen(de->d_name) >= sizeof files->name)
            continue;
        if (n_files == cap) {
            cap = cap ? 2 * cap : 16;
            struct cache_quota_file *more = realloc(files, cap * sizeof *files);
            if (!more) {
                rc = LD_ENOMEM;
                ld_errorf(errbuf, "out of memory");
                break;
            }
            files = more;
        }
        struct cache_quota_file *f = &files[n_files++];
        snprintf(f->name, sizeof f->name, "%s", de->d_name);
        f->bytes = (uint64_t)st.st_size;
        f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    }
    if (rc == 0) {
        if (n_files)
            qsort(files, n_files, sizeof *files, cache_quota_older);
        for (size_t i = 0; i < n_files && used + need > quota; i++) {
            if (unlinkat(fd, files[i].name, 0) < 0)
                continue;
            used -= files[i].bytes;
            ld_log(LD_LOG_INFO, "removed the older cache '%s' (%" PRIu64 " bytes) beside %s to stay within the "
                   "cache quota", files[i].name, files[i].bytes, shown);
        }
        if (used + need > quota) {
            ld_format_bytes(used, u, sizeof u);
            ld_errorf(errbuf, "cache %s: needs %s, and builds under way keep %s of the %s of caches its user may "
                      "keep (the cache_quota of the access.declare grant): not built, the stream reads the source",
                      shown, n, u, q);
            rc = LD_EDENIED;
        }
    }
    free(files);
    closedir(dir);
    return rc;
}

int cache_quota_lock(int dirfd, const char *shown, const atomic_int *cancel, int *ret_fd, char *errbuf)
{
    /* dirfd is O_PATH, which flock refuses: a descriptor of the same directory that
     * can hold the lock. */
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        ld_errorf(errbuf, "cache %s: cannot open its directory: %s", shown, strerror(e));
        return ld_from_errno(e);
    }
    /* A wait that the keeper's close can end: another build of this user may take
     * hours, and a stop must not wait for it. */
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        if (e != EWOULDBLOCK && e != EINTR) {
            close(fd);
            ld_errorf(errbuf, "cache %s: cannot lock its directory: %s", shown, strerror(e));
            return ld_from_errno(e);
        }
        if (cancel && atomic_load(cancel)) {
            close(fd);
            ld_errorf(errbuf, "cache %s: cancelled while another build in its directory ran", shown);
            return LD_ECANCELED;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *ret_fd = fd;
    return 0;
}
