/* client_info — what libloaderclient says about itself without a daemon: its version,
 * the error table (codes, wire names, sentences), the protocol's limits by name, and the
 * copying of versioned structs in and out.
 *
 * Every fact here is generated from the one place that states it (VERSION through the
 * Makefile, the LC_ERROR_MAP and LD_LIMIT_MAP X-macros), so that bindings read them
 * from the library instead of copying them. The struct helpers implement the growth
 * rule of loaderclient.h: a caller's struct carries the size it was compiled with, the
 * library reads and writes only that many bytes. */
#include "client_internal.h"
#include "proto.h"

#include <stdlib.h>
#include <string.h>

/* The public LC_E* codes and the daemon's LD_E* codes are generated from one list
 * (loaderclient_errors.h); these only guard the generation itself. */
_Static_assert((int)LC_EFIELD == (int)LD_EFIELD && (int)LC_ECANCELED == (int)LD_ECANCELED, "one error table");
_Static_assert(LD_SLOT_COUNT_MAX <= UINT32_MAX, "slot counts are uint32_t");

/* The version comes from the VERSION file, through the Makefile. */
#if !defined(LD_VERSION) || !defined(LD_VERSION_NUMBER)
#error "LD_VERSION and LD_VERSION_NUMBER are defined by the Makefile (from VERSION)"
#endif
_Static_assert(LC_DTYPE_UINT8 == LD_DTYPE_UINT8, "LC_DTYPE_UINT8");
_Static_assert(LC_DTYPE_UINT16 == LD_DTYPE_UINT16, "LC_DTYPE_UINT16");
_Static_assert(LC_DTYPE_UINT32 == LD_DTYPE_UINT32, "LC_DTYPE_UINT32");
_Static_assert(LC_DTYPE_INT32 == LD_DTYPE_INT32, "LC_DTYPE_INT32");
_Static_assert(LC_DTYPE_INT64 == LD_DTYPE_INT64, "LC_DTYPE_INT64");
_Static_assert(LC_DTYPE_FLOAT16 == LD_DTYPE_FLOAT16, "LC_DTYPE_FLOAT16");
_Static_assert(LC_DTYPE_FLOAT32 == LD_DTYPE_FLOAT32, "LC_DTYPE_FLOAT32");
_Static_assert(LC_MAX_DIMS == LD_MAX_DIMS + 1, "lc_field.shape holds the batch dim + a sample's dims");

/* ---- versions, errors, limits --------------------------------------------------------- */

LC_EXPORT const char *lc_version(void)
{
    return LD_VERSION;
}

LC_EXPORT int lc_version_number(void)
{
    return LD_VERSION_NUMBER;
}

LC_EXPORT const char *lc_strerror(int code)
{
    return ld_strerror(code);
}

LC_EXPORT const char *lc_error_name(int code)
{
    return ld_error_name(code);
}

static const int client_error_codes[] = {
#define CLIENT_ERROR_CODE(name, value, wire, msg) (value),
    LC_ERROR_MAP(CLIENT_ERROR_CODE)
#undef CLIENT_ERROR_CODE
};

LC_EXPORT int lc_error_code(int index)
{
    if (index < 0 || (size_t)index >= sizeof client_error_codes / sizeof client_error_codes[0])
        return 0;
    return client_error_codes[index];
}

static const struct {
    const char *name;
    int64_t value;
} client_limits[] = {
#define CLIENT_LIMIT(name, value) {name, (int64_t)(value)},
    LD_LIMIT_MAP(CLIENT_LIMIT)
#undef CLIENT_LIMIT
};

LC_EXPORT int64_t lc_limit(const char *name)
{
    for (size_t i = 0; name && i < sizeof client_limits / sizeof client_limits[0]; i++)
        if (strcmp(client_limits[i].name, name) == 0)
            return client_limits[i].value;
    return LC_EINVAL;
}

LC_EXPORT const char *lc_limit_name(int index)
{
    if (index < 0 || (size_t)index >= sizeof client_limits / sizeof client_limits[0])
        return NULL;
    return client_limits[index].name;
}

/* ---- versioned structs ------------------------------------------------------------- */

/* Copies a caller's versioned struct of `theirs` bytes into ours (`ours` bytes, already
 * holding the defaults): the common prefix is copied, members the caller does not know
 * keep their defaults, and members we do not know must be zero (their default, as far
 * as a newer header is concerned) or we would silently ignore what was asked. */
int client_copy_struct_in(void *dst, size_t ours, const void *src, size_t theirs, size_t min,
                                 const char *what, char *msg)
{
    if (theirs < min) {
        client_msgf(msg, "%s.struct_size is %zu, below the smallest layout (%zu bytes): initialise it with "
                    "%s_init()", what, theirs, min, what);
        return LC_EINVAL;
    }
    memcpy(dst, src, theirs < ours ? theirs : ours);
    for (size_t i = ours; i < theirs; i++) {
        if (((const unsigned char *)src)[i] != 0) {
            client_msgf(msg, "%s sets a member at byte %zu that this library (%s, %zu-byte struct) does not "
                        "know: the trainer was built against a newer loaderclient.h", what, i, LD_VERSION, ours);
            return LC_ENOTSUP;
        }
    }
    ((size_t *)dst)[0] = ours;
    return 0;
}


/* Hands a versioned struct out to a caller whose copy is `theirs` bytes: as much of
 * ours (`ours` bytes) as fits; members we do not know (a newer header's) are zeroed,
 * their "not set". LC_EINVAL when theirs is below the first published layout (min). */
int client_copy_struct_out(void *dst, size_t theirs, const void *src, size_t ours, size_t min)
{
    if (theirs < min)
        return LC_EINVAL;
    if (theirs > ours)
        memset((char *)dst + ours, 0, theirs - ours);
    memcpy(dst, src, theirs < ours ? theirs : ours);
    return 0;
}
