/*
 * The attention-window fold of docs/prefetch.md: every golden vector of
 * fold.jsonl, the contract's two examples, shape validation, out-of-memory, and a
 * randomized comparison against a brute-force reference that tests each
 * prefix length for servability directly.
 */
#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/fold.h"
#include "vectors.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXG    8
#define MAXKEYS 4096

typedef struct fold_case {
    int64_t windows[MAXG];
    kvidx_fold_shape_t shape;
    uint8_t available[MAXKEYS];
} fold_case_t;

/* Reads one fold.jsonl line into c; returns 0 when the line fits. */
static int case_from_json(const cJSON *v, fold_case_t *c)
{
    memset(c, 0, sizeof(*c));
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(v, "windows");
    size_t g = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, w)
    {
        if (g == MAXG)
            return -1;
        c->windows[g++] = (int64_t)it->valuedouble;
    }
    c->shape.windows = c->windows;
    c->shape.num_groups = g;
    c->shape.num_chunks = (size_t)cJSON_GetObjectItemCaseSensitive(v, "num_chunks")->valuedouble;
    c->shape.num_ranks = (size_t)cJSON_GetObjectItemCaseSensitive(v, "num_ranks")->valuedouble;
    if (kvidx_fold_num_keys(&c->shape) > MAXKEYS)
        return -1;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(v, "present"))
    {
        size_t i = (size_t)it->valuedouble;
        if (i >= kvidx_fold_num_keys(&c->shape))
            return -1;
        c->available[i] = 1;
    }
    return 0;
}

/* Whether L is servable, straight from docs/prefetch.md definition. */
static int brute_servable(const fold_case_t *c, size_t L)
{
    const kvidx_fold_shape_t *s = &c->shape;
    for (size_t g = 0; g < s->num_groups; g++) {
        size_t lo = 0;
        if (s->windows[g] != KVIDX_WINDOW_FULL && (size_t)s->windows[g] < L)
            lo = L - (size_t)s->windows[g];
        for (size_t ch = lo; ch < L; ch++) {
            for (size_t r = 0; r < s->num_ranks; r++) {
                size_t i = g * s->num_chunks * s->num_ranks + ch * s->num_ranks + r;
                if (!c->available[i])
                    return 0;
            }
        }
    }
    return 1;
}

static size_t brute_fold(const fold_case_t *c)
{
    size_t best = 0;
    for (size_t L = 0; L <= c->shape.num_chunks; L++) {
        if (brute_servable(c, L))
            best = L;
    }
    return best;
}

/* The retained list from the brute force: every key of a group whose chunk
 * lies in that group's window before L. */
static size_t brute_retained(const fold_case_t *c, size_t L, uint32_t *out)
{
    const kvidx_fold_shape_t *s = &c->shape;
    size_t k = 0;
    for (size_t i = 0; i < kvidx_fold_num_keys(s); i++) {
        size_t g = i / (s->num_chunks * s->num_ranks);
        size_t ch = (i / s->num_ranks) % s->num_chunks;
        int64_t w = s->windows[g];
        int in = ch < L && (w == KVIDX_WINDOW_FULL || ch + (size_t)w >= L);
        if (in)
            out[k++] = (uint32_t)i;
    }
    return k;
}

Test(fold, golden_vectors)
{
    size_t n = 0;
    cJSON **v = vectors_load("fold.jsonl", &n);
    cr_assert_gt(n, 0, "fold.jsonl is empty");
    static fold_case_t c;
    static uint32_t list[MAXKEYS];
    static uint8_t mark[MAXKEYS];
    for (size_t line = 1; line <= n; line++) {
        const cJSON *item = v[line - 1];
        cr_assert_eq(case_from_json(item, &c), 0, "fold.jsonl line %zu does not fit the test",
                     line);
        size_t hit = 99999;
        cr_assert_eq(kvidx_fold(&c.shape, c.available, &hit), 0, "fold.jsonl line %zu", line);
        size_t want = (size_t)cJSON_GetObjectItemCaseSensitive(item, "hit_chunks")->valuedouble;
        cr_expect_eq(hit, want, "fold.jsonl line %zu: hit_chunks %zu, want %zu", line, hit, want);

        const cJSON *ret = cJSON_GetObjectItemCaseSensitive(item, "retained");
        size_t cnt = 0;
        cr_assert_eq(kvidx_fold_retained_list(&c.shape, want, list, MAXKEYS, &cnt), 0);
        cr_expect_eq(cnt, (size_t)cJSON_GetArraySize(ret),
                     "fold.jsonl line %zu: %zu retained, want %d", line, cnt,
                     cJSON_GetArraySize(ret));
        cr_expect_eq(kvidx_fold_retained_count(&c.shape, want), cnt);
        size_t k = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, ret)
        {
            if (k < cnt)
                cr_expect_eq(list[k], (uint32_t)it->valuedouble,
                             "fold.jsonl line %zu: retained[%zu] = %u, want %u", line, k, list[k],
                             (uint32_t)it->valuedouble);
            k++;
        }
        cr_assert_eq(kvidx_fold_retained_mark(&c.shape, want, mark), 0);
        size_t marked = 0;
        for (size_t i = 0; i < kvidx_fold_num_keys(&c.shape); i++) {
            marked += mark[i];
            /* What serves hit_chunks is available, by definition. */
            if (mark[i])
                cr_expect(c.available[i], "fold.jsonl line %zu: retained key %zu is absent", line,
                          i);
        }
        cr_expect_eq(marked, cnt, "fold.jsonl line %zu: mark and list disagree", line);
    }
}

static size_t fold_of(const int64_t *windows, size_t g, size_t chunks, const int *const *have)
{
    static fold_case_t c;
    memset(&c, 0, sizeof(c));
    memcpy(c.windows, windows, g * sizeof(int64_t));
    c.shape = (kvidx_fold_shape_t){c.windows, g, chunks, 1};
    for (size_t gi = 0; gi < g; gi++) {
        for (const int *p = have[gi]; *p >= 0; p++)
            c.available[gi * chunks + (size_t)*p] = 1;
    }
    size_t hit = 0;
    cr_assert_eq(kvidx_fold(&c.shape, c.available, &hit), 0);
    cr_assert_eq(hit, brute_fold(&c));
    return hit;
}

Test(fold, spec_example_three_groups)
{
    /* Windows [-1, 2, 1], 6 chunks, 1 rank: {0,1,2,3}, {2,3,4}, {1,3,5} -> 4. */
    int64_t w[] = {-1, 2, 1};
    static const int g0[] = {0, 1, 2, 3, -1}, g1[] = {2, 3, 4, -1}, g2[] = {1, 3, 5, -1};
    const int *const have[] = {g0, g1, g2};
    cr_assert_eq(fold_of(w, 3, 6, have), 4);
}

Test(fold, spec_example_not_downward_closed)
{
    /* Windows [-1, 1], 8 chunks: group 0 all, group 1 {3,7} -> 8, although
     * L = 5 is not servable. */
    int64_t w[] = {-1, 1};
    static const int g0[] = {0, 1, 2, 3, 4, 5, 6, 7, -1}, g1[] = {3, 7, -1};
    const int *const have[] = {g0, g1};
    cr_assert_eq(fold_of(w, 2, 8, have), 8);
}

Test(fold, every_rank_needed)
{
    /* One full group, 3 chunks, 2 ranks: chunk 1 lacks rank 1. */
    int64_t w[] = {-1};
    kvidx_fold_shape_t s = {w, 1, 3, 2};
    uint8_t av[] = {1, 1, 1, 0, 1, 1};
    size_t hit = 9;
    cr_assert_eq(kvidx_fold(&s, av, &hit), 0);
    cr_assert_eq(hit, 1);
    av[3] = 1;
    cr_assert_eq(kvidx_fold(&s, av, &hit), 0);
    cr_assert_eq(hit, 3);
}

Test(fold, many_ranks_use_word_test)
{
    /* 19 ranks: exercises the 8-byte test and its tail, with bytes > 1. */
    int64_t w[] = {-1};
    kvidx_fold_shape_t s = {w, 1, 4, 19};
    uint8_t av[4 * 19];
    memset(av, 0x80, sizeof(av));
    size_t hit = 0;
    cr_assert_eq(kvidx_fold(&s, av, &hit), 0);
    cr_assert_eq(hit, 4);
    for (size_t r = 0; r < 19; r++) {
        av[2 * 19 + r] = 0;
        cr_assert_eq(kvidx_fold(&s, av, &hit), 0);
        cr_assert_eq(hit, 2, "rank %zu missing", r);
        av[2 * 19 + r] = 0x01;
    }
}

Test(fold, invalid_windows)
{
    uint8_t av[4] = {1, 1, 1, 1};
    size_t hit = 7;
    int64_t bad[][2] = {{-1, 0}, {-2, 1}, {INT64_MIN, -1}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvidx_fold_shape_t s = {bad[i], 2, 2, 1};
        cr_expect_eq(kvidx_fold_shape_check(&s), KVIDX_EINVAL, "case %zu", i);
        cr_expect_eq(kvidx_fold(&s, av, &hit), KVIDX_EINVAL, "case %zu", i);
        cr_expect_eq(kvidx_fold_retained_mark(&s, 0, av), KVIDX_EINVAL, "case %zu", i);
        cr_expect_eq(hit, 7, "hit_chunks written on error");
    }
    int64_t big[] = {INT64_MAX, 1};
    kvidx_fold_shape_t ok = {big, 2, 2, 1};
    cr_expect_eq(kvidx_fold(&ok, av, &hit), 0);
    cr_expect_eq(hit, 2);
    cr_expect_eq(kvidx_fold_retained_count(&ok, 2), 3);
}

Test(fold, invalid_shapes_and_bounds)
{
    int64_t w[] = {-1};
    uint8_t av[4] = {1, 1, 1, 1};
    size_t hit = 0, cnt = 0;
    kvidx_fold_shape_t nowin = {NULL, 1, 2, 2};
    cr_expect_eq(kvidx_fold(&nowin, av, &hit), KVIDX_EINVAL);
    kvidx_fold_shape_t huge = {w, 1, (size_t)1 << 20, (size_t)1 << 13};
    cr_expect_eq(kvidx_fold_shape_check(&huge), KVIDX_EINVAL);
    kvidx_fold_shape_t s = {w, 1, 2, 2};
    cr_expect_eq(kvidx_fold(&s, NULL, &hit), KVIDX_EINVAL);
    cr_expect_eq(kvidx_fold(&s, av, NULL), KVIDX_EINVAL);
    cr_expect_eq(kvidx_fold(NULL, av, &hit), KVIDX_EINVAL);
    cr_expect_eq(kvidx_fold_retained_mark(&s, 3, av), KVIDX_EINVAL);
    cr_expect_eq(kvidx_fold_retained_list(&s, 3, NULL, 0, &cnt), KVIDX_EINVAL);
    uint32_t out[4];
    cr_expect_eq(kvidx_fold_retained_list(&s, 2, out, 3, &cnt), KVIDX_ENOBUFS);
    cr_expect_eq(cnt, 4);
    cr_expect_eq(kvidx_fold_retained_list(&s, 2, out, 4, &cnt), 0);
    cr_expect_eq(out[3], 3);
}

Test(fold, empty_shapes)
{
    int64_t w[] = {2};
    size_t hit = 9;
    kvidx_fold_shape_t nochunks = {w, 1, 0, 4};
    cr_expect_eq(kvidx_fold(&nochunks, NULL, &hit), 0);
    cr_expect_eq(hit, 0);
    /* No ranks: every chunk counts vacuously. */
    kvidx_fold_shape_t noranks = {w, 1, 5, 0};
    cr_expect_eq(kvidx_fold(&noranks, NULL, &hit), 0);
    cr_expect_eq(hit, 5);
}

static void *failing_malloc(void *ctx, size_t size)
{
    (void)ctx;
    (void)size;
    return NULL;
}
static void *failing_realloc(void *ctx, void *p, size_t size)
{
    (void)ctx;
    (void)p;
    (void)size;
    return NULL;
}
static void plain_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(fold, out_of_memory)
{
    kvidx_allocator_t a = {failing_malloc, failing_realloc, plain_free, NULL};
    kvidx_set_allocator(&a);
    int64_t w[] = {-1, 2};
    kvidx_fold_shape_t s = {w, 2, 2, 1};
    uint8_t av[4] = {1, 1, 1, 1};
    size_t hit = 5;
    cr_expect_eq(kvidx_fold(&s, av, &hit), KVIDX_ENOMEM);
    cr_expect_eq(hit, 5);
    /* Full groups alone need no scratch. */
    w[1] = -1;
    cr_expect_eq(kvidx_fold(&s, av, &hit), 0);
    cr_expect_eq(hit, 2);
    kvidx_set_allocator(NULL);
}

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: a fixed, portable sequence. */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(2685821657736338717);
}

Test(fold, random_against_brute_force)
{
    uint64_t seed = UINT64_C(0x6b76696478666f6c);
    static fold_case_t c;
    static uint32_t got[MAXKEYS], want[MAXKEYS];
    static uint8_t mark[MAXKEYS];
    for (int t = 0; t < 20000; t++) {
        memset(&c, 0, sizeof(c));
        size_t G = 1 + rng_next(&seed) % 4;
        size_t C = rng_next(&seed) % 11;
        size_t R = 1 + rng_next(&seed) % 4;
        for (size_t g = 0; g < G; g++) {
            uint64_t k = rng_next(&seed) % (C + 3);
            c.windows[g] = k == 0 ? KVIDX_WINDOW_FULL : (int64_t)k;
        }
        c.shape = (kvidx_fold_shape_t){c.windows, G, C, R};
        /* Mostly-available inputs make long prefixes and window tails likely. */
        uint64_t density = 60 + rng_next(&seed) % 41;
        for (size_t i = 0; i < G * C * R; i++)
            c.available[i] = (rng_next(&seed) % 100) < density;
        size_t hit = 0;
        cr_assert_eq(kvidx_fold(&c.shape, c.available, &hit), 0);
        size_t ref = brute_fold(&c);
        cr_assert_eq(hit, ref, "case %d (G=%zu C=%zu R=%zu): %zu, brute force %zu", t, G, C, R, hit,
                     ref);
        size_t cnt = 0;
        cr_assert_eq(kvidx_fold_retained_list(&c.shape, hit, got, MAXKEYS, &cnt), 0);
        size_t wn = brute_retained(&c, hit, want);
        cr_assert_eq(cnt, wn, "case %d: retained count", t);
        cr_assert_eq(memcmp(got, want, cnt * sizeof(uint32_t)), 0, "case %d: retained", t);
        cr_assert_eq(kvidx_fold_retained_mark(&c.shape, hit, mark), 0);
        for (size_t i = 0; i < G * C * R; i++) {
            if (mark[i])
                cr_assert(c.available[i], "case %d: retained key %zu absent", t, i);
        }
    }
}
