/*
 * Prefetch planning and trimming (docs/prefetch.md): every golden
 * vector of prefetch.jsonl, docs/prefetch.md worked example in its three
 * variants, joined in-flight loads, WARM, the ipc form, bad input and
 * out-of-memory.
 */
#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/prefetch_plan.h"
#include "vectors.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 256

/* Whether list[0..n) equals the JSON array of integers. */
static int list_eq_json(const uint32_t *list, size_t n, const cJSON *arr)
{
    if ((size_t)cJSON_GetArraySize(arr) != n)
        return 0;
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (list[k++] != (uint32_t)it->valuedouble)
            return 0;
    }
    return 1;
}

/* Whether list[0..n) equals want[0..wn). */
static int list_eq(const uint32_t *list, size_t n, const uint32_t *want, size_t wn)
{
    return n == wn && (n == 0 || memcmp(list, want, n * sizeof(uint32_t)) == 0);
}

static void mark_json(uint8_t *map, const cJSON *arr, uint8_t value)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        map[(size_t)it->valuedouble] = value;
    }
}

static kvidx_trim_policy_t policy_of(const char *s)
{
    if (strcmp(s, "PREFIX") == 0)
        return KVIDX_TRIM_PREFIX;
    if (strcmp(s, "SEGMENTED_PREFIX") == 0)
        return KVIDX_TRIM_SEGMENTED_PREFIX;
    cr_assert_str_eq(s, "SPARSE", "unknown trim policy %s", s);
    return KVIDX_TRIM_SPARSE;
}

Test(prefetch_plan, golden_vectors)
{
    size_t count = 0;
    cJSON **v = vectors_load("prefetch.jsonl", &count);
    cr_assert_gt(count, 0, "prefetch.jsonl is empty");
    for (size_t line = 1; line <= count; line++) {
        const cJSON *c = v[line - 1];
        size_t n = (size_t)cJSON_GetObjectItemCaseSensitive(c, "n")->valuedouble;
        cr_assert_leq(n, MAXN, "prefetch.jsonl line %zu: n too large for the test", line);
        uint8_t state[MAXN] = {0}, failed[MAXN] = {0};
        /* L2 first, then L1 over it: an L1 copy wins (the L2 probe is only for L1 misses). */
        mark_json(state, cJSON_GetObjectItemCaseSensitive(c, "l2"), KVIDX_PF_L2);
        mark_json(state, cJSON_GetObjectItemCaseSensitive(c, "l1"), KVIDX_PF_L1_READY);
        mark_json(failed, cJSON_GetObjectItemCaseSensitive(c, "failed_loads"), 1);
        kvidx_prefetch_req_t req = {
            .n = n,
            .state = state,
            .mode = KVIDX_PF_LOOKUP,
            .policy = policy_of(cJSON_GetObjectItemCaseSensitive(c, "trim_policy")->valuestring),
        };
        kvidx_prefetch_plan_t plan;
        kvidx_prefetch_result_t res;
        cr_assert_eq(kvidx_prefetch_plan(&req, &plan), 0, "prefetch.jsonl line %zu", line);
        cr_assert_eq(kvidx_prefetch_trim(&plan, failed, &res), 0, "prefetch.jsonl line %zu", line);
        cr_expect(list_eq_json(plan.l1_found, plan.n_l1_found,
                               cJSON_GetObjectItemCaseSensitive(c, "l1_found_indices")),
                  "prefetch.jsonl line %zu: l1_found_indices", line);
        cr_expect(list_eq_json(plan.l2_orig, plan.n_l2_orig,
                               cJSON_GetObjectItemCaseSensitive(c, "l2_orig_indices")),
                  "prefetch.jsonl line %zu: l2_orig_indices", line);
        cr_expect(list_eq(plan.new_loads, plan.n_new_loads, plan.l2_orig, plan.n_l2_orig),
                  "prefetch.jsonl line %zu: no joined load, so every load is new", line);
        cr_expect(list_eq_json(res.retained, res.n_retained,
                               cJSON_GetObjectItemCaseSensitive(c, "retained_indices")),
                  "prefetch.jsonl line %zu: retained_indices", line);
        size_t hk = (size_t)cJSON_GetObjectItemCaseSensitive(c, "hit_keys")->valuedouble;
        cr_expect_eq(res.hit_keys, hk, "prefetch.jsonl line %zu: hit_keys %zu, want %zu", line,
                     res.hit_keys, hk);
        /* Every found key is either retained or released. */
        cr_expect_eq(res.n_found, res.n_retained + res.n_released,
                     "prefetch.jsonl line %zu: found = retained + released", line);
        kvidx_prefetch_result_free(&res);
        kvidx_prefetch_plan_free(&plan);
    }
}

/* docs/prefetch.md worked example: 6 keys; L1 holds 0,1,3; L2 holds 2,3,4. */
static void spec_state(uint8_t state[6], int key2_anywhere)
{
    static const uint8_t base[6] = {KVIDX_PF_L1_READY, KVIDX_PF_L1_READY, KVIDX_PF_L2,
                                    KVIDX_PF_L1_READY, KVIDX_PF_L2,       KVIDX_PF_ABSENT};
    memcpy(state, base, 6);
    if (!key2_anywhere)
        state[2] = KVIDX_PF_ABSENT;
}

static void run(kvidx_trim_policy_t policy, kvidx_prefetch_mode_t mode, const uint8_t *state,
                size_t n, const uint8_t *failed, kvidx_prefetch_plan_t *plan,
                kvidx_prefetch_result_t *res)
{
    kvidx_prefetch_req_t req = {.n = n, .state = state, .mode = mode, .policy = policy};
    cr_assert_eq(kvidx_prefetch_plan(&req, plan), 0);
    cr_assert_eq(kvidx_prefetch_trim(plan, failed, res), 0);
}

Test(prefetch_plan, spec_example_all_loads_succeed)
{
    uint8_t st[6];
    spec_state(st, 1);
    static const uint32_t l1[] = {0, 1, 3}, l2[] = {2, 4}, all[] = {0, 1, 2, 3, 4};
    for (int p = KVIDX_TRIM_PREFIX; p <= KVIDX_TRIM_SPARSE; p++) {
        kvidx_prefetch_plan_t plan;
        kvidx_prefetch_result_t res;
        run((kvidx_trim_policy_t)p, KVIDX_PF_LOOKUP, st, 6, NULL, &plan, &res);
        cr_expect(list_eq(plan.l1_found, plan.n_l1_found, l1, 3), "policy %d", p);
        cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, l2, 2), "policy %d", p);
        cr_expect(list_eq(res.retained, res.n_retained, all, 5), "policy %d", p);
        cr_expect(list_eq(res.found, res.n_found, all, 5), "policy %d", p);
        cr_expect_eq(res.hit_keys, 5, "policy %d", p);
        cr_expect_eq(res.n_released, 0, "policy %d", p);
        kvidx_prefetch_result_free(&res);
        kvidx_prefetch_plan_free(&plan);
    }
}

Test(prefetch_plan, spec_example_key2_load_fails)
{
    uint8_t st[6], failed[6] = {0, 0, 1, 0, 0, 0};
    spec_state(st, 1);
    static const uint32_t head[] = {0, 1}, tail[] = {3, 4}, gaps[] = {0, 1, 3, 4};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;

    run(KVIDX_TRIM_PREFIX, KVIDX_PF_LOOKUP, st, 6, failed, &plan, &res);
    cr_expect(list_eq(res.retained, res.n_retained, head, 2));
    cr_expect(list_eq(res.released, res.n_released, tail, 2), "keys 3 and 4 released");
    cr_expect(list_eq(res.found, res.n_found, gaps, 4));
    cr_expect_eq(res.hit_keys, 2);
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);

    for (int p = KVIDX_TRIM_SEGMENTED_PREFIX; p <= KVIDX_TRIM_SPARSE; p++) {
        run((kvidx_trim_policy_t)p, KVIDX_PF_LOOKUP, st, 6, failed, &plan, &res);
        cr_expect(list_eq(res.retained, res.n_retained, gaps, 4), "policy %d", p);
        cr_expect_eq(res.n_released, 0, "policy %d", p);
        cr_expect_eq(res.hit_keys, 2, "policy %d", p);
        kvidx_prefetch_result_free(&res);
        kvidx_prefetch_plan_free(&plan);
    }
}

Test(prefetch_plan, spec_example_key2_in_no_tier)
{
    uint8_t st[6];
    spec_state(st, 0);
    static const uint32_t head[] = {0, 1}, sparse[] = {0, 1, 3, 4}, sparse_l1[] = {0, 1, 3},
                          four[] = {4};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;
    for (int p = KVIDX_TRIM_PREFIX; p <= KVIDX_TRIM_SEGMENTED_PREFIX; p++) {
        run((kvidx_trim_policy_t)p, KVIDX_PF_LOOKUP, st, 6, NULL, &plan, &res);
        cr_expect(list_eq(plan.l1_found, plan.n_l1_found, head, 2), "policy %d", p);
        cr_expect_eq(plan.n_l2_orig, 0, "policy %d", p);
        cr_expect(list_eq(res.retained, res.n_retained, head, 2), "policy %d", p);
        cr_expect_eq(res.hit_keys, 2);
        kvidx_prefetch_result_free(&res);
        kvidx_prefetch_plan_free(&plan);
    }
    run(KVIDX_TRIM_SPARSE, KVIDX_PF_LOOKUP, st, 6, NULL, &plan, &res);
    cr_expect(list_eq(plan.l1_found, plan.n_l1_found, sparse_l1, 3));
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, four, 1));
    cr_expect(list_eq(res.retained, res.n_retained, sparse, 4));
    cr_expect_eq(res.hit_keys, 2);
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);
}

Test(prefetch_plan, loading_copy_joins_the_load)
{
    /* Key 1 is loading for another handle: planned, in l2_orig, no new load. */
    uint8_t st[4] = {KVIDX_PF_L1_READY, KVIDX_PF_L1_LOADING, KVIDX_PF_L2, KVIDX_PF_L1_READY};
    static const uint32_t l1[] = {0, 3}, l2[] = {1, 2}, fresh[] = {2}, all[] = {0, 1, 2, 3},
                          head[] = {0};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;
    run(KVIDX_TRIM_PREFIX, KVIDX_PF_LOOKUP, st, 4, NULL, &plan, &res);
    cr_expect(list_eq(plan.l1_found, plan.n_l1_found, l1, 2));
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, l2, 2));
    cr_expect(list_eq(plan.new_loads, plan.n_new_loads, fresh, 1));
    cr_expect(list_eq(res.retained, res.n_retained, all, 4));
    kvidx_prefetch_result_free(&res);

    /* The joined load fails: a miss, like any failed load. */
    uint8_t failed[4] = {0, 1, 0, 0};
    cr_assert_eq(kvidx_prefetch_trim(&plan, failed, &res), 0);
    cr_expect(list_eq(res.retained, res.n_retained, head, 1));
    cr_expect_eq(res.hit_keys, 1);
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);
}

Test(prefetch_plan, failure_outside_the_load_set_is_ignored)
{
    /* An L1 hit cannot fail a load, nor can an unplanned key. */
    uint8_t st[3] = {KVIDX_PF_L1_READY, KVIDX_PF_ABSENT, KVIDX_PF_L2};
    uint8_t failed[3] = {1, 1, 1};
    static const uint32_t head[] = {0};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;
    run(KVIDX_TRIM_PREFIX, KVIDX_PF_LOOKUP, st, 3, failed, &plan, &res);
    cr_expect_eq(plan.n_l2_orig, 0);
    cr_expect(list_eq(res.retained, res.n_retained, head, 1));
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);
}

Test(prefetch_plan, warm_pins_nothing)
{
    uint8_t st[6];
    spec_state(st, 1);
    uint8_t failed[6] = {0, 0, 0, 0, 1, 0};
    static const uint32_t l2[] = {2, 4}, l1[] = {0, 1, 3}, found[] = {0, 1, 2, 3};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;
    run(KVIDX_TRIM_SPARSE, KVIDX_PF_WARM, st, 6, failed, &plan, &res);
    cr_expect_eq(plan.n_l1_found, 0, "WARM's l1_found_indices is []");
    cr_expect(list_eq(plan.l1_hits, plan.n_l1_hits, l1, 3), "L1 hits are still reported");
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, l2, 2));
    cr_expect(list_eq(res.found, res.n_found, found, 4), "found = L1-resident at completion");
    cr_expect_eq(res.n_retained, 0);
    cr_expect_eq(res.n_released, 0);
    cr_expect_eq(res.hit_keys, 4);
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);
}

Test(prefetch_plan, warm_prefix_warms_only_the_leading_run)
{
    /* Key 2 in no tier: PREFIX warms only {0,1}; key 4 is not loaded, but
     * key 3, already in L1, is still found (resident at completion). */
    uint8_t st[6];
    spec_state(st, 0);
    static const uint32_t found[] = {0, 1, 3};
    for (int p = KVIDX_TRIM_PREFIX; p <= KVIDX_TRIM_SEGMENTED_PREFIX; p++) {
        kvidx_prefetch_plan_t plan;
        kvidx_prefetch_result_t res;
        run((kvidx_trim_policy_t)p, KVIDX_PF_WARM, st, 6, NULL, &plan, &res);
        cr_expect_eq(plan.n_l1_found, 0);
        cr_expect_eq(plan.n_l2_orig, 0, "policy %d: key 4 is past the leading run", p);
        cr_expect(list_eq(res.found, res.n_found, found, 3), "policy %d", p);
        cr_expect_eq(res.hit_keys, 2);
        cr_expect_eq(res.n_retained, 0);
        kvidx_prefetch_result_free(&res);
        kvidx_prefetch_plan_free(&plan);
    }
}

Test(prefetch_plan, ipc_form_plans_the_fold)
{
    /* docs/prefetch.md first example: windows [-1, 2, 1], 6 chunks, 1 rank;
     * group 0 {0,1,2,3} (L1), group 1 {2,3,4} (L2), group 2 {1,3,5} (L2). */
    int64_t w[] = {-1, 2, 1};
    kvidx_fold_shape_t shape = {w, 3, 6, 1};
    uint8_t st[18] = {0};
    for (int c = 0; c < 4; c++)
        st[c] = KVIDX_PF_L1_READY;
    st[6 + 2] = st[6 + 3] = st[6 + 4] = KVIDX_PF_L2;
    st[12 + 1] = st[12 + 3] = st[12 + 5] = KVIDX_PF_L2;
    kvidx_prefetch_req_t req = {18, st, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, &shape};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;
    cr_assert_eq(kvidx_prefetch_plan(&req, &plan), 0);
    static const uint32_t l1[] = {0, 1, 2, 3}, l2[] = {8, 9, 15}, kept[] = {0, 1, 2, 3, 8, 9, 15};
    cr_expect_eq(plan.planned_chunks, 4);
    cr_expect(list_eq(plan.l1_found, plan.n_l1_found, l1, 4));
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, l2, 3));
    cr_assert_eq(kvidx_prefetch_trim(&plan, NULL, &res), 0);
    cr_expect_eq(res.hit_chunks, 4);
    cr_expect(list_eq(res.retained, res.n_retained, kept, 7));
    cr_expect_eq(res.hit_keys, 4, "leading run in flat order: group 0's chunks 0..3");
    kvidx_prefetch_result_free(&res);

    /* Group 2's chunk 3 (flat 15) fails: group 2 then has no chunk found
     * (13 and 17 were never planned), so no L >= 1 is servable. */
    uint8_t failed[18] = {0};
    failed[15] = 1;
    cr_assert_eq(kvidx_prefetch_trim(&plan, failed, &res), 0);
    cr_expect_eq(res.hit_chunks, 0);
    cr_expect_eq(res.n_retained, 0);
    cr_expect_eq(res.n_released, 6, "every found key is released");
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);

    /* SEGMENTED_PREFIX plans the same set and keeps what survives. */
    req.policy = KVIDX_TRIM_SEGMENTED_PREFIX;
    cr_assert_eq(kvidx_prefetch_plan(&req, &plan), 0);
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, l2, 3));
    cr_assert_eq(kvidx_prefetch_trim(&plan, failed, &res), 0);
    static const uint32_t seg[] = {0, 1, 2, 3, 8, 9};
    cr_expect(list_eq(res.retained, res.n_retained, seg, 6));
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);

    /* SPARSE plans every available key. */
    req.policy = KVIDX_TRIM_SPARSE;
    cr_assert_eq(kvidx_prefetch_plan(&req, &plan), 0);
    static const uint32_t all2[] = {8, 9, 10, 13, 15, 17};
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, all2, 6));
    kvidx_prefetch_plan_free(&plan);
}

Test(prefetch_plan, ipc_form_windows_need_not_be_downward_closed)
{
    /* docs/prefetch.md second example: windows [-1, 1], 8 chunks: group 0 all,
     * group 1 {3, 7}. PREFIX plans L = 8: group 0 all, group 1 chunk 7. */
    int64_t w[] = {-1, 1};
    kvidx_fold_shape_t shape = {w, 2, 8, 1};
    uint8_t st[16] = {0};
    memset(st, KVIDX_PF_L1_READY, 8);
    st[8 + 3] = st[8 + 7] = KVIDX_PF_L2;
    kvidx_prefetch_req_t req = {16, st, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, &shape};
    kvidx_prefetch_plan_t plan;
    cr_assert_eq(kvidx_prefetch_plan(&req, &plan), 0);
    static const uint32_t l2[] = {15};
    cr_expect_eq(plan.planned_chunks, 8);
    cr_expect_eq(plan.n_l1_found, 8);
    cr_expect(list_eq(plan.l2_orig, plan.n_l2_orig, l2, 1), "chunk 3 of group 1 is not needed");
    kvidx_prefetch_plan_free(&plan);
}

Test(prefetch_plan, invalid_input)
{
    uint8_t st[2] = {KVIDX_PF_L1_READY, 7};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_req_t req = {2, st, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, NULL};
    cr_expect_eq(kvidx_prefetch_plan(&req, &plan), KVIDX_EINVAL, "bad state value");
    st[1] = KVIDX_PF_L2;
    req.policy = (kvidx_trim_policy_t)3;
    cr_expect_eq(kvidx_prefetch_plan(&req, &plan), KVIDX_EINVAL, "bad policy");
    req.policy = KVIDX_TRIM_SPARSE;
    req.mode = (kvidx_prefetch_mode_t)2;
    cr_expect_eq(kvidx_prefetch_plan(&req, &plan), KVIDX_EINVAL, "bad mode");
    req.mode = KVIDX_PF_WARM;
    int64_t w[] = {0};
    kvidx_fold_shape_t shape = {w, 1, 2, 1};
    req.ipc = &shape;
    cr_expect_eq(kvidx_prefetch_plan(&req, &plan), KVIDX_EINVAL, "window 0");
    w[0] = -1;
    shape.num_chunks = 3;
    cr_expect_eq(kvidx_prefetch_plan(&req, &plan), KVIDX_EINVAL, "G*C*R != n");
    shape.num_chunks = 2;
    cr_expect_eq(kvidx_prefetch_plan(&req, &plan), 0);
    kvidx_prefetch_plan_free(&plan);
    kvidx_prefetch_plan_free(&plan); /* idempotent */
    cr_expect_eq(kvidx_prefetch_plan(NULL, &plan), KVIDX_EINVAL);
    cr_expect_eq(kvidx_prefetch_trim(NULL, NULL, NULL), KVIDX_EINVAL);
}

Test(prefetch_plan, empty_request)
{
    kvidx_prefetch_req_t req = {0, NULL, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, NULL};
    kvidx_prefetch_plan_t plan;
    kvidx_prefetch_result_t res;
    cr_assert_eq(kvidx_prefetch_plan(&req, &plan), 0);
    cr_assert_eq(kvidx_prefetch_trim(&plan, NULL, &res), 0);
    cr_expect_eq(plan.n_l1_found + plan.n_l2_orig + res.n_found + res.hit_keys, 0);
    kvidx_prefetch_result_free(&res);
    kvidx_prefetch_plan_free(&plan);
}

/* Fails the allocation numbered `fail_at` (0-based), passes the rest. */
typedef struct countdown {
    int calls;
    int fail_at;
} countdown_t;

static void *cd_malloc(void *ctx, size_t size)
{
    countdown_t *cd = ctx;
    return cd->calls++ == cd->fail_at ? NULL : malloc(size);
}
static void *cd_realloc(void *ctx, void *p, size_t size)
{
    countdown_t *cd = ctx;
    return cd->calls++ == cd->fail_at ? NULL : realloc(p, size);
}
static void cd_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(prefetch_plan, out_of_memory_at_every_allocation)
{
    int64_t w[] = {-1, 2};
    kvidx_fold_shape_t shape = {w, 2, 3, 1};
    uint8_t st[6] = {1, 1, 3, 3, 3, 3};
    kvidx_prefetch_req_t req = {6, st, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, &shape};
    int saw_success = 0;
    for (int k = 0; k < 16 && !saw_success; k++) {
        countdown_t cd = {0, k};
        kvidx_allocator_t a = {cd_malloc, cd_realloc, cd_free, &cd};
        kvidx_set_allocator(&a);
        kvidx_prefetch_plan_t plan;
        kvidx_prefetch_result_t res;
        int err = kvidx_prefetch_plan(&req, &plan);
        if (err == 0) {
            err = kvidx_prefetch_trim(&plan, NULL, &res);
            if (err == 0) {
                saw_success = 1;
                cr_expect_eq(res.n_retained, 5, "group 1 keeps its last 2 chunks");
                kvidx_prefetch_result_free(&res);
            }
            kvidx_prefetch_plan_free(&plan);
        }
        kvidx_set_allocator(NULL);
        if (!saw_success)
            cr_expect_eq(err, KVIDX_ENOMEM, "allocation %d", k);
    }
    cr_expect(saw_success);
}
