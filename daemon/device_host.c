/* device_host — the stage of a stream without a device (and of one whose trainer
 * copies for itself, transfer "client"): a filled host slot is deliverable as it is,
 * so every submit completes at once and nothing is allocated. It is also what the unit
 * tests drive the slot state machine through, since it always works. */
#include "device.h"

static struct device_stage device_host_stage = {.ops = &device_host_ops};

static int host_open(const struct device_spec *spec, const struct device_stream_params *p, device_copied_fn copied,
                     void *ctx, device_stage **ret, char *errbuf)
{
    *ret = &device_host_stage; /* stateless: one for every stream */
    return 0;
}

static int host_submit(device_stage *st, uint32_t slot, uint64_t bytes, uint32_t rows)
{
    return 1;
}

static bool host_describe(const device_stage *st, struct proto_device_info *ret)
{
    return false;
}

static void host_stats(device_stage *st, cJSON *obj)
{
}

static void host_close(device_stage *st)
{
}

const struct device_ops device_host_ops = {
    .name = "host",
    .open = host_open,
    .submit = host_submit,
    .describe = host_describe,
    .stats = host_stats,
    .close = host_close,
};
