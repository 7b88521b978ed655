/*
 * Per-salt L1 accounting and quotas of the index.
 *
 * The index keeps, for every cache_salt that has keys, the number and
 * bytes of its L1 copies and its own LRU list of ready unpinned copies, in
 * the same recency order as the index's LRU. A salt may be given a quota:
 * a cap on its L1 bytes, whoever stores them. Then:
 *   - a store (kvidx_index_put_batch) that would take a salt over its quota
 *     first evicts that salt's own unpinned L1 copies in LRU order (never
 *     another salt's, never the batch's own); when even evicting all of
 *     them cannot make room the whole batch fails with KVIDX_EQUOTA and
 *     nothing changes;
 *   - an L1 reservation for a load (kvidx_index_l1_reserve) does the same
 *     and fails with KVIDX_EQUOTA, changing nothing;
 *   - a bulk load (kvidx_index_load) evicts each salt to its quota after
 *     loading, as it evicts to the L1 capacity.
 * L2 is never affected by quotas. The L1 capacity of the whole index still
 * applies on top: its eviction may take any salt's copies.
 *
 * The salt accounting is always on and costs O(1) per L1 change; quota
 * checks cost nothing while no quota is set.
 */
#ifndef KVIDX_INDEX_QUOTA_H
#define KVIDX_INDEX_QUOTA_H

#include "kvidx/index.h"

#include <stddef.h>
#include <stdint.h>

/* One quota: salt (salt_len bytes, may be 0 for the empty salt) and its cap
 * in bytes (> 0). */
typedef struct kvidx_salt_quota {
    const char *salt;
    size_t salt_len;
    uint64_t quota_bytes;
} kvidx_salt_quota_t;

/* What the index knows of one salt. salt views the index's interned copy
 * (valid until the next call that changes the index) or the caller's. */
typedef struct kvidx_salt_usage {
    const char *salt;
    size_t salt_len;
    uint64_t keys;               /* distinct keys with this salt */
    uint64_t l1_keys;            /* its L1 copies (loading and ready) */
    uint64_t l1_bytes;           /* their bytes */
    uint64_t l1_evictable_bytes; /* ready and unpinned: what its quota may evict */
    uint64_t quota_bytes;        /* 0: no quota */
    uint64_t quota_evictions;    /* copies evicted for its quota while it had keys */
} kvidx_salt_usage_t;

/* Replaces every quota with q[0..n) (n may be 0: no quota). Salts that are
 * over their new quota evict their own unpinned copies, least recent first,
 * as far as they can (pinned and loading bytes may keep a salt above its
 * quota until released; its next stores and loads then need the room).
 * Returns 0; KVIDX_EINVAL (nothing changed) when a salt is longer than
 * KVIDX_SALT_MAX, a quota is 0 or a salt is given twice; KVIDX_ENOMEM. */
int kvidx_index_set_quotas(kvidx_index_t *idx, const kvidx_salt_quota_t *q, size_t n);

/* The usage of one salt (all zero but quota_bytes when it has no key). */
void kvidx_index_salt_usage(const kvidx_index_t *idx, const char *salt, size_t salt_len,
                            kvidx_salt_usage_t *out);

/* Calls fn for every salt that has keys, in salt order. fn must not change
 * the index. */
void kvidx_index_each_salt(const kvidx_index_t *idx,
                           void (*fn)(void *ctx, const kvidx_salt_usage_t *u), void *ctx);

/* L1 copies evicted for quotas since the index was created. */
uint64_t kvidx_index_quota_evictions(const kvidx_index_t *idx);

#endif
