/* itest_metrics — the Prometheus exposition of a real loaderd, as `loaderctl metrics`
 * prints it: every line parses (our own small parser of the text format 0.0.4), and the
 * values agree with `status` and `streams` taken at the same moment, daemon-wide, per
 * stream and per client. When promtool is installed it checks the text too. Then the
 * HTTP listener (server.metrics.listen) on a Unix socket and on a loopback port: the
 * same text, the error statuses, bounded requests and timeouts, and a non-loopback
 * address refused at start. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define METRICS_MAX (256 * 1024)

static int setup(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", 300, 64, 3, false);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

/* ---- a parser of the text format ----------------------------------------------------- */

/* Checks the grammar of every line (comments: HELP and TYPE only; a sample: a name,
 * optional labels with quoted, escaped values, one number) and fails the test at the
 * first line that breaks it. */
static void check_grammar(const char *text)
{
    const char *p = text;
    int line_no = 0;
    while (*p) {
        line_no++;
        const char *nl = strchr(p, '\n');
        if (!nl)
            fail_msg("line %d does not end with a newline", line_no);
        if (*p == '#') {
            if (strncmp(p, "# HELP loaderd_", 15) != 0 && strncmp(p, "# TYPE loaderd_", 15) != 0)
                fail_msg("line %d: a comment that is not HELP or TYPE: %.*s", line_no, (int)(nl - p), p);
            if (p[2] == 'T') {
                const char *sp = memchr(p + 7, ' ', (size_t)(nl - p - 7));
                if (!sp || (strncmp(sp, " counter\n", 9) != 0 && strncmp(sp, " gauge\n", 7) != 0))
                    fail_msg("line %d: bad TYPE: %.*s", line_no, (int)(nl - p), p);
            }
            p = nl + 1;
            continue;
        }
        const char *q = p;
        if (strncmp(q, "loaderd_", 8) != 0)
            fail_msg("line %d: name without the loaderd_ prefix: %.*s", line_no, (int)(nl - p), p);
        while (isalnum((unsigned char)*q) || *q == '_')
            q++;
        if (*q == '{') {
            q++;
            for (;;) {
                const char *ls = q;
                while (isalnum((unsigned char)*q) || *q == '_')
                    q++;
                if (q == ls || q[0] != '=' || q[1] != '"')
                    fail_msg("line %d: bad label at column %d", line_no, (int)(ls - p) + 1);
                q += 2;
                while (*q != '"') {
                    if (*q == '\n' || !*q)
                        fail_msg("line %d: unterminated label value", line_no);
                    if (*q == '\\') {
                        if (q[1] != '\\' && q[1] != '"' && q[1] != 'n')
                            fail_msg("line %d: bad escape in a label value", line_no);
                        q++;
                    }
                    q++;
                }
                q++;
                if (*q == ',') {
                    q++;
                    continue;
                }
                if (*q != '}')
                    fail_msg("line %d: expected , or } after a label", line_no);
                q++;
                break;
            }
        }
        if (*q != ' ')
            fail_msg("line %d: expected a space before the value", line_no);
        char *end;
        strtod(q + 1, &end);
        if (end == q + 1 || end != nl)
            fail_msg("line %d: bad value: %.*s", line_no, (int)(nl - p), p);
        p = nl + 1;
    }
}

/* The value of the sample written exactly `series` (name plus labels as printed);
 * NAN when there is none. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return NAN;
}

static char *metrics_text(struct harness *h)
{
    char *out = malloc(METRICS_MAX);
    assert_non_null(out);
    int rc = harness_ctl(h, out, METRICS_MAX, "metrics", (char *)NULL);
    if (rc != 0)
        fail_msg("loaderctl metrics exited %d: %s", rc, out);
    check_grammar(out);
    return out;
}

static cJSON *request(struct harness *h, const char *op)
{
    lc_client *c = harness_connect(h, 5000, "itest-metrics-probe");
    char req[64], *json = NULL;
    snprintf(req, sizeof req, "{\"op\":\"%s\"}", op);
    assert_int_equal(lc_request_json(c, req, &json), 0);
    cJSON *r = cJSON_Parse(json);
    lc_free(json);
    lc_client_close(c);
    assert_non_null(r);
    return r;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("no number '%s' in the reply", key);
    return v->valuedouble;
}

/* Values that only move while batches are prepared and handed out: equal in two texts
 * means nothing moved in between. */
static bool same_counters(const char *a, const char *b)
{
    static const char *const keys[] = {"loaderd_batches_served_total", "loaderd_samples_served_total",
                                       "loaderd_slots{state=\"free\"}", "loaderd_slots{state=\"filling\"}",
                                       "loaderd_slots{state=\"ready\"}", "loaderd_slots{state=\"leased\"}",
                                       "loaderd_cache_samples_total{dataset=\"rec\"}"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (sample(a, keys[i]) != sample(b, keys[i]))
            return false;
    /* The cache's state line (its build runs on a thread of its own). */
    const char *ca = strstr(a, "\nloaderd_cache_state{"), *cb = strstr(b, "\nloaderd_cache_state{");
    if (!ca || !cb)
        return false;
    size_t la = strcspn(ca + 1, "\n"), lb = strcspn(cb + 1, "\n");
    return la == lb && memcmp(ca, cb, la + 1) == 0;
}

static lc_stream *open_and_read(lc_client *c, uint32_t batch_size, int batches, lc_batch **ret_held)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = batch_size;
    o.seed = 5;
    lc_stream *s = NULL;
    if (lc_stream_open(c, "rec", &o, &s) < 0)
        fail_msg("open: %s", lc_client_error(c));
    lc_batch *b = NULL;
    for (int i = 0; i < batches; i++) {
        if (b)
            assert_int_equal(lc_batch_release(b), 0);
        assert_int_equal(lc_stream_next(s, 20000, &b), 0);
    }
    *ret_held = b;
    return s;
}

/* Runs promtool's linter on the text when promtool is installed. */
static void promtool_check(struct harness *h, const char *text)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        printf("promtool check skipped: promtool is not installed (Debian package prometheus)\n");
        return;
    }
    char path[256], cmd[600];
    snprintf(path, sizeof path, "%s/metrics.txt", h->dir);
    harness_write_file(h, "metrics.txt", text, strlen(text));
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int rc = system(cmd);
    if (rc != 0)
        fail_msg("promtool check metrics failed (%d) on:\n%s", rc, text);
}

/* Every loaderd_* name the Grafana dashboard queries is a family of the text. */
static void check_dashboard(const char *text)
{
    FILE *f = fopen("contrib/grafana/loaderd.json", "r");
    if (!f)
        fail_msg("cannot open contrib/grafana/loaderd.json (run from the repository root)");
    static char json[256 * 1024];
    size_t n = fread(json, 1, sizeof json - 1, f);
    fclose(f);
    json[n] = '\0';
    int names = 0;
    for (const char *p = json; (p = strstr(p, "loaderd_")) != NULL;) {
        char name[128], type[140];
        size_t k = 0;
        while (k < sizeof name - 1 && (islower((unsigned char)p[k]) || p[k] == '_'))
            name[k] = p[k], k++;
        name[k] = '\0';
        p += k;
        if (strcmp(name, "loaderd_") == 0)
            continue;
        snprintf(type, sizeof type, "# TYPE %s ", name);
        if (!strstr(text, type))
            fail_msg("the dashboard queries %s, which loaderd does not export", name);
        names++;
    }
    assert_true(names >= 15);
}

static void test_metrics_agree_with_status(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n",
                         "  rec:\n    kind: files\n    path: rec\n    cache: {path: rec.ldc}\n");
    harness_start(h);

    lc_client *a = harness_connect(h, 5000, "trainer-a");
    lc_client *b = harness_connect(h, 5000, "odd \"name\\");
    lc_batch *held_a, *held_b;
    lc_stream *sa = open_and_read(a, 16, 5, &held_a);
    lc_stream *sb = open_and_read(b, 10, 2, &held_b);

    /* Take metrics, status and streams between two metrics that agree: then nothing moved
     * while status and streams were read (the readers ahead finish within moments). */
    char *m1 = NULL, *m2 = NULL;
    cJSON *st = NULL, *streams = NULL;
    for (int tries = 0; tries < 100; tries++) {
        free(m1);
        m1 = m2 ? m2 : metrics_text(h);
        cJSON_Delete(st);
        cJSON_Delete(streams);
        st = request(h, "status");
        streams = request(h, "streams");
        m2 = metrics_text(h);
        if (same_counters(m1, m2))
            break;
        usleep(20000);
    }
    assert_true(same_counters(m1, m2));

    /* Daemon-wide. */
    assert_true(sample(m2, "loaderd_batches_served_total") == num(st, "batches_served"));
    assert_true(sample(m2, "loaderd_samples_served_total") == num(st, "samples_served"));
    assert_true(sample(m2, "loaderd_bytes_served_total") == num(st, "bytes_served"));
    assert_true(sample(m2, "loaderd_samples_served_total") >= 16 * 5 + 10 * 2);
    assert_true(sample(m2, "loaderd_streams") == 2 && num(st, "streams") == 2);
    /* The two trainers and the one asking (loaderctl for metrics, a probe for status). */
    assert_true(sample(m2, "loaderd_clients") == 3 && num(st, "clients") == 3);
    assert_true(sample(m2, "loaderd_workers") == num(st, "workers"));
    assert_true(sample(m2, "loaderd_memory_used_bytes") == num(st, "memory_used"));
    assert_true(sample(m2, "loaderd_memory_used_bytes") > 0);
    assert_true(sample(m2, "loaderd_memory_budget_bytes") == num(st, "memory_budget"));
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(st, "slots");
    static const char *const states[] = {"free", "filling", "ready", "leased", "copying"};
    for (int k = 0; k < 5; k++) {
        char series[64];
        snprintf(series, sizeof series, "loaderd_slots{state=\"%s\"}", states[k]);
        assert_true(sample(m2, series) == num(slots, states[k]));
    }
    assert_true(sample(m2, "loaderd_slots{state=\"leased\"}") >= 2); /* each trainer holds one */
    /* Time-like values move on their own: status lies between the two texts. */
    assert_true(sample(m1, "loaderd_uptime_seconds") <= num(st, "uptime_s") + 1e-6);
    assert_true(num(st, "uptime_s") <= sample(m2, "loaderd_uptime_seconds") + 1e-6);
    assert_true(sample(m1, "loaderd_wait_seconds_total") <= num(st, "client_wait_s") + 1e-6);
    assert_true(num(st, "client_wait_s") <= sample(m2, "loaderd_wait_seconds_total") + 1e-6);
    assert_true(sample(m1, "loaderd_worker_busy_seconds_total") <= num(st, "worker_busy_s") + 1e-6);
    assert_true(num(st, "worker_busy_s") <= sample(m2, "loaderd_worker_busy_seconds_total") + 1e-6);
    assert_true(sample(m2, "loaderd_process_resident_memory_bytes") > 1e6);
    assert_true(sample(m2, "loaderd_process_cpu_seconds_total") > 0);
    assert_true(sample(m2, "loaderd_bad_samples_total{dataset=\"rec\"}") == num(st, "bad_samples"));
    assert_true(sample(m2, "loaderd_replaced_samples_total{dataset=\"rec\"}") == num(st, "replaced_samples"));
    const cJSON *cache = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(st, "caches"), 0);
    assert_non_null(cache);
    char series[256];
    snprintf(series, sizeof series, "loaderd_cache_state{dataset=\"rec\",state=\"%s\"}",
             cJSON_GetObjectItemCaseSensitive(cache, "state")->valuestring);
    assert_true(sample(m2, series) == 1);
    assert_true(sample(m2, "loaderd_cache_samples_total{dataset=\"rec\"}") == num(cache, "hits"));
    assert_true(sample(m2, "loaderd_cache_bytes_total{dataset=\"rec\"}") == num(cache, "hit_bytes"));

    /* Per stream and per client, against `streams`. */
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(streams, "streams");
    assert_int_equal(cJSON_GetArraySize(list), 2);
    const cJSON *js;
    cJSON_ArrayForEach(js, list)
    {
        char labels[160];
        snprintf(labels, sizeof labels, "{dataset=\"rec\",stream=\"%.0f\",client=\"%.0f\"}", num(js, "id"),
                 num(js, "client_id"));
        static const char *const counters[] = {"batches_served", "samples_served", "bytes_served"};
        for (int k = 0; k < 3; k++) {
            snprintf(series, sizeof series, "loaderd_stream_%s_total%s", counters[k], labels);
            if (sample(m2, series) != num(js, counters[k]))
                fail_msg("%s is %g, streams says %g", series, sample(m2, series), num(js, counters[k]));
            /* One stream per client, none closed: the client's counter is the stream's. */
            snprintf(series, sizeof series, "loaderd_client_%s_total{client=\"%.0f\"}", counters[k],
                     num(js, "client_id"));
            assert_true(sample(m2, series) == num(js, counters[k]));
        }
        for (int k = 0; k < 4; k++) {
            snprintf(series, sizeof series, "loaderd_stream_slots{dataset=\"rec\",stream=\"%.0f\",client=\"%.0f\",state=\"%s\"}",
                     num(js, "id"), num(js, "client_id"), states[k]);
            assert_true(sample(m2, series) == num(js, states[k]));
        }
        snprintf(series, sizeof series, "loaderd_stream_wait_seconds_total%s", labels);
        assert_true(sample(m1, series) <= num(js, "client_wait_s") + 1e-6);
        assert_true(num(js, "client_wait_s") <= sample(m2, series) + 1e-6);
        const char *name = cJSON_GetObjectItemCaseSensitive(js, "client")->valuestring;
        snprintf(series, sizeof series, "loaderd_client_info{client=\"%.0f\",client_name=\"%s\"}",
                 num(js, "client_id"), strcmp(name, "trainer-a") == 0 ? "trainer-a" : "odd \\\"name\\\\");
        if (sample(m2, series) != 1)
            fail_msg("no %s in:\n%s", series, m2);
    }
    promtool_check(h, m2);
    check_dashboard(m2);

    /* The op itself says what the text is. */
    cJSON *r = request(h, "metrics");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(r, "content_type")->valuestring,
                        "text/plain; version=0.0.4; charset=utf-8");
    assert_true(strncmp(cJSON_GetObjectItemCaseSensitive(r, "text")->valuestring, "# HELP loaderd_", 15) == 0);
    cJSON_Delete(r);

    /* A closed stream's wait and counts stay with its client and the daemon. */
    double before = sample(m2, "loaderd_samples_served_total");
    assert_int_equal(lc_batch_release(held_b), 0);
    lc_stream_close(sb);
    char *m3 = metrics_text(h);
    assert_true(sample(m3, "loaderd_streams") == 1);
    assert_true(sample(m3, "loaderd_samples_served_total") >= before);
    assert_true(strstr(m3, "loaderd_client_streams{client=") != NULL);

    free(m1);
    free(m2);
    free(m3);
    cJSON_Delete(st);
    cJSON_Delete(streams);
    assert_int_equal(lc_batch_release(held_a), 0);
    lc_stream_close(sa);
    lc_client_close(a);
    lc_client_close(b);
    harness_stop_clean(h);
}

/* ---- the HTTP listener ------------------------------------------------------------ */

static int connect_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        fail_msg("connect %s: %s", path, strerror(errno));
    return fd;
}

static int connect_tcp(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        fail_msg("connect 127.0.0.1:%u: %s", port, strerror(errno));
    return fd;
}

/* A port nothing listens on now (the kernel's choice for port 0). */
static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* Sends `req` (may be empty), then reads until the daemon closes, at most 10 s. Returns
 * what came (malloc'ed, NUL-terminated); *ret_secs: how long until the close. */
static char *http_exchange(int fd, const char *req, double *ret_secs)
{
    size_t n = strlen(req), off = 0;
    while (off < n) {
        ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL); /* the daemon may have closed */
        if (w <= 0)
            break; /* the daemon may already have answered and closed */
        off += (size_t)w;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double spent = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (spent > 10)
            fail_msg("the metrics listener did not close the connection within 10 s");
        if (poll(&p, 1, 200) <= 0)
            continue;
        if (len == cap)
            assert_non_null(buf = realloc(buf, (cap *= 2) + 1));
        ssize_t r = read(fd, buf + len, cap - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (ret_secs)
        *ret_secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    buf[len] = '\0';
    close(fd);
    return buf;
}

/* The body of a 200 reply, after checking its status line and headers. */
static const char *http_body(const char *reply, bool head)
{
    if (strncmp(reply, "HTTP/1.0 200 OK\r\n", 17) != 0)
        fail_msg("not a 200 reply: %.200s", reply);
    if (!strstr(reply, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"))
        fail_msg("no Prometheus content type: %.300s", reply);
    const char *body = strstr(reply, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    const char *cl = strstr(reply, "\r\nContent-Length: ");
    assert_non_null(cl);
    size_t n = strtoul(cl + 18, NULL, 10);
    assert_true(n > 100);
    assert_int_equal(strlen(body), head ? 0 : n);
    return body;
}

static void assert_status(const char *reply, const char *status)
{
    if (strncmp(reply, status, strlen(status)) != 0)
        fail_msg("expected %s, got: %.200s", status, reply);
}

static void test_http_unix(void **state)
{
    struct harness *h = *state;
    char path[100], extra[256];
    assert_true((size_t)snprintf(path, sizeof path, "%s/m.sock", h->dir) < sizeof path);
    snprintf(extra, sizeof extra, "  workers: 2\n  metrics: {listen: 'unix:%s'}\n", path);
    harness_write_config(h, extra, "  rec:\n    kind: files\n    path: rec\n");
    /* A socket file left by a process that is gone is replaced. */
    int stale = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    assert_int_equal(bind(stale, (struct sockaddr *)&sa, sizeof sa), 0);
    close(stale);
    harness_start(h);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);

    lc_client *a = harness_connect(h, 5000, "trainer-a");
    lc_batch *held;
    lc_stream *s = open_and_read(a, 16, 3, &held);
    char *reply = http_exchange(connect_unix(path), "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n", NULL);
    const char *body = http_body(reply, false);
    check_grammar(body);
    assert_true(sample(body, "loaderd_clients") == 1); /* a scrape is not a client */
    assert_true(sample(body, "loaderd_streams") == 1);
    assert_true(sample(body, "loaderd_samples_served_total") >= 48);
    free(reply);
    reply = http_exchange(connect_unix(path), "HEAD /metrics?x=1 HTTP/1.1\n\n", NULL);
    http_body(reply, true);
    free(reply);

    /* Wrong requests get their status and a closed connection. */
    reply = http_exchange(connect_unix(path), "GET / HTTP/1.0\r\n\r\n", NULL);
    assert_status(reply, "HTTP/1.0 404 Not Found\r\n");
    free(reply);
    reply = http_exchange(connect_unix(path), "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", NULL);
    assert_status(reply, "HTTP/1.0 405 Method Not Allowed\r\n");
    free(reply);
    reply = http_exchange(connect_unix(path), "hello\r\n\r\n", NULL);
    assert_status(reply, "HTTP/1.0 400 Bad Request\r\n");
    free(reply);
    char big[6000];
    memcpy(big, "GET /metrics HTTP/1.0\r\nX-Pad: ", 30);
    memset(big + 30, 'a', sizeof big - 31);
    big[sizeof big - 1] = '\0';
    reply = http_exchange(connect_unix(path), big, NULL);
    assert_status(reply, "HTTP/1.0 431 Request Header Fields Too Large\r\n");
    free(reply);

    /* A request that never completes, and a connection that says nothing, are closed
     * after the timeout (3 s) while other scrapes are served. */
    int slow = connect_unix(path), silent = connect_unix(path);
    assert_int_equal(write(slow, "GET /met", 8), 8);
    reply = http_exchange(connect_unix(path), "GET /metrics HTTP/1.0\r\n\r\n", NULL);
    http_body(reply, false);
    free(reply);
    /* Past 16 connections at once, a new one is closed at once, unanswered. */
    int extra_fds[14];
    for (int i = 0; i < 14; i++)
        extra_fds[i] = connect_unix(path);
    double secs;
    bool refused = false;
    for (int tries = 0; tries < 20 && !refused; tries++) { /* until the daemon has accepted all 16 */
        reply = http_exchange(connect_unix(path), "GET /metrics HTTP/1.0\r\n\r\n", &secs);
        refused = reply[0] == '\0' && secs < 1;
        free(reply);
        if (!refused)
            usleep(50000);
    }
    assert_true(refused);
    reply = http_exchange(slow, "", &secs);
    assert_status(reply, "HTTP/1.0 408 Request Timeout\r\n");
    assert_true(secs < 5);
    free(reply);
    reply = http_exchange(silent, "", &secs);
    assert_string_equal(reply, "");
    free(reply);
    for (int i = 0; i < 14; i++)
        close(extra_fds[i]);
    /* Once they are gone, scrapes are served again. */
    reply = http_exchange(connect_unix(path), "GET /metrics HTTP/1.0\r\n\r\n", NULL);
    http_body(reply, false);
    free(reply);

    assert_int_equal(lc_batch_release(held), 0);
    lc_stream_close(s);
    lc_client_close(a);
    harness_stop_clean(h);
    assert_int_equal(access(path, F_OK), -1); /* the socket file is removed on stop */
}

static void test_http_tcp(void **state)
{
    struct harness *h = *state;
    uint16_t port = free_port();
    char extra[128];
    snprintf(extra, sizeof extra, "  metrics:\n    listen: 127.0.0.1:%u\n", port);
    harness_write_config(h, extra, "  rec:\n    kind: files\n    path: rec\n");
    harness_start(h);
    char *reply = http_exchange(connect_tcp(port), "GET /metrics HTTP/1.0\r\n\r\n", NULL);
    const char *body = http_body(reply, false);
    check_grammar(body);
    assert_non_null(strstr(body, "\nloaderd_build_info{version=\""));
    free(reply);
    harness_stop_clean(h);
}

static void test_listen_refused(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  metrics: {listen: 0.0.0.0:9464}\n", "  rec:\n    kind: files\n    path: rec\n");
    const char *const no_args[] = {NULL};
    int rc = harness_run_to_exit(h, no_args);
    char *log = harness_log(h);
    if (rc != 1 || !strstr(log, "server.metrics.listen: '0.0.0.0:9464': 0.0.0.0 is not a loopback address"))
        fail_msg("exit %d, log:\n%s", rc, log);
    free(log);
}

/* A configured dataset that cannot be opened is in the text as
 * loaderd_dataset_available 0 (and agrees with status); once its folder exists, a
 * reload makes it 1. */
static void test_dataset_available(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 1\n",
                         "  rec:\n    kind: files\n    path: rec\n"
                         "  later:\n    kind: files\n    path: later\n");
    harness_start(h);
    char *m = metrics_text(h);
    cJSON *st = request(h, "status");
    assert_true(sample(m, "loaderd_dataset_available{dataset=\"rec\"}") == 1);
    assert_true(sample(m, "loaderd_dataset_available{dataset=\"later\"}") == 0);
    assert_true(num(st, "datasets_unavailable") == 1);
    assert_non_null(strstr(m, "# TYPE loaderd_dataset_available gauge\n"));
    promtool_check(h, m);
    free(m);
    cJSON_Delete(st);
    harness_gen_files(h, "later", 10, 16, 0, false);
    char out[4096];
    assert_int_equal(harness_ctl(h, out, sizeof out, "reload", (char *)NULL), 0);
    m = metrics_text(h);
    assert_true(sample(m, "loaderd_dataset_available{dataset=\"later\"}") == 1);
    assert_true(sample(m, "loaderd_dataset_available{dataset=\"rec\"}") == 1);
    free(m);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_metrics_agree_with_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http_unix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http_tcp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listen_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dataset_available, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
