/*
 * The pin ledger and state machine of one prefetch handle (docs/lookup_and_prefetch.md,
 * docs/prefetch.md), on top of the index's pin/reserve primitives and the pure plan and trim of
 * kvidx/prefetch_plan.h. Pure: no I/O, no clock, no globals. The daemon owns what is shared between
 * handles (single-flight loads, loaders, timers); everything that gives or takes a pin of a handle
 * goes through here, so that one randomized test can check the rule "no pin outlives its handle"
 * against a reference model.
 *
 * Each key of the handle records the pins it holds as (ref, generation,
 * count). A pin is given back exactly once: by a release, by the trim at
 * completion, or when the handle ends (released or expired). When the
 * pinned L1 copy has disappeared (a forced delete kills its generation),
 * the pins are counted as lost and never unpinned, so a later copy of the
 * same key (even one that reuses the ref) is never unpinned by mistake.
 *
 * Lifecycle: kvidx_pfh_open (pending) → kvidx_pfh_start_load for each
 * planned L2 key → kvidx_pfh_load_result as loads finish →
 * kvidx_pfh_complete when none is outstanding (completed) →
 * kvidx_pfh_release / kvidx_pfh_end (released or expired) →
 * kvidx_pfh_close. Every function takes the index the handle was opened on.
 */
#ifndef KVIDX_PREFETCH_HANDLE_H
#define KVIDX_PREFETCH_HANDLE_H

#include "kvidx/index.h"
#include "kvidx/prefetch_plan.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kvidx_pfh_status {
    KVIDX_PFH_PENDING = 0,   /* loads outstanding */
    KVIDX_PFH_COMPLETED = 1, /* trimmed; retained keys hold their pins */
    KVIDX_PFH_RELEASED = 2,  /* every pin given back by release or DELETE */
    KVIDX_PFH_EXPIRED = 3    /* the lease ended; every pin given back */
} kvidx_pfh_status_t;

typedef struct kvidx_pfh_key {
    kvidx_ref_t ref; /* KVIDX_REF_NONE when the key was absent */
    uint64_t gen;    /* generation of the L1 copy the pins are on */
    uint32_t pins;   /* pins this handle holds on that copy */
    uint8_t failed;  /* its load failed: a miss for the trim */
    uint8_t lost;    /* its pinned copy was force-deleted */
    uint8_t waiting; /* a load is outstanding for it */
} kvidx_pfh_key_t;

typedef struct kvidx_pfh {
    kvidx_pfh_status_t status;
    kvidx_prefetch_mode_t mode;
    kvidx_trim_policy_t policy;
    uint32_t extra; /* extra readers: retained keys hold 1 + extra pins */
    size_t n;
    kvidx_pfh_key_t *keys;
    kvidx_prefetch_plan_t plan;     /* l1_found, l2_orig, ... (read-only) */
    kvidx_prefetch_result_t result; /* valid when has_result */
    int has_result;
    size_t waiting; /* keys with waiting set */
    uint64_t pins;  /* sum of keys[].pins */
} kvidx_pfh_t;

/* What kvidx_pfh_start_load did for one planned L2 key. */
typedef enum kvidx_pfh_load {
    KVIDX_PFH_LOAD_NEW = 0,   /* reserved a loading copy (*gen): start a load, wait for it */
    KVIDX_PFH_LOAD_JOIN = 1,  /* a loading copy (*gen) exists: wait for that load */
    KVIDX_PFH_LOAD_READY = 2, /* the key is ready now (a duplicate key): treated as a hit */
    KVIDX_PFH_LOAD_FAILED = 3 /* no room even after eviction, or the key vanished */
} kvidx_pfh_load_t;

/* Probes keys[0..n) in idx, plans (kvidx_prefetch_plan) and, for LOOKUP,
 * pins every planned L1 hit with 1 + extra pins. The handle is pending.
 * ipc is the ipc form's shape or NULL. extra is forced to 0 for WARM.
 * Returns 0, KVIDX_EINVAL (bad mode/policy/shape, extra > 127) or
 * KVIDX_ENOMEM; on error nothing changed and *h needs no close. */
int kvidx_pfh_open(kvidx_pfh_t *h, kvidx_index_t *idx, const kvidx_key_t *keys, size_t n,
                   kvidx_prefetch_mode_t mode, kvidx_trim_policy_t policy, uint32_t extra,
                   const kvidx_fold_shape_t *ipc);

/* For planned L2 key i (an entry of plan.l2_orig): reserves an L1 copy
 * (temporary as asked; evicting as needed), or finds the load to join.
 * NEW and JOIN mark the key waiting and give *gen; FAILED marks it failed. */
kvidx_pfh_load_t kvidx_pfh_start_load(kvidx_pfh_t *h, kvidx_index_t *idx, size_t i, int temporary,
                                      uint64_t *gen);

/* The load of waiting key i (copy generation gen) finished. Call it for
 * every waiting handle *before* kvidx_index_l1_load_done, so that a LOOKUP
 * handle pins the copy (1 + extra) while it is still loading and nothing
 * can evict it. ok = 0, or a pin that cannot be taken, marks the key
 * failed. Returns 1 when the handle waits for no more loads (call
 * kvidx_pfh_complete), else 0. Ignored (returns 0) unless key i waits. */
int kvidx_pfh_load_result(kvidx_pfh_t *h, kvidx_index_t *idx, size_t i, uint64_t gen, int ok);

/* Pending → completed: trims, gives back the pins of planned keys that are
 * not retained, LRU-touches WARM's hits. KVIDX_EINVAL when not pending or
 * loads are outstanding; on KVIDX_ENOMEM every pin is given back and the
 * handle is completed without a result. */
int kvidx_pfh_complete(kvidx_pfh_t *h, kvidx_index_t *idx);

/* Gives back one reader's pin on each listed index (an index listed twice:
 * two pins), or, with indices NULL, one pin on every retained key that
 * still holds pins. All or nothing: KVIDX_EINVAL when an index is out of
 * range, KVIDX_ECONFLICT when the handle is not completed or an index is
 * not retained or holds fewer pins than asked; *bad (may be NULL) is the
 * position in indices of the first offending item. A completed handle
 * whose last pin goes becomes released. */
int kvidx_pfh_release(kvidx_pfh_t *h, kvidx_index_t *idx, const uint32_t *indices, size_t n,
                      size_t *bad);

/* Ends the handle (status KVIDX_PFH_RELEASED or KVIDX_PFH_EXPIRED): every
 * pin is given back and no load is waited for any more (the caller drops
 * the handle from its loads). No-op on a handle already ended. */
void kvidx_pfh_end(kvidx_pfh_t *h, kvidx_index_t *idx, kvidx_pfh_status_t st);

/* Marks as lost the pins whose copy is gone (forced delete). Read-only on
 * the index. Called by every function above before it unpins. */
void kvidx_pfh_refresh(kvidx_pfh_t *h, const kvidx_index_t *idx);

/* Frees the handle's memory. Its pins must have been given back
 * (kvidx_pfh_end) first: a handle closed with pins would leak them, so
 * close gives them back itself when idx is not NULL. */
void kvidx_pfh_close(kvidx_pfh_t *h, kvidx_index_t *idx);

#endif
