/*
 * Small helpers every benchmark program uses: a monotonic clock, the
 * process's resident set, a fixed-seed xorshift generator and an index
 * with a fixed hash seed (so runs are repeatable). Header-only, static inline: every
 * tests/bench/bench_*.c is its own program.
 */
#ifndef KVIDX_BENCH_UTIL_H
#define KVIDX_BENCH_UTIL_H

#include "kvidx/index.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident bytes of this process, or -1. */
static inline long rss_bytes(void)
{
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2)
        res = -1;
    fclose(f);
    return res * sysconf(_SC_PAGESIZE);
}

static uint64_t rng = 0x243f6a8885a308d3ULL;

static inline uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A new index with a fixed hash seed; exits on failure. */
static inline kvidx_index_t *bench_new_index(void)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    kvidx_index_t *idx;
    if (kvidx_index_new(&o, &idx))
        exit(1);
    return idx;
}

#endif
