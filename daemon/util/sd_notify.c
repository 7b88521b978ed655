/*
 * The three pieces of systemd's service protocol kvidxd uses, written from
 * the documented wire format instead of linking libsystemd:
 *
 *  - sd_notify_send(): one datagram ("READY=1", "STOPPING=1", "STATUS=...",
 *    "WATCHDOG=1") to the AF_UNIX socket named by $NOTIFY_SOCKET; a name
 *    starting with '@' is in the abstract namespace (leading NUL).
 *  - sd_watchdog_usec(): $WATCHDOG_USEC, when $WATCHDOG_PID (if set) is us.
 *  - sd_listen_fds(): socket activation, fds 3.. passed with $LISTEN_FDS
 *    when $LISTEN_PID is us. They are marked close-on-exec and the
 *    variables are removed, so children do not believe they were activated.
 *
 * Invariants: no state is kept; every call reads the environment again.
 * Nothing here blocks (the datagram socket is local and the send is
 * MSG_DONTWAIT).
 */
#include "util/sd_notify.h"

#include "kvidx/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* A decimal environment value, 0 when absent or malformed. */
static unsigned long long env_ull(const char *name, int *ok)
{
    const char *s = getenv(name);
    *ok = 0;
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || s[0] == '-')
        return 0;
    *ok = 1;
    return v;
}

int sd_notify_send(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof(sa.sun_path))
        return KVIDX_EINVAL;
    memcpy(sa.sun_path, path, n);
    if (sa.sun_path[0] == '@')
        sa.sun_path[0] = '\0';
    /* Abstract names are exactly n bytes; paths include their NUL. */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));

    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return KVIDX_EINTERNAL;
    ssize_t w;
    do {
        w = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, len);
    } while (w < 0 && errno == EINTR);
    close(fd);
    return w < 0 ? KVIDX_EINTERNAL : 1;
}

uint64_t sd_watchdog_usec(void)
{
    int ok;
    unsigned long long pid = env_ull("WATCHDOG_PID", &ok);
    if (ok && pid != (unsigned long long)getpid())
        return 0;
    if (!ok && getenv("WATCHDOG_PID"))
        return 0; /* set but unreadable: not for us */
    unsigned long long usec = env_ull("WATCHDOG_USEC", &ok);
    return ok ? (uint64_t)usec : 0;
}

int sd_listen_fds(void)
{
    int ok_pid, ok_fds;
    unsigned long long pid = env_ull("LISTEN_PID", &ok_pid);
    unsigned long long n = env_ull("LISTEN_FDS", &ok_fds);
    int result = 0;
    if (ok_pid && ok_fds && pid == (unsigned long long)getpid() && n > 0 && n < 4096) {
        result = (int)n;
        for (int fd = 3; fd < 3 + (int)n; fd++) {
            int flags = fcntl(fd, F_GETFD);
            if (flags < 0) {
                result = 0; /* not an open fd: the environment lies */
                break;
            }
            if (!(flags & FD_CLOEXEC))
                fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
        }
    }
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    return result;
}
