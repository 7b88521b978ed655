/*
 * The B+tree and the hash table at sizes the model-based tests never reach:
 * tens of thousands of keys of one namespace, stored in random, descending
 * and ascending order, partly deleted and stored again, with
 * kvidx_index_check after every batch. Full nodes share with a sibling
 * before they split, so random and descending stores must keep leaves
 * well above the 69% that halving splits leave; ascending stores keep them
 * full; the table never passes its 0.9 load.
 */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/index.h"

/* The index's private structures, to measure node fill. */
#include "../../../lib/index/index_int.h"

#include <stdlib.h>
#include <string.h>

enum { NKEYS = 60000, BATCH = 500 };

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static kvidx_index_t *new_index(void)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    kvidx_index_t *idx = NULL;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    return idx;
}

/* Key i of the test: 16-byte hash whose first 8 bytes are i big-endian
 * (so the order of i is the key order) and whose last 8 are noise. */
static void key_of(uint32_t i, kvidx_put_t *it)
{
    memset(&it->key, 0, sizeof(it->key));
    it->key.model = "m";
    it->key.model_len = 1;
    it->key.kv_rank = 7;
    it->key.hash_len = 16;
    for (int b = 0; b < 8; b++)
        it->key.hash[b] = (uint8_t)((uint64_t)i >> (56 - 8 * b));
    uint64_t x = (uint64_t)i * UINT64_C(0x9e3779b97f4a7c15);
    memcpy(it->key.hash + 8, &x, 8);
    it->size_bytes = 100 + i;
}

/* Stores keys order[0..n) in batches, checking the index after each. */
static void store_all(kvidx_index_t *idx, const uint32_t *order, size_t n)
{
    static kvidx_put_t items[BATCH];
    for (size_t done = 0; done < n; done += BATCH) {
        size_t m = n - done < BATCH ? n - done : BATCH;
        for (size_t i = 0; i < m; i++)
            key_of(order[done + i], &items[i]);
        cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, items, m, NULL), 0);
        cr_assert_eq(kvidx_index_check(idx), 0, "after %zu keys", done + m);
        cr_assert_leq(idx->ht_count, idx->ht_cap / 10 * 9);
    }
}

/* Average fill of the leaves and of the inner nodes above them. */
static void fill_of(const kvidx_index_t *idx, double *leaf_fill, double *inner_fill)
{
    cr_assert_eq(idx->n_ns, 1);
    const ns_t *ns = idx->ns_sorted[0];
    uint64_t leaves = 0, keys = 0;
    for (const leaf_t *l = ns->first; l; l = l->next) {
        leaves++;
        keys += l->n;
    }
    cr_assert_eq(keys, ns->nkeys);
    *leaf_fill = (double)keys / (double)(leaves * LEAF_CAP);
    /* The inner nodes right above the leaves: their children are the
     * leaves, so their number is what their fill decides. */
    cr_assert_geq(ns->height, 2u);
    uint64_t parents = 0;
    const inner_t *path[MAXH];
    uint32_t at[MAXH];
    uint32_t d = 0;
    path[0] = ns->root;
    at[0] = 0;
    for (;;) {
        if (d + 1 == ns->height) {
            parents++;
        } else if (at[d] < path[d]->n) {
            path[d + 1] = path[d]->child[at[d]++];
            at[++d] = 0;
            continue;
        }
        if (d == 0)
            break;
        d--;
    }
    *inner_fill = (double)leaves / (double)(parents * INNER_CAP);
}

static uint32_t *shuffled(size_t n)
{
    uint32_t *v = malloc(n * sizeof(*v));
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = rnd() % i;
        uint32_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
    return v;
}

Test(index_tree, random_stores_share_before_splitting)
{
    rng_state = 0x9e3779b97f4a7c15ULL;
    kvidx_index_t *idx = new_index();
    uint32_t *order = shuffled(NKEYS);
    store_all(idx, order, NKEYS);
    double lf, inf;
    fill_of(idx, &lf, &inf);
    cr_assert_geq(lf, 0.78, "leaf fill %.3f", lf);
    cr_assert_geq(inf, 0.76, "inner fill %.3f", inf);

    /* Delete every third key, then store them again in another order:
     * sharing and splitting among partly emptied leaves. */
    kvidx_del_outcome_t out;
    for (size_t i = 0; i < NKEYS; i += 3) {
        kvidx_put_t it;
        key_of(order[i], &it);
        cr_assert_eq(kvidx_index_delete(idx, &it.key, KVIDX_TIER_ALL, 0, &out), 0);
        if (i % 3000 == 0)
            cr_assert_eq(kvidx_index_check(idx), 0);
    }
    cr_assert_eq(kvidx_index_check(idx), 0);
    size_t nb = 0;
    uint32_t *back = malloc((NKEYS / 3 + 1) * sizeof(*back));
    cr_assert_not_null(back);
    for (size_t i = NKEYS; i-- > 0;)
        if (i % 3 == 0)
            back[nb++] = order[i];
    store_all(idx, back, nb);
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, NKEYS);
    for (uint32_t i = 0; i < NKEYS; i++) {
        kvidx_put_t it;
        kvidx_ref_t ref;
        key_of(i, &it);
        cr_assert_eq(kvidx_index_find(idx, &it.key, &ref), 0, "key %u", i);
    }
    free(back);
    free(order);
    kvidx_index_free(idx);
}

Test(index_tree, descending_stores_share_with_the_left_sibling)
{
    kvidx_index_t *idx = new_index();
    uint32_t *order = malloc(NKEYS * sizeof(*order));
    cr_assert_not_null(order);
    for (size_t i = 0; i < NKEYS; i++)
        order[i] = (uint32_t)(NKEYS - 1 - i);
    store_all(idx, order, NKEYS);
    double lf, inf;
    fill_of(idx, &lf, &inf);
    cr_assert_geq(lf, 0.9, "leaf fill %.3f", lf);
    cr_assert_geq(inf, 0.85, "inner fill %.3f", inf);
    free(order);
    kvidx_index_free(idx);
}

Test(index_tree, ascending_stores_keep_leaves_full)
{
    kvidx_index_t *idx = new_index();
    uint32_t *order = malloc(NKEYS * sizeof(*order));
    cr_assert_not_null(order);
    for (size_t i = 0; i < NKEYS; i++)
        order[i] = (uint32_t)i;
    store_all(idx, order, NKEYS);
    double lf, inf;
    fill_of(idx, &lf, &inf);
    cr_assert_geq(lf, 0.99, "leaf fill %.3f", lf);
    free(order);
    kvidx_index_free(idx);
}
