/* declare_cache — where the cache of a trainer's declared dataset goes, and the
 * directory it is written beneath.
 *
 * A grant of access.declare with caches: true names a directory (cache_dir) and a
 * quota. The daemon keeps each user's declared caches in a subdirectory of it named by
 * the uid (cache_dir/1001/), which it creates mode 0700 and requires to be its own: a
 * trainer never names a cache path, so it can neither point a build at a file of its
 * choosing nor reach another user's caches or a configured dataset's. The file's name
 * is the dataset directory's name and a hash of the directory (as the kernel names it)
 * and of the spec's keys that decide which samples and bytes are cached (not its
 * transforms, on_error or cache options), each object's keys in the order of their
 * names: the same spec on the same tree, however its keys are ordered, finds the same
 * cache again, in a later run too.
 *
 * cache_dir itself must be the daemon's, writable by nobody else, and is never reached
 * through a symbolic link (checked at config load when it exists, and at every
 * placing). The user's directory is opened once, without following a symbolic link
 * (O_NOFOLLOW; a link, a directory someone else owns, or one that others may enter, in
 * its place is refused, not used), and
 * everything the cache keeper does goes through that descriptor
 * (cache_keeper_new_at). Loop thread or any thread: blocking, but a few system calls. */
#ifndef LD_DECLARE_CACHE_H
#define LD_DECLARE_CACHE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <cJSON.h>

#include "access.h"

struct declare_cache {
    int dirfd;                      /* the user's directory (O_PATH), or -1: no cache */
    char name[NAME_MAX + 1];        /* the file's name in it */
    char shown[PATH_MAX];           /* cache_dir/UID/NAME, for messages and status */
    uint64_t quota;                 /* the grant's cache_quota */
};

/* Places the cache of the dataset in directory `real` (absolute, as resolved) that
 * `spec` declares, for user `uid`, under `grant` (caches: true): opens (creating when
 * missing) grant->cache_dir and its subdirectory `uid`. 0 and *ret (its dirfd the
 * caller's), or LD_EDENIED (a link or a stranger's directory in the way) or another
 * code, with errbuf saying what and where. */
int declare_cache_place(const struct access_declare *grant, uint32_t uid, const char *real, const cJSON *spec,
                        struct declare_cache *ret, char *errbuf);
/* Opens `dir` (an access.declare grant's cache_dir) as O_PATH, never through a
 * symbolic link, and checks that it is the daemon's (owner: the effective uid) and
 * that neither group nor others may write it. 0 and *ret_fd (the caller's), or
 * LD_EDENIED (a link, a stranger's or a writable directory) or another code, with
 * `why` saying what is wrong, to follow the directory's name. */
int declare_cache_open_dir(const char *dir, int *ret_fd, char *why, size_t why_size);
/* Closes ret's descriptor (-1 after). Accepts a cache with dirfd -1. */
void declare_cache_close(struct declare_cache *c);

#endif
