/* image_scratch — each worker thread's scratch memory for the image pipelines: the
 * decoder's buffers (struct image_buf) and one buffer for an encoded image. It is made
 * on a thread's first image and kept for the thread's life (a thread-specific key frees
 * it when the thread exits), so that a worker allocates once, not once per sample. The
 * dataset kinds that decode images (source_images.c, source_tar.c) share it. */
#ifndef LD_IMAGE_SCRATCH_H
#define LD_IMAGE_SCRATCH_H

#include <stdint.h>

#include "image.h"

struct image_scratch {
    struct image_buf img;
    uint8_t *raw;                   /* raw_cap bytes, for one encoded image */
    uint64_t raw_cap;
};

/* The calling thread's scratch, its raw buffer holding at least `need` bytes; NULL when
 * memory runs out. Any thread; the scratch is the caller's until its next call. */
struct image_scratch *image_scratch_get(uint64_t need);

#endif
