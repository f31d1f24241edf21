/* loaderctl_top — `loaderctl top`, the operator's live view of who is starved.
 *
 * Every interval it asks the daemon for `status` and `streams` and prints one screen:
 * a summary line, the streams sorted by their data stall over the last seconds (the
 * fraction of time their trainer waited inside `next`; ties by the stall since the
 * stream began), the same per client, added up over its streams, and each shared stream
 * once. A shared stream's batches are prepared once for all its consumers: a consumer's
 * CPU column shows the group's time marked `*`, and that time is counted once, in the
 * shares' table, not in any client's total. The numbers are
 * the daemon's own (stream_get_stats), so the view and `loaderctl streams --json`
 * always agree; nothing is computed here but sums and the order. With --once it prints
 * one view without clearing the screen, which is what scripts and tests read. */
#include "loaderctl_top.h"

#include <cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOP_MAX_CLIENTS 256
#define TOP_MAX_SHARES 256

static double top_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *top_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
}

static cJSON *top_request(lc_client *c, const char *op)
{
    char req[64], *text = NULL;
    snprintf(req, sizeof req, "{\"op\":\"%s\"}", op);
    if (lc_request_json(c, req, &text) < 0) {
        fprintf(stderr, "loaderctl: top: %s: %s\n", op, lc_client_error(c));
        return NULL;
    }
    cJSON *r = cJSON_Parse(text);
    lc_free(text);
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        fprintf(stderr, "loaderctl: top: %s: the reply is not a JSON object\n", op);
        return NULL;
    }
    return r;
}

/* Worst stall now first, then worst stall overall, then the older stream. */
static int top_cmp(const void *a, const void *b)
{
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    double dx = top_num(x, "stall_now"), dy = top_num(y, "stall_now");
    if (dx != dy)
        return dx < dy ? 1 : -1;
    dx = top_num(x, "stall");
    dy = top_num(y, "stall");
    if (dx != dy)
        return dx < dy ? 1 : -1;
    return top_num(x, "id") < top_num(y, "id") ? -1 : 1;
}

static void top_rate(double v, char *buf, size_t size)
{
    if (v >= 1e6)
        snprintf(buf, size, "%.2fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(buf, size, "%.1fk", v / 1e3);
    else
        snprintf(buf, size, "%.0f", v);
}

struct top_client {
    double id;
    const char *name;
    int streams;
    double wait, active, rate_now, rate, cpu;
};

struct top_share {
    double producer;
    const char *name;
    double consumers, cpu;
};

/* One view; the streams array of `streams` is sorted in place. */
static void top_print(const cJSON *status, cJSON *streams, bool once)
{
    if (!once)
        fputs("\033[H\033[2J", stdout);
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", localtime_r(&now, &tm));
    char rate[32];
    top_rate(top_num(status, "samples_per_s"), rate, sizeof rate);
    printf("%s  %s  clients %.0f  streams %.0f  workers %.0f  samples/s %s  worker busy %.1f s\n\n",
           top_str(status, "server"), when, top_num(status, "clients"), top_num(status, "streams"),
           top_num(status, "workers"), rate, top_num(status, "worker_busy_s"));

    cJSON *list = cJSON_GetObjectItemCaseSensitive(streams, "streams");
    int n = cJSON_GetArraySize(list);
    cJSON **v = calloc(n ? (size_t)n : 1, sizeof *v);
    if (!v)
        return;
    int k = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, list) v[k++] = (cJSON *)s;
    qsort(v, (size_t)n, sizeof *v, top_cmp);

    printf("%6s %-16s %-14s %7s %7s %9s %9s %9s %7s %6s %s\n", "STREAM", "DATASET", "CLIENT", "STALL%",
           "AVG%", "SAMPLES/S", "AVG/S", "CPU_S", "DEPTH", "WEIGHT", "STATE");
    if (n == 0)
        puts("  (no open streams)");
    struct top_client cl[TOP_MAX_CLIENTS];
    struct top_share sh[TOP_MAX_SHARES];
    int ncl = 0, nsh = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *e = v[i];
        const cJSON *share = cJSON_GetObjectItemCaseSensitive(e, "share");
        char now_rate[32], avg_rate[32], depth[32], cpu[32];
        top_rate(top_num(e, "samples_per_s_now"), now_rate, sizeof now_rate);
        top_rate(top_num(e, "samples_per_s"), avg_rate, sizeof avg_rate);
        snprintf(depth, sizeof depth, "%.0f/%.0f", top_num(e, "prefetch_depth"), top_num(e, "prefetch"));
        if (share)
            snprintf(cpu, sizeof cpu, "%.2f*", top_num(share, "worker_cpu_s"));
        else
            snprintf(cpu, sizeof cpu, "%.2f", top_num(e, "worker_cpu_s"));
        printf("%6.0f %-16.16s %-14.14s %7.1f %7.1f %9s %9s %9s %7s %6.0f %s\n", top_num(e, "id"),
               top_str(e, "dataset"), top_str(e, "client"), 100 * top_num(e, "stall_now"), 100 * top_num(e, "stall"),
               now_rate, avg_rate, cpu, depth, top_num(e, "weight"), top_str(e, "state"));
        if (share) {
            int q = 0;
            while (q < nsh && sh[q].producer != top_num(share, "producer"))
                q++;
            if (q == nsh && nsh < TOP_MAX_SHARES)
                sh[nsh++] = (struct top_share){.producer = top_num(share, "producer"), .name = top_str(share, "name"),
                                               .consumers = top_num(share, "consumers"),
                                               .cpu = top_num(share, "worker_cpu_s")};
        }
        int j = 0;
        while (j < ncl && cl[j].id != top_num(e, "client_id"))
            j++;
        if (j == ncl && ncl < TOP_MAX_CLIENTS)
            cl[ncl++] = (struct top_client){.id = top_num(e, "client_id"), .name = top_str(e, "client")};
        if (j < ncl) {
            cl[j].streams++;
            cl[j].wait += top_num(e, "client_wait_s");
            cl[j].active += top_num(e, "active_s");
            cl[j].rate_now += top_num(e, "samples_per_s_now");
            cl[j].rate += top_num(e, "samples_per_s");
            cl[j].cpu += top_num(e, "worker_cpu_s");
        }
    }
    if (ncl) {
        printf("\n%6s %-16s %7s %7s %9s %9s %9s\n", "CLIENT", "NAME", "STREAMS", "AVG%", "SAMPLES/S", "AVG/S",
               "CPU_S");
        for (int j = 0; j < ncl; j++) {
            char now_rate[32], avg_rate[32];
            top_rate(cl[j].rate_now, now_rate, sizeof now_rate);
            top_rate(cl[j].rate, avg_rate, sizeof avg_rate);
            printf("%6.0f %-16.16s %7d %7.1f %9s %9s %9.2f\n", cl[j].id, cl[j].name, cl[j].streams,
                   cl[j].active > 0 ? 100 * cl[j].wait / cl[j].active : 0.0, now_rate, avg_rate, cl[j].cpu);
        }
    }
    if (nsh) {
        printf("\n%8s %-16s %9s %9s   * a shared stream's CPU, prepared once for its consumers\n", "PRODUCER",
               "SHARE", "CONSUMERS", "CPU_S");
        for (int q = 0; q < nsh; q++)
            printf("%8.0f %-16.16s %9.0f %9.2f\n", sh[q].producer, sh[q].name, sh[q].consumers, sh[q].cpu);
    }
    free(v);
    fflush(stdout);
}

/* The streams sorted as the view shows them, as JSON. */
static void top_print_json(cJSON *streams)
{
    cJSON *list = cJSON_GetObjectItemCaseSensitive(streams, "streams");
    int n = cJSON_GetArraySize(list);
    cJSON **v = calloc(n ? (size_t)n : 1, sizeof *v);
    cJSON *out = cJSON_CreateArray();
    if (v && out) {
        int k = 0;
        cJSON *s;
        cJSON_ArrayForEach(s, list) v[k++] = s;
        qsort(v, (size_t)n, sizeof *v, top_cmp);
        for (int i = 0; i < n; i++)
            cJSON_AddItemToArray(out, cJSON_Duplicate(v[i], true));
        char *text = cJSON_Print(out);
        if (text)
            puts(text);
        cJSON_free(text);
    }
    cJSON_Delete(out);
    free(v);
    fflush(stdout);
}

static int top_parse(const char *s, double min, double max, double *ret)
{
    char *end = NULL;
    errno = 0;
    double d = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || errno || !(d >= min && d <= max))
        return -1;
    *ret = d;
    return 0;
}

int ctl_top(lc_client *c, int argc, char **argv, bool json)
{
    bool once = false;
    double interval = 1, count = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--once") == 0) {
            once = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
            if (top_parse(argv[++i], 0.1, 3600, &interval) < 0) {
                fprintf(stderr, "loaderctl: top: --interval needs seconds in [0.1, 3600], got '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            if (top_parse(argv[++i], 1, 1e9, &count) < 0 || count != (double)(long)count) {
                fprintf(stderr, "loaderctl: top: --count needs a whole number in [1, 1e9], got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "loaderctl: top: unknown or incomplete argument %s\n", argv[i]);
            return 2;
        }
    }
    if (once || json)
        count = 1;
    for (long shown = 0; !count || shown < (long)count; shown++) {
        if (shown) {
            struct timespec ts = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
            nanosleep(&ts, NULL);
        }
        cJSON *status = json ? NULL : top_request(c, "status");
        cJSON *streams = top_request(c, "streams");
        if ((!json && !status) || !streams) {
            cJSON_Delete(status);
            cJSON_Delete(streams);
            return 1;
        }
        if (json)
            top_print_json(streams);
        else
            top_print(status, streams, once || count == 1);
        cJSON_Delete(status);
        cJSON_Delete(streams);
    }
    return 0;
}
