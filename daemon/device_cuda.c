/* device_cuda — the CUDA backend of the device stage (device.h), and the one daemon
 * file that includes cuda_runtime.h.
 *
 * Per stream, at open: the host ring is pinned in place (cudaHostRegister on the
 * shared-memory mapping, so workers fill memory the copy engine reads directly), one
 * allocation holds the device ring (slot i of the host ring goes to device slot i;
 * device slots are multiples of 2 MiB), and each slot gets two interprocess events: one
 * the copy stream records when the slot's copy (and normalize) is done, one the trainer
 * records when it is done with the slot. The memory and events are exported once
 * (cudaIpcGet*Handle) in the open reply. Per batch, submit queues on the stream's copy
 * stream: a wait on the slot's "done" event, the copy, the optional normalize kernel,
 * the "ready" event, and a host function that reports the copy to the loop.
 *
 * The runtime is linked statically (libcudart_static loads the driver when first
 * used), so the same binary starts on a host without a driver; the first stream that
 * asks for a GPU gets an error naming why it cannot have one, and the daemon serves on.
 * In a build without CUDA this file is still compiled and every open says so.
 *
 * CUDA calls go through CUDA_TRY: it logs the call, clears the runtime's sticky error
 * state, maps the failure to LD_EDEVICE with a message and jumps to the one cleanup
 * label. */
#include "device.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ld_error.h"
#include "log.h"

#if LD_HAVE_CUDA
#include <cuda_runtime.h>

_Static_assert(sizeof(cudaIpcMemHandle_t) == LD_IPC_HANDLE_SIZE, "cudaIpcMemHandle_t travels as ld_ipc_handle");
_Static_assert(sizeof(cudaIpcEventHandle_t) == LD_IPC_HANDLE_SIZE, "cudaIpcEventHandle_t travels as ld_ipc_handle");

/* device_cuda_kernels.cu */
int device_cuda_normalize(const void *src, void *dst, const void *lut, uint32_t rows, uint32_t c, uint32_t h,
                          uint32_t w, int from_hwc, int f16, void *stream);

#define CUDA_TRY(call)                                                                                   \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            (void)cudaGetLastError();                                                                    \
            ld_errorf(errbuf, "device: %s: %s failed: %s (%s)", st->name, #call, cudaGetErrorString(e_), \
                      cudaGetErrorName(e_));                                                             \
            ld_log(LD_LOG_WARN, "%s", errbuf);                                                           \
            rc = LD_EDEVICE;                                                                             \
            goto fail;                                                                                   \
        }                                                                                                \
    } while (0)

struct cuda_slot {
    struct cuda_stage *st;
    uint32_t slot;
    uint64_t bytes;
    cudaEvent_t ready, done;      /* interprocess, so without timing */
    cudaEvent_t t0, t1;           /* the copy's own start and end on the copy stream */
    bool timed;                   /* t0/t1 hold a copy not yet counted */
};

struct cuda_stage {
    struct device_stage base;
    char name[LD_DEVICE_NAME_MAX];
    int ordinal;
    device_copied_fn copied;
    void *ctx;
    uint8_t *ring_base;
    uint64_t ring_size, slot_offset, host_slot_size;
    bool registered;
    cudaStream_t copy;
    uint8_t *dev;                 /* slot_count * dev_slot_size */
    uint64_t dev_slot_size;
    uint64_t dev_bytes;           /* taken from the budget */
    uint64_t budget;              /* server.device_memory_budget */
    uint32_t slot_count;
    void *lut;                    /* the normalize tables on the device, or NULL */
    struct device_normalize norm;
    uint64_t norm_src, norm_dst;  /* offsets in a slot */
    const char *norm_name;
    struct proto_device_info *info; /* the exported handles, for every open reply */
    struct cuda_slot *slots;
    /* Counted on the loop thread when a slot's next copy is queued (its previous copy has
     * ended by then) or when `streams` asks: the copy engine's own time, from t0 to t1. */
    uint64_t copies, copy_bytes;
    double copy_ms;
};

/* Why this process cannot use GPU `ordinal`, in words, or 0 when it can. */
static int cuda_check_device(int ordinal, char *errbuf)
{
    int drv = 0, n = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0) {
        (void)cudaGetLastError();
        ld_errorf(errbuf, "device: cuda:%d: no NVIDIA driver on this host (libcuda.so.1 cannot be loaded, or "
                  "/dev/nvidia* is hidden from loaderd: on a GPU host install the systemd drop-in "
                  "loaderd.service.d/gpu.conf); this stream can use \"transfer\": \"client\" or no device", ordinal);
        return LD_EDEVICE;
    }
    e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || drv < CUDART_VERSION) {
        (void)cudaGetLastError();
        ld_errorf(errbuf, "device: cuda:%d: the NVIDIA driver is too old: it supports CUDA %d.%d, loaderd was built "
                  "with CUDA %d.%d (update the driver)", ordinal, drv / 1000, drv % 1000 / 10,
                  CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        return LD_EDEVICE;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        (void)cudaGetLastError();
        ld_errorf(errbuf, "device: cuda:%d: no CUDA device is visible to loaderd (see CUDA_VISIBLE_DEVICES in its "
                  "environment, and /dev/nvidia*)", ordinal);
        return LD_EDEVICE;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ld_errorf(errbuf, "device: cuda:%d: the CUDA driver cannot start: %s (%s)", ordinal, cudaGetErrorString(e),
                  cudaGetErrorName(e));
        return LD_EDEVICE;
    }
    if (ordinal >= n) {
        ld_errorf(errbuf, "device: cuda:%d: no device %d: loaderd sees %d CUDA device%s (ordinals 0 to %d)", ordinal,
                  ordinal, n, n == 1 ? "" : "s", n - 1);
        return LD_EDEVICE;
    }
    return 0;
}

static void cuda_close(device_stage *base)
{
    struct cuda_stage *st = (struct cuda_stage *)base;
    if (!st)
        return;
    cudaSetDevice(st->ordinal);
    if (st->copy)
        cudaStreamSynchronize(st->copy);
    if (st->slots) {
        for (uint32_t i = 0; i < st->slot_count; i++) {
            if (st->slots[i].ready)
                cudaEventDestroy(st->slots[i].ready);
            if (st->slots[i].done)
                cudaEventDestroy(st->slots[i].done);
            if (st->slots[i].t0)
                cudaEventDestroy(st->slots[i].t0);
            if (st->slots[i].t1)
                cudaEventDestroy(st->slots[i].t1);
        }
    }
    if (st->lut)
        cudaFree(st->lut);
    if (st->dev)
        cudaFree(st->dev);
    if (st->registered)
        cudaHostUnregister(st->ring_base);
    if (st->copy)
        cudaStreamDestroy(st->copy);
    (void)cudaGetLastError();
    if (st->dev_bytes)
        device_budget_give(st->ordinal, st->dev_bytes);
    free(st->slots);
    free(st->info);
    free(st);
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static int cuda_open(const struct device_spec *spec, const struct device_stream_params *p, device_copied_fn copied,
                     void *ctx, device_stage **ret, char *errbuf)
{
    int rc = cuda_check_device(spec->ordinal, errbuf);
    if (rc < 0)
        return rc;
    if (p->slot_count > LD_DEVICE_SLOT_COUNT_MAX) {
        ld_errorf(errbuf, "device: cuda:%d: %u slots, at most %d for a device stream", spec->ordinal, p->slot_count,
                  LD_DEVICE_SLOT_COUNT_MAX);
        return LD_ELIMIT;
    }
    struct cuda_stage *st = calloc(1, sizeof *st);
    if (!st) {
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    st->base.ops = &device_cuda_ops;
    snprintf(st->name, sizeof st->name, "cuda:%d", spec->ordinal);
    st->ordinal = spec->ordinal;
    st->copied = copied;
    st->ctx = ctx;
    st->ring_base = p->ring_base;
    st->ring_size = p->ring_size;
    st->slot_offset = p->slot_offset;
    st->host_slot_size = p->slot_size;
    st->slot_count = p->slot_count;
    st->norm.field = -1;
    st->slots = calloc(p->slot_count, sizeof *st->slots);
    st->info = calloc(1, sizeof *st->info);
    if (!st->slots || !st->info) {
        rc = LD_ENOMEM;
        ld_errorf(errbuf, "out of memory");
        goto fail;
    }
    /* The device slot: the host slot's bytes at the same offsets, then the normalized
     * field (when asked for) on a 256-byte boundary; rounded to 2 MiB. */
    uint64_t need = p->slot_bytes;
    if (p->norm && p->norm->field >= 0) {
        st->norm = *p->norm;
        st->norm_src = p->norm_src_offset;
        st->norm_dst = round_up(p->slot_bytes, 256);
        st->norm_name = p->norm_name;
        need = st->norm_dst + (uint64_t)p->batch_size * st->norm.c * st->norm.h * st->norm.w *
                                  proto_dtype_size(st->norm.dtype);
    }
    st->dev_slot_size = round_up(need, LD_DEVICE_SLOT_ALIGN);
    if ((rc = device_budget_take(st->ordinal, st->dev_slot_size * p->slot_count, p->budget, errbuf)) < 0)
        goto fail;
    st->dev_bytes = st->dev_slot_size * p->slot_count;
    st->budget = p->budget;

    CUDA_TRY(cudaSetDevice(st->ordinal));
    CUDA_TRY(cudaStreamCreateWithFlags(&st->copy, cudaStreamNonBlocking));
    /* Pinned once, in place: the workers' writes are what the DMA engine reads. */
    CUDA_TRY(cudaHostRegister(st->ring_base, st->ring_size, cudaHostRegisterDefault));
    st->registered = true;
    CUDA_TRY(cudaMalloc((void **)&st->dev, st->dev_bytes));
    if (st->norm.field >= 0) {
        size_t lut_bytes = st->norm.dtype == LD_DTYPE_FLOAT16 ? sizeof st->norm.lut16 : sizeof st->norm.lut32;
        CUDA_TRY(cudaMalloc(&st->lut, lut_bytes));
        CUDA_TRY(cudaMemcpy(st->lut, st->norm.dtype == LD_DTYPE_FLOAT16 ? (const void *)st->norm.lut16
                                                                         : (const void *)st->norm.lut32,
                            lut_bytes, cudaMemcpyHostToDevice));
    }
    struct proto_device_info *d = st->info;
    snprintf(d->name, sizeof d->name, "%s", st->name);
    d->ordinal = st->ordinal;
    d->ipc = true;
    d->slot_size = st->dev_slot_size;
    d->slot_count = st->slot_count;
    CUDA_TRY(cudaIpcGetMemHandle((cudaIpcMemHandle_t *)&d->memory, st->dev));
    for (uint32_t i = 0; i < st->slot_count; i++) {
        struct cuda_slot *cs = &st->slots[i];
        cs->st = st;
        cs->slot = i;
        CUDA_TRY(cudaEventCreateWithFlags(&cs->ready, cudaEventInterprocess | cudaEventDisableTiming));
        CUDA_TRY(cudaEventCreateWithFlags(&cs->done, cudaEventInterprocess | cudaEventDisableTiming));
        CUDA_TRY(cudaEventCreate(&cs->t0));
        CUDA_TRY(cudaEventCreate(&cs->t1));
        CUDA_TRY(cudaIpcGetEventHandle((cudaIpcEventHandle_t *)&d->ready[i], cs->ready));
        CUDA_TRY(cudaIpcGetEventHandle((cudaIpcEventHandle_t *)&d->done[i], cs->done));
    }
    if (st->norm.field >= 0) {
        struct proto_device_field *f = &d->fields[0];
        snprintf(f->name, sizeof f->name, "%s", st->norm_name ? st->norm_name : "");
        f->dtype = st->norm.dtype;
        f->ndim = 3;
        f->shape[0] = st->norm.c;
        f->shape[1] = st->norm.h;
        f->shape[2] = st->norm.w;
        f->offset = st->norm_dst;
        f->row_bytes = (uint64_t)st->norm.c * st->norm.h * st->norm.w * proto_dtype_size(st->norm.dtype);
        d->n_fields = 1;
    }
    ld_log(LD_LOG_INFO, "stream %" PRIu64 ": device ring on %s: %u slots of %" PRIu64 " MiB, host ring pinned",
           p->stream_id, st->name, st->slot_count, st->dev_slot_size >> 20);
    *ret = &st->base;
    return 0;

fail:
    cuda_close(&st->base);
    return rc;
}

/* The runtime's callback thread, once the slot's copy and kernel are done: the report
 * is the last thing it does with the stage (the loop may close it right after). */
static void CUDART_CB cuda_copied(void *arg)
{
    struct cuda_slot *cs = arg;
    struct cuda_stage *st = cs->st;
    st->copied(st->ctx, cs->slot, 0);
}

/* Adds a finished copy's engine time to the counters (loop thread). */
static void cuda_count(struct cuda_stage *st, struct cuda_slot *cs)
{
    float ms = 0;
    if (!cs->timed || cudaEventQuery(cs->t1) != cudaSuccess)
        return;
    if (cudaEventElapsedTime(&ms, cs->t0, cs->t1) == cudaSuccess) {
        st->copies++;
        st->copy_bytes += cs->bytes;
        st->copy_ms += ms;
    }
    (void)cudaGetLastError();
    cs->timed = false;
}

static int cuda_submit(device_stage *base, uint32_t slot, uint64_t bytes, uint32_t rows)
{
    struct cuda_stage *st = (struct cuda_stage *)base;
    char errbuf[LD_ERRMSG_MAX];
    int rc = 0;
    if (slot >= st->slot_count || bytes > st->host_slot_size)
        return LD_EINVAL;
    struct cuda_slot *cs = &st->slots[slot];
    uint8_t *dst = st->dev + (uint64_t)slot * st->dev_slot_size;
    const uint8_t *src = st->ring_base + st->slot_offset + (uint64_t)slot * st->host_slot_size;
    CUDA_TRY(cudaSetDevice(st->ordinal));
    cuda_count(st, cs);
    cs->bytes = bytes;
    /* The trainer recorded `done` before it released the slot's last batch. */
    CUDA_TRY(cudaStreamWaitEvent(st->copy, cs->done, 0));
    CUDA_TRY(cudaEventRecord(cs->t0, st->copy));
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->copy));
    CUDA_TRY(cudaEventRecord(cs->t1, st->copy));
    cs->timed = true;
    if (st->norm.field >= 0) {
        cudaError_t e = (cudaError_t)device_cuda_normalize(dst + st->norm_src, dst + st->norm_dst, st->lut, rows,
                                                           st->norm.c, st->norm.h, st->norm.w, st->norm.from_hwc,
                                                           st->norm.dtype == LD_DTYPE_FLOAT16, st->copy);
        CUDA_TRY(e);
    }
    CUDA_TRY(cudaEventRecord(cs->ready, st->copy));
    CUDA_TRY(cudaLaunchHostFunc(st->copy, cuda_copied, cs));
    return 0;
fail:
    return rc;
}

static bool cuda_describe(const device_stage *base, struct proto_device_info *ret)
{
    const struct cuda_stage *st = (const struct cuda_stage *)base;
    *ret = *st->info;
    return true;
}

static void cuda_stats(device_stage *base, cJSON *o)
{
    struct cuda_stage *st = (struct cuda_stage *)base;
    if (cudaSetDevice(st->ordinal) == cudaSuccess)
        for (uint32_t i = 0; i < st->slot_count; i++)
            cuda_count(st, &st->slots[i]);
    (void)cudaGetLastError();
    uint64_t n = st->copies, b = st->copy_bytes;
    double ns = st->copy_ms * 1e6;
    cJSON_AddStringToObject(o, "device", st->name);
    cJSON_AddNumberToObject(o, "device_memory", (double)st->dev_bytes);
    cJSON_AddNumberToObject(o, "device_memory_used", (double)device_budget_used(st->ordinal));
    cJSON_AddNumberToObject(o, "device_memory_budget", (double)st->budget);
    cJSON_AddNumberToObject(o, "device_copies", (double)n);
    cJSON_AddNumberToObject(o, "copy_ms_per_batch", n ? ns / (double)n / 1e6 : 0.0);
    cJSON_AddNumberToObject(o, "h2d_gbps", ns > 0 ? (double)b / ns : 0.0);
}

#else /* !LD_HAVE_CUDA */

static int cuda_open(const struct device_spec *spec, const struct device_stream_params *p, device_copied_fn copied,
                     void *ctx, device_stage **ret, char *errbuf)
{
    ld_errorf(errbuf, "device: cuda:%d: this loaderd was built without CUDA (make CUDA=1 with the CUDA toolkit); "
              "this stream can use \"transfer\": \"client\" or no device", spec->ordinal);
    return LD_EDEVICE;
}

static int cuda_submit(device_stage *st, uint32_t slot, uint64_t bytes, uint32_t rows)
{
    return LD_ENOTSUP;
}

static bool cuda_describe(const device_stage *st, struct proto_device_info *ret)
{
    return false;
}

static void cuda_stats(device_stage *st, cJSON *obj)
{
}

static void cuda_close(device_stage *st)
{
}

#endif

const struct device_ops device_cuda_ops = {
    .name = "cuda",
    .open = cuda_open,
    .submit = cuda_submit,
    .describe = cuda_describe,
    .stats = cuda_stats,
    .close = cuda_close,
};
