/*
 * The configuration file (daemon/util/config.c, read with inih): the input
 * is the file's text, handed over through a memory file so that the real
 * reader (fopen, its long-line handling, inih's syntax) runs. A refused
 * file must leave the settings as they were and say why; an accepted one
 * must hold settings that each write back as text and read again to the
 * same value, so that --print-config and a reload agree with the file.
 */
#include "util/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static int ndiff;

static void on_diff(void *ctx, const char *name, const char *from, const char *to)
{
    (void)ctx;
    (void)name;
    (void)from;
    (void)to;
    ndiff++;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    static struct config before, c, again;
    if (fd < 0) {
        fd = memfd_create("kvidx-fuzz-config", 0);
        check(fd >= 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    check(ftruncate(fd, 0) == 0);
    check(pwrite(fd, data, size, 0) == (ssize_t)size);

    config_defaults(&c);
    before = c;
    char err[512] = "";
    int rc = config_load_file(&c, path, err, sizeof(err));
    if (rc != 0) {
        check(memcmp(&c, &before, sizeof(c)) == 0);
        check(err[0] != '\0');
        return 0;
    }
    config_check(&c, err, sizeof(err));
    /* Every setting survives text and back. */
    config_defaults(&again);
    for (size_t i = 0; config_name(i); i++) {
        const char *name = config_name(i);
        char value[4096];
        check(config_format(&c, name, value, sizeof(value)) == 0);
        check(config_set(&again, name, value, err, sizeof(err)) == 0);
    }
    ndiff = 0;
    config_diff(&c, &again, on_diff, NULL);
    check(ndiff == 0);
    return 0;
}
