/*
 * Prefetch planning and trimming, docs/prefetch.md (LOOKUP) and §4.2 (WARM), for
 * one request and independent of the index.
 *
 * Plan: available = every key whose state is not ABSENT. PREFIX and
 * SEGMENTED_PREFIX plan the leading run of available (for the ipc form, the
 * keys that serve the fold of available, §4.3); SPARSE plans every
 * available key. Planned READY keys are L1 hits (pinned by LOOKUP), planned
 * LOADING keys join a load in flight, planned L2 keys need a new load; the
 * last two together are l2_orig_indices.
 *
 * Trim: a planned key whose load failed is a miss. found = the planned keys
 * left (WARM adds every ready L1 hit, planned or not: it reports residency).
 * LOOKUP PREFIX retains the leading run of found (ipc form: the keys serving
 * the fold of found); SEGMENTED_PREFIX and SPARSE retain all of found; WARM
 * retains nothing. Invariants: retained ⊆ found ⊆ planned ∪ ready, and every
 * list is ascending. A plan and a result each own two kvidx_malloc blocks:
 * the bitmaps (and the window copy), then the index lists sized exactly;
 * a list that equals another list or its beginning shares its storage.
 */
#include "kvidx/prefetch_plan.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <string.h>

size_t kvidx_prefetch_leading_run(const uint8_t *b, size_t n)
{
    size_t k = 0;
    while (k < n && b[k])
        k++;
    return k;
}

static int check_req(const kvidx_prefetch_req_t *req)
{
    if (!req || (req->n > 0 && !req->state) || req->n > UINT32_MAX)
        return KVIDX_EINVAL;
    if (req->mode != KVIDX_PF_LOOKUP && req->mode != KVIDX_PF_WARM)
        return KVIDX_EINVAL;
    if (req->policy != KVIDX_TRIM_PREFIX && req->policy != KVIDX_TRIM_SEGMENTED_PREFIX &&
        req->policy != KVIDX_TRIM_SPARSE)
        return KVIDX_EINVAL;
    for (size_t i = 0; i < req->n; i++) {
        if (req->state[i] > KVIDX_PF_L2)
            return KVIDX_EINVAL;
    }
    if (req->ipc) {
        if (kvidx_fold_shape_check(req->ipc) != 0 || kvidx_fold_num_keys(req->ipc) != req->n)
            return KVIDX_EINVAL;
    }
    return 0;
}

/* Fills plan->planned from plan->state; plan->shape is set for the ipc form. */
static int fill_planned(kvidx_prefetch_plan_t *plan)
{
    const size_t n = plan->n;
    if (plan->is_ipc) {
        /* A state byte is nonzero exactly when the key is available. */
        int err = kvidx_fold(&plan->shape, plan->state, &plan->planned_chunks);
        if (err)
            return err;
    }
    if (plan->policy == KVIDX_TRIM_SPARSE) {
        const uint8_t *state = plan->state;
        uint8_t *planned = plan->planned;
        for (size_t i = 0; i < n; i++)
            planned[i] = state[i] != KVIDX_PF_ABSENT;
    } else if (plan->is_ipc) {
        return kvidx_fold_retained_mark(&plan->shape, plan->planned_chunks, plan->planned);
    } else {
        size_t k = kvidx_prefetch_leading_run(plan->state, n);
        memset(plan->planned, 1, k);
        memset(plan->planned + k, 0, n - k);
    }
    return 0;
}

int kvidx_prefetch_plan(const kvidx_prefetch_req_t *req, kvidx_prefetch_plan_t *plan)
{
    if (!plan)
        return KVIDX_EINVAL;
    memset(plan, 0, sizeof(*plan));
    int err = check_req(req);
    if (err)
        return err;
    const size_t n = req->n;
    const size_t G = req->ipc ? req->ipc->num_groups : 0;

    /* Block 0: the window copy first (for alignment), then state, planned. */
    unsigned char *mem = kvidx_malloc(G * sizeof(int64_t) + 2 * n + 1);
    if (!mem)
        return KVIDX_ENOMEM;
    plan->mem_[0] = mem;
    plan->n = n;
    plan->mode = req->mode;
    plan->policy = req->policy;
    if (req->ipc) {
        int64_t *windows = (int64_t *)(void *)mem;
        if (G > 0)
            memcpy(windows, req->ipc->windows, G * sizeof(int64_t));
        plan->is_ipc = 1;
        plan->shape = *req->ipc;
        plan->shape.windows = windows;
    }
    plan->state = mem + G * sizeof(int64_t);
    plan->planned = plan->state + n;
    if (n > 0)
        memcpy(plan->state, req->state, n);
    err = fill_planned(plan);
    if (err)
        goto fail;

    size_t n1 = 0, n2 = 0, nnew = 0;
    for (size_t i = 0; i < n; i++) {
        if (!plan->planned[i])
            continue;
        uint8_t st = plan->state[i];
        n1 += st == KVIDX_PF_L1_READY;
        n2 += st == KVIDX_PF_L1_LOADING || st == KVIDX_PF_L2;
        nnew += st == KVIDX_PF_L2;
    }
    /* When no planned key joins a load in flight (the common case),
     * new_loads is l2_orig and shares its storage. */
    const int share = nnew == n2;
    uint32_t *lists = kvidx_malloc((n1 + n2 + (share ? 0 : nnew)) * sizeof(uint32_t) + 1);
    if (!lists) {
        err = KVIDX_ENOMEM;
        goto fail;
    }
    plan->mem_[1] = lists;
    /* Locals, not the struct's fields, so the loop keeps them in registers. */
    uint32_t *hits = lists, *orig = lists + n1, *fresh = share ? orig : lists + n1 + n2;
    size_t k1 = 0, k2 = 0, knew = 0;
    for (size_t i = 0; i < n; i++) {
        if (!plan->planned[i])
            continue;
        uint8_t st = plan->state[i];
        if (st == KVIDX_PF_L1_READY) {
            hits[k1++] = (uint32_t)i;
        } else {
            orig[k2++] = (uint32_t)i;
            if (st == KVIDX_PF_L2 && !share)
                fresh[knew] = (uint32_t)i;
            knew += st == KVIDX_PF_L2;
        }
    }
    plan->l1_hits = hits;
    plan->n_l1_hits = k1;
    plan->l2_orig = orig;
    plan->n_l2_orig = k2;
    plan->new_loads = fresh;
    plan->n_new_loads = knew;
    /* WARM pins nothing, so its l1_found_indices is empty (docs/prefetch.md). */
    plan->l1_found = plan->l1_hits;
    plan->n_l1_found = plan->mode == KVIDX_PF_LOOKUP ? plan->n_l1_hits : 0;
    return 0;

fail:
    kvidx_prefetch_plan_free(plan);
    return err;
}

void kvidx_prefetch_plan_free(kvidx_prefetch_plan_t *plan)
{
    if (!plan)
        return;
    kvidx_free(plan->mem_[0]);
    kvidx_free(plan->mem_[1]);
    memset(plan, 0, sizeof(*plan));
}

/* found_map from the plan and the failures (see the header for the rule). */
static void fill_found(const kvidx_prefetch_plan_t *plan, const uint8_t *failed, uint8_t *found)
{
    /* Locals: stores through a byte pointer may alias anything, so reading
     * plan's fields in the loop would reload them on every key. */
    const size_t n = plan->n;
    const uint8_t *state = plan->state, *planned = plan->planned;
    const int warm = plan->mode == KVIDX_PF_WARM;
    for (size_t i = 0; i < n; i++) {
        uint8_t st = state[i];
        int load = planned[i] && (st == KVIDX_PF_L1_LOADING || st == KVIDX_PF_L2);
        int fail = load && failed && failed[i];
        if (warm)
            found[i] = st == KVIDX_PF_L1_READY || (load && !fail);
        else
            found[i] = planned[i] && !fail;
    }
}

int kvidx_prefetch_trim(const kvidx_prefetch_plan_t *plan, const uint8_t *failed,
                        kvidx_prefetch_result_t *res)
{
    if (!res)
        return KVIDX_EINVAL;
    memset(res, 0, sizeof(*res));
    if (!plan || (plan->n > 0 && (!plan->state || !plan->planned)))
        return KVIDX_EINVAL;
    const size_t n = plan->n;
    int err;

    unsigned char *maps = kvidx_malloc(2 * n + 1);
    if (!maps)
        return KVIDX_ENOMEM;
    res->mem_[0] = maps;
    res->found_map = maps;
    res->retained_map = maps + n;
    fill_found(plan, failed, res->found_map);
    res->hit_keys = kvidx_prefetch_leading_run(res->found_map, n);
    if (plan->is_ipc) {
        err = kvidx_fold(&plan->shape, res->found_map, &res->hit_chunks);
        if (err)
            goto fail;
    }

    if (plan->mode == KVIDX_PF_WARM) {
        memset(res->retained_map, 0, n);
    } else if (plan->policy != KVIDX_TRIM_PREFIX) {
        memcpy(res->retained_map, res->found_map, n);
    } else if (plan->is_ipc) {
        /* The keys serving the fold of found are all found (each counts). */
        err = kvidx_fold_retained_mark(&plan->shape, res->hit_chunks, res->retained_map);
        if (err)
            goto fail;
    } else {
        memset(res->retained_map, 1, res->hit_keys);
        memset(res->retained_map + res->hit_keys, 0, n - res->hit_keys);
    }

    /* WARM releases nothing: it never pinned anything. Except for the ipc
     * form's LOOKUP + PREFIX, retained is the first n_retained entries of
     * found (all of found, its leading run, or nothing), so it shares
     * found's storage instead of a second list as long as the request. */
    const int lookup = plan->mode == KVIDX_PF_LOOKUP;
    const int share = !(plan->is_ipc && lookup && plan->policy == KVIDX_TRIM_PREFIX);
    const uint8_t *fm = res->found_map, *rm = res->retained_map;
    size_t nf = 0, nr = 0, nrel = 0;
    for (size_t i = 0; i < n; i++) {
        nf += fm[i] != 0;
        nr += rm[i] != 0;
        nrel += lookup && fm[i] && !rm[i];
    }
    uint32_t *lists = kvidx_malloc((nf + (share ? 0 : nr) + nrel) * sizeof(uint32_t) + 1);
    if (!lists) {
        err = KVIDX_ENOMEM;
        goto fail;
    }
    res->mem_[1] = lists;
    uint32_t *found = lists, *kept = share ? lists : lists + nf;
    uint32_t *rel = lists + nf + (share ? 0 : nr);
    size_t kf = 0, kr = 0, krel = 0;
    for (size_t i = 0; i < n; i++) {
        if (fm[i])
            found[kf++] = (uint32_t)i;
        if (rm[i]) {
            if (!share)
                kept[kr] = (uint32_t)i;
            kr++;
        } else if (fm[i] && lookup) {
            rel[krel++] = (uint32_t)i;
        }
    }
    res->found = found;
    res->n_found = kf;
    res->retained = kept;
    res->n_retained = kr;
    res->released = rel;
    res->n_released = krel;
    return 0;

fail:
    kvidx_prefetch_result_free(res);
    return err;
}

void kvidx_prefetch_result_free(kvidx_prefetch_result_t *res)
{
    if (!res)
        return;
    kvidx_free(res->mem_[0]);
    kvidx_free(res->mem_[1]);
    memset(res, 0, sizeof(*res));
}
