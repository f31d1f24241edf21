/* proto_device — encode and decode the open reply's "device" object (see
 * proto_device.h), shared by loaderd and libloaderclient so that both ends read the
 * handles the same way. Like the rest of proto/, it returns codes and never prints.
 * Decoding checks every member against the wire limits (ld_wire.h) before a byte of
 * it is used: a client imports these handles into its GPU context, so a malformed
 * block must fail here with its member named, not later inside the driver. */
#include "proto_device.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define HEX_LEN (2 * LD_IPC_HANDLE_SIZE)

void proto_handle_hex(const struct ld_ipc_handle *h, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < LD_IPC_HANDLE_SIZE; i++) {
        out[2 * i] = digits[h->bytes[i] >> 4];
        out[2 * i + 1] = digits[h->bytes[i] & 15];
    }
    out[HEX_LEN] = '\0';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* `what` names the member for the message ("device.ready_events[3]"). */
static int handle_from_json(const cJSON *item, const char *what, struct ld_ipc_handle *ret, char *errbuf)
{
    if (!cJSON_IsString(item) || !item->valuestring || strlen(item->valuestring) != HEX_LEN) {
        ld_errorf(errbuf, "field '%s': expected %d lower-case hex digits", what, HEX_LEN);
        return LD_EFIELD;
    }
    struct ld_ipc_handle h;
    for (size_t i = 0; i < LD_IPC_HANDLE_SIZE; i++) {
        int hi = hex_digit(item->valuestring[2 * i]), lo = hex_digit(item->valuestring[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            ld_errorf(errbuf, "field '%s': not a hex digit at character %zu", what, hi < 0 ? 2 * i : 2 * i + 1);
            return LD_EFIELD;
        }
        h.bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    *ret = h;
    return 0;
}

static bool add_handle(cJSON *arr_or_obj, const char *key, const struct ld_ipc_handle *h)
{
    char hex[HEX_LEN + 1];
    proto_handle_hex(h, hex);
    cJSON *s = cJSON_CreateString(hex);
    if (!s)
        return false;
    if (key)
        return cJSON_AddItemToObject(arr_or_obj, key, s);
    return cJSON_AddItemToArray(arr_or_obj, s);
}

int proto_device_encode(const struct proto_device_info *d, cJSON *obj)
{
    if (!d || !obj || d->ordinal < 0 || d->ordinal > LD_DEVICE_ORDINAL_MAX || d->n_fields < 0 ||
        d->n_fields > LD_MAX_FIELDS || (d->ipc && (d->slot_count < 1 || d->slot_count > LD_DEVICE_SLOT_COUNT_MAX)))
        return LD_EINVAL;
    cJSON *o = cJSON_AddObjectToObject(obj, "device");
    if (!o || !cJSON_AddStringToObject(o, "name", d->name) ||
        !cJSON_AddNumberToObject(o, "ordinal", d->ordinal) ||
        !cJSON_AddStringToObject(o, "transfer", d->ipc ? LD_TRANSFER_IPC : LD_TRANSFER_CLIENT))
        return LD_ENOMEM;
    if (!d->ipc)
        return 0;
    if (!cJSON_AddNumberToObject(o, "slot_size", (double)d->slot_size) ||
        !cJSON_AddNumberToObject(o, "slot_count", d->slot_count) || !add_handle(o, "memory", &d->memory))
        return LD_ENOMEM;
    cJSON *ready = cJSON_AddArrayToObject(o, "ready_events");
    cJSON *done = cJSON_AddArrayToObject(o, "done_events");
    cJSON *fields = cJSON_AddArrayToObject(o, "fields");
    if (!ready || !done || !fields)
        return LD_ENOMEM;
    for (uint32_t i = 0; i < d->slot_count; i++)
        if (!add_handle(ready, NULL, &d->ready[i]) || !add_handle(done, NULL, &d->done[i]))
            return LD_ENOMEM;
    for (int f = 0; f < d->n_fields; f++) {
        const struct proto_device_field *df = &d->fields[f];
        const char *dt = proto_dtype_name(df->dtype);
        if (!dt || df->ndim < 0 || df->ndim > LD_MAX_DIMS)
            return LD_EINVAL;
        cJSON *jf = cJSON_CreateObject();
        if (!jf || !cJSON_AddItemToArray(fields, jf))
            return LD_ENOMEM; /* jf leaks only when cJSON_AddItemToArray fails, which it cannot for a fresh item */
        cJSON *shape = cJSON_AddArrayToObject(jf, "shape");
        if (!cJSON_AddStringToObject(jf, "name", df->name) || !cJSON_AddStringToObject(jf, "dtype", dt) || !shape ||
            !cJSON_AddNumberToObject(jf, "offset", (double)df->offset) ||
            !cJSON_AddNumberToObject(jf, "row_bytes", (double)df->row_bytes))
            return LD_ENOMEM;
        for (int i = 0; i < df->ndim; i++) {
            cJSON *n = cJSON_CreateNumber((double)df->shape[i]);
            if (!n || !cJSON_AddItemToArray(shape, n))
                return LD_ENOMEM;
        }
    }
    return 0;
}

/* "device.<key>" into buf, for messages. */
static const char *member(char *buf, size_t size, const char *key)
{
    snprintf(buf, size, "device.%s", key);
    return buf;
}

static int get_int(const cJSON *o, const char *key, int64_t min, int64_t max, int64_t *ret, char *errbuf)
{
    char sub[LD_ERRMSG_MAX];
    int rc = proto_get_int(o, key, min, max, ret, sub);
    if (rc < 0)
        ld_errorf(errbuf, "device: %s", sub);
    return rc;
}

static int decode_field(const cJSON *jf, int i, uint64_t slot_size, struct proto_device_field *ret, char *errbuf)
{
    char sub[LD_ERRMSG_MAX];
    const char *name = NULL, *dtype = NULL;
    int64_t off, rb;
    if (!cJSON_IsObject(jf)) {
        ld_errorf(errbuf, "device.fields[%d]: expected an object", i);
        return LD_EFIELD;
    }
    if (proto_get_str(jf, "name", LD_NAME_MAX - 1, &name, sub) < 0 ||
        proto_get_str(jf, "dtype", 16, &dtype, sub) < 0 ||
        proto_get_int(jf, "offset", 0, LD_JSON_SAFE_INT, &off, sub) < 0 ||
        proto_get_int(jf, "row_bytes", 1, LD_JSON_SAFE_INT, &rb, sub) < 0) {
        ld_errorf(errbuf, "device.fields[%d]: %s", i, sub);
        return LD_EFIELD;
    }
    struct proto_device_field f = {0};
    snprintf(f.name, sizeof f.name, "%s", name);
    f.dtype = proto_dtype_from_name(dtype);
    if (f.dtype < 0) {
        ld_errorf(errbuf, "device.fields[%d]: unknown dtype '%s'", i, dtype);
        return LD_EFIELD;
    }
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(jf, "shape");
    int n = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    if (n < 0 || n > LD_MAX_DIMS) {
        ld_errorf(errbuf, "device.fields[%d]: 'shape' must be an array of at most %d dims", i, LD_MAX_DIMS);
        return LD_EFIELD;
    }
    uint64_t elems = 1;
    for (int d = 0; d < n; d++) {
        const cJSON *v = cJSON_GetArrayItem(shape, d);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > (double)(1u << 30) ||
            v->valuedouble != (double)(int64_t)v->valuedouble) {
            ld_errorf(errbuf, "device.fields[%d].shape[%d]: expected an integer in [1, 2^30]", i, d);
            return LD_EFIELD;
        }
        f.shape[d] = (int64_t)v->valuedouble;
        elems *= (uint64_t)f.shape[d];
        if (elems > (uint64_t)1 << 40) {
            ld_errorf(errbuf, "device.fields[%d]: shape too large", i);
            return LD_EFIELD;
        }
    }
    f.ndim = n;
    f.offset = (uint64_t)off;
    f.row_bytes = (uint64_t)rb;
    if (f.row_bytes != elems * proto_dtype_size(f.dtype) || f.offset >= slot_size) {
        ld_errorf(errbuf, "device.fields[%d] ('%s'): row_bytes %" PRIu64 " or offset %" PRIu64
                  " do not match its shape and dtype or the slot size %" PRIu64, i, f.name, f.row_bytes, f.offset,
                  slot_size);
        return LD_EFIELD;
    }
    *ret = f;
    return 0;
}

static int decode_events(const cJSON *o, const char *key, uint32_t count, struct ld_ipc_handle *out, char *errbuf)
{
    char what[64];
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != (int)count) {
        ld_errorf(errbuf, "field '%s': expected an array of %" PRIu32 " handles (one per slot)",
                  member(what, sizeof what, key), count);
        return LD_EFIELD;
    }
    for (uint32_t i = 0; i < count; i++) {
        snprintf(what, sizeof what, "device.%s[%" PRIu32 "]", key, i);
        int rc = handle_from_json(cJSON_GetArrayItem(arr, (int)i), what, &out[i], errbuf);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int device_decode_into(const cJSON *o, struct proto_device_info *dp, char *errbuf);

int proto_device_decode(const cJSON *obj, struct proto_device_info *ret, char *errbuf)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, "device");
    if (!o || cJSON_IsNull(o))
        return 1;
    if (!cJSON_IsObject(o)) {
        ld_errorf(errbuf, "field 'device': expected an object");
        return LD_EFIELD;
    }
    /* Filled aside (it is large: two handle arrays) and copied out only when whole. */
    struct proto_device_info *dp = calloc(1, sizeof *dp);
    if (!dp) {
        ld_errorf(errbuf, "out of memory decoding 'device'");
        return LD_ENOMEM;
    }
    int rc = device_decode_into(o, dp, errbuf);
    if (rc == 0)
        *ret = *dp;
    free(dp);
    return rc;
}

static int device_decode_into(const cJSON *o, struct proto_device_info *dp, char *errbuf)
{
    char sub[LD_ERRMSG_MAX];
    const char *name, *transfer;
    int64_t v;
    int rc;
    if (proto_get_str(o, "name", LD_DEVICE_NAME_MAX - 1, &name, sub) < 0 ||
        proto_get_str(o, "transfer", 16, &transfer, sub) < 0) {
        ld_errorf(errbuf, "device: %s", sub);
        return LD_EFIELD;
    }
    if ((rc = get_int(o, "ordinal", 0, LD_DEVICE_ORDINAL_MAX, &v, errbuf)) < 0)
        return rc;
    snprintf(dp->name, sizeof dp->name, "%s", name);
    dp->ordinal = (int)v;
    if (strcmp(transfer, LD_TRANSFER_IPC) == 0) {
        dp->ipc = true;
    } else if (strcmp(transfer, LD_TRANSFER_CLIENT) != 0) {
        ld_errorf(errbuf, "field 'device.transfer': expected \"" LD_TRANSFER_IPC "\" or \"" LD_TRANSFER_CLIENT
                  "\", got \"%s\"", transfer);
        return LD_EFIELD;
    }
    if (dp->ipc) {
        if ((rc = get_int(o, "slot_size", LD_DEVICE_SLOT_ALIGN, LD_JSON_SAFE_INT, &v, errbuf)) < 0)
            return rc;
        dp->slot_size = (uint64_t)v;
        if (dp->slot_size % LD_DEVICE_SLOT_ALIGN) {
            ld_errorf(errbuf, "field 'device.slot_size': %" PRIu64 " is not a multiple of %u", dp->slot_size,
                      LD_DEVICE_SLOT_ALIGN);
            return LD_EFIELD;
        }
        if ((rc = get_int(o, "slot_count", 1, LD_DEVICE_SLOT_COUNT_MAX, &v, errbuf)) < 0)
            return rc;
        dp->slot_count = (uint32_t)v;
        if ((rc = handle_from_json(cJSON_GetObjectItemCaseSensitive(o, "memory"), "device.memory", &dp->memory,
                                   errbuf)) < 0 ||
            (rc = decode_events(o, "ready_events", dp->slot_count, dp->ready, errbuf)) < 0 ||
            (rc = decode_events(o, "done_events", dp->slot_count, dp->done, errbuf)) < 0)
            return rc;
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(o, "fields");
        int n = fields ? (cJSON_IsArray(fields) ? cJSON_GetArraySize(fields) : -1) : 0;
        if (n < 0 || n > LD_MAX_FIELDS) {
            ld_errorf(errbuf, "field 'device.fields': expected an array of at most %d fields", LD_MAX_FIELDS);
            return LD_EFIELD;
        }
        for (int i = 0; i < n; i++)
            if ((rc = decode_field(cJSON_GetArrayItem(fields, i), i, dp->slot_size, &dp->fields[i], errbuf)) < 0)
                return rc;
        dp->n_fields = n;
    }
    return 0;
}
