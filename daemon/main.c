/* loaderd — the process: read the config, open the datasets, start the workers and the
 * server, run the loop until SIGTERM, SIGINT or SIGQUIT, then take everything down in
 * order so that no socket file and no shared-memory object is left behind.
 *
 * Every signal an operator or systemd commonly sends is handled, so that none kills the
 * process without that clean-up: SIGHUP reloads the config (server_reload.c),
 * SIGUSR1/SIGUSR2 are logged and ignored, SIGPIPE is ignored (a client that hangs up is
 * seen as a write error on its connection).
 *
 * Startup errors are fatal with a clear message and exit status 1, except a dataset
 * that cannot be opened (its path missing or unreadable): the daemon serves the others
 * and lists it as unavailable until a reload opens it. --check fails on it. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "config.h"
#include "dataset.h"
#include "hub.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "ring.h"
#include "server.h"

/* Signals that stop the daemon cleanly, and signals that are only logged. */
static const int stop_signals[] = {SIGTERM, SIGINT, SIGQUIT};
static const int ignored_signals[] = {SIGHUP, SIGUSR1, SIGUSR2}; /* SIGHUP: a reload */
#define N_STOP (sizeof stop_signals / sizeof stop_signals[0])
#define N_IGNORED (sizeof ignored_signals / sizeof ignored_signals[0])

struct daemon {
    uv_loop_t *loop;
    uv_signal_t signals[N_STOP + N_IGNORED];
    size_t n_signals;               /* initialised handles in signals[] */
    uv_timer_t late;                /* the shutdown's deadline */
    bool late_open;
    hub *hub;                       /* work done off the loop comes back through it */
    server *srv;
    pool *workers;
};

/* How long a stop may wait for the workers to finish their tasks. A read of a hung
 * network or FUSE file system can keep a worker forever, and no signal frees it. */
#define SHUTDOWN_GRACE_MS 5000

static void usage(FILE *f)
{
    fprintf(f, "usage: loaderd --config FILE [--check] [--log-level LEVEL]\n"
               "  --config FILE      YAML configuration (see config/loaderd.yaml)\n"
               "  --check            validate the configuration and the datasets, then exit\n"
               "  --log-level LEVEL  error, warn, info or debug (overrides server.log_level)\n"
               "  --version          print the version\n"
               "  --help             print this\n"
               "\nenvironment:\n"
               "  LOADERD_SOCKET     the socket when the config names none (else\n"
               "                     $XDG_RUNTIME_DIR/loaderd.sock when that is a private directory,\n"
               "                     else /tmp/loaderd-UID/loaderd.sock)\n"
               "  NOTIFY_SOCKET, LISTEN_FDS, WATCHDOG_USEC   set by systemd (Type=notify, socket\n"
               "                     activation, watchdog)\n"
               "  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN   the keys of s3:// datasets\n"
               "  AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE   else their credentials file (default\n"
               "                     $HOME/.aws/credentials) and profile (default: default)\n"
               "  AWS_REGION, AWS_DEFAULT_REGION   the region of s3:// datasets that name none\n"
               "\nsignals: SIGTERM, SIGINT, SIGQUIT stop cleanly (exit 0); SIGHUP reloads the config;\n"
               "SIGUSR1, SIGUSR2 are logged and ignored.\n"
               "exit status: 0 after a clean stop or a passed --check, 1 for a startup error, 2 for a\n"
               "bad command line\n");
}

/* Descriptors the daemon holds whatever its clients do: stdio, the loop's own, the
 * listener, timers and signals, with room to spare. */
#define FD_BASE 64

/* Raises the soft open-file limit to the hard one (shortages cost clients and samples,
 * and the hard limit is what the operator allowed), then checks that what the config
 * allows at once fits: a client's socket each, one file per worker, a root and a cache
 * per dataset. 0, or -1 with a message in err. */
static int fd_limit_check(const struct config *cfg, char *err)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return 0; /* nothing known, nothing to check */
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit raised = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    uint64_t need = FD_BASE + (uint64_t)cfg->max_clients + cfg->workers + 2 * (uint64_t)cfg->n_datasets;
    if (rl.rlim_cur != RLIM_INFINITY && need > rl.rlim_cur) {
        snprintf(err, LD_ERRMSG_MAX,
                 "%s: server.max_clients %u with %u workers and %zu datasets needs about %" PRIu64
                 " open files, but the limit (RLIMIT_NOFILE) is %" PRIu64 ": raise it (LimitNOFILE= in the "
                 "service, ulimit -n) or lower server.max_clients", cfg->file, cfg->max_clients, cfg->workers,
                 cfg->n_datasets, need, (uint64_t)rl.rlim_cur);
        return -1;
    }
    ld_log(LD_LOG_DEBUG, "open-file limit %" PRIu64 ", about %" PRIu64 " needed",
           (uint64_t)rl.rlim_cur, need);
    return 0;
}

static void signal_closed(uv_handle_t *h)
{
    (void)h;
}

static void signals_close(struct daemon *d)
{
    for (size_t i = 0; i < d->n_signals; i++)
        uv_close((uv_handle_t *)&d->signals[i], signal_closed);
    d->n_signals = 0;
    if (d->late_open)
        uv_close((uv_handle_t *)&d->late, signal_closed);
    d->late_open = false;
}

/* The stop took too long: the socket file is gone and every ring's name is unlinked
 * (server_stop and stream_close see to it), so nothing is left behind by leaving now,
 * without waiting for the stuck workers or freeing what they may still touch. */
static void on_late(uv_timer_t *t)
{
    struct daemon *d = t->data;
    ld_log(LD_LOG_ERROR, "stopping took more than %d s: %u worker(s) still inside a task (a read that does not "
           "return: see read_timeout); exiting without waiting for them", SHUTDOWN_GRACE_MS / 1000,
           pool_running(d->workers));
    fflush(stderr);
    _exit(1);
}

static void server_done(void *ctx)
{
    struct daemon *d = ctx;
    signals_close(d);
    hub_close(d->hub); /* every stream is gone: nothing posts any more */
    d->hub = NULL;
}

static void on_stop_signal(uv_signal_t *h, int signum)
{
    struct daemon *d = h->data;
    ld_log(LD_LOG_INFO, "received %s (SIG%s); stopping", strsignal(signum), sigabbrev_np(signum));
    if (d->late_open && !uv_is_active((uv_handle_t *)&d->late))
        uv_timer_start(&d->late, on_late, SHUTDOWN_GRACE_MS, 0);
    server_stop(d->srv, server_done, d);
}

static void on_ignored_signal(uv_signal_t *h, int signum)
{
    struct daemon *d = h->data;
    if (signum == SIGHUP)
        server_reload_signal(d->srv);
    else
        ld_log(LD_LOG_WARN, "received SIG%s: loaderd gives it no meaning; ignoring it", sigabbrev_np(signum));
}

/* Installs the handlers before the socket exists, so that no signal can end the
 * process between the bind and the loop. The callbacks run inside uv_run only. */
static int signals_start(struct daemon *d)
{
    for (size_t i = 0; i < N_STOP + N_IGNORED; i++) {
        uv_signal_t *h = &d->signals[i];
        int rc = uv_signal_init(d->loop, h);
        if (rc < 0)
            return rc;
        d->n_signals++;
        h->data = d;
        rc = i < N_STOP ? uv_signal_start(h, on_stop_signal, stop_signals[i])
                        : uv_signal_start(h, on_ignored_signal, ignored_signals[i - N_STOP]);
        if (rc < 0)
            return rc;
    }
    return 0;
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
        case 'V': printf("loaderd %s\n", LD_VERSION); return 0;
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
    char **why = NULL;              /* per dataset that could not be opened: the reason */
    size_t n_open = 0, n_failed = 0, n_why = 0;
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
    if (fd_limit_check(cfg, err) < 0) {
        fprintf(stderr, "loaderd: %s\n", err);
        goto out;
    }

    datasets = calloc(cfg->n_datasets ? cfg->n_datasets : 1, sizeof *datasets);
    why = calloc(cfg->n_datasets ? cfg->n_datasets : 1, sizeof *why);
    if (why)
        n_why = cfg->n_datasets;
    if (!datasets || !why) {
        ld_log(LD_LOG_ERROR, "cannot open %zu datasets: out of memory", cfg->n_datasets);
        goto out;
    }
    for (; n_open < cfg->n_datasets; n_open++) {
        uint64_t t0 = uv_hrtime();
        if (dataset_open(&cfg->datasets[n_open], &datasets[n_open], err) < 0) {
            struct config_pos at = config_dataset_error_at(&cfg->datasets[n_open], err);
            if (check_only) {
                ld_log(LD_LOG_ERROR, "%s:%d:%d: %s", cfg->file, at.line, at.column, err);
                goto out;
            }
            /* The others are served; this one is listed as unavailable until a reload
             * can open it. */
            ld_log(LD_LOG_ERROR, "%s:%d:%d: %s; dataset '%s' is unavailable until a reload can open it",
                   cfg->file, at.line, at.column, err, cfg->datasets[n_open].name);
            datasets[n_open] = NULL;
            if (!(why[n_open] = strdup(err))) {
                ld_log(LD_LOG_ERROR, "out of memory");
                goto out;
            }
            n_failed++;
            continue;
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

    int rc = pool_new(cfg->workers, &workers);
    if (rc < 0) {
        ld_log(LD_LOG_ERROR, "cannot start %u worker threads (server.workers): %s", cfg->workers, ld_strerror(rc));
        goto out;
    }
    d.loop = uv_default_loop();
    if (!d.loop) {
        ld_log(LD_LOG_ERROR, "cannot set up the event loop: %s", strerror(errno ? errno : ENOMEM));
        goto out;
    }
    d.workers = workers;
    uv_timer_init(d.loop, &d.late);
    d.late.data = &d;
    d.late_open = true;
    rc = signals_start(&d);
    if (rc < 0) {
        ld_log(LD_LOG_ERROR, "cannot install the signal handlers: %s", uv_strerror(rc));
        goto out;
    }
    if ((rc = hub_new(d.loop, &d.hub)) < 0) {
        ld_log(LD_LOG_ERROR, "cannot set up the loop's completion hub: %s", ld_strerror(rc));
        goto out;
    }
    err[0] = '\0';
    uint64_t budget = cfg->memory_budget;
    if ((rc = server_new(d.loop, d.hub, cfg, datasets, why, workers, &d.srv, err)) < 0) {
        ld_log(LD_LOG_ERROR, "%s", err[0] ? err : ld_strerror(rc));
        goto out;
    }
    cfg = NULL; /* the server's now, with the datasets */
    n_open = 0;

    ld_log(LD_LOG_INFO, "listening on %s with %u workers, memory budget %" PRIu64 " MiB%s",
           server_socket_path(d.srv), pool_threads(workers), budget >> 20,
           n_failed ? "; some datasets are unavailable (see `loaderctl datasets`)" : "");
    notify_send("READY=1");
    uv_run(d.loop, UV_RUN_DEFAULT);
    ld_log(LD_LOG_INFO, "stopped");
    status = 0;

out:
    if (d.loop) {
        if (d.n_signals || d.late_open || d.hub) {
            signals_close(&d);
            hub_close(d.hub);
            uv_run(d.loop, UV_RUN_NOWAIT); /* let the handles close before the loop does */
        }
        server_free(d.srv);
        uv_loop_close(d.loop);
    }
    pool_free(workers);
    for (size_t i = 0; i < n_open; i++)
        dataset_free(datasets[i]);
    for (size_t i = 0; i < n_why; i++)
        free(why[i]);
    free(why);
    free(datasets);
    config_free(cfg);
    return status;
}
