/* transform_plugin — the `plugin` transform kind: its parameters, and the loader that
 * opens a plug-in shared object and checks it against the ABI in transform_plugin.h.
 *
 * Loading happens once, when a dataset's pipeline is built on the main thread:
 * dlopen(RTLD_NOW | RTLD_LOCAL), the versioned entry point looked up with dlsym, the
 * descriptor's ABI version and size checked, then init() given the params. A plug-in
 * built for another ABI version is named as such rather than misread. The config
 * loader checks only what needs no dlopen (transform_specs_check), so a missing file
 * is reported when the dataset opens; transform_emit.c calls apply() per sample. */
#include "transform_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ld_error.h"

/* What can be said of a plug-in step without loading it. */
static int plugin_check_path(struct transform_build *b, const char *path)
{
    if (!path || !*path)
        return transform_build_fail(b, NULL, "path is required");
    if (!strchr(path, '/'))
        return transform_build_fail(b, "path", "path '%s' must contain a '/' (a bare name would be searched "
                                    "for in the system's library path)", path);
    return 0;
}

static int plugin_load(struct transform_build *b, struct tstep *s)
{
    int r = plugin_check_path(b, s->path);
    if (r < 0)
        return r;
    dlerror();
    s->dl = dlopen(s->path, RTLD_NOW | RTLD_LOCAL);
    if (!s->dl) {
        const char *e = dlerror();
        return transform_build_fail(b, "path", "cannot load '%s': %s", s->path, e ? e : "unknown error");
    }
    void *sym = dlsym(s->dl, LD_TRANSFORM_PLUGIN_SYMBOL_V1);
    if (!sym) {
        for (int v = 9; v >= 2; v--) {
            char other[64];
            snprintf(other, sizeof other, "ld_transform_plugin_v%d", v);
            if (dlsym(s->dl, other))
                return transform_build_fail(b, "path", "'%s' was built for plug-in ABI v%d (it exports %s); "
                                            "this loaderd supports v%u", s->path, v, other,
                                            LD_TRANSFORM_PLUGIN_ABI_V1);
        }
        return transform_build_fail(b, "path", "'%s' is not a loaderd transform plug-in: it has no symbol %s",
                                    s->path, LD_TRANSFORM_PLUGIN_SYMBOL_V1);
    }
    ld_transform_plugin_v1_fn entry;
    memcpy(&entry, &sym, sizeof entry);     /* POSIX: a data pointer holds a function's address */
    const struct ld_transform_plugin_v1 *d = entry();
    if (!d)
        return transform_build_fail(b, "path", "'%s': %s() returned NULL", s->path, LD_TRANSFORM_PLUGIN_SYMBOL_V1);
    if (d->abi_version != LD_TRANSFORM_PLUGIN_ABI_V1)
        return transform_build_fail(b, "path", "'%s' declares plug-in ABI version %u; this loaderd supports %u",
                                    s->path, d->abi_version, LD_TRANSFORM_PLUGIN_ABI_V1);
    if (d->struct_size < sizeof(struct ld_transform_plugin_v1))
        return transform_build_fail(b, "path", "'%s' declares a descriptor of %u bytes, %zu expected", s->path,
                                    d->struct_size, sizeof(struct ld_transform_plugin_v1));
    if (!d->apply)
        return transform_build_fail(b, "path", "'%s' has no apply function", s->path);
    s->plugin = d;
    if (d->init) {
        char perr[LD_PLUGIN_ERR_MAX] = "";
        void *state = NULL;
        if (d->init(s->params ? s->params : "{}", &state, perr) != 0) {
            perr[sizeof perr - 1] = '\0';
            s->plugin = NULL;       /* init failed: free() must not see its state */
            return transform_build_fail(b, "params", "plug-in '%s' (%s) refused its parameters: %s",
                                        d->name ? d->name : "?", s->path, perr[0] ? perr : "init failed");
        }
        s->state = state;
    }
    return 0;
}

static int plugin_check(struct transform_build *b, struct tstep *s)
{
    return b->load_plugins ? plugin_load(b, s) : plugin_check_path(b, s->path);
}

void transform_plugin_close(struct tstep *s)
{
    if (s->plugin && s->plugin->free)
        s->plugin->free(s->state);
    s->plugin = NULL;
    s->state = NULL;
    if (s->dl)
        dlclose(s->dl);
    s->dl = NULL;
}

static const struct transform_param plugin_params[] = {
    {.name = "path", .type = TRANSFORM_PARAM_PATH, .offset = offsetof(struct transform_spec, plugin.path),
     .width = sizeof(char *), .flags = TRANSFORM_PARAM_REQUIRED},
    {.name = "params", .type = TRANSFORM_PARAM_JSON, .offset = offsetof(struct transform_spec, plugin.params_json),
     .width = sizeof(char *)},
};

const struct transform_kind_desc transform_plugin_kind = {
    .schema = {.kind = TRANSFORM_PLUGIN, .name = "plugin", .params = plugin_params,
               .n_params = sizeof plugin_params / sizeof plugin_params[0]},
    .defaults = {.kind = TRANSFORM_PLUGIN},
    .geometric = true,
    .check = plugin_check,
};
