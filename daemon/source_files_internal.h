/* source_files_internal.h — private to the `files` kind (source_files.c, the dataset;
 * source_files_scan.c, the folder walk that builds its index).
 *
 * The index is what a files dataset keeps per sample for its whole life, so it is kept
 * small (bench/bench_scale.py measures it; the target is at most 64 bytes a sample):
 * a 16-byte entry (where the relative path starts in the shared string arena, a bit
 * saying the scan found a symbolic link, and the size the scan recorded) plus the path
 * itself. Labels are not stored per sample: samples are sorted by path, so the files of
 * one first-level folder are contiguous, and a short table of runs (the first sample of
 * each run and its label) gives any sample's label by binary search. */
#ifndef LD_SOURCE_FILES_INTERNAL_H
#define LD_SOURCE_FILES_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "beneath.h"
#include "config.h"

/* In files_entry.path: the scan found a symbolic link (to a regular file). */
#define FILES_LINK_BIT (UINT64_C(1) << 63)

struct files_entry {
    uint64_t path;                  /* arena offset of the NUL-terminated relative path, | FILES_LINK_BIT */
    uint64_t size;                  /* bytes, as the scan saw it */
};
_Static_assert(sizeof(struct files_entry) == 16, "the index's per-sample cost (bench_scale.py)");

/* Samples [first, next run's first) have this label. */
struct files_label_run {
    uint64_t first;
    int64_t label;
};

/* What a scan builds; owned by the dataset afterwards. */
struct files_index {
    char *arena;                    /* every relative path, back to back */
    struct files_entry *entries;    /* count of them, sorted bytewise by path */
    size_t count;
    struct files_label_run *runs;   /* n_runs >= 1 of them, by first */
    size_t n_runs;
    uint64_t n_classes;
};

/* Walks cfg->path beneath root (opened by the caller) and builds the index: regular
 * files (and links to them) matching cfg->pattern (never NULL here), sorted, labelled.
 * An empty result is not an error here. On failure errbuf names the dataset and the
 * path, and nothing is left allocated. Blocking; the daemon's start or a rescan. */
int source_files_scan(const struct config_dataset *cfg, struct beneath *root, struct files_index *ret_index,
                      char *errbuf);
/* Frees what a scan built (not the struct itself). Accepts a zeroed index. */
void source_files_index_free(struct files_index *ix);
/* The label of sample i (< ix->count): the first-level folder's rank, or -1. */
int64_t source_files_label(const struct files_index *ix, uint64_t i);

static inline const char *files_entry_path(const struct files_index *ix, const struct files_entry *e)
{
    return ix->arena + (e->path & ~FILES_LINK_BIT);
}

static inline bool files_entry_link(const struct files_entry *e)
{
    return (e->path & FILES_LINK_BIT) != 0;
}

#endif
