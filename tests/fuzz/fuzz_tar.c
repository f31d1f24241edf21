/* fuzz_tar — libFuzzer harness for the tar reader (daemon/tar.c) and the shard index
 * built on it (daemon/tar_index.c), which the daemon runs on every shard of a
 * `tar_shards` dataset at open.
 *
 * Each input is a whole shard, given as a file (a memfd) of exactly its size. A walk
 * either fails with LD_EDATASET and a message that names an offset, or reports members
 * whose data lies within the file, after their header, in increasing order, with
 * non-empty names of bounded length. The index scan of the same bytes must agree with
 * the walk, and an index saved and loaded again must hold the same members. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ld_error.h"
#include "ld_wire.h"
#include "tar.h"
#include "tar_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

struct walk {
    uint64_t size, last_end, n;
};

static int member(void *ctx, const struct tar_member *m)
{
    struct walk *w = ctx;
    size_t len = strlen(m->name);
    check(len > 0 && len < TAR_NAME_MAX);
    check(m->header_offset % TAR_BLOCK == 0 && m->header_offset >= w->last_end);
    check(m->offset >= m->header_offset + TAR_BLOCK && m->offset % TAR_BLOCK == 0);
    check(m->offset <= w->size && m->size <= w->size - m->offset);
    w->last_end = m->offset + m->size;
    w->n++;
    return 0;
}

static int memfd = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[LD_ERRMSG_MAX];
    if (memfd < 0) {
        memfd = memfd_create("fuzz_tar", MFD_CLOEXEC);
        check(memfd >= 0);
    }
    check(ftruncate(memfd, 0) == 0);
    check(size == 0 || pwrite(memfd, data, size, 0) == (ssize_t)size);
    struct walk w = {.size = size};
    err[0] = '\0';
    int r = tar_walk(memfd, size, member, &w, err);
    if (r < 0) {
        check(r == LD_EDATASET || r == LD_ENOMEM);
        check(strncmp(err, "offset ", 7) == 0 || r == LD_ENOMEM);
    }
    struct tar_shard_index s = {0};
    s.name = strdup("fuzz.tar");
    check(s.name != NULL);
    s.size = size;
    int r2 = tar_index_scan(memfd, size, &s, err);
    check(r2 == r);
    if (r == 0) {
        check(s.n_entries == w.n);
        char path[64];
        snprintf(path, sizeof path, "/tmp/fuzz_tar.%d.idx", (int)getpid());
        if (tar_index_save(path, &s, 1, err) == 0) {
            struct tar_shard_index *got = NULL;
            size_t n = 0;
            check(tar_index_load(path, &got, &n, err) == 0);
            check(n == 1 && got[0].n_entries == s.n_entries);
            for (size_t i = 0; i < s.n_entries; i++) {
                check(got[0].entries[i].offset == s.entries[i].offset && got[0].entries[i].size == s.entries[i].size);
                check(strcmp(got[0].pool + got[0].entries[i].name_off, s.pool + s.entries[i].name_off) == 0);
            }
            tar_index_free(got, n);
            unlink(path);
        }
    }
    tar_shard_index_clear(&s);
    return 0;
}
