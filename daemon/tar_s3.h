/* tar_s3 — the shards of a `tar_shards` dataset at an s3://BUCKET/PREFIX location, copied
 * whole into a folder on this node, where source_tar.c indexes and reads them as it does
 * local shards.
 *
 * A shard is read whole once: one pass of parallel ranged GETs straight into its local
 * copy, which is then indexed from the page cache (tar_index.h). Walking the headers with
 * ranged GETs instead would cost a round trip per member; reading a shard to index it and
 * again to serve or cache it would cost two passes over the network. The copies are the
 * node-local data of later epochs and later runs: each open lists the prefix again and
 * fetches only the shards that are new or whose size or ETag changed since they were
 * copied (what was copied is recorded in the folder's `.listing`), and removes the copies
 * of shards that left the store. */
#ifndef LD_TAR_S3_H
#define LD_TAR_S3_H

#include <stddef.h>

#include "config.h"

/* The folder that holds the copies of cfg's shards: "<index>.shards" when the dataset
 * names an index file, else "<cache.path>.shards"; NULL when it names neither (the
 * config refuses that) or out of memory. The caller frees it. */
char *tar_s3_local_dir(const struct config_dataset *cfg);

/* Lists the shards under cfg->path (the objects directly under the prefix whose name
 * matches cfg->pattern, not hidden), brings their copies in `local` (created if absent)
 * up to date, and returns their names, sorted (*ret_names, *ret_n; the caller frees each
 * and the array). Blocking: it downloads. LD_EDATASET with the reason in errbuf (naming
 * the dataset and s3://bucket/key) when the store refuses or cannot be reached, when no
 * shard matches, or when a copy cannot be written; LD_ENOMEM. */
int tar_s3_fetch(const struct config_dataset *cfg, const char *local, char ***ret_names, size_t *ret_n,
                 char *errbuf);

#endif
