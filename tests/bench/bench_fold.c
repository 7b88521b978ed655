/*
 * Benchmark of the attention-window fold (docs/prefetch.md) at the request size
 * limit: 8 groups x 4096 chunks x 8 ranks = 262,144 keys. Prints one
 * "name value unit" line per figure: the median of many runs of one fold,
 * per fold and per key, next to a memset and a byte scan of the same bitmap
 * as a floor, and a full LOOKUP plan + trim of the same request.
 *
 * Build: with -DKVIDX_BENCH=ON, or directly:
 *   gcc -O2 -Ilib/include tests/bench/bench_fold.c build/libkvidx.a -lsodium -lm
 */
#include "kvidx/fold.h"
#include "kvidx/prefetch_plan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GROUPS 8
#define CHUNKS 4096
#define RANKS  8
#define NKEYS  (GROUPS * CHUNKS * RANKS)
#define RUNS   301

static volatile size_t sink;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t median(uint64_t *t, size_t n)
{
    qsort(t, n, sizeof(*t), cmp_u64);
    return t[n / 2];
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(2685821657736338717);
}

/* Each of the n keys available with probability ppm / 1e6. */
static void fill_random(uint8_t *av, size_t n, uint64_t ppm, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        av[i] = rng_next(&seed) % 1000000u < ppm;
}

static void report(const char *name, uint64_t ns)
{
    printf("%s_ns %llu ns\n", name, (unsigned long long)ns);
    printf("%s_per_key_ns %.4f ns\n", name, (double)ns / NKEYS);
}

static void bench_fold(const char *name, const kvidx_fold_shape_t *shape, const uint8_t *av)
{
    static uint64_t t[RUNS];
    size_t hit = 0;
    for (size_t i = 0; i < RUNS; i++) {
        uint64_t t0 = now_ns();
        if (kvidx_fold(shape, av, &hit) != 0) {
            fprintf(stderr, "kvidx_fold failed\n");
            exit(1);
        }
        t[i] = now_ns() - t0;
        sink += hit;
    }
    report(name, median(t, RUNS));
    printf("%s_hit_chunks %zu chunks\n", name, hit);
}

static void bench_floor(uint8_t *av)
{
    static uint64_t t[RUNS];
    for (size_t i = 0; i < RUNS; i++) {
        uint64_t t0 = now_ns();
        memset(av, 1, NKEYS);
        __asm__ __volatile__("" : : "r"(av) : "memory");
        t[i] = now_ns() - t0;
    }
    report("floor_memset", median(t, RUNS));
    for (size_t i = 0; i < RUNS; i++) {
        uint64_t t0 = now_ns();
        size_t set = 0;
        for (size_t k = 0; k < NKEYS; k++)
            set += av[k] != 0;
        sink += set;
        t[i] = now_ns() - t0;
    }
    report("floor_scan", median(t, RUNS));
}

static void bench_plan_trim(const char *name, const kvidx_fold_shape_t *shape, const uint8_t *av)
{
    static uint8_t state[NKEYS];
    static uint64_t t[RUNS];
    /* Half of the available keys in L1, the other half loadable from L2. */
    for (size_t i = 0; i < NKEYS; i++)
        state[i] = !av[i] ? KVIDX_PF_ABSENT : (i & 1) ? KVIDX_PF_L2 : KVIDX_PF_L1_READY;
    kvidx_prefetch_req_t req = {NKEYS, state, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, shape};
    for (size_t i = 0; i < RUNS; i++) {
        kvidx_prefetch_plan_t plan;
        kvidx_prefetch_result_t res;
        uint64_t t0 = now_ns();
        if (kvidx_prefetch_plan(&req, &plan) != 0 || kvidx_prefetch_trim(&plan, NULL, &res) != 0) {
            fprintf(stderr, "plan/trim failed\n");
            exit(1);
        }
        t[i] = now_ns() - t0;
        sink += res.n_retained;
        kvidx_prefetch_result_free(&res);
        kvidx_prefetch_plan_free(&plan);
    }
    report(name, median(t, RUNS));
}

int main(void)
{
    static uint8_t av[NKEYS];
    int64_t full[GROUPS] = {-1, -1, -1, -1, -1, -1, -1, -1};
    /* Six full-attention groups, a 128-chunk sliding window and a mamba-like window of 1. */
    int64_t mixed[GROUPS] = {-1, -1, -1, -1, -1, -1, 128, 1};
    kvidx_fold_shape_t sfull = {full, GROUPS, CHUNKS, RANKS};
    kvidx_fold_shape_t smixed = {mixed, GROUPS, CHUNKS, RANKS};

    printf("keys %d keys\n", NKEYS);
    memset(av, 1, NKEYS);
    bench_fold("fold_full_all_available", &sfull, av);
    bench_fold("fold_mixed_all_available", &smixed, av);
    /* All full groups available, only the windowed groups random: the whole
     * request is scanned and the answer is the largest servable L. */
    fill_random(av + 6 * CHUNKS * RANKS, 2 * CHUNKS * RANKS, 999000, 42);
    bench_fold("fold_mixed_windows_random", &smixed, av);
    fill_random(av, NKEYS, 999990, 7);
    bench_fold("fold_mixed_random_p99999", &smixed, av);
    fill_random(av, NKEYS, 500000, 9);
    bench_fold("fold_mixed_random_p50", &smixed, av);

    memset(av, 1, NKEYS);
    bench_plan_trim("plan_trim_mixed_all_available", &smixed, av);
    bench_floor(av);
    return sink == 0xdeadbeef;
}
