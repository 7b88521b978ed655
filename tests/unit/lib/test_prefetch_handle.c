/*
 * kvidx/prefetch_handle.h: the worked example of docs/prefetch.md on a real index,
 * and a randomized run that interleaves prefetches (LOOKUP and WARM, every
 * policy, shared single-flight loads that succeed or fail), releases,
 * expiries, evicting stores and (forced) deletes, and after every step
 * checks each key's pin count in the index against a reference model:
 * no pin ever outlives its handle.
 */
#include "small_index.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/prefetch_handle.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define NK 8 /* keys in the universe */

static kvidx_index_t *idx;
static kvidx_key_t uni[NK];

static void mk_index(uint64_t l1_cap)
{
    cr_assert_eq(small_index_new(l1_cap, &idx, uni, NK), 0);
}

static int store(kvidx_tier_t tier, int k)
{
    kvidx_put_t p = {uni[k], 10};
    return kvidx_index_put_batch(idx, tier, &p, 1, NULL);
}

static kvidx_entry_info_t info(int k)
{
    kvidx_entry_info_t in;
    kvidx_ref_t ref;
    memset(&in, 0, sizeof(in));
    if (kvidx_index_find(idx, &uni[k], &ref) == 0)
        kvidx_index_info(idx, ref, &in);
    return in;
}

/* Runs every load of h to completion at once with the given failures. */
static void load_all(kvidx_pfh_t *h, const int *fail)
{
    for (size_t j = 0; j < h->plan.n_l2_orig; j++) {
        size_t i = h->plan.l2_orig[j];
        uint64_t gen = 0;
        kvidx_pfh_load_t r = kvidx_pfh_start_load(h, idx, i, 1, &gen);
        cr_assert_eq(r, KVIDX_PFH_LOAD_NEW);
        int ok = !fail[i];
        kvidx_pfh_load_result(h, idx, i, gen, ok);
        cr_assert_eq(kvidx_index_l1_load_done(idx, h->keys[i].ref, gen, ok), 0);
    }
    cr_assert_eq(kvidx_pfh_complete(h, idx), 0);
}

Test(prefetch_handle, worked_example)
{
    static const kvidx_trim_policy_t pol[] = {KVIDX_TRIM_PREFIX, KVIDX_TRIM_SEGMENTED_PREFIX,
                                              KVIDX_TRIM_SPARSE};
    static const size_t want_retained[] = {2, 4, 4};
    for (int p = 0; p < 3; p++) {
        mk_index(0);
        int l1[] = {0, 1, 3}, l2[] = {2, 3, 4};
        for (int i = 0; i < 3; i++)
            cr_assert_eq(store(KVIDX_TIER_L2, l2[i]), 0);
        for (int i = 0; i < 3; i++)
            cr_assert_eq(store(KVIDX_TIER_L1, l1[i]), 0);
        kvidx_pfh_t h;
        cr_assert_eq(kvidx_pfh_open(&h, idx, uni, 6, KVIDX_PF_LOOKUP, pol[p], 1, NULL), 0);
        cr_assert_eq(h.plan.n_l1_found, 3);
        cr_assert_eq(h.plan.n_l2_orig, 2);
        cr_assert_eq(info(0).pins, 2);
        int fail[6] = {0, 0, 1, 0, 0, 0};
        load_all(&h, fail);
        cr_assert_eq(h.result.n_retained, want_retained[p]);
        cr_assert_eq(info(3).pins, p == 0 ? 0 : 2);
        cr_assert_eq(info(4).l1_state, p == 0 ? KVIDX_L1_NONE : KVIDX_L1_READY);
        /* release one reader of key 0; asking for three more is a conflict */
        uint32_t i0[] = {0}, i000[] = {0, 0, 0}, out[] = {9};
        cr_assert_eq(kvidx_pfh_release(&h, idx, i0, 1, NULL), 0);
        cr_assert_eq(info(0).pins, 1);
        size_t bad = 99;
        cr_assert_eq(kvidx_pfh_release(&h, idx, i000, 3, &bad), KVIDX_ECONFLICT);
        cr_assert_eq(bad, 1);
        cr_assert_eq(kvidx_pfh_release(&h, idx, out, 1, &bad), KVIDX_EINVAL);
        cr_assert_eq(info(0).pins, 1);
        kvidx_pfh_end(&h, idx, KVIDX_PFH_EXPIRED);
        for (int k = 0; k < 6; k++)
            cr_assert_eq(info(k).pins, 0);
        cr_assert_eq(h.pins, 0);
        kvidx_pfh_close(&h, idx);
        kvidx_index_free(idx);
    }
}

Test(prefetch_handle, forced_delete_is_lost_not_unpinned)
{
    mk_index(0);
    cr_assert_eq(store(KVIDX_TIER_L1, 0), 0);
    kvidx_pfh_t h;
    cr_assert_eq(kvidx_pfh_open(&h, idx, uni, 1, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, 0, NULL), 0);
    cr_assert_eq(kvidx_pfh_complete(&h, idx), 0);
    kvidx_del_outcome_t out;
    cr_assert_eq(kvidx_index_delete(idx, &uni[0], KVIDX_TIER_ALL, 1, &out), 0);
    cr_assert_eq(store(KVIDX_TIER_L1, 0), 0); /* a new copy, maybe the same ref */
    uint32_t i0[] = {0};
    cr_assert_eq(kvidx_pfh_release(&h, idx, i0, 1, NULL), KVIDX_ECONFLICT);
    cr_assert(h.keys[0].lost);
    kvidx_pfh_end(&h, idx, KVIDX_PFH_RELEASED);
    cr_assert_eq(info(0).l1_state, KVIDX_L1_READY);
    kvidx_pfh_close(&h, idx);
    kvidx_index_free(idx);
}

/* ---- randomized ---- */

#define NH   16
#define NL   64
#define MAXN 6

struct mh {
    int live;
    kvidx_pfh_t h;
    int key[MAXN];
    uint32_t pins[MAXN]; /* what the model says the handle holds */
    uint8_t lost[MAXN];  /* its pinned copy was force-deleted */
};

struct ml {
    int live;
    kvidx_ref_t ref;
    uint64_t gen;
    int nw;
    int wh[NH * MAXN];    /* waiting handle slot */
    size_t wi[NH * MAXN]; /* its key index */
};

static struct mh H[NH];
static struct ml L[NL];
static uint64_t rng = 0x2545f4914f6cdd1dULL;
static int last_op;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static struct ml *load_of(kvidx_ref_t ref, uint64_t gen)
{
    for (int l = 0; l < NL; l++)
        if (L[l].live && L[l].ref == ref && L[l].gen == gen)
            return &L[l];
    return NULL;
}

/* Model: a completed handle holds 1 + extra on retained keys. */
static void model_complete(struct mh *m)
{
    for (size_t i = 0; i < m->h.n; i++)
        m->pins[i] =
            m->h.has_result && m->h.result.retained_map[i] && !m->lost[i] ? 1 + m->h.extra : 0;
}

static void check(int step)
{
    uint32_t want[NK] = {0};
    for (int s = 0; s < NH; s++) {
        if (!H[s].live)
            continue;
        uint64_t sum = 0;
        for (size_t i = 0; i < H[s].h.n; i++) {
            want[H[s].key[i]] += H[s].pins[i];
            sum += H[s].h.keys[i].pins;
            cr_assert_eq(H[s].h.keys[i].pins, H[s].pins[i],
                         "step %d: handle %d key %zu: %u vs model %u, status %d mode %d lost %d "
                         "failed %d waiting %d op %d key %d",
                         step, s, i, H[s].h.keys[i].pins, H[s].pins[i], H[s].h.status, H[s].h.mode,
                         H[s].h.keys[i].lost, H[s].h.keys[i].failed, H[s].h.keys[i].waiting,
                         last_op, H[s].key[i], i);
        }
        cr_assert_eq(sum, H[s].h.pins, "step %d: ledger total", step);
        if (H[s].h.status >= KVIDX_PFH_RELEASED)
            cr_assert_eq(H[s].h.pins, 0, "step %d: an ended handle holds pins", step);
    }
    for (int k = 0; k < NK; k++) {
        kvidx_entry_info_t in = info(k);
        cr_assert_eq(in.pins, want[k], "step %d: key %d has %u pins, model %u", step, k, in.pins,
                     want[k]);
        if (want[k])
            cr_assert_eq(in.l1_state, KVIDX_L1_READY, "step %d", step);
    }
}

static void op_open(void)
{
    int s = (int)rnd(NH);
    if (H[s].live)
        return;
    struct mh *m = &H[s];
    kvidx_key_t keys[MAXN];
    size_t n = 1 + rnd(MAXN);
    for (size_t i = 0; i < n; i++) {
        m->key[i] = (int)rnd(NK);
        keys[i] = uni[m->key[i]];
    }
    kvidx_prefetch_mode_t mode = rnd(5) ? KVIDX_PF_LOOKUP : KVIDX_PF_WARM;
    uint32_t extra = rnd(3);
    cr_assert_eq(
        kvidx_pfh_open(&m->h, idx, keys, n, mode, (kvidx_trim_policy_t)rnd(3), extra, NULL), 0);
    m->live = 1;
    memset(m->pins, 0, sizeof(m->pins));
    memset(m->lost, 0, sizeof(m->lost));
    for (size_t j = 0; j < m->h.plan.n_l1_found; j++)
        m->pins[m->h.plan.l1_found[j]] = 1 + m->h.extra;
    for (size_t j = 0; j < m->h.plan.n_l2_orig; j++) {
        size_t i = m->h.plan.l2_orig[j];
        uint64_t gen = 0;
        kvidx_pfh_load_t r = kvidx_pfh_start_load(&m->h, idx, i, mode == KVIDX_PF_LOOKUP, &gen);
        struct ml *l = NULL;
        if (r == KVIDX_PFH_LOAD_NEW) {
            for (int q = 0; q < NL && !l; q++)
                if (!L[q].live)
                    l = &L[q];
            cr_assert_not_null(l, "too many loads");
            memset(l, 0, sizeof(*l));
            l->live = 1;
            l->ref = m->h.keys[i].ref;
            l->gen = gen;
        } else if (r == KVIDX_PFH_LOAD_JOIN) {
            l = load_of(m->h.keys[i].ref, gen);
            cr_assert_not_null(l, "joined a load nobody started");
        } else if (r == KVIDX_PFH_LOAD_READY) {
            m->pins[i] = 1 + m->h.extra;
        }
        if (l) {
            l->wh[l->nw] = s;
            l->wi[l->nw++] = i;
        }
    }
    if (m->h.waiting == 0) {
        cr_assert_eq(kvidx_pfh_complete(&m->h, idx), 0);
        model_complete(m);
    }
}

static void finish_load(struct ml *l, int ok)
{
    kvidx_entry_info_t in;
    int mine = kvidx_index_info(idx, l->ref, &in) == 0 && in.l1_state == KVIDX_L1_LOADING &&
               in.generation == l->gen;
    ok = ok && mine;
    int done[NH] = {0}, waiters = 0;
    for (int w = 0; w < l->nw; w++) {
        struct mh *m = &H[l->wh[w]];
        if (!m->live || !m->h.keys[l->wi[w]].waiting)
            continue;
        waiters++;
        if (kvidx_pfh_load_result(&m->h, idx, l->wi[w], l->gen, ok))
            done[l->wh[w]] = 1;
        if (ok && m->h.mode == KVIDX_PF_LOOKUP)
            m->pins[l->wi[w]] = 1 + m->h.extra;
    }
    if (mine)
        cr_assert_eq(kvidx_index_l1_load_done(idx, l->ref, l->gen, ok && waiters), 0);
    l->live = 0;
    for (int s = 0; s < NH; s++) {
        if (done[s] && H[s].live && H[s].h.status == KVIDX_PFH_PENDING) {
            cr_assert_eq(kvidx_pfh_complete(&H[s].h, idx), 0);
            model_complete(&H[s]);
        }
    }
}

static void op_finish_load(void)
{
    struct ml *l = &L[rnd(NL)];
    if (l->live)
        finish_load(l, rnd(4) != 0);
}

/* A handle that ends stops waiting: its slot may be reused. */
static void forget_waiters(int s)
{
    for (int q = 0; q < NL; q++) {
        for (int w = 0; L[q].live && w < L[q].nw;) {
            if (L[q].wh[w] == s) {
                L[q].wh[w] = L[q].wh[L[q].nw - 1];
                L[q].wi[w] = L[q].wi[L[q].nw - 1];
                L[q].nw--;
            } else {
                w++;
            }
        }
    }
}

static struct mh *pick(void)
{
    struct mh *m = &H[rnd(NH)];
    return m->live ? m : NULL;
}

static void op_release(void)
{
    struct mh *m = pick();
    if (!m)
        return;
    if (rnd(3) == 0) {
        int rc = kvidx_pfh_release(&m->h, idx, NULL, 0, NULL);
        if (m->h.status == KVIDX_PFH_PENDING) {
            cr_assert_eq(rc, KVIDX_ECONFLICT);
            return;
        }
        if (rc == 0)
            for (size_t i = 0; i < m->h.n; i++)
                if (m->h.result.retained_map[i] && m->pins[i] && !m->h.keys[i].lost)
                    m->pins[i]--;
        return;
    }
    uint32_t ind[3];
    size_t n = 1 + rnd(3);
    uint32_t want[MAXN] = {0};
    int expect = 0;
    for (size_t j = 0; j < n; j++) {
        ind[j] = rnd((uint32_t)m->h.n + 1); /* sometimes out of range */
        if (ind[j] >= m->h.n)
            expect = KVIDX_EINVAL;
    }
    for (size_t j = 0; j < n && !expect; j++)
        if (m->h.status != KVIDX_PFH_COMPLETED || !m->h.result.retained_map[ind[j]] ||
            ++want[ind[j]] > m->pins[ind[j]])
            expect = KVIDX_ECONFLICT;
    if (m->h.status != KVIDX_PFH_COMPLETED)
        expect = KVIDX_ECONFLICT;
    int rc = kvidx_pfh_release(&m->h, idx, ind, n, NULL);
    cr_assert_eq(rc, expect);
    if (rc == 0)
        for (size_t j = 0; j < n; j++)
            m->pins[ind[j]]--;
}

static void op_end(void)
{
    struct mh *m = pick();
    if (!m)
        return;
    kvidx_pfh_end(&m->h, idx, rnd(2) ? KVIDX_PFH_EXPIRED : KVIDX_PFH_RELEASED);
    memset(m->pins, 0, sizeof(m->pins));
    forget_waiters((int)(m - H));
    if (rnd(2)) {
        kvidx_pfh_close(&m->h, idx);
        m->live = 0;
    }
}

static void op_delete(void)
{
    int k = (int)rnd(NK), force = (int)rnd(2);
    kvidx_tier_t tier = (kvidx_tier_t)(1 + rnd(3));
    kvidx_del_outcome_t out;
    cr_assert_eq(kvidx_index_delete(idx, &uni[k], tier, force, &out), 0);
    if (!force || tier == KVIDX_TIER_L2 || out != KVIDX_DEL_DELETED)
        return;
    for (int s = 0; s < NH; s++)
        for (size_t i = 0; H[s].live && i < H[s].h.n; i++)
            if (H[s].key[i] == k && H[s].pins[i]) {
                H[s].pins[i] = 0;
                H[s].lost[i] = 1;
            }
    /* the handle learns it lazily; the ledger is checked after a refresh */
    for (int s = 0; s < NH; s++)
        if (H[s].live)
            kvidx_pfh_refresh(&H[s].h, idx);
}

Test(prefetch_handle, randomized_no_pin_outlives_its_handle)
{
    mk_index(50);
    memset(H, 0, sizeof(H));
    memset(L, 0, sizeof(L));
    uint64_t completed = 0, lost = 0;
    for (int step = 0; step < 20000; step++) {
        last_op = (int)rnd(9);
        switch (last_op) {
        case 0:
        case 1:
            (void)store(rnd(2) ? KVIDX_TIER_L1 : KVIDX_TIER_L2, (int)rnd(NK));
            break;
        case 2:
        case 3:
            op_open();
            break;
        case 4:
            op_finish_load();
            break;
        case 5:
            op_release();
            break;
        case 6:
            op_end();
            break;
        case 7:
            op_delete();
            break;
        default:
            op_finish_load();
            break;
        }
        for (int s = 0; s < NH; s++) {
            completed += H[s].live && H[s].h.status == KVIDX_PFH_COMPLETED;
            for (size_t i = 0; H[s].live && i < H[s].h.n; i++)
                lost += H[s].h.keys[i].lost;
        }
        check(step);
    }
    for (int l = 0; l < NL; l++)
        if (L[l].live)
            finish_load(&L[l], 1);
    check(-2);
    for (int s = 0; s < NH; s++) {
        if (H[s].live) {
            kvidx_pfh_end(&H[s].h, idx, KVIDX_PFH_EXPIRED);
            memset(H[s].pins, 0, sizeof(H[s].pins));
            check(-1);
            kvidx_pfh_close(&H[s].h, idx);
            H[s].live = 0;
        }
    }
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    cr_assert_eq(st.l1_pins, 0, "pins outlived every handle");
    cr_assert_gt(st.evictions, 100);
    cr_assert_gt(completed, 1000);
    cr_assert_gt(lost, 10);
    kvidx_index_free(idx);
}
