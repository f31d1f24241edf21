/* notify — the daemon's side of systemd's service protocol (Type=notify): READY=1,
 * STOPPING=1, STATUS=..., WATCHDOG=1, and socket activation. One small module so that
 * nothing else knows whether libsystemd is there. */
#ifndef LD_NOTIFY_H
#define LD_NOTIFY_H

#include <stdint.h>

/* Sends a state string ("READY=1", "STATUS=serving 3 clients"); no-op outside systemd. */
void notify_send(const char *state);
/* The watchdog period in microseconds when systemd asked for one, else 0. */
uint64_t notify_watchdog_usec(void);
/* A listening socket passed by systemd socket activation, or -1 when none. */
int notify_listen_fd(void);

#endif
