/* device — choosing a stream's device stage, parsing what an open asks for, and the
 * per-GPU device-memory budget that every stream on a GPU shares (device.h). The
 * backends are device_host.c (nothing to do) and device_cuda.c; this file knows no
 * CUDA, so it reads the same in every build. */
#include "device.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "ld_error.h"
#include "log.h"
#include "proto.h"
#include "transform.h"

int device_parse(const char *device, const char *transfer, struct device_spec *ret, char *errbuf)
{
    struct device_spec s = {.kind = DEVICE_HOST};
    if (device && strcmp(device, "host") != 0) {
        const char *p = device + 5;
        char *end = NULL;
        if (strncmp(device, "cuda:", 5) != 0 || *p < '0' || *p > '9' || (p[0] == '0' && p[1])) {
            ld_errorf(errbuf, "field 'device': expected \"cuda:N\" (N a GPU ordinal) or \"host\", got \"%s\"", device);
            return LD_EFIELD;
        }
        errno = 0;
        long n = strtol(p, &end, 10);
        if (errno || *end || n < 0 || n > LD_DEVICE_ORDINAL_MAX) {
            ld_errorf(errbuf, "field 'device': \"%s\": the ordinal must be an integer in [0, %d]", device,
                      LD_DEVICE_ORDINAL_MAX);
            return LD_EFIELD;
        }
        s.kind = DEVICE_CUDA;
        s.ordinal = (int)n;
    }
    if (transfer) {
        if (strcmp(transfer, LD_TRANSFER_CLIENT) == 0) {
            s.transfer_client = true;
        } else if (strcmp(transfer, LD_TRANSFER_IPC) != 0) {
            ld_errorf(errbuf, "field 'transfer': expected \"" LD_TRANSFER_IPC "\" or \"" LD_TRANSFER_CLIENT
                      "\", got \"%s\"", transfer);
            return LD_EFIELD;
        }
        if (s.kind == DEVICE_HOST) {
            ld_errorf(errbuf, "field 'transfer': \"%s\" needs a device (\"device\": \"cuda:N\")", transfer);
            return LD_EFIELD;
        }
    }
    *ret = s;
    return 0;
}

void device_spec_name(const struct device_spec *spec, char *buf, size_t size)
{
    if (spec->kind == DEVICE_CUDA)
        snprintf(buf, size, "cuda:%d", spec->ordinal);
    else
        snprintf(buf, size, "host");
}

int device_open(const struct device_spec *spec, const struct device_stream_params *p, device_copied_fn copied,
                void *ctx, device_stage **ret, char *errbuf)
{
    /* transfer "client": the trainer pins its own mapping and copies on its stream;
     * the daemon serves host slots as for any stream. */
    const struct device_ops *ops =
        spec->kind == DEVICE_CUDA && !spec->transfer_client ? &device_cuda_ops : &device_host_ops;
    return ops->open(spec, p, copied, ctx, ret, errbuf);
}

int device_describe(const device_stage *st, const struct device_spec *spec, cJSON *obj)
{
    if (spec->kind == DEVICE_HOST)
        return 0;
    struct proto_device_info *d = calloc(1, sizeof *d);
    if (!d)
        return LD_ENOMEM;
    int rc = 0;
    if (!st->ops->describe(st, d)) {
        device_spec_name(spec, d->name, sizeof d->name);
        d->ordinal = spec->ordinal;
        d->ipc = false;
    }
    rc = proto_device_encode(d, obj);
    free(d);
    return rc;
}

void device_stats(device_stage *st, cJSON *obj)
{
    st->ops->stats(st, obj);
}

/* ---- the per-GPU budget ------------------------------------------------------------- */

static uint64_t device_used[LD_DEVICE_ORDINAL_MAX + 1]; /* loop thread only */

static void device_human(uint64_t b, char *buf, size_t size)
{
    snprintf(buf, size, "%.1f MiB", (double)b / (1024.0 * 1024.0));
}

int device_budget_take(int ordinal, uint64_t bytes, uint64_t budget, char *errbuf)
{
    if (ordinal < 0 || ordinal > LD_DEVICE_ORDINAL_MAX)
        return LD_EINVAL;
    uint64_t used = device_used[ordinal];
    if (bytes > budget || used > budget - bytes) {
        char a[32], b[32], c[32];
        device_human(bytes, a, sizeof a);
        device_human(budget - (used < budget ? used : budget), b, sizeof b);
        device_human(budget, c, sizeof c);
        ld_errorf(errbuf, "device: cuda:%d: the stream's device ring needs %s but only %s is left of "
                  "server.device_memory_budget (%s per GPU): lower batch_size or prefetch, or raise the budget",
                  ordinal, a, b, c);
        return LD_EBUDGET;
    }
    device_used[ordinal] = used + bytes;
    return 0;
}

void device_budget_give(int ordinal, uint64_t bytes)
{
    /* Else more is given back than was taken: the accounting is broken. */
    ld_require(ordinal >= 0 && ordinal <= LD_DEVICE_ORDINAL_MAX && device_used[ordinal] >= bytes);
    device_used[ordinal] -= bytes;
}

uint64_t device_budget_used(int ordinal)
{
    return ordinal >= 0 && ordinal <= LD_DEVICE_ORDINAL_MAX ? device_used[ordinal] : 0;
}

uint64_t device_budget_used_total(void)
{
    uint64_t sum = 0;
    for (int i = 0; i <= LD_DEVICE_ORDINAL_MAX; i++)
        sum += device_used[i];
    return sum;
}

/* ---- on-GPU normalize: the open's request ------------------------------------------- */

static int norm_values(const cJSON *o, const char *key, uint32_t c, double out[DEVICE_NORM_MAX_C], bool is_std,
                       char *errbuf)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (n != 1 && n != (int)c) {
        ld_errorf(errbuf, "field 'device_normalize.%s': expected an array of 1 or %u numbers (one per channel)", key,
                  c);
        return LD_EFIELD;
    }
    for (uint32_t i = 0; i < c; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, n == 1 ? 0 : (int)i);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || (is_std && v->valuedouble == 0.0)) {
            ld_errorf(errbuf, "field 'device_normalize.%s[%u]': expected a finite%s number", key, n == 1 ? 0 : i,
                      is_std ? " non-zero" : "");
            return LD_EFIELD;
        }
        out[i] = v->valuedouble;
    }
    return 0;
}

int device_normalize_parse(const cJSON *obj, const struct dataset *d, struct device_normalize *ret, char *errbuf)
{
    char sub[LD_ERRMSG_MAX];
    const char *field, *dtype = "float32", *layout = "CHW";
    if (!obj || cJSON_IsNull(obj)) {
        ret->field = -1;
        return 0;
    }
    if (!cJSON_IsObject(obj)) {
        ld_errorf(errbuf, "field 'device_normalize': expected an object {field, mean, std, dtype, layout}");
        return LD_EFIELD;
    }
    if (proto_get_str(obj, "field", LD_NAME_MAX - 1, &field, sub) < 0 ||
        (cJSON_GetObjectItemCaseSensitive(obj, "dtype") && proto_get_str(obj, "dtype", 16, &dtype, sub) < 0) ||
        (cJSON_GetObjectItemCaseSensitive(obj, "layout") && proto_get_str(obj, "layout", 8, &layout, sub) < 0)) {
        ld_errorf(errbuf, "device_normalize: %s", sub);
        return LD_EFIELD;
    }
    int f;
    for (f = 0; f < d->n_fields; f++)
        if (strcmp(d->fields[f].name, field) == 0)
            break;
    if (f == d->n_fields) {
        ld_errorf(errbuf, "field 'device_normalize.field': dataset '%s' has no field '%s'", d->name, field);
        return LD_EFIELD;
    }
    const struct dataset_field *df = &d->fields[f];
    bool hwc = strcmp(layout, "HWC") == 0;
    if (!hwc && strcmp(layout, "CHW") != 0) {
        ld_errorf(errbuf, "field 'device_normalize.layout': expected \"CHW\" or \"HWC\" (the field's layout on the "
                  "host), got \"%s\"", layout);
        return LD_EFIELD;
    }
    int dt = proto_dtype_from_name(dtype);
    if (dt != LD_DTYPE_FLOAT16 && dt != LD_DTYPE_FLOAT32) {
        ld_errorf(errbuf, "field 'device_normalize.dtype': expected \"float16\" or \"float32\", got \"%s\"", dtype);
        return LD_EFIELD;
    }
    uint32_t c = df->ndim == 3 ? (uint32_t)df->shape[hwc ? 2 : 0] : 0;
    if (df->ragged || df->dtype != LD_DTYPE_UINT8 || df->ndim != 3 || c < 1 || c > DEVICE_NORM_MAX_C) {
        ld_errorf(errbuf, "field 'device_normalize.field': '%s' must be a uint8 image of 3 dims (%s) with 1 to %d "
                  "channels: end the pipeline with to_dtype {dtype: uint8} and let the GPU normalize", field,
                  layout, DEVICE_NORM_MAX_C);
        return LD_EFIELD;
    }
    double mean[DEVICE_NORM_MAX_C], sd[DEVICE_NORM_MAX_C];
    int rc;
    if ((rc = norm_values(obj, "mean", c, mean, false, errbuf)) < 0 || (rc = norm_values(obj, "std", c, sd, true, errbuf)) < 0)
        return rc;
    struct device_normalize n = {.field = f, .dtype = dt, .from_hwc = hwc, .c = c};
    n.h = (uint32_t)df->shape[hwc ? 0 : 1];
    n.w = (uint32_t)df->shape[hwc ? 1 : 2];
    /* The host pipeline's own tables (transform.c build_luts): the same double
     * arithmetic rounded once, so both paths give the same bits. */
    for (uint32_t ch = 0; ch < c; ch++) {
        for (int v = 0; v < 256; v++) {
            double x = ((double)v / 255.0 - mean[ch]) / sd[ch];
            n.lut32[ch][v] = (float)x;
            n.lut16[ch][v] = transform_half_from_double(x);
        }
    }
    *ret = n;
    return 0;
}
