/*
 * kvidx/prefetch_table.h on a real index: leases (expiry, the grace period,
 * then forgotten), single-flight loads shared by handles, task deadlines,
 * the id and wait_ms parsers, a randomized run checked against a simple
 * reference of handle lifetimes and task deadlines, and the same kind of
 * workload with the Nth allocation failing for every N.
 */
#include "small_index.h"
#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/prefetch_table.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NK 8 /* keys in the universe */

static kvidx_index_t *idx;
static kvidx_key_t uni[NK];
static int gone_calls, changed_calls;

static void on_gone(void *ctx, kvidx_pft_handle_t *h)
{
    (void)ctx;
    (void)h;
    gone_calls++;
}

static void on_changed(void *ctx, kvidx_pft_handle_t *h)
{
    (void)ctx;
    (void)h;
    changed_calls++;
}

static const kvidx_pft_events_t events = {NULL, on_changed, on_gone, NULL};

static void mk_index(uint64_t l1_cap)
{
    cr_assert_eq(small_index_new(l1_cap, &idx, uni, NK), 0);
    gone_calls = changed_calls = 0;
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

/* L1 holds 0, 1, 3; L2 holds 2, 3, 4; 5 is nowhere. */
static void example(void)
{
    static const int l1[] = {0, 1, 3}, l2[] = {2, 3, 4};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(store(KVIDX_TIER_L2, l2[i]), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(store(KVIDX_TIER_L1, l1[i]), 0);
}

static kvidx_pft_submit_t lookup6(uint64_t lease_ms, uint32_t extra)
{
    kvidx_pft_submit_t s;
    memset(&s, 0, sizeof(s));
    s.keys = uni;
    s.n = 6;
    s.mode = KVIDX_PF_LOOKUP;
    s.policy = KVIDX_TRIM_PREFIX;
    s.extra = extra;
    s.lease_ms = lease_ms;
    s.temporary = 1;
    return s;
}

static uint64_t index_pins(void)
{
    uint64_t n = 0;
    for (int k = 0; k < NK; k++)
        n += info(k).pins;
    return n;
}

static size_t index_loading(void)
{
    size_t n = 0;
    for (int k = 0; k < NK; k++)
        n += info(k).l1_state == KVIDX_L1_LOADING;
    return n;
}

/* What must hold between any two calls: the table's pins are the index's,
 * every loading copy has exactly one load, and that load is open in a task. */
static void check_consistent(const kvidx_pft_t *t)
{
    kvidx_pft_stats_t st;
    kvidx_pft_stats(t, &st);
    cr_assert_eq(st.pins, index_pins(), "pins: table %llu, index %llu", (unsigned long long)st.pins,
                 (unsigned long long)index_pins());
    cr_assert_eq(st.loads, index_loading());
    size_t open = 0, tasks = 0;
    for (const kvidx_pft_task_t *k = kvidx_pft_task_first(t); k; k = kvidx_pft_task_next(k)) {
        cr_assert_gt(k->open, 0, "a task with no open load is kept");
        size_t o = 0;
        for (size_t p = 0; p < k->n; p++) {
            kvidx_ref_t ref;
            if (kvidx_pft_task_ref(k, p, &ref) != 0)
                continue;
            kvidx_entry_info_t in;
            cr_assert_eq(kvidx_index_info(idx, ref, &in), 0);
            cr_assert_eq(in.l1_state, KVIDX_L1_LOADING);
            o++;
        }
        cr_assert_eq(o, k->open);
        open += o;
        tasks++;
    }
    cr_assert_eq(open, st.loads);
    cr_assert_eq(tasks, st.tasks);
}

Test(prefetch_table, lease_expiry_then_410_then_404)
{
    mk_index(0);
    example();
    kvidx_pft_t *t;
    cr_assert_eq(kvidx_pft_new(&t, idx, &events, 0), 0);
    kvidx_pft_set_times(t, 60, 1000);
    kvidx_pft_submit_t s = lookup6(40, 0);
    kvidx_pft_handle_t *h;
    uint64_t task = 0, at = 0;
    cr_assert_eq(kvidx_pft_submit(t, &s, 100, &h, &task), 0);
    cr_assert_eq(h->id, 1);
    cr_assert_neq(task, 0, "keys 2 and 4 load");
    cr_assert_eq(kvidx_pft_task_finish(t, task, 0, 1), 0);
    cr_assert_eq(kvidx_pft_task_finish(t, task, 1, 1), 0);
    cr_assert_eq(kvidx_pft_task_finish(t, task, 1, 1), KVIDX_ENOTFOUND, "finished already");
    cr_assert_eq(h->pfh.status, KVIDX_PFH_COMPLETED);
    cr_assert_eq(info(0).pins, 1);
    cr_assert_eq(kvidx_pft_next_deadline(t, &at), 0);
    cr_assert_eq(at, 140);
    kvidx_pft_advance(t, 139);
    cr_assert_eq(h->pfh.status, KVIDX_PFH_COMPLETED);
    kvidx_pft_advance(t, 140);
    cr_assert_eq(kvidx_pft_find(t, 1, &h), KVIDX_EHANDLEEXPIRED);
    cr_assert_eq(h->pfh.status, KVIDX_PFH_EXPIRED);
    cr_assert_eq(index_pins(), 0, "expiry gives the pins back");
    cr_assert_eq(info(2).l1_state, KVIDX_L1_NONE, "the temporary copy went with its pin");
    cr_assert_eq(kvidx_pft_delete(t, 1, 150), 0, "DELETE of an expired handle is fine");
    cr_assert_eq(kvidx_pft_extend(t, h, 150, 10), KVIDX_EHANDLEEXPIRED);
    kvidx_pft_advance(t, 199);
    cr_assert_eq(kvidx_pft_find(t, 1, &h), KVIDX_EHANDLEEXPIRED, "within the grace period");
    kvidx_pft_advance(t, 200);
    cr_assert_eq(kvidx_pft_find(t, 1, &h), KVIDX_ENOTFOUND);
    cr_assert_null(h);
    cr_assert_eq(gone_calls, 1);
    cr_assert_eq(kvidx_pft_delete(t, 1, 300), 0, "repeated DELETE stays fine");
    cr_assert_eq(kvidx_pft_delete(t, 2, 300), KVIDX_ENOTFOUND, "never issued");
    cr_assert_eq(kvidx_pft_delete(t, 0, 300), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_pft_next_deadline(t, &at), KVIDX_ENOTFOUND);
    kvidx_pft_stats_t st;
    kvidx_pft_stats(t, &st);
    cr_assert_eq(st.counters[KVIDX_PFT_EXPIRATIONS], 1);
    cr_assert_eq(st.counters[KVIDX_PFT_LOADS], 2);
    cr_assert_eq(st.counters[KVIDX_PFT_LOADS_COMPLETED], 2);
    kvidx_pft_free(t);
    kvidx_index_free(idx);
}

Test(prefetch_table, release_extend_and_grace)
{
    mk_index(0);
    example();
    kvidx_pft_t *t;
    cr_assert_eq(kvidx_pft_new(&t, idx, &events, 1000), 0);
    kvidx_pft_set_times(t, 5, 1000);
    kvidx_pft_submit_t s = lookup6(50, 0);
    kvidx_pft_handle_t *h, *f;
    uint64_t task = 0;
    cr_assert_eq(kvidx_pft_submit(t, &s, 0, &h, &task), 0);
    cr_assert_eq(h->id, 1001, "ids start after first_id");
    cr_assert_eq(kvidx_pft_delete(t, 7, 0), 0, "an id from before first_id is idempotent");
    cr_assert_eq(kvidx_pft_release(t, h, 0, NULL, 0, NULL), KVIDX_ECONFLICT, "pending");
    kvidx_pft_advance(t, 1000); /* the lease ends before the loads */
    cr_assert_eq(h->pfh.status, KVIDX_PFH_EXPIRED);
    cr_assert_eq(kvidx_pft_find(t, 1001, &f), KVIDX_EHANDLEEXPIRED);
    cr_assert_eq(kvidx_pft_task_find(t, task), NULL, "the task timed out at 1000 too");
    cr_assert_eq(index_loading(), 0);
    kvidx_pft_advance(t, 1005);
    cr_assert_eq(kvidx_pft_find(t, 1001, &f), KVIDX_ENOTFOUND);

    cr_assert_eq(kvidx_pft_submit(t, &s, 2000, &h, &task), 0);
    cr_assert_eq(kvidx_pft_extend(t, h, 2010, 500), 0);
    cr_assert_eq(h->expires_at, 2510);
    cr_assert_eq(kvidx_pft_task_finish(t, task, 0, 0), 0); /* key 2 fails */
    cr_assert_eq(kvidx_pft_task_finish(t, task, 1, 1), 0);
    cr_assert_eq(h->pfh.status, KVIDX_PFH_COMPLETED);
    kvidx_pft_advance(t, 2100);
    cr_assert_eq(h->pfh.status, KVIDX_PFH_COMPLETED, "extended");
    cr_assert_eq(kvidx_pft_release(t, h, 2200, NULL, 0, NULL), 0);
    cr_assert_eq(h->pfh.status, KVIDX_PFH_RELEASED);
    cr_assert_eq(kvidx_pft_extend(t, h, 2200, 10), KVIDX_ECONFLICT);
    cr_assert_eq(kvidx_pft_find(t, h->id, &f), 0, "a released handle answers");
    cr_assert_eq(index_pins(), 0);
    kvidx_pft_advance(t, 2205);
    cr_assert_eq(kvidx_pft_find(t, 1002, &f), KVIDX_ENOTFOUND);
    kvidx_pft_free(t);
    kvidx_index_free(idx);
}

Test(prefetch_table, single_flight_load_shared_by_handles)
{
    mk_index(0);
    example();
    kvidx_pft_t *t;
    cr_assert_eq(kvidx_pft_new(&t, idx, &events, 0), 0);
    kvidx_pft_set_times(t, 0, 1000);
    kvidx_pft_submit_t sa = lookup6(1000, 2), sb = lookup6(1000, 0);
    kvidx_pft_handle_t *a, *b;
    uint64_t ta = 0, tb = 0;
    cr_assert_eq(kvidx_pft_submit(t, &sa, 0, &a, &ta), 0);
    cr_assert_eq(kvidx_pft_submit(t, &sb, 0, &b, &tb), 0);
    cr_assert_neq(ta, 0);
    cr_assert_eq(tb, 0, "b joins a's loads: no task of its own");
    kvidx_pft_stats_t st;
    kvidx_pft_stats(t, &st);
    cr_assert_eq(st.loads, 2);
    cr_assert_eq(st.tasks, 1);
    cr_assert_eq(st.handles_pending, 2);
    check_consistent(t);
    cr_assert_eq(kvidx_pft_task_finish(t, ta, 0, 1), 0);
    cr_assert_eq(info(2).pins, 3 + 1, "both pin the copy before it turns ready");
    cr_assert_eq(info(2).l1_state, KVIDX_L1_READY);
    cr_assert_eq(a->pfh.status, KVIDX_PFH_PENDING);
    int before = changed_calls;
    cr_assert_eq(kvidx_pft_task_finish(t, ta, 1, 1), 0);
    cr_assert_eq(a->pfh.status, KVIDX_PFH_COMPLETED);
    cr_assert_eq(b->pfh.status, KVIDX_PFH_COMPLETED);
    cr_assert_eq(changed_calls, before + 2);
    cr_assert_null(kvidx_pft_task_find(t, ta), "the task went with its last load");
    check_consistent(t);
    /* a goes: b keeps its pins */
    cr_assert_eq(kvidx_pft_delete(t, a->id, 10), 0);
    cr_assert_eq(info(0).pins, 1);
    kvidx_pft_advance(t, 10);
    cr_assert_eq(kvidx_pft_find(t, 1, &a), KVIDX_ENOTFOUND, "grace 0: forgotten at once");
    check_consistent(t);
    kvidx_pft_free(t);
    cr_assert_eq(index_pins(), 0, "free gives every pin back");
    kvidx_index_free(idx);
}

Test(prefetch_table, task_deadline_fails_open_loads)
{
    mk_index(0);
    example();
    kvidx_pft_t *t;
    cr_assert_eq(kvidx_pft_new(&t, idx, &events, 0), 0);
    kvidx_pft_set_times(t, 0, 20);
    kvidx_pft_submit_t s = lookup6(1000, 0);
    s.policy = KVIDX_TRIM_SPARSE;
    kvidx_pft_handle_t *h;
    uint64_t task = 0, at = 0;
    cr_assert_eq(kvidx_pft_submit(t, &s, 5, &h, &task), 0);
    cr_assert_eq(kvidx_pft_task_find(t, task)->deadline, 25);
    cr_assert_eq(kvidx_pft_task_finish(t, task, 1, 1), 0); /* key 4 loads */
    cr_assert_eq(kvidx_pft_next_deadline(t, &at), 0);
    cr_assert_eq(at, 25);
    kvidx_pft_advance(t, 25);
    cr_assert_null(kvidx_pft_task_find(t, task));
    cr_assert_eq(h->pfh.status, KVIDX_PFH_COMPLETED);
    cr_assert_eq(h->pfh.result.n_retained, 4, "0, 1, 3 and 4; key 2 timed out");
    cr_assert_eq(info(2).l1_state, KVIDX_L1_NONE);
    cr_assert_eq(kvidx_pft_next_deadline(t, &at), 0);
    cr_assert_eq(at, 1005, "the lease is what is left");
    check_consistent(t);
    kvidx_pft_free(t);
    kvidx_index_free(idx);
}

Test(prefetch_table, warm_loads_stay_and_forced_delete_fails_the_load)
{
    mk_index(0);
    example();
    kvidx_pft_t *t;
    cr_assert_eq(kvidx_pft_new(&t, idx, &events, 0), 0);
    kvidx_pft_set_times(t, 0, 100);
    kvidx_pft_submit_t s = lookup6(1000, 0);
    s.mode = KVIDX_PF_WARM;
    s.policy = KVIDX_TRIM_SPARSE;
    kvidx_pft_handle_t *h;
    uint64_t task = 0;
    cr_assert_eq(kvidx_pft_submit(t, &s, 0, &h, &task), 0);
    kvidx_del_outcome_t o;
    cr_assert_eq(kvidx_index_delete(idx, &uni[4], KVIDX_TIER_ALL, 1, &o), 0);
    cr_assert_eq(kvidx_pft_task_finish(t, task, 0, 1), 0);
    cr_assert_eq(kvidx_pft_task_finish(t, task, 1, 1), 0, "its copy is gone: a failed load");
    cr_assert_eq(h->pfh.status, KVIDX_PFH_COMPLETED);
    cr_assert_eq(h->pfh.result.n_found, 4, "0, 1, 2, 3");
    cr_assert_eq(info(2).l1_state, KVIDX_L1_READY);
    cr_assert_eq(info(2).temporary, 0, "what WARM loads stays");
    cr_assert_eq(index_pins(), 0, "WARM pins nothing");
    check_consistent(t);
    kvidx_pft_free(t);
    kvidx_index_free(idx);
}

Test(prefetch_table, parse_id_is_canonical_decimal)
{
    static const char *good[] = {"1", "0", "42", "18446744073709551615"};
    static const uint64_t want[] = {1, 0, 42, UINT64_MAX};
    for (size_t i = 0; i < 4; i++) {
        uint64_t id = 7;
        size_t used = 0;
        cr_assert_eq(kvidx_pft_parse_id(good[i], strlen(good[i]), &id, &used), 0, "%s", good[i]);
        cr_assert_eq(id, want[i]);
        cr_assert_eq(used, strlen(good[i]));
    }
    static const char *bad[] = {
        "01", "00", "+1", "-1", " 1", "", "x", "18446744073709551616", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t id;
        cr_assert_eq(kvidx_pft_parse_id(bad[i], strlen(bad[i]), &id, NULL), KVIDX_EINVAL, "%s",
                     bad[i]);
    }
    uint64_t id;
    size_t used;
    cr_assert_eq(kvidx_pft_parse_id("12/release", 10, &id, &used), 0);
    cr_assert_eq(id, 12);
    cr_assert_eq(used, 2, "the caller decides what may follow");
}

Test(prefetch_table, parse_wait_names_the_parameter)
{
    int given;
    uint64_t ms;
    kvidx_reason_t why = {NULL, NULL};
    cr_assert_eq(kvidx_pft_parse_wait("", 0, &given, &ms, &why), 0);
    cr_assert_eq(given, 0);
    cr_assert_eq(kvidx_pft_parse_wait("wait_ms=250", 11, &given, &ms, &why), 0);
    cr_assert_eq(given, 1);
    cr_assert_eq(ms, 250);
    cr_assert_eq(kvidx_pft_parse_wait("&wait%5Fms=30000&", 17, &given, &ms, &why), 0);
    cr_assert_eq(ms, 30000);
    static const struct {
        const char *q, *field;
    } bad[] = {
        {"wait_ms=30001", "wait_ms"},
        {"wait_ms=", "wait_ms"},
        {"wait_ms=-1", "wait_ms"},
        {"wait_ms=1x", "wait_ms"},
        {"wait_ms=1&wait_ms=2", "wait_ms"},
        {"x=1", "query"},
        {"wait_ms=1&w=2", "query"},
        {"wait_msx=1", "query"},
        {"%zz=1", "query"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why.field = NULL;
        cr_assert_eq(kvidx_pft_parse_wait(bad[i].q, strlen(bad[i].q), &given, &ms, &why),
                     KVIDX_EINVAL, "%s", bad[i].q);
        cr_assert_str_eq(why.field, bad[i].field, "%s", bad[i].q);
    }
}

/* ---- out of memory ---- */

static struct {
    long count, fail_at, live;
} F;

static void *f_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (++F.count == F.fail_at)
        return NULL;
    void *p = malloc(n ? n : 1);
    F.live += p != NULL;
    return p;
}

static void *f_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (++F.count == F.fail_at)
        return NULL;
    void *q = realloc(p, n ? n : 1);
    F.live += q && !p;
    return q;
}

static void f_free(void *ctx, void *p)
{
    (void)ctx;
    F.live -= p != NULL;
    free(p);
}

/* ---- randomized, against a reference of lifetimes and deadlines ---- */

#define RH 64 /* handles one run may make */

enum { R_LIVE = 1, R_EXPIRED, R_RELEASED, R_GONE };

struct rhandle {
    uint64_t id;
    int state;
    uint64_t expires_at, gone_at;
};

struct rtask {
    uint64_t id, deadline;
    size_t n;
    uint8_t done[NK];
    int gone;
};

struct rmodel {
    struct rhandle h[RH];
    struct rtask k[RH];
    size_t nh, nk;
    uint64_t now, grace, timeout, rng;
};

static uint32_t rnd(struct rmodel *m, uint32_t n)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return (uint32_t)(m->rng % n);
}

/* What time passing does to the reference (the same rules, stated simply). */
static void model_advance(struct rmodel *m, uint64_t now)
{
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < m->nh; i++) {
            struct rhandle *h = &m->h[i];
            if (h->state == R_LIVE && h->expires_at <= now) {
                h->state = R_EXPIRED;
                h->gone_at = now + m->grace;
                again = 1;
            } else if ((h->state == R_EXPIRED || h->state == R_RELEASED) && h->gone_at <= now) {
                h->state = R_GONE;
            }
        }
    }
    for (size_t i = 0; i < m->nk; i++)
        if (m->k[i].deadline <= now)
            m->k[i].gone = 1;
    m->now = now;
}

static void model_check(const struct rmodel *m, const kvidx_pft_t *t)
{
    uint64_t next = UINT64_MAX, at;
    for (size_t i = 0; i < m->nh; i++) {
        const struct rhandle *r = &m->h[i];
        kvidx_pft_handle_t *h;
        int rc = kvidx_pft_find(t, r->id, &h);
        switch (r->state) {
        case R_LIVE:
            cr_assert_eq(rc, 0, "handle %llu", (unsigned long long)r->id);
            cr_assert(h->pfh.status == KVIDX_PFH_PENDING || h->pfh.status == KVIDX_PFH_COMPLETED);
            cr_assert_eq(h->expires_at, r->expires_at);
            next = r->expires_at < next ? r->expires_at : next;
            break;
        case R_EXPIRED:
            cr_assert_eq(rc, KVIDX_EHANDLEEXPIRED, "handle %llu", (unsigned long long)r->id);
            cr_assert_eq(h->pfh.pins, 0);
            break;
        case R_RELEASED:
            cr_assert_eq(rc, 0);
            cr_assert_eq(h->pfh.status, KVIDX_PFH_RELEASED);
            cr_assert_eq(h->pfh.pins, 0);
            break;
        default:
            cr_assert_eq(rc, KVIDX_ENOTFOUND, "handle %llu", (unsigned long long)r->id);
        }
        if (r->state == R_EXPIRED || r->state == R_RELEASED) {
            cr_assert_eq(h->gone_at, r->gone_at);
            next = r->gone_at < next ? r->gone_at : next;
        }
    }
    for (size_t i = 0; i < m->nk; i++) {
        const kvidx_pft_task_t *k = kvidx_pft_task_find(t, m->k[i].id);
        cr_assert_eq(k == NULL, m->k[i].gone != 0, "task %llu", (unsigned long long)m->k[i].id);
        if (k) {
            cr_assert_eq(k->deadline, m->k[i].deadline);
            next = k->deadline < next ? k->deadline : next;
        }
    }
    int rc = kvidx_pft_next_deadline(t, &at);
    cr_assert_eq(rc == 0 ? at : UINT64_MAX, next, "next deadline");
    check_consistent(t);
}

static void r_submit(struct rmodel *m, kvidx_pft_t *t)
{
    kvidx_key_t keys[NK];
    size_t n = 1 + rnd(m, NK);
    for (size_t i = 0; i < n; i++)
        keys[i] = uni[rnd(m, NK)];
    kvidx_pft_submit_t s;
    memset(&s, 0, sizeof(s));
    s.keys = keys;
    s.n = n;
    s.mode = rnd(m, 3) == 0 ? KVIDX_PF_WARM : KVIDX_PF_LOOKUP;
    s.policy = (kvidx_trim_policy_t)rnd(m, 3);
    s.extra = rnd(m, 3);
    s.lease_ms = 1 + rnd(m, 60);
    s.temporary = (int)rnd(m, 2);
    kvidx_pft_handle_t *h;
    uint64_t task;
    int rc = kvidx_pft_submit(t, &s, m->now, &h, &task);
    if (rc != 0) {
        cr_assert_eq(rc, KVIDX_ENOMEM);
        return;
    }
    m->h[m->nh++] = (struct rhandle){h->id, R_LIVE, m->now + s.lease_ms, 0};
    if (task) {
        const kvidx_pft_task_t *k = kvidx_pft_task_find(t, task);
        cr_assert_not_null(k);
        struct rtask *r = &m->k[m->nk++];
        memset(r, 0, sizeof(*r));
        r->id = task;
        r->n = k->n;
        r->deadline = m->now + m->timeout;
    }
}

static void r_finish(struct rmodel *m, kvidx_pft_t *t)
{
    if (!m->nk)
        return;
    struct rtask *r = &m->k[rnd(m, (uint32_t)m->nk)];
    if (r->gone)
        return;
    size_t pos = rnd(m, (uint32_t)r->n);
    int rc = kvidx_pft_task_finish(t, r->id, pos, (int)rnd(m, 4) != 0);
    cr_assert_eq(rc, r->done[pos] ? KVIDX_ENOTFOUND : 0);
    r->done[pos] = 1;
    size_t open = 0;
    for (size_t p = 0; p < r->n; p++)
        open += !r->done[p];
    r->gone = open == 0;
}

static void r_end(struct rmodel *m, kvidx_pft_t *t)
{
    if (!m->nh)
        return;
    struct rhandle *r = &m->h[rnd(m, (uint32_t)m->nh)];
    kvidx_pft_handle_t *h;
    int rc = kvidx_pft_find(t, r->id, &h);
    switch (rnd(m, 3)) {
    case 0:
        cr_assert_eq(kvidx_pft_delete(t, r->id, m->now), 0);
        if (r->state == R_LIVE) {
            r->state = R_RELEASED;
            r->gone_at = m->now + m->grace;
        }
        break;
    case 1:
        if (rc != 0 || h->pfh.status != KVIDX_PFH_COMPLETED)
            break;
        rc = kvidx_pft_release(t, h, m->now, NULL, 0, NULL);
        if (rc == 0 && h->pfh.status == KVIDX_PFH_RELEASED) {
            r->state = R_RELEASED;
            r->gone_at = m->now + m->grace;
        }
        break;
    default:
        if (rc != 0)
            break;
        rc = kvidx_pft_extend(t, h, m->now, 1 + rnd(m, 60));
        if (r->state == R_LIVE) {
            cr_assert_eq(rc, 0);
            r->expires_at = h->expires_at;
        } else {
            cr_assert_eq(rc, KVIDX_ECONFLICT);
        }
    }
}

/* One run of steps operations; returns after freeing everything. With
 * fail_nth, the fail_nth allocation after the index is set up fails. */
static void random_run(uint64_t seed, int steps, int check, long fail_nth)
{
    struct rmodel *m = calloc(1, sizeof(*m));
    cr_assert_not_null(m);
    m->rng = seed;
    m->grace = rnd(m, 20);
    m->timeout = 1 + rnd(m, 40);
    mk_index(40); /* room for 4 keys in L1: reservations evict */
    for (int k = 0; k < NK; k++)
        cr_assert_eq(store(rnd(m, 3) ? KVIDX_TIER_L2 : KVIDX_TIER_L1, k), 0);
    F.count = 0;
    F.fail_at = fail_nth;
    kvidx_pft_t *t;
    if (kvidx_pft_new(&t, idx, &events, 0) != 0) {
        kvidx_index_free(idx);
        free(m);
        return;
    }
    kvidx_pft_set_times(t, m->grace, m->timeout);
    for (int s = 0; s < steps && m->nh < RH && m->nk < RH; s++) {
        switch (rnd(m, 5)) {
        case 0:
        case 1:
            r_submit(m, t);
            break;
        case 2:
            r_finish(m, t);
            break;
        case 3:
            r_end(m, t);
            break;
        default: {
            uint64_t now = m->now + rnd(m, 15);
            kvidx_pft_advance(t, now);
            model_advance(m, now);
        }
        }
        if (check)
            model_check(m, t);
        else
            check_consistent(t);
    }
    kvidx_pft_free(t);
    cr_assert_eq(index_pins(), 0, "a pin outlived the table");
    cr_assert_eq(index_loading(), 0, "a loading copy outlived the table");
    kvidx_index_free(idx);
    free(m);
}

Test(prefetch_table, randomized_against_reference)
{
    for (uint64_t seed = 1; seed <= 200; seed++)
        random_run(seed * 0x9e3779b97f4a7c15ULL, 200, 1, 0);
}

/* Every N over a small workload: the Nth allocation fails, the table stays
 * consistent after every step (the workload's model is not checked: which
 * submit fails changes what follows), and everything is freed at the end. */
Test(prefetch_table, every_allocation_may_fail)
{
    kvidx_allocator_t a = {f_malloc, f_realloc, f_free, NULL};
    kvidx_set_allocator(&a);
    F.live = 0;
    random_run(42, 60, 0, 0);
    long total = F.count;
    cr_assert_gt(total, 50, "the workload allocates");
    cr_assert_eq(F.live, 0);
    for (long n = 1; n <= total + 10; n++) {
        F.live = 0;
        F.fail_at = 0;
        random_run(42, 60, 0, n);
        cr_assert_eq(F.live, 0, "allocation %ld failing leaked %ld blocks", n, F.live);
    }
    kvidx_set_allocator(NULL);
}
