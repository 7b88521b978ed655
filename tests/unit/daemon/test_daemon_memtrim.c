/*
 * util/memtrim.c: the timer never keeps the loop alive and closes cleanly;
 * with glibc's malloc, memory freed below a block still in use (so that
 * free() cannot give it back) is returned to the kernel by the next tick.
 */
#include "util/memtrim.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVIDX_OWN_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVIDX_OWN_MALLOC 0
#endif
#endif
#ifndef KVIDX_OWN_MALLOC
#ifdef __GLIBC__
#define KVIDX_OWN_MALLOC 1
#else
#define KVIDX_OWN_MALLOC 0
#endif
#endif

static long resident_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, pages = 0;
    cr_assert(f);
    cr_assert_eq(fscanf(f, "%ld %ld", &size, &pages), 2);
    fclose(f);
    return pages * (sysconf(_SC_PAGESIZE) / 1024);
}

Test(memtrim, the_timer_keeps_no_loop_alive_and_closes)
{
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    struct memtrim m;
    cr_assert_eq(memtrim_start(&m, &loop), 0);
    cr_assert_eq(uv_run(&loop, UV_RUN_DEFAULT), 0, "the timer alone kept the loop running");
    memtrim_close(&m);
    memtrim_close(&m); /* idempotent */
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

static void on_stop(uv_timer_t *t)
{
    uv_stop(t->loop);
}

Test(memtrim, freed_pages_below_a_live_block_go_back_to_the_kernel)
{
    if (!KVIDX_OWN_MALLOC)
        cr_skip_test("not glibc's malloc");
    memtrim_setup();
    enum { N = 40000, SIZE = 200 }; /* ~8 MiB of small blocks */
    char **blocks = malloc(N * sizeof(*blocks));
    cr_assert(blocks);
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(SIZE);
        cr_assert(blocks[i]);
        for (int j = 0; j < SIZE; j += 64)
            ((volatile char *)blocks[i])[j] = (char)i; /* really touched */
    }
    char *pin = malloc(SIZE); /* above them: the heap's top cannot shrink */
    cr_assert(pin);
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    long before = resident_kib();

    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    struct memtrim m;
    cr_assert_eq(memtrim_start(&m, &loop), 0);
    uv_timer_t stop;
    uv_timer_init(&loop, &stop);
    uv_timer_start(&stop, on_stop, 1500, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    long after = resident_kib();
    cr_assert_geq(m.trims, 1);
    cr_assert_geq(before - after, 4096, "resident %ld KiB before the tick, %ld after", before,
                  after);

    memtrim_close(&m);
    uv_close((uv_handle_t *)&stop, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    free(pin);
    free(blocks);
}
