/* source_files — the `files` dataset kind: one sample per file of a directory tree.
 *
 * open() walks the configured directory once, keeps the regular files whose path
 * matches the dataset's glob, and sorts them bytewise by relative path, so a sample
 * index names the same file on every run and every machine. A sample has two fields:
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
 * the batch slot, one close(). A shortage of descriptors or memory is waited out and
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

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena.h"
#include "beneath.h"
#include "log.h"
#include "npy.h"
#include "coldread.h"

#define FIELD_DATA 0
#define FIELD_LABEL 1
/* One pread() is capped so a very large file cannot ask for more than ssize_t holds. */
#define READ_CHUNK (1u << 30)

/* 32 bytes a file; the path itself lives in the shared arena. */
struct files_entry {
    uint64_t path_off;              /* NUL-terminated relative path at arena + path_off */
    uint64_t size;                  /* bytes, as the scan saw it */
    int64_t label;
    uint32_t link;                  /* the scan found a symbolic link (to a regular file) */
};

struct files_dataset {
    struct dataset base;            /* first: a files_dataset is a dataset */
    struct beneath root;            /* every open goes through it (beneath.h) */
    char *arena;                    /* every relative path, back to back */
    struct files_entry *entries;    /* base.count of them, in sample order */
    uint64_t n_classes;
    bool npy;                       /* format: npy; then every sample's array is like npy_layout */
    struct npy_header npy_layout;
};

/* State of one scan; everything here is dropped or moved into the dataset at the end. */
struct files_walk {
    const struct config_dataset *cfg;
    struct beneath root;
    bool match_base;                /* the glob has no '/': also try the base name */
    char *arena;
    size_t arena_len, arena_cap;
    struct files_entry *entries;
    size_t n_entries, cap_entries;
    uint64_t *dirs;                 /* arena offsets of directories still to read */
    size_t n_dirs, cap_dirs;
    char *errbuf;
};

static bool walk_matches(const struct files_walk *w, const char *rel, const char *name)
{
    if (fnmatch(w->cfg->pattern, rel, FNM_PATHNAME) == 0)
        return true;
    return w->match_base && fnmatch(w->cfg->pattern, name, FNM_PATHNAME) == 0;
}

static void walk_error(struct files_walk *w, const char *what, const char *rel, int err)
{
    char ebuf[128];
    snprintf(w->errbuf, LD_ERRMSG_MAX, "dataset '%s': cannot %s '%s%s%s': %s", w->cfg->name,
             what, w->cfg->path, *rel ? "/" : "", rel, strerror_r(err, ebuf, sizeof ebuf));
}

/* Reads one directory (rel "" is the root): sub-directories go on the stack, matching
 * regular files into the entries. Only this directory's descriptor is open meanwhile,
 * so the depth of the tree never costs descriptors. */
static int walk_dir(struct files_walk *w, uint64_t dir_off)
{
    char rel[PATH_MAX];
    DIR *dir = NULL;
    int dfd, r = 0;

    /* The arena may move while we append, so work on a copy of the directory's path. */
    size_t dlen = strlen(w->arena + dir_off);
    memcpy(rel, w->arena + dir_off, dlen + 1);

    r = beneath_open_dir(&w->root, rel, &dfd);
    if (r < 0) {
        walk_error(w, "open directory", rel, -r);
        goto out;
    }
    dir = fdopendir(dfd);
    if (!dir) {
        r = ld_from_errno(errno);
        walk_error(w, "open directory", rel, errno);
        close(dfd);
        goto out;
    }

    for (;;) {
        rel[dlen] = '\0';  /* so that a message names the directory */
        errno = 0;
        struct dirent *de = readdir(dir);
        if (!de) {
            if (errno) {
                r = ld_from_errno(errno);
                walk_error(w, "read directory", rel, errno);
            }
            break;
        }
        if (de->d_name[0] == '.')
            continue;   /* ".", ".." and hidden entries: see the top of the file */

        size_t nlen = strlen(de->d_name);
        size_t plen = dlen ? dlen + 1 + nlen : nlen;
        if (plen >= sizeof rel) {
            r = LD_ENAMETOOLONG;
            walk_error(w, "use", rel, ENAMETOOLONG);
            break;
        }
        if (dlen)
            rel[dlen] = '/';
        memcpy(rel + (dlen ? dlen + 1 : 0), de->d_name, nlen + 1);

        struct stat st;
        unsigned char type = de->d_type;
        if (type == DT_UNKNOWN) {   /* some file systems do not fill d_type */
            if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (errno == ENOENT)
                    continue;      /* removed while we scan */
                r = ld_from_errno(errno);
                walk_error(w, "stat", rel, errno);
                break;
            }
            type = S_ISDIR(st.st_mode) ? DT_DIR
                 : S_ISREG(st.st_mode) ? DT_REG
                 : S_ISLNK(st.st_mode) ? DT_LNK : DT_UNKNOWN;
        }

        if (type == DT_DIR) {
            uint64_t off;
            r = arena_grow((void **)&w->dirs, &w->cap_dirs, w->n_dirs + 1, sizeof *w->dirs);
            if (r == 0)
                r = arena_push(&w->arena, &w->arena_len, &w->arena_cap, rel, plen, &off);
            if (r < 0) {
                snprintf(w->errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", w->cfg->name);
                break;
            }
            w->dirs[w->n_dirs++] = off;
        } else if (type == DT_REG || type == DT_LNK) {
            if (!walk_matches(w, rel, de->d_name))
                continue;
            if (type == DT_REG) {
                if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                    if (errno == ENOENT)
                        continue;  /* removed meanwhile */
                    r = ld_from_errno(errno);
                    walk_error(w, "stat", rel, errno);
                    break;
                }
                if (!S_ISREG(st.st_mode))
                    continue;      /* replaced meanwhile */
            } else {
                /* A link is followed to what it names, by the rules every read
                 * follows too (beneath.h); only a regular file there counts. */
                int lfd;
                r = beneath_open(&w->root, rel, BENEATH_LINK | BENEATH_PATH, &lfd, &st);
                if (r == 0) {
                    close(lfd);
                } else if (r == LD_ENOENT || r == -ELOOP || r == BENEATH_ENOTREG || r == -EISDIR || r == -ENOTDIR) {
                    r = 0;
                    continue;      /* dangling, a cycle, or not a file: not a sample */
                } else if (r == -EXDEV) {
                    char ebuf[128];
                    ld_log(LD_LOG_WARN, "dataset '%s': '%s' is not a sample: %s", w->cfg->name, rel,
                           beneath_strerror(r, ebuf, sizeof ebuf));
                    r = 0;
                    continue;
                } else {
                    walk_error(w, "follow the link", rel, -r);
                    break;
                }
            }
            r = arena_grow((void **)&w->entries, &w->cap_entries, w->n_entries + 1, sizeof *w->entries);
            struct files_entry e = {.size = (uint64_t)st.st_size, .label = -1, .link = type == DT_LNK};
            if (r == 0)
                r = arena_push(&w->arena, &w->arena_len, &w->arena_cap, rel, plen, &e.path_off);
            if (r < 0) {
                snprintf(w->errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", w->cfg->name);
                break;
            }
            w->entries[w->n_entries++] = e;
        }
    }

out:
    if (dir)
        closedir(dir);
    return r;
}

static int entry_cmp(const void *a, const void *b, void *arena)
{
    const struct files_entry *x = a, *y = b;
    return strcmp((const char *)arena + x->path_off, (const char *)arena + y->path_off);
}

/* A first-level sub-folder: its name is the first `len` bytes of a path in the arena. */
struct files_class {
    uint64_t off;
    size_t len;
};

struct class_sort {
    const struct files_class *classes;
    const char *arena;
};

static int class_cmp(const void *a, const void *b, void *ctx)
{
    const struct class_sort *s = ctx;
    const struct files_class *x = &s->classes[*(const uint64_t *)a];
    const struct files_class *y = &s->classes[*(const uint64_t *)b];
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(s->arena + x->off, s->arena + y->off, n);
    if (c)
        return c;
    return (x->len > y->len) - (x->len < y->len);   /* a prefix sorts first, as strcmp */
}

/* Gives each entry its label. Entries are sorted by path, so the files of one
 * first-level folder are contiguous (they share the prefix "name/"); the folders are
 * then ranked by name, which is not the same order ("a-b/" sorts before "a/"). */
static int assign_labels(const char *arena, struct files_entry *entries, size_t n,
                         uint64_t *ret_n_classes)
{
    struct files_class *classes = NULL;
    uint64_t *order = NULL, *rank = NULL;
    size_t n_classes = 0, cap = 0;
    int r = 0;

    for (size_t i = 0; i < n; i++) {
        const char *p = arena + entries[i].path_off;
        const char *slash = strchr(p, '/');
        if (!slash) {
            entries[i].label = -1;
            continue;
        }
        size_t len = (size_t)(slash - p);
        if (n_classes == 0 || classes[n_classes - 1].len != len ||
            memcmp(arena + classes[n_classes - 1].off, p, len) != 0) {
            r = arena_grow((void **)&classes, &cap, n_classes + 1, sizeof *classes);
            if (r < 0)
                goto out;
            classes[n_classes++] = (struct files_class){.off = entries[i].path_off, .len = len};
        }
        entries[i].label = (int64_t)(n_classes - 1);   /* group number, ranked below */
    }

    if (n_classes > 0) {
        order = malloc(n_classes * sizeof *order);
        rank = malloc(n_classes * sizeof *rank);
        if (!order || !rank) {
            r = LD_ENOMEM;
            goto out;
        }
        for (size_t k = 0; k < n_classes; k++)
            order[k] = k;
        struct class_sort ctx = {.classes = classes, .arena = arena};
        qsort_r(order, n_classes, sizeof *order, class_cmp, &ctx);
        for (size_t k = 0; k < n_classes; k++)
            rank[order[k]] = k;
        for (size_t i = 0; i < n; i++)
            if (entries[i].label >= 0)
                entries[i].label = (int64_t)rank[entries[i].label];
    }
    *ret_n_classes = n_classes;

out:
    free(classes);
    free(order);
    free(rank);
    return r;
}

static void files_free_now(void *arg)
{
    struct files_dataset *fd = arg;
    beneath_root_close(&fd->root);
    for (size_t k = 0; fd->base.class_names && k < fd->base.n_classes; k++)
        free(fd->base.class_names[k]);
    free(fd->base.class_names);
    free(fd->arena);
    free(fd->entries);
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

/* The class names by label: the first path component of any file of that class. */
static int files_class_names(struct files_dataset *fd)
{
    dataset *d = &fd->base;
    if (!fd->n_classes)
        return 0;
    d->class_names = calloc(fd->n_classes, sizeof *d->class_names);
    if (!d->class_names)
        return LD_ENOMEM;
    d->n_classes = fd->n_classes;
    for (uint64_t i = 0; i < d->count; i++) {
        int64_t label = fd->entries[i].label;
        if (label < 0 || d->class_names[label])
            continue;
        const char *p = fd->arena + fd->entries[i].path_off;
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
        const struct files_entry *e = &fd->entries[i];
        const char *rel = fd->arena + e->path_off;
        struct npy_header h;
        int f = -1, r = beneath_open(&fd->root, rel, e->link ? BENEATH_LINK : 0, &f, NULL);
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

/* Read-ahead (coldread.h) opens a sample as read() does and brings in its recorded
 * size; a file that cannot be opened is skipped there and reported by read(). */
static int files_ahead_open(const void *ctx, uint64_t index, int *ret_fd, uint64_t *ret_bytes)
{
    const struct files_dataset *fd = ctx;
    const struct files_entry *e = &fd->entries[index];
    int r = beneath_open(&fd->root, fd->arena + e->path_off, e->link ? BENEATH_LINK : 0, ret_fd, NULL);
    if (r < 0)
        return r;
    *ret_bytes = e->size;
    return 0;
}

static int files_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct files_walk w = {.cfg = cfg, .root = {.rootfd = -1}, .errbuf = errbuf};
    struct files_dataset *fd = NULL;
    const char *pattern = cfg->pattern ? cfg->pattern : "*";
    struct config_dataset c = *cfg;
    char ebuf[128];
    int r;

    c.pattern = (char *)pattern;
    w.cfg = &c;
    w.match_base = strchr(pattern, '/') == NULL;

    r = beneath_root_open(cfg->path, cfg->follow_links == CONFIG_FOLLOW_LINKS_OUTSIDE ? BENEATH_LINKS_OUTSIDE
                                                                                   : BENEATH_LINKS_INSIDE,
                          getenv("LOADERD_NO_OPENAT2") ? BENEATH_ROOT_NO_OPENAT2 : 0, &w.root);
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': cannot open directory '%s': %s",
                 cfg->name, cfg->path, strerror_r(-r, ebuf, sizeof ebuf));
        goto fail;
    }

    /* Depth-first from the root; the stack holds directories not yet read. */
    uint64_t root_off;
    r = arena_push(&w.arena, &w.arena_len, &w.arena_cap, "", 0, &root_off);
    if (r == 0)
        r = arena_grow((void **)&w.dirs, &w.cap_dirs, 1, sizeof *w.dirs);
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    w.dirs[w.n_dirs++] = root_off;
    while (w.n_dirs > 0) {
        r = walk_dir(&w, w.dirs[--w.n_dirs]);
        if (r < 0)
            goto fail;
    }

    if (w.n_entries == 0) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': no file under '%s' matches '%s'",
                 cfg->name, cfg->path, pattern);
        goto fail;
    }

    qsort_r(w.entries, w.n_entries, sizeof *w.entries, entry_cmp, w.arena);

    uint64_t n_classes = 0, max_size = 0;
    bool same = true;
    r = assign_labels(w.arena, w.entries, w.n_entries, &n_classes);
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    for (size_t i = 0; i < w.n_entries; i++) {
        if (w.entries[i].size != w.entries[0].size)
            same = false;
        if (w.entries[i].size > max_size)
            max_size = w.entries[i].size;
    }
    /* A sample of zero bytes everywhere is a layout with nothing in it: surely a
     * wrong directory or glob, better said at start than served. */
    if (max_size == 0) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX,
                 "dataset '%s': all %zu files under '%s' matching '%s' are empty", cfg->name,
                 w.n_entries, cfg->path, pattern);
        goto fail;
    }

    fd = calloc(1, sizeof *fd);
    if (!fd) {
        r = LD_ENOMEM;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    dataset *d = &fd->base;
    d->ops = &source_files_ops;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    d->count = w.n_entries;
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

    /* Hand the scan's buffers over; the directory paths left in the arena are a few
     * bytes per folder and not worth a compaction. */
    fd->root = w.root;
    fd->arena = w.arena;
    fd->entries = w.entries;
    fd->n_classes = n_classes;
    free(w.dirs);
    if (files_class_names(fd) < 0) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        files_free(d);
        return LD_ENOMEM;
    }
    if (cfg->format == CONFIG_FORMAT_NPY && (r = files_npy_layout(fd, errbuf)) < 0) {
        files_free(d);
        return r;
    }

    if (cfg->read_ahead && coldread_new(cfg->read_ahead, files_ahead_open, fd, &d->ahead) < 0) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        files_free(d);
        return LD_ENOMEM;
    }

    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " files in %" PRIu64 " classes under '%s' (%s)",
           d->name, d->count, n_classes, d->source, same ? "fixed size" : "ragged");
    *ret_dataset = d;
    return 0;

fail:
    beneath_root_close(&w.root);
    free(w.arena);
    free(w.entries);
    free(w.dirs);
    return r;
}

static uint64_t files_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct files_dataset *fd = (const struct files_dataset *)d;
    if (index >= d->count)
        return 0;
    if (field == FIELD_DATA)
        return fd->npy ? fd->npy_layout.data_bytes : fd->entries[index].size;
    if (field == FIELD_LABEL)
        return sizeof(int64_t);
    return 0;
}

/* One attempt at sample `index`: open it beneath the root, read its recorded size. */
static int files_read_once(const struct files_dataset *fd, uint64_t index, void *const dst[], char *errbuf)
{
    const struct files_entry *e = &fd->entries[index];
    const char *rel = fd->arena + e->path_off;
    uint8_t *out = dst[FIELD_DATA];
    char ebuf[128];
    int f = -1, r;

    r = beneath_open(&fd->root, rel, e->link ? BENEATH_LINK : 0, &f, NULL);
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
        memcpy(dst[FIELD_LABEL], &e->label, sizeof e->label);
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
    memcpy(dst[FIELD_LABEL], &e->label, sizeof e->label);
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
                 fd->arena + fd->entries[index].path_off, len, cap);
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
    const char *rel = fd->arena + e->path_off;
    char ebuf[128];
    XXH3_state_t *st = XXH3_createState();
    int f = -1, r = 0;

    if (!st) {
        r = LD_ENOMEM;
        ld_errorf(errbuf, "dataset '%s': out of memory", fd->base.name);
        goto out;
    }
    XXH3_64bits_reset(st);
    r = beneath_open(&fd->root, rel, e->link ? BENEATH_LINK : 0, &f, NULL);
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
        const struct files_entry *e = &fd->entries[i];
        const char *rel = fd->arena + e->path_off;
        struct files_fp_record rec = {.scan_size = e->size};
        struct stat sb;

        /* Follow a link the scan found, as read() does: its target is the sample. A
         * plain file that became a link since is seen as the link (and read() refuses
         * it), so the fingerprint changes. */
        if (fstatat(fd->root.rootfd, rel, &sb, e->link ? 0 : AT_SYMLINK_NOFOLLOW) < 0) {
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
    return index < d->count ? fd->arena + fd->entries[index].path_off : NULL;
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
