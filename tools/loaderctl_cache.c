/* loaderctl_cache — `loaderctl cache build|verify|info DATASET`: build a dataset's
 * packed cache now and follow its progress, check every sample against its checksum,
 * or show the cache's state, header and hits. */
#include "loaderctl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Sends {"op": op, "dataset": name[, "force": true]} and returns the reply, or NULL
 * after printing why. */
static cJSON *ctl_cache_request(lc_client *c, const char *op, const char *dataset, bool force)
{
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "op", op);
    cJSON_AddStringToObject(req, "dataset", dataset);
    if (force)
        cJSON_AddBoolToObject(req, "force", true);
    char *text = cJSON_PrintUnformatted(req), what[96];
    cJSON_Delete(req);
    snprintf(what, sizeof what, "%s %s", op, dataset);
    if (!text) {
        ctl_fail(what, "out of memory");
        return NULL;
    }
    cJSON *reply = ctl_request_text(c, text, what);
    cJSON_free(text);
    return reply;
}

static void ctl_cache_print(const cJSON *r)
{
    char state[160], size[32], hb[32];
    ctl_cache_state(r, state, sizeof state);
    ctl_fmt_bytes(ctl_num(r, "hit_bytes", 0), hb, sizeof hb);
    printf("%-14s %s\n", "dataset", ctl_str(r, "dataset", "?"));
    printf("%-14s %s\n", "state", state);
    printf("%-14s %s (mode %s)\n", "path", ctl_str(r, "path", "?"), ctl_str(r, "mode", "?"));
    printf("%-14s %.0f samples, %s\n", "served", ctl_num(r, "hits", 0), hb);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(r, "file");
    if (f) {
        ctl_fmt_bytes(ctl_num(f, "file_size", 0), size, sizeof size);
        printf("%-14s %.0f (format version %.0f)\n", "samples", ctl_num(f, "count", 0), ctl_num(f, "version", 0));
        printf("%-14s %s\n", "size", size);
        printf("%-14s %s\n", "fingerprint", ctl_str(f, "fingerprint", "?"));
        printf("%-14s %s\n", "built", ctl_str(f, "build_time", "?"));
        printf("%-14s %s (%s)\n", "source", ctl_str(f, "source", "?"), ctl_str(f, "kind", "?"));
    }
}

int ctl_cmd_cache(lc_client **pc, struct ctl_opts *o, int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : NULL, *dataset = NULL;
    bool force = false;
    if (!sub || (strcmp(sub, "build") && strcmp(sub, "verify") && strcmp(sub, "info")))
        return ctl_usage_error("cache: expected build, verify or info");
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--force") == 0 && strcmp(sub, "build") == 0)
            force = true;
        else if (strcmp(argv[i], "--json") == 0)
            o->json = true;
        else if (argv[i][0] == '-')
            return ctl_usage_error("cache %s: unknown option %s", sub, argv[i]);
        else if (dataset)
            return ctl_usage_error("cache %s: one dataset only (got %s and %s)", sub, dataset, argv[i]);
        else
            dataset = argv[i];
    }
    if (!dataset)
        return ctl_usage_error("cache %s: which dataset?", sub);
    if (strcmp(sub, "verify") == 0 && o->timeout_ms == CTL_DEFAULT_TIMEOUT_MS)
        o->timeout_ms = 24 * 3600 * 1000; /* a verify reads the whole cache */
    lc_client *c = *pc = ctl_connect(o);
    if (!c)
        return 1;
    cJSON *r;
    if (strcmp(sub, "info") == 0) {
        if (!(r = ctl_cache_request(c, "cache_info", dataset, false)))
            return 1;
    } else if (strcmp(sub, "verify") == 0) {
        if (!(r = ctl_cache_request(c, "cache_verify", dataset, false)))
            return 1;
        cJSON_Delete(r);
        if (!(r = ctl_cache_request(c, "cache_info", dataset, false)))
            return 1;
        if (!o->json)
            printf("cache of %s: every sample matches its checksum\n", dataset);
    } else {
        /* Start the build, then follow it until it is ready or has failed. */
        if (!(r = ctl_cache_request(c, "cache_build", dataset, force)))
            return 1;
        for (;;) {
            const char *state = ctl_str(r, "state", "?");
            if (strcmp(state, "building") && strcmp(state, "checking") && strcmp(state, "absent") &&
                strcmp(state, "stale"))
                break;
            if (!o->json) {
                char line[160];
                ctl_cache_state(r, line, sizeof line);
                fprintf(stderr, "\r%s: %s   ", dataset, line);
            }
            usleep(200000);
            cJSON_Delete(r);
            if (!(r = ctl_cache_request(c, "cache_info", dataset, false)))
                return 1;
        }
        if (!o->json)
            fprintf(stderr, "\n");
        if (strcmp(ctl_str(r, "state", "?"), "ready") != 0) {
            char what[96];
            snprintf(what, sizeof what, "cache build %s", dataset);
            ctl_fail(what, ctl_str(r, "error", "the build did not finish"));
            cJSON_Delete(r);
            return 1;
        }
    }
    if (o->json)
        ctl_print_json(r);
    else
        ctl_cache_print(r);
    cJSON_Delete(r);
    return 0;
}
