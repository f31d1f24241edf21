/* cache_report — the JSON side of the cache, for the op handlers; see cache_report.h.
 * Sizes and counts in these objects stay far below 2^53, so they are JSON numbers; the
 * fingerprint does not, so it is 16 hex digits. */
#include "cache_report.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "ld_error.h"
#include "ld_wire.h"

int cache_report_file(const cache *c, cJSON *out)
{
    const struct cache_meta *m = cache_meta(c);
    char hex[17], when[64] = "";
    uint64_t hits, hit_bytes;
    struct tm tm;
    time_t sec = (time_t)(m->build_time_ns / 1000000000u);

    snprintf(hex, sizeof hex, "%016" PRIx64, m->fingerprint);
    if (gmtime_r(&sec, &tm)) {
        size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof when - n, ".%09" PRIu64 "Z", m->build_time_ns % 1000000000u);
    }
    cache_hits(c, &hits, &hit_bytes);

    cJSON *fields = cJSON_CreateArray();
    if (!fields)
        return LD_ENOMEM;
    for (int k = 0; k < m->n_fields; k++) {
        const struct dataset_field *f = &m->fields[k];
        cJSON *jf = cJSON_CreateObject();
        cJSON *shape = cJSON_CreateArray();
        if (!jf || !shape) {
            cJSON_Delete(jf);
            cJSON_Delete(shape);
            cJSON_Delete(fields);
            return LD_ENOMEM;
        }
        cJSON_AddItemToArray(fields, jf);
        cJSON_AddItemToObject(jf, "shape", shape);
        for (int j = 0; j < f->ndim; j++)
            if (!cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)f->shape[j]))) {
                cJSON_Delete(fields);
                return LD_ENOMEM;
            }
        const char *dtype = proto_dtype_name(f->dtype);
        if (!cJSON_AddStringToObject(jf, "name", f->name) ||
            !cJSON_AddStringToObject(jf, "dtype", dtype ? dtype : "?") ||
            !cJSON_AddBoolToObject(jf, "ragged", f->ragged) ||
            !cJSON_AddNumberToObject(jf, "max_item_bytes", (double)f->max_item_bytes)) {
            cJSON_Delete(fields);
            return LD_ENOMEM;
        }
    }
    if (!cJSON_AddItemToObject(out, "fields", fields)) {
        cJSON_Delete(fields);
        return LD_ENOMEM;
    }
    if (!cJSON_AddStringToObject(out, "path", cache_path(c)) ||
        !cJSON_AddNumberToObject(out, "version", m->version) ||
        !cJSON_AddNumberToObject(out, "flags", m->flags) ||
        !cJSON_AddNumberToObject(out, "count", (double)m->count) ||
        !cJSON_AddStringToObject(out, "fingerprint", hex) ||
        !cJSON_AddStringToObject(out, "kind", m->kind) ||
        !cJSON_AddStringToObject(out, "name", m->name) ||
        !cJSON_AddStringToObject(out, "source", m->source) ||
        !cJSON_AddNumberToObject(out, "label_field", m->label_field) ||
        !cJSON_AddStringToObject(out, "build_time", when) ||
        !cJSON_AddNumberToObject(out, "build_time_unix", (double)sec) ||
        !cJSON_AddNumberToObject(out, "file_size", (double)m->file_size) ||
        !cJSON_AddNumberToObject(out, "data_bytes", (double)m->data_bytes) ||
        !cJSON_AddNumberToObject(out, "sample_bytes", (double)m->sample_bytes) ||
        !cJSON_AddNumberToObject(out, "max_sample_bytes", (double)m->max_sample_bytes) ||
        !cJSON_AddNumberToObject(out, "hits", (double)hits) ||
        !cJSON_AddNumberToObject(out, "hit_bytes", (double)hit_bytes))
        return LD_ENOMEM;
    return 0;
}

int cache_report_keeper(const cache_keeper *k, cJSON *out)
{
    struct cache_keeper_stats st;
    cache_keeper_stats(k, &st);
    if (!cJSON_AddStringToObject(out, "state", st.state) || !cJSON_AddStringToObject(out, "path", st.path) ||
        !cJSON_AddStringToObject(out, "mode", st.mode))
        return LD_ENOMEM;
    if (st.progress >= 0 && !cJSON_AddNumberToObject(out, "progress", st.progress))
        return LD_ENOMEM;
    if (!cJSON_AddNumberToObject(out, "hits", (double)st.hits) ||
        !cJSON_AddNumberToObject(out, "hit_bytes", (double)st.hit_bytes) ||
        !cJSON_AddNumberToObject(out, "attached", (double)st.attached) ||
        !cJSON_AddNumberToObject(out, "mapped", (double)st.mapped))
        return LD_ENOMEM;
    if (st.error && !cJSON_AddStringToObject(out, "error", st.error))
        return LD_ENOMEM;
    if (st.file) {
        cJSON *file = cJSON_AddObjectToObject(out, "file");
        if (!file)
            return LD_ENOMEM;
        return cache_report_file(st.file, file);
    }
    return 0;
}
