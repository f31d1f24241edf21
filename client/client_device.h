/* This file is private to libloaderclient: the device side of a stream
 * (client_device.c), called by the stream and batch code of client.c. Every function
 * takes an errbuf-style `msg` (LD_ERRMSG_MAX bytes) and returns 0 or an LC_E* code. */
#ifndef LC_CLIENT_DEVICE_H
#define LC_CLIENT_DEVICE_H

#include <cJSON.h>

#include "loaderclient.h"

struct client_device;

/* After the ring is mapped: reads the open reply's device block and opens the handles
 * (transfer ipc) or pins the mapping and allocates a device ring (transfer client). On
 * failure s->dev stays NULL and nothing is held. */
int client_device_open(lc_stream *s, const cJSON *reply, int asked_ordinal, char *msg);
/* Before the stream's close is sent: closes the handles, frees what was ours. */
void client_device_close(lc_stream *s);
/* Field i of b on the device. */
int client_device_field(const lc_batch *b, int i, lc_device_field *ret, char *msg);
/* Makes cuda_stream wait for b (ipc) or copies b on it (client). */
int client_device_wait(lc_batch *b, void *cuda_stream, char *msg);
/* Before b's release is sent: records the slot's done event on the stream b was used on. */
int client_device_release(lc_batch *b, char *msg);

#endif
