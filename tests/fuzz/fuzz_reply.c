/* fuzz_reply — libFuzzer harness for what a trainer trusts from the daemon: the client
 * library's decoding of an `open` reply (ring geometry and field layout) and of a
 * batch's slot (the ragged offsets the daemon wrote into shared memory).
 *
 * A daemon that is buggy, or an impostor that passed the identity checks, must not
 * make the trainer read outside the ring. The harness calls the library's internal
 * decoders (client_internal.h) and links libloaderclient's archive. Input: bytes 0-1 the batch size asked for, 2-3 the rows
 * of the batch, then the reply's JSON text, a NUL, and bytes that fill the ring
 * (repeated). When client_parse_open accepts the reply, every field must lie inside a
 * slot and the slots inside shm_size; then the ring is a heap block of exactly
 * shm_size bytes (ASan catches any read past it), and client_fill_batch on the first
 * and last slot must either refuse the slot or give views that lie inside it. A device
 * block (proto_device.h) that is accepted must be within the wire's limits and survive
 * an encode and decode unchanged. */
#include "client_internal.h"
#include "proto_device.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_RING (4u << 20)

static void check(int cond)
{
    if (!cond)
        abort();
}

static void check_layout(const lc_stream *s, int64_t shm_size)
{
    check(s->slot_count >= 1 && s->slot_size >= LD_RING_ALIGN);
    check(s->slot_offset + (uint64_t)s->slot_count * s->slot_size <= (uint64_t)shm_size);
    check(s->n_fields >= 1 && s->n_fields <= LD_MAX_FIELDS);
    for (int i = 0; i < s->n_fields; i++) {
        const struct client_field *f = &s->fields[i];
        check(f->offset >= sizeof(struct ld_slot_header) && f->offset % LD_FIELD_ALIGN == 0);
        if (!f->ragged) {
            check(f->offset + f->row_bytes * s->batch_size <= s->slot_size);
        } else {
            check(f->offsets_offset + ((uint64_t)s->batch_size + 1) * sizeof(int64_t) <= s->slot_size);
            check(f->offset + f->capacity <= s->slot_size);
        }
    }
}

static void check_batch(lc_stream *s, const uint8_t *ring, int slot, uint32_t rows)
{
    lc_batch b;
    memset(&b, 0, sizeof b);
    b.stream = s;
    b.slot = slot;
    b.rows = rows;
    b.base = ring + s->slot_offset + (uint64_t)slot * s->slot_size;
    char msg[LD_ERRMSG_MAX];
    if (client_fill_batch(s, &b, msg) < 0)
        return;
    const uint8_t *lo = b.base, *hi = b.base + s->slot_size;
    for (int i = 0; i < s->n_fields; i++) {
        const lc_field *v = &b.fields[i];
        const uint8_t *p = v->data;
        check(p >= lo && p <= hi && v->nbytes <= (size_t)(hi - p));
        if (v->offsets)
            check((const uint8_t *)v->offsets >= lo &&
                  (const uint8_t *)(v->offsets + rows + 1) <= hi);
        /* Read every byte of the view, as a trainer would. */
        volatile uint8_t sum = 0;
        for (size_t k = 0; k < v->nbytes; k++)
            sum += p[k];
        (void)sum;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5)
        return 0;
    uint32_t batch_size = 1 + ((uint32_t)data[0] << 8 | data[1]) % 65536;
    uint32_t rows = (uint32_t)data[2] << 8 | data[3];
    data += 4;
    size -= 4;
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *fill = nul ? nul + 1 : NULL;
    size_t fill_len = nul ? size - json_len - 1 : 0;

    char *text = malloc(json_len + 1);
    check(text != NULL);
    memcpy(text, data, json_len);
    text[json_len] = '\0';
    cJSON *reply = NULL;
    char err[LD_ERRMSG_MAX];
    if (proto_parse(text, json_len, &reply, err) < 0) {
        free(text);
        return 0;
    }
    lc_stream *s = calloc(1, sizeof *s);
    check(s != NULL);
    const char *shm = NULL;
    int64_t shm_size = 0;
    char msg[LD_ERRMSG_MAX];
    if (client_parse_open(reply, batch_size, s, &shm, &shm_size, msg) == 0) {
        check(shm != NULL && shm[0] == '/' && strchr(shm + 1, '/') == NULL);
        check_layout(s, shm_size);
        if ((uint64_t)shm_size <= FUZZ_MAX_RING) {
            uint8_t *ring = malloc((size_t)shm_size);
            check(ring != NULL);
            for (size_t k = 0; k < (size_t)shm_size; k++)
                ring[k] = fill_len ? fill[k % fill_len] : (uint8_t)k;
            uint32_t r = 1 + rows % batch_size;
            check_batch(s, ring, 0, r);
            check_batch(s, ring, (int)s->slot_count - 1, r);
            free(ring);
        }
    }
    free(s);
    /* The device block (a device stream's handles): accepted only within the wire's
     * limits, and a second decode of what was accepted gives the same bytes. */
    struct proto_device_info *dev = calloc(2, sizeof *dev);
    check(dev != NULL);
    if (proto_device_decode(reply, &dev[0], err) == 0) {
        check(dev[0].ordinal >= 0 && dev[0].ordinal <= LD_DEVICE_ORDINAL_MAX);
        check(dev[0].n_fields >= 0 && dev[0].n_fields <= LD_MAX_FIELDS);
        if (dev[0].ipc)
            check(dev[0].slot_count >= 1 && dev[0].slot_count <= LD_DEVICE_SLOT_COUNT_MAX &&
                  dev[0].slot_size % LD_DEVICE_SLOT_ALIGN == 0);
        cJSON *again = cJSON_CreateObject();
        check(again != NULL && proto_device_encode(&dev[0], again) == 0);
        check(proto_device_decode(again, &dev[1], err) == 0 && memcmp(&dev[0], &dev[1], sizeof dev[0]) == 0);
        cJSON_Delete(again);
    }
    free(dev);
    cJSON_Delete(reply);
    free(text);
    return 0;
}
