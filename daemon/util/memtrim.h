/*
 * Allocator hygiene for glibc malloc: fixed mmap/trim thresholds, fewer
 * arenas, and free pages handed back to the kernel now and then (memtrim.c).
 */
#ifndef KVIDXD_MEMTRIM_H
#define KVIDXD_MEMTRIM_H

#include <uv.h>

#include <stddef.h>
#include <stdint.h>

struct memtrim {
    uv_timer_t timer;
    int on;
    uint64_t trims;      /* malloc_trim calls made (read with a debugger) */
    uint64_t trim_ns;    /* time spent in them */
    int64_t slack_after; /* resident bytes minus bytes in use, after the last trim */
};

/* Fixes glibc's mmap and trim thresholds and caps its arenas; call before
 * any thread is created. A no-op on other C libraries. */
void memtrim_setup(void);
/* Starts the periodic check on loop; 0 or a negative KVIDX_E*. */
int memtrim_start(struct memtrim *m, uv_loop_t *loop);
/* Closes the timer (idempotent). */
void memtrim_close(struct memtrim *m);

#endif
