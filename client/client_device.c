/* client_device — the GPU side of libloaderclient, and the one client file that
 * includes cuda_runtime.h. A stream opened with a device gets, once, what it needs to
 * hand out device pointers per batch:
 *
 *   transfer "ipc"     the daemon copies each batch into its device ring; this file
 *                      opens the ring's memory and each slot's two events from the
 *                      handles of the open reply (cudaIpcOpen*Handle, once per stream).
 *                      lc_batch_device_wait makes the trainer's CUDA stream wait on the
 *                      slot's "ready" event (no host synchronisation); lc_batch_release
 *                      records the slot's "done" event on that stream, which the
 *                      daemon's copy stream waits on before it writes the slot again.
 *   transfer "client"  where IPC is not available (another container, MIG, another
 *                      device): the read-only host mapping is pinned here and
 *                      lc_batch_device_wait issues the copy on the trainer's stream
 *                      into a device ring this process owns.
 *
 * The runtime is linked statically, so the library loads on a host without a driver;
 * opening a device stream there fails with the reason. In a build without CUDA every
 * device call says so. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_device.h"
#include "client_internal.h"
#include "proto_device.h"

#if LD_HAVE_CUDA
#include <cuda_runtime.h>

_Static_assert(sizeof(cudaIpcMemHandle_t) == LD_IPC_HANDLE_SIZE, "cudaIpcMemHandle_t travels as ld_ipc_handle");
_Static_assert(sizeof(cudaIpcEventHandle_t) == LD_IPC_HANDLE_SIZE, "cudaIpcEventHandle_t travels as ld_ipc_handle");

struct client_device {
    int ordinal;
    bool ipc;
    uint8_t *dev;                 /* the device ring: imported (ipc) or our own (client) */
    uint64_t dev_slot_size;
    uint32_t slot_count;
    bool registered;              /* client: the host mapping is pinned */
    cudaEvent_t *ready;           /* ipc: imported; client: recorded after our copy */
    cudaEvent_t *done;            /* ipc: imported; client: ours, recorded at release */
    int n_fields;
    struct proto_device_field fields[LD_MAX_FIELDS]; /* fields laid out differently on the device */
};

/* Logs nothing (library code): the message says which call failed and why. */
#define CUDA_TRY(call, what)                                                                            \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                        \
            (void)cudaGetLastError();                                                                   \
            snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: %s: %s (%s)", d->ordinal, what,              \
                     cudaGetErrorString(e_), cudaGetErrorName(e_));                                     \
            ret = LC_EDEVICE;                                                                           \
            goto fail;                                                                                  \
        }                                                                                               \
    } while (0)

/* Why this process cannot use GPU `ordinal`, or 0. */
static int client_device_check(int ordinal, char *msg)
{
    int drv = 0, n = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0) {
        (void)cudaGetLastError();
        snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: no NVIDIA driver in this process (libcuda.so.1 cannot be "
                 "loaded, or /dev/nvidia* is not visible here)", ordinal);
        return LC_EDEVICE;
    }
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || drv < CUDART_VERSION) {
        (void)cudaGetLastError();
        snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: the NVIDIA driver is too old: it supports CUDA %d.%d, "
                 "libloaderclient was built with CUDA %d.%d", ordinal, drv / 1000, drv % 1000 / 10,
                 CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        return LC_EDEVICE;
    }
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: no CUDA device is visible to this process (%s)", ordinal,
                 e == cudaSuccess ? "none found" : cudaGetErrorString(e));
        return LC_EDEVICE;
    }
    if (ordinal >= n) {
        snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: no device %d: this process sees %d CUDA device%s", ordinal,
                 ordinal, n, n == 1 ? "" : "s");
        return LC_EDEVICE;
    }
    return 0;
}

void client_device_close(lc_stream *s)
{
    struct client_device *d = s->dev;
    if (!d)
        return;
    s->dev = NULL;
    cudaSetDevice(d->ordinal);
    /* Work this process queued on the ring (kernels still reading a batch) ends first. */
    cudaDeviceSynchronize();
    for (uint32_t i = 0; i < d->slot_count; i++) {
        if (d->ready && d->ready[i])
            cudaEventDestroy(d->ready[i]);
        if (d->done && d->done[i])
            cudaEventDestroy(d->done[i]);
    }
    if (d->dev)
        d->ipc ? cudaIpcCloseMemHandle(d->dev) : cudaFree(d->dev);
    if (d->registered)
        cudaHostUnregister((void *)s->map);
    (void)cudaGetLastError();
    free(d->ready);
    free(d->done);
    free(d);
}

int client_device_open(lc_stream *s, const cJSON *reply, int asked_ordinal, char *msg)
{
    struct proto_device_info *info = calloc(1, sizeof *info);
    struct client_device *d = calloc(1, sizeof *d);
    int ret;
    if (!info || !d) {
        free(info);
        free(d);
        snprintf(msg, LD_ERRMSG_MAX, "out of memory");
        return LC_ENOMEM;
    }
    d->ordinal = asked_ordinal;
    ret = proto_device_decode(reply, info, msg);
    if (ret == 1) {
        snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: the open reply has no device block (an older loaderd?)",
                 asked_ordinal);
        ret = LC_EPROTO;
        goto fail;
    }
    if (ret < 0) {
        ret = LC_EPROTO;
        goto fail;
    }
    if (info->ordinal != asked_ordinal) {
        snprintf(msg, LD_ERRMSG_MAX, "device: the daemon answered for %s, asked for cuda:%d", info->name, asked_ordinal);
        ret = LC_EPROTO;
        goto fail;
    }
    if ((ret = client_device_check(asked_ordinal, msg)) < 0)
        goto fail;
    d->ipc = info->ipc;
    d->slot_count = s->slot_count;
    d->ready = calloc(d->slot_count, sizeof *d->ready);
    d->done = calloc(d->slot_count, sizeof *d->done);
    if (!d->ready || !d->done) {
        ret = LC_ENOMEM;
        snprintf(msg, LD_ERRMSG_MAX, "out of memory");
        goto fail;
    }
    CUDA_TRY(cudaSetDevice(d->ordinal), "cudaSetDevice");
    if (d->ipc) {
        if (info->slot_count != s->slot_count) {
            snprintf(msg, LD_ERRMSG_MAX, "device: %u device slots for %u host slots", info->slot_count, s->slot_count);
            ret = LC_EPROTO;
            goto fail;
        }
        d->dev_slot_size = info->slot_size;
        cudaIpcMemHandle_t mh;
        memcpy(&mh, &info->memory, sizeof mh);
        CUDA_TRY(cudaIpcOpenMemHandle((void **)&d->dev, mh, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle (the daemon's device ring; use transfer \"client\" where IPC is not "
                 "possible: another container, MIG, another device)");
        for (uint32_t i = 0; i < d->slot_count; i++) {
            cudaIpcEventHandle_t eh;
            memcpy(&eh, &info->ready[i], sizeof eh);
            CUDA_TRY(cudaIpcOpenEventHandle(&d->ready[i], eh), "cudaIpcOpenEventHandle (ready)");
            memcpy(&eh, &info->done[i], sizeof eh);
            CUDA_TRY(cudaIpcOpenEventHandle(&d->done[i], eh), "cudaIpcOpenEventHandle (done)");
        }
        d->n_fields = info->n_fields;
        memcpy(d->fields, info->fields, sizeof d->fields);
    } else {
        /* Our own copy: the mapping is read-only, so it is pinned read-only. */
        CUDA_TRY(cudaHostRegister((void *)s->map, s->map_size, cudaHostRegisterReadOnly),
                 "cudaHostRegister of the read-only ring");
        d->registered = true;
        d->dev_slot_size = (s->slot_size + LD_DEVICE_SLOT_ALIGN - 1) / LD_DEVICE_SLOT_ALIGN * LD_DEVICE_SLOT_ALIGN;
        CUDA_TRY(cudaMalloc((void **)&d->dev, d->dev_slot_size * d->slot_count), "cudaMalloc of the device ring");
        for (uint32_t i = 0; i < d->slot_count; i++) {
            CUDA_TRY(cudaEventCreateWithFlags(&d->ready[i], cudaEventDisableTiming), "cudaEventCreate");
            CUDA_TRY(cudaEventCreateWithFlags(&d->done[i], cudaEventDisableTiming), "cudaEventCreate");
        }
    }
    free(info);
    s->dev = d;
    return 0;

fail:
    free(info);
    s->dev = d;
    client_device_close(s);
    return ret;
}

static const struct proto_device_field *client_device_layout(const struct client_device *d, const char *name)
{
    for (int i = 0; i < d->n_fields; i++)
        if (strcmp(d->fields[i].name, name) == 0)
            return &d->fields[i];
    return NULL;
}

int client_device_field(const lc_batch *b, int i, lc_device_field *ret, char *msg)
{
    const lc_stream *s = b->stream;
    const struct client_device *d = s->dev;
    const struct client_field *f = &s->fields[i];
    const lc_field *host = &b->fields[i];
    uint8_t *slot = d->dev + (uint64_t)b->slot * d->dev_slot_size;
    lc_device_field v;
    memset(&v, 0, sizeof v);
    v.name = f->name;
    v.device = d->ordinal;
    const struct proto_device_field *df = client_device_layout(d, f->name);
    if (df) {
        v.dtype = df->dtype;
        v.ndim = 1 + df->ndim;
        v.shape[0] = b->rows;
        for (int k = 0; k < df->ndim; k++)
            v.shape[1 + k] = df->shape[k];
        v.data = slot + df->offset;
        v.nbytes = (size_t)(b->rows * df->row_bytes);
    } else {
        v.dtype = host->dtype;
        v.ndim = host->ndim;
        memcpy(v.shape, host->shape, sizeof v.shape);
        v.data = slot + f->offset;
        v.nbytes = host->nbytes;
        if (f->ragged)
            v.offsets = (const int64_t *)(const void *)(slot + f->offsets_offset);
    }
    *ret = v;
    return 0;
}

int client_device_wait(lc_batch *b, void *cuda_stream, char *msg)
{
    lc_stream *s = b->stream;
    struct client_device *d = s->dev;
    cudaStream_t st = (cudaStream_t)cuda_stream;
    int ret = 0;
    CUDA_TRY(cudaSetDevice(d->ordinal), "cudaSetDevice");
    if (d->ipc) {
        CUDA_TRY(cudaStreamWaitEvent(st, d->ready[b->slot], 0), "cudaStreamWaitEvent on the batch's ready event");
    } else if (!b->dev_waited) {
        /* The previous batch of this device slot is done (recorded at its release). */
        CUDA_TRY(cudaStreamWaitEvent(st, d->done[b->slot], 0), "cudaStreamWaitEvent on the slot's done event");
        uint64_t used = 0;
        for (int i = 0; i < s->n_fields; i++) {
            const lc_field *h = &b->fields[i];
            uint64_t end = (uint64_t)((const uint8_t *)h->data - b->base) + h->nbytes;
            if (end > used)
                used = end;
        }
        CUDA_TRY(cudaMemcpyAsync(d->dev + (uint64_t)b->slot * d->dev_slot_size, b->base, used,
                                 cudaMemcpyHostToDevice, st),
                 "cudaMemcpyAsync of the batch");
        CUDA_TRY(cudaEventRecord(d->ready[b->slot], st), "cudaEventRecord");
    } else {
        CUDA_TRY(cudaStreamWaitEvent(st, d->ready[b->slot], 0), "cudaStreamWaitEvent on the batch's copy");
    }
    b->dev_stream = cuda_stream;
    b->dev_waited = true;
    return 0;
fail:
    return ret;
}

int client_device_release(lc_batch *b, char *msg)
{
    lc_stream *s = b->stream;
    struct client_device *d = s->dev;
    int ret = 0;
    CUDA_TRY(cudaSetDevice(d->ordinal), "cudaSetDevice");
    /* Whatever the trainer queued on its stream reading this slot comes before the
     * daemon's next copy into it (ipc) or our next copy (client). */
    CUDA_TRY(cudaEventRecord(d->done[b->slot], (cudaStream_t)b->dev_stream), "cudaEventRecord (done)");
    /* client: the daemon may refill the host slot once released, so our copy out of it
     * must have finished (it has, unless the trainer releases a batch it never used). */
    if (!d->ipc && b->dev_waited)
        CUDA_TRY(cudaEventSynchronize(d->ready[b->slot]), "cudaEventSynchronize (the batch's copy)");
    return 0;
fail:
    return ret;
}

#else /* !LD_HAVE_CUDA */

int client_device_open(lc_stream *s, const cJSON *reply, int asked_ordinal, char *msg)
{
    snprintf(msg, LD_ERRMSG_MAX, "device: cuda:%d: this libloaderclient was built without CUDA (make CUDA=1 with the "
             "CUDA toolkit)", asked_ordinal);
    return LC_EDEVICE;
}

void client_device_close(lc_stream *s)
{
}

int client_device_field(const lc_batch *b, int i, lc_device_field *ret, char *msg)
{
    return LC_ENOTSUP;
}

int client_device_wait(lc_batch *b, void *cuda_stream, char *msg)
{
    return LC_ENOTSUP;
}

int client_device_release(lc_batch *b, char *msg)
{
    return 0;
}

#endif

/* ---- the public calls ------------------------------------------------------------------- */

LC_EXPORT int lc_stream_device(const lc_stream *s)
{
    return s && s->dev_ordinal >= 0 ? s->dev_ordinal : -1;
}

static int client_device_usable(const lc_batch *b, const char *call)
{
    if (!b)
        return LC_EINVAL;
    lc_stream *s = b->stream;
    if (!s->dev) {
        snprintf(s->client->error, sizeof s->client->error,
                 "%s: stream %llu was opened without a device (lc_stream_options.device)", call,
                 (unsigned long long)s->id);
        return LC_EINVAL;
    }
    return 0;
}

LC_EXPORT int lc_batch_device_field_sized(const lc_batch *b, int i, lc_device_field *ret_field, size_t field_size)
{
    int ret = client_device_usable(b, "lc_batch_device_field");
    if (ret < 0)
        return ret;
    lc_stream *s = b->stream;
    if (i < 0 || i >= s->n_fields || !ret_field || field_size < offsetof(lc_device_field, offsets) + sizeof(void *)) {
        snprintf(s->client->error, sizeof s->client->error, "lc_batch_device_field: no field %d (the batch has %d)",
                 i, s->n_fields);
        return LC_EINVAL;
    }
    lc_device_field v;
    char msg[LD_ERRMSG_MAX];
    if ((ret = client_device_field(b, i, &v, msg)) < 0)
        return ret;
    memset(ret_field, 0, field_size);
    memcpy(ret_field, &v, field_size < sizeof v ? field_size : sizeof v);
    return 0;
}

LC_EXPORT int lc_batch_device_field_by_name_sized(const lc_batch *b, const char *name, lc_device_field *ret_field,
                                                  size_t field_size)
{
    if (!b || !name)
        return LC_EINVAL;
    for (int i = 0; i < b->stream->n_fields; i++)
        if (strcmp(b->stream->fields[i].name, name) == 0)
            return lc_batch_device_field_sized(b, i, ret_field, field_size);
    snprintf(b->stream->client->error, sizeof b->stream->client->error, "lc_batch_device_field: no field '%s'", name);
    return LC_EINVAL;
}

LC_EXPORT int lc_batch_device_wait(lc_batch *b, void *cuda_stream)
{
    int ret = client_device_usable(b, "lc_batch_device_wait");
    if (ret < 0)
        return ret;
    char msg[LD_ERRMSG_MAX];
    if ((ret = client_device_wait(b, cuda_stream, msg)) < 0)
        snprintf(b->stream->client->error, sizeof b->stream->client->error, "lc_batch_device_wait: %s", msg);
    return ret;
}
