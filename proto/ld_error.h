/* loaderd error codes: one table for the daemon, the client library and the wire.
 *
 * Every function in loaderd returns 0 or a negative code from this table. The codes
 * that mirror errno have errno's value (negated), so `-errno` right at a failing
 * system call is already one of ours; codes of our own live below -4000. The same
 * table gives each code a stable wire name ("not_found", "bad_field", ...) so a reply
 * means the same on both ends of the socket.
 *
 * Never change a wire name or a number of our own without a protocol version bump.
 */
#ifndef LD_ERROR_H
#define LD_ERROR_H

#include <errno.h>

/* X(NAME, value, wire name, message) */
#define LD_ERROR_MAP(X)                                                                  \
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
    X(ECANCELED, -ECANCELED, "canceled", "operation canceled")

enum ld_error {
    LD_OK = 0,
#define LD_ERROR_ENUM(name, value, wire, msg) LD_##name = (value),
    LD_ERROR_MAP(LD_ERROR_ENUM)
#undef LD_ERROR_ENUM
};

/* A human sentence for a code; never NULL. Unknown codes get strerror's text or "unknown error". */
const char *ld_strerror(int code);
/* The wire name of a code ("not_found"); never NULL ("unknown_error" when not in the table). */
const char *ld_error_name(int code);
/* The code for a wire name; LD_EPROTO when the name is not in the table. */
int ld_error_from_name(const char *name);
/* Formats a message into errbuf (LD_ERRMSG_MAX bytes, see proto.h); NULL errbuf is
 * accepted and ignored. Every module that reports "what was wrong, where" uses it. */
void ld_errorf(char *errbuf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* -errno for an errno value, for use right at a failing call: `return ld_from_errno(errno);` */
static inline int ld_from_errno(int e) { return e > 0 ? -e : LD_EIO; }

#endif
