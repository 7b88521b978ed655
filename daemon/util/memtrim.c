/*
 * Allocator hygiene for glibc malloc: settings that keep the resident size
 * close to the bytes in use under a long mixed load. What they correct:
 *
 *  - glibc's mmap and trim thresholds are left as glibc moves them (a
 *    freed mapped block raises them to its size). Fixed at glibc's first
 *    128 KiB, every request body and fast-scanner array of 100 KB or more
 *    is mapped afresh per request and faults its pages in each time, which
 *    costs a 1000-key store or lookup about as much as the rest of its
 *    work; fixed at 32 MiB, the heap's top is no longer trimmed on free and
 *    2 MiB of a big request's transient memory stays resident between
 *    trims. Both were measured in the soak (tests/soak/soak.py);
 *  - each thread that allocates (the journal writer, the fs source's scan
 *    thread, libuv's pool) may get an arena of its own that keeps its peak:
 *    at most MEMTRIM_ARENAS arenas, the loop thread's and one shared;
 *  - free chunks in the middle of an arena are only reused, never returned.
 *    A request that builds a big transient structure (a 250 KB JSON body
 *    is ~2 MiB of parser nodes) leaves that much free but resident memory
 *    behind whenever a longer-lived block was allocated above it. Every
 *    MEMTRIM_EVERY_MS, when at least MEMTRIM_MIN_FREE bytes are free in
 *    malloc and the resident bytes not held by blocks in use (resident
 *    size minus mallinfo2's uordblks) grew by MEMTRIM_REGROW since the
 *    last trim, malloc_trim(0) gives the free pages back to the kernel
 *    (MADV_DONTNEED; the chunks stay free, a later use faults the page in
 *    again). A call costs ~0.05-0.5 ms on a heap of a few MiB; the check
 *    (mallinfo2 and one read of /proc/self/statm) ~10 us.
 *
 * Invariants: memtrim_setup() runs before any thread exists; the timer is
 * unreferenced (it never keeps the loop alive) and closed by
 * memtrim_close(); nothing here changes what malloc returns, only where big
 * blocks live and which free pages stay resident. Other C libraries: no-op.
 */
#include "util/memtrim.h"

#include "kvidx/err.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

enum {
    MEMTRIM_ARENAS = 2,
    MEMTRIM_EVERY_MS = 1000,
    MEMTRIM_MIN_FREE = 256 * 1024,
    MEMTRIM_REGROW = 256 * 1024,
};

void memtrim_setup(void)
{
#ifdef __GLIBC__
    mallopt(M_ARENA_MAX, MEMTRIM_ARENAS);
#endif
}

#ifdef __GLIBC__
/* Resident bytes (the second field of /proc/self/statm), 0 when unknown. */
static uint64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long long size = 0, pages = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &pages) != 2)
        pages = 0;
    fclose(f);
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

static void on_tick(uv_timer_t *t)
{
    struct memtrim *m = t->data;
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    if (mi.fordblks < MEMTRIM_MIN_FREE)
        return;
    /* Resident bytes beyond the blocks in use: free memory still resident
     * plus what malloc does not count (code, stacks, untouched maps). If
     * that did not grow since the last trim, a trim now would walk the same
     * free lists again for nothing. Blocks freed since then count, even
     * when the resident size itself did not grow. */
    uint64_t rss = resident_bytes();
    int64_t slack = (int64_t)rss - (int64_t)mi.uordblks;
    if (rss && m->trims && slack < m->slack_after + MEMTRIM_REGROW)
        return;
    uint64_t t0 = mono_ns();
    malloc_trim(0);
    m->trim_ns += mono_ns() - t0;
    m->trims++;
    mi = mallinfo2();
    m->slack_after = (int64_t)resident_bytes() - (int64_t)mi.uordblks;
#else
    (void)m;
#endif
}

int memtrim_start(struct memtrim *m, uv_loop_t *loop)
{
    m->trims = 0;
    m->trim_ns = 0;
    m->slack_after = 0;
#ifdef __GLIBC__
    int rc = uv_timer_init(loop, &m->timer);
    if (rc != 0)
        return KVIDX_EINTERNAL;
    m->timer.data = m;
    m->on = 1;
    uv_unref((uv_handle_t *)&m->timer);
    uv_timer_start(&m->timer, on_tick, MEMTRIM_EVERY_MS, MEMTRIM_EVERY_MS);
#else
    (void)loop;
    m->on = 0;
#endif
    return 0;
}

void memtrim_close(struct memtrim *m)
{
    if (!m->on)
        return;
    m->on = 0;
    uv_close((uv_handle_t *)&m->timer, NULL);
}
