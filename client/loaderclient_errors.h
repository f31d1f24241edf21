/* loaderclient_errors.h — loaderd's error table, the one list that the daemon, the
 * client library, loaderctl and the Python binding all generate their codes from.
 *
 * It is public (installed next to loaderclient.h) and depends on nothing but <errno.h>:
 * a trainer includes it through loaderclient.h and gets one LC_E* constant for every
 * code the daemon can send. The daemon's LD_E* codes (proto/ld_error.h) are generated
 * from the same list, so the two cannot drift apart.
 *
 * Codes that mirror errno have errno's value (negated), so `-errno` right at a failing
 * system call is already one of ours; codes of loaderd's own live below -4000. Each code
 * has a stable wire name ("not_found", "bad_field", ...) that replies carry, and a
 * sentence (lc_strerror). Never change a wire name or a number of our own without a
 * protocol version bump; add new codes at the end.
 */
#ifndef LOADERCLIENT_ERRORS_H
#define LOADERCLIENT_ERRORS_H

#include <errno.h>

/* X(NAME, value, wire name, message) */
#define LC_ERROR_MAP(X)                                                                  \
    X(EPERM, -EPERM, "not_permitted", "operation not permitted")                         \
    X(ENOENT, -ENOENT, "not_found", "no such file or directory")                         \
    X(EIO, -EIO, "io_error", "input/output error")                                       \
    X(EBADF, -EBADF, "bad_descriptor", "bad file descriptor")                            \
    X(EAGAIN, -EAGAIN, "try_again", "resource temporarily unavailable")                  \
    X(ENOMEM, -ENOMEM, "out_of_memory", "out of memory")                                 \
    X(EACCES, -EACCES, "access_denied", "permission denied")                             \
    X(EBUSY, -EBUSY, "busy", "resource busy")                                            \
    X(EEXIST, -EEXIST, "exists", "already exists")                                       \
    X(ENOTDIR, -ENOTDIR, "not_a_directory", "not a directory")                           \
    X(EISDIR, -EISDIR, "is_a_directory", "is a directory")                               \
    X(EINVAL, -EINVAL, "invalid_argument", "invalid argument")                           \
    X(EMFILE, -EMFILE, "too_many_files", "too many open files")                          \
    X(EFBIG, -EFBIG, "too_big", "file too large")                                        \
    X(ENOSPC, -ENOSPC, "no_space", "no space left on device")                            \
    X(EPIPE, -EPIPE, "broken_pipe", "broken pipe")                                       \
    X(ERANGE, -ERANGE, "out_of_range", "value out of range")                             \
    X(ENAMETOOLONG, -ENAMETOOLONG, "name_too_long", "name too long")                     \
    X(ENOSYS, -ENOSYS, "not_implemented", "not implemented")                             \
    X(EBADMSG, -EBADMSG, "bad_message", "malformed message")                             \
    X(EPROTO, -EPROTO, "protocol_error", "protocol error")                               \
    X(EMSGSIZE, -EMSGSIZE, "frame_too_large", "frame larger than the limit")             \
    X(ENOTSUP, -ENOTSUP, "not_supported", "operation not supported")                     \
    X(EADDRINUSE, -EADDRINUSE, "address_in_use", "address already in use")               \
    X(ECONNRESET, -ECONNRESET, "connection_reset", "connection reset by peer")           \
    X(ENOTCONN, -ENOTCONN, "not_connected", "not connected")                             \
    X(ETIMEDOUT, -ETIMEDOUT, "timed_out", "timed out")                                   \
    X(ECONNREFUSED, -ECONNREFUSED, "connection_refused", "connection refused")           \
    X(EVERSION, -4001, "version_mismatch", "protocol version not supported")             \
    X(EUNKNOWNOP, -4002, "unknown_op", "unknown operation")                              \
    X(EFIELD, -4003, "bad_field", "missing or invalid field")                            \
    X(ENODATASET, -4004, "no_such_dataset", "no such dataset")                           \
    X(ENOSTREAM, -4005, "no_such_stream", "no such stream")                              \
    X(ENOTLEASED, -4006, "not_leased", "slot is not leased by this client")              \
    X(ESTALE, -4007, "stale_generation", "slot generation is stale")                     \
    X(EEND, -4008, "end_of_stream", "the stream has delivered all its epochs")           \
    X(EBUDGET, -4009, "over_budget", "memory budget exceeded")                           \
    X(ESAMPLE, -4010, "bad_sample", "a sample could not be read")                        \
    X(ECONFIG, -4011, "bad_config", "invalid configuration")                             \
    X(ELIMIT, -4012, "limit_reached", "limit reached")                                   \
    X(ESHM, -4013, "shm_error", "shared memory error")                                   \
    X(EHELLO, -4014, "hello_required", "the first request must be hello")                \
    X(ECLOSED, -4015, "closed", "closed")                                                \
    X(EDATASET, -4016, "bad_dataset", "the dataset cannot be served")                    \
    X(ECACHE, -4017, "cache_corrupt", "the cache file is corrupt or truncated")          \
    X(ECACHESTALE, -4018, "cache_stale", "the cache file does not match its source")     \
    X(ECACHEVERSION, -4019, "cache_version", "cache file format version not supported")  \
    X(ECANCELED, -ECANCELED, "canceled", "operation canceled")                           \
    X(EDEVICE, -4020, "device_error", "the device cannot be used")                       \
    X(EDENIED, -4021, "permission_denied", "denied by the daemon's access rules")     \
    X(EDETACHED, -4030, "detached", "the consumer fell behind its shared stream and was detached")

/* LC_OK and one LC_<NAME> per row: LC_EPERM, ..., LC_EFIELD, ..., LC_ECANCELED. */
enum lc_error {
    LC_OK = 0,
#define LC_ERROR_ENUM_(name, value, wire, msg) LC_##name = (value),
    LC_ERROR_MAP(LC_ERROR_ENUM_)
#undef LC_ERROR_ENUM_
};

#endif
