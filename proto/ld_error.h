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

/* The table itself is public: client/loaderclient_errors.h, installed with the client
 * library. LD_ERROR_MAP is the same list under the daemon's prefix. */
#include "loaderclient_errors.h"

/* X(NAME, value, wire name, message) */
#define LD_ERROR_MAP(X) LC_ERROR_MAP(X)

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
