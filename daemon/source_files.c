/* source_files — the `files` dataset kind: one sample per file of a directory tree.
 *
 * open() walks the configured directory once (source_files_scan.c, which builds the
 * index: 16 bytes and the relative path per sample, labels as runs), keeps the regular
 * files whose path matches the dataset's glob, and sorts them bytewise by relative path,
 * so a sample index names the same file on every run and every machine. A sample has two fields:
 * "data", the file's bytes (a fixed uint8 row when every file has the same size, a
 * ragged field otherwise), and "label", an int64 scalar: the index of the file's
 * first-level sub-folder among the sorted first-level sub-folders that hold at least
 * one matching file (torchvision's ImageFolder gives the same labels wherever it
 * accepts the tree: it refuses a class folder without a valid file), or -1 for a file
 * directly in the root.
 *
 * Matching: the glob is applied with fnmatch(3) and FNM_PATHNAME to the path relative
 * to the root ("class_003/0000042.bin"); when the glob has no '/', it is also applied
 * to the file's base name, so "*.bin" means "every .bin file at any depth" as users
 * expect, while "class_00?/0*.bin" restricts the depth. Entries whose name begins with
 * '.' are skipped, files and directories alike: hidden files, editor droppings and
 * ld-gendata's ".complete" marker are never samples. Symbolic links to regular files
 * beneath the root are samples (links leading outside only with follow_links:
 * outside); symbolic links to directories are not followed, which also rules out
 * walking in circles; FIFOs, sockets and devices are skipped.
 *
 * read() is the hot path (a worker per core, 100,000 files of 3 KiB per epoch): one
 * openat2() beneath a descriptor of the root (beneath.c: no link swapped in, nothing but
 * a regular file, never blocking on a FIFO) and an fstat(), one pread() straight into
 * the batch slot, one close(). When the files are cold, the read-ahead's I/O threads
 * read them once into buffers and read() copies from there instead (coldread.h,
 * files_ahead_same for the check that the file did not change since). A shortage of descriptors or memory is waited out and
 * retried, never blamed on the sample. The scan
 * records each file's size, which is what the batch layout relies on; a file that has
 * shrunk since is a bad sample, one that has grown is read up to its recorded size.
 * Everything read() touches is immutable after open(), so workers share it freely.
 *
 * With `format: npy` each file is a numpy .npy array (npy.c) and "data" is a typed
 * field: its dtype and shape are those of the first file in sample order whose header
 * parses (float32[3,32,32] makes batches of float32[B,3,32,32]). read() parses each
 * file's header again, so a file of another dtype or shape, or one that is not a .npy
 * file, is a bad sample like any unreadable one (on_error), and only the array's bytes
 * reach the slot and the cache.
 *
 * For the cache file (cache_build.c) the kind also offers read_raw(), the same read into
 * one buffer, and a fingerprint of the tree: per sample, in sample order, its relative
 * path, the size the scan recorded and a fresh stat's size and modification time (or,
 * in content mode, a hash of its bytes instead of the time). A file added or removed
 * changes the list at the next scan, one touched or resized changes its stat, and a
 * file that changed between the scan and the fingerprint shows as recorded size !=
 * stat size; the root's path is left out, so a moved tree keeps its cache. */
#include "dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "beneath.h"
#include "log.h"
#include "npy.h"
#include "coldread.h"
#include "source_files_internal.h"

#define FIELD_DATA 0
#define FIELD_LABEL 1
/* One pread() is capped so a very large file cannot ask for more than ssize_t holds. */
#define READ_CHUNK (1u << 30)

struct files_dataset {
    struct dataset base;            /* first: a files_dataset is a dataset */
    struct beneath root;            /* every open goes through it (beneath.h) */
    struct files_index ix;          /* the samples (source_files_internal.h) */
    bool npy;                       /* format: npy; then every sample's array is like npy_layout */
    struct npy_header npy_layout;
};

static void files_free_now(void *arg)
{
    struct files_dataset *fd = arg;
    beneath_root_close(&fd->root);
    for (size_t k = 0; fd->base.class_names && k < fd->base.n_classes; k++)
        free(fd->base.class_names[k]);
    free(fd->base.class_names);
    source_files_index_free(&fd->ix);
    free(fd);
}

/* Read-ahead uses the root and the entries: they go when its reads in flight are back,
 * which may be later than now (a read of a hung file system), without blocking here. */
static void files_free(dataset *d)
{
    struct files_dataset *fd = (struct files_dataset *)d;
    if (!fd)
        return;
    coldread_release(fd->base.ahead, files_free_now, fd);
}

/* The class names by label: the first path component of the first file of each run. */
static int files_class_names(struct files_dataset *fd)
{
    dataset *d = &fd->base;
    if (!fd->ix.n_classes)
        return 0;
    d->class_names = calloc(fd->ix.n_classes, sizeof *d->class_names);
    if (!d->class_names)
        return LD_ENOMEM;
    d->n_classes = fd->ix.n_classes;
    for (size_t k = 0; k < fd->ix.n_runs; k++) {
        int64_t label = fd->ix.runs[k].label;
        if (label < 0 || d->class_names[label])
            continue;
        const char *p = files_entry_path(&fd->ix, &fd->ix.entries[fd->ix.runs[k].first]);
        d->class_names[label] = strndup(p, strcspn(p, "/"));
        if (!d->class_names[label])
            return LD_ENOMEM;
    }
    return 0;
}

/* How many files open() tries for the layout of a `format: npy` dataset: a few bad
 * files first in sample order should not keep the others from being served. */
#define NPY_PROBE_FILES 16

/* format: npy: the "data" field takes the dtype and shape of the first file (of the
 * first NPY_PROBE_FILES) whose header parses; the ones before it are bad samples that
 * read() will report. */
static int files_npy_layout(struct files_dataset *fd, char *errbuf)
{
    dataset *d = &fd->base;
    char first[LD_ERRMSG_MAX] = "", reason[LD_ERRMSG_MAX], ebuf[128];
    int first_rc = 0;

    for (uint64_t i = 0; i < d->count && i < NPY_PROBE_FILES; i++) {
        const struct files_entry *e = &fd->ix.entries[i];
        const char *rel = files_entry_path(&fd->ix, e);
        struct npy_header h;
        int f = -1, r = beneath_open(&fd->root, rel, files_entry_link(e) ? BENEATH_LINK : 0, &f, NULL);
        if (r < 0) {
            snprintf(reason, sizeof reason, "%s", beneath_strerror(r, ebuf, sizeof ebuf));
        } else {
            r = npy_read_header(f, e->size, &h, reason);
            close(f);
        }
        if (r == 0 && h.data_bytes == 0) {
            snprintf(reason, sizeof reason, ".npy array %s holds no element", npy_describe(&h, ebuf, sizeof ebuf));
            r = LD_ESAMPLE;
        }
        if (r == 0) {
            struct dataset_field *data = &d->fields[FIELD_DATA];
            fd->npy = true;
            fd->npy_layout = h;
            data->dtype = h.dtype;
            data->ndim = h.ndim;
            memcpy(data->shape, h.shape, sizeof data->shape);
            data->ragged = false;
            data->max_item_bytes = h.data_bytes;
            ld_log(LD_LOG_DEBUG, "dataset '%s': format npy: samples are %s (from '%s')", d->name,
                   npy_describe(&h, ebuf, sizeof ebuf), rel);
            return 0;
        }
        if (!first[0]) {
            ld_errorf(first, "'%s': %s", rel, reason);
            first_rc = r;
        }
    }
    ld_errorf(errbuf, "dataset '%s': format npy: no .npy array among its first files to take the layout from; "
              "the first: %s", d->name, first);
    return first_rc == LD_ENOMEM ? LD_ENOMEM : LD_EDATASET;
}

/* Read-ahead (coldread.h) opens a sample as read() does (beneath the root, the same
 * refusals) and brings in its recorded size; a file that cannot be opened, or is
 * shorter than recorded, is skipped there and reported by read(). */
static int files_ahead_open(const void *ctx, uint64_t index, int *ret_fd, uint64_t *ret_bytes,
                            struct coldread_stamp *ret_stamp)
{
    const struct files_dataset *fd = ctx;
    const struct files_entry *e = &fd->ix.entries[index];
    struct stat st;
    int f = -1;
    int r = beneath_open(&fd->root, files_entry_path(&fd->ix, e), files_entry_link(e) ? BENEATH_LINK : 0, &f, &st);
    if (r < 0)
        return r;
    if ((uint64_t)st.st_size < e->size) {
        close(f); /* shrank since the scan: nothing to read ahead, the worker's read reports it */
        return LD_ESAMPLE;
    }
    coldread_stamp_of(&st, ret_stamp);
    *ret_fd = f;
    *ret_bytes = e->size;
    return 0;
}

/* Read once: before a worker uses the bytes the read-ahead read, the sample's path must
 * still lead to the file they came from, unchanged: the same inode (not removed, not
 * replaced by a rename or by a link: a sample that was a plain file is looked at
 * without following a link, one that was a link through it, as read() opens it), the
 * same size and the same change time (any write, truncate or link count change sets
 * it). Otherwise read() reads the file as it would without read-ahead and reports what
 * it finds. A change within the file system's timestamp granularity of the read ahead,
 * that keeps the size, is not seen, as a change during a worker's own read is not. */
static bool files_ahead_same(const void *ctx, uint64_t index, const struct coldread_stamp *then)
{
    const struct files_dataset *fd = ctx;
    const struct files_entry *e = &fd->ix.entries[index];
    struct stat st;
    struct coldread_stamp now;
    if (fstatat(fd->root.rootfd, files_entry_path(&fd->ix, e), &st, files_entry_link(e) ? 0 : AT_SYMLINK_NOFOLLOW) < 0
        || !S_ISREG(st.st_mode))
        return false;
    coldread_stamp_of(&st, &now);
    return memcmp(&now, then, sizeof now) == 0;
}

static int files_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct files_dataset *fd = NULL;
    const char *pattern = cfg->pattern ? cfg->pattern : "*";
    struct config_dataset c = *cfg;
    char ebuf[128];
    int r;

    c.pattern = (char *)pattern;
    fd = calloc(1, sizeof *fd);
    if (!fd) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    fd->root.rootfd = -1;
    dataset *d = &fd->base;
    d->ops = &source_files_ops;
    r = beneath_root_open(cfg->path, cfg->follow_links == CONFIG_FOLLOW_LINKS_OUTSIDE ? BENEATH_LINKS_OUTSIDE
                                                                                   : BENEATH_LINKS_INSIDE,
                          getenv("LOADERD_NO_OPENAT2") ? BENEATH_ROOT_NO_OPENAT2 : 0, &fd->root);
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': cannot open directory '%s': %s",
                 cfg->name, cfg->path, strerror_r(-r, ebuf, sizeof ebuf));
        goto fail;
    }
    r = source_files_scan(&c, &fd->root, &fd->ix, errbuf);
    if (r < 0)
        goto fail;
    if (fd->ix.count == 0) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': no file under '%s' matches '%s'",
                 cfg->name, cfg->path, pattern);
        goto fail;
    }

    uint64_t max_size = 0;
    bool same = true;
    for (size_t i = 0; i < fd->ix.count; i++) {
        if (fd->ix.entries[i].size != fd->ix.entries[0].size)
            same = false;
        if (fd->ix.entries[i].size > max_size)
            max_size = fd->ix.entries[i].size;
    }
    /* A sample of zero bytes everywhere is a layout with nothing in it: surely a
     * wrong directory or glob, better said at start than served. */
    if (max_size == 0) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX,
                 "dataset '%s': all %zu files under '%s' matching '%s' are empty", cfg->name,
                 fd->ix.count, cfg->path, pattern);
        goto fail;
    }

    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    d->count = fd->ix.count;
    /* openat + pread + close of a small cached file: about 3 us, the time of a 16 KiB memcpy. */
    d->sample_overhead = 16 * 1024;
    d->n_fields = 2;

    struct dataset_field *data = &d->fields[FIELD_DATA];
    snprintf(data->name, sizeof data->name, "data");
    data->dtype = LD_DTYPE_UINT8;
    data->max_item_bytes = max_size;
    if (same) {
        data->ndim = 1;
        data->shape[0] = (int64_t)max_size;
    } else {
        data->ndim = 0;
        data->ragged = true;
    }
    struct dataset_field *label = &d->fields[FIELD_LABEL];
    snprintf(label->name, sizeof label->name, "label");
    label->dtype = LD_DTYPE_INT64;
    label->ndim = 0;

    if (files_class_names(fd) < 0) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    if (cfg->format == CONFIG_FORMAT_NPY && (r = files_npy_layout(fd, errbuf)) < 0)
        goto fail;
    /* npy samples are parsed from the file (npy_read): read ahead, not once. */
    if (cfg->read_ahead && coldread_new(cfg->read_ahead, files_ahead_open, fd->npy ? NULL : files_ahead_same, fd,
                                        &d->ahead) < 0) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }

    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " files in %" PRIu64 " classes under '%s' (%s)",
           d->name, d->count, fd->ix.n_classes, d->source, same ? "fixed size" : "ragged");
    *ret_dataset = d;
    return 0;

fail:
    files_free(d);
    return r;
}

static uint64_t files_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct files_dataset *fd = (const struct files_dataset *)d;
    if (index >= d->count)
        return 0;
    if (field == FIELD_DATA)
        return fd->npy ? fd->npy_layout.data_bytes : fd->ix.entries[index].size;
    if (field == FIELD_LABEL)
        return sizeof(int64_t);
    return 0;
}

/* One attempt at sample `index`: open it beneath the root, read its recorded size. */
static int files_read_once(const struct files_dataset *fd, uint64_t index, void *const dst[], char *errbuf)
{
    const struct files_entry *e = &fd->ix.entries[index];
    const char *rel = files_entry_path(&fd->ix, e);
    int64_t label = source_files_label(&fd->ix, index);
    uint8_t *out = dst[FIELD_DATA];
    char ebuf[128];
    int f = -1, r;

    /* Cold storage: the read-ahead may have read it already (coldread_take checks that
     * the file is still the one it read). */
    if (!fd->npy && coldread_take(fd->base.ahead, index, out, e->size)) {
        memcpy(dst[FIELD_LABEL], &label, sizeof label);
        return 0;
    }
    r = beneath_open(&fd->root, rel, files_entry_link(e) ? BENEATH_LINK : 0, &f, NULL);
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "sample %" PRIu64 " (%s): %s", index, rel,
                 beneath_strerror(r, ebuf, sizeof ebuf));
        goto out;
    }
    if (fd->npy) {
        char reason[LD_ERRMSG_MAX];
        r = npy_read(f, e->size, &fd->npy_layout, out, reason);
        if (r < 0) {
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s", index, rel, reason);
            goto out;
        }
        memcpy(dst[FIELD_LABEL], &label, sizeof label);
        goto out;
    }
    uint64_t done = 0;
    while (done < e->size) {
        uint64_t left = e->size - done;
        size_t want = left < READ_CHUNK ? (size_t)left : READ_CHUNK;
        ssize_t n = coldread_pread(fd->base.ahead, f, out + done, want, (off_t)done);
        if (n < 0) {
            r = ld_from_errno(errno);
            snprintf(errbuf, LD_ERRMSG_MAX, "sample %" PRIu64 " (%s): %s", index, rel,
                     strerror_r(errno, ebuf, sizeof ebuf));
            goto out;
        }
        if (n == 0) {
            snprintf(errbuf, LD_ERRMSG_MAX,
                     "sample %" PRIu64 " (%s): expected %" PRIu64 " bytes, file has %" PRIu64,
                     index, rel, e->size, done);
            r = LD_ESAMPLE;
            goto out;
        }
        done += (uint64_t)n;
    }
    /* The slot's rows are aligned, but memcpy says so without assuming it. */
    memcpy(dst[FIELD_LABEL], &label, sizeof label);
    r = 0;

out:
    if (f >= 0)
        close(f);
    return r;
}

/* A shortage of descriptors or memory says nothing about the sample: wait and try again,
 * 1 ms doubling to 100 ms, for up to FILES_RESOURCE_WAIT_NS in all; then the read fails
 * with the resource's own code (never LD_ESAMPLE), so the sample is not held bad. */
#define FILES_RESOURCE_WAIT_NS (5ull * 1000 * 1000 * 1000)

static int files_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct files_dataset *fd = (const struct files_dataset *)d;

    if (index >= d->count) {
        snprintf(errbuf, LD_ERRMSG_MAX, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")",
                 index, d->name, d->count);
        return LD_EINVAL;
    }
    uint64_t waited = 0, delay = 1000 * 1000;
    for (;;) {
        int r = files_read_once(fd, index, dst, errbuf);
        if (r == 0)
            return 0;
        if (!dataset_resource_error(r))
            return LD_ESAMPLE;
        if (waited >= FILES_RESOURCE_WAIT_NS) /* as a code the protocol names */
            return r == -ENFILE ? LD_EMFILE : r == -ENOBUFS ? LD_ENOMEM : r;
        dataset_note_resource(d, errbuf);
        struct timespec ts = {.tv_sec = (time_t)(delay / 1000000000u), .tv_nsec = (long)(delay % 1000000000u)};
        nanosleep(&ts, NULL);
        waited += delay;
        delay = delay * 2 > 100 * 1000 * 1000 ? 100 * 1000 * 1000 : delay * 2;
    }
}

static uint64_t files_raw_bytes(const dataset *d, uint64_t index)
{
    return files_item_bytes(d, index, FIELD_DATA);
}

static int files_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap,
                          uint64_t *ret_len, int64_t *ret_label, char *errbuf)
{
    const struct files_dataset *fd = (const struct files_dataset *)d;
    int64_t label;
    void *dst[2] = {buf, &label};

    uint64_t len = files_item_bytes(d, index, FIELD_DATA);
    if (index < d->count && len > cap) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %" PRIu64
                 " bytes do not fit a buffer of %" PRIu64, index,
                 files_entry_path(&fd->ix, &fd->ix.entries[index]), len, cap);
        return LD_ERANGE;
    }
    int r = files_read(d, index, dst, errbuf);
    if (r < 0)
        return r;
    *ret_len = len;
    *ret_label = label;
    return 0;
}

/* What the fingerprint hashes per sample after its path and NUL, little-endian. A
 * file that has gone is hashed with stat_size = UINT64_MAX: the fingerprint then
 * differs from any a cache was built with, and the sample's read reports the error. */
struct files_fp_record {
    uint64_t scan_size;
    uint64_t stat_size;
    int64_t mtime_sec;              /* STAT mode; 0 in CONTENT mode */
    int64_t mtime_nsec;
    uint64_t content;               /* CONTENT mode: XXH3-64 of the bytes; 0 in STAT mode */
};
_Static_assert(sizeof(struct files_fp_record) == 40, "no padding may reach the hash");

/* XXH3-64 of a file's bytes, read in chunks through buf. */
static int files_hash_content(const struct files_dataset *fd, const struct files_entry *e, uint8_t *buf,
                              size_t cap, uint64_t *ret_hash, char *errbuf)
{
    const char *rel = files_entry_path(&fd->ix, e);
    char ebuf[128];
    XXH3_state_t *st = XXH3_createState();
    int f = -1, r = 0;

    if (!st) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", fd->base.name);
        goto out;
    }
    XXH3_64bits_reset(st);
    r = beneath_open(&fd->root, rel, files_entry_link(e) ? BENEATH_LINK : 0, &f, NULL);
    if (r < 0)
        goto out;
    for (;;) {
        ssize_t n = read(f, buf, cap);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            r = ld_from_errno(errno);
            goto out;
        }
        if (n == 0)
            break;
        XXH3_64bits_update(st, buf, (size_t)n);
    }
    *ret_hash = XXH3_64bits_digest(st);

out:
    if (r < 0 && r != LD_ENOMEM)
        ld_errorf(errbuf, "dataset '%s': cannot read '%s/%s' for its fingerprint: %s",
                  fd->base.name, fd->base.source, rel, beneath_strerror(r, ebuf, sizeof ebuf));
    if (f >= 0)
        close(f);
    XXH3_freeState(st);
    return r;
}

static int files_fingerprint(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf)
{
    const struct files_dataset *fd = (const struct files_dataset *)d;
    /* The tag names the kind, the mode and this record's layout: bump "v1" when what
     * is hashed changes, so old caches turn stale instead of matching by accident. */
    static const char tag_stat[] = "loaderd files fingerprint v1 stat";
    static const char tag_content[] = "loaderd files fingerprint v1 content";
    /* An npy dataset's cache holds the arrays, not the files: never the same cache. */
    static const char tag_npy[] = "format npy";
    const size_t buf_cap = 1u << 20;
    uint8_t *buf = NULL;
    char ebuf[128];
    int r = 0;

    if (mode != DATASET_FINGERPRINT_STAT && mode != DATASET_FINGERPRINT_CONTENT) {
        ld_errorf(errbuf, "dataset '%s': unknown fingerprint mode %d", d->name, mode);
        return LD_EINVAL;
    }
    XXH3_state_t *st = XXH3_createState();
    if (mode == DATASET_FINGERPRINT_CONTENT)
        buf = malloc(buf_cap);
    if (!st || (mode == DATASET_FINGERPRINT_CONTENT && !buf)) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
        goto out;
    }
    XXH3_64bits_reset(st);
    if (mode == DATASET_FINGERPRINT_STAT)
        XXH3_64bits_update(st, tag_stat, sizeof tag_stat);
    else
        XXH3_64bits_update(st, tag_content, sizeof tag_content);
    if (fd->npy)
        XXH3_64bits_update(st, tag_npy, sizeof tag_npy);

    for (uint64_t i = 0; i < d->count; i++) {
        const struct files_entry *e = &fd->ix.entries[i];
        const char *rel = files_entry_path(&fd->ix, e);
        struct files_fp_record rec = {.scan_size = e->size};
        struct stat sb;

        /* Follow a link the scan found, as read() does: its target is the sample. A
         * plain file that became a link since is seen as the link (and read() refuses
         * it), so the fingerprint changes. */
        if (fstatat(fd->root.rootfd, rel, &sb, files_entry_link(e) ? 0 : AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT) {
                r = ld_from_errno(errno);
                ld_errorf(errbuf, "dataset '%s': cannot stat '%s/%s': %s",
                         d->name, d->source, rel, strerror_r(errno, ebuf, sizeof ebuf));
                goto out;
            }
            rec.stat_size = UINT64_MAX;
        } else if (mode == DATASET_FINGERPRINT_STAT) {
            rec.stat_size = (uint64_t)sb.st_size;
            rec.mtime_sec = (int64_t)sb.st_mtim.tv_sec;
            rec.mtime_nsec = (int64_t)sb.st_mtim.tv_nsec;
        } else {
            rec.stat_size = (uint64_t)sb.st_size;
            r = files_hash_content(fd, e, buf, buf_cap, &rec.content, errbuf);
            if (r < 0)
                goto out;
        }
        XXH3_64bits_update(st, rel, strlen(rel) + 1);
        XXH3_64bits_update(st, &rec, sizeof rec);
    }
    uint64_t h = XXH3_64bits_digest(st);
    *ret_fingerprint = h ? h : 1;   /* 0 means "do not check" to cache_open() */

out:
    XXH3_freeState(st);
    free(buf);
    return r;
}

static const char *files_sample_name(const dataset *d, uint64_t index)
{
    const struct files_dataset *fd = (const struct files_dataset *)d;
    return index < d->count ? files_entry_path(&fd->ix, &fd->ix.entries[index]) : NULL;
}

const struct dataset_ops source_files_ops = {
    .sample_name = files_sample_name,
    .kind = "files",
    .open = files_open,
    .free = files_free,
    .item_bytes = files_item_bytes,
    .read = files_read,
    .fingerprint = files_fingerprint,
    .raw_bytes = files_raw_bytes,
    .read_raw = files_read_raw,
};
