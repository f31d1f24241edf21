/* cache_quota — the byte budget of a directory of caches the daemon writes for
 * trainers (access.declare's cache_quota, declare_cache.h). Any thread; blocking (lists
 * and stats the directory). */
#ifndef LD_CACHE_QUOTA_H
#define LD_CACHE_QUOTA_H

#include <stdint.h>

/* Makes room for a cache of `need` bytes in directory dirfd: its regular files (caches,
 * set-aside ones, builds' temporary files) may take `quota` bytes in all, the file
 * `keep` (the one the build replaces) not counted; the oldest other caches (by
 * modification time: when they were built) are removed until the new one fits.
 * Temporary files are never removed (a build may be writing them), nor anything that
 * is not a regular file. 0, or LD_EDENIED with a message naming `shown` (the cache's
 * path) when it cannot fit. */
int cache_quota_make_room(int dirfd, const char *keep, const char *shown, uint64_t quota, uint64_t need,
                          char *errbuf);

#endif
