/* Unit tests for daemon/metrics.c: a known snapshot becomes the exact sample lines we
 * document, label values are escaped, every family is announced once (HELP, then TYPE)
 * before its samples and its samples are not interleaved with another family's, and
 * /proc/PID/stat is parsed from the last ')' so that a command name with spaces and
 * parentheses cannot shift the fields. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ld_error.h"
#include "metrics.h"

static const struct metrics_stream two_streams[] = {
    {.id = 7, .dataset = "imagenet", .client_id = 3, .batches = 10, .samples = 640, .bytes = 123456789012ull,
     .wait_s = 1.5, .slots = {1, 2, 3, 4}, .worker_cpu_s = 2.5, .stall = 0.25, .samples_per_s_now = 1000,
     .samples_per_s = 812.5, .prefetch_depth = 5},
    {.id = 9, .dataset = "tokens", .client_id = 4, .batches = 0, .samples = 0, .bytes = 0, .wait_s = 0,
     .slots = {4, 0, 0, 0}},
};

static const struct metrics_client two_clients[] = {
    {.id = 3, .name = "we\"ird\\name\nx", .streams = 1, .batches = 12, .samples = 700, .bytes = 900, .wait_s = 2.25,
     .worker_cpu_s = 3.5, .connected_s = 9, .samples_per_s_now = 1000},
    {.id = 4, .name = "", .streams = 1},
};

static const struct metrics_dataset two_datasets[] = {
    {.name = "imagenet", .bad_samples = 5, .replaced_samples = 4, .cache_state = "ready", .cache_samples = 600,
     .cache_bytes = 6000},
    {.name = "tokens", .bad_samples = 0, .replaced_samples = 0, .cache_state = NULL},
};

static const char *const one_unavailable[] = {"later"};

static const struct metrics_share one_share[] = {
    {.name = "sweep", .producer = 12, .consumers = 3, .worker_cpu_s = 4.25},
};

static struct metrics_snapshot snapshot(void)
{
    struct metrics_snapshot s = {
        .version = "0.1.0",
        .uptime_s = 12.5,
        .clients = 2,
        .streams = 2,
        .workers = 8,
        .batches = 18446744073709551615ull, /* a counter's whole range is printed exactly */
        .samples = 700,
        .bytes = 900,
        .wait_s = 3.75,
        .worker_busy_s = 0.25,
        .memory_budget = 1ull << 30,
        .memory_used = 4096,
        .queued_reply_bytes = 17,
        .slots = {5, 2, 3, 4},
        .have_process = true,
        .rss_bytes = 10485760,
        .cpu_s = 1.125,
        .stream = two_streams,
        .n_streams = 2,
        .client = two_clients,
        .n_clients = 2,
        .dataset = two_datasets,
        .n_datasets = 2,
        .unavailable = one_unavailable,
        .n_unavailable = 1,
        .share = one_share,
        .n_shares = 1,
    };
    return s;
}

static char *format(const struct metrics_snapshot *s)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(metrics_format(s, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

/* The text holds `line` as a whole line. */
static void assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    }
    fail_msg("line not found: %s\n--- in ---\n%s", line, text);
}

static void test_values(void **state)
{
    struct metrics_snapshot s = snapshot();
    char *t = format(&s);
    assert_line(t, "loaderd_build_info{version=\"0.1.0\"} 1");
    assert_line(t, "loaderd_uptime_seconds 12.5");
    assert_line(t, "loaderd_clients 2");
    assert_line(t, "loaderd_streams 2");
    assert_line(t, "loaderd_workers 8");
    assert_line(t, "loaderd_batches_served_total 18446744073709551615");
    assert_line(t, "loaderd_samples_served_total 700");
    assert_line(t, "loaderd_bytes_served_total 900");
    assert_line(t, "loaderd_wait_seconds_total 3.75");
    assert_line(t, "loaderd_worker_busy_seconds_total 0.25");
    assert_line(t, "loaderd_memory_budget_bytes 1073741824");
    assert_line(t, "loaderd_memory_used_bytes 4096");
    assert_line(t, "loaderd_queued_reply_bytes 17");
    assert_line(t, "loaderd_slots{state=\"free\"} 5");
    assert_line(t, "loaderd_slots{state=\"leased\"} 4");
    assert_line(t, "loaderd_process_resident_memory_bytes 10485760");
    assert_line(t, "loaderd_process_cpu_seconds_total 1.125");
    assert_line(t, "loaderd_bad_samples_total{dataset=\"imagenet\"} 5");
    assert_line(t, "loaderd_replaced_samples_total{dataset=\"imagenet\"} 4");
    assert_line(t, "loaderd_bad_samples_total{dataset=\"tokens\"} 0");
    assert_line(t, "loaderd_dataset_available{dataset=\"imagenet\"} 1");
    assert_line(t, "loaderd_dataset_available{dataset=\"tokens\"} 1");
    assert_line(t, "loaderd_dataset_available{dataset=\"later\"} 0");
    assert_line(t, "loaderd_cache_state{dataset=\"imagenet\",state=\"ready\"} 1");
    assert_line(t, "loaderd_cache_samples_total{dataset=\"imagenet\"} 600");
    assert_line(t, "loaderd_cache_bytes_total{dataset=\"imagenet\"} 6000");
    assert_null(strstr(t, "loaderd_cache_state{dataset=\"tokens\"")); /* no cache configured */
    assert_null(strstr(t, "loaderd_cache_samples_total{dataset=\"tokens\""));
    assert_line(t, "loaderd_stream_batches_served_total{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 10");
    assert_line(t, "loaderd_stream_samples_served_total{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 640");
    assert_line(t, "loaderd_stream_bytes_served_total{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 123456789012");
    assert_line(t, "loaderd_stream_wait_seconds_total{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 1.5");
    assert_line(t, "loaderd_stream_slots{dataset=\"imagenet\",stream=\"7\",client=\"3\",state=\"filling\"} 2");
    assert_line(t, "loaderd_stream_slots{dataset=\"tokens\",stream=\"9\",client=\"4\",state=\"free\"} 4");
    assert_line(t, "loaderd_client_info{client=\"3\",client_name=\"we\\\"ird\\\\name\\nx\"} 1");
    assert_line(t, "loaderd_client_info{client=\"4\",client_name=\"\"} 1");
    assert_line(t, "loaderd_client_streams{client=\"3\"} 1");
    assert_line(t, "loaderd_client_samples_served_total{client=\"3\"} 700");
    assert_line(t, "loaderd_client_wait_seconds_total{client=\"3\"} 2.25");
    /* Scheduling and data stall. */
    assert_line(t, "loaderd_stream_worker_cpu_seconds_total{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 2.5");
    assert_line(t, "loaderd_stream_stall_ratio{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 0.25");
    assert_line(t, "loaderd_stream_samples_per_second{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 1000");
    assert_line(t, "loaderd_stream_samples_per_second_average{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 812.5");
    assert_line(t, "loaderd_stream_prefetch_depth{dataset=\"imagenet\",stream=\"7\",client=\"3\"} 5");
    assert_line(t, "loaderd_stream_stall_ratio{dataset=\"tokens\",stream=\"9\",client=\"4\"} 0");
    assert_line(t, "loaderd_client_worker_cpu_seconds_total{client=\"3\"} 3.5");
    assert_line(t, "loaderd_client_stall_ratio{client=\"3\"} 0.25");
    assert_line(t, "loaderd_client_stall_ratio{client=\"4\"} 0"); /* not connected for any time yet */
    assert_line(t, "loaderd_client_samples_per_second{client=\"3\"} 1000");
    /* A shared stream's preparation: once per group, whatever its consumers. */
    assert_line(t, "loaderd_share_consumers{share=\"sweep\",producer=\"12\"} 3");
    assert_line(t, "loaderd_share_worker_cpu_seconds_total{share=\"sweep\",producer=\"12\"} 4.25");
    free(t);
}

/* Every sample line belongs to the family announced last (HELP then TYPE), no family is
 * announced twice, counters end in _total and gauges do not. */
static void check_structure(const char *text, int *ret_families, int *ret_samples)
{
    char family[128] = "", seen[8192] = " ";
    int families = 0, samples = 0;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl); /* the text ends with a newline */
        char line[512];
        size_t n = (size_t)(nl - p);
        assert_true(n < sizeof line);
        memcpy(line, p, n);
        line[n] = '\0';
        p = nl + 1;
        char name[128], type[32];
        if (sscanf(line, "# HELP %127s", name) == 1) {
            char key[140];
            snprintf(key, sizeof key, " %s ", name);
            if (strstr(seen, key))
                fail_msg("family %s announced twice", name);
            assert_true(strlen(seen) + strlen(key) < sizeof seen);
            strcat(seen, key + 1);
            snprintf(family, sizeof family, "%s", name);
            families++;
            assert_true(strchr(nl + 1, '\n') != NULL);
            assert_int_equal(sscanf(nl + 1, "# TYPE %127s %31s", name, type), 2);
            assert_string_equal(name, family);
            size_t fl = strlen(family);
            bool total = fl > 6 && strcmp(family + fl - 6, "_total") == 0;
            if (strcmp(type, "counter") == 0)
                assert_true(total);
            else
                assert_true(strcmp(type, "gauge") == 0 && !total);
            p = strchr(nl + 1, '\n') + 1;
            continue;
        }
        assert_true(line[0] != '#');
        size_t fl = strlen(family);
        if (fl == 0 || strncmp(line, family, fl) != 0 || (line[fl] != ' ' && line[fl] != '{'))
            fail_msg("sample outside its family (%s): %s", family, line);
        samples++;
    }
    *ret_families = families;
    *ret_samples = samples;
}

static void test_structure(void **state)
{
    struct metrics_snapshot s = snapshot();
    char *t = format(&s);
    int families, samples;
    check_structure(t, &families, &samples);
    assert_true(families >= 30);
    free(t);

    /* An idle daemon: every family is still announced, with its unlabelled samples only. */
    struct metrics_snapshot idle = {.version = "0.1.0"};
    t = format(&idle);
    int idle_families, idle_samples;
    check_structure(t, &idle_families, &idle_samples);
    assert_int_equal(idle_families, families - 2); /* no process metrics */
    assert_null(strstr(t, "loaderd_process_"));
    assert_null(strstr(t, "{dataset="));
    assert_null(strstr(t, "{client="));
    assert_true(idle_samples < samples);
    free(t);
}

static void test_proc_stat(void **state)
{
    uint64_t rss = 1;
    double cpu = 1;
    /* Fields 3..24 after a command name holding ") (" and spaces; utime 250, stime 150,
     * rss 300 pages. */
    const char *stat = "1234 (a) (b c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 9 0 5000 "
                       "123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
    assert_int_equal(metrics_parse_proc_stat(stat, 4096, 100, &rss, &cpu), 0);
    assert_int_equal(rss, 300 * 4096);
    assert_true(cpu > 3.999 && cpu < 4.001);

    uint64_t r2 = 7;
    double c2 = 7;
    assert_int_equal(metrics_parse_proc_stat("1234 (x) S 1 2 3\n", 4096, 100, &r2, &c2), LD_EINVAL);
    assert_int_equal(metrics_parse_proc_stat("no parenthesis", 4096, 100, &r2, &c2), LD_EINVAL);
    assert_int_equal(metrics_parse_proc_stat(NULL, 4096, 100, &r2, &c2), LD_EINVAL);
    assert_int_equal(metrics_parse_proc_stat(stat, 0, 100, &r2, &c2), LD_EINVAL);
    const char *letters = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 ab 1 0 0 20 0 1 0 1 1 1 1\n";
    assert_int_equal(metrics_parse_proc_stat(letters, 4096, 100, &r2, &c2), LD_EINVAL);
    assert_int_equal(r2, 7); /* untouched on failure */
    assert_true(c2 == 7);

    /* This process: some resident memory, and CPU time that does not go backwards. */
    assert_int_equal(metrics_read_self(&rss, &cpu), 0);
    assert_true(rss > 0);
    volatile double x = 0;
    for (int i = 0; i < 2000000; i++)
        x += i;
    double cpu2;
    assert_int_equal(metrics_read_self(&rss, &cpu2), 0);
    assert_true(cpu2 >= cpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_proc_stat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
