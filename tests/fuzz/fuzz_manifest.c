/* fuzz_manifest — libFuzzer harness for the CSV and JSONL manifest reader
 * (daemon/manifest.c), which reads a file a user wrote.
 *
 * Byte 0 picks the format (even: CSV, odd: JSONL); the rest is the file, written to one
 * anonymous in-memory file (memfd) that manifest_open reads as /proc/self/fd/N. A
 * manifest that loads must give every row both declared columns as NUL-terminated
 * strings and lines that never go back; one that does not must say why, with its line. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ld_error.h"
#include "manifest.h"
#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static int memfd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const cols[] = {"path", "label"};
    char err[LD_ERRMSG_MAX] = "";
    if (size < 1)
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_manifest", MFD_CLOEXEC);
        check(memfd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    check(ftruncate(memfd, 0) == 0);
    check(pwrite(memfd, data + 1, size - 1, 0) == (ssize_t)(size - 1));
    manifest *m = NULL;
    int r = manifest_open(path, data[0] & 1 ? MANIFEST_JSONL : MANIFEST_CSV, cols, 2, &m, err);
    if (r < 0) {
        check(m == NULL && err[0] != '\0');
        check(strncmp(err, path, strlen(path)) == 0);
        return 0;
    }
    check(manifest_rows(m) > 0);
    uint64_t last = 0;
    for (size_t i = 0; i < manifest_rows(m); i++) {
        check(manifest_line(m, i) > last);
        last = manifest_line(m, i);
        check(strlen(manifest_cell(m, i, 0)) <= size && strlen(manifest_cell(m, i, 1)) <= size);
    }
    manifest_free(m);
    return 0;
}
