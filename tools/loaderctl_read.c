/* loaderctl_read — `loaderctl read`, the benchmark client: it attaches as a trainer
 * would, opens a stream, takes every batch and releases it at once (or after reading
 * every byte with --touch, hashing them into a checksum that two runs can compare), and
 * reports the time from open to the first batch, then samples/s and MB/s per epoch, so
 * that the daemon's throughput can be measured without Python. */
#include "loaderctl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

static double ctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct ctl_epoch {
    uint64_t epoch, samples, batches, bytes;
    double seconds;
};

static cJSON *ctl_epoch_json(const struct ctl_epoch *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch", (double)e->epoch);
    cJSON_AddNumberToObject(o, "samples", (double)e->samples);
    cJSON_AddNumberToObject(o, "batches", (double)e->batches);
    cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
    cJSON_AddNumberToObject(o, "seconds", e->seconds);
    cJSON_AddNumberToObject(o, "samples_per_s", e->seconds > 0 ? (double)e->samples / e->seconds : 0.0);
    cJSON_AddNumberToObject(o, "mb_per_s", e->seconds > 0 ? (double)e->bytes / 1e6 / e->seconds : 0.0);
    return o;
}

static void ctl_epoch_print(const struct ctl_epoch *e)
{
    printf("epoch %" PRIu64 ": %" PRIu64 " samples, %" PRIu64 " batches in %.3f s: %.0f samples/s, %.1f MB/s\n",
           e->epoch, e->samples, e->batches, e->seconds, e->seconds > 0 ? (double)e->samples / e->seconds : 0.0,
           e->seconds > 0 ? (double)e->bytes / 1e6 / e->seconds : 0.0);
    fflush(stdout);
}

static int ctl_read(lc_client *c, const struct ctl_opts *o, const char *dataset, const lc_stream_options *so,
                    bool touch)
{
    char what[128];
    lc_stream *s = NULL;
    struct ctl_epoch *epochs = NULL;
    size_t n_epochs = 0;
    /* --touch: every byte of every field, in order, through XXH3 (order-sensitive, and as
     * fast as the memory: a trainer's own read of a batch costs about that, a hand-written
     * byte fold cost 3-4 times more per byte and was counted against loaderd). */
    XXH3_state_t *hash = NULL;
    uint64_t checksum = 0;
    double first_ms = -1;
    int ret = 1;
    const char *label = dataset ? dataset : "spec";
    snprintf(what, sizeof what, "read %s", label);

    epochs = calloc(so->epochs, sizeof *epochs);
    if (touch && (hash = XXH3_createState()) != NULL)
        XXH3_64bits_reset(hash);
    if (!epochs || (touch && !hash)) {
        ctl_fail(what, "out of memory");
        goto out;
    }
    double t0 = ctl_now();
    int r = lc_stream_open(c, dataset, so, &s);
    if (r < 0) {
        ctl_fail(what, lc_client_error(c));
        goto out;
    }
    if (!o->json) {
        printf("loaderctl read %s%s: batch %u, shuffle %s, seed %" PRIu64 ", %" PRIu64 " epoch%s", label,
               dataset && so->spec ? "+spec" : "",
               so->batch_size, so->shuffle ? "on" : "off", so->seed, so->epochs, so->epochs == 1 ? "" : "s");
        if (so->world_size > 1)
            printf(", rank %d of %d", so->rank, so->world_size);
        printf("\n");
        fflush(stdout);
    }
    double t_mark = t0; /* where the current epoch's time starts */
    double t_last = t0; /* after the latest release */
    struct ctl_epoch *cur = NULL;
    for (;;) {
        lc_batch *b = NULL;
        r = lc_stream_next(s, 0, &b);
        /* A daemon that restarts under us: the library reconnects within its reconnect
         * time and goes on at the batch we had reached; a timeout meanwhile is no failure. */
        if (r == LC_ETIMEDOUT && lc_client_reconnecting(c))
            continue;
        if (r == LC_EEND)
            break;
        if (r < 0) {
            char w[160];
            snprintf(w, sizeof w, "%s: next batch", what);
            ctl_fail(w, lc_client_error(c));
            goto out;
        }
        if (first_ms < 0) {
            first_ms = (ctl_now() - t0) * 1e3;
            if (!o->json) {
                printf("first batch: %.1f ms after open\n", first_ms);
                fflush(stdout);
            }
        }
        if (!cur || cur->epoch != lc_batch_epoch(b)) {
            if (cur) {
                cur->seconds = t_last - t_mark;
                t_mark = t_last;
                if (!o->json)
                    ctl_epoch_print(cur);
            }
            if (n_epochs == so->epochs) { /* more epochs than asked: a daemon bug */
                lc_batch_release(b);
                ctl_fail(what, "loaderd delivered more epochs than asked for");
                goto out;
            }
            cur = &epochs[n_epochs++];
            cur->epoch = lc_batch_epoch(b);
        }
        int nf = lc_batch_field_count(b);
        for (int i = 0; i < nf; i++) {
            lc_field f;
            if (lc_batch_field(b, i, &f) < 0)
                continue;
            cur->bytes += f.nbytes;
            if (touch) {
                /* The field's length first: bytes moved from one field to the next
                 * change the checksum too. */
                uint64_t n = f.nbytes;
                XXH3_64bits_update(hash, &n, sizeof n);
                XXH3_64bits_update(hash, f.data, f.nbytes);
            }
        }
        cur->samples += lc_batch_rows(b);
        cur->batches++;
        r = lc_batch_release(b);
        t_last = ctl_now();
        if (r < 0) {
            char w[160];
            snprintf(w, sizeof w, "%s: release", what);
            ctl_fail(w, lc_client_error(c));
            goto out;
        }
    }
    if (cur) {
        cur->seconds = t_last - t_mark;
        if (!o->json)
            ctl_epoch_print(cur);
    }
    double total_s = t_last - t0;
    uint64_t samples = 0, bytes = 0;
    for (size_t i = 0; i < n_epochs; i++) {
        samples += epochs[i].samples;
        bytes += epochs[i].bytes;
    }
    r = lc_stream_close(s);
    s = NULL;
    if (r < 0) {
        char w[160];
        snprintf(w, sizeof w, "%s: close", what);
        ctl_fail(w, lc_client_error(c));
        goto out;
    }
    if (touch)
        checksum = XXH3_64bits_digest(hash);
    double sps = total_s > 0 ? (double)samples / total_s : 0.0;
    double mbps = total_s > 0 ? (double)bytes / 1e6 / total_s : 0.0;
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *arr = cJSON_CreateArray();
        cJSON_AddStringToObject(j, "dataset", label);
        cJSON_AddNumberToObject(j, "batch_size", so->batch_size);
        for (size_t i = 0; i < n_epochs; i++)
            cJSON_AddItemToArray(arr, ctl_epoch_json(&epochs[i]));
        cJSON_AddItemToObject(j, "epochs", arr);
        cJSON_AddNumberToObject(j, "first_batch_ms", first_ms < 0 ? 0.0 : first_ms);
        cJSON_AddNumberToObject(j, "samples", (double)samples);
        cJSON_AddNumberToObject(j, "bytes", (double)bytes);
        cJSON_AddNumberToObject(j, "seconds", total_s);
        cJSON_AddNumberToObject(j, "samples_per_s", sps);
        cJSON_AddNumberToObject(j, "mb_per_s", mbps);
        if (touch) {
            /* A string: a 64-bit value does not survive JSON's doubles. */
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, checksum);
            cJSON_AddStringToObject(j, "checksum", hex);
        }
        char *text = cJSON_Print(j);
        if (text)
            puts(text);
        cJSON_free(text);
        cJSON_Delete(j);
    } else {
        printf("total: %" PRIu64 " samples in %.3f s: %.0f samples/s, %.1f MB/s\n", samples, total_s, sps, mbps);
        if (touch)
            printf("checksum: %016" PRIx64 "\n", checksum);
    }
    ret = 0;
out:
    lc_stream_close(s);
    XXH3_freeState(hash);
    free(epochs);
    return ret;
}

/* Parses `read`'s arguments (argv[0] is "read"). */
int ctl_cmd_read(lc_client **pc, struct ctl_opts *o, int argc, char **argv)
{
    lc_stream_options so;
    const char *dataset = NULL;
    bool touch = false;
    uint64_t v;
    lc_stream_options_init(&so);
    so.batch_size = 64;
    so.epochs = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define CTL_NUM(flag, min, max, target)                                                              \
    if (strcmp(a, flag) == 0) {                                                                      \
        if (ctl_parse_u64(val, (min), (max), &v) < 0)                                                \
            return ctl_usage_error("%s needs an integer in [%llu, %llu]", flag,                      \
                                   (unsigned long long)(min), (unsigned long long)(max));            \
        target = v;                                                                                  \
        i++;                                                                                         \
        continue;                                                                                    \
    }
        /* The protocol's limits, from the library; epoch_max is also the largest integer JSON
         * carries exactly, the bound of seeds and batch numbers. */
        CTL_NUM("--epochs", 1, 1000000, so.epochs)
        CTL_NUM("--batch-size", 1, (uint64_t)lc_limit("batch_size_max"), so.batch_size)
        CTL_NUM("--seed", 0, (uint64_t)lc_limit("epoch_max"), so.seed)
        CTL_NUM("--epoch", 0, (uint64_t)lc_limit("epoch_max"), so.epoch)
        CTL_NUM("--rank", 0, (uint64_t)lc_limit("world_size_max") - 1, so.rank)
        CTL_NUM("--world-size", 1, (uint64_t)lc_limit("world_size_max"), so.world_size)
        CTL_NUM("--start-batch", 0, (uint64_t)lc_limit("epoch_max"), so.start_batch)
        CTL_NUM("--prefetch", 1, (uint64_t)lc_limit("prefetch_max"), so.prefetch)
#undef CTL_NUM
        if (strcmp(a, "--no-shuffle") == 0) {
            so.shuffle = 0;
        } else if (strcmp(a, "--drop-last") == 0) {
            so.drop_last = 1;
        } else if (strcmp(a, "--touch") == 0) {
            touch = true;
        } else if (strcmp(a, "--handoff") == 0) {
            if (!val || (strcmp(val, "shm") != 0 && strcmp(val, "socket") != 0))
                return ctl_usage_error("--handoff needs shm or socket");
            so.handoff = strcmp(val, "socket") == 0 ? LC_HANDOFF_SOCKET : LC_HANDOFF_SHM;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            o->json = true;
        } else if (strcmp(a, "--share") == 0) {
            if (!val || !*val)
                return ctl_usage_error("--share needs a name (or auto)");
            so.share = argv[++i]; /* a shared stream (README "Shared streams") */
        } else if (strcmp(a, "--spec") == 0) {
            if (!val)
                return ctl_usage_error("--spec needs a JSON object (a dataset's keys)");
            so.spec = argv[++i]; /* a declared dataset, or the keys that refine DATASET */
        } else if (a[0] == '-' && a[1] != '\0') {
            return ctl_usage_error("read: unknown option %s", a);
        } else if (!dataset) {
            dataset = a;
        } else {
            return ctl_usage_error("read: one dataset only (got %s and %s)", dataset, a);
        }
    }
    if (!dataset && !so.spec)
        return ctl_usage_error("read: which dataset? (a configured name, or --spec JSON)");
    *pc = ctl_connect(o);
    if (!*pc)
        return 1;
    return ctl_read(*pc, o, dataset, &so, touch);
}
