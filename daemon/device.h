/* device — the stage between "a host slot is filled" and "the batch may be handed out".
 *
 * A stream opened with "device": "cuda:N" copies each filled slot of its host ring to
 * a slot of a device ring before the batch is delivered; a stream without a device goes
 * through the host stage, which has nothing to do and completes at once. The stage is
 * an ops table with one backend per kind of device, chosen at open; callers never test
 * for CUDA. The CUDA backend is device_cuda.c (the one daemon file that includes
 * cuda_runtime.h); in a build without CUDA it is still there and says so at open.
 *
 * Threads: every call below comes from the loop thread. A backend that completes a
 * copy later reports it through the `copied` function given at open, from a thread of
 * its own (never inside the call that queued the copy); the receiver hands it to the
 * loop (the stream does so through its completion hub).
 *
 * Slot i of the host ring is copied to slot i of the device ring; the stream's ring
 * holds that slot (COPYING, then READY, then LEASED) until the trainer releases it. The
 * trainer records the slot's "done" event on its stream before it releases; the copy
 * stream waits on that event before it writes the slot again, so device memory the
 * trainer may still read is never overwritten. */
#ifndef LD_DEVICE_H
#define LD_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cJSON.h>

#include "ld_wire.h"
#include "proto_device.h"

enum device_kind { DEVICE_HOST = 0, DEVICE_CUDA = 1 };

/* What an open asked for. */
struct device_spec {
    enum device_kind kind;
    int ordinal;                  /* cuda:N */
    bool transfer_client;         /* "transfer": "client": the trainer copies; the daemon only serves host slots */
};

/* Parses an open's "device" and "transfer" (either may be NULL: absent). "host" and
 * absent mean no device; "cuda:N" with N in [0, LD_DEVICE_ORDINAL_MAX]. LD_EFIELD
 * with a message naming the field otherwise. */
int device_parse(const char *device, const char *transfer, struct device_spec *ret, char *errbuf);
/* "cuda:0", "host". */
void device_spec_name(const struct device_spec *spec, char *buf, size_t size);

/* An on-GPU cast and normalize of one uint8 field as the batch's last step, on the copy
 * stream: out = (v / 255 - mean[c]) / std[c] as float16 or float32, laid out CHW. The
 * values come from tables built here exactly as the host pipeline builds its own
 * (transform.c: in double, then rounded once), so a device batch is bit-identical to
 * the host pipeline's normalize of the same bytes. */
#define DEVICE_NORM_MAX_C 4
struct device_normalize {
    int field;                    /* index of the uint8 field, or -1: none */
    int dtype;                    /* LD_DTYPE_FLOAT16 or LD_DTYPE_FLOAT32 */
    bool from_hwc;                /* the host field is [H, W, C]; else [C, H, W] */
    uint32_t c, h, w;             /* C in [1, DEVICE_NORM_MAX_C] */
    float lut32[DEVICE_NORM_MAX_C][256];
    uint16_t lut16[DEVICE_NORM_MAX_C][256];
};

struct dataset;
/* Parses an open's "device_normalize" ({"field", "mean", "std", "dtype", "layout"};
 * NULL: none, ret->field = -1) against the dataset's fields. LD_EFIELD with a message
 * naming the member otherwise. */
int device_normalize_parse(const cJSON *obj, const struct dataset *d, struct device_normalize *ret, char *errbuf);

struct device_stream_params {
    uint64_t stream_id;
    uint8_t *ring_base;           /* the ring's whole mapping (pinned once by the CUDA backend) */
    uint64_t ring_size;
    uint64_t slot_offset;         /* slot 0's offset in the mapping */
    uint64_t slot_size;           /* host slot size */
    uint32_t slot_count;
    uint64_t slot_bytes;          /* bytes of a host slot the layout uses (the most a copy moves) */
    uint64_t budget;              /* server.device_memory_budget: per GPU, across its streams */
    uint32_t batch_size;          /* the most rows of a batch */
    const struct device_normalize *norm; /* NULL or .field = -1: none */
    uint64_t norm_src_offset;     /* the normalized field's offset in a slot */
    const char *norm_name;        /* its name, for the open reply */
};

/* Called by a backend from its own thread when the copy of `slot` ended (rc 0 or a
 * negative code). Must not block; must not call back into the stage. */
typedef void (*device_copied_fn)(void *ctx, uint32_t slot, int rc);

typedef struct device_stage device_stage;

/* One backend. Every member is called from the loop thread. */
struct device_ops {
    const char *name;
    /* Sets up the stage for one stream: may block (driver start-up, allocation,
     * pinning), once per stream. LD_EDEVICE with a message that names the reason (no
     * driver, no device N, driver too old, over budget: LD_EBUDGET) on failure. */
    int (*open)(const struct device_spec *spec, const struct device_stream_params *p, device_copied_fn copied,
                void *ctx, device_stage **ret, char *errbuf);
    /* Queues the copy of host slot `slot` (`bytes` from its start; `rows` rows) to its
     * device slot. Does not block. 0: queued, `copied` follows; 1: done at once (no
     * call of `copied`); <0: not queued. */
    int (*submit)(device_stage *st, uint32_t slot, uint64_t bytes, uint32_t rows);
    /* Fills the open reply's device block (proto_device.h); false: none to send. */
    bool (*describe)(const device_stage *st, struct proto_device_info *ret);
    /* Adds the `streams` entry's device members (memory, copy time, GB/s). May query the
     * device (it counts copies that ended since). */
    void (*stats)(device_stage *st, cJSON *obj);
    /* Frees everything the stage holds. Called once no copy is in flight (every
     * submitted copy was reported); may block briefly on the device. Accepts NULL. */
    void (*close)(device_stage *st);
};

/* Every stage starts with this. */
struct device_stage {
    const struct device_ops *ops;
};

extern const struct device_ops device_host_ops;
extern const struct device_ops device_cuda_ops;

/* Opens the stage `spec` calls for (the host stage for none and for transfer "client"). */
int device_open(const struct device_spec *spec, const struct device_stream_params *p, device_copied_fn copied,
                void *ctx, device_stage **ret, char *errbuf);
static inline int device_submit(device_stage *st, uint32_t slot, uint64_t bytes, uint32_t rows)
{
    return st->ops->submit(st, slot, bytes, rows);
}
static inline void device_close(device_stage *st)
{
    if (st)
        st->ops->close(st);
}
/* Adds the open reply's "device" object when the stream has one. 0 or LD_ENOMEM. */
int device_describe(const device_stage *st, const struct device_spec *spec, cJSON *obj);
void device_stats(device_stage *st, cJSON *obj);

/* Device memory per GPU, shared by the streams of the daemon (loop thread only): a
 * backend takes `bytes` of ordinal's budget at open and gives them back at close.
 * LD_EBUDGET with a message when they do not fit. */
int device_budget_take(int ordinal, uint64_t bytes, uint64_t budget, char *errbuf);
void device_budget_give(int ordinal, uint64_t bytes);
uint64_t device_budget_used(int ordinal);
/* Across every GPU: for `status`. */
uint64_t device_budget_used_total(void);

#endif
