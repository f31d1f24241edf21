/* tar_group — which sample and which field each member of a WebDataset shard is.
 *
 * A member "dir/000042.seg.npy" has the key "dir/000042" (the path up to the first dot
 * of its base name) and the suffix "seg.npy" (the rest, lower-cased), as webdataset
 * groups them; a sample is a run of consecutive members of one key within a shard; a
 * member whose base name has no dot after its first character is in no sample. The
 * mapping says which suffix fills which field: `fields:` (config.h: columns of type
 * image, label, npy, bytes), else every suffix found: jpg, jpeg and png the field
 * "image" when the dataset has transforms, cls the int64 "label", npy and *.npy a
 * typed field and others bytes, each named after its suffix (the image first, the
 * label last, the others in suffix order). Works on the shards' indexes alone
 * (tar_index.h); the main thread, at open. */
#ifndef LD_TAR_GROUP_H
#define LD_TAR_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "ld_error.h"
#include "ld_wire.h"
#include "tar_index.h"

#define TAR_GROUP_MISSING UINT64_MAX    /* a tar_loc's offset: the sample has no such member */
#define TAR_GROUP_SUFFIXES_MAX 64       /* distinct suffixes a default mapping takes */

struct tar_loc {
    uint64_t offset, size;          /* the member's data in its shard */
};

struct tar_group {
    /* The mapping: the fields, and suffix -> field. */
    int n_fields;
    char field[LD_MAX_FIELDS][LD_NAME_MAX];
    int types[LD_MAX_FIELDS];       /* CONFIG_COLUMN_IMAGE, _LABEL, _NPY, _BYTES */
    char *suffix[TAR_GROUP_SUFFIXES_MAX];
    int suffix_field[TAR_GROUP_SUFFIXES_MAX];
    size_t n_suffixes;
    /* The samples: each one's shard, name ("SHARD/KEY") and fields' members. */
    uint64_t count;
    uint32_t *shard_of;
    uint64_t *name_off;             /* into names */
    char *names;
    size_t names_len, names_cap;
    struct tar_loc *locs;           /* count * n_fields; offset TAR_GROUP_MISSING: none */
    int64_t *labels;                /* count, when a field is the label (its .cls parsed) */
};

/* Makes the mapping of g (zeroed) from cfg's `fields:` and transforms, or from the
 * suffixes of the n_shards shards. LD_EDATASET with the reason (naming the dataset, and
 * the shard and offset of a member at fault) in errbuf; LD_ENOMEM. */
int tar_group_map(struct tar_group *g, const struct config_dataset *cfg, const struct tar_shard_index *shards,
                  size_t n_shards, char *errbuf);
/* Groups the shards' members into samples by the mapping. A sample that lacks a field
 * (or whose label does not parse) is refused under on_error: fail, else logged (the
 * first one, and a count) and left for the reads to report; two members of one sample
 * for one field, no sample at all, or no sample with every field are refused. */
int tar_group_samples(struct tar_group *g, const struct config_dataset *cfg, const struct tar_shard_index *shards,
                      size_t n_shards, char *errbuf);
/* Frees what g holds; accepts a zeroed one. */
void tar_group_free(struct tar_group *g);

static inline const char *tar_group_name(const struct tar_group *g, uint64_t index)
{
    return index < g->count ? g->names + g->name_off[index] : "?";
}

static inline const struct tar_loc *tar_group_loc(const struct tar_group *g, uint64_t index, int field)
{
    return &g->locs[index * (uint64_t)g->n_fields + (uint64_t)field];
}

#endif
