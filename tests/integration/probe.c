/* probe — counts of what a process holds, from /proc, and of what loaderd says it holds,
 * from its `status` reply; see probe.h. Plain functions without cmocka, so that a
 * forked child may call them too. */
#include "probe.h"
#include "loaderclient.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int probe_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    /* Our own look at /proc/self/fd opened one more. */
    if (pid == getpid())
        n--;
    return n;
}

long probe_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

int probe_ring_maps(pid_t pid)
{
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "/dev/shm/loaderd.") || strstr(line, "/memfd:loaderd-handoff"))
            n++;
    fclose(f);
    return n;
}

static int number(const cJSON *o, const char *key, int64_t *ret)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return -1;
    *ret = (int64_t)v->valuedouble;
    return 0;
}

int probe_status(struct lc_client *c, struct probe_status *ret)
{
    char *json = NULL;
    int r = lc_request_json(c, "{\"op\":\"status\"}", &json);
    if (r < 0)
        return r;
    cJSON *st = cJSON_Parse(json);
    lc_free(json);
    if (!st)
        return LC_EPROTO;
    int64_t clients, streams, leased, filling, used;
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(st, "slots");
    if (number(st, "clients", &clients) < 0 || number(st, "streams", &streams) < 0 ||
        number(st, "memory_used", &used) < 0 || number(slots, "leased", &leased) < 0 ||
        number(slots, "filling", &filling) < 0) {
        cJSON_Delete(st);
        return LC_EPROTO;
    }
    cJSON_Delete(st);
    ret->clients = (int)clients;
    ret->streams = (int)streams;
    ret->leased = (int)leased;
    ret->filling = (int)filling;
    ret->memory_used = used;
    return 0;
}
