/* cache_report — the cache as JSON: an open cache file's header and hit counters, and
 * what a dataset's keeper is doing. The replies of `loaderctl cache info|build|verify`,
 * `status` and `datasets` are built here, so the cache (cache.c, cache_build.c) and
 * the keeper (cache_keeper.c) know nothing of JSON. */
#ifndef LD_CACHE_REPORT_H
#define LD_CACHE_REPORT_H

#include <cJSON.h>

#include "cache.h"
#include "cache_keeper.h"

/* Adds the header's fields, the file's size and the hit counters to the JSON object
 * `out`: path, version, flags, count, fingerprint (16 hex digits), kind, name, source,
 * fields [{name, dtype, shape, ragged, max_item_bytes}], label_field, build_time (ISO
 * 8601 UTC), build_time_unix, file_size, data_bytes, sample_bytes, max_sample_bytes,
 * hits, hit_bytes. LD_ENOMEM (out may then hold some of them). Any thread. */
int cache_report_file(const cache *c, cJSON *out);

/* Adds the keeper's state to `out`: {"state": "absent|checking|building|ready|stale|
 * failed|off", "path", "mode", "progress": 0..1 (while a build or verify runs),
 * "hits", "hit_bytes", "attached" (caches attached this run), "mapped" (still mapped:
 * the attached one and replaced ones still read), "error" (the last failure), and
 * "file": cache_report_file() of the attached cache when there is one}. LD_ENOMEM.
 * On the loop thread, like every keeper call. */
int cache_report_keeper(const cache_keeper *k, cJSON *out);

#endif
