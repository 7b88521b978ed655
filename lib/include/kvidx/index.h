/*
 * The in-memory index of kvidx (docs/index.md, docs/api.md, docs/page_tokens.md): every known key
 * with its size, its L1 copy (state, pins, temporary flag, LRU position) and its L2 presence; exact
 * lookup, ordered listing with a resumable cursor, batch stores with synchronous LRU eviction,
 * deletes, and the pin/reserve/load primitives that the prefetch manager builds handles from.
 *
 * The index is single-threaded: the caller serialises every call. It never
 * performs I/O and allocates only through kvidx/alloc.h; every function that
 * fails returns a negative KVIDX_E* code and leaves the index as it was.
 *
 * A key inside the index is named by a kvidx_ref_t, a 32-bit handle that is
 * stable while the key exists. A ref held across calls is guaranteed to stay
 * valid only while the key's L1 copy is pinned or loading (such a key cannot
 * be forgotten except by a forced delete); otherwise an eviction or delete
 * may free it and a later insert may reuse it. L1 copies carry a generation
 * (unique over the index's lifetime), so a holder that recorded
 * (ref, generation) can always tell whether "its" copy is still there.
 * See docs/index.md for the memory layout and the figures.
 */
#ifndef KVIDX_INDEX_H
#define KVIDX_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/key.h"

typedef struct kvidx_index kvidx_index_t;
typedef uint32_t kvidx_ref_t;

#define KVIDX_REF_NONE   UINT32_MAX
#define KVIDX_SIZE_MAX   ((uint64_t)1 << 40) /* largest size_bytes (docs/index.md) */
#define KVIDX_SEED_BYTES 32

typedef enum {
    KVIDX_TIER_L1 = 1,
    KVIDX_TIER_L2 = 2,
    KVIDX_TIER_ALL = 3, /* delete: both tiers; list: either tier ("any") */
} kvidx_tier_t;

typedef enum {
    KVIDX_L1_NONE = 0,
    KVIDX_L1_LOADING = 1, /* reserved by a load, not readable, never evicted */
    KVIDX_L1_READY = 2,
} kvidx_l1_state_t;

/* Called once for every L1 copy that eviction removes (never for deletes,
 * unpins of temporary copies or failed loads). key views the interned names
 * and is valid only during the call; forgotten is 1 when the key had no L2
 * copy and left the index. The callback must not call into the index. */
typedef void (*kvidx_evict_cb)(void *ctx, const kvidx_key_t *key, uint64_t size_bytes,
                               int forgotten);

/* A key's durable state (persistence): its size, whether it has
 * a ready non-temporary L1 copy (KVIDX_DURABLE_L1) and whether it has an L2
 * copy (KVIDX_DURABLE_L2). tiers == 0 (size_bytes 0) means the key is
 * absent, or has only loading or temporary copies, which do not survive a
 * restart. */
#define KVIDX_DURABLE_L1 1u
#define KVIDX_DURABLE_L2 2u
typedef struct kvidx_durable {
    uint64_t size_bytes;
    unsigned tiers;
} kvidx_durable_t;

/* Called after a key's durable state may have changed, with the state
 * before and after: for stores, deletes, evictions, completed loads and
 * temporary-flag changes (before may equal after). Calls come in the order
 * of the changes; within a batch store, in key order, before the evictions
 * it causes. key views the index's memory during the call only; the
 * callback must not call into the index. */
typedef void (*kvidx_change_cb)(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *before,
                                const kvidx_durable_t *after);

typedef struct kvidx_index_opts {
    uint64_t l1_capacity_bytes; /* 0 = unbounded */
    uint64_t l2_capacity_bytes; /* 0 = unbounded */
    /* Key of the keyed hash (SipHash-2-4 uses the first 16 bytes). When
     * has_seed is 0 a random key is drawn from libsodium's randombytes_buf,
     * which makes the hash table safe against hash flooding; tests and
     * benchmarks pass a fixed seed to be reproducible. */
    int has_seed;
    uint8_t seed[KVIDX_SEED_BYTES];
    kvidx_evict_cb on_evict; /* optional */
    void *on_evict_ctx;
} kvidx_index_opts_t;

/* What the index knows about one key. */
typedef struct kvidx_entry_info {
    uint64_t size_bytes;
    int l2;                    /* 1 when an L2 copy exists (l2_api or l2_source) */
    kvidx_l1_state_t l1_state; /* KVIDX_L1_NONE when there is no L1 copy */
    uint32_t pins;             /* read-lock count of the L1 copy */
    int temporary;             /* L1 copy is dropped when its last pin goes */
    uint64_t generation;       /* of the L1 copy; 0 when there is none */
    int l2_api;                /* 1 when the L2 copy was stored through the API (durable) */
    int l2_source;             /* 1 when a source holds an L2 copy (kvidx/index_source.h) */
} kvidx_entry_info_t;

/* One item of a batch store. key views caller memory for the duration of
 * the call only; the index interns what it keeps. */
typedef struct kvidx_put {
    kvidx_key_t key;
    uint64_t size_bytes; /* 1..KVIDX_SIZE_MAX */
} kvidx_put_t;

typedef enum {
    KVIDX_DEL_DELETED = 0,
    KVIDX_DEL_NOT_FOUND = 1,
    KVIDX_DEL_SKIPPED_PINNED = 2,
    KVIDX_DEL_SKIPPED_SOURCE = 3,
} kvidx_del_outcome_t;

typedef struct kvidx_index_stats {
    uint64_t keys;               /* distinct keys */
    uint64_t l1_keys;            /* L1 copies (loading + ready) */
    uint64_t l1_bytes;           /* bytes of L1 copies (loading ones included) */
    uint64_t l1_loading;         /* copies in state loading */
    uint64_t l1_pinned;          /* copies with pins > 0 */
    uint64_t l1_pins;            /* sum of pins */
    uint64_t l1_evictable_bytes; /* ready, unpinned: what eviction can free */
    uint64_t l2_keys;            /* L2 copies stored through the API (sources' are below) */
    uint64_t l2_bytes;
    uint64_t evictions;  /* L1 copies evicted since creation */
    uint64_t names;      /* interned model names and salts */
    uint64_t namespaces; /* distinct (cache_salt, model_name) pairs */
    uint64_t l1_capacity_bytes;
    uint64_t l2_capacity_bytes;
    uint64_t l2_source_keys;  /* keys held by at least one source */
    uint64_t l2_source_bytes; /* their sizes */
} kvidx_index_stats_t;

/* A key with its own storage for the names: what a listing resumes after.
 * key points into the struct itself: after the struct is copied or moved
 * (memcpy, realloc, qsort), set key.model = model and key.salt = salt. */
typedef struct kvidx_key_buf {
    kvidx_key_t key; /* model and salt point into the arrays below */
    char model[KVIDX_MODEL_MAX];
    char salt[KVIDX_SALT_MAX];
} kvidx_key_buf_t;

/* Copies *k into *b (b->key then points into b). */
void kvidx_key_buf_set(kvidx_key_buf_t *b, const kvidx_key_t *k);

/* Listing filters; a field applies when its has_ flag is 1. The empty salt
 * is selected by has_salt = 1, salt_len = 0. */
typedef struct kvidx_list_filter {
    int has_salt;
    const char *salt;
    size_t salt_len;
    int has_model;
    const char *model;
    size_t model_len;
    int has_rank;
    uint32_t kv_rank;
    int has_group;
    uint16_t group;
    kvidx_tier_t tier; /* KVIDX_TIER_L1, _L2 or _ALL ("any"); 0 means _ALL */
} kvidx_list_filter_t;

/* ---- lifetime ---- */

/* Creates an empty index. opts may be NULL (unbounded, random seed).
 * Returns 0, KVIDX_ENOMEM, or KVIDX_EINTERNAL when libsodium cannot start. */
int kvidx_index_new(const kvidx_index_opts_t *opts, kvidx_index_t **out);
/* Frees the index and everything it owns; NULL is allowed. Refs and key
 * views obtained from it become invalid. */
void kvidx_index_free(kvidx_index_t *idx);
/* Sets both capacities (0 = unbounded). When L1 is now over capacity,
 * unpinned ready copies are evicted in LRU order until it fits or nothing
 * evictable is left (pinned and loading bytes may keep L1 above capacity
 * until they are released; later stores then need the room). L2 above a new
 * smaller capacity is kept (nothing is evicted from L2); later L2 stores that
 * grow L2 fail with KVIDX_ECAPACITY. Always returns 0. */
int kvidx_index_set_capacity(kvidx_index_t *idx, uint64_t l1_capacity_bytes,
                             uint64_t l2_capacity_bytes);
/* Installs (or clears, with cb NULL) the eviction callback. */
void kvidx_index_set_evict_cb(kvidx_index_t *idx, kvidx_evict_cb cb, void *ctx);
/* Sizes the hash table for nkeys more keys at once (a restore knows the
 * count up front), so that bulk stores do not rehash as they grow. Changes
 * nothing visible. 0, KVIDX_ENOMEM, or KVIDX_EINVAL past 2^31 keys. */
int kvidx_index_reserve(kvidx_index_t *idx, uint64_t nkeys);
/* Installs (or clears, with cb NULL) the durable-change callback. */
void kvidx_index_set_change_cb(kvidx_index_t *idx, kvidx_change_cb cb, void *ctx);

/* ---- lookup ---- */

/* Finds a key. Returns 0 and *ref, or KVIDX_ENOTFOUND. No side effect
 * (recency is not changed: docs/lookup_and_prefetch.md). */
int kvidx_index_find(const kvidx_index_t *idx, const kvidx_key_t *key, kvidx_ref_t *ref);
/* Finds n keys: refs[i] is the ref of keys[i], or KVIDX_REF_NONE, and when
 * infos is not NULL, infos[i] what kvidx_index_info says of a found key
 * (untouched for the others). The same answers as n find + info calls,
 * faster: the cache misses of a window of keys overlap, and consecutive
 * keys sharing a namespace, a chunk hash or a rank share that part of the
 * work (as an ipc request's keys do). No side effect. */
void kvidx_index_find_batch(const kvidx_index_t *idx, const kvidx_key_t *keys, size_t n,
                            kvidx_ref_t *refs, kvidx_entry_info_t *infos);
/* Fills *info for a live ref. Returns 0, or KVIDX_ENOTFOUND when ref names
 * no key (freed, out of range). */
int kvidx_index_info(const kvidx_index_t *idx, kvidx_ref_t ref, kvidx_entry_info_t *info);
/* The key of a live ref; model and salt of *out point into the index's
 * interned names and stay valid while the key exists. 0 or KVIDX_ENOTFOUND. */
int kvidx_index_key(const kvidx_index_t *idx, kvidx_ref_t ref, kvidx_key_t *out);
/* The index's keyed 64-bit hash (SipHash-2-4) of all five fields of a key:
 * stable for the index's lifetime, unpredictable without its seed. Useful
 * for the caller's own hash maps (single-flight loads, sharding). */
uint64_t kvidx_index_key_hash64(const kvidx_index_t *idx, const kvidx_key_t *key);

/* ---- stores and deletes ---- */

/* Stores n items into tier (KVIDX_TIER_L1 or KVIDX_TIER_L2), all or nothing.
 * A new key is created with that tier; an existing key gains the tier and
 * takes the new size (the size is per key, so an L2 re-put also resizes the
 * L1 copy). A new L1 copy is ready, unpinned, not temporary; a re-put to L1
 * of a ready unpinned copy touches it, and a re-put to L1 of a temporary
 * copy makes it permanent (it is the caller's now). Keys of the batch enter the LRU in
 * reverse: items[n-1] becomes the least recent, items[0] the most recent.
 * A key given twice counts once, at its last position, with its last size.
 * Room in L1 is made by evicting unpinned ready copies of other keys in LRU
 * order, after the batch is in (keys left with no tier are forgotten).
 * Errors (the index is unchanged, *conflict_index set when not NULL):
 *   KVIDX_EINVAL    bad tier, n == 0 with items NULL, or an item with a size
 *                   out of 1..2^40 or a field length out of range (index set);
 *   KVIDX_ECONFLICT an item's size differs from the key's size while its L1
 *                   copy is pinned or loading, or while a source holds the
 *                   key (the source owns its size) (index of the first such
 *                   item);
 *   KVIDX_ECAPACITY L1 (even after evicting everything evictable outside the
 *                   batch) or L2 (never evicted) would exceed its capacity;
 *   KVIDX_ENOMEM.
 * On success returns 0. */
int kvidx_index_put_batch(kvidx_index_t *idx, kvidx_tier_t tier, const kvidx_put_t *items, size_t n,
                          size_t *conflict_index);
/* kvidx_index_put_batch that also reports, on success, the number of
 * distinct keys of the batch in *stored (a key given twice counts once). */
int kvidx_index_put_batch_count(kvidx_index_t *idx, kvidx_tier_t tier, const kvidx_put_t *items,
                                size_t n, size_t *conflict_index, size_t *stored);

/* One item of a bulk load: a key absent from the index, its size and its
 * KVIDX_DURABLE_* tiers (at least one). */
typedef struct kvidx_load {
    kvidx_key_t key;
    uint64_t size_bytes;
    unsigned tiers;
} kvidx_load_t;

/* Bulk load for a restore: inserts n keys that are not in the index, with
 * their tiers (L1 copies ready, unpinned, not temporary, most recent last).
 * Much faster than kvidx_index_put_batch (no sort when the input is in key
 * order, one hash probe per key, no undo log), but NOT all or nothing:
 * on error the items before *bad_index (when set) stay in. Errors:
 * KVIDX_EINVAL (a bad item, *bad_index), KVIDX_ECONFLICT (a key already
 * present or given twice, *bad_index), KVIDX_ECAPACITY (L2 capacity, before
 * anything is inserted), KVIDX_ENOMEM. L1 above capacity is evicted in LRU
 * order afterwards, as for a store. No change callback is called. */
int kvidx_index_load(kvidx_index_t *idx, const kvidx_load_t *items, size_t n, size_t *bad_index);

/* Deletes one key from tier (L1, L2 or ALL). Never fails for a valid tier
 * (KVIDX_EINVAL otherwise) and never allocates. *outcome:
 *   DELETED        something was removed;
 *   NOT_FOUND      the key has no copy in the tier(s) named;
 *   SKIPPED_PINNED the L1 copy is pinned or loading and force is 0: it is
 *                  kept. For KVIDX_TIER_ALL the L2 copy is still deleted
 *                  ("delete what you can"), and the outcome stays
 *                  SKIPPED_PINNED so the caller reports it;
 *   SKIPPED_SOURCE nothing was deleted, and the tier(s) named include L2,
 *                  where a source holds the key's copy: a source's copy
 *                  is never deleted here (only the API's own L2 copy is),
 *                  with or without force.
 * With force, a pinned or loading copy is removed too; its generation dies
 * with it, so holders see KVIDX_ENOTFOUND from unpin and load_done. A key
 * left with no tier is forgotten. */
int kvidx_index_delete(kvidx_index_t *idx, const kvidx_key_t *key, kvidx_tier_t tier, int force,
                       kvidx_del_outcome_t *outcome);

/* ---- prefetch primitives (on refs) ----
 * Each returns KVIDX_ENOTFOUND when ref names no key or, where a generation
 * is taken, when the key's L1 copy is not the one of that generation
 * (generation 0 accepts whatever copy is there). */

/* Adds n (>= 1) pins to the key's L1 copy (ready or loading); a ready copy
 * leaves the LRU while pinned. KVIDX_ENOTFOUND when there is no L1 copy,
 * KVIDX_EINVAL when n is 0 or the count would pass UINT32_MAX. */
int kvidx_index_pin(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation, uint32_t n);
/* Removes n pins (KVIDX_EINVAL when n is 0 or more than held). When the
 * count reaches 0: a temporary copy is dropped from L1 (key forgotten when
 * it has no L2 copy), a ready one re-enters the LRU as most recent. */
int kvidx_index_unpin(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation, uint32_t n);
/* Creates a loading L1 copy for a key that has none (KVIDX_ECONFLICT when it
 * has one), evicting unpinned ready copies in LRU order to make room;
 * KVIDX_ECAPACITY (nothing changed) when even that cannot. *generation gets
 * the new copy's generation. The copy has no pins. */
int kvidx_index_l1_reserve(kvidx_index_t *idx, kvidx_ref_t ref, int temporary,
                           uint64_t *generation);
/* Ends a load: ok != 0 makes the loading copy ready (most recent in the LRU
 * when unpinned); ok == 0 drops it (key forgotten when it has no L2 copy).
 * KVIDX_EINVAL when the copy is not loading. */
int kvidx_index_l1_load_done(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation, int ok);
/* Makes a ready unpinned L1 copy the most recent; no-op for pinned or
 * loading copies. KVIDX_ENOTFOUND when there is no L1 copy. */
int kvidx_index_touch(kvidx_index_t *idx, kvidx_ref_t ref);
/* Sets or clears the temporary flag of the key's L1 copy. Clearing never
 * drops; setting on an unpinned ready copy does not drop it either (only the
 * release of a last pin does). KVIDX_ENOTFOUND when there is no L1 copy. */
int kvidx_index_set_temporary(kvidx_index_t *idx, kvidx_ref_t ref, int temporary);

/* ---- listing (docs/page_tokens.md) ----
 * Writes up to page_size refs of keys matching *f, in the total order of
 * kvidx_key_cmp, strictly after *after (NULL: from the start), into
 * refs[0..*count). At most max_scan keys are examined (a key is examined when
 * it is read from the ordered structure, matching or not; whole namespaces
 * that the salt/model filters exclude are skipped without examining their
 * keys, and rank/group filters seek). After the page is full the listing
 * keeps examining, within the same budget, to learn whether a further match
 * exists.
 * *more = 0 only when no matching key follows; otherwise *more = 1 and
 * *resume holds the key to pass as `after` for the next page (the last key
 * returned, or the last key examined when the budget ran out, in which case
 * the page may be short or empty). Because the order is total and `after` is
 * a value, not a position, resuming works even when that key was deleted, and
 * a full listing returns every key present throughout exactly once.
 * The refs are valid until the next call that changes the index. When
 * examined is not NULL it gets the number of keys examined (<= max_scan).
 * Returns 0, or KVIDX_EINVAL when page_size or max_scan is 0. */
int kvidx_index_list(const kvidx_index_t *idx, const kvidx_list_filter_t *f,
                     const kvidx_key_t *after, size_t page_size, size_t max_scan, kvidx_ref_t *refs,
                     size_t *count, kvidx_key_buf_t *resume, int *more, size_t *examined);

/* What a listing writes of one key, viewing the index's own memory (no
 * copy): valid until the next call that changes the index. Two entries
 * with the same ns_id share model and salt (the same interned bytes). */
typedef struct kvidx_list_entry {
    const char *model, *salt;
    uint16_t model_len;
    uint8_t salt_len;
    uint8_t hash_len;
    uint16_t group;
    uint32_t kv_rank;
    uint32_t ns_id;
    const uint8_t *hash;
    uint64_t size_bytes;
} kvidx_list_entry_t;

/* Fills *e for the key ref names. 0, or KVIDX_ENOTFOUND for a ref that
 * names no live key. */
int kvidx_index_list_entry(const kvidx_index_t *idx, kvidx_ref_t ref, kvidx_list_entry_t *e);

/* ---- statistics ---- */
void kvidx_index_stats(const kvidx_index_t *idx, kvidx_index_stats_t *out);

/* ---- consistency ---- */

/* Verifies the index's internal invariants: every live key is in its
 * namespace's ordered tree and in the hash table exactly once and nothing
 * else is; trees, namespaces and interned names are in strict order;
 * interned names are referenced exactly by the namespaces that use them;
 * every key has an L1 or an L2 copy (its own or a source's); records carry
 * the source bit exactly when a source's membership holds them, and each
 * source's key and byte counts are the sums over its members; the LRU
 * holds exactly the ready
 * unpinned L1 copies; the key, byte, pin and LRU counters (what
 * kvidx_index_stats reports) equal the sums over the keys. Meant for tests
 * and fuzzers after each operation: it reads the whole index (time linear
 * in its size, plus names x namespaces), changes nothing, allocates
 * nothing and never aborts. Returns 0, or KVIDX_EINTERNAL when an
 * invariant is broken. */
int kvidx_index_check(const kvidx_index_t *idx);

#endif
