/* fuzz_config — libFuzzer harness for the YAML config loader (daemon/config.c,
 * config_table.c, config_yaml.c).
 *
 * config_load() reads a path, so each input is written to one anonymous in-memory
 * file (memfd) that config_load opens as /proc/self/fd/N: no disk, nothing left behind.
 * A config that loads must hold what the table promises (bounds, names, a dataset
 * path, a fixed-size transform list); one that does not must say why. The loader
 * never opens a dataset or a plug-in, so nothing outside the input is touched. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "ld_error.h"
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
    if (memfd < 0) {
        memfd = memfd_create("fuzz_config.yaml", MFD_CLOEXEC);
        check(memfd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    check(ftruncate(memfd, 0) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t w = pwrite(memfd, data + off, size - off, (off_t)off);
        check(w > 0);
        off += (size_t)w;
    }

    struct config *c = NULL;
    char err[LD_ERRMSG_MAX];
    int r = config_load(path, &c, err);
    if (r < 0) {
        check(c == NULL);
        check(err[0] != '\0');
        return 0;
    }
    check(c != NULL && c->socket_path != NULL && c->workers >= 1);
    check(c->max_frame >= LD_FRAME_MIN_LIMIT && c->max_frame <= LD_FRAME_MAX_LIMIT);
    check(c->n_datasets <= CONFIG_MAX_DATASETS);
    for (size_t i = 0; i < c->n_datasets; i++) {
        const struct config_dataset *d = &c->datasets[i];
        check(d->name != NULL && d->name[0] != '\0' && strlen(d->name) < LD_NAME_MAX);
        check(d->path != NULL);
        check(d->kind >= CONFIG_DATASET_FILES && d->kind <= CONFIG_DATASET_IMAGE_FOLDER);
        check(d->n_transforms <= TRANSFORM_MAX);
        for (size_t t = 0; t < d->n_transforms; t++)
            check(transform_kind_name(d->transforms[t].kind) != NULL);
    }
    config_free(c);
    return 0;
}
