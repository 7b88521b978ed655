/*
 * The fleet directory: which server of an LMCache fleet holds which key, in
 * which tier and backend, fed by the cache-event batches the servers post
 * (LMCache's MP coordinator: its event gate, key directory, capacity
 * registry and instance registry, as one pure state). docs/fleet.md
 * describes the rules, the wire shapes the daemon builds on this API, and
 * where kvidx differs from LMCache.
 *
 * Model:
 *  - A key (kvidx_key_t) has one or more placements {instance_id,
 *    incarnation, tier, backend, size_bytes, shared}. A private placement's
 *    identity is (instance_id, tier, backend); a shared one's is (tier,
 *    backend) fleet-wide, and its instance_id is the last reporter. A key
 *    with no placement left is forgotten. Each key also has a last_access
 *    (the largest ts of a store or access batch that touched it).
 *  - Token bindings: the token ids of a chunk hash (last non-empty store
 *    wins), kept while any key with that chunk hash exists, within a memory
 *    cap beyond which the oldest bindings are dropped.
 *  - The gate: per instance_id a cursor (incarnation, last_seq, gap) and
 *    counters; it decides whether a batch is admitted, a duplicate or stale,
 *    and fences an instance (drops every L1 placement it last reported) when
 *    a higher incarnation appears.
 *  - Capacity declarations: per instance, compartments (tier, backend) with
 *    capacity_bytes, grouped by (incarnation, capacity_revision).
 *  - The instance registry: registration data and the last time each
 *    registered instance was heard of.
 *
 * The directory is single-threaded (the caller serialises calls), does no
 * I/O and allocates only through kvidx/alloc.h. Every function that fails
 * returns a negative KVIDX_E* code and leaves the directory exactly as it
 * was; reads never allocate unless they say so. Pointers a read hands out
 * (strings, token arrays, key views) point into the directory and are
 * valid until the next call that changes it.
 *
 * Strings are byte ranges (pointer + length, not NUL-terminated, NULL
 * allowed when the length is 0). Times are injected: batch timestamps are
 * the emitter's wall-clock seconds, liveness uses the caller's monotonic
 * clock in milliseconds.
 */
#ifndef KVIDX_DIRECTORY_H
#define KVIDX_DIRECTORY_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/fold.h"
#include "kvidx/key.h"

typedef struct kvidx_directory kvidx_directory_t;

#define KVIDX_DIR_ID_MAX 1024 /* bytes of an instance_id or a backend name */
/* Bytes a token binding costs besides 4 per token id; the token cap counts
 * both (docs/fleet.md). */
#define KVIDX_DIR_BINDING_OVERHEAD 24
#define KVIDX_DIR_UNKNOWN_OFFSET   (-1) /* LMCache's UNKNOWN_TOKEN_OFFSET */

typedef enum kvidx_dir_tier {
    KVIDX_DIR_ALL = 0, /* filters only: either tier (the wire's "all") */
    KVIDX_DIR_L1 = 1,
    KVIDX_DIR_L2 = 2,
} kvidx_dir_tier_t;

typedef enum kvidx_dir_event {
    KVIDX_DIR_STORE = 0,
    KVIDX_DIR_DELETE = 1,
    KVIDX_DIR_ACCESS = 2,
    KVIDX_DIR_CONFIG = 3,
} kvidx_dir_event_t;

typedef struct kvidx_dir_options {
    /* Cap on the bytes of token bindings (4 per token id plus
     * KVIDX_DIR_BINDING_OVERHEAD per binding); past it the oldest bindings
     * are dropped. 0 = unbounded. */
    uint64_t token_bytes_cap;
    /* Key of the keyed table hash. When has_seed is 0 a random key is drawn
     * from libsodium. Layout only: no answer depends on it. */
    int has_seed;
    uint8_t seed[16];
} kvidx_dir_options_t;

/* 0 and *out, KVIDX_ENOMEM, or KVIDX_EINTERNAL (libsodium unusable). opts
 * may be NULL for the defaults. */
int kvidx_directory_new(const kvidx_dir_options_t *opts, kvidx_directory_t **out);
void kvidx_directory_free(kvidx_directory_t *d);
/* Changes the token cap; dropping what no longer fits. Never fails. */
void kvidx_directory_set_token_cap(kvidx_directory_t *d, uint64_t token_bytes_cap);

/* ---- ingest: POST /events ---- */

typedef struct kvidx_dir_entry {
    kvidx_key_t key;
    uint64_t size_bytes;       /* store only; 0 otherwise */
    const uint32_t *token_ids; /* store only: the chunk's tokens; NULL/0 = none */
    size_t num_tokens;
    int64_t token_offset; /* >= 0, or KVIDX_DIR_UNKNOWN_OFFSET */
} kvidx_dir_entry_t;

typedef struct kvidx_dir_batch {
    const char *instance_id; /* 1..KVIDX_DIR_ID_MAX bytes */
    size_t instance_len;
    uint64_t incarnation; /* >= 0 */
    uint64_t seq;         /* >= 1 */
    kvidx_dir_event_t event_type;
    kvidx_dir_tier_t tier; /* KVIDX_DIR_L1 or KVIDX_DIR_L2 */
    const char *backend;   /* 1..KVIDX_DIR_ID_MAX bytes; may be empty for access */
    size_t backend_len;
    const kvidx_dir_entry_t *entries; /* none for config */
    size_t num_entries;
    int shared;                 /* 0 or 1 */
    double ts;                  /* finite, >= 0 */
    uint64_t capacity_bytes;    /* config only: 0 = no limit */
    uint64_t capacity_revision; /* config only */
} kvidx_dir_batch_t;

typedef enum kvidx_dir_verdict {
    KVIDX_DIR_ADMITTED = 0,
    KVIDX_DIR_DUPLICATE = 1, /* seq <= last_seq of the current incarnation */
    KVIDX_DIR_STALE = 2,     /* incarnation below the cursor's */
} kvidx_dir_verdict_t;

/* The batch rules (LMCache's CacheEventBatch and CacheEventEntry checks plus
 * kvidx's key rules). Returns 0, or KVIDX_EINVAL with *why naming the field
 * and rule and *bad_entry the index of the offending entry (SIZE_MAX when
 * the batch itself is at fault); either pointer may be NULL. The daemon
 * answers 422 for any batch that fails. */
int kvidx_directory_batch_check(const kvidx_dir_batch_t *b, size_t *bad_entry, kvidx_reason_t *why);

/* What the gate would say of the batch now, without changing anything
 * (for a caller that journals before applying). The batch must pass
 * kvidx_directory_batch_check. */
kvidx_dir_verdict_t kvidx_directory_classify(const kvidx_directory_t *d,
                                             const kvidx_dir_batch_t *b);

/* Offers one batch to the gate and, when admitted, applies it whole: a
 * higher incarnation first fences the instance and opens a fresh cursor;
 * a gap (seq > last_seq + 1) is recorded and the batch admitted. store
 * upserts placements (and token bindings), delete removes them, access
 * raises last_access, config records a compartment. Duplicates and stale
 * batches change only the cursor's counters. *verdict says which.
 * Returns 0; KVIDX_EINVAL (the batch fails kvidx_directory_batch_check);
 * KVIDX_ENOMEM (nothing changed, not even counters: retrying is safe). */
int kvidx_directory_ingest(kvidx_directory_t *d, const kvidx_dir_batch_t *b,
                           kvidx_dir_verdict_t *verdict);

/* ---- instances: /instances ---- */

typedef struct kvidx_dir_instance {
    const char *instance_id; /* 1..KVIDX_DIR_ID_MAX bytes (the daemon names an unnamed one) */
    size_t instance_len;
    const char *ip; /* 1..KVIDX_DIR_ID_MAX bytes */
    size_t ip_len;
    uint32_t http_port;             /* 1..65535 */
    uint32_t mq_port;               /* 0..65535 */
    const char *p2p_advertised_url; /* 0..KVIDX_DIR_ID_MAX bytes */
    size_t p2p_len;
    /* The registration's metadata as the daemon wants it echoed (its
     * normalized JSON object): opaque bytes here, up to 65536. */
    const char *metadata;
    size_t metadata_len;
    double registration_time; /* wall-clock seconds, for display */
    uint64_t last_seen_ms;    /* monotonic: the registration or last heartbeat */
} kvidx_dir_instance_t;

/* Registers or replaces an instance; last_seen_ms is its liveness start.
 * *re_registered (may be NULL) is 1 when it was registered already.
 * Returns 0, KVIDX_EINVAL (a field out of range), KVIDX_ENOMEM. */
int kvidx_directory_register(kvidx_directory_t *d, const kvidx_dir_instance_t *in,
                             int *re_registered);
/* Records a heartbeat: 0, or KVIDX_ENOTFOUND for an instance not
 * registered (the server then registers again). */
int kvidx_directory_heartbeat(kvidx_directory_t *d, const char *id, size_t len, uint64_t now_ms);
/* Removes a registration and drops the instance's stream: fences it, forgets
 * its cursor and its capacity declaration (L2 placements stay). 0, or
 * KVIDX_ENOTFOUND when it was not registered (nothing is dropped then).
 * Never fails otherwise. */
int kvidx_directory_deregister(kvidx_directory_t *d, const char *id, size_t len);
/* Drops, as deregister does, every registered instance not heard of for
 * more than timeout_ms (now_ms - last_seen_ms > timeout_ms). *expired (may
 * be NULL) gets the count; the change callback names each. Never fails. */
void kvidx_directory_expire(kvidx_directory_t *d, uint64_t now_ms, uint64_t timeout_ms,
                            size_t *expired);
/* The registration of one instance: 0 and *out, or KVIDX_ENOTFOUND. */
int kvidx_directory_instance(const kvidx_directory_t *d, const char *id, size_t len,
                             kvidx_dir_instance_t *out);
/* Calls cb for every registered instance, in registration order (a
 * re-registration keeps its place). cb returns 0 to go on; any other value
 * stops the walk and is returned. */
int kvidx_directory_instances(const kvidx_directory_t *d,
                              int (*cb)(void *ctx, const kvidx_dir_instance_t *in), void *ctx);
size_t kvidx_directory_instance_count(const kvidx_directory_t *d);

/* ---- reading placements: /directory/keys, /directory/lookup ---- */

typedef struct kvidx_dir_placement {
    const char *instance_id; /* the reporter (the last one for a shared placement) */
    size_t instance_len;
    uint64_t incarnation;
    kvidx_dir_tier_t tier;
    const char *backend;
    size_t backend_len;
    uint64_t size_bytes;
    int shared;
} kvidx_dir_placement_t;

typedef struct kvidx_dir_filter {
    kvidx_dir_tier_t tier;   /* KVIDX_DIR_ALL keeps both */
    const char *instance_id; /* length 0 keeps every instance */
    size_t instance_len;
    const char *backend; /* length 0 keeps every backend */
    size_t backend_len;
} kvidx_dir_filter_t;

/* One key as a read sees it. Its placements (those matching the read's
 * filter) come from kvidx_directory_row_next, sorted by (instance_id, tier,
 * backend, shared). */
typedef struct kvidx_dir_row {
    kvidx_key_t key; /* model and salt point into the directory */
    double last_access;
    size_t num_placements;     /* matching the filter */
    const uint32_t *token_ids; /* the chunk hash's binding; NULL when none */
    size_t num_tokens;
    int64_t token_offset; /* KVIDX_DIR_UNKNOWN_OFFSET when no binding */
    /* private: the walk */
    const kvidx_directory_t *d_;
    uint32_t next_, f_inst_, f_backend_;
    int f_tier_;
} kvidx_dir_row_t;

/* The row's next matching placement: 1 and *out, or 0 at the end. */
int kvidx_directory_row_next(kvidx_dir_row_t *row, kvidx_dir_placement_t *out);

/* LMCache's listing: the keys with at least one placement matching the
 * filter, in canonical key order ((cache_salt, model_name, kv_rank,
 * object_group_id, chunk hash)); *total (may be NULL) gets how many match,
 * and cb is called for those at positions [offset, offset + limit). Costs a
 * walk of every key. cb returns 0 to go on; another value stops the walk
 * and is returned (*total is then a lower bound). */
int kvidx_directory_list(const kvidx_directory_t *d, const kvidx_dir_filter_t *f, uint64_t offset,
                         uint64_t limit, int (*cb)(void *ctx, kvidx_dir_row_t *row), void *ctx,
                         uint64_t *total);

/* The resumable listing: keys strictly after *after (NULL: from the first)
 * in canonical order, calling cb for each that matches the filter, until
 * limit keys matched or max_scan keys were examined (either 0: no bound). When the
 * walk stopped before the end, *more is 1 and *resume (caller memory; its
 * model and salt point into the directory, so copy them before changing
 * it) is the last key examined: the next page is after it. A key present
 * from the first page to the last is returned exactly once, whatever
 * changes in between. cb's nonzero return stops the walk and is returned. */
int kvidx_directory_scan(const kvidx_directory_t *d, const kvidx_dir_filter_t *f,
                         const kvidx_key_t *after, size_t limit, size_t max_scan,
                         int (*cb)(void *ctx, kvidx_dir_row_t *row), void *ctx, kvidx_key_t *resume,
                         int *more);

/* One key of a lookup: 0 and *row with all its placements, or
 * KVIDX_ENOTFOUND. In both cases row's token fields carry the binding of
 * the key's chunk hash, which other keys of that hash keep alive. */
int kvidx_directory_lookup(const kvidx_directory_t *d, const kvidx_key_t *key,
                           kvidx_dir_row_t *row);

/* The binding of a chunk hash: 1 and the tokens (valid until the next
 * change), or 0 when none is known. */
int kvidx_directory_tokens(const kvidx_directory_t *d, const uint8_t *hash, size_t hash_len,
                           const uint32_t **tokens, size_t *num_tokens, int64_t *token_offset);

/* ---- score: POST /directory/score ---- */

typedef struct kvidx_dir_score {
    const char *instance_id; /* NULL for the shared-storage entry */
    size_t instance_len;
    int shared;        /* 1: what the fleet's shared storage serves */
    size_t l1_chunks;  /* servable prefix from the instance's own L1 placements */
    size_t l2_chunks;  /* ... from its own L2 placements */
    size_t any_chunks; /* ... counting a key held in either of its tiers */
} kvidx_dir_score_t;

/* For a request's keys in ipc flat order (shape: groups, chunks, ranks and
 * attention windows, as kvidx/fold.h), the servable prefix in chunks of
 * every instance that holds at least one of them, and of shared storage,
 * under the every-rank rule (a chunk counts only when each rank's key has
 * such a placement) and the window rules of kvidx_fold. Private placements
 * count for their instance, shared ones only for the shared entry. Sorted
 * best first: any_chunks, then l1_chunks, descending; then instance_id
 * ascending, the shared entry last among equals. *out is allocated (free it
 * with kvidx_directory_score_free); its strings point into the directory.
 * Returns 0, KVIDX_EINVAL (bad shape, or n differs from its key count),
 * KVIDX_ENOMEM. Costs O(instances x n). */
int kvidx_directory_score(const kvidx_directory_t *d, const kvidx_key_t *keys, size_t n,
                          const kvidx_fold_shape_t *shape, kvidx_dir_score_t **out, size_t *count);
void kvidx_directory_score_free(kvidx_dir_score_t *scores);

/* ---- streams, stats, capacities: /directory/streams, /directory/stats ---- */

typedef struct kvidx_dir_stream {
    const char *instance_id;
    size_t instance_len;
    uint64_t incarnation;
    uint64_t last_seq;
    int gap; /* a seq was skipped in this incarnation */
    /* counters since the cursor opened (a new incarnation opens a new one) */
    uint64_t applied, duplicates, stale;
    double last_ts; /* ts of the last admitted batch */
} kvidx_dir_stream_t;

/* Calls cb for every cursor, by instance_id. cb as for instances. */
int kvidx_directory_streams(const kvidx_directory_t *d,
                            int (*cb)(void *ctx, const kvidx_dir_stream_t *s), void *ctx);

typedef struct kvidx_dir_inst_stats {
    const char *instance_id;
    size_t instance_len;
    int has_cursor, registered;
    uint64_t l1_keys; /* keys with an L1 placement it last reported (LMCache's figure) */
    uint64_t placements[2], bytes[2]; /* [0] L1, [1] L2: placements it last reported */
} kvidx_dir_inst_stats_t;

/* Calls cb for every instance the directory knows (a cursor, a
 * registration, a declaration or placements), by instance_id. */
int kvidx_directory_inst_stats(const kvidx_directory_t *d,
                               int (*cb)(void *ctx, const kvidx_dir_inst_stats_t *s), void *ctx);

typedef struct kvidx_dir_stats {
    uint64_t num_keys, num_placements;
    uint64_t placements[2], bytes[2]; /* [0] L1, [1] L2 */
    uint64_t num_instances, num_registered, num_streams;
    uint64_t bindings, binding_tokens, token_bytes, token_bytes_cap;
    uint64_t bindings_dropped, tokens_dropped; /* by the cap, since creation */
    uint64_t memory_bytes;                     /* everything the directory allocated */
} kvidx_dir_stats_t;

void kvidx_directory_stats(const kvidx_directory_t *d, kvidx_dir_stats_t *out);

typedef struct kvidx_dir_capacity {
    const char *instance_id;
    size_t instance_len;
    uint64_t incarnation, capacity_revision; /* the declaration's stamp */
    kvidx_dir_tier_t tier;
    const char *backend;
    size_t backend_len;
    uint64_t capacity_bytes; /* 0 = no declared limit */
    int shared;
} kvidx_dir_capacity_t;

/* Calls cb for every declared compartment: by instance_id, then in the
 * order the declaration named them. */
int kvidx_directory_capacities(const kvidx_directory_t *d,
                               int (*cb)(void *ctx, const kvidx_dir_capacity_t *c), void *ctx);

/* ---- persistence ---- */

typedef enum kvidx_dir_rec_type {
    KVIDX_DIR_REC_INSTANCE = 1, /* a registration */
    KVIDX_DIR_REC_STREAM = 2,   /* a gate cursor with its counters */
    KVIDX_DIR_REC_CAPACITY = 3, /* one declared compartment */
    KVIDX_DIR_REC_KEY = 4,      /* a key, its last_access and placements */
    KVIDX_DIR_REC_BINDING = 5,  /* a chunk hash's tokens */
} kvidx_dir_rec_type_t;

typedef struct kvidx_dir_record {
    kvidx_dir_rec_type_t type;
    kvidx_dir_instance_t instance;
    kvidx_dir_stream_t stream;
    kvidx_dir_capacity_t capacity;
    struct {
        kvidx_key_t key;
        double last_access;
        const kvidx_dir_placement_t *placements;
        size_t num_placements;
    } key;
    struct {
        const uint8_t *hash;
        size_t hash_len;
        int64_t token_offset;
        const uint32_t *token_ids;
        size_t num_tokens;
    } binding;
} kvidx_dir_record_t;

/* Calls cb with the whole state as records: instances (registration
 * order), streams, capacities, keys (canonical order), then bindings
 * (oldest first). Loading them in that order into an empty directory with
 * the same token cap gives an equal directory (the last_seen_ms of
 * instances is the dump's; a daemon restoring after a restart may want to
 * reset it to its own clock). Records point into the directory and a
 * scratch buffer, valid during the call. Returns 0, cb's nonzero value, or
 * KVIDX_ENOMEM (the scratch for a key's placements). */
int kvidx_directory_dump(const kvidx_directory_t *d,
                         int (*cb)(void *ctx, const kvidx_dir_record_t *rec), void *ctx);

/* Loads one record (everything is copied; no change callback fires). A key
 * must not exist yet, and its placements must have distinct identities; a
 * binding whose chunk hash no key has is ignored (as LMCache does); a
 * stream or instance replaces one of the same id; a capacity follows the
 * declaration rules. Returns 0,
 * KVIDX_EINVAL (a field out of range, or a record of another type),
 * KVIDX_ECONFLICT (the key exists, or two placements share an identity), or
 * KVIDX_ENOMEM; nothing changes on failure. */
int kvidx_directory_load(kvidx_directory_t *d, const kvidx_dir_record_t *rec);

/* What changed, reported after every call that changed the state, so that
 * the daemon can journal it: replaying the same calls in order on the
 * state they started from gives the same directory. */
typedef enum kvidx_dir_change_type {
    KVIDX_DIR_CHG_BATCH = 1,      /* batch, verdict */
    KVIDX_DIR_CHG_REGISTER = 2,   /* instance */
    KVIDX_DIR_CHG_HEARTBEAT = 3,  /* instance_id, now_ms */
    KVIDX_DIR_CHG_DEREGISTER = 4, /* instance_id */
    KVIDX_DIR_CHG_EXPIRE = 5,     /* instance_id, now_ms: dropped by expire */
    KVIDX_DIR_CHG_TOKEN_CAP = 6,  /* token_bytes_cap */
} kvidx_dir_change_type_t;

typedef struct kvidx_dir_change {
    kvidx_dir_change_type_t type;
    const kvidx_dir_batch_t *batch;
    kvidx_dir_verdict_t verdict;
    const kvidx_dir_instance_t *instance;
    const char *instance_id;
    size_t instance_len;
    uint64_t now_ms;
    uint64_t token_bytes_cap;
} kvidx_dir_change_t;

/* Installs (or, with NULL, removes) the change callback. It runs after the
 * change is complete and must not call into the directory. */
void kvidx_directory_on_change(kvidx_directory_t *d,
                               void (*cb)(void *ctx, const kvidx_dir_change_t *c), void *ctx);

/* Verifies every invariant (placements against the reverse index and the
 * counters, the ordering tree and hash tables against the keys, bindings
 * against the chunk hashes, the memory accounting). 0, KVIDX_EINTERNAL, or
 * KVIDX_ENOMEM when its scratch counts cannot be allocated. Costs a walk of
 * the whole state. */
int kvidx_directory_check(const kvidx_directory_t *d);

#endif
