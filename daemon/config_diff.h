/* config_diff — what changed between the running config and one loaded again (a
 * reload): whether a dataset's definition is the same, and which server.* keys that
 * only a restart can apply were changed.
 *
 * Live at a reload: the datasets, server.memory_budget, device_memory_budget, max_clients, max_streams,
 * max_frame (for connections accepted from then on), prefetch, hello_timeout,
 * idle_timeout, max_reply_bytes, max_total_reply_bytes, log_level and `clients:`.
 * Restart only: server.socket, socket_group, workers and metrics.listen (the socket is
 * bound, the workers started and the listener open once, at start). */
#ifndef LD_CONFIG_DIFF_H
#define LD_CONFIG_DIFF_H

#include <stdbool.h>

#include "config.h"

/* True when a and b define the same dataset (every key; where in the file does not
 * count). */
bool config_dataset_same(const struct config_dataset *a, const struct config_dataset *b);

/* Calls fn once per restart-only server key whose value differs between running and
 * loaded, with the key and both values as text, then gives loaded the running value
 * (so that the config the daemon runs on says what it really does). Returns how many
 * keys differed. */
int config_diff_restart_keys(const struct config *running, struct config *loaded,
                             void (*fn)(void *ctx, const char *key, const char *running_value,
                                        const char *loaded_value),
                             void *ctx);

#endif
