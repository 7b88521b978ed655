/*
 * Prefetch planning and trimming (docs/prefetch.md LOOKUP, §4.2 WARM, §4.3 for the
 * ipc form) as pure functions of one request, independent of the index.
 *
 * The daemon's prefetch manager probes the index and classifies each key of
 * the request (kvidx_pf_state_t), calls kvidx_prefetch_plan to learn what to
 * pin, what to load and what to join, performs that, and when every load
 * has finished calls kvidx_prefetch_trim with the keys whose load failed to
 * learn what to keep, what to release and what to report.
 *
 * Indices are positions in the request (for the ipc form, flat indices of
 * docs/keys.md); lists are ascending uint32_t arrays. Bitmaps are one byte per
 * key. Everything a plan or result holds is allocated with kvidx_malloc and
 * owned by it until its _free function; treat the arrays as read-only, as
 * lists may share storage (new_loads with l2_orig, retained with found).
 */
#ifndef KVIDX_PREFETCH_PLAN_H
#define KVIDX_PREFETCH_PLAN_H

#include "kvidx/fold.h"

#include <stddef.h>
#include <stdint.h>

/* What the index says about one key at submit time. When several apply, the
 * first in this order wins: a ready L1 copy, a loading L1 copy, an L2 copy. */
typedef enum kvidx_pf_state {
    KVIDX_PF_ABSENT = 0,     /* in no tier: not available */
    KVIDX_PF_L1_READY = 1,   /* a ready L1 copy: an L1 hit, pinned at once by LOOKUP */
    KVIDX_PF_L1_LOADING = 2, /* a loading L1 copy: available by joining that load (single-flight) */
    KVIDX_PF_L2 = 3          /* an L1 miss with an L2 copy: loadable by a new load */
} kvidx_pf_state_t;

typedef enum kvidx_prefetch_mode {
    KVIDX_PF_LOOKUP = 0, /* pin what the reader is about to use */
    KVIDX_PF_WARM = 1    /* load into L1, pin nothing */
} kvidx_prefetch_mode_t;

typedef enum kvidx_trim_policy {
    KVIDX_TRIM_PREFIX = 0,
    KVIDX_TRIM_SEGMENTED_PREFIX = 1,
    KVIDX_TRIM_SPARSE = 2
} kvidx_trim_policy_t;

/* One request. All pointers are borrowed for the duration of the call. */
typedef struct kvidx_prefetch_req {
    size_t n;             /* keys in the request, <= UINT32_MAX */
    const uint8_t *state; /* n kvidx_pf_state_t values */
    kvidx_prefetch_mode_t mode;
    kvidx_trim_policy_t policy;
    const kvidx_fold_shape_t *ipc; /* the ipc form's shape (G*C*R == n), or NULL for the key form */
} kvidx_prefetch_req_t;

/* Stage 1: what to do now. */
typedef struct kvidx_prefetch_plan {
    /* The wire's l1_found_indices: planned L1 hits to pin now. Always empty
     * for WARM (its planned L1 hits are in l1_hits, to LRU-touch). */
    const uint32_t *l1_found;
    size_t n_l1_found;
    /* Planned ready L1 hits, both modes. l1_found is l1_hits or empty. */
    uint32_t *l1_hits;
    size_t n_l1_hits;
    /* The wire's l2_orig_indices: planned keys that come from L2 — new loads
     * and joined in-flight loads alike. */
    uint32_t *l2_orig;
    size_t n_l2_orig;
    /* The subset of l2_orig that needs an L1 reservation and a new load
     * (state KVIDX_PF_L2). The rest of l2_orig joins a load in flight. */
    uint32_t *new_loads;
    size_t n_new_loads;
    /* Ipc form: the fold (§4.3) of the available keys, the prefix length
     * in chunks that PREFIX and SEGMENTED_PREFIX plan for. 0 for the key form. */
    size_t planned_chunks;

    /* Kept for kvidx_prefetch_trim; read-only for the caller. */
    size_t n;
    kvidx_prefetch_mode_t mode;
    kvidx_trim_policy_t policy;
    int is_ipc;
    kvidx_fold_shape_t shape; /* shape.windows points into this plan's memory */
    uint8_t *state;           /* n bytes: a copy of the request's states */
    uint8_t *planned;         /* n bytes: 1 when the key is planned */
    void *mem_[2];
} kvidx_prefetch_plan_t;

/* Stage 2: what to keep. */
typedef struct kvidx_prefetch_result {
    /* found_indices. LOOKUP: planned keys available at completion (planned
     * minus failed loads), before trimming. WARM: keys L1-resident at
     * completion: every ready L1 hit of the request, planned or not, plus
     * planned loads that did not fail. */
    uint32_t *found;
    size_t n_found;
    /* retained_indices: keys that keep their pins (1 + extra_count each).
     * LOOKUP PREFIX: the leading run of found (ipc form: the keys serving
     * the fold of found); SEGMENTED_PREFIX and SPARSE: every found key.
     * Always empty for WARM. */
    uint32_t *retained;
    size_t n_retained;
    /* LOOKUP: found keys that are not retained: the manager gives back their
     * pins (and drops loaded temporary copies). Always empty for WARM. */
    uint32_t *released;
    size_t n_released;
    /* hit_keys: the leading run of found keys, over all n keys. */
    size_t hit_keys;
    /* hit_chunks (ipc form only, else 0): the fold of found, §4.3. */
    size_t hit_chunks;
    uint8_t *found_map;    /* n bytes */
    uint8_t *retained_map; /* n bytes */
    void *mem_[2];
} kvidx_prefetch_result_t;

/* The number of leading nonzero bytes of b[0..n). */
size_t kvidx_prefetch_leading_run(const uint8_t *b, size_t n);

/* Stage 1. available[i] = state[i] != ABSENT. PREFIX and SEGMENTED_PREFIX
 * plan the leading run of available (ipc form: the retained set of the fold
 * of available, §4.3); SPARSE plans every available key. Same for both
 * modes. On success *plan owns its arrays until kvidx_prefetch_plan_free.
 * Returns 0, KVIDX_EINVAL (bad mode, policy, state value, shape, or
 * G*C*R != n) or KVIDX_ENOMEM; on error *plan needs no free (it is zeroed). */
int kvidx_prefetch_plan(const kvidx_prefetch_req_t *req, kvidx_prefetch_plan_t *plan);

/* Frees a plan's arrays and zeroes it; idempotent; NULL is fine. */
void kvidx_prefetch_plan_free(kvidx_prefetch_plan_t *plan);

/* Stage 2, once every load of the plan has finished. failed: n bytes
 * (nonzero = that key's load failed) or NULL when none failed. A failure on
 * a key that is not in plan->l2_orig is ignored (no load of this plan could
 * fail there). Returns 0, KVIDX_EINVAL or KVIDX_ENOMEM; on error *res needs
 * no free. The plan is not changed and can be trimmed again. */
int kvidx_prefetch_trim(const kvidx_prefetch_plan_t *plan, const uint8_t *failed,
                        kvidx_prefetch_result_t *res);

/* Frees a result's arrays and zeroes it; idempotent; NULL is fine. */
void kvidx_prefetch_result_free(kvidx_prefetch_result_t *res);

#endif
