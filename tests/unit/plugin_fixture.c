/* Broken transform plug-ins for test_transform's error paths, one per build flag
 * (see the Makefile's TEST_PLUGINS):
 *   FIXTURE_nosym     exports nothing loaderd looks for
 *   FIXTURE_badabi    exports ld_transform_plugin_v1 with abi_version 99
 *   FIXTURE_v2only    exports only a (future) ld_transform_plugin_v2
 *   FIXTURE_failinit  init refuses its parameters
 *   FIXTURE_failapply init accepts anything; apply fails every sample */
#include <stdio.h>

#include "transform_plugin.h"

#if defined(FIXTURE_nosym)
LD_PLUGIN_EXPORT int fixture_something_else(void);
int fixture_something_else(void)
{
    return 42;
}
#elif defined(FIXTURE_v2only)
LD_PLUGIN_EXPORT const void *ld_transform_plugin_v2(void);
const void *ld_transform_plugin_v2(void)
{
    return NULL;
}
#else
static int fixture_init(const char *params_json, void **ret_state, char *err)
{
    *ret_state = NULL;
#if defined(FIXTURE_failinit)
    snprintf(err, LD_PLUGIN_ERR_MAX, "fixture refuses %s", params_json);
    return 1;
#else
    (void)params_json;
    (void)err;
    return 0;
#endif
}

static int fixture_apply(void *state, struct ld_image *img, struct ld_prng *rng,
                         const struct ld_sample_info *info, char *err)
{
    (void)state;
    (void)img;
    (void)rng;
    (void)info;
    snprintf(err, LD_PLUGIN_ERR_MAX, "fixture fails");
    return 1;
}

static const struct ld_transform_plugin_v1 fixture = {
#if defined(FIXTURE_badabi)
    .abi_version = 99,
#else
    .abi_version = LD_TRANSFORM_PLUGIN_ABI_V1,
#endif
    .struct_size = sizeof(struct ld_transform_plugin_v1),
    .name = "fixture",
    .init = fixture_init,
    .apply = fixture_apply,
};

const struct ld_transform_plugin_v1 *ld_transform_plugin_v1(void)
{
    return &fixture;
}
#endif
