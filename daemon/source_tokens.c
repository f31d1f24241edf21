/* source_tokens — the `token_windows` dataset kind: windows of a flat token file.
 *
 * Language-model pre-training reads its corpus as one long array of token ids
 * (uint16 or uint32, native byte order, as nanoGPT's and Megatron's .bin files are).
 * A sample is a window of context+1 tokens (the model's input and, shifted by one,
 * its target); window i starts at token i * stride, and there are
 * (ntokens - (context + 1)) / stride + 1 of them, so the last partial window is
 * dropped rather than padded. One field, "tokens", of shape [context + 1].
 *
 * open() maps the whole file read-only and shared, so every stream and every worker
 * reads the same page-cache pages and read() is a single memcpy into the batch slot.
 * Replacing the file by rename is safe, since the mapping keeps the old inode alive.
 * A file truncated or overwritten in place with a shorter one would raise SIGBUS on
 * the next read past its new end: the copy runs under mapguard, so that read fails
 * with LD_EDATASET (the stream that read it ends with a clear error) and the daemon
 * and every other stream go on. */
#include "dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "mapguard.h"

struct tokens_dataset {
    struct dataset base;            /* first: a tokens_dataset is a dataset */
    const uint8_t *map;
    size_t map_len;
    uint64_t ntokens;
    uint64_t stride_bytes;          /* between window starts */
    uint64_t window_bytes;          /* (context + 1) * token size */
};

/* Windows are visited in a shuffled order, which the kernel's read-around (it fetches
 * a large block around every faulting page, expecting sequential access) turns into
 * wasted I/O on a file that does not fit in memory: there MADV_RANDOM makes each fault
 * read only what it needs. A file that fits comfortably (a quarter of RAM) is better
 * read in whole and early with MADV_WILLNEED, so the first epoch runs from the page
 * cache instead of faulting page by page. Advice is a hint: failure is not an error. */
static void advise(void *map, size_t len)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    char ebuf[128];
    if (madvise(map, len, len <= ram / 4 ? MADV_WILLNEED : MADV_RANDOM) < 0)
        ld_log(LD_LOG_DEBUG, "madvise: %s", strerror_r(errno, ebuf, sizeof ebuf));
}

static void tokens_free(dataset *d)
{
    struct tokens_dataset *td = (struct tokens_dataset *)d;
    if (!td)
        return;
    if (td->map)
        munmap((void *)td->map, td->map_len);
    free(td);
}

static int tokens_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct tokens_dataset *td = NULL;
    void *map = NULL;
    size_t tsize = 0;
    char ebuf[128];
    struct stat st;
    uint64_t bytes = 0;
    int f = -1, r;

    const char *tname = cfg->token_dtype == LD_DTYPE_UINT16 ? "uint16"
                      : cfg->token_dtype == LD_DTYPE_UINT32 ? "uint32" : NULL;
    if (!tname) {
        r = LD_EINVAL;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': token dtype must be uint16 or uint32",
                 cfg->name);
        goto out;
    }
    tsize = cfg->token_dtype == LD_DTYPE_UINT16 ? 2 : 4;
    if (cfg->context == 0) {
        r = LD_EINVAL;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': context must be at least 1", cfg->name);
        goto out;
    }
    /* The config fills stride with context when it is not given; 0 means the same. */
    uint64_t stride = cfg->stride ? cfg->stride : cfg->context;
    uint64_t window = (uint64_t)cfg->context + 1;

    f = open(cfg->path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (f < 0 || fstat(f, &st) < 0) {
        int e = errno;
        r = ld_from_errno(e);
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': cannot open '%s': %s", cfg->name,
                 cfg->path, strerror_r(e, ebuf, sizeof ebuf));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': '%s' is not a regular file", cfg->name,
                 cfg->path);
        goto out;
    }
    bytes = (uint64_t)st.st_size;
    if (bytes == 0) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': '%s' is empty", cfg->name, cfg->path);
        goto out;
    }
    if (bytes % tsize != 0) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX,
                 "dataset '%s': '%s' is %" PRIu64 " bytes, not a multiple of %zu (%s tokens)",
                 cfg->name, cfg->path, bytes, tsize, tname);
        goto out;
    }
    uint64_t ntokens = bytes / tsize;
    if (ntokens < window) {
        r = LD_EDATASET;
        snprintf(errbuf, LD_ERRMSG_MAX,
                 "dataset '%s': '%s' has %" PRIu64 " %s tokens, fewer than context + 1 = %" PRIu64,
                 cfg->name, cfg->path, ntokens, tname, window);
        goto out;
    }
    if ((size_t)bytes != bytes) {   /* a 32-bit address space */
        r = LD_EFBIG;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': '%s' is too large to map", cfg->name,
                 cfg->path);
        goto out;
    }

    r = mapguard_init();
    if (r < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': cannot install the SIGBUS guard", cfg->name);
        goto out;
    }
    map = mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, f, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        map = NULL;
        r = ld_from_errno(e);
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': cannot map '%s': %s", cfg->name,
                 cfg->path, strerror_r(e, ebuf, sizeof ebuf));
        goto out;
    }
    advise(map, (size_t)bytes);

    td = calloc(1, sizeof *td);
    if (!td) {
        r = LD_ENOMEM;
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': out of memory", cfg->name);
        goto out;
    }
    dataset *d = &td->base;
    d->ops = &source_tokens_ops;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    d->count = (ntokens - window) / stride + 1;
    d->n_fields = 1;
    struct dataset_field *fld = &d->fields[0];
    snprintf(fld->name, sizeof fld->name, "tokens");
    fld->dtype = cfg->token_dtype;
    fld->ndim = 1;
    fld->shape[0] = (int64_t)window;
    fld->max_item_bytes = window * tsize;

    td->map = map;
    td->map_len = (size_t)bytes;
    td->ntokens = ntokens;
    td->stride_bytes = stride * tsize;
    td->window_bytes = window * tsize;
    map = NULL;
    r = 0;
    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " %s tokens, %" PRIu64 " windows of %" PRIu64,
           d->name, ntokens, tname, d->count, window);
    *ret_dataset = d;

out:
    if (map)
        munmap(map, (size_t)bytes);
    if (f >= 0)
        close(f);   /* the mapping holds its own reference to the file */
    return r;
}

static uint64_t tokens_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct tokens_dataset *td = (const struct tokens_dataset *)d;
    return index < d->count && field == 0 ? td->window_bytes : 0;
}

static int tokens_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct tokens_dataset *td = (const struct tokens_dataset *)d;
    if (index >= d->count) {
        snprintf(errbuf, LD_ERRMSG_MAX, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")",
                 index, d->name, d->count);
        return LD_EINVAL;
    }
    if (mapguard_copy(dst[0], td->map + index * td->stride_bytes, td->window_bytes) < 0) {
        ld_errorf(errbuf, "dataset '%s': '%s' shrank while being served (it had %" PRIu64
                 " bytes at start; window %" PRIu64 " is gone); restart loaderd once the file is whole "
                 "again, and replace token files by rename, not in place",
                 d->name, d->source, (uint64_t)td->map_len, index);
        return LD_EDATASET;
    }
    return 0;
}

/* Windows are picked at random over the file: each is a few dozen lines the copy would
 * otherwise wait for a few at a time. Every line the window touches is asked for (a
 * window need not start on a line). A prefetch never faults, even past the end of a
 * file cut short. */
static void tokens_prefetch(const dataset *d, const uint64_t *idx, size_t n)
{
    const struct tokens_dataset *td = (const struct tokens_dataset *)d;
    uint64_t bytes = td->window_bytes < DATASET_PREFETCH_BYTES ? td->window_bytes : DATASET_PREFETCH_BYTES;
    for (size_t k = 0; k < n; k++) {
        if (idx[k] >= d->count)
            continue;
        uintptr_t from = (uintptr_t)(td->map + idx[k] * td->stride_bytes);
        for (uintptr_t line = from & ~(uintptr_t)63; line < from + bytes; line += 64)
            __builtin_prefetch((const void *)line);
    }
}

const struct dataset_ops source_tokens_ops = {
    .kind = "token_windows",
    .open = tokens_open,
    .free = tokens_free,
    .item_bytes = tokens_item_bytes,
    .read = tokens_read,
    .prefetch = tokens_prefetch,
};
