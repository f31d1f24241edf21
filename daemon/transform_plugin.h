/* transform_plugin — the C ABI of a transform plug-in, and the PRNG every transform
 * (built in or plug-in) draws from. This header is all a plug-in needs: it has no
 * dependency on the rest of loaderd.
 *
 * A plug-in is a shared object named in a dataset's transform list
 * (`- plugin: {path: /opt/x/ld-plugin-foo.so, params: {...}}`). loaderd opens it with
 * dlopen(RTLD_NOW | RTLD_LOCAL) once, when the pipeline is built, looks up the function
 * ld_transform_plugin_v1, calls it once and checks that abi_version is
 * LD_TRANSFORM_PLUGIN_ABI_V1 and struct_size covers this struct. A later ABI gets a
 * new symbol name (ld_transform_plugin_v2) so an old loaderd refuses a new plug-in
 * by name instead of misreading it.
 *
 * The image a plug-in sees is 8-bit RGB, rows of width * 3 bytes (HWC), at the point
 * of the pipeline where the plug-in is listed; it changes the pixels in place and
 * cannot change the size.
 *
 * Randomness: each sample's augmentation is keyed by (seed, epoch, sample index) and
 * each transform of the list gets its own stream (keyed by its position), so a
 * plug-in's draws never shift the built-in ones and a sample comes out bit-identical
 * whatever worker thread prepares it. A plug-in must draw only from the struct
 * ld_prng it is given (never from rand(), time or thread state) to keep that promise.
 *
 * Never change this ABI without a new version number and symbol. */
#ifndef LD_TRANSFORM_PLUGIN_H
#define LD_TRANSFORM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define LD_TRANSFORM_PLUGIN_ABI_V1 1u
#define LD_TRANSFORM_PLUGIN_SYMBOL_V1 "ld_transform_plugin_v1"
#define LD_PLUGIN_ERR_MAX 256       /* bytes of the err buffers given to a plug-in */

/* The entry point must be visible even when the plug-in is built with
 * -fvisibility=hidden. */
#define LD_PLUGIN_EXPORT __attribute__((visibility("default")))

/* ---- the PRNG (counter-based: splitmix64 over a per-sample, per-transform key) --- */

struct ld_prng {
    uint64_t key;
    uint64_t counter;
};

/* splitmix64, the same function as ld_splitmix64() in proto/ld_mix.h (test_mix checks
 * that they agree). Written out here because this header must stand alone. */
static inline uint64_t ld_prng_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The stream of transform `step` (its 0-based position in the list, a leading decode
 * not counted) for one sample. */
static inline struct ld_prng ld_prng_for(uint64_t seed, uint64_t epoch, uint64_t index,
                                         uint64_t step)
{
    uint64_t k = ld_prng_mix(seed ^ 0x6c6f616465726400ull);   /* "loaderd" */
    k = ld_prng_mix(k ^ epoch);
    k = ld_prng_mix(k ^ index);
    k = ld_prng_mix(k ^ step);
    struct ld_prng p = {k, 0};
    return p;
}

static inline uint64_t ld_prng_next(struct ld_prng *p)
{
    return ld_prng_mix(p->key + 0x9e3779b97f4a7c15ull * ++p->counter);
}

/* Uniform in [0, 1), 53 random bits. */
static inline double ld_prng_uniform(struct ld_prng *p)
{
    return (double)(ld_prng_next(p) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n) without modulo bias (Lemire's multiply-and-reject); n > 0. */
static inline uint64_t ld_prng_below(struct ld_prng *p, uint64_t n)
{
    unsigned __int128 m = (unsigned __int128)ld_prng_next(p) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t t = (0 - n) % n;
        while (lo < t) {
            m = (unsigned __int128)ld_prng_next(p) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* ---- the plug-in ABI, version 1 ---------------------------------------------------- */

/* One image, 8-bit RGB, `stride` bytes between rows (>= width * 3). */
struct ld_image {
    uint8_t *data;
    int width, height;
    size_t stride;
};

/* Which sample is being transformed; for plug-ins that key their own decisions. */
struct ld_sample_info {
    uint64_t seed, epoch, index;
    uint32_t step;                  /* this transform's position in the list (0-based,
                                     * a leading decode not counted): rng's key */
};

struct ld_transform_plugin_v1 {
    uint32_t abi_version;           /* LD_TRANSFORM_PLUGIN_ABI_V1 */
    uint32_t struct_size;           /* sizeof(struct ld_transform_plugin_v1) */
    const char *name;               /* short name for messages, e.g. "invert" */
    /* Parses params (a JSON object as text, "{}" when none were given) and makes the
     * state apply() will share. Called once, on the daemon's main thread, may block.
     * Returns 0, or non-zero with a sentence in err (LD_PLUGIN_ERR_MAX bytes). */
    int (*init)(const char *params_json, void **ret_state, char *err);
    /* Transforms one image in place. Called from many worker threads at once with the
     * same state, which it must therefore only read. Must not block or keep pointers
     * to img or rng after it returns. Returns 0, or non-zero with a sentence in err:
     * the sample then counts as bad (the dataset's bad-sample policy applies). */
    int (*apply)(void *state, struct ld_image *img, struct ld_prng *rng,
                 const struct ld_sample_info *info, char *err);
    /* Frees what init made; called once, after the last apply. Accepts NULL. */
    void (*free)(void *state);
};

/* What a plug-in defines; loaderd calls it once after dlopen. The declaration carries
 * the export attribute, so the definition needs none. */
typedef const struct ld_transform_plugin_v1 *(*ld_transform_plugin_v1_fn)(void);
LD_PLUGIN_EXPORT const struct ld_transform_plugin_v1 *ld_transform_plugin_v1(void);

#endif
