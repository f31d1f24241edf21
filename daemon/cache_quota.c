/* cache_quota — keeps the files of one directory within a byte budget before a cache
 * is built there: a trainer's declared caches, each user's in a directory of their own
 * (declare_cache.h), the grant's cache_quota for each. The oldest caches make room for a
 * new one; a build that cannot fit is refused, and the stream reads its source. */
#include "cache_quota.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* Makes room for a build of `need` bytes in a declared cache's directory: the files
 * there (this user's caches, set-aside ones, other builds' temporary files) may take
 * quota bytes in all, the file being replaced not counted; the oldest other caches
 * (by modification time: when they were built) are removed until the new one fits.
 * Temporary files are never removed (a build may be writing them). LD_EDENIED with a
 * message when it cannot fit. */
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
