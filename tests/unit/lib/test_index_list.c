/*
 * Listing (docs/page_tokens.md): the order is kvidx_key_cmp's, every filter
 * combination returns exactly the matching keys, the scan budget is honoured,
 * and a paginated listing returns every key present throughout exactly once
 * and no key twice while keys are inserted, deleted and evicted between
 * pages (also when the resume key itself disappears).
 */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/index.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

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

static const char *salts[] = {"", "a", "b"};
static const char *models[] = {"m1", "m2", "m/3"};
static const uint32_t ranks[] = {0, 1, 0x02000001};

static kvidx_key_t rand_key(void)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    const char *s = salts[rndn(3)], *m = models[rndn(3)];
    k.salt = s;
    k.salt_len = (uint8_t)strlen(s);
    k.model = m;
    k.model_len = (uint16_t)strlen(m);
    k.kv_rank = ranks[rndn(3)];
    k.group = (uint16_t)rndn(3);
    k.hash_len = (uint8_t)(1 + rndn(3));
    for (int i = 0; i < k.hash_len; i++)
        k.hash[i] = (uint8_t)rndn(4); /* small alphabet: prefixes and ties */
    return k;
}

static kvidx_index_t *new_index(uint64_t l1cap)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.l1_capacity_bytes = l1cap;
    o.has_seed = 1;
    kvidx_index_t *idx = NULL;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    return idx;
}

static void put1(kvidx_index_t *idx, const kvidx_key_t *k, kvidx_tier_t tier)
{
    kvidx_put_t p = {*k, 10};
    int rc = kvidx_index_put_batch(idx, tier, &p, 1, NULL);
    cr_assert(rc == 0 || rc == KVIDX_ECAPACITY, "rc %d", rc);
}

/* Every key of the index, by brute force over a candidate list. */
typedef struct keyset {
    kvidx_key_buf_t *k;
    size_t n, cap;
} keyset_t;

/* A kvidx_key_buf_t points into itself: after it moves, re-aim it. */
static kvidx_key_t view(const kvidx_key_buf_t *b)
{
    kvidx_key_t k = b->key;
    k.model = b->model;
    k.salt = b->salt;
    return k;
}

static void ks_fix(keyset_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        s->k[i].key = view(&s->k[i]);
}

static void ks_add(keyset_t *s, const kvidx_key_t *k)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->k = realloc(s->k, s->cap * sizeof(*s->k));
        cr_assert_not_null(s->k);
        ks_fix(s);
    }
    kvidx_key_buf_set(&s->k[s->n++], k);
}

static int cmp_buf(const void *a, const void *b)
{
    kvidx_key_t x = view(a), y = view(b);
    return kvidx_key_cmp(&x, &y);
}

static int matches(kvidx_index_t *idx, const kvidx_key_t *k, const kvidx_list_filter_t *f)
{
    if (f->has_salt && (k->salt_len != f->salt_len || memcmp(k->salt, f->salt, f->salt_len)))
        return 0;
    if (f->has_model && (k->model_len != f->model_len || memcmp(k->model, f->model, f->model_len)))
        return 0;
    if (f->has_rank && k->kv_rank != f->kv_rank)
        return 0;
    if (f->has_group && k->group != f->group)
        return 0;
    kvidx_ref_t r;
    kvidx_entry_info_t info;
    if (kvidx_index_find(idx, k, &r))
        return 0;
    kvidx_index_info(idx, r, &info);
    int ready = info.l1_state == KVIDX_L1_READY;
    if (f->tier == KVIDX_TIER_L1 && !ready)
        return 0;
    if (f->tier == KVIDX_TIER_L2 && !info.l2)
        return 0;
    if (!ready && !info.l2)
        return 0; /* only a loading copy: nothing readable to list */
    return 1;
}

/* Lists everything matching f, checking each page's budget and order. */
static void list_all(kvidx_index_t *idx, const kvidx_list_filter_t *f, size_t page, size_t scan,
                     keyset_t *out)
{
    kvidx_key_buf_t resume;
    int have_after = 0, more = 1;
    kvidx_ref_t refs[64];
    int guard = 0;
    while (more) {
        size_t n = 0, examined = 0;
        cr_assert_eq(kvidx_index_list(idx, f, have_after ? &resume.key : NULL, page, scan, refs, &n,
                                      &resume, &more, &examined),
                     0);
        cr_assert_leq(n, page);
        cr_assert_leq(examined, scan);
        for (size_t i = 0; i < n; i++) {
            kvidx_key_t k;
            cr_assert_eq(kvidx_index_key(idx, refs[i], &k), 0);
            cr_assert(matches(idx, &k, f));
            ks_add(out, &k);
        }
        have_after = more;
        cr_assert_lt(++guard, 1000000);
    }
}

Test(index_list, order_and_every_filter)
{
    rng_state = 12345;
    kvidx_index_t *idx = new_index(0);
    keyset_t cand = {0};
    for (int i = 0; i < 1500; i++) {
        kvidx_key_t k = rand_key();
        put1(idx, &k, rndn(3) ? KVIDX_TIER_L2 : KVIDX_TIER_L1);
        cr_assert_eq(kvidx_index_check(idx), 0, "put %d", i);
        if (rndn(4) == 0) {
            put1(idx, &k, KVIDX_TIER_L1);
            cr_assert_eq(kvidx_index_check(idx), 0, "re-put %d", i);
        }
        ks_add(&cand, &k);
    }
    /* The distinct present keys, sorted: the reference. */
    qsort(cand.k, cand.n, sizeof(*cand.k), cmp_buf);
    ks_fix(&cand);
    keyset_t ref = {0};
    for (size_t i = 0; i < cand.n; i++)
        if (i == 0 || cmp_buf(&cand.k[i - 1], &cand.k[i]) != 0)
            ks_add(&ref, &cand.k[i].key);
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.keys, ref.n);

    static const size_t pages[] = {1, 7, 64};
    static const size_t scans[] = {1, 5, 0};
    int combos = 0;
    for (int fs = 0; fs < 4; fs++)             /* no salt, "", "a", "z" */
        for (int fm = 0; fm < 4; fm++)         /* no model, m1, m/3, "zz" */
            for (int fr = 0; fr < 3; fr++)     /* no rank, 1, 7 */
                for (int fg = 0; fg < 3; fg++) /* no group, 0, 2 */
                    for (int ft = 0; ft < 3; ft++) {
                        kvidx_list_filter_t f;
                        memset(&f, 0, sizeof(f));
                        static const char *fsv[] = {NULL, "", "a", "z"};
                        static const char *fmv[] = {NULL, "m1", "m/3", "zz"};
                        if (fs) {
                            f.has_salt = 1;
                            f.salt = fsv[fs];
                            f.salt_len = strlen(fsv[fs]);
                        }
                        if (fm) {
                            f.has_model = 1;
                            f.model = fmv[fm];
                            f.model_len = strlen(fmv[fm]);
                        }
                        if (fr) {
                            f.has_rank = 1;
                            f.kv_rank = fr == 1 ? 1 : 7;
                        }
                        if (fg) {
                            f.has_group = 1;
                            f.group = (uint16_t)(fg == 1 ? 0 : 2);
                        }
                        f.tier = ft == 0 ? KVIDX_TIER_ALL : ft == 1 ? KVIDX_TIER_L1 : KVIDX_TIER_L2;
                        keyset_t want = {0};
                        for (size_t i = 0; i < ref.n; i++)
                            if (matches(idx, &ref.k[i].key, &f))
                                ks_add(&want, &ref.k[i].key);
                        size_t pi = (size_t)combos % 3, si = (size_t)(combos / 3) % 3;
                        size_t page = pages[pi];
                        size_t scan = scans[si] ? scans[si] : 10 * page + 1000;
                        keyset_t got = {0};
                        list_all(idx, &f, page, scan, &got);
                        cr_assert_eq(got.n, want.n, "combo %d: %zu vs %zu", combos, got.n, want.n);
                        for (size_t i = 0; i < got.n; i++)
                            cr_assert_eq(kvidx_key_cmp(&got.k[i].key, &want.k[i].key), 0,
                                         "combo %d item %zu", combos, i);
                        free(got.k);
                        free(want.k);
                        combos++;
                    }
    free(cand.k);
    free(ref.k);
    kvidx_index_free(idx);
}

Test(index_list, budget_gives_short_pages_and_exact_end)
{
    kvidx_index_t *idx = new_index(0);
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = "m";
    k.model_len = 1;
    k.hash_len = 2;
    for (int i = 0; i < 100; i++) {
        k.group = (uint16_t)(i % 10);
        k.hash[0] = (uint8_t)i;
        put1(idx, &k, i == 99 ? KVIDX_TIER_L1 : KVIDX_TIER_L2);
    }
    cr_assert_eq(kvidx_index_check(idx), 0);
    /* Only the last key is in L1: with a budget of 10 the first pages are
     * empty but never claim the end. */
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    f.tier = KVIDX_TIER_L1;
    kvidx_key_buf_t resume;
    kvidx_ref_t refs[4];
    size_t n, ex;
    int more, pages = 0, have = 0;
    size_t total = 0;
    do {
        cr_assert_eq(kvidx_index_list(idx, &f, have ? &resume.key : NULL, 4, 10, refs, &n, &resume,
                                      &more, &ex),
                     0);
        cr_assert_leq(ex, 10);
        total += n;
        have = more;
        pages++;
    } while (more);
    cr_assert_eq(total, 1);
    cr_assert_eq(pages, 10);
    /* Group filter without rank seeks: examined keys stay near the matches. */
    memset(&f, 0, sizeof(f));
    f.has_group = 1;
    f.group = 3;
    kvidx_ref_t big[100];
    cr_assert_eq(kvidx_index_list(idx, &f, NULL, 100, 1000, big, &n, &resume, &more, &ex), 0);
    cr_assert_eq(n, 10);
    cr_assert_eq(more, 0);
    cr_assert_leq(ex, 12); /* one before, ten, one after */
    /* A page that is exactly full at the end reports the end. */
    memset(&f, 0, sizeof(f));
    cr_assert_eq(kvidx_index_list(idx, &f, NULL, 100, 1000, big, &n, &resume, &more, &ex), 0);
    cr_assert_eq(n, 100);
    cr_assert_eq(more, 0);
    cr_assert_eq(kvidx_index_list(idx, &f, NULL, 0, 10, big, &n, &resume, &more, &ex),
                 KVIDX_EINVAL);
    kvidx_index_free(idx);
}

Test(index_list, guarantee_under_mutation)
{
    rng_state = 777;
    for (int round = 0; round < 1500; round++) {
        kvidx_index_t *idx = new_index(200 + rndn(400));
        keyset_t stable = {0}, other = {0};
        int nst = (int)rndn(120);
        for (int i = 0; i < nst; i++) {
            kvidx_key_t k = rand_key();
            put1(idx, &k, KVIDX_TIER_L2);
            cr_assert_eq(kvidx_index_check(idx), 0, "round %d", round);
            ks_add(&stable, &k);
        }
        /* Stable keys stay in L2 throughout; L1 copies of them may come and go. */
        if (stable.n)
            qsort(stable.k, stable.n, sizeof(*stable.k), cmp_buf);
        size_t w = 0;
        for (size_t i = 0; i < stable.n; i++)
            if (i == 0 || cmp_buf(&stable.k[i - 1], &stable.k[i]) != 0)
                stable.k[w++] = stable.k[i];
        stable.n = w;
        ks_fix(&stable);
        for (int i = 0; i < 60; i++) {
            kvidx_key_t k = rand_key();
            kvidx_ref_t r;
            if (kvidx_index_find(idx, &k, &r) == 0)
                continue; /* would be stable */
            put1(idx, &k, KVIDX_TIER_L1);
            cr_assert_eq(kvidx_index_check(idx), 0, "round %d", round);
            ks_add(&other, &k);
        }
        kvidx_list_filter_t f;
        memset(&f, 0, sizeof(f));
        if (rndn(4) == 0) {
            f.has_salt = 1;
            f.salt = salts[rndn(3)];
            f.salt_len = strlen(f.salt);
        }
        size_t *seen = calloc(stable.n + 1, sizeof(size_t));
        keyset_t got = {0};
        kvidx_key_buf_t resume;
        kvidx_ref_t refs[32];
        int more = 1, have = 0;
        while (more) {
            size_t page = 1 + rndn(8), n = 0, ex = 0;
            size_t scan = rndn(3) ? 10 * page + 1000 : 1 + rndn(4);
            cr_assert_eq(kvidx_index_list(idx, &f, have ? &resume.key : NULL, page, scan, refs, &n,
                                          &resume, &more, &ex),
                         0);
            for (size_t i = 0; i < n; i++) {
                kvidx_key_t k;
                cr_assert_eq(kvidx_index_key(idx, refs[i], &k), 0);
                if (got.n)
                    cr_assert_gt(kvidx_key_cmp(&k, &got.k[got.n - 1].key), 0,
                                 "round %d: out of order or twice", round);
                ks_add(&got, &k);
            }
            have = more;
            /* Mutate: inserts anywhere (before and after the cursor), deletes
             * of non-stable keys (the resume key too), L1 stores that evict. */
            int muts = (int)rndn(6);
            for (int m = 0; m < muts; m++) {
                uint32_t op = rndn(4);
                if (op == 0 || !other.n) {
                    kvidx_key_t k = rand_key();
                    kvidx_ref_t r;
                    if (kvidx_index_find(idx, &k, &r) == 0)
                        continue;
                    put1(idx, &k, rndn(2) ? KVIDX_TIER_L1 : KVIDX_TIER_L2);
                    ks_add(&other, &k);
                } else if (op == 1) {
                    const kvidx_key_t *k = &other.k[rndn((uint32_t)other.n)].key;
                    kvidx_del_outcome_t o;
                    kvidx_index_delete(idx, k, KVIDX_TIER_ALL, 1, &o);
                } else if (op == 2 && have) {
                    kvidx_ref_t r;
                    kvidx_del_outcome_t o;
                    if (kvidx_index_find(idx, &resume.key, &r) == 0) {
                        int is_stable = stable.n && bsearch(&resume, stable.k, stable.n,
                                                            sizeof(*stable.k), cmp_buf) != NULL;
                        if (!is_stable)
                            kvidx_index_delete(idx, &resume.key, KVIDX_TIER_ALL, 1, &o);
                    }
                } else {
                    /* L1 copies of stable keys: evictable, never forgetting them. */
                    if (stable.n)
                        put1(idx, &stable.k[rndn((uint32_t)stable.n)].key, KVIDX_TIER_L1);
                }
                cr_assert_eq(kvidx_index_check(idx), 0, "round %d mutation %d", round, m);
            }
        }
        for (size_t i = 0; i < got.n; i++) {
            kvidx_key_buf_t *hit =
                stable.n ? bsearch(&got.k[i], stable.k, stable.n, sizeof(*stable.k), cmp_buf)
                         : NULL;
            if (hit)
                seen[hit - stable.k]++;
        }
        for (size_t i = 0; i < stable.n; i++) {
            int in_filter = !f.has_salt || (stable.k[i].key.salt_len == f.salt_len &&
                                            !memcmp(stable.k[i].key.salt, f.salt, f.salt_len));
            cr_assert_eq(seen[i], (size_t)in_filter, "round %d stable key %zu seen %zu", round, i,
                         seen[i]);
        }
        free(seen);
        free(got.k);
        free(stable.k);
        free(other.k);
        kvidx_index_free(idx);
    }
}

/* A model filter without a salt passes over every other namespace; those
 * count against max_scan, so a page stays bounded with many salts. */
Test(index_list, model_filter_over_many_salts_is_bounded)
{
    kvidx_index_t *idx = new_index(0);
    static char salts_buf[3000][8];
    for (int i = 0; i < 3000; i++) {
        snprintf(salts_buf[i], sizeof(salts_buf[i]), "s%04d", i);
        kvidx_key_t k;
        memset(&k, 0, sizeof(k));
        k.salt = salts_buf[i];
        k.salt_len = 5;
        k.model = i == 2999 ? "b" : "a";
        k.model_len = 1;
        k.hash_len = 1;
        k.hash[0] = 7;
        put1(idx, &k, KVIDX_TIER_L2);
    }
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    f.has_model = 1;
    f.model = "b";
    f.model_len = 1;
    kvidx_key_buf_t resume;
    kvidx_ref_t refs[8];
    size_t n = 0, examined = 0, pages = 0, found = 0;
    int more = 1, have_after = 0;
    while (more) {
        cr_assert_eq(kvidx_index_list(idx, &f, have_after ? &resume.key : NULL, 8, 100, refs, &n,
                                      &resume, &more, &examined),
                     0);
        cr_assert_leq(examined, 100);
        found += n;
        have_after = more;
        cr_assert_lt(++pages, 100, "the listing must progress");
    }
    cr_assert_eq(found, 1);
    cr_assert_geq(pages, 30, "3000 namespaces at 100 per page need at least 30 pages");
    kvidx_index_free(idx);
}

/* A loading L1 copy is not readable: tier=l1 does not list it. */
Test(index_list, loading_copies_are_not_listed_as_l1)
{
    kvidx_index_t *idx = new_index(0);
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = "m";
    k.model_len = 1;
    k.hash_len = 1;
    put1(idx, &k, KVIDX_TIER_L2);
    kvidx_ref_t ref;
    uint64_t gen = 0;
    cr_assert_eq(kvidx_index_find(idx, &k, &ref), 0);
    cr_assert_eq(kvidx_index_l1_reserve(idx, ref, 1, &gen), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    f.tier = KVIDX_TIER_L1;
    kvidx_key_buf_t resume;
    kvidx_ref_t refs[4];
    size_t n = 9;
    int more = 1;
    cr_assert_eq(kvidx_index_list(idx, &f, NULL, 4, 100, refs, &n, &resume, &more, NULL), 0);
    cr_assert_eq(n, 0, "a loading copy is not an L1 key yet");
    cr_assert_eq(kvidx_index_l1_load_done(idx, ref, gen, 1), 0);
    cr_assert_eq(kvidx_index_check(idx), 0);
    cr_assert_eq(kvidx_index_list(idx, &f, NULL, 4, 100, refs, &n, &resume, &more, NULL), 0);
    cr_assert_eq(n, 1, "once loaded it is");
    kvidx_index_free(idx);
}
