/* loaderd — the process: read the config, open the datasets, start the workers and the
 * server, run the loop until SIGTERM or SIGINT, then take everything down in order so
 * that no socket file and no shared-memory object is left behind.
 *
 * Startup errors are fatal with a clear message and exit status 1. */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "config.h"
#include "dataset.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "ring.h"
#include "server.h"

struct daemon {
    uv_loop_t *loop;
    uv_signal_t sigterm, sigint;
    server *srv;
    int signals_open;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: loaderd --config FILE [--check] [--log-level LEVEL]\n"
               "  --config FILE      YAML configuration (see config/loaderd.yaml)\n"
               "  --check            validate the configuration and the datasets, then exit\n"
               "  --log-level LEVEL  error, warn, info or debug (overrides server.log_level)\n"
               "  --version          print the version\n");
}

static void signal_closed(uv_handle_t *h)
{
    (void)h;
}

static void server_done(void *ctx)
{
    struct daemon *d = ctx;
    uv_close((uv_handle_t *)&d->sigterm, signal_closed);
    uv_close((uv_handle_t *)&d->sigint, signal_closed);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct daemon *d = h->data;
    ld_log(LD_LOG_INFO, "received %s", strsignal(signum));
    server_stop(d->srv, server_done, d);
}

int main(int argc, char **argv)
{
    const char *config_path = NULL;
    const char *log_level = NULL;
    bool check_only = false;
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"check", no_argument, NULL, 'k'},
        {"log-level", required_argument, NULL, 'l'}, {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case 'k': check_only = true; break;
        case 'l': log_level = optarg; break;
        case 'V': printf("loaderd 0.1.0\n"); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!config_path || optind != argc) {
        usage(stderr);
        return 2;
    }

    char err[LD_ERRMSG_MAX];
    struct config *cfg = NULL;
    dataset **datasets = NULL;
    size_t n_open = 0;
    pool *workers = NULL;
    struct daemon d = {0};
    int status = 1;

    if (config_load(config_path, &cfg, err) < 0) {
        fprintf(stderr, "loaderd: %s\n", err);
        goto out;
    }
    ld_log_set_level(cfg->log_level);
    if (log_level) {
        int lvl = ld_log_level_from_name(log_level);
        if (lvl < 0) {
            fprintf(stderr, "loaderd: --log-level: expected error, warn, info or debug, got '%s'\n", log_level);
            goto out;
        }
        ld_log_set_level(lvl);
    }
    signal(SIGPIPE, SIG_IGN);

    datasets = calloc(cfg->n_datasets, sizeof *datasets);
    if (!datasets)
        goto out;
    for (; n_open < cfg->n_datasets; n_open++) {
        uint64_t t0 = uv_hrtime();
        if (dataset_open(&cfg->datasets[n_open], &datasets[n_open], err) < 0) {
            ld_log(LD_LOG_ERROR, "%s:%d:%d: %s", cfg->file, cfg->datasets[n_open].line,
                   cfg->datasets[n_open].column, err);
            goto out;
        }
        const dataset *ds = datasets[n_open];
        ld_log(LD_LOG_INFO, "dataset '%s' (%s): %" PRIu64 " samples from %s, opened in %.1f ms", ds->name,
               dataset_kind(ds), ds->count, ds->source, (double)(uv_hrtime() - t0) / 1e6);
    }
    if (check_only) {
        printf("%s: configuration and %zu datasets are valid\n", config_path, n_open);
        status = 0;
        goto out;
    }

    int swept = ring_sweep("loaderd");
    if (swept > 0)
        ld_log(LD_LOG_INFO, "removed %d shared-memory objects left by a crashed loaderd", swept);

    if (pool_new(cfg->workers, &workers) < 0) {
        ld_log(LD_LOG_ERROR, "cannot start %u worker threads", cfg->workers);
        goto out;
    }
    d.loop = uv_default_loop();
    if (server_new(d.loop, cfg, datasets, n_open, workers, &d.srv, err) < 0) {
        ld_log(LD_LOG_ERROR, "%s", err);
        goto out;
    }
    uv_signal_init(d.loop, &d.sigterm);
    uv_signal_init(d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);

    ld_log(LD_LOG_INFO, "listening on %s with %u workers, memory budget %" PRIu64 " MiB",
           server_socket_path(d.srv), pool_threads(workers), cfg->memory_budget >> 20);
    notify_send("READY=1");
    uv_run(d.loop, UV_RUN_DEFAULT);
    ld_log(LD_LOG_INFO, "stopped");
    status = 0;

out:
    if (d.loop) {
        server_free(d.srv);
        uv_loop_close(d.loop);
    }
    pool_free(workers);
    for (size_t i = 0; i < n_open; i++)
        dataset_free(datasets[i]);
    free(datasets);
    config_free(cfg);
    return status;
}
