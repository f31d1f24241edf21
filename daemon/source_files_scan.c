/* source_files_scan — the folder walk that builds a `files` dataset's index
 * (source_files_internal.h): which files are samples, in which order, with which label.
 *
 * The walk is depth-first with an explicit stack of directories still to read, so only
 * one directory's descriptor is open at a time whatever the depth. Each directory is
 * opened beneath the dataset's root (beneath.c), its entries' types come from readdir
 * (a stat only where the file system leaves d_type unknown), and each matching regular
 * file costs one fstatat for its size; a link is followed by the rules every read
 * follows. Paths go to one string arena and entries to one array, both doubling, so a
 * million files cost two dozen reallocations, not a million allocations. The entries
 * are then sorted bytewise by path, and the labels computed as runs (see the header);
 * what is matched, skipped and followed is described at the top of source_files.c. */
#include "source_files_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "ld_error.h"
#include "ld_wire.h"
#include "log.h"

/* State of one scan; everything here is dropped or moved into the dataset at the end. */
struct files_walk {
    const struct config_dataset *cfg;
    struct beneath *root;           /* the dataset's, opened by the caller */
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

    r = beneath_open_dir(w->root, rel, &dfd);
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
                r = beneath_open(w->root, rel, BENEATH_LINK | BENEATH_PATH, &lfd, &st);
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
            struct files_entry e = {.size = (uint64_t)st.st_size};
            if (r == 0)
                r = arena_push(&w->arena, &w->arena_len, &w->arena_cap, rel, plen, &e.path);
            if (type == DT_LNK)
                e.path |= FILES_LINK_BIT;
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
    return strcmp((const char *)arena + (x->path & ~FILES_LINK_BIT), (const char *)arena + (y->path & ~FILES_LINK_BIT));
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

/* Labels as runs. The entries are sorted by path, so the files of one first-level folder
 * are contiguous (they share the prefix "name/"): each new prefix, or a change between
 * a folder's files and files in the root (label -1), starts a run. The folders are then
 * ranked by name, which is not the same order ("a-b/" sorts before "a/"). */
static int scan_labels(struct files_index *ix)
{
    struct files_class *classes = NULL;
    uint64_t *order = NULL, *rank = NULL;
    size_t n_classes = 0, cap = 0, cap_runs = 0;
    int r = 0;

    for (size_t i = 0; i < ix->count; i++) {
        const char *p = files_entry_path(ix, &ix->entries[i]);
        const char *slash = strchr(p, '/');
        int64_t group = -1;
        if (slash) {
            size_t len = (size_t)(slash - p);
            if (n_classes == 0 || classes[n_classes - 1].len != len ||
                memcmp(ix->arena + classes[n_classes - 1].off, p, len) != 0) {
                r = arena_grow((void **)&classes, &cap, n_classes + 1, sizeof *classes);
                if (r < 0)
                    goto out;
                classes[n_classes++] = (struct files_class){.off = (uint64_t)(p - ix->arena), .len = len};
            }
            group = (int64_t)(n_classes - 1);   /* group number, ranked below */
        }
        if (ix->n_runs == 0 || ix->runs[ix->n_runs - 1].label != group) {
            r = arena_grow((void **)&ix->runs, &cap_runs, ix->n_runs + 1, sizeof *ix->runs);
            if (r < 0)
                goto out;
            ix->runs[ix->n_runs++] = (struct files_label_run){.first = i, .label = group};
        }
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
        struct class_sort ctx = {.classes = classes, .arena = ix->arena};
        qsort_r(order, n_classes, sizeof *order, class_cmp, &ctx);
        for (size_t k = 0; k < n_classes; k++)
            rank[order[k]] = k;
        for (size_t k = 0; k < ix->n_runs; k++)
            if (ix->runs[k].label >= 0)
                ix->runs[k].label = (int64_t)rank[ix->runs[k].label];
    }
    ix->n_classes = n_classes;

out:
    free(classes);
    free(order);
    free(rank);
    return r;
}

int64_t source_files_label(const struct files_index *ix, uint64_t i)
{
    return ix->runs[arena_run_find(ix->runs, ix->n_runs, sizeof *ix->runs, i)].label;
}

void source_files_index_free(struct files_index *ix)
{
    free(ix->arena);
    free(ix->entries);
    free(ix->runs);
    memset(ix, 0, sizeof *ix);
}

int source_files_scan(const struct config_dataset *cfg, struct beneath *root, struct files_index *ret_index,
                      char *errbuf)
{
    struct files_walk w = {.cfg = cfg, .root = root, .errbuf = errbuf};
    struct files_index ix = {0};
    int r;

    w.match_base = strchr(cfg->pattern, '/') == NULL;
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
    free(w.dirs);
    w.dirs = NULL;

    /* The directory paths left in the arena are a few bytes per folder and not worth a
     * compaction; the arrays' unused capacity is given back. */
    ix.arena = w.arena;
    ix.entries = w.entries;
    ix.count = w.n_entries;
    w.arena = NULL;
    w.entries = NULL;
    char *a = realloc(ix.arena, w.arena_len);
    if (a)
        ix.arena = a;
    if (ix.count) {
        struct files_entry *e = realloc(ix.entries, ix.count * sizeof *ix.entries);
        if (e)
            ix.entries = e;
        qsort_r(ix.entries, ix.count, sizeof *ix.entries, entry_cmp, ix.arena);
    }
    r = scan_labels(&ix);
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", cfg->name);
        goto fail;
    }
    *ret_index = ix;
    return 0;

fail:
    source_files_index_free(&ix);
    free(w.arena);
    free(w.entries);
    free(w.dirs);
    return r;
}
