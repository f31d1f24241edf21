/* source_s3 — the `files` kind over an object store: one sample per object under an
 * s3://BUCKET/PREFIX location.
 *
 * open() lists the prefix (s3_list: ListObjectsV2, page after page; the prefix is a
 * folder: "s3://b/train" means the keys under "train/") and keeps what a folder would give: the key relative to the prefix is the sample's path, the glob and
 * the rule that a component beginning with '.' is hidden apply to it, samples are in
 * bytewise path order and labelled by their first-level "folder" (as source_files.c), so
 * the same tree gives the same samples, order and labels whether it lies on a disk or
 * in a bucket. Keys ending in '/' (folder markers) and empty objects are not samples.
 *
 * read() is one ranged GET of the object's listed size straight into the batch slot
 * (several in parallel when the object is larger than s3.part_size); workers read
 * different samples at once, sharing the client's connections. read_raw(), which the
 * cache build calls in sample order from one thread, reads ahead: a window of up to
 * s3.parallel objects (64 MiB at most) is fetched together, so the first pass into the
 * node-local cache is not one round trip per sample. After that the packed cache
 * serves later epochs and later runs locally (cache.h), and the store is only listed
 * again for the fingerprint: per object its key, size and ETag (and in stat mode its
 * LastModified), so an object added, removed or rewritten makes the cache stale. A
 * listing proves the fingerprint for s3.list_ttl seconds: a check within that time of
 * the last listing (the one at open included) reuses its digest instead of listing a
 * prefix of a million objects again for each rank that opens a stream; the first check
 * after it lists again and sees any change.
 *
 * With `format: npy` each object is a .npy array and "data" a typed field with the dtype
 * and shape of the first object (of the first S3_NPY_PROBE) whose header parses, read at
 * open with one ranged GET of its head; a read gets the whole object and checks its
 * header against that layout as a local file's is checked (npy.h), the cache holding the
 * arrays.
 *
 * A missing object (deleted since the listing), or one shorter than listed, is a bad
 * sample (on_error); a store that refuses the credentials or cannot be reached after
 * the retries fails the read with LD_EDATASET, which is never blamed on a sample. */
#include "dataset.h"

#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "arena.h"
#include "log.h"
#include "npy.h"
#include "s3.h"

#define FIELD_DATA 0
#define FIELD_LABEL 1
/* The read-ahead window of read_raw: at most this many bytes at once. */
#define S3_READAHEAD_BYTES (64u << 20)
#define S3_FULL_KEY_MAX 1100
/* format: npy: how many objects open() tries for the layout (as source_files.c). */
#define S3_NPY_PROBE 16
/* The listing's digests: without LastModified (content mode), with it (stat mode). */
#define S3_DIGEST_CONTENT 0
#define S3_DIGEST_STAT 1

/* One object: its relative key in the arena, its listed size, its label. */
struct files_entry {
    uint64_t path_off;
    uint64_t size;
    int64_t label;
};

/* The rules of the files kind (source_files.c) over relative keys: the glob on the whole
 * path, and on the base name when it has no '/'; bytewise order; the label is the rank of
 * the first-level folder among those that hold a sample, -1 at the top. */
static bool s3_match(const char *pattern, const char *rel)
{
    if (fnmatch(pattern, rel, FNM_PATHNAME) == 0)
        return true;
    const char *name = strrchr(rel, '/');
    return !strchr(pattern, '/') && name && fnmatch(pattern, name + 1, FNM_PATHNAME) == 0;
}

static int s3_entry_cmp(const void *a, const void *b, void *arena)
{
    const struct files_entry *x = a, *y = b;
    return strcmp((const char *)arena + x->path_off, (const char *)arena + y->path_off);
}

static int s3_str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Labels and class names (d->class_names) of the sorted entries. */
static int s3_labels(dataset *d, const char *arena, struct files_entry *entries, size_t n)
{
    char **names = NULL;
    size_t n_names = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = arena + entries[i].path_off, *slash = strchr(p, '/');
        if (!slash)
            continue;
        size_t len = (size_t)(slash - p);
        if (n_names && strlen(names[n_names - 1]) == len && memcmp(names[n_names - 1], p, len) == 0)
            continue;
        char **g = realloc(names, (n_names + 1) * sizeof *names);
        if (!g)
            goto nomem;
        names = g;
        if (!(names[n_names] = strndup(p, len)))
            goto nomem;
        n_names++;
    }
    /* Entries are sorted by path, so a folder's entries are contiguous; its rank among the
     * folder names is another order ("a-b/" sorts before "a/"). */
    if (n_names)
        qsort(names, n_names, sizeof *names, s3_str_cmp);
    for (size_t i = 0; i < n; i++) {
        const char *p = arena + entries[i].path_off, *slash = strchr(p, '/');
        entries[i].label = -1;
        if (!slash)
            continue;
        size_t lo = 0, hi = n_names, len = (size_t)(slash - p);
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            int c = strncmp(names[mid], p, len);
            if (c == 0 && names[mid][len])
                c = 1;
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        entries[i].label = (int64_t)lo;
    }
    d->class_names = names;
    d->n_classes = n_names;
    return 0;
nomem:
    for (size_t k = 0; k < n_names; k++)
        free(names[k]);
    free(names);
    return LD_ENOMEM;
}

static void s3_fields(dataset *d, const struct files_entry *entries, size_t n)
{
    uint64_t max_size = 0;
    bool same = true;
    for (size_t i = 0; i < n; i++) {
        same &= entries[i].size == entries[0].size;
        max_size = entries[i].size > max_size ? entries[i].size : max_size;
    }
    d->n_fields = 2;
    struct dataset_field *data = &d->fields[FIELD_DATA];
    snprintf(data->name, sizeof data->name, "data");
    data->dtype = LD_DTYPE_UINT8;
    data->max_item_bytes = max_size;
    data->ragged = !same;
    data->ndim = same ? 1 : 0;
    data->shape[0] = same ? (int64_t)max_size : 0;
    struct dataset_field *label = &d->fields[FIELD_LABEL];
    snprintf(label->name, sizeof label->name, "label");
    label->dtype = LD_DTYPE_INT64;
}

struct s3_dataset {
    struct dataset base;            /* first: an s3_dataset is a dataset */
    s3_client *client;
    char bucket[64];
    char *prefix;
    size_t prefix_len;
    char *pattern;
    char *arena;                    /* relative keys */
    struct files_entry *entries;    /* base.count, in sample order */
    uint32_t parallel;
    /* read_raw's window: samples [ra_first, ra_first + ra_count) in ra_buf at ra_off[k],
     * or their error. One reader at a time (the cache build). */
    pthread_mutex_t ra_lock;
    uint64_t ra_first, ra_count;
    uint8_t *ra_buf;
    uint64_t *ra_off;
    struct s3_get *ra_gets;
    char (*ra_err)[LD_ERRMSG_MAX];
    uint64_t entries_digest;        /* the samples as laid out at open: keys and sizes */
    /* The last listing's digests and when it was taken (CLOCK_MONOTONIC), under fp_lock. */
    pthread_mutex_t fp_lock;
    uint64_t listed_digest[2];
    uint64_t listed_at_ns;
    bool listed;
    uint64_t list_ttl_ns;
    bool npy;                       /* format: npy; every sample's array is like npy_layout */
    struct npy_header npy_layout;
};

/* What a listing collects: the matching objects, before they are sorted. */
struct s3_scan {
    const char *prefix;
    size_t prefix_len;
    const char *pattern;
    char *arena;
    size_t arena_len, arena_cap;
    struct files_entry *entries;
    size_t n, cap;
    uint64_t skipped_empty;
    XXH3_state_t *hash[2];          /* the digests of the listing (S3_DIGEST_*) */
    bool keep;                      /* collect the entries (open) */
};

/* The relative key of an object that is a sample, or NULL. */
static const char *s3_scan_rel(const struct s3_scan *s, const char *key)
{
    const char *rel = key + s->prefix_len;
    size_t len = strlen(rel);
    if (len == 0 || rel[len - 1] == '/')
        return NULL;                /* the prefix itself, or a folder marker */
    if (rel[0] == '.' || strstr(rel, "/."))
        return NULL;                /* hidden, as in a folder */
    if (!s3_match(s->pattern, rel))
        return NULL;
    return rel;
}

static int s3_scan_object(void *ctx, const char *key, uint64_t size, const char *etag, const char *mod)
{
    struct s3_scan *s = ctx;
    if (strncmp(key, s->prefix, s->prefix_len) != 0)
        return 0;                   /* not under the prefix: the store answered more than asked */
    const char *rel = s3_scan_rel(s, key);
    if (!rel)
        return 0;
    if (size == 0) {
        s->skipped_empty++;
        return 0;
    }
    for (int k = 0; k < 2; k++) {
        XXH3_64bits_update(s->hash[k], rel, strlen(rel) + 1);
        XXH3_64bits_update(s->hash[k], &size, sizeof size);
        XXH3_64bits_update(s->hash[k], etag, strlen(etag) + 1);
        if (k == S3_DIGEST_STAT)
            XXH3_64bits_update(s->hash[k], mod, strlen(mod) + 1);
    }
    if (!s->keep)
        return 0;
    struct files_entry e = {.size = size, .label = -1};
    if (arena_grow((void **)&s->entries, &s->cap, s->n + 1, sizeof *s->entries) < 0 ||
        arena_push(&s->arena, &s->arena_len, &s->arena_cap, rel, strlen(rel), &e.path_off) < 0)
        return LD_ENOMEM;
    s->entries[s->n++] = e;
    return 0;
}

static int s3_scan_hash_new(struct s3_scan *s)
{
    for (int k = 0; k < 2; k++) {
        if (!(s->hash[k] = XXH3_createState()))
            return LD_ENOMEM;
        XXH3_64bits_reset(s->hash[k]);
    }
    return 0;
}

static void s3_scan_hash_free(struct s3_scan *s)
{
    for (int k = 0; k < 2; k++) {
        XXH3_freeState(s->hash[k]);
        s->hash[k] = NULL;
    }
}

static uint64_t s3_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Records a complete listing's digests as the last one. Under fp_lock, or before the
 * dataset is shared (open). */
static void s3_listed(struct s3_dataset *sd, struct s3_scan *s)
{
    for (int k = 0; k < 2; k++)
        sd->listed_digest[k] = XXH3_64bits_digest(s->hash[k]);
    sd->listed_at_ns = s3_now_ns();
    sd->listed = true;
}

/* The list the samples were laid out by: a listing that differs from it now (an object
 * resized since open) must not match the cache built from the old one. */
static int s3_entries_digest(struct s3_dataset *sd)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return LD_ENOMEM;
    XXH3_64bits_reset(st);
    for (uint64_t i = 0; i < sd->base.count; i++) {
        const char *rel = sd->arena + sd->entries[i].path_off;
        XXH3_64bits_update(st, rel, strlen(rel) + 1);
        XXH3_64bits_update(st, &sd->entries[i].size, sizeof sd->entries[i].size);
    }
    sd->entries_digest = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return 0;
}

/* The array of the .npy object whose bytes are buf[0..len), checked against the layout
 * as npy_read checks a file, copied into dst. LD_ESAMPLE with the reason. */
static int s3_npy_data(const struct npy_header *layout, const uint8_t *buf, uint64_t len, void *dst, char *reason)
{
    struct npy_header h;
    uint64_t total;
    int r = npy_header_length(buf, (size_t)len, &total, reason);
    if (r < 0)
        return LD_ESAMPLE;
    if (total > len) {
        ld_errorf(reason, ".npy object has %" PRIu64 " bytes, its header claims %" PRIu64, len, total);
        return LD_ESAMPLE;
    }
    if (npy_parse(buf, (size_t)total, &h, reason) < 0)
        return LD_ESAMPLE;
    if (npy_check(&h, layout, len, "object", reason) < 0)
        return LD_ESAMPLE;
    memcpy(dst, buf + h.data_offset, (size_t)h.data_bytes);
    return 0;
}

static void s3_full_key(const struct s3_dataset *sd, uint64_t index, char *key);

/* format: npy: the layout from the head of the first objects (see the top). */
static int s3_npy_layout(struct s3_dataset *sd, char *errbuf)
{
    dataset *d = &sd->base;
    char first[LD_ERRMSG_MAX] = "", reason[LD_ERRMSG_MAX], key[S3_FULL_KEY_MAX], ebuf[128];
    int first_rc = 0;
    uint8_t *head = malloc(NPY_PREFIX_MAX + NPY_HEADER_MAX);
    if (!head) {
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
        return LD_ENOMEM;
    }
    for (uint64_t i = 0; i < d->count && i < S3_NPY_PROBE; i++) {
        uint64_t want = sd->entries[i].size, total = 0;
        struct npy_header h;
        if (want > NPY_PREFIX_MAX + NPY_HEADER_MAX)
            want = NPY_PREFIX_MAX + NPY_HEADER_MAX;
        s3_full_key(sd, i, key);
        struct s3_get g = {.key = key, .len = want, .dst = head, .errmsg = reason};
        int r = s3_get_many(sd->client, &g, 1);
        if (r == 0 && (r = npy_header_length(head, (size_t)want, &total, reason)) == 0) {
            if (total > want) {
                ld_errorf(reason, ".npy object has %" PRIu64 " bytes, its header claims %" PRIu64, want, total);
                r = LD_ESAMPLE;
            } else if ((r = npy_parse(head, (size_t)total, &h, reason)) == 0 && h.data_bytes == 0) {
                ld_errorf(reason, ".npy array %s holds no element", npy_describe(&h, ebuf, sizeof ebuf));
                r = LD_ESAMPLE;
            }
        }
        if (r == 0) {
            struct dataset_field *data = &d->fields[FIELD_DATA];
            sd->npy = true;
            sd->npy_layout = h;
            data->dtype = h.dtype;
            data->ndim = h.ndim;
            memcpy(data->shape, h.shape, sizeof data->shape);
            data->ragged = false;
            data->max_item_bytes = h.data_bytes;
            free(head);
            return 0;
        }
        if (r == LD_EDATASET || r == LD_ENOMEM) {   /* the store, not the object */
            ld_errorf(errbuf, "dataset '%s': format npy: %s", d->name, reason);
            free(head);
            return r;
        }
        if (!first[0]) {
            ld_errorf(first, "'%s': %s", sd->arena + sd->entries[i].path_off, reason);
            first_rc = r;
        }
    }
    free(head);
    ld_errorf(errbuf, "dataset '%s': format npy: no .npy array among its first objects to take the layout from; "
              "the first: %s", d->name, first);
    return first_rc == LD_ENOMEM ? LD_ENOMEM : LD_EDATASET;
}

static void s3_free(dataset *d)
{
    struct s3_dataset *sd = (struct s3_dataset *)d;
    if (!sd)
        return;
    s3_client_free(sd->client);
    for (size_t k = 0; d->class_names && k < d->n_classes; k++)
        free(d->class_names[k]);
    free(d->class_names);
    pthread_mutex_destroy(&sd->ra_lock);
    pthread_mutex_destroy(&sd->fp_lock);
    free(sd->ra_buf);
    free(sd->ra_off);
    free(sd->ra_gets);
    free(sd->ra_err);
    free(sd->prefix);
    free(sd->pattern);
    free(sd->arena);
    free(sd->entries);
    free(sd);
}

void source_s3_options(const struct config_dataset *cfg, struct s3_options *ret_opt)
{
    *ret_opt = (struct s3_options){
        .endpoint = cfg->s3_endpoint, .region = cfg->s3_region, .addressing = cfg->s3_addressing,
        .profile = cfg->s3_profile, .credentials_file = cfg->s3_credentials_file, .part_size = cfg->s3_part_size,
        .parallel = cfg->s3_parallel, .retries = cfg->s3_retries, .timeout_s = cfg->s3_timeout,
        .connect_timeout_s = cfg->s3_connect_timeout,
    };
}

static int s3_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct s3_scan scan = {.pattern = cfg->pattern ? cfg->pattern : "*", .keep = true};
    struct s3_dataset *sd = calloc(1, sizeof *sd);
    char what[LD_NAME_MAX + 16];
    const char *prefix;
    int r;

    if (!sd) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    pthread_mutex_init(&sd->ra_lock, NULL);
    pthread_mutex_init(&sd->fp_lock, NULL);
    dataset *d = &sd->base;
    d->ops = &source_s3_ops;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    snprintf(what, sizeof what, "dataset '%s'", cfg->name);
    if ((r = s3_url_split(cfg->path, sd->bucket, sizeof sd->bucket, &prefix, errbuf)) < 0)
        goto fail;
    /* The prefix names a folder: "s3://b/train" holds train/x, never trainee/x. */
    size_t plen = strlen(prefix);
    if (asprintf(&sd->prefix, "%s%s", prefix, plen && prefix[plen - 1] != '/' ? "/" : "") < 0)
        sd->prefix = NULL;
    if (!sd->prefix || !(sd->pattern = strdup(scan.pattern))) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    sd->prefix_len = strlen(sd->prefix);
    scan.prefix = sd->prefix;
    scan.prefix_len = sd->prefix_len;
    sd->parallel = cfg->s3_parallel ? cfg->s3_parallel : 16;
    sd->list_ttl_ns = (uint64_t)cfg->s3_list_ttl * 1000000000u;
    if (s3_scan_hash_new(&scan) < 0) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    struct s3_options opt;
    source_s3_options(cfg, &opt);
    if ((r = s3_client_new(what, sd->bucket, &opt, &sd->client, errbuf)) < 0)
        goto fail;

    char err[LD_ERRMSG_MAX];
    r = s3_list(sd->client, sd->prefix, s3_scan_object, &scan, err);
    if (r < 0) {
        if (r == LD_ENOMEM)
            ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        else
            ld_errorf(errbuf, "dataset '%s': %s", cfg->name, err);
        r = r == LD_ENOMEM ? LD_ENOMEM : LD_EDATASET;
        goto fail;
    }
    if (scan.n == 0) {
        r = LD_EDATASET;
        ld_errorf(errbuf, "dataset '%s': no object under %s matches '%s'%s", cfg->name, cfg->path, scan.pattern,
                  scan.skipped_empty ? " (only empty ones)" : "");
        goto fail;
    }
    qsort_r(scan.entries, scan.n, sizeof *scan.entries, s3_entry_cmp, scan.arena);
    s3_listed(sd, &scan);
    sd->arena = scan.arena;
    sd->entries = scan.entries;
    scan.arena = NULL;
    scan.entries = NULL;
    d->count = scan.n;
    /* A GET is a round trip: about what a 1 MiB memcpy takes, at the least. */
    d->sample_overhead = 1u << 20;
    s3_fields(d, sd->entries, d->count);
    if ((r = s3_entries_digest(sd)) < 0 || (r = s3_labels(d, sd->arena, sd->entries, d->count)) < 0) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    if (cfg->format == CONFIG_FORMAT_NPY && (r = s3_npy_layout(sd, errbuf)) < 0)
        goto fail;
    s3_scan_hash_free(&scan);
    ld_log(LD_LOG_INFO, "dataset '%s': %" PRIu64 " objects in %" PRIu64 " classes under %s at %s (%s)%s", d->name,
           d->count, (uint64_t)d->n_classes, cfg->path, s3_client_describe(sd->client),
           d->fields[FIELD_DATA].ragged ? "ragged" : "fixed size",
           cfg->cache_path ? "" : "; no cache: every epoch reads the store");
    *ret_dataset = d;
    return 0;

fail:
    s3_scan_hash_free(&scan);
    free(scan.arena);
    free(scan.entries);
    s3_free(d);
    return r;
}

static uint64_t s3_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct s3_dataset *sd = (const struct s3_dataset *)d;
    if (index >= d->count)
        return 0;
    if (field == FIELD_DATA)
        return sd->npy ? sd->npy_layout.data_bytes : sd->entries[index].size;
    return field == FIELD_LABEL ? sizeof(int64_t) : 0;
}

static const char *s3_sample_name(const dataset *d, uint64_t index)
{
    const struct s3_dataset *sd = (const struct s3_dataset *)d;
    return index < d->count ? sd->arena + sd->entries[index].path_off : NULL;
}

/* prefix + relative key: the object's key. */
static void s3_full_key(const struct s3_dataset *sd, uint64_t index, char *key)
{
    snprintf(key, S3_FULL_KEY_MAX, "%s%s", sd->prefix, sd->arena + sd->entries[index].path_off);
}

/* "sample N (rel): <the client's message>" for a failed read. */
static int s3_sample_error(const struct s3_dataset *sd, uint64_t index, int rc, const char *msg, char *errbuf)
{
    ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s", index, s3_sample_name(&sd->base, index), msg);
    return rc;
}

static int s3_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct s3_dataset *sd = (const struct s3_dataset *)d;
    char key[S3_FULL_KEY_MAX], msg[LD_ERRMSG_MAX] = "";
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")", index, d->name, d->count);
        return LD_EINVAL;
    }
    s3_full_key(sd, index, key);
    uint64_t size = sd->entries[index].size;
    uint8_t *obj = sd->npy ? malloc(size) : NULL;
    if (sd->npy && !obj) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): out of memory", index, s3_sample_name(d, index));
        return LD_ENOMEM;
    }
    struct s3_get g = {.key = key, .len = size, .dst = sd->npy ? obj : dst[FIELD_DATA], .errmsg = msg};
    int rc = s3_get_many(sd->client, &g, 1);
    if (rc == 0 && sd->npy)
        rc = s3_npy_data(&sd->npy_layout, obj, size, dst[FIELD_DATA], msg);
    free(obj);
    if (rc < 0)
        return s3_sample_error(sd, index, rc, msg, errbuf);
    memcpy(dst[FIELD_LABEL], &sd->entries[index].label, sizeof(int64_t));
    return 0;
}

static uint64_t s3_raw_bytes(const dataset *d, uint64_t index)
{
    return s3_item_bytes(d, index, FIELD_DATA);
}

/* Fetches the window that starts at `first`: up to `parallel` samples, at most
 * S3_READAHEAD_BYTES (always at least the first). Under ra_lock. */
static int s3_readahead(struct s3_dataset *sd, uint64_t first)
{
    uint64_t n = 0, bytes = 0;
    while (first + n < sd->base.count && n < sd->parallel &&
           (n == 0 || bytes + sd->entries[first + n].size <= S3_READAHEAD_BYTES))
        bytes += sd->entries[first + n++].size;
    if (!sd->ra_gets) {
        sd->ra_gets = calloc(sd->parallel, sizeof *sd->ra_gets);
        sd->ra_off = calloc(sd->parallel, sizeof *sd->ra_off);
        sd->ra_err = calloc(sd->parallel, sizeof *sd->ra_err);
        if (!sd->ra_gets || !sd->ra_off || !sd->ra_err)
            return LD_ENOMEM;
    }
    free(sd->ra_buf);
    sd->ra_count = 0;
    if (!(sd->ra_buf = malloc(bytes)))
        return LD_ENOMEM;
    char (*keys)[S3_FULL_KEY_MAX] = malloc(n * sizeof *keys);
    if (!keys)
        return LD_ENOMEM;
    uint64_t off = 0;
    for (uint64_t k = 0; k < n; k++) {
        s3_full_key(sd, first + k, keys[k]);
        sd->ra_off[k] = off;
        sd->ra_err[k][0] = '\0';
        sd->ra_gets[k] = (struct s3_get){.key = keys[k], .len = sd->entries[first + k].size,
                                         .dst = sd->ra_buf + off, .errmsg = sd->ra_err[k]};
        off += sd->entries[first + k].size;
    }
    s3_get_many(sd->client, sd->ra_gets, n);    /* each read's outcome is in its rc */
    for (uint64_t k = 0; k < n; k++)
        sd->ra_gets[k].key = NULL;
    free(keys);
    sd->ra_first = first;
    sd->ra_count = n;
    return 0;
}

static int s3_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                       int64_t *ret_label, char *errbuf)
{
    struct s3_dataset *sd = (struct s3_dataset *)d;
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")", index, d->name, d->count);
        return LD_EINVAL;
    }
    uint64_t len = s3_item_bytes(d, index, FIELD_DATA);
    if (len > cap) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %" PRIu64 " bytes do not fit a buffer of %" PRIu64, index,
                  s3_sample_name(d, index), len, cap);
        return LD_ERANGE;
    }
    pthread_mutex_lock(&sd->ra_lock);
    int rc = 0;
    if (index < sd->ra_first || index >= sd->ra_first + sd->ra_count)
        rc = s3_readahead(sd, index);
    if (rc < 0) {
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
    } else {
        uint64_t k = index - sd->ra_first;
        rc = sd->ra_gets[k].rc;
        if (rc == 0 && sd->npy)
            rc = s3_npy_data(&sd->npy_layout, sd->ra_buf + sd->ra_off[k], sd->entries[index].size, buf, sd->ra_err[k]);
        else if (rc == 0)
            memcpy(buf, sd->ra_buf + sd->ra_off[k], len);
        if (rc < 0)
            s3_sample_error(sd, index, rc, sd->ra_err[k], errbuf);
    }
    /* The last sample of the dataset: the window is not needed any more. */
    if (index + 1 == d->count) {
        free(sd->ra_buf);
        sd->ra_buf = NULL;
        sd->ra_count = 0;
    }
    pthread_mutex_unlock(&sd->ra_lock);
    if (rc < 0)
        return rc;
    *ret_len = len;
    *ret_label = sd->entries[index].label;
    return 0;
}

static int s3_fingerprint(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf)
{
    struct s3_dataset *sd = (struct s3_dataset *)d;
    /* Bump "v2" when what is hashed changes. */
    static const char tag[] = "loaderd s3 fingerprint v2";
    struct s3_scan scan = {.prefix = sd->prefix, .prefix_len = sd->prefix_len, .pattern = sd->pattern};
    char err[LD_ERRMSG_MAX];
    int r = 0;

    if (mode != DATASET_FINGERPRINT_STAT && mode != DATASET_FINGERPRINT_CONTENT) {
        ld_errorf(errbuf, "dataset '%s': unknown fingerprint mode %d", d->name, mode);
        return LD_EINVAL;
    }
    pthread_mutex_lock(&sd->fp_lock);
    if (!sd->listed || sd->list_ttl_ns == 0 || s3_now_ns() - sd->listed_at_ns >= sd->list_ttl_ns) {
        if (s3_scan_hash_new(&scan) < 0) {
            ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
            r = LD_ENOMEM;
        } else if ((r = s3_list(sd->client, sd->prefix, s3_scan_object, &scan, err)) < 0) {
            ld_errorf(errbuf, "dataset '%s': fingerprint: %s", d->name, err);
        } else {
            s3_listed(sd, &scan);
        }
        s3_scan_hash_free(&scan);
    }
    /* An npy dataset's cache holds the arrays, not the objects: never the same cache. */
    uint64_t rec[3] = {sd->entries_digest, sd->listed_digest[mode == DATASET_FINGERPRINT_STAT ? S3_DIGEST_STAT
                                                                                               : S3_DIGEST_CONTENT],
                       sd->npy};
    pthread_mutex_unlock(&sd->fp_lock);
    if (r < 0)
        return r;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
        return LD_ENOMEM;
    }
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, tag, sizeof tag);
    XXH3_64bits_update(st, rec, sizeof rec);
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    *ret_fingerprint = h ? h : 1;
    return 0;
}

const struct dataset_ops source_s3_ops = {
    .kind = "files",
    .open = s3_open,
    .free = s3_free,
    .item_bytes = s3_item_bytes,
    .read = s3_read,
    .sample_name = s3_sample_name,
    .fingerprint = s3_fingerprint,
    .raw_bytes = s3_raw_bytes,
    .read_raw = s3_read_raw,
};
