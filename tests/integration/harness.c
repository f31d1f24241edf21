/* harness — a real loaderd as a child process, in a private temporary directory, for
 * the integration tests; see harness.h for how a test uses it.
 *
 * Failures that are the machine's, not loaderd's (mkdtemp, fork, write), fail the
 * running cmocka test at once; what loaderd does (its exit status, its /dev/shm objects,
 * its log) is returned for the test to judge. */
#include "harness.h"
#include "loaderclient.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <pwd.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#define HARNESS_WAIT_MS 10000

static void harness_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static int64_t harness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Formats a path; a path that does not fit fails the test instead of being cut. */
static void harness_pathf(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void harness_pathf(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size)
        fail_msg("harness: path too long: %s...", buf);
}

static void harness_path(const struct harness *h, const char *rel, char *buf, size_t size)
{
    harness_pathf(buf, size, "%s/%s", h->dir, rel);
}

static void harness_write_all(int fd, const void *data, size_t len, const char *path)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail_msg("harness: write %s: %s", path, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

struct harness *harness_new(void)
{
    struct harness *h = calloc(1, sizeof *h);
    if (!h)
        fail_msg("harness: out of memory");
    /* A short base keeps <dir>/s.sock under the 107 bytes of sun_path. */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60)
        tmp = "/tmp";
    snprintf(h->dir, sizeof h->dir, "%s/ldtest.XXXXXX", tmp);
    if (!mkdtemp(h->dir))
        fail_msg("harness: mkdtemp %s: %s", h->dir, strerror(errno));
    snprintf(h->socket, sizeof h->socket, "%s/s.sock", h->dir);
    harness_path(h, "loaderd.yaml", h->config, sizeof h->config);
    harness_path(h, "loaderd.log", h->log, sizeof h->log);
    return h;
}

static int harness_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void harness_free(struct harness *h)
{
    if (!h)
        return;
    if (h->pid > 0) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, NULL, 0);
        h->pid = 0;
    }
    if (h->dir[0])
        nftw(h->dir, harness_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(h);
}

void harness_write_file(struct harness *h, const char *relpath, const void *data, size_t len)
{
    char path[PATH_MAX];
    harness_path(h, relpath, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail_msg("harness: create %s: %s", path, strerror(errno));
    harness_write_all(fd, data, len, path);
    close(fd);
}

void harness_write_config(struct harness *h, const char *server_extra, const char *datasets)
{
    char *text = NULL;
    int n = asprintf(&text, "server:\n  socket: %s\n%sdatasets:\n%s", h->socket, server_extra ? server_extra : "",
                     datasets ? datasets : "");
    if (n < 0)
        fail_msg("harness: out of memory");
    harness_write_file(h, "loaderd.yaml", text, (size_t)n);
    free(text);
}

char *harness_log(const struct harness *h)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = fopen(h->log, "re");
    if (f) {
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
            char *nb = realloc(buf, len + n + 1);
            if (!nb)
                break;
            buf = nb;
            memcpy(buf + len, chunk, n);
            len += n;
        }
        fclose(f);
    }
    if (!buf)
        buf = calloc(1, 1);
    if (!buf)
        fail_msg("harness: out of memory");
    buf[len] = '\0';
    return buf;
}

static const char *harness_bin(void)
{
    const char *b = getenv("LOADERD_BIN");
    return b && *b ? b : "build/bin/loaderd";
}

static pid_t harness_spawn_fd(struct harness *h, const char *const *extra_args, int listen_fd);

static pid_t harness_spawn(struct harness *h, const char *const *extra_args)
{
    return harness_spawn_fd(h, extra_args, -1);
}

static void harness_copy_file(const char *src, const char *dst, mode_t mode)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        fail_msg("harness: open %s: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (out < 0)
        fail_msg("harness: create %s: %s", dst, strerror(errno));
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        harness_write_all(out, buf, (size_t)n, dst);
    if (n < 0)
        fail_msg("harness: read %s: %s", src, strerror(errno));
    close(in);
    if (fchmod(out, mode) < 0 || close(out) < 0)
        fail_msg("harness: finish %s: %s", dst, strerror(errno));
}

/* A daemon that runs as another user must be able to reach its binary and the files its
 * sanitizer reads, and the build tree may sit in a directory only we can enter (a clone
 * under a 0700 mktemp directory): such a daemon runs a copy of the binary placed in the
 * test's own directory, and TSan's suppressions file is copied there too (tsan_env gets
 * the TSAN_OPTIONS to give it, or "" to leave them as they are). */
static const char *harness_bin_for(struct harness *h, char *copy, size_t size, char *tsan_env, size_t env_size)
{
    const char *bin = harness_bin();
    tsan_env[0] = '\0';
    if (!h->run_uid)
        return bin;
    snprintf(copy, size, "%s/loaderd-bin", h->dir);
    if (access(copy, X_OK) != 0)
        harness_copy_file(bin, copy, 0755);
    const char *opts = getenv("TSAN_OPTIONS");
    const char *sup = opts ? strstr(opts, "suppressions=") : NULL;
    if (sup) {
        char src[PATH_MAX], dst[PATH_MAX];
        const char *from = sup + strlen("suppressions=");
        size_t len = strcspn(from, ": ");
        snprintf(src, sizeof src, "%.*s", (int)len, from);
        snprintf(dst, sizeof dst, "%s/tsan.supp", h->dir);
        harness_copy_file(src, dst, 0644);
        snprintf(tsan_env, env_size, "%.*s%s%s", (int)(sup - opts) + (int)strlen("suppressions="), opts, dst,
                 from + len);
    }
    return copy;
}

static pid_t harness_spawn_fd(struct harness *h, const char *const *extra_args, int listen_fd)
{
    const char *argv[32];
    char bin_copy[PATH_MAX], tsan_env[2 * PATH_MAX];
    int argc = 0;
    argv[argc++] = harness_bin_for(h, bin_copy, sizeof bin_copy, tsan_env, sizeof tsan_env);
    argv[argc++] = "--config";
    argv[argc++] = h->config;
    for (int i = 0; extra_args && extra_args[i] && argc < 31; i++)
        argv[argc++] = extra_args[i];
    argv[argc] = NULL;
    int logfd = open(h->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0)
        fail_msg("harness: create %s: %s", h->log, strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("harness: fork: %s", strerror(errno));
    if (pid == 0) {
        /* The child: only async-signal-safe calls until exec. */
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        if (listen_fd >= 0) {
            /* sd_listen_fds(3): the sockets start at fd 3, LISTEN_PID names this process. */
            char lpid[24];
            snprintf(lpid, sizeof lpid, "%d", (int)getpid());
            if (listen_fd != 3) {
                dup2(listen_fd, 3);
                close(listen_fd);
            } else {
                fcntl(3, F_SETFD, 0);
            }
            setenv("LISTEN_FDS", "1", 1);
            setenv("LISTEN_PID", lpid, 1);
        }
        if (tsan_env[0])
            setenv("TSAN_OPTIONS", tsan_env, 1);
        if (h->run_uid)
            harness_become(h->run_uid, h->run_gid);
        execv(argv[0], (char *const *)argv);
        dprintf(2, "harness: cannot run %s: %s (set LOADERD_BIN)\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(logfd);
    return pid;
}

/* Exit status as harness_stop reports it, or -2 while the child still runs. */
static int harness_reap(pid_t pid, bool block)
{
    int st = 0;
    pid_t r;
    do
        r = waitpid(pid, &st, block ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        return -2;
    if (r < 0)
        return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

static bool harness_socket_answers(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

static void harness_wait_listening(struct harness *h);

void harness_start(struct harness *h)
{
    if (h->pid > 0)
        fail_msg("harness: loaderd already runs (pid %d)", (int)h->pid);
    h->pid = harness_spawn(h, NULL);
    harness_wait_listening(h);
}

void harness_start_activated(struct harness *h, unsigned mode)
{
    if (h->pid > 0)
        fail_msg("harness: loaderd already runs (pid %d)", (int)h->pid);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", h->socket);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || chmod(h->socket, mode) < 0 ||
        listen(fd, 128) < 0)
        fail_msg("harness: cannot listen on %s: %s", h->socket, strerror(errno));
    h->pid = harness_spawn_fd(h, NULL, fd);
    close(fd);
    harness_wait_listening(h);
}

static void harness_wait_listening(struct harness *h)
{
    int64_t deadline = harness_now_ms() + HARNESS_WAIT_MS;
    for (;;) {
        int st = harness_reap(h->pid, false);
        if (st != -2) {
            char *log = harness_log(h);
            h->pid = 0;
            print_error("loaderd log:\n%s\n", log);
            free(log);
            fail_msg("harness: loaderd exited with status %d before it listened on %s", st, h->socket);
        }
        if (harness_socket_answers(h->socket))
            return;
        if (harness_now_ms() > deadline) {
            char *log = harness_log(h);
            print_error("loaderd log:\n%s\n", log);
            free(log);
            fail_msg("harness: loaderd did not accept connections on %s within %d ms", h->socket,
                     HARNESS_WAIT_MS);
        }
        harness_sleep_ms(10);
    }
}

static int harness_wait_exit(struct harness *h)
{
    int64_t deadline = harness_now_ms() + HARNESS_WAIT_MS;
    for (;;) {
        int st = harness_reap(h->pid, false);
        if (st != -2) {
            h->pid = 0;
            return st;
        }
        if (harness_now_ms() > deadline) {
            kill(h->pid, SIGKILL);
            harness_reap(h->pid, true);
            h->pid = 0;
            return -1;
        }
        harness_sleep_ms(5);
    }
}

int harness_run_to_exit(struct harness *h, const char *const *extra_args)
{
    if (h->pid > 0)
        fail_msg("harness: loaderd already runs (pid %d)", (int)h->pid);
    h->pid = harness_spawn(h, extra_args);
    return harness_wait_exit(h);
}

int harness_stop(struct harness *h)
{
    return harness_stop_with(h, SIGTERM);
}

int harness_stop_with(struct harness *h, int sig)
{
    if (h->pid <= 0)
        return -1;
    kill(h->pid, sig);
    return harness_wait_exit(h);
}

bool harness_alive(struct harness *h)
{
    if (h->pid <= 0)
        return false;
    int st = harness_reap(h->pid, false);
    if (st == -2)
        return true;
    h->pid = 0;
    return false;
}

int harness_shm_count(pid_t pid, char *buf, size_t size)
{
    char prefix[64];
    int n = 0;
    size_t used = 0;
    snprintf(prefix, sizeof prefix, "loaderd.%d.", (int)pid);
    if (buf && size)
        buf[0] = '\0';
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        n++;
        if (buf && used < size) {
            int w = snprintf(buf + used, size - used, "%s%s", used ? " " : "", e->d_name);
            if (w > 0)
                used += (size_t)w;
        }
    }
    closedir(d);
    return n;
}

int harness_fd_count(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

/* ---- datasets ---------------------------------------------------------------------- */

uint64_t harness_file_size(uint64_t i, uint64_t size, bool vary)
{
    if (!vary)
        return size;
    return size / 2 + ld_splitmix64(i ^ 0x5A5A5A5A5A5A5A5Aull) % (size + 1);
}

uint8_t harness_file_byte(uint64_t i, uint64_t j)
{
    return (uint8_t)(ld_splitmix64(i * 1000003 + j / 8) >> (8 * (j % 8)));
}

bool harness_file_matches(uint64_t i, const uint8_t *buf, uint64_t len, uint64_t size, bool vary)
{
    if (len != harness_file_size(i, size, vary))
        return false;
    for (uint64_t j = 0; j < len; j++)
        if (buf[j] != harness_file_byte(i, j))
            return false;
    return true;
}

static int harness_digits(uint64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

void harness_gen_files(struct harness *h, const char *reldir, uint64_t n, uint64_t size, uint64_t classes,
                       bool vary)
{
    char root[PATH_MAX], path[PATH_MAX];
    int fw = harness_digits(n ? n - 1 : 0) > 7 ? harness_digits(n - 1) : 7;
    int cw = classes && harness_digits(classes - 1) > 3 ? harness_digits(classes - 1) : 3;
    harness_path(h, reldir, root, sizeof root);
    if (mkdir(root, 0755) < 0 && errno != EEXIST)
        fail_msg("harness: mkdir %s: %s", root, strerror(errno));
    for (uint64_t c = 0; c < classes && c < n; c++) {
        harness_pathf(path, sizeof path, "%s/class_%0*" PRIu64, root, cw, c);
        if (mkdir(path, 0755) < 0 && errno != EEXIST)
            fail_msg("harness: mkdir %s: %s", path, strerror(errno));
    }
    uint8_t *buf = malloc(vary ? size / 2 + size + 1 : size + 1);
    if (!buf)
        fail_msg("harness: out of memory");
    for (uint64_t i = 0; i < n; i++) {
        if (classes)
            harness_pathf(path, sizeof path, "%s/class_%0*" PRIu64 "/%0*" PRIu64 ".bin", root, cw, i % classes, fw, i);
        else
            harness_pathf(path, sizeof path, "%s/%0*" PRIu64 ".bin", root, fw, i);
        uint64_t len = harness_file_size(i, size, vary);
        for (uint64_t j = 0; j < len; j++)
            buf[j] = harness_file_byte(i, j);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            fail_msg("harness: create %s: %s", path, strerror(errno));
        harness_write_all(fd, buf, len, path);
        close(fd);
    }
    free(buf);
}

uint64_t harness_token(uint64_t k, uint64_t vocab)
{
    return ld_splitmix64(k) % vocab;
}

void harness_gen_tokens(struct harness *h, const char *relpath, uint64_t n, int token_bytes, uint64_t vocab)
{
    char path[PATH_MAX];
    uint8_t buf[65536];
    size_t used = 0;
    if (token_bytes != 2 && token_bytes != 4)
        fail_msg("harness: token_bytes must be 2 or 4, got %d", token_bytes);
    harness_path(h, relpath, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail_msg("harness: create %s: %s", path, strerror(errno));
    for (uint64_t k = 0; k < n; k++) {
        uint64_t t = harness_token(k, vocab);
        if (token_bytes == 2) {
            uint16_t v = (uint16_t)t;
            memcpy(buf + used, &v, 2);
        } else {
            uint32_t v = (uint32_t)t;
            memcpy(buf + used, &v, 4);
        }
        used += (size_t)token_bytes;
        if (used == sizeof buf) {
            harness_write_all(fd, buf, used, path);
            used = 0;
        }
    }
    harness_write_all(fd, buf, used, path);
    close(fd);
}

void harness_stop_clean(struct harness *h)
{
    char names[512];
    pid_t pid = h->pid;
    int st = harness_stop(h);
    if (st != 0) {
        char *log = harness_log(h);
        print_error("loaderd log:\n%s\n", log);
        free(log);
    }
    assert_int_equal(st, 0);
    int n = harness_shm_count(pid, names, sizeof names);
    if (n != 0)
        fail_msg("loaderd %d left shared memory behind: %s", (int)pid, names);
    struct stat sst;
    if (lstat(h->socket, &sst) == 0)
        fail_msg("loaderd %d left its socket file %s behind", (int)pid, h->socket);
}

/* ---- loaderctl, status, raw frames ----------------------------------------------- */

static const char *harness_ctl_bin(void)
{
    const char *b = getenv("LOADERCTL_BIN");
    return b && *b ? b : "build/bin/loaderctl";
}

int harness_ctl(struct harness *h, char *out, size_t size, ...)
{
    const char *argv[40];
    int argc = 0;
    argv[argc++] = harness_ctl_bin();
    argv[argc++] = "--socket";
    argv[argc++] = h->socket;
    va_list ap;
    va_start(ap, size);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && argc < 39)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        fail_msg("harness: pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("harness: fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        execv(argv[0], (char *const *)argv);
        dprintf(2, "harness: cannot run %s: %s (set LOADERCTL_BIN)\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    size_t used = 0;
    int64_t deadline = harness_now_ms() + 20000;
    for (;;) {
        struct pollfd p = { .fd = fds[0], .events = POLLIN };
        int left = (int)(deadline - harness_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            kill(pid, SIGKILL);
            harness_reap(pid, true);
            close(fds[0]);
            fail_msg("harness: loaderctl did not finish within 20 s");
        }
        char chunk[1024];
        ssize_t n = read(fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t take = (size_t)n;
        if (size && used + take > size - 1)
            take = size - 1 - used;
        if (out && take)
            memcpy(out + used, chunk, take);
        used += take;
    }
    close(fds[0]);
    if (out && size)
        out[used] = '\0';
    return harness_reap(pid, true);
}

double harness_status_num(struct harness *h, const char *key, const char *sub)
{
    lc_client *c = harness_connect(h, 10000, "harness-status");
    char *json = NULL;
    int r = lc_request_json(c, "{\"op\":\"status\"}", &json);
    if (r < 0)
        fail_msg("harness: status: %s: %s", lc_strerror(r), lc_client_error(c));
    lc_client_close(c);
    cJSON *st = cJSON_Parse(json);
    lc_free(json);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(st, key);
    if (sub)
        o = cJSON_GetObjectItemCaseSensitive(o, sub);
    if (!cJSON_IsNumber(o)) {
        cJSON_Delete(st);
        fail_msg("harness: status has no number %s%s%s", key, sub ? "." : "", sub ? sub : "");
    }
    double v = o->valuedouble;
    cJSON_Delete(st);
    return v;
}

int harness_wait_leased(struct harness *h, int at_most)
{
    int leased = -1;
    for (int i = 0; i < 100; i++) {
        leased = (int)harness_status_num(h, "slots", "leased");
        if (leased <= at_most)
            break;
        harness_sleep_ms(20);
    }
    return leased;
}

bool harness_handoff_default(void)
{
    const char *env = getenv("LOADERD_HANDOFF");
    return !(env && strcmp(env, "socket") == 0);
}

void harness_flush_releases(lc_client *c)
{
    char *json = NULL;
    int r = lc_request_json(c, "{\"op\":\"status\"}", &json);
    if (r < 0)
        fail_msg("harness: status: %s: %s", lc_strerror(r), lc_client_error(c));
    lc_free(json);
}

int harness_raw_connect(const struct harness *h)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", h->socket);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        fail_msg("harness: connect %s: %s", h->socket, strerror(errno));
    return fd;
}

void harness_raw_send(int fd, const char *json)
{
    uint32_t len = (uint32_t)strlen(json);
    uint8_t hdr[4] = { (uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len };
    if (send(fd, hdr, 4, MSG_NOSIGNAL) != 4 || send(fd, json, len, MSG_NOSIGNAL) != (ssize_t)len)
        fail_msg("harness: send: %s", strerror(errno));
}

static bool harness_read_full(int fd, void *buf, size_t len, int64_t deadline)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int left = (int)(deadline - harness_now_ms());
        if (left <= 0 || poll(&p, 1, left) != 1)
            return false;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        got += (size_t)n;
    }
    return true;
}

/* The rest of a frame whose first `have` bytes of header are in hdr: its body, NUL
 * terminated (NULL when it does not come by the deadline). */
static char *harness_read_frame(int fd, uint8_t hdr[4], size_t have, int64_t deadline)
{
    if (!harness_read_full(fd, hdr + have, 4 - have, deadline))
        return NULL;
    uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    char *buf = calloc(1, (size_t)len + 1);
    if (!buf)
        fail_msg("harness: out of memory");
    if (!harness_read_full(fd, buf, len, deadline)) {
        free(buf);
        return NULL;
    }
    return buf;
}

char *harness_raw_reply(int fd, int timeout_ms)
{
    uint8_t hdr[4];
    return harness_read_frame(fd, hdr, 0, harness_now_ms() + timeout_ms);
}

char *harness_raw_reply_fd(int fd, int timeout_ms, int *ret_fd)
{
    /* The descriptor comes with the frame's first byte: read that byte with recvmsg. */
    *ret_fd = -1;
    uint8_t first;
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = &first, .iov_len = 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl.space};
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0 || recvmsg(fd, &m, MSG_CMSG_CLOEXEC) != 1)
        return NULL;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
        memcpy(ret_fd, CMSG_DATA(h), sizeof(int));
    uint8_t hdr[4] = {first};
    return harness_read_frame(fd, hdr, 1, harness_now_ms() + timeout_ms);
}

/* ---- other users ------------------------------------------------------------------ */

static int harness_system(const char *const *argv)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("harness: fork: %s", strerror(errno));
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return harness_reap(pid, true);
}

int harness_test_user(const char *user, const char *group, uid_t *ret_uid, gid_t *ret_gid)
{
    if (geteuid() != 0)
        return -1;
    /* useradd and groupadd take a lock on /etc/passwd: another test may hold it. */
    for (int attempt = 0; attempt < 50; attempt++) {
        struct group *gr = getgrnam(group);
        struct passwd *pw = getpwnam(user);
        if (gr && pw) {
            *ret_uid = pw->pw_uid;
            *ret_gid = gr->gr_gid;
            return 0;
        }
        if (!gr) {
            const char *argv[] = { "/usr/sbin/groupadd", "-r", group, NULL };
            harness_system(argv);
        } else {
            const char *argv[] = { "/usr/sbin/useradd", "-r", "-M", "-N", "-g", group, "-s", "/usr/sbin/nologin",
                                   user, NULL };
            harness_system(argv);
        }
        if (!getgrnam(group) || !getpwnam(user))
            harness_sleep_ms(100);
    }
    fail_msg("harness: cannot create the test user %s in group %s (useradd/groupadd)", user, group);
    return -1;
}

void harness_become(uid_t uid, gid_t gid)
{
    if (setgroups(1, &gid) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
        _exit(120);
}

lc_client *harness_connect(struct harness *h, int timeout_ms, const char *name)
{
    char err[512];
    lc_client *c = NULL;
    int r = lc_connect(h->socket, timeout_ms, name, &c, err, sizeof err);
    if (r < 0)
        fail_msg("lc_connect: %s (%s)", lc_strerror(r), err);
    return c;
}
