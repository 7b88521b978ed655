/*
 * systemd's notify protocol, without libsystemd: one datagram to the
 * AF_UNIX socket named by $NOTIFY_SOCKET (abstract when it starts with '@').
 */
#ifndef KVIDXD_SD_NOTIFY_H
#define KVIDXD_SD_NOTIFY_H

#include <stdint.h>

/* Sends msg ("READY=1", "STATUS=...") when NOTIFY_SOCKET is set. Returns 1
 * sent, 0 no socket configured, negative KVIDX_E* on failure. */
int sd_notify_send(const char *msg);
/* Watchdog interval in µs from $WATCHDOG_USEC (honouring $WATCHDOG_PID), 0 when off. */
uint64_t sd_watchdog_usec(void);
/* Socket activation: number of fds passed (LISTEN_FDS for our LISTEN_PID),
 * starting at fd 3; 0 when none. */
int sd_listen_fds(void);

#endif
