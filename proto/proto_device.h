/* proto_device — the open reply's "device" object: what a trainer needs to reach a
 * stream's device ring (its name, how batches get to the GPU, and for transfer "ipc"
 * the CUDA IPC handles of the ring's memory and of each slot's two events), encoded
 * once per stream. The handles are opaque bytes here (struct ld_ipc_handle); only the
 * CUDA backends of the daemon and of libloaderclient know what they are.
 *
 *   "device": {"name": "cuda:0", "ordinal": 0, "transfer": "ipc",
 *              "slot_size": 4194304, "slot_count": 7, "memory": "<128 hex>",
 *              "ready_events": ["<128 hex>", ...], "done_events": [...],
 *              "fields": [{"name": "image", "dtype": "float16", "shape": [3, 224, 224],
 *                          "offset": 1310720, "row_bytes": 301056}]}
 *
 * "fields" lists only the fields whose device layout differs from the host one (an
 * on-GPU cast and normalize); every other field sits at its host offset in the device
 * slot. For transfer "client" only name, ordinal and transfer are sent. */
#ifndef LD_PROTO_DEVICE_H
#define LD_PROTO_DEVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <cJSON.h>

#include "ld_wire.h"

struct proto_device_field {
    char name[LD_NAME_MAX];
    int dtype;                    /* LD_DTYPE_* */
    int ndim;                     /* dims of one sample */
    int64_t shape[LD_MAX_DIMS];
    uint64_t offset;              /* from the device slot's start */
    uint64_t row_bytes;           /* bytes of one sample */
};

struct proto_device_info {
    char name[LD_DEVICE_NAME_MAX]; /* "cuda:N" */
    int ordinal;                  /* N */
    bool ipc;                     /* transfer "ipc"; false: "client" */
    uint64_t slot_size;           /* ipc: bytes per device slot, a multiple of LD_DEVICE_SLOT_ALIGN */
    uint32_t slot_count;          /* ipc: the host ring's slot count (slot i is copied to device slot i) */
    struct ld_ipc_handle memory;  /* ipc: slot_count * slot_size bytes */
    struct ld_ipc_handle ready[LD_DEVICE_SLOT_COUNT_MAX];
    struct ld_ipc_handle done[LD_DEVICE_SLOT_COUNT_MAX];
    int n_fields;
    struct proto_device_field fields[LD_MAX_FIELDS];
};

/* Adds "device" to obj. LD_ENOMEM, or LD_EINVAL for a block that breaks the limits. */
int proto_device_encode(const struct proto_device_info *d, cJSON *obj);
/* Reads obj's "device": 0 and *ret filled, 1 when there is none (a host stream; *ret
 * untouched), LD_EFIELD with a message naming the member otherwise. */
int proto_device_decode(const cJSON *obj, struct proto_device_info *ret, char *errbuf);

/* Lower-case hex of a handle into out (2 * LD_IPC_HANDLE_SIZE + 1 bytes). */
void proto_handle_hex(const struct ld_ipc_handle *h, char *out);

#endif
