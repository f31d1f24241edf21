/* itest_device — the device stage as a host without a GPU sees it, against a real
 * loaderd: a stream that asks for "cuda:N" gets a clear error that names the device and
 * why it cannot have it (no driver here, or a build without CUDA), while the daemon
 * keeps serving host batches to every other stream; malformed device requests are
 * refused field by field; "transfer": "client" is served from host slots (the trainer
 * copies) with the device named in the open reply; and the per-stream state shows the
 * COPYING count. No test here pretends a GPU exists: on a host with /dev/nvidiactl the
 * tests that need its absence are skipped (scripts/gpu-check.sh covers that host). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 64
#define FILE_SIZE 32

static int setup_daemon(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 4, false);
    harness_write_config(h, "  workers: 2\n  memory_budget: 64MiB\n  device_memory_budget: 1GiB\n",
                         "  records:\n    kind: files\n    path: rec\n");
    harness_start(h);
    *state = h;
    return 0;
}

static int teardown_daemon(void **state)
{
    harness_free(*state);
    return 0;
}

static bool gpu_present(void)
{
    return access("/dev/nvidiactl", F_OK) == 0;
}

/* Sends a raw request on c; returns its code and, in msg, the client's error text. */
static int request(lc_client *c, const char *json, cJSON **ret_reply)
{
    char *reply = NULL;
    int rc = lc_request_json(c, json, &reply);
    if (ret_reply)
        *ret_reply = reply ? cJSON_Parse(reply) : NULL;
    lc_free(reply);
    return rc;
}

static lc_stream *open_host(lc_client *c)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    lc_stream *s = NULL;
    int r = lc_stream_open(c, "records", &o, &s);
    if (r < 0)
        fail_msg("lc_stream_open: %s: %s", lc_strerror(r), lc_client_error(c));
    return s;
}

/* Reads n batches of s and checks each is whole. */
static void read_batches(lc_stream *s, int n)
{
    for (int i = 0; i < n; i++) {
        lc_batch *b = NULL;
        assert_int_equal(lc_stream_next(s, 10000, &b), 0);
        assert_int_equal(lc_batch_rows(b), 4);
        assert_true(lc_batch_valid(b));
        assert_int_equal(lc_batch_release(b), 0);
    }
}

/* A device stream fails at open with the reason; a host stream opened before it and one
 * opened after both keep getting batches. */
static void test_device_open_fails_clearly(void **state)
{
    struct harness *h = *state;
    if (gpu_present())
        skip();
    lc_client *a = harness_connect(h, 10000, "host-trainer");
    lc_client *b = harness_connect(h, 10000, "gpu-trainer");
    lc_stream *before = open_host(a);
    read_batches(before, 2);
    for (int i = 0; i < 3; i++) {
        const char *req = i == 1 ? "{\"op\":\"open\",\"dataset\":\"records\",\"batch_size\":4,\"device\":\"cuda:3\"}"
                                 : "{\"op\":\"open\",\"dataset\":\"records\",\"batch_size\":4,\"device\":\"cuda:0\"}";
        assert_int_equal(request(b, req, NULL), LC_EDEVICE);
        const char *msg = lc_client_error(b);
        assert_non_null(strstr(msg, i == 1 ? "device: cuda:3: " : "device: cuda:0: "));
        /* Here: no driver (a CUDA build) or no CUDA at all (CUDA=0). */
        if (!strstr(msg, "no NVIDIA driver") && !strstr(msg, "built without CUDA"))
            fail_msg("the error does not say why: %s", msg);
        read_batches(before, 1);
    }
    /* A device stream that failed holds nothing: no stream, no shared memory (the host
     * stream's name went at its first next). */
    assert_true(harness_status_num(h, "streams", NULL) == 1);
    assert_int_equal(harness_shm_count(h->pid, NULL, 0), 0);
    lc_stream *after = open_host(b);
    read_batches(after, 2);
    read_batches(before, 2);
    assert_int_equal(lc_stream_close(after), 0);
    assert_int_equal(lc_stream_close(before), 0);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "device: cuda:0: "));
    free(log);
    lc_client_close(a);
    lc_client_close(b);
    harness_stop_clean(h);
}

/* Malformed device requests are refused with the field named; nothing is opened. */
static void test_device_bad_fields(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "bad");
    static const struct {
        const char *extra, *needle;
    } cases[] = {
        {"\"device\":\"gpu0\"", "field 'device': expected \"cuda:N\""},
        {"\"device\":\"cuda:\"", "field 'device'"},
        {"\"device\":\"cuda:01\"", "field 'device'"},
        {"\"device\":\"cuda:256\"", "the ordinal must be an integer in [0, 255]"},
        {"\"device\":7", "field 'device': expected a string"},
        {"\"transfer\":\"client\"", "field 'transfer': \"client\" needs a device"},
        {"\"device\":\"cuda:0\",\"transfer\":\"dma\"", "field 'transfer': expected \"ipc\" or \"client\""},
        {"\"device_normalize\":{\"field\":\"data\",\"mean\":[0.5],\"std\":[0.5]}",
         "field 'device_normalize': needs \"device\""},
        {"\"device\":\"cuda:0\",\"device_normalize\":{\"field\":\"nope\",\"mean\":[0.5],\"std\":[0.5]}",
         "dataset 'records' has no field 'nope'"},
        {"\"device\":\"cuda:0\",\"device_normalize\":{\"field\":\"data\",\"mean\":[0.5],\"std\":[0.5]}",
         "must be a uint8 image of 3 dims"},
        {"\"device\":\"cuda:0\",\"device_normalize\":[1]", "field 'device_normalize': expected an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char req[512];
        snprintf(req, sizeof req, "{\"op\":\"open\",\"dataset\":\"records\",\"batch_size\":4,%s}", cases[i].extra);
        int rc = request(c, req, NULL);
        if (rc != LC_EFIELD || !strstr(lc_client_error(c), cases[i].needle))
            fail_msg("%s: got %s: %s (expected bad_field saying %s)", cases[i].extra, lc_error_name(rc),
                     lc_client_error(c), cases[i].needle);
    }
    assert_true(harness_status_num(h, "streams", NULL) == 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* transfer "client": the daemon serves host slots (no GPU needed on its side) and the
 * open reply names the device for the trainer's own copy; the stream's state has the
 * COPYING count. */
static void test_transfer_client_reply(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "client-copy");
    cJSON *reply = NULL;
    assert_int_equal(request(c, "{\"op\":\"open\",\"dataset\":\"records\",\"batch_size\":4,\"device\":\"cuda:1\","
                                "\"transfer\":\"client\"}", &reply), 0);
    assert_non_null(reply);
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(reply, "device");
    assert_non_null(dev);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(dev, "name")->valuestring, "cuda:1");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(dev, "transfer")->valuestring, "client");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(dev, "ordinal")->valueint, 1);
    assert_null(cJSON_GetObjectItemCaseSensitive(dev, "memory")); /* nothing to import */
    assert_non_null(cJSON_GetObjectItemCaseSensitive(reply, "shm"));
    cJSON *streams = NULL;
    assert_int_equal(request(c, "{\"op\":\"streams\"}", &streams), 0);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(streams, "streams");
    assert_int_equal(cJSON_GetArraySize(list), 1);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(list, 0), "copying")));
    /* Each slot state once: a key twice is JSON that parsers read differently. */
    int copying = 0;
    for (const cJSON *k = cJSON_GetArrayItem(list, 0)->child; k; k = k->next)
        copying += k->string && strcmp(k->string, "copying") == 0;
    assert_int_equal(copying, 1);
    /* A host stream's open reply has no device block. */
    cJSON *host = NULL;
    assert_int_equal(request(c, "{\"op\":\"open\",\"dataset\":\"records\",\"batch_size\":4}", &host), 0);
    assert_null(cJSON_GetObjectItemCaseSensitive(host, "device"));
    cJSON_Delete(host);
    cJSON_Delete(streams);
    cJSON_Delete(reply);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* The C API: a device stream fails to open with the reason, from the daemon (ipc) or
 * from this process (transfer client: the daemon has no part in the GPU then), and
 * leaves no stream behind; a host stream has no device fields. */
static void test_client_api_without_gpu(void **state)
{
    struct harness *h = *state;
    if (gpu_present())
        skip();
    lc_client *c = harness_connect(h, 10000, "capi");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    o.device = "cuda:0";
    lc_stream *s = (lc_stream *)c; /* must stay untouched */
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EDEVICE);
    assert_ptr_equal(s, (lc_stream *)c);
    assert_non_null(strstr(lc_client_error(c), "device: cuda:0: "));
    o.transfer = LC_TRANSFER_CLIENT;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EDEVICE);
    const char *msg = lc_client_error(c);
    assert_non_null(strstr(msg, "device: cuda:0: "));
    if (!strstr(msg, "no NVIDIA driver in this process") && !strstr(msg, "built without CUDA"))
        fail_msg("the error does not say why: %s", msg);
    /* The daemon had opened the transfer-client stream; the library closed it. */
    assert_true(harness_status_num(h, "streams", NULL) == 0);

    lc_stream_options_init(&o);
    o.batch_size = 4;
    s = open_host(c);
    assert_int_equal(lc_stream_device(s), -1);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    lc_device_field f;
    assert_int_equal(lc_batch_device_field(b, 0, &f), LC_EINVAL);
    assert_non_null(strstr(lc_client_error(c), "was opened without a device"));
    assert_int_equal(lc_batch_device_wait(b, NULL), LC_EINVAL);
    assert_int_equal(lc_batch_release(b), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_device_open_fails_clearly, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_device_bad_fields, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_transfer_client_reply, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_client_api_without_gpu, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
