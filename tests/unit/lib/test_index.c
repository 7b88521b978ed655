/*
 * The index against a reference model (arrays and linear scans): random
 * stores, deletes, pins, reservations and loads under capacities small
 * enough to evict all the time, compared after every step; plus targeted
 * tests of LRU order, pin exemption, ECAPACITY/ECONFLICT atomicity,
 * interning and out-of-memory atomicity with no leak.
 */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "../../../lib/siphash_int.h"

/* The index's private structures, for the test that breaks invariants on
 * purpose and expects kvidx_index_check to notice. */
#include "../../../lib/index/index_int.h"
#include "failing_alloc.h"

#include <sodium.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic PRNG ---- */

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

static uint32_t rndn(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}

/* ---- the key universe ---- */

static const char *salts[] = {"", "a"};
static const char *models[] = {"m1", "m/2"};
static const uint32_t ranks[] = {0, 0x01000000};
static const uint8_t hlens[] = {1, 2, 8, 9, 32, 64};
#define NU (2 * 2 * 2 * 2 * 6)

static kvidx_key_t U[NU];

static void universe_init(void)
{
    int u = 0;
    for (int s = 0; s < 2; s++)
        for (int m = 0; m < 2; m++)
            for (int r = 0; r < 2; r++)
                for (uint16_t g = 0; g < 2; g++)
                    for (int h = 0; h < 6; h++) {
                        kvidx_key_t *k = &U[u++];
                        memset(k, 0, sizeof(*k));
                        k->salt = salts[s];
                        k->salt_len = (uint8_t)strlen(salts[s]);
                        k->model = models[m];
                        k->model_len = (uint16_t)strlen(models[m]);
                        k->kv_rank = ranks[r];
                        k->group = g;
                        k->hash_len = hlens[h];
                        /* Shared prefix: shorter hashes are prefixes of longer ones. */
                        for (int i = 0; i < hlens[h]; i++)
                            k->hash[i] = (uint8_t)(0xa0 + i);
                    }
}

/* ---- the reference model ---- */

typedef struct mkey {
    int present;
    uint64_t size;
    int l2;
    int l1; /* 0 none, 1 loading, 2 ready */
    uint32_t pins;
    int temp;
    uint64_t stamp; /* LRU: larger is more recent */
} mkey_t;

typedef struct model {
    mkey_t k[NU];
    uint64_t stamp, evictions, l1cap, l2cap;
} model_t;

static model_t M;

static uint64_t m_l1_bytes(void)
{
    uint64_t b = 0;
    for (int i = 0; i < NU; i++)
        if (M.k[i].present && M.k[i].l1)
            b += M.k[i].size;
    return b;
}

static uint64_t m_l2_bytes(void)
{
    uint64_t b = 0;
    for (int i = 0; i < NU; i++)
        if (M.k[i].present && M.k[i].l2)
            b += M.k[i].size;
    return b;
}

static int m_evictable(int i)
{
    return M.k[i].present && M.k[i].l1 == 2 && M.k[i].pins == 0;
}

static void m_drop_l1(int i)
{
    M.k[i].l1 = 0;
    M.k[i].pins = 0;
    M.k[i].temp = 0;
    if (!M.k[i].l2)
        M.k[i].present = 0;
}

static void m_evict_to_fit(void)
{
    while (M.l1cap && m_l1_bytes() > M.l1cap) {
        int best = -1;
        for (int i = 0; i < NU; i++)
            if (m_evictable(i) && (best < 0 || M.k[i].stamp < M.k[best].stamp))
                best = i;
        if (best < 0)
            return;
        m_drop_l1(best);
        M.evictions++;
    }
}

static int m_put(int tier, const int *ui, const uint64_t *sz, size_t n, size_t *ci)
{
    for (size_t i = 0; i < n; i++)
        if (sz[i] == 0 || sz[i] > KVIDX_SIZE_MAX) {
            *ci = i;
            return KVIDX_EINVAL;
        }
    for (size_t i = 0; i < n; i++) {
        mkey_t *k = &M.k[ui[i]];
        if (k->present && k->l1 && (k->pins || k->l1 == 1) && k->size != sz[i]) {
            *ci = i;
            return KVIDX_ECONFLICT;
        }
    }
    model_t saved = M;
    uint64_t b1 = m_l1_bytes(), b2 = m_l2_bytes();
    int eff[64], inbatch[NU] = {0};
    for (size_t i = 0; i < n; i++) {
        eff[i] = 1;
        for (size_t j = i + 1; j < n; j++)
            if (ui[j] == ui[i])
                eff[i] = 0;
        inbatch[ui[i]] = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!eff[i])
            continue;
        mkey_t *k = &M.k[ui[i]];
        if (!k->present) {
            memset(k, 0, sizeof(*k));
            k->present = 1;
        }
        k->size = sz[i];
        if (tier == KVIDX_TIER_L2)
            k->l2 = 1;
        else if (!k->l1)
            k->l1 = 2;
        else
            k->temp = 0; /* a store into L1 makes a temporary copy permanent */
    }
    uint64_t a1 = m_l1_bytes(), a2 = m_l2_bytes();
    if (M.l2cap && a2 > b2 && a2 > M.l2cap) {
        M = saved;
        return KVIDX_ECAPACITY;
    }
    if (M.l1cap && a1 > b1 && a1 > M.l1cap) {
        uint64_t freeable = 0;
        for (int i = 0; i < NU; i++)
            if (m_evictable(i) && !inbatch[i])
                freeable += M.k[i].size;
        if (a1 - freeable > M.l1cap) {
            M = saved;
            return KVIDX_ECAPACITY;
        }
    }
    if (tier == KVIDX_TIER_L1)
        for (size_t i = n; i-- > 0;)
            if (eff[i] && m_evictable(ui[i]))
                M.k[ui[i]].stamp = ++M.stamp;
    m_evict_to_fit();
    return 0;
}

static kvidx_del_outcome_t m_delete(int u, int tier, int force)
{
    mkey_t *k = &M.k[u];
    if (!k->present)
        return KVIDX_DEL_NOT_FOUND;
    int deleted = 0, skipped = 0;
    if ((tier & KVIDX_TIER_L1) && k->l1) {
        if (!force && (k->pins || k->l1 == 1)) {
            skipped = 1;
        } else {
            k->l1 = 0;
            k->pins = 0;
            k->temp = 0;
            deleted = 1;
        }
    }
    if ((tier & KVIDX_TIER_L2) && k->l2) {
        k->l2 = 0;
        deleted = 1;
    }
    if (!k->l1 && !k->l2)
        k->present = 0;
    return skipped ? KVIDX_DEL_SKIPPED_PINNED : deleted ? KVIDX_DEL_DELETED : KVIDX_DEL_NOT_FOUND;
}

static int m_reserve(int u, int temp)
{
    mkey_t *k = &M.k[u];
    if (!k->present)
        return KVIDX_ENOTFOUND;
    if (k->l1)
        return KVIDX_ECONFLICT;
    uint64_t b = m_l1_bytes() + k->size;
    if (M.l1cap && b > M.l1cap) {
        uint64_t freeable = 0;
        for (int i = 0; i < NU; i++)
            if (m_evictable(i))
                freeable += M.k[i].size;
        if (b - freeable > M.l1cap)
            return KVIDX_ECAPACITY;
    }
    k->l1 = 1;
    k->pins = 0;
    k->temp = temp;
    m_evict_to_fit();
    return 0;
}

/* ---- comparing ---- */

static void compare(const kvidx_index_t *idx, int step)
{
    uint64_t keys = 0, l1k = 0, l2k = 0, loading = 0, pinned = 0, pins = 0, evb = 0;
    for (int i = 0; i < NU; i++) {
        const mkey_t *k = &M.k[i];
        kvidx_ref_t ref;
        int rc = kvidx_index_find(idx, &U[i], &ref);
        cr_assert_eq(rc, k->present ? 0 : KVIDX_ENOTFOUND, "step %d key %d", step, i);
        if (!k->present)
            continue;
        keys++;
        kvidx_entry_info_t info;
        cr_assert_eq(kvidx_index_info(idx, ref, &info), 0);
        cr_assert_eq(info.size_bytes, k->size, "step %d key %d", step, i);
        cr_assert_eq(info.l2, k->l2, "step %d key %d", step, i);
        cr_assert_eq((int)info.l1_state, k->l1, "step %d key %d", step, i);
        cr_assert_eq(info.pins, k->pins, "step %d key %d", step, i);
        if (k->l1) {
            cr_assert_eq(info.temporary, k->temp, "step %d key %d", step, i);
            cr_assert_neq(info.generation, 0);
        }
        kvidx_key_t back;
        cr_assert_eq(kvidx_index_key(idx, ref, &back), 0);
        cr_assert(kvidx_key_equal(&back, &U[i]));
        l1k += k->l1 != 0;
        l2k += k->l2;
        loading += k->l1 == 1;
        pinned += k->pins > 0;
        pins += k->pins;
        if (m_evictable(i))
            evb += k->size;
    }
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, keys, "step %d", step);
    cr_assert_eq(st.l1_keys, l1k, "step %d", step);
    cr_assert_eq(st.l2_keys, l2k, "step %d", step);
    cr_assert_eq(st.l1_bytes, m_l1_bytes(), "step %d", step);
    cr_assert_eq(st.l2_bytes, m_l2_bytes(), "step %d", step);
    cr_assert_eq(st.l1_loading, loading, "step %d", step);
    cr_assert_eq(st.l1_pinned, pinned, "step %d", step);
    cr_assert_eq(st.l1_pins, pins, "step %d", step);
    cr_assert_eq(st.l1_evictable_bytes, evb, "step %d", step);
    cr_assert_eq(st.evictions, M.evictions, "step %d", step);
}

static kvidx_index_t *new_index(uint64_t l1cap, uint64_t l2cap)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.l1_capacity_bytes = l1cap;
    o.l2_capacity_bytes = l2cap;
    o.has_seed = 1;
    memset(o.seed, 7, sizeof(o.seed));
    kvidx_index_t *idx = NULL;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    return idx;
}

static void model_reset(uint64_t l1cap, uint64_t l2cap)
{
    memset(&M, 0, sizeof(M));
    M.l1cap = l1cap;
    M.l2cap = l2cap;
}

/* One random step applied to both; returns nothing, asserts equal results. */
static void random_step(kvidx_index_t *idx, int step)
{
    uint32_t op = rndn(100);
    if (op < 35) {
        size_t n = 1 + rndn(8);
        int ui[64];
        uint64_t sz[64];
        kvidx_put_t items[64];
        for (size_t i = 0; i < n; i++) {
            ui[i] = (int)rndn(NU);
            /* Sizes repeat often so re-puts of pinned keys sometimes agree. */
            sz[i] = rndn(50) == 0 ? 0 : 1 + rndn(4) * 40 + (rndn(3) == 0 ? rndn(40) : 0);
            items[i].key = U[ui[i]];
            items[i].size_bytes = sz[i];
        }
        int tier = rndn(2) ? KVIDX_TIER_L1 : KVIDX_TIER_L2;
        size_t ci_m = 999, ci_i = 999;
        int rm = m_put(tier, ui, sz, n, &ci_m);
        int ri = kvidx_index_put_batch(idx, (kvidx_tier_t)tier, items, n, &ci_i);
        cr_assert_eq(ri, rm, "step %d put", step);
        if (rm == KVIDX_EINVAL || rm == KVIDX_ECONFLICT)
            cr_assert_eq(ci_i, ci_m, "step %d", step);
    } else if (op < 50) {
        int u = (int)rndn(NU);
        int tier = 1 + (int)rndn(3);
        int force = rndn(4) == 0;
        kvidx_del_outcome_t om = m_delete(u, tier, force), oi;
        cr_assert_eq(kvidx_index_delete(idx, &U[u], (kvidx_tier_t)tier, force, &oi), 0);
        cr_assert_eq(oi, om, "step %d delete", step);
    } else {
        int u = (int)rndn(NU);
        mkey_t *k = &M.k[u];
        kvidx_ref_t ref = KVIDX_REF_NONE;
        int found = kvidx_index_find(idx, &U[u], &ref) == 0;
        cr_assert_eq(found, k->present);
        if (!found)
            return;
        if (op < 62) {
            uint32_t n = 1 + rndn(3);
            int rm = k->l1 ? 0 : KVIDX_ENOTFOUND;
            if (!rm)
                k->pins += n;
            cr_assert_eq(kvidx_index_pin(idx, ref, 0, n), rm, "step %d pin", step);
        } else if (op < 74) {
            uint32_t n = 1 + rndn(2);
            int rm = !k->l1 ? KVIDX_ENOTFOUND : n > k->pins ? KVIDX_EINVAL : 0;
            if (!rm) {
                k->pins -= n;
                if (!k->pins) {
                    if (k->temp)
                        m_drop_l1(u);
                    else if (k->l1 == 2)
                        k->stamp = ++M.stamp;
                }
            }
            cr_assert_eq(kvidx_index_unpin(idx, ref, 0, n), rm, "step %d unpin", step);
        } else if (op < 84) {
            int temp = (int)rndn(2);
            uint64_t gen = 0;
            int rm = m_reserve(u, temp);
            cr_assert_eq(kvidx_index_l1_reserve(idx, ref, temp, &gen), rm, "step %d reserve", step);
        } else if (op < 93) {
            int ok = rndn(3) != 0;
            int rm = !k->l1 ? KVIDX_ENOTFOUND : k->l1 != 1 ? KVIDX_EINVAL : 0;
            if (!rm) {
                if (ok) {
                    k->l1 = 2;
                    if (!k->pins)
                        k->stamp = ++M.stamp;
                } else {
                    m_drop_l1(u);
                }
            }
            cr_assert_eq(kvidx_index_l1_load_done(idx, ref, 0, ok), rm, "step %d load", step);
        } else if (op < 97) {
            int rm = k->l1 ? 0 : KVIDX_ENOTFOUND;
            if (m_evictable(u))
                k->stamp = ++M.stamp;
            cr_assert_eq(kvidx_index_touch(idx, ref), rm);
        } else {
            int t = (int)rndn(2);
            int rm = k->l1 ? 0 : KVIDX_ENOTFOUND;
            if (!rm)
                k->temp = t;
            cr_assert_eq(kvidx_index_set_temporary(idx, ref, t), rm);
        }
    }
}

Test(index, random_against_model)
{
    universe_init();
    static const uint64_t caps[][2] = {{0, 0}, {600, 0}, {300, 2000}, {1000, 1500}};
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        rng_state = 0x9e3779b97f4a7c15ULL + c;
        model_reset(caps[c][0], caps[c][1]);
        kvidx_index_t *idx = new_index(caps[c][0], caps[c][1]);
        for (int step = 0; step < 20000; step++) {
            if (step % 2500 == 2499) {
                /* Shrink and grow L1 now and then. */
                uint64_t l1 = caps[c][0] ? 200 + rndn(800) : 0;
                M.l1cap = l1;
                m_evict_to_fit();
                cr_assert_eq(kvidx_index_set_capacity(idx, l1, caps[c][1]), 0);
                cr_assert_eq(kvidx_index_check(idx), 0, "step %d capacity", step);
            }
            random_step(idx, step);
            cr_assert_eq(kvidx_index_check(idx), 0, "step %d", step);
            compare(idx, step);
        }
        kvidx_index_free(idx);
    }
}

/* ---- targeted tests ---- */

static kvidx_key_t mk(const char *model, const char *salt, uint32_t rank, uint16_t group,
                      uint32_t h)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)strlen(model);
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.kv_rank = rank;
    k.group = group;
    k.hash_len = 32;
    for (int i = 0; i < 4; i++)
        k.hash[i] = (uint8_t)(h >> (24 - 8 * i));
    return k;
}

static int has(kvidx_index_t *idx, const kvidx_key_t *k, int tier)
{
    kvidx_ref_t ref;
    if (kvidx_index_find(idx, k, &ref))
        return 0;
    kvidx_entry_info_t info;
    kvidx_index_info(idx, ref, &info);
    return tier == KVIDX_TIER_L1 ? info.l1_state != KVIDX_L1_NONE : info.l2;
}

typedef struct evlog {
    uint32_t h[64];
    int n;
    int forgotten;
} evlog_t;

static void on_evict(void *ctx, const kvidx_key_t *key, uint64_t size, int forgotten)
{
    evlog_t *l = ctx;
    (void)size;
    l->h[l->n++] = (uint32_t)key->hash[0] << 24 | (uint32_t)key->hash[1] << 16 |
                   (uint32_t)key->hash[2] << 8 | key->hash[3];
    l->forgotten += forgotten;
}

Test(index, lru_reverse_batch_order_and_pins)
{
    kvidx_index_t *idx = new_index(500, 0);
    evlog_t log = {0};
    kvidx_index_set_evict_cb(idx, on_evict, &log);
    kvidx_put_t items[5];
    for (int i = 0; i < 5; i++) {
        items[i].key = mk("m", "", 0, 0, (uint32_t)i);
        items[i].size_bytes = 100;
    }
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, items, 5, NULL), 0);
    /* Pin key 4 (the least recent). */
    kvidx_ref_t r4;
    cr_assert_eq(kvidx_index_find(idx, &items[4].key, &r4), 0);
    cr_assert_eq(kvidx_index_pin(idx, r4, 0, 1), 0);
    /* Two more keys need 200 bytes: 3 then 2 go (tails first), 4 is pinned. */
    kvidx_put_t more[2];
    for (int i = 0; i < 2; i++) {
        more[i].key = mk("m", "", 0, 0, (uint32_t)(10 + i));
        more[i].size_bytes = 100;
    }
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, more, 2, NULL), 0);
    cr_assert_eq(log.n, 2);
    cr_assert_eq(log.h[0], 3);
    cr_assert_eq(log.h[1], 2);
    cr_assert_eq(log.forgotten, 2);
    cr_assert(has(idx, &items[4].key, KVIDX_TIER_L1));
    cr_assert(!has(idx, &items[3].key, KVIDX_TIER_L1));
    /* Touching 0 makes 1 the next victim. */
    kvidx_ref_t r0;
    cr_assert_eq(kvidx_index_find(idx, &items[0].key, &r0), 0);
    cr_assert_eq(kvidx_index_touch(idx, r0), 0);
    kvidx_put_t one = {mk("m", "", 0, 0, 20), 100};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &one, 1, NULL), 0);
    /* Most recent first: 0 10 11 1 (the batch [10, 11] made 11 the older). */
    cr_assert_eq(log.n, 3);
    cr_assert_eq(log.h[2], 1);
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.evictions, 3);
    cr_assert_eq(st.l1_bytes, 500);
    kvidx_index_free(idx);
}

Test(index, capacity_error_changes_nothing)
{
    kvidx_index_t *idx = new_index(300, 1000);
    kvidx_put_t a[3];
    for (int i = 0; i < 3; i++) {
        a[i].key = mk("m", "s", 1, 0, (uint32_t)i);
        a[i].size_bytes = 100;
    }
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, a, 3, NULL), 0);
    kvidx_ref_t r;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kvidx_index_find(idx, &a[i].key, &r), 0);
        cr_assert_eq(kvidx_index_pin(idx, r, 0, 1), 0);
    }
    kvidx_index_stats_t before, after;
    kvidx_index_stats(idx, &before);
    kvidx_put_t b[2] = {{mk("m", "s", 1, 0, 50), 10}, {mk("m", "s", 1, 0, 51), 10}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, b, 2, NULL), KVIDX_ECAPACITY);
    kvidx_index_stats(idx, &after);
    cr_assert_eq(memcmp(&before, &after, sizeof(before)), 0);
    cr_assert_eq(kvidx_index_find(idx, &b[0].key, &r), KVIDX_ENOTFOUND);
    /* One item bigger than L1 itself. */
    kvidx_put_t big = {mk("m", "s", 1, 0, 60), 301};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &big, 1, NULL), KVIDX_ECAPACITY);
    /* L2 is never evicted: 1000 bytes, then one more byte fails. */
    kvidx_put_t l2[2] = {{mk("m", "s", 2, 0, 1), 600}, {mk("m", "s", 2, 0, 2), 400}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, l2, 2, NULL), 0);
    kvidx_put_t l2b = {mk("m", "s", 2, 0, 3), 1};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &l2b, 1, NULL), KVIDX_ECAPACITY);
    /* Shrinking a key's size frees L2 room within the same batch. */
    kvidx_put_t l2c[2] = {{mk("m", "s", 2, 0, 1), 500}, {mk("m", "s", 2, 0, 3), 100}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, l2c, 2, NULL), 0);
    kvidx_index_free(idx);
}

Test(index, conflict_on_pinned_resize)
{
    kvidx_index_t *idx = new_index(0, 0);
    kvidx_put_t a[2] = {{mk("m", "", 0, 0, 1), 100}, {mk("m", "", 0, 0, 2), 100}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, a, 2, NULL), 0);
    kvidx_ref_t r;
    cr_assert_eq(kvidx_index_find(idx, &a[1].key, &r), 0);
    cr_assert_eq(kvidx_index_pin(idx, r, 0, 2), 0);
    kvidx_put_t b[3] = {
        {mk("m", "", 0, 0, 3), 5}, {mk("m", "", 0, 0, 1), 7}, {mk("m", "", 0, 0, 2), 101}};
    size_t ci = 0;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, b, 3, &ci), KVIDX_ECONFLICT);
    cr_assert_eq(ci, 2);
    cr_assert_eq(kvidx_index_find(idx, &b[0].key, &r), KVIDX_ENOTFOUND);
    /* Same size is fine and adds the tier. */
    b[2].size_bytes = 100;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, b, 3, &ci), 0);
    cr_assert(has(idx, &b[2].key, KVIDX_TIER_L2));
    kvidx_index_free(idx);
}

Test(index, delete_pinned_and_force_generation)
{
    kvidx_index_t *idx = new_index(0, 0);
    kvidx_put_t a = {mk("m", "", 0, 0, 1), 100};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &a, 1, NULL), 0);
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &a, 1, NULL), 0);
    kvidx_ref_t r;
    kvidx_entry_info_t info;
    cr_assert_eq(kvidx_index_find(idx, &a.key, &r), 0);
    cr_assert_eq(kvidx_index_info(idx, r, &info), 0);
    uint64_t gen = info.generation;
    cr_assert_eq(kvidx_index_pin(idx, r, gen, 1), 0);
    kvidx_del_outcome_t o;
    cr_assert_eq(kvidx_index_delete(idx, &a.key, KVIDX_TIER_ALL, 0, &o), 0);
    cr_assert_eq(o, KVIDX_DEL_SKIPPED_PINNED);
    cr_assert(!has(idx, &a.key, KVIDX_TIER_L2)); /* L2 went: delete what you can */
    cr_assert(has(idx, &a.key, KVIDX_TIER_L1));
    cr_assert_eq(kvidx_index_delete(idx, &a.key, KVIDX_TIER_L1, 1, &o), 0);
    cr_assert_eq(o, KVIDX_DEL_DELETED);
    cr_assert_eq(kvidx_index_find(idx, &a.key, &r), KVIDX_ENOTFOUND);
    /* The ref may now name another key; the generation tells. */
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &a, 1, NULL), 0);
    kvidx_ref_t r2;
    cr_assert_eq(kvidx_index_find(idx, &a.key, &r2), 0);
    cr_assert_eq(kvidx_index_unpin(idx, r2, gen, 1), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_index_delete(idx, &a.key, KVIDX_TIER_L2, 0, &o), 0);
    cr_assert_eq(o, KVIDX_DEL_NOT_FOUND);
    cr_assert_eq(kvidx_index_delete(idx, &a.key, KVIDX_TIER_ALL, 0, &o), 0);
    cr_assert_eq(o, KVIDX_DEL_DELETED);
    cr_assert_eq(kvidx_index_info(idx, r2, &info), KVIDX_ENOTFOUND);
    kvidx_index_free(idx);
}

Test(index, temporary_copy_dropped_on_last_unpin)
{
    kvidx_index_t *idx = new_index(1000, 0);
    kvidx_put_t a = {mk("m", "", 0, 0, 1), 100};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &a, 1, NULL), 0);
    kvidx_ref_t r;
    uint64_t gen;
    cr_assert_eq(kvidx_index_find(idx, &a.key, &r), 0);
    cr_assert_eq(kvidx_index_l1_reserve(idx, r, 1, &gen), 0);
    cr_assert_eq(kvidx_index_l1_reserve(idx, r, 1, &gen), KVIDX_ECONFLICT);
    cr_assert_eq(kvidx_index_pin(idx, r, gen, 2), 0);
    cr_assert_eq(kvidx_index_l1_load_done(idx, r, gen, 1), 0);
    cr_assert_eq(kvidx_index_l1_load_done(idx, r, gen, 1), KVIDX_EINVAL);
    cr_assert_eq(kvidx_index_unpin(idx, r, gen, 1), 0);
    cr_assert(has(idx, &a.key, KVIDX_TIER_L1));
    cr_assert_eq(kvidx_index_unpin(idx, r, gen, 2), KVIDX_EINVAL);
    cr_assert_eq(kvidx_index_unpin(idx, r, gen, 1), 0);
    cr_assert(!has(idx, &a.key, KVIDX_TIER_L1));
    cr_assert(has(idx, &a.key, KVIDX_TIER_L2));
    kvidx_index_free(idx);
}

Test(index, l1_store_makes_a_temporary_copy_permanent)
{
    kvidx_index_t *idx = new_index(1000, 0);
    kvidx_put_t a = {mk("m", "", 0, 0, 1), 100};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &a, 1, NULL), 0);
    kvidx_ref_t r;
    uint64_t gen;
    cr_assert_eq(kvidx_index_find(idx, &a.key, &r), 0);
    cr_assert_eq(kvidx_index_l1_reserve(idx, r, 1, &gen), 0);
    cr_assert_eq(kvidx_index_pin(idx, r, gen, 1), 0);
    cr_assert_eq(kvidx_index_l1_load_done(idx, r, gen, 1), 0);
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &a, 1, NULL), 0);
    kvidx_entry_info_t info;
    cr_assert_eq(kvidx_index_info(idx, r, &info), 0);
    cr_assert_eq(info.temporary, 0, "stored into L1: the caller's copy now");
    cr_assert_eq(kvidx_index_unpin(idx, r, gen, 1), 0);
    cr_assert(has(idx, &a.key, KVIDX_TIER_L1), "the last unpin must not drop it");
    kvidx_index_free(idx);
}

Test(index, interned_names_are_freed)
{
    kvidx_index_t *idx = new_index(0, 0);
    kvidx_put_t a[4] = {{mk("llama", "alice", 0, 0, 1), 1},
                        {mk("llama", "", 0, 0, 1), 1},
                        {mk("alice", "alice", 0, 0, 1), 1},
                        {mk("llama", "alice", 0, 0, 2), 1}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, a, 4, NULL), 0);
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.names, 3); /* "llama", "alice", "" */
    cr_assert_eq(st.namespaces, 3);
    kvidx_del_outcome_t o;
    kvidx_index_delete(idx, &a[1].key, KVIDX_TIER_ALL, 0, &o);
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.names, 2);
    cr_assert_eq(st.namespaces, 2);
    kvidx_index_delete(idx, &a[0].key, KVIDX_TIER_ALL, 0, &o);
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.namespaces, 2);
    kvidx_index_delete(idx, &a[3].key, KVIDX_TIER_ALL, 0, &o);
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.names, 1);
    cr_assert_eq(st.namespaces, 1);
    kvidx_index_delete(idx, &a[2].key, KVIDX_TIER_ALL, 0, &o);
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.names, 0);
    cr_assert_eq(st.namespaces, 0);
    cr_assert_eq(st.keys, 0);
    kvidx_index_free(idx);
}

Test(index, duplicates_last_size_wins_and_many_keys)
{
    kvidx_index_t *idx = new_index(0, 0);
    kvidx_put_t d[3] = {
        {mk("m", "", 0, 0, 1), 5}, {mk("m", "", 0, 0, 2), 6}, {mk("m", "", 0, 0, 1), 9}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, d, 3, NULL), 0);
    kvidx_ref_t r;
    kvidx_entry_info_t info;
    cr_assert_eq(kvidx_index_find(idx, &d[0].key, &r), 0);
    kvidx_index_info(idx, r, &info);
    cr_assert_eq(info.size_bytes, 9);
    /* Enough keys for a tree of several levels; then delete them all. */
    enum { N = 200000, B = 1000 };
    static kvidx_put_t items[B];
    for (int base = 0; base < N; base += B) {
        for (int i = 0; i < B; i++) {
            uint32_t x = (uint32_t)(base + i) * 2654435761u;
            items[i].key = mk("big", "", x % 3, 0, x);
            items[i].size_bytes = KVIDX_SIZE_MAX;
        }
        cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, items, B, NULL), 0);
    }
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, N + 2);
    cr_assert_eq(st.l2_bytes, (uint64_t)N * KVIDX_SIZE_MAX + 15);
    for (int i = 0; i < N; i++) {
        uint32_t x = (uint32_t)i * 2654435761u;
        kvidx_key_t k = mk("big", "", x % 3, 0, x);
        kvidx_del_outcome_t o;
        cr_assert_eq(kvidx_index_delete(idx, &k, KVIDX_TIER_L2, 0, &o), 0);
        cr_assert_eq(o, KVIDX_DEL_DELETED);
        if (i % 20000 == 19999)
            cr_assert_eq(kvidx_index_check(idx), 0, "after %d deletes", i + 1);
    }
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, 2);
    cr_assert_eq(st.namespaces, 1);
    kvidx_index_free(idx);
}

static int load_cmp(const void *a, const void *b)
{
    return kvidx_key_cmp(&((const kvidx_load_t *)a)->key, &((const kvidx_load_t *)b)->key);
}

/* Bulk loads (a restore) in key order and out of it, with keys already
 * present or given twice (the load stops there, keeping what it loaded),
 * under an L1 capacity that evicts, with deletes in between. */
Test(index, bulk_loads_keep_the_invariants)
{
    rng_state = 4242;
    kvidx_index_t *idx = new_index(3000, 0);
    static const char *ms[] = {"m1", "m2", "a/b"};
    static const char *ss[] = {"", "s"};
    static kvidx_load_t items[400];
    int loaded = 0, conflicts = 0;
    for (int round = 0; round < 300; round++) {
        size_t n = 1 + rndn(400);
        for (size_t i = 0; i < n; i++) {
            items[i].key = mk(ms[rndn(3)], ss[rndn(2)], rndn(3), (uint16_t)rndn(2), rndn(5000));
            items[i].key.hash_len = (uint8_t)(1 + rndn(64));
            items[i].size_bytes = 1 + rndn(50);
            items[i].tiers = 1 + rndn(3);
        }
        if (rndn(2))
            qsort(items, n, sizeof(*items), load_cmp);
        size_t bad = 999;
        int rc = kvidx_index_load(idx, items, n, &bad);
        cr_assert(rc == 0 || (rc == KVIDX_ECONFLICT && bad < n), "round %d rc %d", round, rc);
        loaded += rc == 0;
        conflicts += rc == KVIDX_ECONFLICT;
        cr_assert_eq(kvidx_index_check(idx), 0, "round %d", round);
        /* Deletes, so that later loads reuse records and insert mid-tree. */
        for (int d = 0; d < 20; d++) {
            kvidx_del_outcome_t o;
            cr_assert_eq(kvidx_index_delete(idx, &items[rndn((uint32_t)n)].key,
                                            (kvidx_tier_t)(1 + rndn(3)), 0, &o),
                         0);
        }
        cr_assert_eq(kvidx_index_check(idx), 0, "round %d deletes", round);
    }
    cr_assert_gt(loaded, 10);
    cr_assert_gt(conflicts, 10);
    kvidx_index_free(idx);
}

/* Breaks one invariant of a valid index (stmt), expects the check to fail,
 * mends it (undo) and expects the check to pass again. */
#define BREAK_AND_MEND(stmt, undo)                                                                 \
    do {                                                                                           \
        stmt;                                                                                      \
        cr_assert_eq(kvidx_index_check(idx), KVIDX_EINTERNAL, "not seen: %s", #stmt);              \
        undo;                                                                                      \
        cr_assert_eq(kvidx_index_check(idx), 0, "not mended: %s", #undo);                          \
    } while (0)

Test(index, check_sees_each_broken_invariant)
{
    kvidx_index_t *idx = new_index(0, 0);
    static kvidx_put_t a[1000];
    for (int i = 0; i < 1000; i++) {
        /* Four small namespaces, and one big enough for inner nodes. */
        const char *m = i < 300 ? (i % 2 ? "m1" : "m2") : "big";
        a[i].key = mk(m, i < 300 && i % 3 == 0 ? "s" : "", 0, 0, (uint32_t)i * 2654435761u);
        a[i].size_bytes = 10 + (uint64_t)i;
    }
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, a, 150, NULL), 0);
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, a + 150, 850, NULL), 0);
    /* Free L1 slots: three L1 copies deleted. */
    for (int i = 0; i < 3; i++) {
        kvidx_del_outcome_t o;
        cr_assert_eq(kvidx_index_delete(idx, &a[i].key, KVIDX_TIER_L1, 0, &o), 0);
        cr_assert_eq(o, KVIDX_DEL_DELETED);
    }
    cr_assert_eq(kvidx_index_check(idx), 0);
    cr_assert_geq(idx->l1_nfree, 2);

    /* Counters. */
    BREAK_AND_MEND(idx->c.lru_bytes++, idx->c.lru_bytes--);
    BREAK_AND_MEND(idx->c.l2_bytes--, idx->c.l2_bytes++);
    BREAK_AND_MEND(idx->c.keys++, idx->c.keys--);
    BREAK_AND_MEND(idx->slabs[hash_class(32)].nfree++, idx->slabs[hash_class(32)].nfree--);

    /* Order: namespaces, keys in a leaf, separators in an inner node. */
    ns_t **nss = idx->ns_sorted, *ns0 = nss[0];
    BREAK_AND_MEND((nss[0] = nss[1], nss[1] = ns0), (nss[1] = nss[0], nss[0] = ns0));
    leaf_t *leaf = NULL;
    for (size_t i = 0; i < idx->n_ns; i++)
        if (!idx->ns_sorted[i]->height)
            leaf = idx->ns_sorted[i]->root;
    cr_assert(leaf && leaf->n >= 2);
    uint32_t r0 = leaf->refs[0];
    BREAK_AND_MEND((leaf->refs[0] = leaf->refs[1], leaf->refs[1] = r0),
                   (leaf->refs[1] = leaf->refs[0], leaf->refs[0] = r0));
    ns_t *big = NULL;
    for (size_t i = 0; i < idx->n_ns; i++)
        if (idx->ns_sorted[i]->height)
            big = idx->ns_sorted[i];
    cr_assert_not_null(big);
    inner_t *root = big->root;
    cr_assert_geq(root->n, 3);
    skey_t s0 = root->sep[0];
    BREAK_AND_MEND((root->sep[0] = root->sep[1], root->sep[1] = s0),
                   (root->sep[1] = root->sep[0], root->sep[0] = s0));

    /* Interned names. */
    BREAK_AND_MEND(idx->strs[0]->refs++, idx->strs[0]->refs--);

    /* The table: a tag byte. */
    size_t j = 0;
    while (idx->ht[j] == KVIDX_REF_NONE)
        j++;
    BREAK_AND_MEND(idx->ht_tag[j] ^= 1, idx->ht_tag[j] ^= 1);

    /* Tiers: an L2-only key without its L2 copy (counters kept in step). */
    kvidx_ref_t ref;
    cr_assert_eq(kvidx_index_find(idx, &a[500].key, &ref), 0);
    uint8_t *r = rec_at(idx, ref);
    uint64_t size = rec_size(r);
    BREAK_AND_MEND((rec_set_l2(r, 0), idx->c.l2_keys--, idx->c.l2_bytes -= size),
                   (rec_set_l2(r, 1), idx->c.l2_keys++, idx->c.l2_bytes += size));

    /* The LRU: a ready copy pinned but still in the LRU (counters kept). */
    cr_assert_eq(kvidx_index_find(idx, &a[100].key, &ref), 0);
    l1m_t *e = &idx->l1[rec_l1(rec_at(idx, ref))];
    cr_assert(e->in_lru);
    BREAK_AND_MEND((e->pins = 1, idx->c.l1_pinned++, idx->c.l1_pins++),
                   (e->pins = 0, idx->c.l1_pinned--, idx->c.l1_pins--));

    /* The L1 free list: its head linked to itself, so a slot would be
     * handed out twice (every slot the count walks is still free). */
    uint32_t head = idx->l1_free, next = idx->l1[head].next;
    BREAK_AND_MEND(idx->l1[head].next = head, idx->l1[head].next = next);
    kvidx_index_free(idx);
}

Test(index, invalid_arguments)
{
    kvidx_index_t *idx = new_index(0, 0);
    kvidx_put_t a[2] = {{mk("m", "", 0, 0, 1), 5}, {mk("m", "", 0, 0, 2), KVIDX_SIZE_MAX + 1}};
    size_t ci = 9;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, a, 2, &ci), KVIDX_EINVAL);
    cr_assert_eq(ci, 1);
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_ALL, a, 1, &ci), KVIDX_EINVAL);
    a[0].key.hash_len = 0;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, a, 1, &ci), KVIDX_EINVAL);
    cr_assert_eq(kvidx_index_pin(idx, 12345, 0, 1), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_index_info(idx, KVIDX_REF_NONE, &(kvidx_entry_info_t){0}), KVIDX_ENOTFOUND);
    kvidx_index_free(idx);
}

/* ---- out of memory ---- */

/* A fingerprint of everything observable: stats and every key's info. */
static uint64_t fingerprint(kvidx_index_t *idx, const kvidx_put_t *keys, size_t n)
{
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    uint64_t h = fingerprint_bytes(FINGERPRINT_SEED, &st, sizeof(st));
    for (size_t i = 0; i < n; i++) {
        kvidx_ref_t r;
        kvidx_entry_info_t info;
        memset(&info, 0, sizeof(info));
        if (kvidx_index_find(idx, &keys[i].key, &r) == 0)
            kvidx_index_info(idx, r, &info);
        else
            info.size_bytes = 12345;
        h = fingerprint_bytes(h, &info, sizeof(info));
    }
    return h;
}

Test(index, out_of_memory_is_atomic_and_leak_free)
{
    kvidx_allocator_t a = {failing_malloc, failing_realloc, failing_free, NULL};
    kvidx_set_allocator(&a);
    enum { BASE = 3000, NEW = 1500 };
    static kvidx_put_t base[BASE], batch[NEW], all[BASE + NEW];
    static const char *ms[] = {"m0", "m1", "m2", "m3"};
    for (int i = 0; i < BASE; i++) {
        base[i].key = mk(ms[i % 2], "", (uint32_t)i % 5, 0, (uint32_t)i * 7919u);
        base[i].size_bytes = 10;
        all[i] = base[i];
    }
    for (int i = 0; i < NEW; i++) {
        /* New namespaces, new keys, re-puts of old keys, varied hash lengths. */
        batch[i].key = i % 3 == 0 ? base[i].key
                                  : mk(ms[i % 4], i % 5 ? "" : "s", (uint32_t)i % 5, 0,
                                       (uint32_t)i * 104729u + 1);
        batch[i].key.hash_len = (uint8_t)(i % 3 == 0 ? 32 : 1 + i % 64);
        batch[i].size_bytes = 10;
        all[BASE + i] = batch[i];
    }
    int succeeded = 0, failures = 0;
    for (long n = 1; n < 400 && !succeeded; n++) {
        failing.count = 0;
        failing.fail_at = 0;
        kvidx_index_t *idx = new_index(38000, 0);
        cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, base, BASE, NULL), 0);
        for (int i = 0; i < 50; i++) {
            kvidx_ref_t r;
            cr_assert_eq(kvidx_index_find(idx, &base[i * 7].key, &r), 0);
            cr_assert_eq(kvidx_index_pin(idx, r, 0, 1), 0);
        }
        cr_assert_eq(kvidx_index_check(idx), 0);
        uint64_t fp = fingerprint(idx, all, BASE + NEW);
        failing.fail_at = failing.count + n;
        int rc = kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, NEW, NULL);
        failing.fail_at = 0;
        cr_assert_eq(kvidx_index_check(idx), 0, "n=%ld", n);
        if (rc == 0) {
            succeeded = 1;
        } else {
            cr_assert_eq(rc, KVIDX_ENOMEM, "n=%ld rc=%d", n, rc);
            failures++;
            cr_assert_eq(fingerprint(idx, all, BASE + NEW), fp, "n=%ld", n);
            /* The index still works after the failure. */
            cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, NEW, NULL), 0);
            cr_assert_eq(kvidx_index_check(idx), 0, "n=%ld", n);
        }
        kvidx_index_free(idx);
        cr_assert_eq(failing.live, 0, "leak at n=%ld", n);
    }
    cr_assert(succeeded);
    /* Scratch, table, slabs, L1 slots, names, namespaces and tree nodes. */
    cr_assert_geq(failures, 10, "only %d injected failures", failures);
    /* Reserve and new under failure too. */
    for (long n = 1; n < 4; n++) {
        failing.count = 0;
        failing.fail_at = n;
        kvidx_index_t *idx = NULL;
        int rc = kvidx_index_new(NULL, &idx);
        failing.fail_at = 0;
        if (rc == 0)
            kvidx_index_free(idx);
        else
            cr_assert_eq(rc, KVIDX_ENOMEM);
        cr_assert_eq(failing.live, 0);
    }
    kvidx_set_allocator(NULL);
}

/* The table's inline SipHash is the reference algorithm: run with 2-4
 * rounds it gives libsodium's crypto_shorthash (SipHash-2-4) of the words'
 * bytes, for messages of 0..9 words under random keys; with 1-3 it differs
 * and depends on every word and the key. */
Test(siphash, matches_libsodium)
{
    uint8_t key[crypto_shorthash_KEYBYTES], out[crypto_shorthash_BYTES], b[72];
    uint64_t w[9];
    for (int round = 0; round < 200; round++) {
        randombytes_buf(key, sizeof(key));
        randombytes_buf(w, sizeof(w));
        for (size_t n = 0; n <= 9; n++) {
            for (size_t i = 0; i < 8 * n; i++)
                b[i] = (uint8_t)(w[i / 8] >> (8 * (i % 8)));
            crypto_shorthash(out, b, 8 * n, key);
            uint64_t want = 0;
            for (int i = 7; i >= 0; i--)
                want = want << 8 | out[i];
            cr_assert_eq(kvidx_siphash_words(key, w, n, 2, 4), want, "%zu words", n);
        }
    }
    memset(w, 0, sizeof(w));
    uint64_t h = kvidx_siphash_words(key, w, 5, 1, 3);
    cr_assert_neq(h, kvidx_siphash_words(key, w, 5, 2, 4));
    for (size_t i = 0; i < 5; i++) {
        w[i] ^= UINT64_C(1) << (i * 13);
        cr_assert_neq(kvidx_siphash_words(key, w, 5, 1, 3), h, "word %zu", i);
        w[i] = 0;
    }
    key[0] ^= 1;
    cr_assert_neq(kvidx_siphash_words(key, w, 5, 1, 3), h);
}
