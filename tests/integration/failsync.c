/*
 * LD_PRELOAD shim for tests/integration/test_persistence.py: fsync and
 * fdatasync fail with EIO while the file named by $KVIDX_FAILSYNC exists,
 * the way a disk error reports itself to a process that already wrote.
 * Built as a shared library without sanitizers (it is preloaded into the
 * ASan build too, with verify_asan_link_order=0).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

int fsync(int fd);
int fdatasync(int fd);

static int failing(void)
{
    const char *f = getenv("KVIDX_FAILSYNC");
    return f && access(f, F_OK) == 0;
}

/* EIO while failing, else the real function of that name. */
static int sync_call(const char *name, int fd)
{
    if (failing()) {
        errno = EIO;
        return -1;
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);
    return real ? real(fd) : -1;
}

int fsync(int fd)
{
    return sync_call("fsync", fd);
}

int fdatasync(int fd)
{
    return sync_call("fdatasync", fd);
}
