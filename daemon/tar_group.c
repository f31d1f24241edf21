/* tar_group — WebDataset's rules on the members of a dataset's shards. See tar_group.h.
 *
 * Keys and suffixes are cut as webdataset's base_plus_ext does (its regular expression:
 * any directories, then at least one character that is not a dot, then a dot and the
 * rest; the suffix lower-cased), so a shard written for webdataset groups the same
 * here; a member name that does not match belongs to no sample. Nothing here reads a shard: everything comes from the index. */
#include "tar_group.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "log.h"
#include "tar.h"

static int tar_group_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void tar_group_free(struct tar_group *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_suffixes; i++)
        free(g->suffix[i]);
    free(g->shard_of);
    free(g->name_off);
    free(g->names);
    free(g->locs);
    free(g->labels);
    memset(g, 0, sizeof *g);
}

/* Splits a member name as webdataset does: the key's length and the suffix's start;
 * false when the base name has no dot after its first character. */
static bool tar_split(const char *name, size_t *ret_key_len, const char **ret_suffix)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base)
        return false;
    *ret_key_len = (size_t)(dot - name);
    *ret_suffix = dot + 1;
    return true;
}

static bool tar_is_image(const char *sfx)
{
    return !strcmp(sfx, "jpg") || !strcmp(sfx, "jpeg") || !strcmp(sfx, "png");
}

static bool tar_is_npy(const char *sfx)
{
    size_t n = strlen(sfx);
    return !strcmp(sfx, "npy") || (n > 4 && !strcmp(sfx + n - 4, ".npy"));
}

/* The lower-cased suffix into buf (LD_NAME_MAX); false when too long. */
static bool tar_suffix(const char *sfx, char *buf)
{
    size_t n = strlen(sfx);
    if (n == 0 || n >= LD_NAME_MAX)
        return false;
    for (size_t i = 0; i <= n; i++)
        buf[i] = sfx[i] >= 'A' && sfx[i] <= 'Z' ? (char)(sfx[i] - 'A' + 'a') : sfx[i];
    return true;
}

static int tar_find_suffix(const struct tar_group *g, const char *sfx)
{
    for (size_t i = 0; i < g->n_suffixes; i++)
        if (strcmp(g->suffix[i], sfx) == 0)
            return (int)i;
    return -1;
}

static int tar_add_field(struct tar_group *g, const char *name, int type)
{
    snprintf(g->field[g->n_fields], sizeof g->field[g->n_fields], "%s", name);
    g->types[g->n_fields] = type;
    return g->n_fields++;
}

int tar_group_map(struct tar_group *g, const struct config_dataset *cfg, const struct tar_shard_index *shards,
                  size_t n_shards, char *errbuf)
{
    bool images = cfg->n_transforms > 0;
    if (cfg->n_columns) {
        int image_field = -1;
        for (size_t i = 0; i < cfg->n_columns; i++) {
            int type = cfg->columns[i].type, f;
            if (type == CONFIG_COLUMN_IMAGE && !images) {
                ld_errorf(errbuf, "dataset '%s': fields.%s is an image: give the dataset `transforms:` (at least "
                          "one, e.g. '- resize: {size: 224}'), or make it bytes", cfg->name, cfg->columns[i].name);
                return LD_EDATASET;
            }
            if (type == CONFIG_COLUMN_IMAGE && image_field >= 0)
                f = image_field;
            else
                f = tar_add_field(g, type == CONFIG_COLUMN_IMAGE ? "image" : type == CONFIG_COLUMN_LABEL
                                  ? "label" : cfg->columns[i].name, type);
            if (type == CONFIG_COLUMN_IMAGE)
                image_field = f;
            if (!(g->suffix[g->n_suffixes] = strdup(cfg->columns[i].name)))
                goto oom;
            g->suffix_field[g->n_suffixes++] = f;
        }
        if (images && image_field < 0) {
            ld_errorf(errbuf, "dataset '%s': `transforms:` is given but no suffix in `fields:` is an image",
                      cfg->name);
            return LD_EDATASET;
        }
        return 0;
    }
    /* Every suffix of every member, sorted. */
    char *found[TAR_GROUP_SUFFIXES_MAX], sfx[LD_NAME_MAX];
    size_t n = 0;
    for (size_t s = 0; s < n_shards; s++) {
        const struct tar_shard_index *ix = &shards[s];
        for (size_t k = 0; k < ix->n_entries; k++) {
            size_t kl;
            const char *raw;
            if (!tar_split(ix->pool + ix->entries[k].name_off, &kl, &raw) || !tar_suffix(raw, sfx))
                continue;
            size_t j = 0;
            while (j < n && strcmp(found[j], sfx) != 0)
                j++;
            if (j < n)
                continue;
            if (n == TAR_GROUP_SUFFIXES_MAX) {
                ld_errorf(errbuf, "dataset '%s': the shards' members have more than %d suffixes (shard '%s', "
                          "offset %" PRIu64 ": '%s'): say which are fields with `fields:`", cfg->name,
                          TAR_GROUP_SUFFIXES_MAX, ix->name, ix->entries[k].offset - TAR_BLOCK,
                          ix->pool + ix->entries[k].name_off);
                for (size_t i = 0; i < n; i++)
                    free(found[i]);
                return LD_EDATASET;
            }
            if (!(found[n] = strdup(sfx))) {
                for (size_t i = 0; i < n; i++)
                    free(found[i]);
                goto oom;
            }
            n++;
        }
    }
    qsort(found, n, sizeof *found, tar_group_cmp);
    /* The image first, then the other fields in suffix order, the label last: a
     * dataset of an image (or bytes) and a label can be cached. */
    int image_field = -1, label_suffix = -1, r = 0;
    for (size_t i = 0; i < n; i++)
        if (images && tar_is_image(found[i]) && image_field < 0)
            image_field = tar_add_field(g, "image", CONFIG_COLUMN_IMAGE);
    for (size_t i = 0; i < n; i++) {
        bool image = images && tar_is_image(found[i]), label = !strcmp(found[i], "cls");
        if (label)
            label_suffix = (int)i;
        if (image || label)
            continue;
        if (g->n_fields == LD_MAX_FIELDS) {
            ld_errorf(errbuf, "dataset '%s': the shards' members have more than %d suffixes that would be "
                      "fields: say which are with `fields:`", cfg->name, LD_MAX_FIELDS);
            r = LD_EDATASET;
            goto done;
        }
        int f = tar_add_field(g, found[i], tar_is_npy(found[i]) ? CONFIG_COLUMN_NPY : CONFIG_COLUMN_BYTES);
        g->suffix[g->n_suffixes] = found[i];
        g->suffix_field[g->n_suffixes++] = f;
        found[i] = NULL;
    }
    if (label_suffix >= 0) {
        if (g->n_fields == LD_MAX_FIELDS) {
            ld_errorf(errbuf, "dataset '%s': too many fields: say which are with `fields:`", cfg->name);
            r = LD_EDATASET;
            goto done;
        }
        int f = tar_add_field(g, "label", CONFIG_COLUMN_LABEL);
        g->suffix[g->n_suffixes] = found[label_suffix];
        g->suffix_field[g->n_suffixes++] = f;
        found[label_suffix] = NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (found[i] && images && tar_is_image(found[i])) {
            g->suffix[g->n_suffixes] = found[i];
            g->suffix_field[g->n_suffixes++] = image_field;
            found[i] = NULL;
        }
    if (images && image_field < 0) {
        ld_errorf(errbuf, "dataset '%s': `transforms:` is given but no member is a .jpg, .jpeg or .png image",
                  cfg->name);
        r = LD_EDATASET;
    } else if (g->n_fields == 0) {
        ld_errorf(errbuf, "dataset '%s': the shards hold no member named KEY.SUFFIX", cfg->name);
        r = LD_EDATASET;
    }
done:
    for (size_t i = 0; i < n; i++)
        free(found[i]);
    return r;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
    return LD_ENOMEM;
}

/* A .cls member's integer (ASCII, surrounding white space allowed). */
static bool tar_parse_label(const struct tar_shard_index *ix, const struct tar_entry *e, int64_t *ret)
{
    char buf[TAR_INDEX_INLINE + 1];
    if (e->data_off == TAR_INDEX_NONE || e->size == 0)
        return false;
    memcpy(buf, ix->pool + e->data_off, (size_t)e->size);
    buf[e->size] = '\0';
    char *p = buf, *end;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')
        end++;
    if (*end)
        return false;
    *ret = v;
    return true;
}

int tar_group_samples(struct tar_group *g, const struct config_dataset *cfg, const struct tar_shard_index *shards,
                      size_t n_shards, char *errbuf)
{
    int nf = g->n_fields, lf = -1;
    uint64_t count = 0, bad = 0;
    char sfx[LD_NAME_MAX];
    size_t cap_shard = 0, cap_name = 0, cap_label = 0;
    size_t cap_locs = 0;
    for (int f = 0; f < nf; f++)
        if (g->types[f] == CONFIG_COLUMN_LABEL)
            lf = f;
    for (size_t s = 0; s < n_shards; s++) {
        const struct tar_shard_index *ix = &shards[s];
        const char *key = NULL;
        size_t key_len = 0;
        for (size_t k = 0; k < ix->n_entries; k++) {
            const struct tar_entry *e = &ix->entries[k];
            const char *name = ix->pool + e->name_off, *raw;
            size_t kl;
            if (!tar_split(name, &kl, &raw) || !tar_suffix(raw, sfx))
                continue;
            int si = tar_find_suffix(g, sfx);
            if (!key || kl != key_len || memcmp(key, name, kl) != 0) {
                /* A new sample. */
                key = name;
                key_len = kl;
                if (arena_grow((void **)&g->shard_of, &cap_shard, count + 1, sizeof *g->shard_of) < 0 ||
                    arena_grow((void **)&g->name_off, &cap_name, count + 1, sizeof *g->name_off) < 0 ||
                    arena_grow((void **)&g->locs, &cap_locs, (count + 1) * (uint64_t)nf, sizeof *g->locs) < 0 ||
                    (lf >= 0 && arena_grow((void **)&g->labels, &cap_label, count + 1, sizeof *g->labels) < 0))
                    goto oom;
                char nm[TAR_NAME_MAX + 256];
                int w = snprintf(nm, sizeof nm, "%s/%.*s", ix->name, (int)kl, name);
                if (w < 0 || arena_push(&g->names, &g->names_len, &g->names_cap, nm,
                                        (size_t)w < sizeof nm ? (size_t)w : sizeof nm - 1, &g->name_off[count]) < 0)
                    goto oom;
                g->shard_of[count] = (uint32_t)s;
                for (int f = 0; f < nf; f++)
                    g->locs[count * (uint64_t)nf + (uint64_t)f] = (struct tar_loc){TAR_GROUP_MISSING, 0};
                if (lf >= 0)
                    g->labels[count] = -1;
                count++;
            }
            if (si < 0)
                continue;
            int f = g->suffix_field[si];
            struct tar_loc *loc = &g->locs[(count - 1) * (uint64_t)nf + (uint64_t)f];
            if (loc->offset != TAR_GROUP_MISSING) {
                ld_errorf(errbuf, "dataset '%s': shard '%s', offset %" PRIu64 ": a second member '%s' for field '%s' "
                          "of sample '%.*s'", cfg->name, ix->name, e->offset - TAR_BLOCK, name, g->field[f],
                          (int)kl, name);
                return LD_EDATASET;
            }
            if (g->types[f] == CONFIG_COLUMN_LABEL) {
                int64_t v;
                if (!tar_parse_label(ix, e, &v))
                    continue; /* stays missing: a bad sample */
                g->labels[count - 1] = v;
            }
            *loc = (struct tar_loc){e->offset, e->size};
        }
    }
    g->count = count;
    if (count == 0) {
        ld_errorf(errbuf, "dataset '%s': the shards hold no sample (no member named KEY.SUFFIX)", cfg->name);
        return LD_EDATASET;
    }
    /* Samples without a field (or whose label did not parse) are bad. */
    for (uint64_t i = 0; i < count; i++) {
        for (int f = 0; f < nf; f++) {
            if (tar_group_loc(g, i, f)->offset != TAR_GROUP_MISSING)
                continue;
            const char *why = g->types[f] == CONFIG_COLUMN_LABEL ? "no label member, or one that is not an integer"
                                                                 : "no member for it";
            if (cfg->on_error == CONFIG_ON_ERROR_FAIL) {
                ld_errorf(errbuf, "dataset '%s': sample '%s': field '%s': %s (on_error: fail)", cfg->name,
                          tar_group_name(g, i), g->field[f], why);
                return LD_EDATASET;
            }
            if (bad++ == 0)
                ld_log(LD_LOG_WARN, "dataset '%s': sample '%s': field '%s': %s; the sample is replaced (on_error: "
                       "replace)", cfg->name, tar_group_name(g, i), g->field[f], why);
            break;
        }
    }
    if (bad == count) {
        ld_errorf(errbuf, "dataset '%s': no sample of the %" PRIu64 " has every field (the first: '%s')", cfg->name,
                  count, tar_group_name(g, 0));
        return LD_EDATASET;
    }
    if (bad > 1)
        ld_log(LD_LOG_WARN, "dataset '%s': %" PRIu64 " of %" PRIu64 " samples lack a field", cfg->name, bad, count);
    return 0;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
    return LD_ENOMEM;
}
