/* image_scratch — the worker threads' image scratch. See image_scratch.h. */
#include "image_scratch.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_key_t image_scratch_key;
static pthread_once_t image_scratch_once = PTHREAD_ONCE_INIT;

static void image_scratch_free(void *p)
{
    struct image_scratch *s = p;
    image_buf_close(&s->img);
    free(s->raw);
    free(s);
}

static void image_scratch_key_make(void)
{
    (void)pthread_key_create(&image_scratch_key, image_scratch_free);
}

struct image_scratch *image_scratch_get(uint64_t need)
{
    pthread_once(&image_scratch_once, image_scratch_key_make);
    struct image_scratch *s = pthread_getspecific(image_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        image_buf_init(&s->img);
        if (pthread_setspecific(image_scratch_key, s) != 0) {
            image_scratch_free(s);
            return NULL;
        }
    }
    if (need > s->raw_cap || !s->raw) {
        uint8_t *p = realloc(s->raw, need ? need : 1);
        if (!p)
            return NULL;
        s->raw = p;
        s->raw_cap = need ? need : 1;
    }
    return s;
}
