/*
 * One out-of-memory sweep per lib/ module: a mixed workload of the
 * module's entry points is run with its Nth allocation failing, for every N
 * from 1 until a run completes without a failure.
 *
 * The workload is a list of steps, each one call into the module. A run
 * is deterministic up to the failing allocation, so the state before the
 * failing step is the reference run's state before that step. A module
 * gives a fingerprint of its observable state (everything its read
 * functions show) and its invariant check (kvidx_index_check,
 * kvidx_directory_check, kvidx_refset_check, the prefetch table's pins
 * against the index's; none for the layouts and tokens, whose fingerprint
 * is all there is). After the step that met the failure:
 *   - the check passes;
 *   - the call returned KVIDX_ENOMEM and the state is the one before the
 *     call; or it absorbed the failure and the state is the one after it;
 *     or, for the few calls whose header documents a best effort (a
 *     prefetch load that cannot start counts as failed, a bulk load keeps
 *     the items before the failing one), the module checks that the
 *     documented outcome is the one that happened;
 *   - the same call retried with memory back succeeds and leaves the
 *     reference state after it;
 * and the run's remaining steps give the reference answers and the
 * reference end state. After everything is destroyed no block is live.
 * Each module prints "oom_sweep MODULE points=N": the number of
 * allocations its workload met, each of which was failed once (0 for the
 * journal, snapshot and page token codecs, which must not allocate).
 * OOM_SWEEP_VERBOSE=1 lists each step's allocations and each documented
 * best effort taken.
 */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/directory.h"
#include "kvidx/directory_codec.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/index_quota.h"
#include "kvidx/index_source.h"
#include "kvidx/journal.h"
#include "kvidx/layout.h"
#include "kvidx/page_token.h"
#include "kvidx/prefetch_handle.h"
#include "kvidx/prefetch_plan.h"
#include "kvidx/prefetch_table.h"
#include "kvidx/refset.h"
#include "kvidx/tokens.h"

#include "directory_text.h"
#include "failing_alloc.h"
#include "small_index.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- the sweep ---- */

/* What a module may say of a step that returned KVIDX_ENOMEM with its
 * state changed (a call documented as not all or nothing). */
enum {
    PARTIAL_REFUSED = 0, /* a broken promise: the test fails */
    PARTIAL_DIVERGED,    /* allowed; the rest of the run is only checked for invariants */
    PARTIAL_RETRIED      /* allowed; the module completed the call itself */
};

typedef struct sweep {
    const char *name;
    int nsteps;
    int (*step)(int i);
    uint64_t (*fingerprint)(void); /* observable state, allocator paused */
    int (*check)(void);            /* 0 when the invariants hold, allocator paused */
    /* A step that met the failure, answered as the reference did and left
     * another state than the reference: 1 when its header allows it (a
     * best effort degraded, e.g. a load that counts as failed). NULL: never. */
    int (*degraded_ok)(int i);
    /* A step that returned KVIDX_ENOMEM with its state changed: PARTIAL_*.
     * NULL: refused. */
    int (*partial)(int i);
    void (*teardown)(void);
} sweep_t;

#define MAX_STEPS 128

static int sweep_reference; /* 1 during the run that never fails */

static long saved_count, saved_fail;

/* Fingerprints and checks may allocate (a dump's scratch); those
 * allocations neither fail nor count. */
static void pause_failing(void)
{
    saved_count = failing.count;
    saved_fail = failing.fail_at;
    failing.fail_at = 0;
}

static void resume_failing(void)
{
    failing.count = saved_count;
    failing.fail_at = saved_fail;
}

static uint64_t paused_fp(const sweep_t *m)
{
    pause_failing();
    uint64_t h = m->fingerprint();
    resume_failing();
    return h;
}

static int paused_check(const sweep_t *m)
{
    pause_failing();
    int rc = m->check();
    resume_failing();
    return rc;
}

static uint64_t fold64(uint64_t h, uint64_t v)
{
    return fingerprint_bytes(h, &v, sizeof(v));
}

static long run_sweep(const sweep_t *m)
{
    static uint64_t pre[MAX_STEPS], post[MAX_STEPS];
    static int rc_ref[MAX_STEPS];
    cr_assert_leq(m->nsteps, MAX_STEPS);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvidx_allocator_t a = {failing_malloc, failing_realloc, failing_free, NULL};
    kvidx_set_allocator(&a);

    /* The reference run: no failure. Every step of a workload succeeds. */
    failing.count = 0;
    failing.fail_at = 0;
    failing.live = 0;
    int verbose = getenv("OOM_SWEEP_VERBOSE") != NULL;
    sweep_reference = 1;
    for (int i = 0; i < m->nsteps; i++) {
        pre[i] = paused_fp(m);
        long c0 = failing.count;
        rc_ref[i] = m->step(i);
        if (verbose)
            fprintf(stderr, "%s step %d: %ld allocations\n", m->name, i, failing.count - c0);
        cr_assert_eq(rc_ref[i], 0, "%s: reference step %d answered %s", m->name, i,
                     kvidx_err_name(rc_ref[i]));
        cr_assert_eq(paused_check(m), 0, "%s: reference step %d", m->name, i);
        post[i] = paused_fp(m);
    }
    sweep_reference = 0;
    long total = failing.count;
    m->teardown();
    cr_assert_eq(failing.live, 0, "%s: the reference run leaks %ld blocks", m->name, failing.live);

    long points = 0, enomem = 0, absorbed = 0, degraded = 0, partial = 0;
    for (long n = 1;; n++) {
        cr_assert_leq(n, total + 1, "%s: more allocations than the reference run", m->name);
        failing.count = 0;
        failing.fail_at = n;
        failing.live = 0;
        int failed_at = -1, diverged = 0;
        for (int i = 0; i < m->nsteps; i++) {
            long c0 = failing.count;
            int rc = m->step(i);
            int met = failed_at < 0 && c0 < n && failing.count >= n;
            if (diverged) {
                cr_assert_eq(paused_check(m), 0, "%s n=%ld: step %d after a degraded step", m->name,
                             n, i);
                continue;
            }
            if (!met) {
                cr_assert_eq(rc, rc_ref[i], "%s n=%ld: step %d answered %s", m->name, n, i,
                             kvidx_err_name(rc));
                continue;
            }
            failed_at = i;
            cr_assert_eq(paused_check(m), 0, "%s n=%ld: step %d broke an invariant", m->name, n, i);
            uint64_t fp = paused_fp(m);
            if (rc == rc_ref[i]) {
                if (fp != post[i]) {
                    cr_assert(m->degraded_ok && m->degraded_ok(i),
                              "%s n=%ld: step %d succeeded with another state", m->name, n, i);
                    diverged = 1;
                    degraded++;
                    if (verbose)
                        fprintf(stderr, "%s n=%ld: step %d degraded\n", m->name, n, i);
                } else {
                    absorbed++;
                }
                continue;
            }
            cr_assert_eq(rc, KVIDX_ENOMEM, "%s n=%ld: step %d answered %s", m->name, n, i,
                         kvidx_err_name(rc));
            pause_failing();
            if (fp != pre[i]) {
                int p = m->partial ? m->partial(i) : PARTIAL_REFUSED;
                cr_assert_neq(p, PARTIAL_REFUSED, "%s n=%ld: failed step %d changed the state",
                              m->name, n, i);
                partial++;
                if (verbose)
                    fprintf(stderr, "%s n=%ld: step %d partial\n", m->name, n, i);
                if (p == PARTIAL_DIVERGED) {
                    diverged = 1;
                    resume_failing();
                    continue;
                }
            } else {
                enomem++;
                int again = m->step(i);
                cr_assert_eq(again, rc_ref[i], "%s n=%ld: step %d retried answered %s", m->name, n,
                             i, kvidx_err_name(again));
            }
            cr_assert_eq(m->check(), 0, "%s n=%ld: step %d retried", m->name, n, i);
            cr_assert_eq(m->fingerprint(), post[i], "%s n=%ld: step %d retried: another state",
                         m->name, n, i);
            resume_failing();
        }
        if (!diverged)
            cr_assert_eq(paused_fp(m), post[m->nsteps - 1], "%s n=%ld: ends in another state",
                         m->name, n);
        m->teardown();
        cr_assert_eq(failing.live, 0, "%s n=%ld: %ld blocks leak", m->name, n, failing.live);
        if (failed_at < 0)
            break;
        points++;
    }
    cr_assert_eq(points, total, "%s: %ld allocations, %ld failed", m->name, total, points);
    failing.fail_at = 0;
    kvidx_set_allocator(NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("oom_sweep %s points=%ld\n", m->name, points);
    fprintf(stderr,
            "oom_sweep %s: %d steps; failures answered ENOMEM %ld, absorbed %ld, degraded as "
            "documented %ld, partial as documented %ld; %.2f s\n",
            m->name, m->nsteps, enomem, absorbed, degraded, partial, s);
    fflush(stdout);
    return points;
}

/* ---- keys ---- */

static const char *models[] = {"m0", "m1", "model/2"};
static const char *salts[] = {"", "q", "z"};

/* Key i: three models, three salts, two ranks, hashes of 4..32 bytes. */
static kvidx_key_t key_of(int i)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = models[i % 3];
    k.model_len = (uint16_t)strlen(k.model);
    k.salt = salts[(i / 3) % 3];
    k.salt_len = (uint8_t)strlen(k.salt);
    k.kv_rank = (uint32_t)(i / 9) % 2;
    k.hash_len = (uint8_t)(4 + i % 29);
    for (unsigned j = 0; j < k.hash_len; j++)
        k.hash[j] = (uint8_t)(i * 131 + (int)j * 17);
    memcpy(k.hash, &i, sizeof(i));
    return k;
}

/* ---- (a) the index ---- */

/* S scales the workload: key counts, capacities and quotas. */
enum { S = 4, IX_N = 600 * S };

static struct {
    kvidx_index_t *idx;
    kvidx_key_t u[IX_N];
    unsigned s0, s1;
    uint64_t gen[3];
    /* A second index whose L1 table is full when a load reserves a copy. */
    kvidx_index_t *small;
    kvidx_key_t su[64];
    uint64_t out; /* what reads and deletes answered */
} IX;

static uint64_t index_fp(const kvidx_index_t *idx, const kvidx_key_t *u, int n, int sources)
{
    if (!idx)
        return 1;
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    uint64_t h = fingerprint_bytes(FINGERPRINT_SEED, &st, sizeof(st));
    for (int i = 0; i < n; i++) {
        kvidx_ref_t r;
        kvidx_entry_info_t info;
        memset(&info, 0, sizeof(info));
        uint32_t mask = 0;
        if (kvidx_index_find(idx, &u[i], &r) == 0) {
            cr_assert_eq(kvidx_index_info(idx, r, &info), 0);
            mask = kvidx_index_source_mask(idx, r);
        } else {
            info.size_bytes = 12345;
        }
        h = fingerprint_bytes(h, &info, sizeof(info));
        h = fold64(h, mask);
    }
    for (int s = 0; s < sources; s++) {
        kvidx_source_stats_t ss;
        memset(&ss, 0, sizeof(ss));
        if (kvidx_index_source_stats(idx, (unsigned)s, &ss) == 0)
            h = fingerprint_bytes(h, &ss, sizeof(ss));
    }
    for (int s = 0; s < 3; s++) {
        kvidx_salt_usage_t us;
        kvidx_index_salt_usage(idx, salts[s], strlen(salts[s]), &us);
        us.salt = NULL;
        h = fingerprint_bytes(h, &us, sizeof(us));
    }
    return fold64(h, kvidx_index_quota_evictions(idx));
}

static uint64_t ix_fp(void)
{
    uint64_t h = fold64(index_fp(IX.idx, IX.u, IX_N, 2), IX.out);
    return fold64(h, index_fp(IX.small, IX.su, 64, 0));
}

static int ix_check(void)
{
    if (IX.idx && kvidx_index_check(IX.idx))
        return KVIDX_EINTERNAL;
    return IX.small ? kvidx_index_check(IX.small) : 0;
}

static void ix_teardown(void)
{
    kvidx_index_free(IX.idx);
    kvidx_index_free(IX.small);
    IX.idx = IX.small = NULL;
    IX.out = 0;
}

static int ix_put(kvidx_tier_t tier, int from, int to, int again_to, uint64_t size)
{
    static kvidx_put_t items[IX_N + IX_N];
    size_t n = 0;
    for (int i = from; i < to; i++)
        items[n++] = (kvidx_put_t){IX.u[i], size};
    for (int i = 0; i < again_to; i++)
        items[n++] = (kvidx_put_t){IX.u[i], size};
    size_t stored = 0;
    int rc = kvidx_index_put_batch_count(IX.idx, tier, items, n, NULL, &stored);
    if (rc == 0)
        IX.out = fold64(IX.out, stored);
    return rc;
}

static kvidx_load_t ix_loads[100 * S];

/* The bulk load of step 5: U[360S..460S), L1 and L2 or L2 only, in reverse
 * order so that the loader sorts. */
static void ix_load_items(void)
{
    for (int j = 0; j < 100 * S; j++) {
        int i = 460 * S - 1 - j;
        ix_loads[j] =
            (kvidx_load_t){IX.u[i], 10, KVIDX_DURABLE_L2 | (i % 3 ? 0 : KVIDX_DURABLE_L1)};
    }
}

static int ix_load(void)
{
    ix_load_items();
    return kvidx_index_load(IX.idx, ix_loads, 100 * S, NULL);
}

/* A bulk load that ran out of memory keeps the items before the failing
 * one: each item is fully in or absent, those in come before those
 * absent, and loading the rest gives what one load gives. */
static int ix_partial(int i)
{
    if (i != 5)
        return PARTIAL_REFUSED;
    cr_assert_eq(kvidx_index_check(IX.idx), 0);
    int in = 0, out = 0;
    for (int j = 0; j < 100 * S; j++) {
        kvidx_ref_t r;
        kvidx_entry_info_t info;
        if (kvidx_index_find(IX.idx, &ix_loads[j].key, &r) != 0) {
            out++;
            continue;
        }
        cr_assert_eq(out, 0, "a loaded item after an absent one");
        cr_assert_eq(kvidx_index_info(IX.idx, r, &info), 0);
        cr_assert_eq(info.size_bytes, 10);
        cr_assert_eq(info.l2_api, 1);
        cr_assert_eq(info.l1_state,
                     ix_loads[j].tiers & KVIDX_DURABLE_L1 ? KVIDX_L1_READY : KVIDX_L1_NONE);
        in++;
    }
    cr_assert_gt(out, 0, "a load that failed and loaded everything");
    cr_assert_eq(kvidx_index_load(IX.idx, ix_loads + in, (size_t)(100 * S - in), NULL), 0);
    return PARTIAL_RETRIED;
}

static int ix_ref(int i, kvidx_ref_t *r)
{
    return kvidx_index_find(IX.idx, &IX.u[i], r);
}

/* Every page of a listing with filter f, folded into IX.out. */
static int ix_list(const kvidx_list_filter_t *f)
{
    kvidx_key_buf_t resume, after;
    kvidx_ref_t refs[37];
    int more = 1, first = 1;
    uint64_t h = FINGERPRINT_SEED;
    while (more) {
        size_t count = 0;
        int rc = kvidx_index_list(IX.idx, f, first ? NULL : &after.key, 37, 100, refs, &count,
                                  &resume, &more, NULL);
        if (rc)
            return rc;
        for (size_t j = 0; j < count; j++) {
            kvidx_list_entry_t e;
            cr_assert_eq(kvidx_index_list_entry(IX.idx, refs[j], &e), 0);
            h = fingerprint_bytes(h, e.hash, e.hash_len);
            h = fingerprint_bytes(h, e.model, e.model_len);
            h = fold64(h, e.size_bytes ^ (uint64_t)e.kv_rank << 48);
        }
        h = fold64(h, count);
        if (more)
            kvidx_key_buf_set(&after, &resume.key);
        first = 0;
    }
    IX.out = fold64(IX.out, h);
    return 0;
}

static int ix_delete(int i, kvidx_tier_t tier, int force)
{
    kvidx_del_outcome_t o;
    int rc = kvidx_index_delete(IX.idx, &IX.u[i], tier, force, &o);
    if (rc == 0)
        IX.out = fold64(IX.out, (uint64_t)o + 1);
    return rc;
}

static int ix_source_put(unsigned s, int from, int to, uint64_t odd_size)
{
    static uint64_t sizes[IX_N];
    for (int i = from; i < to; i++)
        sizes[i - from] = i % 2 && i < 460 * S ? odd_size : 10;
    return kvidx_index_source_put(IX.idx, s, IX.u + from, sizes, (size_t)(to - from), NULL);
}

static int ix_step(int i)
{
    kvidx_ref_t r = KVIDX_REF_NONE;
    switch (i) {
    case 0: {
        kvidx_index_opts_t o;
        memset(&o, 0, sizeof(o));
        o.l1_capacity_bytes = 3500 * S;
        o.has_seed = 1;
        for (int j = 0; j < IX_N; j++) {
            IX.u[j] = key_of(j);
            /* Half of the bulk load's second part, and a source's new
             * keys, in namespaces of their own. */
            if (j >= 400 * S && j < 460 * S && j % 2) {
                IX.u[j].model = "loaded";
                IX.u[j].model_len = 6;
            }
            if (j >= 500 * S && j < 520 * S && j % 3 == 0) {
                IX.u[j].model = "src";
                IX.u[j].model_len = 3;
            }
        }
        IX.idx = NULL;
        return kvidx_index_new(&o, &IX.idx);
    }
    case 1:
        return kvidx_index_source_add(IX.idx, &IX.s0);
    case 2: {
        kvidx_salt_quota_t q = {"q", 1, 1000 * S};
        return kvidx_index_set_quotas(IX.idx, &q, 1);
    }
    case 3:
        return ix_put(KVIDX_TIER_L1, 0, 240 * S, 0, 10);
    case 4:
        return ix_put(KVIDX_TIER_L2, 160 * S, 360 * S, 0, 10);
    case 5:
        return ix_load();
    case 6:
        return ix_source_put(IX.s0, 420 * S, 520 * S, 12) /* resizes L1 copies */;
    case 7:
        return ix_list(NULL);
    case 8: {
        kvidx_list_filter_t f = {
            .has_model = 1, .model = "m1", .model_len = 2, .tier = KVIDX_TIER_L2};
        return ix_list(&f);
    }
    /* Tier moves: loads into L1 of L2-only keys, pins, the temporary flag. */
    case 9:
    case 10:
        if (ix_ref(300 * S + (i - 9), &r))
            return KVIDX_EINTERNAL;
        return kvidx_index_l1_reserve(IX.idx, r, i == 10, &IX.gen[i - 9]);
    case 11:
        return ix_ref(300 * S, &r) ? KVIDX_EINTERNAL : kvidx_index_pin(IX.idx, r, IX.gen[0], 2);
    case 12:
    case 13:
        if (ix_ref(300 * S + (i - 12), &r))
            return KVIDX_EINTERNAL;
        return kvidx_index_l1_load_done(IX.idx, r, IX.gen[i - 12], i == 12);
    case 14:
        return ix_ref(300 * S, &r) ? KVIDX_EINTERNAL : kvidx_index_unpin(IX.idx, r, IX.gen[0], 1);
    case 15:
        return ix_ref(0, &r) ? KVIDX_EINTERNAL : kvidx_index_set_temporary(IX.idx, r, 1);
    case 16:
        return ix_ref(5, &r) ? KVIDX_EINTERNAL : kvidx_index_touch(IX.idx, r);
    case 17:
        return ix_ref(10, &r) ? KVIDX_EINTERNAL : kvidx_index_pin(IX.idx, r, 0, 1);
    case 18:
        return ix_delete(20, KVIDX_TIER_ALL, 0);
    case 19:
        return ix_delete(21, KVIDX_TIER_L1, 0);
    case 20:
        return ix_delete(10, KVIDX_TIER_ALL, 0); /* pinned: L2 goes, L1 stays */
    case 21:
        return ix_delete(300 * S, KVIDX_TIER_ALL, 1); /* pinned, forced */
    case 22:
        /* New keys and re-puts: salt q passes its quota, evicting its own. */
        return ix_put(KVIDX_TIER_L1, 460 * S, 600 * S, 40 * S, 10);
    case 23:
        return kvidx_index_source_add(IX.idx, &IX.s1);
    case 24:
        return ix_source_put(IX.s1, 500 * S, 560 * S, 10);
    case 25:
        return kvidx_index_source_resync_begin(IX.idx, IX.s0);
    case 26:
        return ix_source_put(IX.s0, 440 * S, 480 * S, 10);
    case 27:
        return kvidx_index_source_resync_end(IX.idx, IX.s0, NULL);
    case 28: {
        size_t removed = 0;
        int rc = kvidx_index_source_del(IX.idx, IX.s1, IX.u + 500 * S, 30 * S, &removed);
        IX.out = fold64(IX.out, removed);
        return rc;
    }
    case 29: {
        kvidx_salt_quota_t q[2] = {{"q", 1, 600 * S}, {"z", 1, 900 * S}};
        return kvidx_index_set_quotas(IX.idx, q, 2);
    }
    case 30:
        return kvidx_index_set_capacity(IX.idx, 1500 * S, 0);
    case 31:
        return kvidx_index_reserve(IX.idx, 2000 * S);
    case 32:
        return ix_put(KVIDX_TIER_L2, 0, IX_N, 0, 10);
    case 33:
        return ix_list(NULL);
    case 34:
        IX.small = NULL;
        return small_index_new(0, &IX.small, IX.su, 64);
    case 35:
    case 36: {
        /* 63 L1 copies fill the first L1 table; key 63 only in L2. */
        kvidx_put_t it[63];
        for (int j = 0; j < 63; j++)
            it[j] = (kvidx_put_t){IX.su[i == 35 ? j : 63], 1};
        return kvidx_index_put_batch(IX.small, i == 35 ? KVIDX_TIER_L1 : KVIDX_TIER_L2, it,
                                     i == 35 ? 63 : 1, NULL);
    }
    default:
        /* A temporary load into the full table: reserve (the table
         * grows), pin, done, and the last unpin drops the copy. */
        if (kvidx_index_find(IX.small, &IX.su[63], &r))
            return KVIDX_EINTERNAL;
        if (i == 37)
            return kvidx_index_l1_reserve(IX.small, r, 1, &IX.gen[2]);
        if (i == 38)
            return kvidx_index_pin(IX.small, r, IX.gen[2], 1);
        if (i == 39)
            return kvidx_index_l1_load_done(IX.small, r, IX.gen[2], 1);
        return kvidx_index_unpin(IX.small, r, IX.gen[2], 1);
    }
}

Test(oom_sweep, index, .timeout = 600)
{
    sweep_t m = {"index", 41, ix_step, ix_fp, ix_check, NULL, ix_partial, ix_teardown};
    cr_assert_geq(run_sweep(&m), 30);
}

/* ---- (b) prefetch: plans, a handle's ledger, the table ---- */

enum { PF_NK = 16 };

static struct {
    kvidx_index_t *idx;
    kvidx_key_t u[PF_NK];
    kvidx_prefetch_plan_t plan[2];
    kvidx_prefetch_result_t res[2];
    kvidx_pfh_t h;
    int h_open;
    kvidx_pfh_load_t kind[PF_NK];
    uint8_t loading[PF_NK]; /* the handle started this key's load */
    uint64_t gen[PF_NK];
    kvidx_pft_t *t;
    uint64_t id[4], task[4];
    uint64_t events[3]; /* the table's changed, gone and count callbacks */
    uint64_t out;
} PF;

static void pf_changed(void *ctx, kvidx_pft_handle_t *h)
{
    (void)ctx;
    PF.events[0] = fold64(PF.events[0], h->id ^ (uint64_t)h->pfh.status << 32);
}

static void pf_gone(void *ctx, kvidx_pft_handle_t *h)
{
    (void)ctx;
    PF.events[1] = fold64(PF.events[1], h->id);
}

static void pf_count(void *ctx, kvidx_pft_counter_t c, uint64_t d)
{
    (void)ctx;
    PF.events[2] = fold64(PF.events[2], (uint64_t)c ^ d << 8);
}

static const kvidx_pft_events_t pf_events = {NULL, pf_changed, pf_gone, pf_count};

static uint64_t fp_list(uint64_t h, const uint32_t *a, size_t n)
{
    h = fold64(h, n);
    return n ? fingerprint_bytes(h, a, n * sizeof(*a)) : h;
}

static uint64_t fp_plan(uint64_t h, const kvidx_prefetch_plan_t *p)
{
    h = fp_list(h, p->l1_found, p->n_l1_found);
    h = fp_list(h, p->l1_hits, p->n_l1_hits);
    h = fp_list(h, p->l2_orig, p->n_l2_orig);
    h = fp_list(h, p->new_loads, p->n_new_loads);
    h = fold64(h, p->planned_chunks ^ p->n << 20);
    return p->n ? fingerprint_bytes(h, p->planned, p->n) : h;
}

static uint64_t fp_result(uint64_t h, const kvidx_prefetch_result_t *r, size_t n)
{
    h = fp_list(h, r->found, r->n_found);
    h = fp_list(h, r->retained, r->n_retained);
    h = fp_list(h, r->released, r->n_released);
    h = fold64(h, r->hit_keys ^ r->hit_chunks << 32);
    if (r->found_map)
        h = fingerprint_bytes(fingerprint_bytes(h, r->found_map, n), r->retained_map, n);
    return h;
}

static uint64_t fp_pfh(uint64_t h, const kvidx_pfh_t *p)
{
    h = fold64(h, (uint64_t)p->status ^ (uint64_t)p->has_result << 8 ^ p->waiting << 16);
    h = fold64(h, p->pins);
    for (size_t i = 0; i < p->n; i++) {
        const kvidx_pfh_key_t *k = &p->keys[i];
        h = fold64(h, k->ref ^ (uint64_t)k->pins << 32);
        h = fold64(h, k->gen ^ (uint64_t)k->failed << 40 ^ (uint64_t)k->lost << 48 ^
                          (uint64_t)k->waiting << 56);
    }
    h = fp_plan(h, &p->plan);
    return p->has_result ? fp_result(h, &p->result, p->n) : h;
}

/* Handles come in no particular order: their hashes are summed. */
static void fp_handle(void *ctx, const kvidx_pft_handle_t *hd)
{
    uint64_t h = fold64(FINGERPRINT_SEED, hd->id);
    h = fold64(h, hd->expires_at ^ hd->gone_at << 32);
    h = fingerprint_bytes(h, hd->ext_id ? hd->ext_id : "-", hd->ext_id ? strlen(hd->ext_id) : 1);
    h = fingerprint_bytes(h, hd->owner ? hd->owner : "-", hd->owner ? strlen(hd->owner) : 1);
    *(uint64_t *)ctx += fp_pfh(h, &hd->pfh);
}

static uint64_t pf_fp(void)
{
    uint64_t h = fold64(index_fp(PF.idx, PF.u, PF_NK, 0), PF.out);
    h = fingerprint_bytes(h, PF.events, sizeof(PF.events));
    for (int j = 0; j < 2; j++)
        h = fp_result(fp_plan(h, &PF.plan[j]), &PF.res[j], PF.plan[j].n);
    if (PF.h_open)
        h = fp_pfh(h, &PF.h);
    if (PF.t) {
        kvidx_pft_stats_t st;
        kvidx_pft_stats(PF.t, &st);
        h = fingerprint_bytes(h, &st, sizeof(st));
        uint64_t sum = 0;
        kvidx_pft_each(PF.t, fp_handle, &sum);
        h = fold64(h, sum);
        for (const kvidx_pft_task_t *k = kvidx_pft_task_first(PF.t); k; k = kvidx_pft_task_next(k))
            h = fold64(fold64(h, k->id ^ k->open << 32), k->deadline ^ k->n << 40);
    }
    return h;
}

/* The table's pins are the index's, every loading copy has one open load
 * of one task, and the index keeps its own invariants. */
static int pf_check(void)
{
    if (!PF.idx)
        return 0;
    if (kvidx_index_check(PF.idx))
        return KVIDX_EINTERNAL;
    kvidx_index_stats_t is;
    kvidx_index_stats(PF.idx, &is);
    uint64_t pins = PF.h_open ? PF.h.pins : 0;
    kvidx_pft_stats_t st;
    memset(&st, 0, sizeof(st));
    if (PF.t)
        kvidx_pft_stats(PF.t, &st);
    if (is.l1_pins != pins + st.pins)
        return KVIDX_EINTERNAL;
    uint64_t loading = 0;
    for (int j = 0; j < PF_NK; j++)
        loading += PF.loading[j];
    if (is.l1_loading != loading + st.loads)
        return KVIDX_EINTERNAL;
    size_t open = 0, tasks = 0;
    for (const kvidx_pft_task_t *k = PF.t ? kvidx_pft_task_first(PF.t) : NULL; k;
         k = kvidx_pft_task_next(k)) {
        size_t o = 0;
        for (size_t p = 0; p < k->n; p++) {
            kvidx_ref_t ref;
            kvidx_entry_info_t in;
            if (kvidx_pft_task_ref(k, p, &ref) != 0)
                continue;
            if (kvidx_index_info(PF.idx, ref, &in) != 0 || in.l1_state != KVIDX_L1_LOADING)
                return KVIDX_EINTERNAL;
            o++;
        }
        if (o == 0 || o != k->open)
            return KVIDX_EINTERNAL;
        open += o;
        tasks++;
    }
    return open == st.loads && tasks == st.tasks ? 0 : KVIDX_EINTERNAL;
}

static void pf_teardown(void)
{
    for (int j = 0; j < 2; j++) {
        kvidx_prefetch_plan_free(&PF.plan[j]);
        kvidx_prefetch_result_free(&PF.res[j]);
    }
    if (PF.h_open)
        kvidx_pfh_close(&PF.h, PF.idx);
    kvidx_pft_free(PF.t);
    if (PF.idx) {
        kvidx_index_stats_t is;
        kvidx_index_stats(PF.idx, &is);
        cr_assert_eq(is.l1_pins, 0, "a pin outlived its handle");
    }
    kvidx_index_free(PF.idx);
    memset(&PF, 0, sizeof(PF));
}

static const int64_t pf_windows[2] = {KVIDX_WINDOW_FULL, 2};
static const kvidx_fold_shape_t pf_shape = {pf_windows, 2, 4, 2};  /* 16 keys */
static const kvidx_fold_shape_t pf_shape8 = {pf_windows, 1, 4, 2}; /* 8 keys */

static int pf_plan(int j)
{
    static const uint8_t st[2][PF_NK] = {
        {1, 1, 3, 2, 3, 3, 0, 1, 3, 1, 1, 1, 1, 1, 1, 1},
        {1, 3, 3, 3, 2, 1, 3, 3, 1, 1, 3, 0, 3, 3, 3, 3},
    };
    kvidx_prefetch_req_t r = {PF_NK, st[j], j ? KVIDX_PF_WARM : KVIDX_PF_LOOKUP,
                              j ? KVIDX_TRIM_SEGMENTED_PREFIX : KVIDX_TRIM_SPARSE,
                              j ? &pf_shape : NULL};
    kvidx_prefetch_plan_free(&PF.plan[j]);
    return kvidx_prefetch_plan(&r, &PF.plan[j]);
}

static int pf_trim(int j)
{
    uint8_t failed[PF_NK] = {0};
    failed[2] = failed[10] = 1;
    kvidx_prefetch_result_free(&PF.res[j]);
    return kvidx_prefetch_trim(&PF.plan[j], j ? NULL : failed, &PF.res[j]);
}

/* Handle step: start_load for the j-th planned L2 key (none: nothing). */
static int pf_start(size_t j)
{
    if (j >= PF.h.plan.n_l2_orig)
        return 0;
    size_t i = PF.h.plan.l2_orig[j];
    PF.kind[i] = kvidx_pfh_start_load(&PF.h, PF.idx, i, 1, &PF.gen[i]);
    PF.loading[i] = PF.kind[i] == KVIDX_PFH_LOAD_NEW;
    PF.out = fold64(PF.out, PF.kind[i]);
    return 0;
}

static int pf_finish(size_t j)
{
    if (j >= PF.h.plan.n_l2_orig)
        return 0;
    size_t i = PF.h.plan.l2_orig[j];
    if (!PF.loading[i])
        return 0;
    int ok = i != 4;
    PF.out = fold64(PF.out, (uint64_t)kvidx_pfh_load_result(&PF.h, PF.idx, i, PF.gen[i], ok));
    kvidx_ref_t r = PF.h.keys[i].ref;
    PF.loading[i] = 0;
    return kvidx_index_l1_load_done(PF.idx, r, PF.gen[i], ok);
}

static int pf_submit(int which, uint64_t now)
{
    /* The last submit names keys twice: it joins its own loads. */
    static const int dup[PF_NK] = {0, 1, 12, 12, 13, 13, 14, 15, 2, 3, 12, 14, 4, 5, 6, 7};
    kvidx_key_t keys[PF_NK];
    for (int k = 0; k < PF_NK; k++)
        keys[k] = PF.u[dup[k]];
    kvidx_pft_submit_t s;
    memset(&s, 0, sizeof(s));
    s.keys = which == 3 ? keys : PF.u + (which == 1 ? 4 : which == 2 ? 2 : 0);
    s.n = which == 3 ? PF_NK : 8;
    s.mode = which == 1 ? KVIDX_PF_WARM : KVIDX_PF_LOOKUP;
    s.policy = which == 3 ? KVIDX_TRIM_PREFIX : KVIDX_TRIM_SPARSE;
    s.extra = which == 0 ? 1 : 0;
    s.ipc = which == 2 ? &pf_shape8 : NULL;
    s.ext_id = which == 0 ? "req-1" : NULL;
    s.owner = which < 2 ? "owner" : NULL;
    s.lease_ms = 100;
    s.temporary = which != 1;
    s.submit_wall_ms = 1000 + (uint64_t)which;
    kvidx_pft_handle_t *h;
    int rc = kvidx_pft_submit(PF.t, &s, now, &h, &PF.task[which]);
    if (rc == 0)
        PF.id[which] = h->id;
    return rc;
}

/* Finishes the load at position pos of the task of submit which, when
 * it is open. */
static int pf_task_finish(int which, size_t pos)
{
    const kvidx_pft_task_t *k = kvidx_pft_task_find(PF.t, PF.task[which]);
    kvidx_ref_t r;
    if (!k || kvidx_pft_task_ref(k, pos, &r) != 0)
        return 0;
    return kvidx_pft_task_finish(PF.t, PF.task[which], pos, pos % 3 != 1);
}

static kvidx_pft_handle_t *pf_handle(int which)
{
    kvidx_pft_handle_t *h = NULL;
    int rc = kvidx_pft_find(PF.t, PF.id[which], &h);
    return rc == 0 ? h : NULL;
}

#define PF_STEPS 53

/* What a degraded step must show against the reference: a key of the
 * submit's handle that failed when the reference's did not (its load could
 * not start, or the handle could not join it), or more handles completed
 * without a result. */
static uint64_t pf_ref_failed[MAX_STEPS], pf_ref_bare[MAX_STEPS];

static void pf_bare(void *ctx, const kvidx_pft_handle_t *h)
{
    *(uint64_t *)ctx += h->pfh.status != KVIDX_PFH_PENDING && !h->pfh.has_result;
}

static int pf_submit_of(int i)
{
    return i >= 20 && i <= 22 ? i - 20 : i == 51 ? 3 : -1;
}

/* The failed keys of the handle step i submitted, one bit each, and the
 * handles completed without a result. */
static void pf_degradation(int i, uint64_t *failed, uint64_t *bare)
{
    *failed = *bare = 0;
    if (!PF.t)
        return;
    kvidx_pft_each(PF.t, pf_bare, bare);
    int which = pf_submit_of(i);
    kvidx_pft_handle_t *h = NULL;
    if (which < 0 || !PF.id[which])
        return;
    int rc = kvidx_pft_find(PF.t, PF.id[which], &h);
    if (rc == 0 || rc == KVIDX_EHANDLEEXPIRED)
        for (size_t k = 0; k < h->pfh.n; k++)
            *failed |= (uint64_t)h->pfh.keys[k].failed << k;
}

static int pf_step_do(int i);

static int pf_step(int i)
{
    int rc = pf_step_do(i);
    if (sweep_reference)
        pf_degradation(i, &pf_ref_failed[i], &pf_ref_bare[i]);
    return rc;
}

static int pf_step_do(int i)
{
    switch (i) {
    case 0:
        PF.idx = NULL;
        return small_index_new(100, &PF.idx, PF.u, PF_NK); /* room for 10 keys */
    case 1: {
        kvidx_put_t it[PF_NK];
        for (int k = 0; k < PF_NK; k++)
            it[k] = (kvidx_put_t){PF.u[k], 10};
        return kvidx_index_put_batch(PF.idx, KVIDX_TIER_L2, it, PF_NK, NULL);
    }
    case 2: {
        kvidx_put_t it[3] = {{PF.u[0], 10}, {PF.u[1], 10}, {PF.u[9], 10}};
        return kvidx_index_put_batch(PF.idx, KVIDX_TIER_L1, it, 3, NULL);
    }
    case 3:
    case 4:
        return pf_plan(i - 3);
    case 5:
    case 6:
        return pf_trim(i - 5);
    case 7: {
        int rc =
            kvidx_pfh_open(&PF.h, PF.idx, PF.u, 6, KVIDX_PF_LOOKUP, KVIDX_TRIM_PREFIX, 1, NULL);
        PF.h_open = rc == 0;
        return rc;
    }
    case 8:
    case 9:
    case 10:
    case 11:
        return pf_start((size_t)(i - 8));
    case 12:
    case 13:
    case 14:
    case 15:
        return pf_finish((size_t)(i - 12));
    case 16:
        return kvidx_pfh_complete(&PF.h, PF.idx);
    case 17: {
        const uint32_t ix[2] = {0, 1};
        return kvidx_pfh_release(&PF.h, PF.idx, ix, 2, NULL);
    }
    case 18:
        kvidx_pfh_end(&PF.h, PF.idx, KVIDX_PFH_RELEASED);
        kvidx_pfh_close(&PF.h, PF.idx);
        PF.h_open = 0;
        return 0;
    case 19: {
        int rc = kvidx_pft_new(&PF.t, PF.idx, &pf_events, 0);
        if (rc == 0)
            kvidx_pft_set_times(PF.t, 5, 50);
        else
            PF.t = NULL;
        return rc;
    }
    case 20:
    case 21:
    case 22:
        return pf_submit(i - 20, 10);
    case 47: {
        kvidx_pft_handle_t *h = pf_handle(0);
        if (!h || h->pfh.status != KVIDX_PFH_COMPLETED)
            return 0;
        const uint32_t ix[1] = {0};
        return kvidx_pft_release(PF.t, h, 20,
                                 h->pfh.has_result && h->pfh.result.n_retained ? ix : NULL,
                                 h->pfh.has_result && h->pfh.result.n_retained ? 1 : 0, NULL);
    }
    case 48: {
        kvidx_pft_handle_t *h = pf_handle(2);
        return h ? kvidx_pft_extend(PF.t, h, 20, 300) : 0;
    }
    case 49:
        return kvidx_pft_delete(PF.t, PF.id[1], 25);
    case 50:
        kvidx_pft_advance(PF.t, 150);
        return 0;
    case 51:
        return pf_submit(3, 150);
    default:
        if (i < 47) /* 23..46: the three tasks' loads, eight positions each */
            return pf_task_finish((i - 23) / 8, (size_t)((i - 23) % 8));
        kvidx_pft_advance(PF.t, 1000);
        return 0;
    }
}

/* Documented best efforts: a load that cannot start or be recorded is a
 * failed load (start_load, submit), and a completion that cannot trim
 * gives back every pin and keeps no result (pfh_complete, and the table's
 * completions inside task_finish and advance). */
static int pf_degraded_ok(int i)
{
    uint64_t failed, bare;
    pf_degradation(i, &failed, &bare);
    if (pf_submit_of(i) >= 0)
        return (failed & ~pf_ref_failed[i]) != 0;
    if ((i >= 23 && i <= 46) || i == 50 || i == 52) /* load ends: a bare completion */
        return bare > pf_ref_bare[i];
    return 0;
}

static int pf_partial(int i)
{
    return i == 16 ? PARTIAL_DIVERGED : PARTIAL_REFUSED;
}

Test(oom_sweep, prefetch, .timeout = 600)
{
    sweep_t m = {"prefetch", PF_STEPS,       pf_step,    pf_fp,
                 pf_check,   pf_degraded_ok, pf_partial, pf_teardown};
    cr_assert_geq(run_sweep(&m), 30);
}

/* ---- (c) the journal and snapshot codecs ---- */

/* They write into caller buffers and read in place: the sweep shows that
 * none of their entry points allocates (0 points). */
static struct {
    uint8_t buf[1 << 16];
    size_t len;
    uint64_t out;
} JR;

static uint64_t jr_fp(void)
{
    return fold64(fingerprint_bytes(FINGERPRINT_SEED, JR.buf, JR.len), JR.out);
}

static int jr_check(void)
{
    return 0;
}

static void jr_teardown(void)
{
    memset(&JR, 0, sizeof(JR));
}

static uint64_t fp_rec(uint64_t h, const kvidx_jrec_t *r)
{
    h = fold64(h, (uint64_t)r->type ^ (uint64_t)r->tiers << 8 ^ (uint64_t)r->world_size << 16);
    h = fold64(h, r->size_bytes);
    h = fingerprint_bytes(h, r->key.model, r->key.model_len);
    h = fingerprint_bytes(h, r->key.salt, r->key.salt_len);
    h = fingerprint_bytes(h, r->key.hash, r->key.hash_len);
    return r->blob ? fingerprint_bytes(h, r->blob, r->blob_len) : h;
}

static int jr_step(int i)
{
    static const uint8_t blob[] = "{\"layout\":1}";
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    size_t len = 0;
    int rc;
    switch (i) {
    case 0:
        kvidx_journal_header_encode(7, JR.buf);
        JR.len = KVIDX_JOURNAL_HEADER_LEN;
        return 0;
    case 1:
    case 2:
    case 3:
        /* A key, a layout and a directory record. */
        if (i == 1) {
            r.type = KVIDX_JREC_KEY;
            r.key = key_of(5);
            r.size_bytes = 4096;
            r.tiers = KVIDX_STATE_L1 | KVIDX_STATE_L2;
        } else {
            r.type = i == 2 ? KVIDX_JREC_LAYOUT_PUT : KVIDX_JREC_DIR;
            r.key.model = "m0";
            r.key.model_len = 2;
            r.world_size = 4;
            r.blob = blob;
            r.blob_len = sizeof(blob) - 1;
        }
        rc = kvidx_jrec_encode(&r, JR.buf + JR.len, sizeof(JR.buf) - JR.len, &len);
        JR.len += rc == 0 ? len : 0;
        return rc;
    case 4: {
        uint64_t g = 0;
        if (kvidx_journal_header_decode(JR.buf, JR.len, &g) != 0 || g != 7)
            return KVIDX_EINTERNAL;
        size_t off = KVIDX_JOURNAL_HEADER_LEN;
        int n = 0;
        while ((rc = kvidx_journal_next(JR.buf, JR.len, &off, &r)) > 0) {
            JR.out = fp_rec(JR.out, &r);
            n++;
        }
        return rc == 0 && n == 3 ? 0 : KVIDX_EINTERNAL;
    }
    case 5: {
        /* A snapshot of 50 keys in two namespaces and a layout. */
        kvidx_snapshot_writer_t w;
        kvidx_snapshot_begin(&w, 9, JR.buf);
        JR.len = KVIDX_SNAPSHOT_HEADER_LEN;
        for (int k = 0; k < 51; k++) {
            memset(&r, 0, sizeof(r));
            if (k < 50) {
                r.type = KVIDX_JREC_KEY;
                r.key = key_of(k < 25 ? 32 : 33); /* 32-byte hashes */
                r.key.hash[20] = (uint8_t)k;
                r.size_bytes = 100 + (uint64_t)k;
                r.tiers = KVIDX_STATE_L2;
            } else {
                r.type = KVIDX_JREC_LAYOUT_PUT;
                r.key.model = "m0";
                r.key.model_len = 2;
                r.world_size = 1;
                r.blob = blob;
                r.blob_len = sizeof(blob) - 1;
            }
            rc = kvidx_snapshot_add(&w, &r, JR.buf + JR.len, sizeof(JR.buf) - JR.len, &len);
            if (rc)
                return rc;
            JR.len += len;
        }
        kvidx_snapshot_finish(&w, JR.buf + JR.len);
        JR.len += KVIDX_SNAPSHOT_TRAILER_LEN;
        return 0;
    }
    default: {
        kvidx_snapshot_reader_t rd;
        rc = i == 6 ? kvidx_snapshot_open(&rd, JR.buf, JR.len, NULL)
                    : kvidx_snapshot_open_streaming(&rd, JR.buf, JR.len, NULL);
        int n = 0;
        while (rc == 0 && kvidx_snapshot_next(&rd, &r) > 0) {
            JR.out = fp_rec(JR.out, &r);
            n++;
        }
        if (rc == 0)
            rc = kvidx_snapshot_next(&rd, &r);
        return rc == 0 && n == 51 ? 0 : KVIDX_EINTERNAL;
    }
    }
}

Test(oom_sweep, journal, .timeout = 600)
{
    sweep_t m = {"journal", 8, jr_step, jr_fp, jr_check, NULL, NULL, jr_teardown};
    cr_assert_eq(run_sweep(&m), 0, "the codecs allocate");
}

/* Page tokens, the same: encoded into and decoded from caller memory. */
static struct {
    kvidx_token_keyring_t kr;
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t len;
    kvidx_page_cursor_t cur;
} PT;

static uint64_t pt_fp(void)
{
    uint64_t h = fingerprint_bytes(FINGERPRINT_SEED, PT.tok, PT.len);
    h = fold64(h, PT.kr.count ^ (uint64_t)PT.cur.flags << 8 ^ (uint64_t)PT.cur.secret_id << 16);
    h = fingerprint_bytes(h, PT.cur.key.hash, PT.cur.key.hash_len);
    return fingerprint_bytes(h, PT.cur.model, PT.cur.key.model_len);
}

static void pt_teardown(void)
{
    memset(&PT, 0, sizeof(PT));
}

static int pt_step(int i)
{
    static const uint8_t digest[KVIDX_LIST_DIGEST_LEN] = {1, 2, 3};
    kvidx_token_secret_t sec;
    memset(&sec, 0, sizeof(sec));
    switch (i) {
    case 0:
        kvidx_token_keyring_init(&PT.kr);
        return 0;
    case 1:
    case 2:
        sec.id = (uint32_t)i;
        sec.secret[0] = (uint8_t)i;
        return kvidx_token_keyring_rotate(&PT.kr, &sec);
    case 3: {
        kvidx_key_t k = key_of(7);
        PT.len = sizeof(PT.tok);
        return kvidx_page_token_encode(kvidx_token_keyring_current(&PT.kr), 1000, digest, &k,
                                       KVIDX_PAGE_CURSOR_INCLUSIVE, PT.tok, &PT.len);
    }
    default: {
        int rc = kvidx_page_token_decode(&PT.kr, PT.tok, PT.len, 1010, 60, digest, &PT.cur);
        kvidx_key_t k = key_of(7);
        return rc == 0 && kvidx_key_cmp(&PT.cur.key, &k) != 0 ? KVIDX_EINTERNAL : rc;
    }
    }
}

Test(oom_sweep, page_token, .timeout = 600)
{
    sweep_t m = {"page_token", 5, pt_step, pt_fp, jr_check, NULL, NULL, pt_teardown};
    cr_assert_eq(run_sweep(&m), 0, "page tokens allocate");
}

/* ---- (d) the fleet directory, its codec and its replay ---- */

enum { DR_BLOBS = 16 };

static struct {
    kvidx_directory_t *d, *d2; /* d2: what the replay of d's journal built */
    kvidx_directory_t *d3;     /* what the replay of some of d's state records built */
    uint8_t *sblob[7];         /* those records: 2 keys, 2 bindings, an instance, ... */
    size_t sblob_len[7], nsblobs;
    int skept[6]; /* per record type */
    kvidx_dir_replay_t rp;
    int rp_open;
    uint8_t *blob[DR_BLOBS];
    size_t blob_len[DR_BLOBS], nblobs;
    uint32_t toks[300][4];
    uint64_t out;
} DR;

static uint64_t dir_fp(const kvidx_directory_t *d)
{
    if (!d)
        return 3;
    char *t = dir_text(d);
    cr_assert_not_null(t);
    uint64_t h = fingerprint_bytes(FINGERPRINT_SEED, t, strlen(t));
    free(t);
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    st.memory_bytes = 0; /* room kept by a failed call is not state */
    return fingerprint_bytes(h, &st, sizeof(st));
}

static uint64_t dr_fp(void)
{
    uint64_t h = fold64(fold64(dir_fp(DR.d), dir_fp(DR.d2)), DR.out);
    h = fold64(h, dir_fp(DR.d3));
    for (size_t j = 0; j < DR.nsblobs; j++)
        h = fingerprint_bytes(h, DR.sblob[j], DR.sblob_len[j]);
    if (DR.rp_open) {
        const kvidx_dir_replay_t *r = &DR.rp;
        h = fold64(h, r->total ^ r->have << 32 ^ (uint64_t)r->open << 63);
        h = fold64(h, r->batches ^ r->mismatches << 20 ^ r->dropped << 40);
    }
    for (size_t j = 0; j < DR.nblobs; j++)
        h = fingerprint_bytes(h, DR.blob[j], DR.blob_len[j]);
    return h;
}

static int dr_check(void)
{
    if (DR.d && kvidx_directory_check(DR.d))
        return KVIDX_EINTERNAL;
    if (DR.d3 && kvidx_directory_check(DR.d3))
        return KVIDX_EINTERNAL;
    return DR.d2 ? kvidx_directory_check(DR.d2) : 0;
}

static void dr_teardown(void)
{
    kvidx_directory_free(DR.d);
    kvidx_directory_free(DR.d2);
    kvidx_directory_free(DR.d3);
    for (size_t j = 0; j < DR.nsblobs; j++)
        free(DR.sblob[j]);
    if (DR.rp_open)
        kvidx_dir_replay_free(&DR.rp);
    for (size_t j = 0; j < DR.nblobs; j++)
        free(DR.blob[j]);
    memset(&DR, 0, sizeof(DR));
}

static const char *dr_models[] = {"m", "m/x", "other"};
static const char *dr_salts[] = {"", "s", "t"};

/* Store batch `step`: step 0 is 120 entries, the others 5. */
static kvidx_dir_batch_t dr_store_batch(int step, kvidx_dir_entry_t *e)
{
    static const uint8_t lens[] = {8, 32, 64, 1, 17};
    size_t n = step == 0 ? 120 : 5;
    for (size_t i = 0; i < n; i++) {
        unsigned h = (unsigned)(i + (size_t)step * 3);
        e[i] = mkentry(mkkey_len(dr_models[i % 3], dr_salts[(i / 3) % 3], (uint32_t)(i % 2), 0, h,
                                 lens[h % 5]),
                       100 + i);
        if (i % 2 == 0) {
            for (int j = 0; j < 4; j++)
                DR.toks[i][j] = (uint32_t)(h + (unsigned)j + (unsigned)step);
            e[i].token_ids = DR.toks[i];
            e[i].num_tokens = 1 + i % 4;
            e[i].token_offset = (int64_t)i;
        }
    }
    const char *inst = step % 2 ? "b" : "a";
    kvidx_dir_batch_t b =
        mkbatch(inst, step >= 4 ? 2 : 1, (uint64_t)step + 1, KVIDX_DIR_STORE,
                step % 3 ? KVIDX_DIR_L1 : KVIDX_DIR_L2, step % 3 == 2 ? "cxl" : "dram", e, n);
    b.shared = step == 2;
    b.ts = step;
    return b;
}

static int dr_store(int step)
{
    kvidx_dir_entry_t e[300];
    kvidx_dir_batch_t b = dr_store_batch(step, e);
    kvidx_dir_verdict_t v;
    int rc = kvidx_directory_ingest(DR.d, &b, &v);
    if (rc == 0)
        DR.out = fold64(DR.out, v);
    return rc;
}

static int dr_simple(kvidx_dir_event_t ev, const char *inst, uint64_t seq)
{
    kvidx_dir_entry_t e[3] = {mkentry(mkkey_len("m", "", 0, 0, 0, 8), 0),
                              mkentry(mkkey_len("m/x", "s", 1, 0, 1, 32), 0),
                              mkentry(mkkey_len("zzz", "", 0, 0, 2, 64), 0)};
    kvidx_dir_batch_t b =
        mkbatch(inst, 1, seq, ev, KVIDX_DIR_L2, ev == KVIDX_DIR_ACCESS ? "" : "dram", e,
                ev == KVIDX_DIR_CONFIG ? 0 : 3);
    b.capacity_revision = seq;
    b.capacity_bytes = 4096;
    b.ts = 77;
    kvidx_dir_verdict_t v;
    int rc = kvidx_directory_ingest(DR.d, &b, &v);
    if (rc == 0)
        DR.out = fold64(DR.out, v);
    return rc;
}

static int dr_register(const char *id)
{
    kvidx_dir_instance_t x = {.instance_id = id,
                              .instance_len = strlen(id),
                              .ip = "127.0.0.1",
                              .ip_len = 9,
                              .http_port = 80,
                              .p2p_advertised_url = "tcp://p",
                              .p2p_len = 7,
                              .metadata = "{\"a\":\"b\"}",
                              .metadata_len = 9,
                              .registration_time = 3.25,
                              .last_seen_ms = 10};
    return kvidx_directory_register(DR.d, &x, NULL);
}

static int dr_load(int which)
{
    kvidx_dir_record_t r;
    memset(&r, 0, sizeof(r));
    kvidx_dir_placement_t p[3] = {{"new1", 4, 7, KVIDX_DIR_L1, "pmem", 4, 10, 0},
                                  {"new2", 4, 1, KVIDX_DIR_L2, "s3", 2, 20, 1},
                                  {"a", 1, 1, KVIDX_DIR_L2, "fs", 2, 30, 0}};
    static const uint32_t tok[] = {9, 8, 7};
    kvidx_key_t k = mkkey_len("loaded", "ls", 3, 5, 200, 40);
    switch (which) {
    case 0:
        r.type = KVIDX_DIR_REC_KEY;
        r.key.key = k;
        r.key.last_access = 12.5;
        r.key.placements = p;
        r.key.num_placements = 3;
        break;
    case 1:
        r.type = KVIDX_DIR_REC_BINDING;
        r.binding.hash = k.hash;
        r.binding.hash_len = 40;
        r.binding.token_offset = 5;
        r.binding.token_ids = tok;
        r.binding.num_tokens = 3;
        break;
    case 2:
        r.type = KVIDX_DIR_REC_STREAM;
        r.stream = (kvidx_dir_stream_t){"streamonly", 10, 9, 99, 1, 5, 6, 7, 1.5};
        break;
    case 3:
        r.type = KVIDX_DIR_REC_CAPACITY;
        r.capacity = (kvidx_dir_capacity_t){"capsonly", 8, 1, 2, KVIDX_DIR_L1, "hbm", 3, 1000, 0};
        break;
    default:
        r.type = KVIDX_DIR_REC_INSTANCE;
        r.instance = (kvidx_dir_instance_t){"reg2", 4, "::1", 3, 1, 2, "", 0, "{}", 2, 0.5, 3};
        break;
    }
    return kvidx_directory_load(DR.d, &r);
}

static uint64_t fp_row(uint64_t h, kvidx_dir_row_t *row)
{
    h = fingerprint_bytes(h, row->key.hash, row->key.hash_len);
    h = fingerprint_bytes(h, row->key.model, row->key.model_len);
    h = fold64(h, row->num_placements ^ row->num_tokens << 20 ^ (uint64_t)row->token_offset << 40);
    kvidx_dir_placement_t p;
    while (kvidx_directory_row_next(row, &p)) {
        h = fingerprint_bytes(h, p.instance_id, p.instance_len);
        h = fingerprint_bytes(h, p.backend, p.backend_len);
        h = fold64(h, p.size_bytes ^ p.incarnation << 40 ^ (uint64_t)p.tier << 60);
    }
    return h;
}

static int dr_row_cb(void *ctx, kvidx_dir_row_t *row)
{
    *(uint64_t *)ctx = fp_row(*(uint64_t *)ctx, row);
    return 0;
}

static int dr_reads(int which)
{
    uint64_t h = FINGERPRINT_SEED, total = 0;
    kvidx_dir_filter_t f;
    memset(&f, 0, sizeof(f));
    int rc = 0;
    switch (which) {
    case 0: {
        kvidx_dir_row_t row;
        kvidx_key_t k = mkkey_len("m/x", "s", 1, 0, 1, 32);
        rc = kvidx_directory_lookup(DR.d, &k, &row);
        if (rc == 0)
            h = fp_row(h, &row);
        rc = rc == KVIDX_ENOTFOUND ? 0 : rc;
        break;
    }
    case 1:
        f.tier = KVIDX_DIR_L1;
        rc = kvidx_directory_list(DR.d, &f, 10, 50, dr_row_cb, &h, &total);
        h = fold64(h, total);
        break;
    case 2: {
        /* Every page of a resumable listing of instance "b". */
        f.instance_id = "b";
        f.instance_len = 1;
        kvidx_key_t resume, after;
        kvidx_key_buf_t copy;
        int more = 1, first = 1;
        while (more && rc == 0) {
            rc = kvidx_directory_scan(DR.d, &f, first ? NULL : &after, 7, 40, dr_row_cb, &h,
                                      &resume, &more);
            if (more) {
                kvidx_key_buf_set(&copy, &resume);
                after = copy.key;
            }
            first = 0;
        }
        break;
    }
    case 3: {
        const uint32_t *tok;
        size_t nt = 0;
        int64_t off = 0;
        kvidx_key_t k = mkkey_len("m", "", 0, 0, 0, 8);
        int has = kvidx_directory_tokens(DR.d, k.hash, k.hash_len, &tok, &nt, &off);
        h = fold64(h, (uint64_t)has ^ nt << 8 ^ (uint64_t)off << 32);
        break;
    }
    default: {
        int64_t w[1] = {-1};
        kvidx_fold_shape_t s = {w, 1, 3, 2};
        kvidx_key_t k[6];
        for (unsigned i = 0; i < 6; i++)
            k[i] = mkkey_len("m", "", i % 2, 0, i / 2, 8);
        kvidx_dir_score_t *out;
        size_t n;
        rc = kvidx_directory_score(DR.d, k, 6, &s, &out, &n);
        if (rc == 0) {
            for (size_t j = 0; j < n; j++) {
                h = fold64(h, out[j].l1_chunks ^ out[j].l2_chunks << 20 ^ out[j].any_chunks << 40);
                h = fingerprint_bytes(h, out[j].instance_id ? out[j].instance_id : "*",
                                      out[j].instance_id ? out[j].instance_len : 1);
            }
            kvidx_directory_score_free(out);
        }
        break;
    }
    }
    if (rc == 0)
        DR.out = fold64(DR.out, h);
    return rc;
}

static int dr_emit(void *ctx, const uint8_t *blob, size_t len)
{
    (void)ctx;
    cr_assert_lt(DR.nblobs, DR_BLOBS);
    uint8_t *c = malloc(len);
    cr_assert_not_null(c);
    memcpy(c, blob, len);
    DR.blob[DR.nblobs] = c;
    DR.blob_len[DR.nblobs++] = len;
    return 0;
}

/* The journal of store batch 0 and of a registration: blobs of at most
 * 4 KiB, so the batch takes several. */
static int dr_encode(int which)
{
    kvidx_dir_entry_t e[300];
    kvidx_dir_batch_t b = dr_store_batch(0, e);
    kvidx_dir_instance_t x = {.instance_id = "r",
                              .instance_len = 1,
                              .ip = "::1",
                              .ip_len = 3,
                              .http_port = 8,
                              .metadata = "{}",
                              .metadata_len = 2};
    kvidx_dir_change_t c;
    memset(&c, 0, sizeof(c));
    c.type = which ? KVIDX_DIR_CHG_REGISTER : KVIDX_DIR_CHG_BATCH;
    c.batch = &b;
    c.verdict = KVIDX_DIR_ADMITTED;
    c.instance = &x;
    size_t before = DR.nblobs;
    int rc = kvidx_dir_change_encode(&c, 4096, dr_emit, NULL);
    if (rc == 0)
        cr_assert_gt(DR.nblobs, before + (which ? 0 : 1), "a batch of several blobs");
    return rc;
}

static int dr_replay(size_t j)
{
    if (j >= DR.nblobs)
        return 0;
    return kvidx_dir_replay_blob(&DR.rp, DR.d2, DR.blob[j], DR.blob_len[j]);
}

/* The dump's records, each encoded as a snapshot blob: their bytes. */
static int dr_record_cb(void *ctx, const kvidx_dir_record_t *rec)
{
    (void)ctx;
    size_t before = DR.nblobs;
    int rc = kvidx_dir_record_encode(rec, 4096, dr_emit, NULL);
    static const int keep[6] = {0, 1, 1, 1, 2, 2}; /* by kvidx_dir_rec_type_t */
    for (size_t j = before; j < DR.nblobs; j++) {
        DR.out = fingerprint_bytes(DR.out, DR.blob[j], DR.blob_len[j]);
        if (j == before && DR.skept[rec->type] < keep[rec->type]) {
            DR.skept[rec->type]++;
            DR.sblob[DR.nsblobs] = DR.blob[j];
            DR.sblob_len[DR.nsblobs++] = DR.blob_len[j];
            continue;
        }
        free(DR.blob[j]);
    }
    DR.nblobs = before;
    return rc;
}

static int dr_dump(void)
{
    uint64_t out = DR.out;
    int rc = kvidx_directory_dump(DR.d, dr_record_cb, NULL);
    if (rc) {
        DR.out = out;
        for (size_t j = 0; j < DR.nsblobs; j++)
            free(DR.sblob[j]);
        DR.nsblobs = 0;
        memset(DR.skept, 0, sizeof(DR.skept));
    }
    return rc;
}

#define DR_STEPS 54

static int dr_step(int i)
{
    switch (i) {
    case 0:
    case 30: {
        kvidx_dir_options_t o = {.has_seed = 1};
        kvidx_directory_t **d = i ? &DR.d2 : &DR.d;
        *d = NULL;
        return kvidx_directory_new(&o, d);
    }
    case 1:
        return dr_register("a");
    case 2:
        return dr_register("b");
    case 3:
    case 4:
    case 5:
    case 6:
        return dr_store(i - 3);
    case 7:
        return dr_simple(KVIDX_DIR_CONFIG, "c", 1);
    case 8:
        return dr_simple(KVIDX_DIR_CONFIG, "c", 2);
    case 9:
        return dr_simple(KVIDX_DIR_ACCESS, "d", 1);
    case 10:
        return dr_simple(KVIDX_DIR_DELETE, "a", 100);
    case 11:
        return dr_simple(KVIDX_DIR_DELETE, "a", 100); /* a duplicate */
    case 12:
    case 13:
        return dr_store(i - 8); /* incarnation 2: fences "a" */
    case 14:
    case 15:
    case 16:
    case 17:
    case 18:
        return dr_load(i - 14);
    case 19:
        return kvidx_directory_heartbeat(DR.d, "b", 1, 50);
    case 20:
    case 21:
    case 22:
    case 23:
    case 24:
        return dr_reads(i - 20);
    case 25:
        return dr_dump();
    case 26:
        return kvidx_directory_check(DR.d);
    case 27:
    case 28:
        return dr_encode(i - 27);
    case 29:
        kvidx_dir_replay_init(&DR.rp, 5);
        DR.rp_open = 1;
        return 0;
    case 40:
        kvidx_directory_set_token_cap(DR.d, 600);
        return 0;
    case 41:
        return dr_register("a");
    case 42:
        return kvidx_directory_deregister(DR.d, "b", 1);
    case 43:
        kvidx_directory_expire(DR.d, 100000, 1000, NULL);
        return 0;
    case 44: {
        kvidx_dir_options_t o = {.has_seed = 1};
        DR.d3 = NULL;
        return kvidx_directory_new(&o, &DR.d3);
    }
    case 45:
    case 46:
    case 47:
    case 48:
    case 49:
    case 50:
    case 51: /* the kept state records replayed into d3 */
        cr_assert_eq(DR.nsblobs, 7);
        return kvidx_dir_replay_blob(&DR.rp, DR.d3, DR.sblob[i - 45], DR.sblob_len[i - 45]);
    case 52:
    case 53: /* under the token cap, after a deregistration */
        return dr_store(i - 46);
    default: /* 31..39: the journal's blobs replayed into d2 */
        return dr_replay((size_t)(i - 31));
    }
}

Test(oom_sweep, directory, .timeout = 600)
{
    sweep_t m = {"directory", DR_STEPS, dr_step, dr_fp, dr_check, NULL, NULL, dr_teardown};
    cr_assert_geq(run_sweep(&m), 100);
}

/* ---- (e) the layouts registry ---- */

static kvidx_layouts_t *LY;
static uint64_t ly_out;

/* The registry has no check of its own: everything kvidx_layouts_at and
 * kvidx_layouts_find show. */
static uint64_t ly_fp(void)
{
    if (!LY)
        return 5;
    uint64_t h = fold64(FINGERPRINT_SEED, kvidx_layouts_count(LY) ^ ly_out << 16);
    kvidx_layout_entry_t e;
    for (size_t i = 0; kvidx_layouts_at(LY, i, &e) == 0; i++) {
        h = fingerprint_bytes(h, e.model, e.model_len);
        h = fingerprint_bytes(h, e.desc, e.desc_len + 1);
        h = fold64(h, e.size ^ (uint64_t)e.world_size << 48);
        kvidx_layout_entry_t f;
        cr_assert_eq(kvidx_layouts_find(LY, e.model, e.model_len, e.world_size, &f), 0);
        cr_assert_eq(f.size, e.size);
    }
    return h;
}

static int ly_check(void)
{
    return 0;
}

static void ly_teardown(void)
{
    kvidx_layouts_free(LY);
    LY = NULL;
    ly_out = 0;
}

static int ly_put(int m, uint8_t ws, uint64_t size)
{
    char model[16], desc[64];
    int ml = snprintf(model, sizeof(model), "model-%d", m);
    int dl = snprintf(desc, sizeof(desc), "{\"model\":\"model-%d\",\"ws\":%u,\"size\":%llu}", m,
                      (unsigned)ws, (unsigned long long)size);
    return kvidx_layouts_put(LY, model, (size_t)ml, ws, size, desc, (size_t)dl);
}

static int ly_step(int i)
{
    if (i == 0) {
        LY = NULL;
        return kvidx_layouts_new(&LY);
    }
    if (i <= 40) /* new layouts: the array grows */
        return ly_put(i % 13, (uint8_t)(1 + i / 13), 1000 + (uint64_t)i);
    if (i <= 45) /* replacements with longer descriptions */
        return ly_put(i % 13, 1, 5000000000ull + (uint64_t)i);
    if (i <= 50) {
        char model[16];
        int ml = snprintf(model, sizeof(model), "model-%d", i % 13);
        int rc = kvidx_layouts_remove(LY, model, (size_t)ml, 2);
        ly_out = fold64(ly_out, (uint64_t)rc);
        return rc == KVIDX_ENOTFOUND ? 0 : rc;
    }
    return ly_put(i, 7, 42); /* new after removals */
}

Test(oom_sweep, layouts, .timeout = 600)
{
    sweep_t m = {"layouts", 56, ly_step, ly_fp, ly_check, NULL, NULL, ly_teardown};
    cr_assert_geq(run_sweep(&m), 40);
}

/* ---- (f) refsets and tokens ---- */

static struct {
    kvidx_refset_t s;
    uint64_t out;
} RS;

static uint32_t rs_ref(uint32_t i)
{
    return i * 2654435761u % 100003u;
}

/* Members and marks over the refs the workload uses, and the counts. */
static uint64_t rs_fp(void)
{
    uint64_t h = fold64(FINGERPRINT_SEED, RS.s.count ^ RS.s.marked << 32);
    h = fold64(h, RS.out);
    for (uint32_t i = 0; i < 3000; i++)
        h = fold64(h, (uint64_t)kvidx_refset_has(&RS.s, rs_ref(i)) |
                          (uint64_t)kvidx_refset_marked(&RS.s, rs_ref(i)) << 1);
    return h;
}

static int rs_check(void)
{
    return kvidx_refset_check(&RS.s);
}

static void rs_teardown(void)
{
    kvidx_refset_free(&RS.s);
    memset(&RS, 0, sizeof(RS));
}

/* Adds refs [from, to) (room reserved first, as the header asks). */
static int rs_add(uint32_t from, uint32_t to, int mark)
{
    int rc = kvidx_refset_reserve(&RS.s, to - from);
    for (uint32_t i = from; rc == 0 && i < to; i++) {
        int a = kvidx_refset_add(&RS.s, rs_ref(i), mark && i % 3 == 0);
        rc = a < 0 ? a : 0;
    }
    return rc;
}

static int rs_step(int i)
{
    switch (i) {
    case 0:
        kvidx_refset_init(&RS.s);
        return 0;
    case 1:
        return rs_add(0, 10, 1);
    case 2:
        return rs_add(10, 500, 1);
    case 3:
        for (uint32_t j = 0; j < 400; j++)
            RS.out += (uint64_t)kvidx_refset_remove(&RS.s, rs_ref(j));
        return 0;
    case 4:
        /* Few members and many tombstones: the reserve rebuilds. */
        return kvidx_refset_reserve(&RS.s, 50);
    case 5:
        kvidx_refset_unmark_all(&RS.s);
        for (uint32_t j = 400; j < 500; j += 2)
            RS.out += (uint64_t)kvidx_refset_mark(&RS.s, rs_ref(j));
        return 0;
    case 6:
        return rs_add(500, 3000, 0);
    default: {
        /* A walk that removes every other member. */
        size_t pos = 0;
        uint32_t ref;
        int mark, k = 0;
        while (kvidx_refset_next(&RS.s, &pos, &ref, &mark))
            if (k++ % 2)
                kvidx_refset_remove(&RS.s, ref);
        return kvidx_refset_reserve(&RS.s, 4000);
    }
    }
}

Test(oom_sweep, refset, .timeout = 600)
{
    sweep_t m = {"refset", 8, rs_step, rs_fp, rs_check, NULL, NULL, rs_teardown};
    cr_assert_geq(run_sweep(&m), 5);
}

static kvidx_tokens_t *TK[2];

static uint64_t tk_fp(void)
{
    uint64_t h = FINGERPRINT_SEED;
    for (int j = 0; j < 2; j++) {
        if (!TK[j])
            continue;
        kvidx_principal_t p;
        for (size_t i = 0; kvidx_tokens_at(TK[j], i, &p) == 0; i++)
            h = fingerprint_bytes(h, &p, sizeof(p));
        char tok[32];
        int n = snprintf(tok, sizeof(tok), "tok-%d-%d", j, 17);
        memset(&p, 0, sizeof(p));
        h = fold64(h, (uint64_t)kvidx_tokens_find(TK[j], tok, (size_t)n, &p));
        h = fingerprint_bytes(h, &p, sizeof(p));
    }
    return h;
}

static int tk_check(void)
{
    return 0;
}

static void tk_teardown(void)
{
    for (int j = 0; j < 2; j++) {
        kvidx_tokens_free(TK[j]);
        TK[j] = NULL;
    }
}

static int tk_step(int i)
{
    static const char *roles[] = {"read", "write", "admin"};
    static char text[32768];
    size_t len = 0;
    int n = i ? 300 : 40; /* the second file grows the table past its first room */
    for (int k = 0; k < n; k++)
        len += (size_t)snprintf(text + len, sizeof(text) - len, "tok-%d-%d %s%s%s\n", i, k,
                                roles[k % 3], k % 4 || k % 3 == 2 ? "" : " salt=s",
                                k % 8 || k % 3 == 2 ? "" : " quota_bytes=1MiB");
    TK[i] = NULL;
    unsigned line = 0;
    const char *why = NULL;
    int rc = kvidx_tokens_parse(text, len, &TK[i], &line, &why);
    cr_assert(rc == 0 || TK[i] == NULL, "a failed parse hands out a table");
    return rc;
}

Test(oom_sweep, tokens, .timeout = 600)
{
    sweep_t m = {"tokens", 2, tk_step, tk_fp, tk_check, NULL, NULL, tk_teardown};
    cr_assert_geq(run_sweep(&m), 4);
}
