/* Unit tests for the device stage (device.h) as far as a host without a GPU can drive
 * it: parsing what an open asks for, the ring's slot state machine with the COPYING
 * state driven through the host stage, the CUDA backend's refusal with its reason
 * (skipped where a GPU is present: scripts/gpu-check.sh covers that host), the per-GPU
 * budget, the on-GPU normalize request and its tables, and the open reply's device
 * block (proto_device.h) round-tripping through JSON text. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset.h"
#include "device.h"
#include "ld_error.h"
#include "proto.h"
#include "proto_device.h"
#include "ring.h"
#include "transform.h"

static void test_parse(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    struct device_spec s;
    assert_int_equal(device_parse(NULL, NULL, &s, err), 0);
    assert_int_equal(s.kind, DEVICE_HOST);
    assert_int_equal(device_parse("host", NULL, &s, err), 0);
    assert_int_equal(s.kind, DEVICE_HOST);
    assert_int_equal(device_parse("cuda:0", NULL, &s, err), 0);
    assert_int_equal(s.kind, DEVICE_CUDA);
    assert_int_equal(s.ordinal, 0);
    assert_false(s.transfer_client);
    assert_int_equal(device_parse("cuda:255", "client", &s, err), 0);
    assert_int_equal(s.ordinal, 255);
    assert_true(s.transfer_client);
    assert_int_equal(device_parse("cuda:7", "ipc", &s, err), 0);
    assert_false(s.transfer_client);
    char name[LD_DEVICE_NAME_MAX];
    device_spec_name(&s, name, sizeof name);
    assert_string_equal(name, "cuda:7");

    static const struct {
        const char *dev, *transfer, *needle;
    } bad[] = {
        {"cuda", NULL, "expected \"cuda:N\""},      {"cuda:", NULL, "expected \"cuda:N\""},
        {"cuda:-1", NULL, "expected \"cuda:N\""},   {"cuda:01", NULL, "expected \"cuda:N\""},
        {"cuda:1x", NULL, "ordinal must be"},       {"cuda:256", NULL, "ordinal must be"},
        {"cuda:99999999999999999999", NULL, "ordinal must be"},
        {"gpu:0", NULL, "expected \"cuda:N\""},     {"cuda:0", "dma", "field 'transfer'"},
        {NULL, "ipc", "needs a device"},            {"host", "client", "needs a device"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct device_spec keep = {.kind = DEVICE_CUDA, .ordinal = 42};
        err[0] = '\0';
        assert_int_equal(device_parse(bad[i].dev, bad[i].transfer, &keep, err), LD_EFIELD);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s/%s: '%s' does not say '%s'", bad[i].dev ? bad[i].dev : "-",
                     bad[i].transfer ? bad[i].transfer : "-", err, bad[i].needle);
        assert_int_equal(keep.ordinal, 42); /* untouched on failure */
    }
}

/* FILLING -> COPYING -> READY -> LEASED -> FREE through the host stage, and every
 * transition COPYING refuses. */
static void test_state_machine_host_stage(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX], prefix[64];
    snprintf(prefix, sizeof prefix, "ld-test-device-%ld", (long)getpid());
    ring *r = NULL;
    assert_int_equal(ring_open(prefix, 1, 3, 4096, 0600, &r, err), 0);
    struct device_spec spec = {.kind = DEVICE_HOST};
    struct device_stream_params p = {.slot_count = 3, .slot_size = ring_slot_size(r)};
    device_stage *st = NULL;
    assert_int_equal(device_open(&spec, &p, NULL, NULL, &st, err), 0);
    assert_non_null(st);

    uint32_t slot;
    uint64_t gen;
    assert_int_equal(ring_acquire(r, &slot, &gen), 0);
    assert_int_equal(ring_copied(r, slot), LD_EBUSY);        /* not COPYING yet */
    assert_int_equal(ring_copying(r, slot), 0);
    assert_int_equal(ring_state(r, slot), RING_COPYING);
    assert_int_equal(ring_count(r, RING_COPYING), 1);
    assert_int_equal(ring_count(r, RING_FILLING), 0);
    /* While the copy engine reads it, nothing else may happen to the slot. */
    assert_int_equal(ring_copying(r, slot), LD_EBUSY);
    assert_int_equal(ring_ready(r, slot), LD_EBUSY);
    assert_int_equal(ring_lease(r, slot), LD_EBUSY);
    assert_int_equal(ring_discard(r, slot), LD_EBUSY);
    assert_int_equal(ring_release(r, slot, gen), LD_ENOTLEASED);
    assert_int_equal(ring_copying(r, 3), LD_EINVAL);
    assert_int_equal(ring_copied(r, 3), LD_EINVAL);
    /* The host stage completes at once and never calls back. */
    assert_int_equal(device_submit(st, slot, 64, 1), 1);
    assert_int_equal(ring_copied(r, slot), 0);
    assert_int_equal(ring_state(r, slot), RING_READY);
    assert_int_equal(ring_count(r, RING_COPYING), 0);
    assert_int_equal(ring_copied(r, slot), LD_EBUSY);
    assert_int_equal(ring_copying(r, slot), LD_EBUSY);        /* READY cannot go back */
    assert_int_equal(ring_lease(r, slot), 0);
    assert_int_equal(ring_release(r, slot, gen), 0);
    assert_int_equal(ring_count(r, RING_FREE), 3);
    /* A host stream's open reply has no device block. */
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(device_describe(st, &spec, o), 0);
    assert_null(cJSON_GetObjectItemCaseSensitive(o, "device"));
    cJSON_Delete(o);
    device_close(st);
    ring_free(r);
}

/* transfer "client" also gets the host stage, and its reply names the device. */
static void test_transfer_client_stage(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    struct device_spec spec = {.kind = DEVICE_CUDA, .ordinal = 2, .transfer_client = true};
    struct device_stream_params p = {.slot_count = 3};
    device_stage *st = NULL;
    assert_int_equal(device_open(&spec, &p, NULL, NULL, &st, err), 0);
    assert_ptr_equal(st->ops, &device_host_ops);
    assert_int_equal(device_submit(st, 0, 64, 1), 1);
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(device_describe(st, &spec, o), 0);
    struct proto_device_info *d = calloc(1, sizeof *d);
    assert_int_equal(proto_device_decode(o, d, err), 0);
    assert_string_equal(d->name, "cuda:2");
    assert_int_equal(d->ordinal, 2);
    assert_false(d->ipc);
    free(d);
    cJSON_Delete(o);
    device_close(st);
}

/* Without a GPU the CUDA backend refuses at open with the reason and takes nothing. */
static void test_cuda_refuses_without_gpu(void **state)
{
    (void)state;
    if (access("/dev/nvidiactl", F_OK) == 0)
        skip();
    char err[LD_ERRMSG_MAX] = "";
    struct device_spec spec = {.kind = DEVICE_CUDA, .ordinal = 0};
    static uint8_t fake_ring[8192];
    struct device_stream_params p = {.ring_base = fake_ring, .ring_size = sizeof fake_ring, .slot_offset = 4096,
                                     .slot_size = 4096, .slot_count = 1, .slot_bytes = 128, .budget = 1u << 30,
                                     .batch_size = 1};
    device_stage *st = (device_stage *)&p; /* must stay untouched */
    assert_int_equal(device_open(&spec, &p, NULL, NULL, &st, err), LD_EDEVICE);
    assert_ptr_equal(st, (device_stage *)&p);
    assert_non_null(strstr(err, "device: cuda:0: "));
#if LD_HAVE_CUDA
    assert_non_null(strstr(err, "no NVIDIA driver"));
#else
    assert_non_null(strstr(err, "built without CUDA"));
#endif
    assert_int_equal(device_budget_used(0), 0);
}

static void test_budget(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(device_budget_take(3, 6u << 20, 10u << 20, err), 0);
    assert_int_equal(device_budget_used(3), 6u << 20);
    assert_int_equal(device_budget_used(4), 0); /* per GPU */
    assert_int_equal(device_budget_take(3, 6u << 20, 10u << 20, err), LD_EBUDGET);
    assert_non_null(strstr(err, "cuda:3"));
    assert_non_null(strstr(err, "server.device_memory_budget"));
    assert_non_null(strstr(err, "4.0 MiB is left"));
    assert_int_equal(device_budget_used(3), 6u << 20); /* a refusal takes nothing */
    assert_int_equal(device_budget_take(4, 6u << 20, 10u << 20, err), 0);
    assert_int_equal(device_budget_take(3, 4u << 20, 10u << 20, err), 0);
    device_budget_give(3, 10u << 20);
    device_budget_give(4, 6u << 20);
    assert_int_equal(device_budget_used(3), 0);
    assert_int_equal(device_budget_take(3, UINT64_MAX, 10u << 20, err), LD_EBUDGET);
    assert_int_equal(device_budget_take(-1, 1, 10u << 20, err), LD_EINVAL);
}

static void test_normalize_parse(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    static struct dataset d;
    snprintf(d.name, sizeof d.name, "imgs");
    d.n_fields = 2;
    d.fields[0] = (struct dataset_field){.name = "image", .dtype = LD_DTYPE_UINT8, .ndim = 3, .shape = {6, 5, 3}};
    d.fields[1] = (struct dataset_field){.name = "label", .dtype = LD_DTYPE_INT64, .ndim = 0};
    struct device_normalize *n = calloc(1, sizeof *n);
    cJSON *o = cJSON_Parse("{\"field\":\"image\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225],"
                           "\"dtype\":\"float16\",\"layout\":\"HWC\"}");
    assert_int_equal(device_normalize_parse(o, &d, n, err), 0);
    assert_int_equal(n->field, 0);
    assert_int_equal(n->dtype, LD_DTYPE_FLOAT16);
    assert_true(n->from_hwc);
    assert_int_equal(n->c, 3);
    assert_int_equal(n->h, 6);
    assert_int_equal(n->w, 5);
    static const double mean[3] = {0.485, 0.456, 0.406}, sd[3] = {0.229, 0.224, 0.225};
    for (int c = 0; c < 3; c++) {
        for (int v = 0; v < 256; v += 51) {
            double x = ((double)v / 255.0 - mean[c]) / sd[c];
            assert_true(n->lut32[c][v] == (float)x);
            assert_int_equal(n->lut16[c][v], transform_half_from_double(x));
        }
    }
    cJSON_Delete(o);
    /* One value for every channel; CHW by default; float32 by default. */
    o = cJSON_Parse("{\"field\":\"image\",\"mean\":[0.5],\"std\":[0.25]}");
    d.fields[0].shape[0] = 3;
    d.fields[0].shape[1] = 6;
    d.fields[0].shape[2] = 5;
    assert_int_equal(device_normalize_parse(o, &d, n, err), 0);
    assert_false(n->from_hwc);
    assert_int_equal(n->dtype, LD_DTYPE_FLOAT32);
    assert_true(n->lut32[2][255] == (float)((1.0 - 0.5) / 0.25));
    cJSON_Delete(o);
    assert_int_equal(device_normalize_parse(NULL, &d, n, err), 0);
    assert_int_equal(n->field, -1);

    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"field\":\"label\",\"mean\":[0],\"std\":[1]}", "must be a uint8 image"},
        {"{\"field\":\"none\",\"mean\":[0],\"std\":[1]}", "has no field 'none'"},
        {"{\"field\":\"image\",\"mean\":[0,0],\"std\":[1]}", "device_normalize.mean': expected an array of 1 or 3"},
        {"{\"field\":\"image\",\"mean\":[0],\"std\":[0]}", "device_normalize.std[0]': expected a finite non-zero"},
        {"{\"field\":\"image\",\"mean\":[0],\"std\":[1],\"dtype\":\"int32\"}", "expected \"float16\" or \"float32\""},
        {"{\"field\":\"image\",\"mean\":[0],\"std\":[1],\"layout\":\"NHWC\"}", "expected \"CHW\" or \"HWC\""},
        {"{\"mean\":[0],\"std\":[1]}", "field 'field': missing"},
        {"[1]", "expected an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = cJSON_Parse(bad[i].json);
        n->field = 77;
        assert_int_equal(device_normalize_parse(o, &d, n, err), LD_EFIELD);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s: '%s' does not say '%s'", bad[i].json, err, bad[i].needle);
        assert_int_equal(n->field, 77);
        cJSON_Delete(o);
    }
    free(n);
}

/* The malformed blocks below are templates with the handles filled in. */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

static void fill_handle(struct ld_ipc_handle *h, unsigned seed)
{
    for (size_t i = 0; i < LD_IPC_HANDLE_SIZE; i++)
        h->bytes[i] = (uint8_t)(seed * 131u + i * 7u);
}

/* Encode to JSON text, parse, decode: the same bytes. */
static void test_proto_device_roundtrip(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    struct proto_device_info *in = calloc(1, sizeof *in), *out = calloc(1, sizeof *out);
    snprintf(in->name, sizeof in->name, "cuda:3");
    in->ordinal = 3;
    in->ipc = true;
    in->slot_size = 3u * LD_DEVICE_SLOT_ALIGN;
    in->slot_count = LD_DEVICE_SLOT_COUNT_MAX;
    fill_handle(&in->memory, 1);
    for (uint32_t i = 0; i < in->slot_count; i++) {
        fill_handle(&in->ready[i], 100 + i);
        fill_handle(&in->done[i], 200 + i);
    }
    in->n_fields = 1;
    in->fields[0] = (struct proto_device_field){.name = "image", .dtype = LD_DTYPE_FLOAT16, .ndim = 3,
                                                .shape = {3, 224, 224}, .offset = 1u << 20,
                                                .row_bytes = 3u * 224 * 224 * 2};
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(proto_device_encode(in, o), 0);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON *back = NULL;
    assert_int_equal(proto_parse(text, strlen(text), &back, err), 0);
    assert_int_equal(proto_device_decode(back, out, err), 0);
    assert_memory_equal(in, out, sizeof *in);
    cJSON_Delete(back);
    free(text);

    /* Absent: a host stream. */
    o = cJSON_Parse("{\"stream\":1}");
    memset(out, 0x5a, sizeof *out);
    assert_int_equal(proto_device_decode(o, out, err), 1);
    assert_int_equal(((uint8_t *)out)[0], 0x5a);
    cJSON_Delete(o);

    /* Malformed members are named; *ret stays untouched. */
    char good_hex[2 * LD_IPC_HANDLE_SIZE + 1];
    proto_handle_hex(&in->memory, good_hex);
    char upper[sizeof good_hex];
    snprintf(upper, sizeof upper, "%s", good_hex);
    for (char *p = upper; *p; p++)
        if (*p >= 'a' && *p <= 'f')
            *p = (char)(*p - 'a' + 'A');
    char body[2048];
    static const char *const tmpl[] = {
        "{\"device\":{\"name\":\"cuda:0\",\"ordinal\":0,\"transfer\":\"ipc\",\"slot_size\":2097152,\"slot_count\":1,"
        "\"memory\":\"%s\",\"ready_events\":[\"%s\"],\"done_events\":[]}}",
        "{\"device\":{\"name\":\"cuda:0\",\"ordinal\":0,\"transfer\":\"ipc\",\"slot_size\":2097153,\"slot_count\":1,"
        "\"memory\":\"%s\",\"ready_events\":[\"%s\"],\"done_events\":[]}}",
        "{\"device\":{\"name\":\"cuda:0\",\"ordinal\":0,\"transfer\":\"ipc\",\"slot_size\":2097152,\"slot_count\":1,"
        "\"memory\":\"%s\",\"ready_events\":[\"%s\"],\"done_events\":[\"00\"]}}",
        "{\"device\":{\"name\":\"cuda:0\",\"ordinal\":0,\"transfer\":\"pcie\",\"memory\":\"%s%s\"}}",
        "{\"device\":{\"name\":\"cuda:0\",\"ordinal\":300,\"transfer\":\"client\",\"x\":\"%s%s\"}}",
        "{\"device\":{\"name\":\"cuda:0\",\"ordinal\":0,\"transfer\":\"ipc\",\"slot_size\":2097152,\"slot_count\":1,"
        "\"memory\":\"%s\",\"ready_events\":[\"%s\"],\"done_events\":[\"%s\"],\"fields\":[{\"name\":\"x\","
        "\"dtype\":\"float32\",\"shape\":[3,2],\"offset\":0,\"row_bytes\":25}]}}",
    };
    static const char *const needles[] = {"device.done_events", "device.slot_size", "device.done_events[0]",
                                          "device.transfer", "device: field 'ordinal'", "device.fields[0]"};
    for (size_t i = 0; i < sizeof tmpl / sizeof tmpl[0]; i++) {
        snprintf(body, sizeof body, tmpl[i], good_hex, good_hex, good_hex);
        o = cJSON_Parse(body);
        assert_non_null(o);
        memset(out, 0x5a, sizeof *out);
        assert_int_equal(proto_device_decode(o, out, err), LD_EFIELD);
        if (!strstr(err, needles[i]))
            fail_msg("case %zu: '%s' does not name '%s'", i, err, needles[i]);
        assert_int_equal(((uint8_t *)out)[0], 0x5a);
        cJSON_Delete(o);
    }
    /* Upper-case hex is refused (one spelling on the wire). */
    snprintf(body, sizeof body, tmpl[0], upper, good_hex);
    o = cJSON_Parse(body);
    assert_int_equal(proto_device_decode(o, out, err), LD_EFIELD);
    assert_non_null(strstr(err, "device.memory': not a hex digit"));
    cJSON_Delete(o);
    free(in);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_state_machine_host_stage),
        cmocka_unit_test(test_transfer_client_stage),
        cmocka_unit_test(test_cuda_refuses_without_gpu),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_normalize_parse),
        cmocka_unit_test(test_proto_device_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
