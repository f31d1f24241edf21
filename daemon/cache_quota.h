/* cache_quota — the byte budget of a directory of caches the daemon writes for
 * trainers (access.declare's cache_quota, declare_cache.h). Any thread; blocking (lists
 * and stats the directory). */
#ifndef LD_CACHE_QUOTA_H
#define LD_CACHE_QUOTA_H

#include <stdatomic.h>
#include <stdint.h>

/* Takes the build lock of directory dirfd (an exclusive flock on it): one build at a
 * time in a user's directory, from its quota check to its rename, so that what
 * cache_quota_make_room counts is what is on disk, and a build of a cache another
 * build just wrote finds it instead of writing it again. Waits while another holds it,
 * until *cancel becomes non-zero (LD_ECANCELED). 0 and *ret_fd (close it to unlock),
 * or a code with a message naming `shown`. */
int cache_quota_lock(int dirfd, const char *shown, const atomic_int *cancel, int *ret_fd, char *errbuf);

/* Makes room for a cache of `need` bytes in directory dirfd, whose build lock the
 * caller holds: its regular files (caches, set-aside ones) may take `quota` bytes in
 * all, the file `keep` (the one the build replaces) not counted; temporary files
 * (NAME.tmp.PID.RANDOM) are removed, whatever their pid: with the lock held no build is
 * writing one, so each is a dead builder's, even where its pid now names another
 * process; the oldest other caches (by modification time: when they were built) are
 * removed until the new one fits. Nothing that is not a regular file is touched. 0, or
 * LD_EDENIED with a message naming `shown` (the cache's path) when it cannot fit. */
int cache_quota_make_room(int dirfd, const char *keep, const char *shown, uint64_t quota, uint64_t need,
                          char *errbuf);

#endif
