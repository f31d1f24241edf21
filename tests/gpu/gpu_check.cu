/* ld-gpu-check — the GPU side of scripts/gpu-check.sh: each subcommand is one check of
 * the device path against a real loaderd on a host with an NVIDIA GPU, through the
 * public client API only (loaderclient.h), and prints what it measured as
 * `RESULT <check> PASS|FAIL <details>` lines that the script collects.
 *
 *   probe                                  is a GPU usable here? exit 0, or 2 and why not
 *   identical SOCK HOSTDS DEVDS BATCH N [--client] [--normalize JSON]
 *                                          N device batches == the host batches, byte for byte
 *   peak BYTES                             pinned cudaMemcpyAsync host-to-device GB/s
 *   trainer SOCK DS BATCH STEPS KERNEL_MS  a synthetic trainer (one kernel of fixed
 *                                          duration per step): the fraction of time the
 *                                          GPU waited for data, and the stage's GB/s
 *   churn SOCK DS BATCH N                  N trainers SIGKILLed holding device batches:
 *                                          cudaMemGetInfo and the daemon's counters
 *                                          before and after
 *
 * Built by nvcc (make CUDA=1, no sanitizer) into BUILD/bin/ld-gpu-check. */
#include <cuda_runtime.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loaderclient.h"

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "ld-gpu-check: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static lc_client *connect_or_die(const char *sock, const char *name)
{
    char err[512];
    lc_client *c = NULL;
    int rc = lc_connect(sock, 30000, name, &c, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "ld-gpu-check: connect %s: %s\n", sock, err);
        exit(1);
    }
    return c;
}

static lc_stream *open_or_die(lc_client *c, const char *ds, uint32_t batch, const char *device, int transfer,
                              const char *norm)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = batch;
    o.seed = 7;
    o.shuffle = 1;
    o.device = device;
    o.transfer = transfer;
    o.device_normalize = norm;
    lc_stream *s = NULL;
    int rc = lc_stream_open(c, ds, &o, &s);
    if (rc < 0) {
        fprintf(stderr, "ld-gpu-check: open %s on %s: %s: %s\n", ds, device ? device : "host", lc_strerror(rc),
                lc_client_error(c));
        exit(1);
    }
    return s;
}

static lc_batch *next_or_die(lc_stream *s, lc_client *c)
{
    lc_batch *b = NULL;
    int rc = lc_stream_next(s, 60000, &b);
    if (rc < 0) {
        fprintf(stderr, "ld-gpu-check: next: %s: %s\n", lc_strerror(rc), lc_client_error(c));
        exit(1);
    }
    return b;
}

static int cmd_probe(void)
{
    int drv = 0, n = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0) {
        printf("no GPU present: no NVIDIA driver (libcuda.so.1 cannot be loaded)\n");
        return 2;
    }
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("no GPU present: the driver (CUDA %d.%d) sees no device: %s\n", drv / 1000, drv % 1000 / 10,
               e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
        return 2;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("gpu: %s (cc %d.%d, %.1f GiB), driver CUDA %d.%d, runtime %d.%d, %d device%s\n", p.name, p.major, p.minor,
           (double)p.totalGlobalMem / (1u << 30), drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000,
           CUDART_VERSION % 1000 / 10, n, n == 1 ? "" : "s");
    return 0;
}

/* Device batches against host batches of another (or the same) dataset with the same
 * seed: every field of the device stream, brought back with cudaMemcpy, equals the host
 * field of that name, shape and dtype included. */
static int cmd_identical(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: identical SOCK HOSTDS DEVDS BATCH N [--client] [--normalize JSON]\n");
        return 1;
    }
    const char *sock = argv[0], *hds = argv[1], *dds = argv[2];
    uint32_t batch = (uint32_t)atoi(argv[3]);
    int n = atoi(argv[4]);
    int transfer = LC_TRANSFER_IPC;
    const char *norm = NULL;
    for (int i = 5; i < argc; i++) {
        if (strcmp(argv[i], "--client") == 0)
            transfer = LC_TRANSFER_CLIENT;
        else if (strcmp(argv[i], "--normalize") == 0 && i + 1 < argc)
            norm = argv[++i];
    }
    lc_client *c = connect_or_die(sock, "gpu-check-identical");
    lc_stream *hs = open_or_die(c, hds, batch, NULL, 0, NULL);
    lc_stream *ds = open_or_die(c, dds, batch, "cuda:0", transfer, norm);
    if (lc_stream_device(ds) != 0) {
        printf("RESULT identical FAIL lc_stream_device is %d, not 0\n", lc_stream_device(ds));
        return 1;
    }
    cudaStream_t st;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreate(&st));
    uint64_t bytes = 0, fields = 0, bad = 0;
    for (int k = 0; k < n && !bad; k++) {
        lc_batch *hb = next_or_die(hs, c), *db = next_or_die(ds, c);
        if (lc_batch_rows(hb) != lc_batch_rows(db) || lc_batch_index(hb) != lc_batch_index(db)) {
            printf("RESULT identical FAIL batch %d: rows/index differ (%u/%llu vs %u/%llu)\n", k, lc_batch_rows(hb),
                   (unsigned long long)lc_batch_index(hb), lc_batch_rows(db), (unsigned long long)lc_batch_index(db));
            return 1;
        }
        if (lc_batch_device_wait(db, st) < 0) {
            printf("RESULT identical FAIL lc_batch_device_wait: %s\n", lc_client_error(c));
            return 1;
        }
        for (int f = 0; f < lc_batch_field_count(db); f++) {
            lc_device_field dv;
            lc_field hv;
            if (lc_batch_device_field(db, f, &dv) < 0 || lc_batch_field_by_name(hb, dv.name, &hv) < 0) {
                printf("RESULT identical FAIL field %d: %s\n", f, lc_client_error(c));
                return 1;
            }
            if (dv.dtype != hv.dtype || dv.ndim != hv.ndim || dv.nbytes != hv.nbytes ||
                memcmp(dv.shape, hv.shape, sizeof(int64_t) * (size_t)hv.ndim) != 0) {
                printf("RESULT identical FAIL batch %d field '%s': device dtype %d ndim %d %zu bytes, host dtype %d "
                       "ndim %d %zu bytes\n", k, dv.name, dv.dtype, dv.ndim, dv.nbytes, hv.dtype, hv.ndim, hv.nbytes);
                return 1;
            }
            uint8_t *buf = (uint8_t *)malloc(dv.nbytes + 1);
            CK(cudaMemcpyAsync(buf, dv.data, dv.nbytes, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            if (memcmp(buf, hv.data, dv.nbytes) != 0) {
                size_t at = 0;
                while (at < dv.nbytes && buf[at] == ((const uint8_t *)hv.data)[at])
                    at++;
                printf("RESULT identical FAIL batch %d field '%s': first difference at byte %zu of %zu\n", k, dv.name,
                       at, dv.nbytes);
                bad++;
            }
            if (hv.offsets) {
                int64_t *offs = (int64_t *)malloc(sizeof(int64_t) * (lc_batch_rows(db) + 1));
                CK(cudaMemcpy(offs, dv.offsets, sizeof(int64_t) * (lc_batch_rows(db) + 1), cudaMemcpyDeviceToHost));
                if (memcmp(offs, hv.offsets, sizeof(int64_t) * (lc_batch_rows(db) + 1)) != 0) {
                    printf("RESULT identical FAIL batch %d field '%s': ragged offsets differ\n", k, dv.name);
                    bad++;
                }
                free(offs);
            }
            free(buf);
            bytes += dv.nbytes;
            fields++;
        }
        lc_batch_release(hb);
        lc_batch_release(db);
    }
    lc_stream_close(ds);
    lc_stream_close(hs);
    lc_client_close(c);
    CK(cudaStreamDestroy(st));
    if (bad)
        return 1;
    printf("RESULT identical PASS %s vs %s%s%s: %d batches, %llu fields, %llu bytes equal\n", dds, hds,
           transfer == LC_TRANSFER_CLIENT ? " (transfer client)" : "", norm ? " (on-GPU normalize)" : "", n,
           (unsigned long long)fields, (unsigned long long)bytes);
    return 0;
}

static int cmd_peak(int argc, char **argv)
{
    size_t bytes = argc > 0 ? strtoull(argv[0], NULL, 10) : (64u << 20);
    void *h, *d;
    cudaStream_t st;
    cudaEvent_t a, b;
    CK(cudaSetDevice(0));
    CK(cudaMallocHost(&h, bytes));
    CK(cudaMalloc(&d, bytes));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    memset(h, 1, bytes);
    for (int i = 0; i < 3; i++)
        CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st));
    const int reps = 20;
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++)
        CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    printf("RESULT peak PASS %.3f GB/s pinned cudaMemcpyAsync of %zu bytes\n", (double)bytes * reps / (ms * 1e6), bytes);
    return 0;
}

/* A kernel that runs for `cycles` clock cycles and reads the batch's first byte. */
__global__ void spin_kernel(const uint8_t *data, long long cycles, int *sink)
{
    long long start = clock64();
    int acc = data ? data[threadIdx.x & 63] : 0;
    while (clock64() - start < cycles)
        acc += 1;
    if (acc == -1)
        *sink = acc;
}

static double json_num(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1.0;
}

static int cmd_trainer(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: trainer SOCK DS BATCH STEPS KERNEL_MS\n");
        return 1;
    }
    const char *sock = argv[0], *dsn = argv[1];
    uint32_t batch = (uint32_t)atoi(argv[2]);
    int steps = atoi(argv[3]);
    double kernel_ms = atof(argv[4]);
    CK(cudaSetDevice(0));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    long long cycles = (long long)(kernel_ms * clock_khz);
    int *sink;
    CK(cudaMalloc(&sink, sizeof(int)));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* The kernel's real duration on this GPU (the clock rate is nominal). */
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < 5; i++)
        spin_kernel<<<1, 64, 0, st>>>(NULL, cycles, sink);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float cal_ms = 0;
    CK(cudaEventElapsedTime(&cal_ms, a, b));
    double step_ms = cal_ms / 5;

    lc_client *c = connect_or_die(sock, "gpu-check-trainer");
    lc_stream *s = open_or_die(c, dsn, batch, "cuda:0", LC_TRANSFER_IPC, NULL);
    const int warm = steps / 5 > 5 ? steps / 5 : 5;
    cudaEvent_t *done = (cudaEvent_t *)calloc((size_t)steps, sizeof(cudaEvent_t));
    double t0 = 0, host_wait = 0;
    lc_batch *prev = NULL;
    for (int i = 0; i < steps; i++) {
        if (i == warm) {
            CK(cudaStreamSynchronize(st));
            t0 = now_s();
            host_wait = 0;
        }
        /* A trainer's host runs at most two steps ahead of its GPU. */
        if (i >= 2)
            CK(cudaEventSynchronize(done[i - 2]));
        double w = now_s();
        lc_batch *bt = next_or_die(s, c);
        host_wait += now_s() - w;
        lc_device_field f;
        if (lc_batch_device_wait(bt, st) < 0 || lc_batch_device_field(bt, 0, &f) < 0) {
            printf("RESULT trainer FAIL %s\n", lc_client_error(c));
            return 1;
        }
        spin_kernel<<<1, 64, 0, st>>>((const uint8_t *)f.data, cycles, sink);
        CK(cudaGetLastError());
        CK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
        CK(cudaEventRecord(done[i], st));
        if (prev)
            lc_batch_release(prev);
        prev = bt;
    }
    CK(cudaStreamSynchronize(st));
    double wall = now_s() - t0;
    int measured = steps - warm;
    double busy = measured * step_ms / 1000.0;
    double wait_fraction = wall > busy ? (wall - busy) / wall : 0.0;
    char *reply = NULL;
    double gbps = -1, copy_ms = -1;
    if (lc_request_json(c, "{\"op\":\"streams\"}", &reply) == 0) {
        gbps = json_num(reply, "h2d_gbps");
        copy_ms = json_num(reply, "copy_ms_per_batch");
        lc_free(reply);
    }
    lc_batch_release(prev);
    lc_stream_close(s);
    lc_client_close(c);
    printf("RESULT trainer %s wait_fraction %.4f over %d steps of %.2f ms (wall %.3f s, host waited %.3f s); "
           "stage h2d_gbps %.3f copy_ms_per_batch %.3f\n", wait_fraction <= 0.05 ? "PASS" : "FAIL", wait_fraction,
           measured, step_ms, wall, host_wait, gbps, copy_ms);
    return wait_fraction <= 0.05 ? 0 : 1;
}

static double status_num(const char *sock, const char *key)
{
    lc_client *c = connect_or_die(sock, "gpu-check-status");
    char *reply = NULL;
    double v = -1;
    if (lc_request_json(c, "{\"op\":\"status\"}", &reply) == 0) {
        v = json_num(reply, key);
        lc_free(reply);
    }
    lc_client_close(c);
    return v;
}

static int cmd_churn(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: churn SOCK DS BATCH N\n");
        return 1;
    }
    const char *sock = argv[0], *dsn = argv[1];
    uint32_t batch = (uint32_t)atoi(argv[2]);
    int n = atoi(argv[3]);
    /* Our own context first, so that it is in both measurements. */
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    size_t free0, free1, total;
    /* One trainer that closes cleanly first: the daemon's own CUDA context then exists
     * in both measurements. */
    {
        lc_client *c = connect_or_die(sock, "gpu-check-warm");
        lc_stream *s = open_or_die(c, dsn, batch, "cuda:0", LC_TRANSFER_IPC, NULL);
        lc_batch_release(next_or_die(s, c));
        lc_stream_close(s);
        lc_client_close(c);
    }
    CK(cudaMemGetInfo(&free0, &total));
    double streams0 = status_num(sock, "streams"), dev0 = status_num(sock, "device_memory_used");
    for (int i = 0; i < n; i++) {
        /* CUDA does not survive fork in a process that has initialised it: each trainer
         * is a fresh ld-gpu-check (`victim`). */
        pid_t pid = fork();
        if (pid == 0) {
            char bs[16];
            snprintf(bs, sizeof bs, "%u", batch);
            execl("/proc/self/exe", "ld-gpu-check", "victim", sock, dsn, bs, i % 2 ? "client" : "ipc", (char *)NULL);
            _exit(3);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
            printf("RESULT churn FAIL trainer %d did not reach its SIGKILL (status 0x%x)\n", i, status);
            return 1;
        }
    }
    double streams1 = -1, dev1 = -1;
    for (int t = 0; t < 100; t++) {
        streams1 = status_num(sock, "streams");
        dev1 = status_num(sock, "device_memory_used");
        if (streams1 == streams0 && dev1 == dev0)
            break;
        usleep(100000);
    }
    CK(cudaMemGetInfo(&free1, &total));
    double lost_mib = ((double)free0 - (double)free1) / (1 << 20);
    bool ok = streams1 == streams0 && dev1 == dev0 && lost_mib < 64.0;
    printf("RESULT churn %s %d trainers SIGKILLed: streams %.0f -> %.0f, daemon device_memory_used %.0f -> %.0f, "
           "cudaMemGetInfo free %.1f -> %.1f MiB (%.1f MiB not back)\n", ok ? "PASS" : "FAIL", n, streams0, streams1,
           dev0, dev1, (double)free0 / (1 << 20), (double)free1 / (1 << 20), lost_mib);
    return ok ? 0 : 1;
}

/* One trainer of `churn`: takes a device batch, uses it on its stream, and dies by
 * SIGKILL while holding it. */
static int cmd_victim(int argc, char **argv)
{
    if (argc < 4)
        return 1;
    lc_client *c = connect_or_die(argv[0], "gpu-check-victim");
    lc_stream *s = open_or_die(c, argv[1], (uint32_t)atoi(argv[2]), "cuda:0",
                               strcmp(argv[3], "client") == 0 ? LC_TRANSFER_CLIENT : LC_TRANSFER_IPC, NULL);
    lc_batch *b = next_or_die(s, c);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    if (lc_batch_device_wait(b, st) < 0)
        return 1;
    CK(cudaStreamSynchronize(st));
    raise(SIGKILL);
    return 3;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ld-gpu-check probe|identical|peak|trainer|churn ...\n");
        return 1;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "probe") == 0)
        return cmd_probe();
    if (strcmp(cmd, "identical") == 0)
        return cmd_identical(argc - 2, argv + 2);
    if (strcmp(cmd, "peak") == 0)
        return cmd_peak(argc - 2, argv + 2);
    if (strcmp(cmd, "trainer") == 0)
        return cmd_trainer(argc - 2, argv + 2);
    if (strcmp(cmd, "churn") == 0)
        return cmd_churn(argc - 2, argv + 2);
    if (strcmp(cmd, "victim") == 0)
        return cmd_victim(argc - 2, argv + 2);
    fprintf(stderr, "ld-gpu-check: unknown check '%s'\n", cmd);
    return 1;
}
