/*
 * The daemon's snapshot loader (state/persist/restore.c: the reader
 * thread, the batches, the bulk load into the key index, layout records
 * through layouts_restore), on a snapshot file made of the input. The
 * loader reads a file (it maps it), so the input goes to a memory file
 * handed over by its /proc/self/fd path. The first byte is a plan: with
 * bit 0 set the header, every record's and the trailer's checksums are
 * recomputed first, so that mutations reach the record and layout parsers
 * behind them instead of stopping at a checksum.
 *
 * Whatever the bytes, the load must end with 0 or an error and a reason,
 * leave an index that passes its consistency check, and, when it
 * succeeds, the index must hold the number of keys the loader reports.
 */
#include "state/layouts.h"
#include "state/persist/persist.h"
#include "util/log.h"

#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/journal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Sets every checksum the format has to what the bytes give. */
static void fix_checksums(uint8_t *b, size_t n)
{
    if (n < KVIDX_SNAPSHOT_HEADER_LEN + KVIDX_SNAPSHOT_TRAILER_LEN)
        return;
    put32(b + 24, kvidx_crc32c(0, b, 24));
    size_t end = n - KVIDX_SNAPSHOT_TRAILER_LEN;
    for (size_t off = KVIDX_SNAPSHOT_HEADER_LEN; off + KVIDX_JREC_HDR_LEN <= end;) {
        uint32_t len = get32(b + off);
        if (len == 0 || len > end - off - KVIDX_JREC_HDR_LEN)
            break;
        uint32_t c = kvidx_crc32c(0, b + off, 4);
        put32(b + off + 4, kvidx_crc32c(c, b + off + KVIDX_JREC_HDR_LEN, len));
        off += KVIDX_JREC_HDR_LEN + len;
    }
    put32(b + n - 8, kvidx_crc32c(0, b, n - 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("kvidx-fuzz-snapshot", 0);
        check(fd >= 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        log_setup(getenv("KVIDX_FUZZ_TRACE") ? LOG_DEBUG : LOG_ERROR, LOG_TEXT);
    }
    if (size < 1)
        return 0;
    unsigned plan = data[0];
    data++;
    size--;
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    if (plan & 1)
        fix_checksums(copy, size);
    check(ftruncate(fd, 0) == 0);
    check(pwrite(fd, copy, size, 0) == (ssize_t)size);
    free(copy);

    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    kvidx_index_t *idx;
    if (kvidx_index_new(&o, &idx) != 0)
        return 0;
    struct layouts *l = layouts_new();
    if (!l) {
        kvidx_index_free(idx);
        return 0;
    }
    struct persist_snapshot_info info;
    const char *why = NULL;
    int rc = persist_load_snapshot(path, idx, l, &info, &why);
    if (getenv("KVIDX_FUZZ_TRACE"))
        fprintf(stderr, "load: %d (%s), %llu keys, %llu layouts\n", rc, why ? why : "",
                (unsigned long long)info.keys, (unsigned long long)info.layouts);
    check(kvidx_index_check(idx) == 0);
    if (rc == 0) {
        kvidx_index_stats_t st;
        kvidx_index_stats(idx, &st);
        check(st.keys == info.keys);
    } else {
        check(rc < 0 && why != NULL);
    }
    layouts_free(l);
    kvidx_index_free(idx);
    return 0;
}
