/*
 * One prefetch handle's pin ledger and state machine (see
 * kvidx/prefetch_handle.h).
 *
 * Invariants, checked by tests/unit/test_prefetch_handle.c after every
 * step of a randomized run:
 *   - h->pins == sum of keys[].pins, and every one of those pins is held
 *     in the index on the copy of generation keys[i].gen;
 *   - a key's pins are only given back through hkey_unpin, which first
 *     checks the generation: pins on a vanished copy become lost, never
 *     unpinned;
 *   - a handle that is released or expired holds no pin and waits for no
 *     load.
 */
#include "kvidx/prefetch_handle.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <string.h>

/* Pins on a copy that is no longer the one pinned are lost. */
static int hkey_check(kvidx_pfh_t *h, const kvidx_index_t *idx, size_t i)
{
    kvidx_pfh_key_t *k = &h->keys[i];
    if (!k->pins)
        return 0;
    kvidx_entry_info_t info;
    if (kvidx_index_info(idx, k->ref, &info) != 0 || info.l1_state == KVIDX_L1_NONE ||
        info.generation != k->gen) {
        h->pins -= k->pins;
        k->pins = 0;
        k->lost = 1;
        return -1;
    }
    return 0;
}

static void hkey_unpin(kvidx_pfh_t *h, kvidx_index_t *idx, size_t i, uint32_t n)
{
    kvidx_pfh_key_t *k = &h->keys[i];
    if (hkey_check(h, idx, i) != 0 || !k->pins || !n)
        return;
    if (n > k->pins)
        n = k->pins;
    if (kvidx_index_unpin(idx, k->ref, k->gen, n) != 0) {
        /* Cannot happen after hkey_check; never retry a pin we may not own. */
        h->pins -= k->pins;
        k->pins = 0;
        k->lost = 1;
        return;
    }
    k->pins -= n;
    h->pins -= n;
}

static int hkey_pin(kvidx_pfh_t *h, kvidx_index_t *idx, size_t i, uint64_t gen)
{
    kvidx_pfh_key_t *k = &h->keys[i];
    uint32_t n = 1 + h->extra;
    if (kvidx_index_pin(idx, k->ref, gen, n) != 0)
        return -1;
    k->gen = gen;
    k->pins += n;
    h->pins += n;
    return 0;
}

void kvidx_pfh_refresh(kvidx_pfh_t *h, const kvidx_index_t *idx)
{
    for (size_t i = 0; i < h->n; i++)
        hkey_check(h, idx, i);
}

int kvidx_pfh_open(kvidx_pfh_t *h, kvidx_index_t *idx, const kvidx_key_t *keys, size_t n,
                   kvidx_prefetch_mode_t mode, kvidx_trim_policy_t policy, uint32_t extra,
                   const kvidx_fold_shape_t *ipc)
{
    memset(h, 0, sizeof(*h));
    if (extra > 127 || (mode != KVIDX_PF_LOOKUP && mode != KVIDX_PF_WARM))
        return KVIDX_EINVAL;
    h->keys = kvidx_calloc(n ? n : 1, sizeof(*h->keys));
    uint8_t *state = kvidx_calloc(n ? n : 1, 1);
    kvidx_ref_t *refs = kvidx_malloc((n ? n : 1) * sizeof(*refs));
    kvidx_entry_info_t *infos = kvidx_malloc((n ? n : 1) * sizeof(*infos));
    if (!h->keys || !state || !refs || !infos) {
        kvidx_free(h->keys);
        kvidx_free(state);
        kvidx_free(refs);
        kvidx_free(infos);
        h->keys = NULL;
        return KVIDX_ENOMEM;
    }
    kvidx_index_find_batch(idx, keys, n, refs, infos);
    for (size_t i = 0; i < n; i++) {
        kvidx_pfh_key_t *k = &h->keys[i];
        k->ref = refs[i];
        if (k->ref == KVIDX_REF_NONE)
            continue;
        const kvidx_entry_info_t info = infos[i];
        k->gen = info.generation;
        if (info.l1_state == KVIDX_L1_READY)
            state[i] = KVIDX_PF_L1_READY;
        else if (info.l1_state == KVIDX_L1_LOADING)
            state[i] = KVIDX_PF_L1_LOADING;
        else if (info.l2)
            state[i] = KVIDX_PF_L2;
    }
    kvidx_free(refs);
    kvidx_free(infos);
    kvidx_prefetch_req_t req = {n, state, mode, policy, ipc};
    int rc = kvidx_prefetch_plan(&req, &h->plan);
    kvidx_free(state);
    if (rc != 0) {
        kvidx_free(h->keys);
        h->keys = NULL;
        return rc;
    }
    h->n = n;
    h->mode = mode;
    h->policy = policy;
    h->extra = mode == KVIDX_PF_WARM ? 0 : extra;
    h->status = KVIDX_PFH_PENDING;
    for (size_t j = 0; j < h->plan.n_l1_found; j++) {
        size_t i = h->plan.l1_found[j];
        /* The copy was just seen ready: a pin only fails on overflow. */
        if (hkey_pin(h, idx, i, h->keys[i].gen) != 0)
            h->keys[i].failed = 1;
    }
    return 0;
}

kvidx_pfh_load_t kvidx_pfh_start_load(kvidx_pfh_t *h, kvidx_index_t *idx, size_t i, int temporary,
                                      uint64_t *gen)
{
    kvidx_pfh_key_t *k = &h->keys[i];
    kvidx_entry_info_t info;
    if (h->status != KVIDX_PFH_PENDING || k->waiting || k->ref == KVIDX_REF_NONE ||
        kvidx_index_info(idx, k->ref, &info) != 0) {
        k->failed = 1;
        return KVIDX_PFH_LOAD_FAILED;
    }
    if (info.l1_state == KVIDX_L1_LOADING) {
        *gen = info.generation;
        k->waiting = 1;
        h->waiting++;
        return KVIDX_PFH_LOAD_JOIN;
    }
    if (info.l1_state == KVIDX_L1_READY) {
        /* A key given twice: its first mention loaded it meanwhile. */
        if (h->mode == KVIDX_PF_LOOKUP && hkey_pin(h, idx, i, info.generation) != 0) {
            k->failed = 1;
            return KVIDX_PFH_LOAD_FAILED;
        }
        k->gen = info.generation;
        return KVIDX_PFH_LOAD_READY;
    }
    if (!info.l2 || kvidx_index_l1_reserve(idx, k->ref, temporary, gen) != 0) {
        k->failed = 1;
        return KVIDX_PFH_LOAD_FAILED;
    }
    k->gen = *gen;
    k->waiting = 1;
    h->waiting++;
    return KVIDX_PFH_LOAD_NEW;
}

int kvidx_pfh_load_result(kvidx_pfh_t *h, kvidx_index_t *idx, size_t i, uint64_t gen, int ok)
{
    kvidx_pfh_key_t *k = &h->keys[i];
    if (!k->waiting)
        return 0;
    k->waiting = 0;
    h->waiting--;
    if (ok && h->mode == KVIDX_PF_LOOKUP)
        ok = hkey_pin(h, idx, i, gen) == 0;
    if (ok)
        k->gen = gen;
    else
        k->failed = 1;
    return h->waiting == 0 && h->status == KVIDX_PFH_PENDING;
}

int kvidx_pfh_complete(kvidx_pfh_t *h, kvidx_index_t *idx)
{
    if (h->status != KVIDX_PFH_PENDING || h->waiting)
        return KVIDX_EINVAL;
    uint8_t *failed = kvidx_calloc(h->n ? h->n : 1, 1);
    int rc = failed ? 0 : KVIDX_ENOMEM;
    for (size_t i = 0; failed && i < h->n; i++)
        failed[i] = h->keys[i].failed;
    if (rc == 0)
        rc = kvidx_prefetch_trim(&h->plan, failed, &h->result);
    kvidx_free(failed);
    h->status = KVIDX_PFH_COMPLETED;
    kvidx_pfh_refresh(h, idx);
    if (rc != 0) {
        /* Keep nothing rather than pins nobody can see. */
        for (size_t i = 0; i < h->n; i++)
            hkey_unpin(h, idx, i, h->keys[i].pins);
        memset(&h->result, 0, sizeof(h->result));
        h->has_result = 0;
        return rc;
    }
    h->has_result = 1;
    for (size_t j = 0; j < h->result.n_released; j++) {
        size_t i = h->result.released[j];
        hkey_unpin(h, idx, i, h->keys[i].pins);
    }
    if (h->mode == KVIDX_PF_WARM) {
        for (size_t j = 0; j < h->plan.n_l1_hits; j++) {
            const kvidx_pfh_key_t *k = &h->keys[h->plan.l1_hits[j]];
            kvidx_entry_info_t info;
            /* Only the copy that was seen: the ref may name another key now. */
            if (kvidx_index_info(idx, k->ref, &info) == 0 && info.generation == k->gen)
                kvidx_index_touch(idx, k->ref);
        }
    }
    return 0;
}

int kvidx_pfh_release(kvidx_pfh_t *h, kvidx_index_t *idx, const uint32_t *indices, size_t n,
                      size_t *bad)
{
    if (h->status != KVIDX_PFH_COMPLETED) {
        if (bad)
            *bad = 0;
        return KVIDX_ECONFLICT;
    }
    kvidx_pfh_refresh(h, idx);
    if (indices) {
        uint32_t *want = kvidx_calloc(h->n ? h->n : 1, sizeof(*want));
        if (!want)
            return KVIDX_ENOMEM;
        int rc = 0;
        for (size_t j = 0; j < n && rc == 0; j++) {
            uint32_t i = indices[j];
            if (i >= h->n)
                rc = KVIDX_EINVAL;
            else if (!h->has_result || !h->result.retained_map[i] || ++want[i] > h->keys[i].pins)
                rc = KVIDX_ECONFLICT;
            if (rc && bad)
                *bad = j;
        }
        /* Out-of-range wins over conflicts: report the worst of all items. */
        for (size_t j = 0; rc == KVIDX_ECONFLICT && j < n; j++) {
            if (indices[j] >= h->n) {
                rc = KVIDX_EINVAL;
                if (bad)
                    *bad = j;
            }
        }
        if (rc == 0)
            for (size_t i = 0; i < h->n; i++)
                hkey_unpin(h, idx, i, want[i]);
        kvidx_free(want);
        if (rc != 0)
            return rc;
    } else if (h->has_result) {
        for (size_t j = 0; j < h->result.n_retained; j++)
            hkey_unpin(h, idx, h->result.retained[j], 1);
    }
    if (h->pins == 0)
        h->status = KVIDX_PFH_RELEASED;
    return 0;
}

void kvidx_pfh_end(kvidx_pfh_t *h, kvidx_index_t *idx, kvidx_pfh_status_t st)
{
    if (h->status == KVIDX_PFH_RELEASED || h->status == KVIDX_PFH_EXPIRED)
        return;
    for (size_t i = 0; i < h->n; i++) {
        hkey_unpin(h, idx, i, h->keys[i].pins);
        h->keys[i].waiting = 0;
    }
    h->waiting = 0;
    h->status = st;
}

void kvidx_pfh_close(kvidx_pfh_t *h, kvidx_index_t *idx)
{
    if (!h)
        return;
    if (idx)
        kvidx_pfh_end(h, idx, KVIDX_PFH_RELEASED);
    kvidx_prefetch_plan_free(&h->plan);
    kvidx_prefetch_result_free(&h->result);
    kvidx_free(h->keys);
    memset(h, 0, sizeof(*h));
}
