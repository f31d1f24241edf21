/* systemd integration in one place: with libsystemd (LD_HAVE_SYSTEMD=1) the service
 * manager hears READY/STOPPING/WATCHDOG and may hand us a listening socket; without
 * it, every call is a no-op and the daemon binds its own socket. */
#include "notify.h"

#include <stddef.h>

#if LD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

void notify_send(const char *state)
{
#if LD_HAVE_SYSTEMD
    (void)sd_notify(0, state);
#else
    (void)state;
#endif
}

uint64_t notify_watchdog_usec(void)
{
#if LD_HAVE_SYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0)
        return usec;
#endif
    return 0;
}

int notify_listen_fd(void)
{
#if LD_HAVE_SYSTEMD
    int n = sd_listen_fds(1);
    if (n == 1 && sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) > 0)
        return SD_LISTEN_FDS_START;
#endif
    return -1;
}
