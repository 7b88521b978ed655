/*
 * L2 copies held by sources (kvidx/index_source.h) against a reference
 * model: random source puts and deletes, resynchronisations, API stores
 * and deletes beside them, with kvidx_index_check and the model compared
 * after every step; then targeted tests: lookups and listings see source
 * copies as L2 copies, the change callback never reports a source's copy,
 * the API cannot resize or delete it, resize of a pinned copy and
 * eviction, out-of-memory atomicity, and each broken invariant is seen.
 */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/index_source.h"

/* Private structures, for the tests that break invariants on purpose. */
#include "../../../lib/index/index_int.h"
#include "failing_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

enum { NU = 48, NSRC = 3 };

static kvidx_key_t U[NU];

static void universe_init(void)
{
    static const char *models[] = {"m1", "org/m2", "m3"};
    for (int i = 0; i < NU; i++) {
        kvidx_key_t *k = &U[i];
        memset(k, 0, sizeof(*k));
        k->model = models[i % 3];
        k->model_len = (uint16_t)strlen(k->model);
        k->salt = i % 4 == 0 ? "s" : "";
        k->salt_len = (uint8_t)(i % 4 == 0);
        k->kv_rank = (uint32_t)(i % 2);
        k->hash_len = (uint8_t)(i % 5 == 0 ? 8 : 32);
        for (int j = 0; j < k->hash_len; j++)
            k->hash[j] = (uint8_t)(i * 7 + j);
    }
}

static kvidx_index_t *new_index(void)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    for (int i = 0; i < KVIDX_SEED_BYTES; i++)
        o.seed[i] = (uint8_t)i;
    kvidx_index_t *idx;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    return idx;
}

/* ---- the model (no capacities, no pins: those have their own tests) ---- */

typedef struct mkey {
    int present, l1, api_l2;
    uint32_t mask; /* sources holding it */
    uint32_t seen; /* sources that put it since their resync began */
    uint64_t size;
} mkey_t;

static mkey_t M[NU];
static int resyncing[NSRC];

static void m_maybe_forget(int i)
{
    if (!M[i].l1 && !M[i].api_l2 && !M[i].mask)
        memset(&M[i], 0, sizeof(M[i]));
}

static void m_source_put(unsigned s, int i, uint64_t size)
{
    if (!M[i].present) {
        memset(&M[i], 0, sizeof(M[i]));
        M[i].present = 1;
    }
    M[i].size = size;
    M[i].mask |= 1u << s;
    M[i].seen |= 1u << s;
}

static void m_source_del(unsigned s, int i)
{
    if (!M[i].present)
        return;
    M[i].mask &= ~(1u << s);
    M[i].seen &= ~(1u << s);
    m_maybe_forget(i);
}

static void agree(kvidx_index_t *idx)
{
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_ref_t refs[NU];
    kvidx_entry_info_t infos[NU];
    kvidx_index_find_batch(idx, U, NU, refs, infos);
    uint64_t keys = 0, src_keys = 0, src_bytes = 0;
    uint64_t per_keys[NSRC] = {0}, per_bytes[NSRC] = {0};
    for (int i = 0; i < NU; i++) {
        cr_assert_eq(refs[i] != KVIDX_REF_NONE, M[i].present, "key %d present", i);
        if (!M[i].present)
            continue;
        keys++;
        const kvidx_entry_info_t *f = &infos[i];
        cr_assert_eq(f->size_bytes, M[i].size, "key %d size", i);
        cr_assert_eq(f->l2_api, M[i].api_l2, "key %d l2_api", i);
        cr_assert_eq(f->l2_source, M[i].mask != 0, "key %d l2_source", i);
        cr_assert_eq(f->l2, M[i].api_l2 || M[i].mask, "key %d l2", i);
        cr_assert_eq(f->l1_state != KVIDX_L1_NONE, M[i].l1, "key %d l1", i);
        cr_assert_eq(kvidx_index_source_mask(idx, refs[i]), M[i].mask, "key %d mask", i);
        if (M[i].mask) {
            src_keys++;
            src_bytes += M[i].size;
        }
        for (unsigned s = 0; s < NSRC; s++) {
            cr_assert_eq(kvidx_index_source_holds(idx, s, refs[i]), (M[i].mask >> s) & 1);
            if ((M[i].mask >> s) & 1) {
                per_keys[s]++;
                per_bytes[s] += M[i].size;
            }
        }
    }
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, keys);
    cr_assert_eq(st.l2_source_keys, src_keys);
    cr_assert_eq(st.l2_source_bytes, src_bytes);
    for (unsigned s = 0; s < NSRC; s++) {
        kvidx_source_stats_t ss;
        cr_assert_eq(kvidx_index_source_stats(idx, s, &ss), 0);
        cr_assert_eq(ss.keys, per_keys[s]);
        cr_assert_eq(ss.bytes, per_bytes[s]);
        cr_assert_eq(ss.resyncing, resyncing[s]);
    }
}

/* What a journal fed by the change callback would hold: the last durable
 * state reported per key. After every step it must equal the API's own
 * copies in the model, whatever the sources hold. */
static kvidx_durable_t J[NU];

static void on_change(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *before,
                      const kvidx_durable_t *after)
{
    (void)ctx;
    (void)before;
    for (int i = 0; i < NU; i++)
        if (kvidx_key_equal(key, &U[i]))
            J[i] = *after;
}

static void journal_agrees(void)
{
    for (int i = 0; i < NU; i++) {
        unsigned tiers = 0;
        if (M[i].present)
            tiers = (M[i].l1 ? KVIDX_DURABLE_L1 : 0u) | (M[i].api_l2 ? KVIDX_DURABLE_L2 : 0u);
        cr_assert_eq(J[i].tiers, tiers, "key %d: journal tiers %u, API copies %u", i, J[i].tiers,
                     tiers);
        if (tiers)
            cr_assert_eq(J[i].size_bytes, M[i].size, "key %d: journal size", i);
    }
}

Test(index_source, random_operations_match_the_model)
{
    universe_init();
    memset(M, 0, sizeof(M));
    memset(resyncing, 0, sizeof(resyncing));
    memset(J, 0, sizeof(J));
    kvidx_index_t *idx = new_index();
    kvidx_index_set_change_cb(idx, on_change, NULL);
    for (unsigned s = 0; s < NSRC; s++) {
        unsigned id = 99;
        cr_assert_eq(kvidx_index_source_add(idx, &id), 0);
        cr_assert_eq(id, s);
    }
    for (int step = 0; step < 20000; step++) {
        unsigned s = rnd(NSRC);
        switch (rnd(9)) {
        case 0:
        case 1: { /* a source put of a small batch, maybe with a repeated key */
            kvidx_key_t keys[6];
            uint64_t sizes[6];
            int at[6];
            size_t n = 1 + rnd(6);
            for (size_t j = 0; j < n; j++) {
                at[j] = j && rnd(4) == 0 ? at[j - 1] : (int)rnd(NU);
                keys[j] = U[at[j]];
                sizes[j] = 1 + rnd(3) * 100;
            }
            cr_assert_eq(kvidx_index_source_put(idx, s, keys, sizes, n, NULL), 0);
            for (size_t j = 0; j < n; j++)
                m_source_put(s, at[j], sizes[j]);
            break;
        }
        case 2: { /* a source delete */
            int i = (int)rnd(NU);
            size_t removed = 9;
            cr_assert_eq(kvidx_index_source_del(idx, s, &U[i], 1, &removed), 0);
            cr_assert_eq(removed, M[i].present && ((M[i].mask >> s) & 1));
            m_source_del(s, i);
            break;
        }
        case 3: /* resync begin or end */
            if (!resyncing[s] || rnd(3) == 0) {
                cr_assert_eq(kvidx_index_source_resync_begin(idx, s), 0);
                resyncing[s] = 1;
                for (int i = 0; i < NU; i++)
                    M[i].seen &= ~(1u << s);
            } else if (rnd(4) == 0) {
                cr_assert_eq(kvidx_index_source_resync_abort(idx, s), 0);
                resyncing[s] = 0;
            } else {
                uint64_t removed = 0, expect = 0;
                cr_assert_eq(kvidx_index_source_resync_end(idx, s, &removed), 0);
                for (int i = 0; i < NU; i++) {
                    if (M[i].present && ((M[i].mask >> s) & 1) && !((M[i].seen >> s) & 1)) {
                        expect++;
                        m_source_del(s, i);
                    }
                }
                cr_assert_eq(removed, expect);
                resyncing[s] = 0;
            }
            break;
        case 4:
        case 5: { /* an API store */
            int i = (int)rnd(NU);
            kvidx_tier_t tier = rnd(2) ? KVIDX_TIER_L1 : KVIDX_TIER_L2;
            uint64_t size = M[i].present && rnd(3) ? M[i].size : 1 + rnd(3) * 100;
            kvidx_put_t it = {U[i], size};
            size_t conflict = 99;
            int rc = kvidx_index_put_batch(idx, tier, &it, 1, &conflict);
            if (M[i].present && M[i].mask && size != M[i].size) {
                cr_assert_eq(rc, KVIDX_ECONFLICT, "the API resized a source's key");
                cr_assert_eq(conflict, 0);
                break;
            }
            cr_assert_eq(rc, 0);
            if (!M[i].present) {
                memset(&M[i], 0, sizeof(M[i]));
                M[i].present = 1;
            }
            M[i].size = size;
            if (tier == KVIDX_TIER_L1)
                M[i].l1 = 1;
            else
                M[i].api_l2 = 1;
            break;
        }
        case 6: { /* an API delete */
            int i = (int)rnd(NU);
            kvidx_tier_t tier = (kvidx_tier_t)(1 + rnd(3));
            kvidx_del_outcome_t o;
            cr_assert_eq(kvidx_index_delete(idx, &U[i], tier, (int)rnd(2), &o), 0);
            int deleted = 0;
            if (M[i].present && (tier & KVIDX_TIER_L1) && M[i].l1) {
                M[i].l1 = 0;
                deleted = 1;
            }
            if (M[i].present && (tier & KVIDX_TIER_L2) && M[i].api_l2) {
                M[i].api_l2 = 0;
                deleted = 1;
            }
            kvidx_del_outcome_t expect = deleted
                                             ? KVIDX_DEL_DELETED
                                             : (M[i].present && (tier & KVIDX_TIER_L2) && M[i].mask
                                                    ? KVIDX_DEL_SKIPPED_SOURCE
                                                    : KVIDX_DEL_NOT_FOUND);
            cr_assert_eq(o, expect, "key %d tier %d", i, tier);
            if (M[i].present)
                m_maybe_forget(i);
            break;
        }
        default: { /* listing tier=l2 returns exactly the keys with an L2 copy */
            kvidx_list_filter_t f;
            memset(&f, 0, sizeof(f));
            f.tier = rnd(2) ? KVIDX_TIER_L2 : KVIDX_TIER_ALL;
            kvidx_ref_t refs[NU + 1];
            size_t count = 0;
            int more = 0;
            kvidx_key_buf_t resume;
            cr_assert_eq(
                kvidx_index_list(idx, &f, NULL, NU + 1, 100000, refs, &count, &resume, &more, NULL),
                0);
            size_t expect = 0;
            for (int i = 0; i < NU; i++)
                if (M[i].present && (M[i].api_l2 || M[i].mask || f.tier == KVIDX_TIER_ALL))
                    expect++;
            cr_assert_eq(count, expect);
            cr_assert_eq(more, 0);
            break;
        }
        }
        agree(idx);
        journal_agrees();
    }
    kvidx_index_free(idx);
}

/* ---- the change callback (the journal's feed) ---- */

static int changes;
static kvidx_durable_t last_before, last_after;

static void count_change(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *before,
                         const kvidx_durable_t *after)
{
    (void)ctx;
    (void)key;
    changes++;
    last_before = *before;
    last_after = *after;
}

Test(index_source, a_source_copy_is_never_durable)
{
    universe_init();
    kvidx_index_t *idx = new_index();
    kvidx_index_set_change_cb(idx, count_change, NULL);
    unsigned id;
    cr_assert_eq(kvidx_index_source_add(idx, &id), 0);
    uint64_t sz[2] = {100, 200};
    changes = 0;
    cr_assert_eq(kvidx_index_source_put(idx, id, U, sz, 2, NULL), 0);
    sz[0] = 150;
    cr_assert_eq(kvidx_index_source_put(idx, id, U, sz, 1, NULL), 0);
    cr_assert_eq(kvidx_index_source_del(idx, id, &U[1], 1, NULL), 0);
    cr_assert_eq(changes, 0, "a source's copies reached the change callback");

    /* An API store onto a source's key: one key, and the API copy is
     * durable. */
    kvidx_put_t it = {U[0], 150};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &it, 1, NULL), 0);
    cr_assert_eq(changes, 1);
    cr_assert_eq(last_after.tiers, KVIDX_DURABLE_L2);
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, 1);
    /* The source resizes it: the durable copy's new size is reported. */
    sz[0] = 175;
    cr_assert_eq(kvidx_index_source_put(idx, id, U, sz, 1, NULL), 0);
    cr_assert_eq(changes, 2);
    cr_assert_eq(last_before.size_bytes, 150);
    cr_assert_eq(last_after.size_bytes, 175);
    cr_assert_eq(last_after.tiers, KVIDX_DURABLE_L2);
    /* The file goes: the API copy stays, nothing durable changes. */
    cr_assert_eq(kvidx_index_source_del(idx, id, U, 1, NULL), 0);
    cr_assert_eq(changes, 2);
    kvidx_ref_t ref;
    kvidx_entry_info_t info;
    cr_assert_eq(kvidx_index_find(idx, &U[0], &ref), 0);
    cr_assert_eq(kvidx_index_info(idx, ref, &info), 0);
    cr_assert(info.l2 && info.l2_api && !info.l2_source);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

Test(index_source, lookups_see_source_copies_as_l2)
{
    universe_init();
    kvidx_index_t *idx = new_index();
    unsigned id;
    cr_assert_eq(kvidx_index_source_add(idx, &id), 0);
    uint64_t sz[NU];
    for (int i = 0; i < NU; i++)
        sz[i] = 10 + (uint64_t)i;
    cr_assert_eq(kvidx_index_source_put(idx, id, U, sz, NU / 2, NULL), 0);
    kvidx_ref_t refs[NU];
    kvidx_entry_info_t infos[NU];
    kvidx_index_find_batch(idx, U, NU, refs, infos);
    for (int i = 0; i < NU; i++) {
        if (i < NU / 2) {
            cr_assert_neq(refs[i], KVIDX_REF_NONE);
            cr_assert(infos[i].l2 && infos[i].l2_source && !infos[i].l2_api);
            cr_assert_eq(infos[i].l1_state, KVIDX_L1_NONE);
            cr_assert_eq(infos[i].size_bytes, sz[i]);
        } else {
            cr_assert_eq(refs[i], KVIDX_REF_NONE);
        }
    }
    /* A load into L1 from the source's copy, then its end: the key stays
     * (the source still holds it), also after a failed load. */
    uint64_t gen;
    cr_assert_eq(kvidx_index_l1_reserve(idx, refs[0], 1, &gen), 0);
    cr_assert_eq(kvidx_index_l1_load_done(idx, refs[0], gen, 0), 0);
    cr_assert_eq(kvidx_index_find(idx, &U[0], &refs[0]), 0);
    cr_assert_eq(kvidx_index_l1_reserve(idx, refs[0], 1, &gen), 0);
    cr_assert_eq(kvidx_index_pin(idx, refs[0], gen, 1), 0);
    cr_assert_eq(kvidx_index_l1_load_done(idx, refs[0], gen, 1), 0);
    cr_assert_eq(kvidx_index_unpin(idx, refs[0], gen, 1), 0); /* temporary: dropped */
    cr_assert_eq(kvidx_index_find(idx, &U[0], &refs[0]), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

Test(index_source, api_deletes_leave_the_source_copy)
{
    universe_init();
    kvidx_index_t *idx = new_index();
    unsigned id;
    cr_assert_eq(kvidx_index_source_add(idx, &id), 0);
    uint64_t sz = 64;
    cr_assert_eq(kvidx_index_source_put(idx, id, U, &sz, 1, NULL), 0);
    kvidx_del_outcome_t o;
    for (int force = 0; force < 2; force++) {
        cr_assert_eq(kvidx_index_delete(idx, &U[0], KVIDX_TIER_ALL, force, &o), 0);
        cr_assert_eq(o, KVIDX_DEL_SKIPPED_SOURCE);
        cr_assert_eq(kvidx_index_delete(idx, &U[0], KVIDX_TIER_L2, force, &o), 0);
        cr_assert_eq(o, KVIDX_DEL_SKIPPED_SOURCE);
        cr_assert_eq(kvidx_index_delete(idx, &U[0], KVIDX_TIER_L1, force, &o), 0);
        cr_assert_eq(o, KVIDX_DEL_NOT_FOUND);
    }
    /* With an L1 copy, deleting L1 deletes it and the key stays. */
    kvidx_put_t it = {U[0], 64};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &it, 1, NULL), 0);
    cr_assert_eq(kvidx_index_delete(idx, &U[0], KVIDX_TIER_ALL, 0, &o), 0);
    cr_assert_eq(o, KVIDX_DEL_DELETED);
    kvidx_ref_t ref;
    cr_assert_eq(kvidx_index_find(idx, &U[0], &ref), 0);
    /* An API resize is refused, in either tier; the same size is fine. */
    it.size_bytes = 65;
    size_t at = 9;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &it, 1, &at), KVIDX_ECONFLICT);
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &it, 1, &at), KVIDX_ECONFLICT);
    cr_assert_eq(at, 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

static int evicted, evicted_forgotten;

static void on_evict(void *ctx, const kvidx_key_t *key, uint64_t size, int forgotten)
{
    (void)ctx;
    (void)key;
    (void)size;
    evicted++;
    evicted_forgotten += forgotten;
}

Test(index_source, a_resize_applies_to_pinned_copies_and_evicts_to_fit)
{
    universe_init();
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    o.l1_capacity_bytes = 1000;
    o.on_evict = on_evict;
    kvidx_index_t *idx;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    unsigned id;
    cr_assert_eq(kvidx_index_source_add(idx, &id), 0);
    uint64_t sz[3] = {300, 300, 300};
    cr_assert_eq(kvidx_index_source_put(idx, id, U, sz, 3, NULL), 0);
    kvidx_put_t it[3] = {{U[0], 300}, {U[1], 300}, {U[2], 300}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, it, 3, NULL), 0);
    kvidx_ref_t ref;
    cr_assert_eq(kvidx_index_find(idx, &U[2], &ref), 0);
    cr_assert_eq(kvidx_index_pin(idx, ref, 0, 1), 0);
    /* The source grows the pinned key past the capacity: the size is the
     * source's, and unpinned copies are evicted to fit, their keys kept. */
    sz[2] = 800;
    evicted = evicted_forgotten = 0;
    cr_assert_eq(kvidx_index_source_put(idx, id, &U[2], &sz[2], 1, NULL), 0);
    kvidx_entry_info_t info;
    cr_assert_eq(kvidx_index_info(idx, ref, &info), 0);
    cr_assert_eq(info.size_bytes, 800);
    cr_assert_eq(info.pins, 1);
    cr_assert_eq(evicted, 2);
    cr_assert_eq(evicted_forgotten, 0, "a key a source holds was forgotten by eviction");
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.l1_bytes, 800);
    cr_assert_eq(st.keys, 3);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

Test(index_source, resync_replaces_the_membership_in_one_step)
{
    universe_init();
    kvidx_index_t *idx = new_index();
    unsigned a, b;
    cr_assert_eq(kvidx_index_source_add(idx, &a), 0);
    cr_assert_eq(kvidx_index_source_add(idx, &b), 0);
    uint64_t sz[NU];
    for (int i = 0; i < NU; i++)
        sz[i] = 5;
    cr_assert_eq(kvidx_index_source_put(idx, a, U, sz, 20, NULL), 0);
    cr_assert_eq(kvidx_index_source_put(idx, b, U + 10, sz, 5, NULL), 0);
    cr_assert_eq(kvidx_index_source_resync_end(idx, a, NULL), KVIDX_EINVAL, "end without begin");
    cr_assert_eq(kvidx_index_source_resync_begin(idx, a), 0);
    /* The store now holds keys 5..24 of the universe. */
    cr_assert_eq(kvidx_index_source_put(idx, a, U + 5, sz, 20, NULL), 0);
    uint64_t removed = 0;
    cr_assert_eq(kvidx_index_source_resync_end(idx, a, &removed), 0);
    cr_assert_eq(removed, 5);
    for (int i = 0; i < 30; i++) {
        kvidx_ref_t ref;
        int found = kvidx_index_find(idx, &U[i], &ref) == 0;
        cr_assert_eq(found, i >= 5 && i < 25, "key %d", i);
        if (found)
            cr_assert_eq(kvidx_index_source_mask(idx, ref),
                         1u << a | (i >= 10 && i < 15 ? 1u << b : 0u), "key %d", i);
    }
    cr_assert_eq(kvidx_index_check(idx), 0);
    unsigned extra;
    for (int i = 2; i < KVIDX_INDEX_SOURCES_MAX; i++)
        cr_assert_eq(kvidx_index_source_add(idx, &extra), 0);
    cr_assert_eq(kvidx_index_source_add(idx, &extra), KVIDX_ECAPACITY);
    cr_assert_eq(kvidx_index_source_put(idx, 99, U, sz, 1, NULL), KVIDX_EINVAL);
    uint64_t bad[2] = {5, 0};
    size_t at = 9;
    cr_assert_eq(kvidx_index_source_put(idx, a, U, bad, 2, &at), KVIDX_EINVAL);
    cr_assert_eq(at, 1);
    kvidx_index_free(idx);
}

/* ---- out of memory ---- */

static uint64_t fingerprint(kvidx_index_t *idx, const kvidx_key_t *keys, size_t n)
{
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    uint64_t h = fingerprint_bytes(FINGERPRINT_SEED, &st, sizeof(st));
    for (size_t i = 0; i < n; i++) {
        kvidx_ref_t r;
        kvidx_entry_info_t info;
        memset(&info, 0, sizeof(info));
        uint32_t mask = 0;
        if (kvidx_index_find(idx, &keys[i], &r) == 0) {
            kvidx_index_info(idx, r, &info);
            mask = kvidx_index_source_mask(idx, r);
        } else {
            info.size_bytes = 12345;
        }
        h = fingerprint_bytes(h, &info, sizeof(info));
        h = (h ^ mask) * 1099511628211ULL;
    }
    for (unsigned s = 0; s < 2; s++) {
        kvidx_source_stats_t ss;
        kvidx_index_source_stats(idx, s, &ss);
        h = (h ^ ss.keys ^ ss.bytes << 20) * 1099511628211ULL;
    }
    return h;
}

Test(index_source, out_of_memory_is_atomic_and_leak_free)
{
    enum { BASE = 2000, NEW = 1500 };
    static kvidx_key_t base[BASE], batch[NEW], all[BASE + NEW];
    static uint64_t bsz[BASE], nsz[NEW];
    static char hexes[NEW][4];
    static const char *ms[] = {"m0", "m1", "m2", "m3"};
    for (int i = 0; i < BASE; i++) {
        memset(&base[i], 0, sizeof(base[i]));
        base[i].model = ms[i % 2];
        base[i].model_len = 2;
        base[i].salt = "";
        base[i].kv_rank = (uint32_t)i % 5;
        base[i].hash_len = 32;
        memcpy(base[i].hash, &i, sizeof(i));
        bsz[i] = 10;
        all[i] = base[i];
    }
    for (int i = 0; i < NEW; i++) {
        /* Re-puts of old keys with new sizes, new keys in new namespaces
         * and salts, varied hash lengths, and repeats within the batch. */
        if (i % 3 == 0) {
            batch[i] = base[i];
        } else {
            memset(&batch[i], 0, sizeof(batch[i]));
            batch[i].model = ms[i % 4];
            batch[i].model_len = 2;
            snprintf(hexes[i], sizeof(hexes[i]), "s%d", i % 7);
            batch[i].salt = i % 5 ? "" : hexes[i];
            batch[i].salt_len = (uint8_t)strlen(batch[i].salt);
            batch[i].kv_rank = (uint32_t)i % 5;
            batch[i].hash_len = (uint8_t)(1 + i % 64);
            int v = i * 104729 + 1;
            memcpy(batch[i].hash, &v, sizeof(v));
            if (i % 11 == 0)
                batch[i] = batch[i - 1];
        }
        nsz[i] = 20 + (uint64_t)(i % 3);
        all[BASE + i] = batch[i];
    }
    kvidx_allocator_t a = {failing_malloc, failing_realloc, failing_free, NULL};
    kvidx_set_allocator(&a);
    int succeeded = 0, failures = 0;
    for (long n = 1; n < 400 && !succeeded; n++) {
        failing.count = 0;
        failing.fail_at = 0;
        kvidx_index_t *idx = new_index();
        unsigned s0, s1;
        cr_assert_eq(kvidx_index_source_add(idx, &s0), 0);
        cr_assert_eq(kvidx_index_source_add(idx, &s1), 0);
        cr_assert_eq(kvidx_index_source_put(idx, s0, base, bsz, BASE, NULL), 0);
        cr_assert_eq(kvidx_index_source_put(idx, s1, base, bsz, BASE / 2, NULL), 0);
        cr_assert_eq(kvidx_index_source_resync_begin(idx, s1), 0);
        kvidx_put_t it = {base[1], 10};
        cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &it, 1, NULL), 0);
        cr_assert_eq(kvidx_index_check(idx), 0);
        uint64_t fp = fingerprint(idx, all, BASE + NEW);
        failing.fail_at = failing.count + n;
        int rc = kvidx_index_source_put(idx, s1, batch, nsz, NEW, NULL);
        failing.fail_at = 0;
        cr_assert_eq(kvidx_index_check(idx), 0, "n=%ld", n);
        if (rc == 0) {
            succeeded = 1;
        } else {
            cr_assert_eq(rc, KVIDX_ENOMEM, "n=%ld rc=%d", n, rc);
            failures++;
            cr_assert_eq(fingerprint(idx, all, BASE + NEW), fp, "n=%ld", n);
            cr_assert_eq(kvidx_index_source_put(idx, s1, batch, nsz, NEW, NULL), 0);
            cr_assert_eq(kvidx_index_check(idx), 0, "n=%ld", n);
        }
        /* The resync still ends correctly after a failed put. */
        cr_assert_eq(kvidx_index_source_resync_end(idx, s1, NULL), 0);
        cr_assert_eq(kvidx_index_check(idx), 0, "n=%ld", n);
        kvidx_index_free(idx);
        cr_assert_eq(failing.live, 0, "leak at n=%ld", n);
    }
    kvidx_set_allocator(NULL);
    cr_assert(succeeded);
    cr_assert_geq(failures, 5, "only %d injected failures", failures);
}

/* ---- the check sees broken invariants ---- */

Test(index_source, the_check_sees_broken_source_invariants)
{
    universe_init();
    kvidx_index_t *idx = new_index();
    unsigned id;
    cr_assert_eq(kvidx_index_source_add(idx, &id), 0);
    uint64_t sz[2] = {7, 9};
    cr_assert_eq(kvidx_index_source_put(idx, id, U, sz, 2, NULL), 0);
    kvidx_put_t it = {U[5], 3};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, &it, 1, NULL), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_ref_t r0, r5;
    cr_assert_eq(kvidx_index_find(idx, &U[0], &r0), 0);
    cr_assert_eq(kvidx_index_find(idx, &U[5], &r5), 0);

    /* A member without the bit (counters adjusted so only the link breaks). */
    rec_set_src(rec_at(idx, r0), 0);
    idx->c.src_keys--;
    idx->c.src_bytes -= 7;
    cr_assert_eq(kvidx_index_check(idx), KVIDX_EINTERNAL, "member without the bit");
    rec_set_src(rec_at(idx, r0), 1);
    idx->c.src_keys++;
    idx->c.src_bytes += 7;
    cr_assert_eq(kvidx_index_check(idx), 0);

    /* The bit on a key no source holds. */
    rec_set_src(rec_at(idx, r5), 1);
    idx->c.src_keys++;
    idx->c.src_bytes += 3;
    cr_assert_eq(kvidx_index_check(idx), KVIDX_EINTERNAL, "bit without a membership");
    rec_set_src(rec_at(idx, r5), 0);
    idx->c.src_keys--;
    idx->c.src_bytes -= 3;

    /* A member's size changed behind the source's byte count (the index
     * counter follows, so only the source's sum is off). */
    rec_set_size(rec_at(idx, r0), 8);
    idx->c.src_bytes++;
    cr_assert_eq(kvidx_index_check(idx), KVIDX_EINTERNAL, "source bytes");
    rec_set_size(rec_at(idx, r0), 7);
    idx->c.src_bytes--;

    /* The index counters off. */
    idx->c.src_bytes++;
    cr_assert_eq(kvidx_index_check(idx), KVIDX_EINTERNAL, "src_bytes");
    idx->c.src_bytes--;
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}
