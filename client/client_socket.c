/* client_socket — which socket a client connects to when the caller names none.
 *
 * The default itself (LOADERD_SOCKET, XDG_RUNTIME_DIR, /tmp/loaderd-<uid>) is computed by
 * proto_socket_default, the very function the daemon uses, so both ends agree. */
#include "client_internal.h"
#include "proto_socket.h"

#include <limits.h>

LC_EXPORT const char *lc_default_socket(void)
{
    /* Thread-local, so that two threads asking at once do not scribble on each other.
     * The daemon computes its default with the same function. */
    static _Thread_local char buf[PATH_MAX];
    (void)proto_socket_default(buf, sizeof buf);
    return buf;
}
