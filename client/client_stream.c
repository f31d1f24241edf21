/* client_stream — opening a stream and mapping its ring: the open request built from a
 * versioned lc_stream_options, the open reply checked field by field (every offset must
 * fall inside a slot and every slot inside the ring, so that a buggy or hostile daemon
 * cannot make the trainer read outside its mapping), the ring's shared memory checked
 * (owner, mode, size, header) and mapped read-only, and closing the stream again.
 *
 * The stream's geometry, once checked here, is what the rest of the library and the
 * bindings use: client_stream_slot() locates a slot, and the lc_stream_ring_* and
 * lc_stream_field_layout calls hand the same facts out, so nobody restates the
 * ring's layout. Asking for batches is client_next.c, their views client_batch.c. */
#include "client_device.h"
#include "client_internal.h"
#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


LC_EXPORT void lc_stream_options_init(lc_stream_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->shuffle = 1;
    o->world_size = 1;
}

LC_EXPORT uint64_t lc_stream_batches_per_epoch(const lc_stream *s) { return s ? s->batches_per_epoch : 0; }
LC_EXPORT uint64_t lc_stream_samples_per_epoch(const lc_stream *s) { return s ? s->samples_per_epoch : 0; }
LC_EXPORT uint64_t lc_stream_id(const lc_stream *s) { return s ? s->id : 0; }

LC_EXPORT const void *lc_stream_ring(const lc_stream *s, size_t *ret_size)
{
    if (!s)
        return NULL;
    if (ret_size)
        *ret_size = s->map_size;
    return s->map;
}

LC_EXPORT int lc_stream_ring_info_sized(const lc_stream *s, lc_ring_info *ret_info, size_t info_size)
{
    if (!s || !ret_info)
        return LC_EINVAL;
    lc_ring_info r;
    memset(&r, 0, sizeof r);
    r.size = s->map_size;
    r.slot_count = s->slot_count;
    r.slot_size = s->slot_size;
    r.slot_header_size = sizeof(struct ld_slot_header);
    r.field_count = s->n_fields;
    return client_copy_struct_out(ret_info, info_size, &r, sizeof r, CLIENT_RING_INFO_V0_SIZE);
}

LC_EXPORT int lc_stream_field_layout_sized(const lc_stream *s, int i, lc_field_layout *ret_layout,
                                           size_t layout_size)
{
    if (!s || !ret_layout || i < 0 || i >= s->n_fields)
        return LC_EINVAL;
    const struct client_field *f = &s->fields[i];
    lc_field_layout l;
    memset(&l, 0, sizeof l);
    l.name = f->name;
    l.dtype = f->dtype;
    l.ragged = f->ragged;
    l.ndim = f->ndim;
    for (int d = 0; d < f->ndim; d++)
        l.shape[d] = f->shape[d];
    l.offset = f->offset;
    if (f->ragged) {
        l.offsets_offset = f->offsets_offset;
        l.capacity = f->capacity;
    } else {
        l.row_bytes = f->row_bytes;
        l.capacity = f->row_bytes * s->batch_size;
    }
    return client_copy_struct_out(ret_layout, layout_size, &l, sizeof l, CLIENT_FIELD_LAYOUT_V0_SIZE);
}

LC_EXPORT int64_t lc_stream_slot_offset(const lc_stream *s, int slot)
{
    if (!s || slot < 0 || (uint32_t)slot >= s->slot_count)
        return LC_EINVAL;
    return (int64_t)(s->slot_offset + (uint64_t)slot * s->slot_size);
}

LC_EXPORT int lc_stream_ring_fd(const lc_stream *s)
{
    if (!s || s->ring_fd < 0)
        return LC_EBADF;
    int fd = fcntl(s->ring_fd, F_DUPFD_CLOEXEC, 0);
    return fd < 0 ? ld_from_errno(errno) : fd;
}

/* Reads one entry of the open reply's "fields" and checks it fits a slot. */
static int client_parse_field(const cJSON *jf, int i, const struct lc_stream *s, struct client_field *f,
                              char *msg)
{
    const char *name = NULL, *dtype_name = NULL;
    bool ragged = false;
    int64_t offset = 0, v = 0;
    char sub[LD_ERRMSG_MAX];
    int ret;
    memset(f, 0, sizeof *f);
    if (!cJSON_IsObject(jf)) {
        client_msgf(msg, "fields[%d] is not an object", i);
        return LC_EPROTO;
    }
    if ((ret = proto_get_str(jf, "name", LD_NAME_MAX - 1, &name, sub)) < 0 ||
        (ret = proto_get_str(jf, "dtype", 15, &dtype_name, sub)) < 0 ||
        (ret = proto_get_bool(jf, "ragged", &ragged, sub)) < 0 ||
        (ret = proto_get_int(jf, "offset", (int64_t)sizeof(struct ld_slot_header), (int64_t)s->slot_size,
                             &offset, sub)) < 0) {
        client_msgf(msg, "fields[%d]: %s", i, sub);
        return LC_EPROTO;
    }
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = proto_dtype_from_name(dtype_name);
    if (f->dtype < 0) {
        client_msgf(msg, "field '%s': unknown dtype '%s'", name, dtype_name);
        return LC_EPROTO;
    }
    f->ragged = ragged;
    f->offset = (uint64_t)offset;
    if (f->offset % LD_FIELD_ALIGN) {
        client_msgf(msg, "field '%s': offset %llu is not a multiple of %u", name,
                 (unsigned long long)f->offset, LD_FIELD_ALIGN);
        return LC_EPROTO;
    }
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(jf, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > LD_MAX_DIMS) {
        client_msgf(msg, "field '%s': 'shape' must be an array of at most %d integers", name,
                 LD_MAX_DIMS);
        return LC_EPROTO;
    }
    uint64_t row = proto_dtype_size(f->dtype);
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        /* Each dim below 2^31 and the running product below 2^40 keeps every size
         * computation here far from overflow. */
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > (double)INT32_MAX ||
            d->valuedouble != (double)(int64_t)d->valuedouble) {
            client_msgf(msg, "field '%s': 'shape' must hold integers in [0, %d]", name, INT32_MAX);
            return LC_EPROTO;
        }
        f->shape[f->ndim++] = (int64_t)d->valuedouble;
        row *= (uint64_t)(int64_t)d->valuedouble;
        if (row > (1ull << 40)) {
            client_msgf(msg, "field '%s': a sample is implausibly large", name);
            return LC_EPROTO;
        }
    }
    if (!ragged) {
        f->row_bytes = row;
        if (f->offset + row * s->batch_size > s->slot_size) {
            client_msgf(msg, "field '%s': %u rows of %llu bytes at offset %llu overrun the %llu-byte slot",
                     name, s->batch_size, (unsigned long long)row, (unsigned long long)f->offset,
                     (unsigned long long)s->slot_size);
            return LC_EPROTO;
        }
        return 0;
    }
    if (f->ndim != 0) {
        client_msgf(msg, "field '%s': a ragged field must have shape []", name);
        return LC_EPROTO;
    }
    if ((ret = proto_get_int(jf, "offsets_offset", (int64_t)sizeof(struct ld_slot_header),
                             (int64_t)s->slot_size, &v, sub)) < 0) {
        client_msgf(msg, "field '%s': %s", name, sub);
        return LC_EPROTO;
    }
    f->offsets_offset = (uint64_t)v;
    if ((ret = proto_get_int(jf, "capacity", 0, (int64_t)s->slot_size, &v, sub)) < 0) {
        client_msgf(msg, "field '%s': %s", name, sub);
        return LC_EPROTO;
    }
    f->capacity = (uint64_t)v;
    if (f->offsets_offset % LD_FIELD_ALIGN ||
        f->offsets_offset + ((uint64_t)s->batch_size + 1) * sizeof(int64_t) > s->slot_size ||
        f->offset + f->capacity > s->slot_size) {
        snprintf(msg, LD_ERRMSG_MAX,
                 "field '%s': offsets at %llu or %llu bytes of data at %llu do not fit the %llu-byte slot",
                 name, (unsigned long long)f->offsets_offset, (unsigned long long)f->capacity,
                 (unsigned long long)f->offset, (unsigned long long)s->slot_size);
        return LC_EPROTO;
    }
    return 0;
}

/* Reads the open reply into s (everything but the mapping). */
int client_parse_open(const cJSON *reply, uint32_t batch_size, lc_stream *s, const char **ret_shm,
                             int64_t *ret_shm_size, char *msg)
{
    int64_t v[8];
    const char *shm = NULL;
    char sub[LD_ERRMSG_MAX];
    int ret;
    if ((ret = proto_get_int(reply, "stream", 0, LD_JSON_SAFE_INT, &v[0], sub)) < 0 ||
        (ret = proto_get_str(reply, "shm", LD_SHM_NAME_MAX - 1, &shm, sub)) < 0 ||
        (ret = proto_get_int(reply, "shm_size", (int64_t)LD_RING_ALIGN, INT64_MAX / 2, &v[1], sub)) < 0 ||
        (ret = proto_get_int(reply, "slot_count", 1, LD_SLOT_COUNT_MAX, &v[2], sub)) < 0 ||
        (ret = proto_get_int(reply, "slot_size", (int64_t)LD_RING_ALIGN, INT64_MAX / 2, &v[3], sub)) < 0 ||
        (ret = proto_get_int(reply, "slot_offset", (int64_t)LD_RING_ALIGN, INT64_MAX / 2, &v[4], sub)) < 0 ||
        (ret = proto_get_int(reply, "batches_per_epoch", 0, LD_JSON_SAFE_INT, &v[5], sub)) < 0 ||
        (ret = proto_get_int(reply, "samples_per_epoch", 0, LD_JSON_SAFE_INT, &v[6], sub)) < 0 ||
        (ret = proto_opt_int(reply, "batch_size", 1, 65536, batch_size, &v[7], sub)) < 0) {
        client_msgf(msg, "%s", sub);
        return LC_EPROTO;
    }
    if (shm[0] != '/' || strchr(shm + 1, '/')) {
        client_msgf(msg, "'shm' is not a shared-memory name: %s", shm);
        return LC_EPROTO;
    }
    if (v[7] != batch_size) {
        client_msgf(msg, "batch_size %lld, asked for %u", (long long)v[7], batch_size);
        return LC_EPROTO;
    }
    s->id = (uint64_t)v[0];
    /* A consumer of a shared stream maps the ring of the stream that fills it. */
    if ((ret = proto_opt_int(reply, "ring_stream", 0, LD_JSON_SAFE_INT, v[0], &v[0], sub)) < 0) {
        client_msgf(msg, "%s", sub);
        return LC_EPROTO;
    }
    s->ring_id = (uint64_t)v[0];
    s->slot_count = (uint32_t)v[2];
    s->slot_size = (uint64_t)v[3];
    s->slot_offset = (uint64_t)v[4];
    s->batches_per_epoch = (uint64_t)v[5];
    s->samples_per_epoch = (uint64_t)v[6];
    s->batch_size = batch_size;
    /* slot_count <= LD_SLOT_COUNT_MAX and slot_size < 2^62 could still overflow: divide instead. */
    if (s->slot_size % LD_RING_ALIGN || s->slot_offset % LD_RING_ALIGN ||
        s->slot_offset > (uint64_t)v[1] ||
        s->slot_size > ((uint64_t)v[1] - s->slot_offset) / s->slot_count) {
        client_msgf(msg, "%u slots of %llu bytes at offset %llu do not fit shm_size %lld",
                 s->slot_count, (unsigned long long)s->slot_size, (unsigned long long)s->slot_offset,
                 (long long)v[1]);
        return LC_EPROTO;
    }
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(reply, "fields");
    int n = cJSON_IsArray(fields) ? cJSON_GetArraySize(fields) : -1;
    if (n < 1 || n > LD_MAX_FIELDS) {
        client_msgf(msg, "'fields' must be an array of 1 to %d fields", LD_MAX_FIELDS);
        return LC_EPROTO;
    }
    for (int i = 0; i < n; i++) {
        ret = client_parse_field(cJSON_GetArrayItem(fields, i), i, s, &s->fields[i], msg);
        if (ret < 0)
            return ret;
        for (int j = 0; j < i; j++) {
            if (strcmp(s->fields[j].name, s->fields[i].name) == 0) {
                client_msgf(msg, "field '%s' appears twice", s->fields[i].name);
                return LC_EPROTO;
            }
        }
    }
    s->n_fields = n;
    *ret_shm = shm;
    *ret_shm_size = v[1];
    return 0;
}

/* Maps the ring read-only and checks its header against the open reply. */
int client_map_ring(lc_stream *s, const char *shm, uint64_t shm_size, char *msg)
{
    struct stat st;
    void *map = MAP_FAILED;
    int ret;
    int fd = shm_open(shm, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot open shared memory %s: %s", shm, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot stat shared memory %s: %s", shm, strerror(errno));
        goto out;
    }
    /* Only the daemon may have made it, and only the daemon may write it: a batch is
     * read in place, and anyone who could write the object could change it. */
    if (st.st_uid != s->client->server_uid || (st.st_mode & 0022)) {
        ret = LC_EPERM;
        client_msgf(msg, "shared memory %s belongs to uid %u with mode 0%03o; expected loaderd's uid %u and no "
                    "write access for group or others: refusing to map it",
                    shm, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)s->client->server_uid);
        goto out;
    }
    /* Mapping past the object's end would turn a short object into a SIGBUS later. */
    if ((uint64_t)st.st_size < shm_size) {
        ret = LC_EPROTO;
        client_msgf(msg, "shared memory %s holds %lld bytes, loaderd said %llu", shm,
                 (long long)st.st_size, (unsigned long long)shm_size);
        goto out;
    }
    map = mmap(NULL, shm_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot map shared memory %s (%llu bytes): %s", shm,
                 (unsigned long long)shm_size, strerror(errno));
        goto out;
    }
    const struct ld_ring_header *h = map;
    if (h->magic != LD_RING_MAGIC || h->version != LD_RING_VERSION || h->slot_count != s->slot_count ||
        h->slot_size != s->slot_size || h->slot_offset != s->slot_offset || h->total_size != shm_size ||
        h->stream_id != s->ring_id) {
        ret = LC_EPROTO;
        snprintf(msg, LD_ERRMSG_MAX,
                 "ring header of %s does not match the open reply (magic 0x%08x version %u, %u slots of "
                 "%llu bytes at %llu, total %llu, stream %llu)",
                 shm, h->magic, h->version, h->slot_count, (unsigned long long)h->slot_size,
                 (unsigned long long)h->slot_offset, (unsigned long long)h->total_size,
                 (unsigned long long)h->stream_id);
        goto out;
    }
    s->map = map;
    s->map_size = shm_size;
    map = MAP_FAILED;
    /* Kept for lc_stream_ring_fd: the name goes away once the stream delivered a batch. */
    s->ring_fd = fd;
    fd = -1;
    ret = 0;
out:
    if (map != MAP_FAILED)
        munmap(map, shm_size);
    if (fd >= 0)
        close(fd);
    return ret;
}

/* Closes stream `id` on the daemon, for an open whose reply we could not use. */
static void client_close_remote(lc_client *c, uint64_t id)
{
    cJSON *msg = cJSON_CreateObject(), *reply = NULL;
    char saved[CLIENT_ERRMSG_MAX];
    snprintf(saved, sizeof saved, "%s", c->error);
    if (msg && cJSON_AddStringToObject(msg, "op", LD_OP_CLOSE) &&
        cJSON_AddNumberToObject(msg, "stream", (double)id)) {
        if (client_call(c, msg, LD_OP_CLOSE, c->timeout_ms, &reply) == 0)
            cJSON_Delete(reply);
    } else {
        cJSON_Delete(msg);
    }
    snprintf(c->error, sizeof c->error, "%s", saved);
}

/* Values sent as JSON numbers must survive the trip through a double. */
static int client_check_u64(lc_client *c, const char *name, uint64_t v)
{
    if (v <= (uint64_t)LD_JSON_SAFE_INT)
        return 0;
    client_seterr(c, "field '%s': expected an integer in [0, %lld], got %llu", name, LD_JSON_SAFE_INT,
                  (unsigned long long)v);
    return LC_EFIELD;
}

/* An option that carries a JSON object (NULL: not given): LC_EINVAL when it is not one. */
static int client_check_object(lc_client *c, const char *what, const char *json)
{
    if (!json)
        return 0;
    cJSON *o = cJSON_Parse(json);
    bool ok = cJSON_IsObject(o);
    cJSON_Delete(o);
    if (ok)
        return 0;
    client_seterr(c, "lc_stream_open: %s is not a JSON object: %.200s", what, json);
    return LC_EINVAL;
}

LC_EXPORT int lc_stream_open(lc_client *c, const char *dataset, const lc_stream_options *opts,
                             lc_stream **ret_stream)
{
    char msg[LD_ERRMSG_MAX];
    lc_stream_options opt;
    const lc_stream_options *o = &opt;
    cJSON *req = NULL, *reply = NULL;
    lc_stream *s = NULL;
    bool remote = false;
    int64_t sid = -1, shm_size = 0;
    const char *shm = NULL;
    int ret;
    if (!c)
        return LC_EINVAL;
    if (!opts || !ret_stream) {
        client_seterr(c, "lc_stream_open: options and ret_stream are required");
        return LC_EINVAL;
    }
    lc_stream_options_init(&opt);
    if ((ret = client_copy_struct_in(&opt, sizeof opt, opts, opts->struct_size, CLIENT_OPTIONS_V0_SIZE,
                                     "lc_stream_options", msg)) < 0) {
        client_seterr(c, "lc_stream_open: %s", msg);
        return ret;
    }
    if (!dataset && !o->spec) {
        client_seterr(c, "lc_stream_open: a dataset name or options.spec is required");
        return LC_EINVAL;
    }
    if ((ret = client_check_object(c, "spec", o->spec)) < 0 ||
        (ret = client_check_object(c, "device_normalize", o->device_normalize)) < 0)
        return ret;
    if (c->broken && (ret = client_check_usable(c)) < 0)
        return ret;
    if ((ret = client_check_u64(c, "seed", o->seed)) < 0 || (ret = client_check_u64(c, "epoch", o->epoch)) < 0 ||
        (ret = client_check_u64(c, "start_batch", o->start_batch)) < 0 ||
        (ret = client_check_u64(c, "epochs", o->epochs)) < 0)
        return ret;
    if (o->share_join != LC_SHARE_JOIN_CURRENT && o->share_join != LC_SHARE_JOIN_EPOCH_START) {
        client_seterr(c, "lc_stream_open: share_join must be LC_SHARE_JOIN_CURRENT or LC_SHARE_JOIN_EPOCH_START, got %d",
                      o->share_join);
        return LC_EINVAL;
    }
    req = client_open_request(dataset, o, o->epoch, o->start_batch, o->epochs, client_handoff_wanted(o));
    if (!req) {
        client_seterr(c, "out of memory building 'open'");
        return LC_ENOMEM;
    }
    if ((ret = client_reconnect(c, client_now_ms() + c->timeout_ms, c->timeout_ms)) < 0) {
        cJSON_Delete(req);
        return ret;
    }
    ret = client_call(c, req, LD_OP_OPEN, c->timeout_ms, &reply);
    if (ret < 0)
        goto out;
    s = calloc(1, sizeof *s);
    if (!s) {
        ret = LC_ENOMEM;
        client_seterr(c, "out of memory");
        goto out;
    }
    s->client = c;
    s->ring_fd = -1;
    s->reopen_id = -1;
    s->opts = *o;
    s->next_epoch = o->epoch;
    s->next_batch = o->start_batch;
    s->dev_ordinal = -1;
    s->opts.device = NULL;
    s->opts.device_normalize = NULL;
    s->opts.spec = NULL;
    /* A reopen (after a daemon restart, or a detach) resumes at the exact batch this
     * stream reached: in a stream of its own, never at a shared stream's front. */
    s->opts.share = NULL;
    /* Once the daemon holds a stream for us, every failure below must close it. */
    if (proto_get_int(reply, "stream", 0, LD_JSON_SAFE_INT, &sid, msg) == 0)
        remote = true;
    s->dataset = strdup(dataset ? dataset : "spec");
    /* The reopen after a daemon restart asks for the same device and the same declared
     * dataset: copies of ours. */
    s->dev_name = o->device ? strdup(o->device) : NULL;
    s->dev_norm = o->device_normalize ? strdup(o->device_normalize) : NULL;
    s->spec = o->spec ? strdup(o->spec) : NULL;
    s->spec_template = o->spec && dataset;
    s->opts.device = s->dev_name;
    s->opts.device_normalize = s->dev_norm;
    s->opts.spec = s->spec;
    if (!s->dataset || (o->device && !s->dev_name) || (o->device_normalize && !s->dev_norm) ||
        (o->spec && !s->spec)) {
        ret = LC_ENOMEM;
        client_seterr(c, "out of memory");
        goto out;
    }
    ret = client_parse_open(reply, o->batch_size, s, &shm, &shm_size, msg);
    if (ret < 0) {
        client_seterr(c, "malformed open reply from loaderd: %s", msg);
        goto out;
    }
    if ((uint64_t)shm_size > SIZE_MAX) {
        ret = LC_EPROTO;
        client_seterr(c, "ring of %lld bytes cannot be mapped here", (long long)shm_size);
        goto out;
    }
    ret = client_map_ring(s, shm, (uint64_t)shm_size, msg);
    if (ret < 0) {
        client_seterr(c, "%s", msg);
        goto out;
    }
    /* A stream that joined a shared one starts where the group is. */
    int64_t e = 0, b = 0;
    if (proto_opt_int(reply, "start_epoch", 0, LD_JSON_SAFE_INT, (int64_t)o->epoch, &e, msg) < 0 ||
        proto_opt_int(reply, "start_batch", 0, LD_JSON_SAFE_INT, (int64_t)o->start_batch, &b, msg) < 0) {
        ret = LC_EPROTO;
        client_seterr(c, "malformed open reply from loaderd: %s", msg);
        goto out;
    }
    s->next_epoch = (uint64_t)e;
    s->next_batch = (uint64_t)b;
    if (o->device && strncmp(o->device, "cuda:", 5) == 0) {
        /* The daemon accepted the name, so it is "cuda:N". */
        int ordinal = atoi(o->device + 5);
        ret = client_device_open(s, reply, ordinal, msg);
        if (ret < 0) {
            client_seterr(c, "%s", msg);
            goto out;
        }
        s->dev_ordinal = ordinal;
    }
    ret = client_handoff_attach(s, reply, msg);
    if (ret < 0) {
        client_seterr(c, "%s", msg);
        goto out;
    }
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    *ret_stream = s;
    s = NULL;
    remote = false;
    ret = 0;
out:
    if (remote)
        client_close_remote(c, (uint64_t)sid);
    client_stream_free(s);
    cJSON_Delete(reply);
    return ret;
}

const struct ld_slot_header *client_stream_slot(const lc_stream *s, int slot)
{
    return (const struct ld_slot_header *)(const void *)(s->map + s->slot_offset + (uint64_t)slot * s->slot_size);
}

LC_EXPORT int lc_stream_close(lc_stream *s)
{
    cJSON *reply = NULL;
    int ret = 0;
    if (!s)
        return 0;
    lc_client *c = s->client;
    /* The daemon releases every slot of a closed stream: no release per batch. */
    while (s->batches) {
        lc_batch *b = s->batches;
        s->batches = b->next;
        client_batch_free(b);
    }
    for (unsigned k = 0; k < CLIENT_READ_AHEAD; k++) {
        cJSON_Delete(s->ahead_reply[k]);
        s->ahead_reply[k] = NULL;
    }
    s->ahead_count = 0;
    client_device_close(s); /* the daemon frees the device ring once the stream is closed */
    client_handoff_close(s);
    /* A reopen still under way: its reply names the stream to close. */
    if (s->reopen_id >= 0 && !c->lost && !c->broken) {
        int64_t deadline = client_now_ms() + c->timeout_ms;
        if (client_wait(c, s->reopen_id, deadline, c->timeout_ms, &reply) == 0)
            client_stream_reopened(s, reply);
        reply = NULL;
    }
    client_pending_forget_stream(c, s);
    /* A stream of a lost connection, or one whose reopen failed, holds nothing on the
     * daemon: the connection's end freed it. */
    bool remote = !c->broken && !c->lost && !s->needs_reopen && s->reopen_id < 0 && !s->failed && s->map;
    if (remote) {
        cJSON *req = cJSON_CreateObject();
        if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_CLOSE) ||
            !cJSON_AddNumberToObject(req, "stream", (double)s->id)) {
            cJSON_Delete(req);
            client_seterr(c, "out of memory building 'close'");
            ret = LC_ENOMEM;
        } else {
            ret = client_call(c, req, LD_OP_CLOSE, c->timeout_ms, &reply);
            cJSON_Delete(reply);
            /* The daemon went away meanwhile: the stream went with it. */
            if (ret < 0 && c->lost)
                ret = 0;
        }
    }
    /* The close's reply came after those of every release sent before it. */
    if (ret == 0)
        ret = client_take_release_failure(c);
    if (s->prev)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    client_stream_free(s);
    return ret;
}

/* Frees a stream unlinked from its client: its batches (invalid from now on), the
 * replies it kept, its mapping and the ring's descriptor. No word to the daemon. */
void client_stream_free(lc_stream *s)
{
    if (!s)
        return;
    while (s->batches) {
        lc_batch *b = s->batches;
        s->batches = b->next;
        client_batch_free(b);
    }
    for (unsigned k = 0; k < CLIENT_READ_AHEAD; k++)
        cJSON_Delete(s->ahead_reply[k]);
    free(s->dataset);
    free(s->dev_name);
    free(s->dev_norm);
    free(s->spec);
    client_device_close(s); /* before the mapping goes: it may be pinned */
    client_handoff_close(s);
    if (s->map)
        munmap((void *)s->map, s->map_size);
    if (s->ring_fd >= 0)
        close(s->ring_fd);
    free(s);
}
