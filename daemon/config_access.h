/* config_access — reads the config's `access:` section into struct access_config
 * (access.h). Private to daemon/config*.c. */
#ifndef LD_CONFIG_ACCESS_H
#define LD_CONFIG_ACCESS_H

#include <stddef.h>
#include <yaml.h>

#include "access.h"
#include "config_yaml.h"

/* The section's value v (key: its key node). Errors are "FILE:LINE:COLUMN: access...". */
int config_access_load(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                       struct access_config *a);
/* Once every section is read: each dataset access.datasets names is one of `names`. */
int config_access_check(const struct config_loader *l, const struct access_config *a, const char *const *names,
                        size_t n_names);

#endif
