/*
 * Per-salt L1 accounting and quotas of the index (kvidx/index_quota.h):
 * the accounts follow every L1 change, a quota evicts only its own salt's
 * unpinned copies in LRU order, stores and loads that cannot fit fail
 * with KVIDX_EQUOTA and change nothing, L2 is never affected, and
 * kvidx_index_check sees a broken account. A randomized run checks the
 * invariants after every step against a model of each salt's bytes.
 */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/index_quota.h"

/* The private structures, to break invariants on purpose. */
#include "../../../lib/index/index_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvidx_key_t key(const char *model, const char *salt, uint32_t n)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)strlen(model);
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.kv_rank = 0;
    k.group = 0;
    k.hash_len = 8;
    for (int i = 0; i < 4; i++)
        k.hash[i] = (uint8_t)(n >> (8 * i));
    k.hash[7] = 0x5a;
    return k;
}

static kvidx_index_t *new_index(uint64_t l1_cap)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.l1_capacity_bytes = l1_cap;
    o.has_seed = 1;
    for (int i = 0; i < KVIDX_SEED_BYTES; i++)
        o.seed[i] = (uint8_t)(i * 7 + 1);
    kvidx_index_t *idx = NULL;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    return idx;
}

static int put1(kvidx_index_t *idx, kvidx_tier_t tier, const char *model, const char *salt,
                uint32_t n, uint64_t size)
{
    kvidx_put_t p = {key(model, salt, n), size};
    int rc = kvidx_index_put_batch(idx, tier, &p, 1, NULL);
    cr_assert_eq(kvidx_index_check(idx), 0);
    return rc;
}

/* The key's L1 state, KVIDX_L1_NONE when absent. */
static kvidx_l1_state_t l1_of(const kvidx_index_t *idx, const char *salt, uint32_t n)
{
    kvidx_key_t k = key("m", salt, n);
    kvidx_ref_t ref;
    kvidx_entry_info_t info;
    if (kvidx_index_find(idx, &k, &ref) != 0 || kvidx_index_info(idx, ref, &info) != 0)
        return KVIDX_L1_NONE;
    return info.l1_state;
}

static kvidx_salt_usage_t usage(const kvidx_index_t *idx, const char *salt)
{
    kvidx_salt_usage_t u;
    kvidx_index_salt_usage(idx, salt, strlen(salt), &u);
    return u;
}

static void set_quota(kvidx_index_t *idx, const char *salt, uint64_t bytes)
{
    kvidx_salt_quota_t q = {salt, strlen(salt), bytes};
    cr_assert_eq(kvidx_index_set_quotas(idx, &q, 1), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
}

static kvidx_ref_t ref_of(const kvidx_index_t *idx, const char *salt, uint32_t n)
{
    kvidx_key_t k = key("m", salt, n);
    kvidx_ref_t ref = KVIDX_REF_NONE;
    cr_assert_eq(kvidx_index_find(idx, &k, &ref), 0);
    return ref;
}

Test(quota, accounts_follow_every_l1_change)
{
    kvidx_index_t *idx = new_index(0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 1, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m2", "a", 2, 50), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "", 3, 7), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L2, "m", "b", 4, 1000), 0);
    kvidx_salt_usage_t u = usage(idx, "a");
    cr_assert_eq(u.keys, 2);
    cr_assert_eq(u.l1_keys, 2);
    cr_assert_eq(u.l1_bytes, 150);
    cr_assert_eq(u.l1_evictable_bytes, 150);
    cr_assert_eq(usage(idx, "").l1_bytes, 7);
    u = usage(idx, "b");
    cr_assert_eq(u.keys, 1);
    cr_assert_eq(u.l1_bytes, 0, "L2 is not counted");
    /* Resize, pin, delete. */
    cr_assert_eq(put1(idx, KVIDX_TIER_L2, "m", "a", 1, 120), 0);
    cr_assert_eq(usage(idx, "a").l1_bytes, 170);
    kvidx_ref_t r = ref_of(idx, "a", 1);
    cr_assert_eq(kvidx_index_pin(idx, r, 0, 1), 0);
    cr_assert_eq(usage(idx, "a").l1_evictable_bytes, 50);
    cr_assert_eq(kvidx_index_check(idx), 0);
    cr_assert_eq(kvidx_index_unpin(idx, r, 0, 1), 0);
    kvidx_del_outcome_t o;
    kvidx_key_t k = key("m2", "a", 2);
    cr_assert_eq(kvidx_index_delete(idx, &k, KVIDX_TIER_ALL, 0, &o), 0);
    cr_assert_eq(usage(idx, "a").l1_bytes, 120);
    cr_assert_eq(kvidx_index_check(idx), 0);
    /* The salt's last key: its account goes (the index check counts them). */
    k = key("m", "a", 1);
    cr_assert_eq(kvidx_index_delete(idx, &k, KVIDX_TIER_ALL, 0, &o), 0);
    cr_assert_eq(usage(idx, "a").keys, 0);
    cr_assert_eq(idx->acc.nfree, 1);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

static void collect(void *ctx, const kvidx_salt_usage_t *u)
{
    char *out = ctx;
    char line[64];
    snprintf(line, sizeof(line), "[%.*s]%llu/%llu ", (int)u->salt_len, u->salt,
             (unsigned long long)u->keys, (unsigned long long)u->l1_bytes);
    strcat(out, line);
}

Test(quota, each_salt_in_order)
{
    kvidx_index_t *idx = new_index(0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "b", 1, 5), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "z", "a", 1, 3), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 1, 4), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L2, "m", "", 1, 9), 0);
    char out[256] = "";
    kvidx_index_each_salt(idx, collect, out);
    cr_assert_str_eq(out, "[]1/0 [a]2/7 [b]1/5 ");
    kvidx_index_free(idx);
}

Test(quota, store_evicts_only_its_own_salt_least_recent_first)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 300);
    for (uint32_t i = 1; i <= 3; i++) {
        cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", i, 100), 0);
        cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "b", i, 100), 0);
    }
    /* a1 is now a's least recent; touching it (a re-put) makes a2 so. */
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 1, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 4, 100), 0);
    cr_assert_eq(l1_of(idx, "a", 2), KVIDX_L1_NONE, "a2 was a's least recent");
    cr_assert_eq(l1_of(idx, "a", 1), KVIDX_L1_READY);
    cr_assert_eq(l1_of(idx, "a", 3), KVIDX_L1_READY);
    for (uint32_t i = 1; i <= 3; i++)
        cr_assert_eq(l1_of(idx, "b", i), KVIDX_L1_READY, "b%u is another salt's", i);
    /* b1 is the index's least recent copy, and stays. */
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 5, 100), 0);
    cr_assert_eq(l1_of(idx, "a", 3), KVIDX_L1_NONE);
    cr_assert_eq(l1_of(idx, "b", 1), KVIDX_L1_READY);
    kvidx_salt_usage_t u = usage(idx, "a");
    cr_assert_eq(u.l1_bytes, 300);
    cr_assert_eq(u.quota_bytes, 300);
    cr_assert_eq(u.quota_evictions, 2);
    cr_assert_eq(kvidx_index_quota_evictions(idx), 2);
    cr_assert_eq(usage(idx, "b").l1_bytes, 300);
    kvidx_index_free(idx);
}

Test(quota, pinned_copies_stay_and_a_store_that_cannot_fit_changes_nothing)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 200);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 1, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 2, 100), 0);
    cr_assert_eq(kvidx_index_pin(idx, ref_of(idx, "a", 1), 0, 1), 0);
    /* a2 is evictable: a3 fits after evicting it, not after a1. */
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 3, 100), 0);
    cr_assert_eq(l1_of(idx, "a", 1), KVIDX_L1_READY);
    cr_assert_eq(l1_of(idx, "a", 2), KVIDX_L1_NONE);
    cr_assert_eq(kvidx_index_pin(idx, ref_of(idx, "a", 3), 0, 1), 0);
    kvidx_index_stats_t before, after;
    kvidx_index_stats(idx, &before);
    /* Everything of a is pinned: a mixed batch fails whole. */
    kvidx_put_t batch[2] = {{key("m", "b", 1), 10}, {key("m", "a", 4), 1}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, 2, NULL), KVIDX_EQUOTA);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_stats(idx, &after);
    cr_assert_eq(memcmp(&before, &after, sizeof(before)), 0);
    cr_assert_eq(l1_of(idx, "b", 1), KVIDX_L1_NONE, "nothing of the batch was stored");
    /* L2 is not affected, and shrinking an existing copy is allowed. */
    cr_assert_eq(put1(idx, KVIDX_TIER_L2, "m", "a", 9, (uint64_t)1 << 40), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "b", 1, 10), 0);
    kvidx_index_free(idx);
}

Test(quota, a_batch_never_evicts_its_own_keys)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 250);
    kvidx_put_t batch[3];
    for (uint32_t i = 0; i < 3; i++) {
        batch[i].key = key("m", "a", i);
        batch[i].size_bytes = 100;
    }
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, 3, NULL), KVIDX_EQUOTA);
    cr_assert_eq(usage(idx, "a").keys, 0);
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, 2, NULL), 0);
    /* Re-putting the two, larger: their own bytes cannot make room. */
    batch[0].size_bytes = batch[1].size_bytes = 126;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, 2, NULL), KVIDX_EQUOTA);
    batch[0].size_bytes = batch[1].size_bytes = 125;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, batch, 2, NULL), 0);
    cr_assert_eq(usage(idx, "a").l1_bytes, 250);
    /* An L2 re-put that grows an L1 copy counts too. */
    batch[0].size_bytes = 200;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, batch, 1, NULL), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    cr_assert_leq(usage(idx, "a").l1_bytes, 250);
    kvidx_index_free(idx);
}

Test(quota, a_new_salt_is_held_to_its_quota)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "new", 100);
    cr_assert_eq(usage(idx, "new").quota_bytes, 100);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "new", 1, 101), KVIDX_EQUOTA);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "new", 1, 100), 0);
    /* Another model of the same salt shares its quota. */
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "other", "new", 1, 60), 0);
    cr_assert_eq(usage(idx, "new").l1_bytes, 60);
    cr_assert_eq(l1_of(idx, "new", 1), KVIDX_L1_NONE);
    kvidx_index_free(idx);
}

Test(quota, loads_evict_their_salt_or_fail)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 200);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 1, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 2, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "b", 1, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L2, "m", "a", 3, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L2, "m", "a", 4, 100), 0);
    uint64_t gen = 0;
    cr_assert_eq(kvidx_index_l1_reserve(idx, ref_of(idx, "a", 3), 0, &gen), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    cr_assert_eq(l1_of(idx, "a", 1), KVIDX_L1_NONE, "a's least recent made room");
    cr_assert_eq(l1_of(idx, "b", 1), KVIDX_L1_READY);
    cr_assert_eq(kvidx_index_pin(idx, ref_of(idx, "a", 2), 0, 1), 0);
    /* a2 pinned, a3 loading: nothing of a can go. */
    kvidx_index_stats_t before, after;
    kvidx_index_stats(idx, &before);
    cr_assert_eq(kvidx_index_l1_reserve(idx, ref_of(idx, "a", 4), 0, &gen), KVIDX_EQUOTA);
    kvidx_index_stats(idx, &after);
    cr_assert_eq(memcmp(&before, &after, sizeof(before)), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

Test(quota, lowering_a_quota_evicts_and_the_capacity_still_applies)
{
    kvidx_index_t *idx = new_index(500);
    for (uint32_t i = 1; i <= 4; i++)
        cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", i, 100), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "b", 1, 100), 0);
    set_quota(idx, "a", 250);
    cr_assert_eq(usage(idx, "a").l1_bytes, 200);
    cr_assert_eq(l1_of(idx, "a", 1), KVIDX_L1_NONE);
    cr_assert_eq(l1_of(idx, "a", 2), KVIDX_L1_NONE);
    /* The index's capacity evicts the index's least recent, whatever its
     * salt: a3. */
    for (uint32_t i = 2; i <= 4; i++)
        cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "c", i, 100), 0);
    cr_assert_eq(l1_of(idx, "a", 3), KVIDX_L1_NONE);
    cr_assert_eq(l1_of(idx, "b", 1), KVIDX_L1_READY);
    cr_assert_eq(kvidx_index_quota_evictions(idx), 2);
    /* Removing every quota. */
    cr_assert_eq(kvidx_index_set_quotas(idx, NULL, 0), 0);
    cr_assert_eq(usage(idx, "a").quota_bytes, 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

Test(quota, set_quotas_checks_its_arguments)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 10);
    kvidx_salt_quota_t dup[2] = {{"x", 1, 5}, {"x", 1, 6}};
    cr_assert_eq(kvidx_index_set_quotas(idx, dup, 2), KVIDX_EINVAL);
    kvidx_salt_quota_t zero = {"x", 1, 0};
    cr_assert_eq(kvidx_index_set_quotas(idx, &zero, 1), KVIDX_EINVAL);
    kvidx_salt_quota_t longer = {"x", KVIDX_SALT_MAX + 1, 5};
    cr_assert_eq(kvidx_index_set_quotas(idx, &longer, 1), KVIDX_EINVAL);
    cr_assert_eq(usage(idx, "a").quota_bytes, 10, "a failed call changes nothing");
    /* The empty salt is a salt. */
    kvidx_salt_quota_t two[2] = {{"", 0, 7}, {"b", 1, 8}};
    cr_assert_eq(kvidx_index_set_quotas(idx, two, 2), 0);
    cr_assert_eq(usage(idx, "").quota_bytes, 7);
    cr_assert_eq(usage(idx, "a").quota_bytes, 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "", 1, 8), KVIDX_EQUOTA);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_index_free(idx);
}

Test(quota, bulk_load_evicts_to_the_quota)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 150);
    kvidx_load_t items[3];
    for (uint32_t i = 0; i < 3; i++) {
        items[i].key = key("m", "a", i);
        items[i].size_bytes = 100;
        items[i].tiers = KVIDX_DURABLE_L1 | KVIDX_DURABLE_L2;
    }
    cr_assert_eq(kvidx_index_load(idx, items, 3, NULL), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    cr_assert_eq(usage(idx, "a").l1_bytes, 100);
    cr_assert_eq(usage(idx, "a").keys, 3, "the L2 copies stay");
    cr_assert_eq(l1_of(idx, "a", 2), KVIDX_L1_READY, "the most recent stays");
    kvidx_index_free(idx);
}

/* ---- the check sees a broken account ---- */

static kvidx_index_t *three_salts(void)
{
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "b", 1000);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 1, 10), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "a", 2, 20), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m", "b", 1, 30), 0);
    cr_assert_eq(put1(idx, KVIDX_TIER_L1, "m2", "b", 1, 40), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    return idx;
}

Test(quota, check_sees_each_broken_account)
{
    for (int what = 0; what < 10; what++) {
        kvidx_index_t *idx = three_salts();
        uint32_t a = idx->ns_sorted[0]->acct, b = idx->ns_sorted[1]->acct;
        ix_acct_t *A = &idx->acc.v[a];
        uint32_t m1 = rec_l1(rec_at(idx, ref_of(idx, "a", 1)));
        switch (what) {
        case 0:
            A->l1_bytes++;
            break;
        case 1:
            A->lru_bytes--;
            break;
        case 2:
            A->l1_keys++;
            break;
        case 3:
            idx->l1[m1].acct = b; /* a copy in another salt's account */
            break;
        case 4:
            A->nns++;
            break;
        case 5:
            idx->ns_sorted[2]->acct = b == idx->ns_sorted[2]->acct ? a : b;
            break;
        case 6:
            A->newest = A->oldest; /* the list loses a copy */
            break;
        case 7:
            A->quota = 5; /* not the table's */
            break;
        case 8:
            idx->acc.quotas[0].pend_d1 = 1; /* left pending */
            break;
        default:
            idx->l1[m1].sprev = m1; /* a broken back link */
            break;
        }
        cr_assert_eq(kvidx_index_check(idx), KVIDX_EINTERNAL, "case %d", what);
        kvidx_index_free(idx);
    }
}

/* ---- randomized, against a model of each salt's bytes ---- */

enum { NSALT = 3, NKEY = 24 };
static const char *rsalts[NSALT] = {"", "t1", "t2"};

Test(quota, random_steps_keep_the_invariants)
{
    kvidx_index_t *idx = new_index(3000);
    kvidx_salt_quota_t q[2] = {{"t1", 2, 700}, {"t2", 2, 400}};
    cr_assert_eq(kvidx_index_set_quotas(idx, q, 2), 0);
    uint64_t s = 88172645463325252ull;
    uint32_t pins[NSALT][NKEY];
    memset(pins, 0, sizeof(pins));
    int refused = 0;
    for (int step = 0; step < 6000; step++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        int si = (int)(s % NSALT);
        uint32_t k = (uint32_t)((s >> 8) % NKEY);
        unsigned op = (unsigned)((s >> 20) % 8);
        const char *salt = rsalts[si];
        kvidx_key_t kk = key("m", salt, k);
        kvidx_ref_t ref;
        int found = kvidx_index_find(idx, &kk, &ref) == 0;
        uint64_t size = 50 + (s >> 32) % 200;
        int rc = 0;
        switch (op) {
        case 0:
        case 1:
            if (found) { /* the same size: a pinned copy may not change size */
                kvidx_entry_info_t info;
                kvidx_index_info(idx, ref, &info);
                size = info.size_bytes;
            }
            rc = put1(idx, KVIDX_TIER_L1, "m", salt, k, size);
            cr_assert(rc == 0 || rc == KVIDX_EQUOTA || rc == KVIDX_ECAPACITY, "rc %d", rc);
            refused += rc == KVIDX_EQUOTA;
            break;
        case 2:
            if (!found)
                rc = put1(idx, KVIDX_TIER_L2, "m", salt, k, size);
            break;
        case 3:
            if (found && !pins[si][k] && kvidx_index_pin(idx, ref, 0, 1) == 0)
                pins[si][k] = 1;
            break;
        case 4:
            if (found && pins[si][k]) {
                cr_assert_eq(kvidx_index_unpin(idx, ref, 0, 1), 0);
                pins[si][k] = 0;
            }
            break;
        case 5:
            if (found && !pins[si][k]) {
                uint64_t gen;
                rc = kvidx_index_l1_reserve(idx, ref, 0, &gen);
                if (rc == 0)
                    cr_assert_eq(kvidx_index_l1_load_done(idx, ref, gen, (s >> 40) & 1), 0);
            }
            break;
        case 6:
            if (found && !pins[si][k]) {
                kvidx_del_outcome_t o;
                cr_assert_eq(kvidx_index_delete(idx, &kk, KVIDX_TIER_L1, 0, &o), 0);
            }
            break;
        default: {
            kvidx_salt_quota_t nq[2] = {{"t1", 2, 300 + (s >> 33) % 800},
                                        {"t2", 2, 300 + (s >> 43) % 800}};
            cr_assert_eq(kvidx_index_set_quotas(idx, nq, 2), 0);
            break;
        }
        }
        cr_assert_eq(kvidx_index_check(idx), 0, "step %d op %u", step, op);
        /* After a store or a new quota, a salt is over its quota only by
         * pinned and loading bytes. */
        for (int i = 1; i < NSALT && (op <= 1 || op == 7); i++) {
            kvidx_salt_usage_t u = usage(idx, rsalts[i]);
            if (u.l1_bytes > u.quota_bytes && (op == 7 || i == si) && rc == 0)
                cr_assert_eq(u.l1_evictable_bytes, 0, "step %d salt %s", step, rsalts[i]);
        }
    }
    /* The run went through both outcomes of a quota. */
    cr_assert_gt(refused, 10);
    cr_assert_gt(kvidx_index_quota_evictions(idx), 100);
    kvidx_index_free(idx);
}

/* ---- out of memory ---- */

static long alloc_left = -1;

static void *q_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (alloc_left == 0)
        return NULL;
    if (alloc_left > 0)
        alloc_left--;
    return malloc(n);
}

static void *q_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (alloc_left == 0)
        return NULL;
    if (alloc_left > 0)
        alloc_left--;
    return realloc(p, n);
}

static void q_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(quota, out_of_memory_changes_nothing)
{
    kvidx_allocator_t a = {q_malloc, q_realloc, q_free, NULL};
    kvidx_set_allocator(&a);
    kvidx_index_t *idx = new_index(0);
    set_quota(idx, "a", 10);
    alloc_left = 0;
    kvidx_salt_quota_t q = {"a", 1, 20};
    cr_assert_eq(kvidx_index_set_quotas(idx, &q, 1), KVIDX_ENOMEM);
    alloc_left = -1;
    cr_assert_eq(usage(idx, "a").quota_bytes, 10);
    /* A new salt's account is the namespace's allocation that fails. */
    for (long n = 0; n < 12; n++) {
        alloc_left = n;
        kvidx_put_t p = {key("m", "s", (uint32_t)n), 5};
        int rc = kvidx_index_put_batch(idx, KVIDX_TIER_L1, &p, 1, NULL);
        alloc_left = -1;
        cr_assert(rc == 0 || rc == KVIDX_ENOMEM);
        cr_assert_eq(kvidx_index_check(idx), 0, "n=%ld", n);
        cr_assert_eq(usage(idx, "s").l1_keys, rc == 0 ? 1u : 0u);
        kvidx_del_outcome_t o;
        cr_assert_eq(kvidx_index_delete(idx, &p.key, KVIDX_TIER_ALL, 1, &o), 0);
    }
    kvidx_index_free(idx);
    kvidx_set_allocator(NULL);
}
