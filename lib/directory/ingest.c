/*
 * The event gate and the application of cache-event batches.
 *
 * The gate keeps, per instance_id, a cursor (incarnation, last_seq, gap)
 * and decides each batch's fate as LMCache's EventGate does: without a
 * cursor a batch is admitted and opens one; a lower incarnation is stale; a
 * higher one fences the instance (every L1 placement it last reported
 * goes, L2 stays) and opens a fresh cursor; at the same incarnation a seq
 * at or below last_seq is a duplicate, and a seq past last_seq + 1 sets the
 * gap flag (for good, in that incarnation) and is admitted.
 *
 * An admitted batch applies whole or not at all: prepare() takes every
 * allocation the batch could need (instance record, strings, namespaces,
 * source, key slots, placement slots, table room, binding blocks) and pins
 * what it will use, so that the fence that may come first cannot free it;
 * apply() then cannot fail; release() drops the pins and whatever was not
 * consumed. Reserved room that ends up unused stays as spare capacity,
 * which changes no answer.
 */
#include "directory_int.h"

#include <math.h>

static int reject(kvidx_reason_t *why, size_t *bad, size_t entry, const char *field,
                  const char *rule)
{
    if (why) {
        why->field = field;
        why->rule = rule;
    }
    if (bad)
        *bad = entry;
    return KVIDX_EINVAL;
}

/* Equal byte ranges (a NULL range of length 0 equals any empty one). */
static int same_bytes(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (an == 0 || (a && b && memcmp(a, b, an) == 0));
}

int kvidx_directory_batch_check(const kvidx_dir_batch_t *b, size_t *bad_entry, kvidx_reason_t *why)
{
    if (bad_entry)
        *bad_entry = SIZE_MAX;
    if (b->instance_len == 0 || !b->instance_id)
        return reject(why, bad_entry, SIZE_MAX, "instance_id", "must be non-empty");
    if (b->instance_len > KVIDX_DIR_ID_MAX)
        return reject(why, bad_entry, SIZE_MAX, "instance_id", "must be at most 1024 bytes");
    if ((unsigned)b->event_type > KVIDX_DIR_CONFIG)
        return reject(why, bad_entry, SIZE_MAX, "event_type",
                      "must be store, delete, access or config");
    if (b->tier != KVIDX_DIR_L1 && b->tier != KVIDX_DIR_L2)
        return reject(why, bad_entry, SIZE_MAX, "tier", "must be l1 or l2");
    if (b->backend_len > KVIDX_DIR_ID_MAX || (b->backend_len && !b->backend))
        return reject(why, bad_entry, SIZE_MAX, "backend", "must be at most 1024 bytes");
    if (b->backend_len == 0 && b->event_type != KVIDX_DIR_ACCESS)
        return reject(why, bad_entry, SIZE_MAX, "backend",
                      "must be non-empty for store, delete and config batches");
    if (b->seq < 1)
        return reject(why, bad_entry, SIZE_MAX, "seq", "must be >= 1");
    if (!isfinite(b->ts) || b->ts < 0.0)
        return reject(why, bad_entry, SIZE_MAX, "ts", "must be a finite number >= 0");
    if (b->shared != 0 && b->shared != 1)
        return reject(why, bad_entry, SIZE_MAX, "shared", "must be a boolean");
    if (b->event_type == KVIDX_DIR_CONFIG && b->num_entries)
        return reject(why, bad_entry, SIZE_MAX, "entries",
                      "config batches declare capacity and carry no entries");
    if (b->num_entries && !b->entries)
        return reject(why, bad_entry, SIZE_MAX, "entries", "missing");
    /* The model name and salt of the entry before, which passed: a batch
     * usually names one model a thousand times, checked once. */
    const kvidx_key_t *ok = NULL;
    for (size_t i = 0; i < b->num_entries; i++) {
        const kvidx_dir_entry_t *e = &b->entries[i];
        const kvidx_key_t *k = &e->key;
        if (k->hash_len < KVIDX_HASH_MIN || k->hash_len > KVIDX_HASH_MAX)
            return reject(why, bad_entry, i, "chunk_hash_hex", "must be 2..128 hex digits");
        if (!k->model)
            return reject(why, bad_entry, i, "model_name", "missing");
        if (!ok || !same_bytes(k->model, k->model_len, ok->model, ok->model_len)) {
            if (kvidx_key_check_model(k->model, k->model_len, why))
                return reject(NULL, bad_entry, i, NULL, NULL);
        }
        if (k->salt_len && (!ok || !same_bytes(k->salt, k->salt_len, ok->salt, ok->salt_len)) &&
            (!k->salt || kvidx_key_check_salt(k->salt, k->salt_len, why)))
            return reject(k->salt ? NULL : why, bad_entry, i, "cache_salt", "missing");
        ok = k;
        if (e->token_offset < KVIDX_DIR_UNKNOWN_OFFSET)
            return reject(why, bad_entry, i, "token_offset", "must be >= 0 or -1 (unknown)");
        if (e->num_tokens && !e->token_ids)
            return reject(why, bad_entry, i, "token_ids", "missing");
        if (e->num_tokens > UINT32_MAX)
            return reject(why, bad_entry, i, "token_ids", "too many");
    }
    return 0;
}

kvidx_dir_verdict_t kvidx_directory_classify(const kvidx_directory_t *d, const kvidx_dir_batch_t *b)
{
    const inst_t *in = dr_inst_find(d, b->instance_id, b->instance_len);
    if (!in || !in->has_cursor || b->incarnation > in->incarnation)
        return KVIDX_DIR_ADMITTED;
    if (b->incarnation < in->incarnation)
        return KVIDX_DIR_STALE;
    return b->seq <= in->last_seq ? KVIDX_DIR_DUPLICATE : KVIDX_DIR_ADMITTED;
}

/* ---- prepare, apply, release ---- */

typedef struct prep {
    inst_t *in;
    uint32_t src;     /* pinned source of a store, or NONE */
    uint32_t backend; /* pinned backend string, or NONE */
    uint32_t *ns;     /* per entry: pinned namespace, or NONE */
    dbind_t **blk;    /* per entry: binding block not yet consumed, or NULL */
    uint32_t *ref;    /* per entry: the key's record when prepare found it, or NONE */
    size_t n;
    int refs_stale; /* a fence came after prepare: ref[] may name freed records */
} prep_t;

static void release(kvidx_directory_t *d, prep_t *pr)
{
    for (size_t i = 0; i < pr->n; i++) {
        if (pr->blk && pr->blk[i])
            dr_bind_block_free(d, pr->blk[i]);
        if (pr->ns && pr->ns[i] != NONE)
            dr_ns_unref(d, pr->ns[i]);
    }
    dr_free(d, pr->blk, pr->n * sizeof(dbind_t *));
    dr_free(d, pr->ns, pr->n * sizeof(uint32_t));
    dr_free(d, pr->ref, pr->n * sizeof(uint32_t));
    if (pr->src != NONE)
        dr_src_unpin(d, pr->src);
    if (pr->backend != NONE)
        dr_str_unref(d, pr->backend);
    if (pr->in)
        dr_inst_unpin(d, pr->in);
}

static int prepare_store(kvidx_directory_t *d, const kvidx_dir_batch_t *b, prep_t *pr)
{
    if (dr_srcs_reserve(d, 1))
        return KVIDX_ENOMEM;
    pr->src = dr_src_get(d, pr->in, b->incarnation, b->tier, pr->backend, b->shared);
    size_t n = b->num_entries;
    if (!n)
        return 0;
    pr->ns = dr_alloc(d, n * sizeof(uint32_t));
    pr->blk = dr_alloc(d, n * sizeof(dbind_t *));
    pr->ref = dr_alloc(d, n * sizeof(uint32_t));
    if (!pr->ns || !pr->blk || !pr->ref) {
        dr_free(d, pr->ns, n * sizeof(uint32_t));
        dr_free(d, pr->blk, n * sizeof(dbind_t *));
        dr_free(d, pr->ref, n * sizeof(uint32_t));
        pr->ns = NULL;
        pr->blk = NULL;
        pr->ref = NULL;
        return KVIDX_ENOMEM;
    }
    pr->n = n;
    for (size_t i = 0; i < n; i++) {
        pr->ns[i] = NONE;
        pr->blk[i] = NULL;
        pr->ref[i] = NONE;
    }
    uint32_t per_class[NCLASS] = {0};
    size_t fresh = 0, blocks = 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_dir_entry_t *e = &b->entries[i];
        const kvidx_key_t *prev = i ? &b->entries[i - 1].key : NULL;
        if (prev && same_bytes(e->key.model, e->key.model_len, prev->model, prev->model_len) &&
            same_bytes(e->key.salt, e->key.salt_len, prev->salt, prev->salt_len)) {
            /* The namespace of the entry before: one more pin, no lookup. */
            pr->ns[i] = pr->ns[i - 1];
            d->ns[pr->ns[i]].refs++;
        } else if (dr_ns_get(d, &e->key, &pr->ns[i])) {
            return KVIDX_ENOMEM;
        }
        pr->ref[i] = dr_key_find(d, pr->ns[i], &e->key);
        if (pr->ref[i] == NONE) {
            per_class[hash_class(e->key.hash_len)]++;
            fresh++;
        }
        if (e->num_tokens) {
            pr->blk[i] = dr_bind_block(d, e->token_ids, e->num_tokens, e->token_offset);
            if (!pr->blk[i])
                return KVIDX_ENOMEM;
            blocks++;
        }
    }
    if (dr_keys_reserve(d, per_class, fresh) || dr_pool_reserve(d, n) ||
        dr_binds_reserve(d, blocks))
        return KVIDX_ENOMEM;
    return 0;
}

static int prepare(kvidx_directory_t *d, const kvidx_dir_batch_t *b, prep_t *pr)
{
    memset(pr, 0, sizeof(*pr));
    pr->src = pr->backend = NONE;
    if (dr_inst_get(d, b->instance_id, b->instance_len, &pr->in)) {
        pr->in = NULL;
        return KVIDX_ENOMEM;
    }
    if (b->event_type == KVIDX_DIR_STORE || b->event_type == KVIDX_DIR_CONFIG) {
        if (dr_str_get(d, b->backend, b->backend_len, &pr->backend)) {
            pr->backend = NONE;
            return KVIDX_ENOMEM;
        }
    }
    if (b->event_type == KVIDX_DIR_STORE)
        return prepare_store(d, b, pr);
    if (b->event_type == KVIDX_DIR_CONFIG)
        return dr_caps_reserve(d, pr->in, 1);
    return 0;
}

static void touch(krec_t *r, double ts)
{
    if (ts > r->last_access)
        r->last_access = ts;
}

static void apply_entries(kvidx_directory_t *d, const kvidx_dir_batch_t *b, prep_t *pr)
{
    inst_t *in = pr->in;
    uint32_t backend = b->backend_len ? dr_str_find(d, b->backend, b->backend_len) : NONE;
    for (size_t i = 0; i < b->num_entries; i++) {
        const kvidx_dir_entry_t *e = &b->entries[i];
        if (b->event_type == KVIDX_DIR_STORE) {
            /* A key prepare found still exists unless a fence came since;
             * one it did not find may have been made by an earlier entry
             * of this batch naming it too. */
            uint32_t ref = pr->refs_stale ? NONE : pr->ref[i];
            if (ref == NONE)
                ref = dr_key_find(d, pr->ns[i], &e->key);
            if (ref == NONE)
                ref = dr_key_create(d, pr->ns[i], &e->key);
            dr_pl_upsert(d, ref, pr->src, e->size_bytes);
            if (pr->blk[i]) {
                dr_bind_set(d, ref, pr->blk[i]);
                pr->blk[i] = NULL;
            }
            touch(K(d, ref), b->ts);
            continue;
        }
        uint32_t ref = dr_key_find(d, dr_ns_find(d, &e->key), &e->key);
        if (ref == NONE)
            continue;
        if (b->event_type == KVIDX_DIR_ACCESS) {
            touch(K(d, ref), b->ts);
        } else if (backend != NONE) {
            uint32_t p = dr_pl_find(d, ref, in->sid, b->tier, backend, b->shared);
            if (p != NONE)
                dr_pl_remove(d, ref, p);
        }
    }
}

static void apply(kvidx_directory_t *d, const kvidx_dir_batch_t *b, prep_t *pr)
{
    inst_t *in = pr->in;
    if (!in->has_cursor || b->incarnation > in->incarnation) {
        if (in->has_cursor) {
            dr_fence(d, in);
            pr->refs_stale = 1;
        }
        in->has_cursor = 1;
        in->incarnation = b->incarnation;
        in->last_seq = 0;
        in->gap = 0;
        in->applied = in->duplicates = in->stale = 0;
        in->last_ts = 0.0;
    }
    if (b->seq > in->last_seq + 1)
        in->gap = 1;
    in->last_seq = b->seq;
    in->applied++;
    in->last_ts = b->ts;
    if (b->event_type == KVIDX_DIR_CONFIG)
        dr_caps_apply(d, in, b->incarnation, b->capacity_revision, b->tier, pr->backend, b->shared,
                      b->capacity_bytes);
    else
        apply_entries(d, b, pr);
}

int kvidx_directory_ingest(kvidx_directory_t *d, const kvidx_dir_batch_t *b,
                           kvidx_dir_verdict_t *verdict)
{
    int rc = kvidx_directory_batch_check(b, NULL, NULL);
    if (rc)
        return rc;
    kvidx_dir_verdict_t v = kvidx_directory_classify(d, b);
    if (v != KVIDX_DIR_ADMITTED) {
        inst_t *in = dr_inst_find(d, b->instance_id, b->instance_len);
        if (v == KVIDX_DIR_STALE)
            in->stale++;
        else
            in->duplicates++;
    } else {
        prep_t pr;
        rc = prepare(d, b, &pr);
        if (rc == 0)
            apply(d, b, &pr);
        release(d, &pr);
        if (rc)
            return rc;
    }
    if (verdict)
        *verdict = v;
    kvidx_dir_change_t c = {.type = KVIDX_DIR_CHG_BATCH, .batch = b, .verdict = v};
    dr_notify(d, &c);
    return 0;
}
