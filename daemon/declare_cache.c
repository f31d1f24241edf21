/* declare_cache — the directory a declared dataset's cache is written beneath, and its
 * name there (declare_cache.h). */
#include "declare_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ld_error.h"
#include "proto.h"

/* The spec's keys that change neither which samples a dataset has nor their bytes:
 * left out of the cache's name, so that a trainer trying other transforms reuses it. */
static const char *const declare_cache_free_keys[] = {"transforms", "on_error", "cache", "path"};

/* Puts the members of every object in `item` in the order of their keys (arrays keep
 * theirs): the same spec names the same cache whatever order a client wrote it in.
 * cJSON links an object's members in a list whose head's prev is its tail. */
static void declare_cache_sort(cJSON *item)
{
    for (cJSON *c = item->child; c; c = c->next)
        declare_cache_sort(c);
    if (!cJSON_IsObject(item) || !item->child)
        return;
    cJSON *sorted = NULL, *c = item->child;
    while (c) {
        cJSON *next = c->next, **pp = &sorted;
        while (*pp && strcmp((*pp)->string, c->string) <= 0)
            pp = &(*pp)->next;
        c->next = *pp;
        *pp = c;
        c = next;
    }
    cJSON *prev = NULL;
    for (c = sorted; c; c = c->next) {
        c->prev = prev;
        prev = c;
    }
    sorted->prev = prev;
    item->child = sorted;
}

/* The hash that names the cache: the directory and the spec's other keys, in the
 * order of their names. */
static int declare_cache_key(const char *real, const cJSON *spec, uint64_t *ret)
{
    cJSON *copy = cJSON_Duplicate(spec, true);
    if (!copy)
        return LD_ENOMEM;
    for (size_t i = 0; i < sizeof declare_cache_free_keys / sizeof *declare_cache_free_keys; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(copy, declare_cache_free_keys[i]);
    declare_cache_sort(copy);
    char *text = cJSON_PrintUnformatted(copy);
    cJSON_Delete(copy);
    if (!text)
        return LD_ENOMEM;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        cJSON_free(text);
        return LD_ENOMEM;
    }
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, real, strlen(real) + 1);
    XXH3_64bits_update(st, text, strlen(text));
    *ret = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    cJSON_free(text);
    return 0;
}

int declare_cache_open_dir(const char *dir, int *ret_fd, char *why, size_t why_size)
{
    char ebuf[128];
    /* Never through a link: the directory itself, or nothing. */
    int fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        if (e == ELOOP || e == ENOTDIR) {
            snprintf(why, why_size, "is not a directory (a symbolic link is not followed): name the directory "
                     "itself");
            return LD_EDENIED;
        }
        snprintf(why, why_size, "cannot be opened: %s", strerror_r(e, ebuf, sizeof ebuf));
        return ld_from_errno(e);
    }
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        snprintf(why, why_size, "belongs to uid %u with mode %04o: it must be the daemon's (uid %u) and "
                 "writable by nobody else (no group or other write)", (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
        return LD_EDENIED;
    }
    *ret_fd = fd;
    return 0;
}

int declare_cache_place(const struct access_declare *grant, uint32_t uid, const char *real, const cJSON *spec,
                        struct declare_cache *ret, char *errbuf)
{
    char sub[16], ebuf[128];
    int rc;
    uint64_t key;
    if ((rc = declare_cache_key(real, spec, &key)) < 0) {
        ld_errorf(errbuf, "out of memory");
        return rc;
    }
    /* The operator's directory: created (one level, mode 0700) when missing. */
    if (mkdir(grant->cache_dir, 0700) < 0 && errno != EEXIST) {
        int e = errno;
        ld_errorf(errbuf, "spec.cache: the cache directory '%s' of the access.declare grant cannot be created: %s",
                  grant->cache_dir, strerror_r(e, ebuf, sizeof ebuf));
        return ld_from_errno(e);
    }
    char why[LD_ERRMSG_MAX];
    int top;
    if ((rc = declare_cache_open_dir(grant->cache_dir, &top, why, sizeof why)) < 0) {
        ld_errorf(errbuf, "%sspec.cache: the cache directory '%s' of the access.declare grant %s",
                  rc == LD_EDENIED ? "permission denied: " : "", grant->cache_dir, why);
        return rc;
    }
    snprintf(sub, sizeof sub, "%u", (unsigned)uid);
    if (mkdirat(top, sub, 0700) < 0 && errno != EEXIST) {
        int e = errno;
        close(top);
        ld_errorf(errbuf, "spec.cache: cannot create '%s/%s': %s", grant->cache_dir, sub,
                  strerror_r(e, ebuf, sizeof ebuf));
        return ld_from_errno(e);
    }
    /* One component, never through a link: what was created above, or what someone
     * put there before, which must then be the daemon's own and closed to others. */
    int fd = openat(top, sub, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = errno;
    close(top);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        if (fd >= 0) {
            e = errno;
            close(fd);
        }
        ld_errorf(errbuf, "permission denied: spec.cache: '%s/%s' %s: the daemon writes declared caches only in a "
                  "directory of its own (remove it)", grant->cache_dir, sub,
                  e == ELOOP || e == ENOTDIR ? "is not a directory (a symbolic link is not followed)"
                                             : strerror_r(e, ebuf, sizeof ebuf));
        return e == ELOOP || e == ENOTDIR ? LD_EDENIED : ld_from_errno(e);
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077)) {
        close(fd);
        ld_errorf(errbuf, "permission denied: spec.cache: '%s/%s' belongs to uid %u with mode %04o: the daemon "
                  "writes declared caches only in a directory of its own that nobody else may enter (mode 0700; "
                  "remove it)",
                  grant->cache_dir, sub, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        return LD_EDENIED;
    }
    /* "train-0123456789abcdef.ldcache": the directory's name, kept to what a file name
     * may hold, for whoever looks at the directory. */
    const char *base = strrchr(real, '/');
    base = base && base[1] ? base + 1 : "root";
    char label[64];
    size_t n = 0;
    for (const char *p = base; *p && n + 1 < sizeof label; p++)
        label[n++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                             *p == '-' || *p == '_' ? *p : '_';
    label[n] = '\0';
    *ret = (struct declare_cache){.dirfd = fd, .quota = grant->cache_quota};
    snprintf(ret->name, sizeof ret->name, "%s-%016llx.ldcache", label, (unsigned long long)key);
    snprintf(ret->shown, sizeof ret->shown, "%s/%s/%s", grant->cache_dir, sub, ret->name);
    return 0;
}

void declare_cache_close(struct declare_cache *c)
{
    if (c->dirfd >= 0)
        close(c->dirfd);
    c->dirfd = -1;
}
