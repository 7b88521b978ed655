/*
 * The fleet directory as records: dump enumerates the whole state
 * (registrations, cursors, declarations, keys with their placements, token
 * bindings oldest first) and load puts one record back.
 *
 * The order of the dump is the order a load needs: keys before the
 * bindings that hang on their chunk hashes, and bindings oldest first so
 * that loading appends them in the same age order (the token cap then
 * drops the same ones). A loaded record changes the state exactly as the
 * record says, fires no change callback, and, like every mutation,
 * allocates everything before changing anything.
 */
#include "directory_int.h"

#include <math.h>

static int dump_keys(const kvidx_directory_t *d, int (*cb)(void *, const kvidx_dir_record_t *),
                     void *ctx)
{
    kvidx_dir_placement_t *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    tree_iter_t it;
    dr_tree_iter_start(d, &it, NULL, 0);
    for (uint32_t ref; (ref = dr_tree_iter_next(d, &it)) != NONE;) {
        size_t n = 0;
        for (uint32_t p = K(d, ref)->plist; !(p & KEY_TAG); p = P(d, p)->next) {
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 8;
                void *nb = kvidx_realloc(buf, nc * sizeof(*buf));
                if (!nb) {
                    rc = KVIDX_ENOMEM;
                    goto done;
                }
                buf = nb;
                cap = nc;
            }
            dr_placement_view(d, p, &buf[n++]);
        }
        kvidx_dir_record_t r;
        memset(&r, 0, sizeof(r));
        r.type = KVIDX_DIR_REC_KEY;
        dr_key_view(d, ref, &r.key.key);
        r.key.last_access = K(d, ref)->last_access;
        r.key.placements = buf;
        r.key.num_placements = n;
        if ((rc = cb(ctx, &r)))
            break;
    }
done:
    kvidx_free(buf);
    return rc;
}

typedef struct dump_ctx {
    int (*cb)(void *, const kvidx_dir_record_t *);
    void *ctx;
    kvidx_dir_record_t r;
} dump_ctx_t;

static int dump_instance(void *ctx, const kvidx_dir_instance_t *in)
{
    dump_ctx_t *c = ctx;
    c->r.type = KVIDX_DIR_REC_INSTANCE;
    c->r.instance = *in;
    return c->cb(c->ctx, &c->r);
}

static int dump_stream(void *ctx, const kvidx_dir_stream_t *s)
{
    dump_ctx_t *c = ctx;
    c->r.type = KVIDX_DIR_REC_STREAM;
    c->r.stream = *s;
    return c->cb(c->ctx, &c->r);
}

static int dump_capacity(void *ctx, const kvidx_dir_capacity_t *cap)
{
    dump_ctx_t *c = ctx;
    c->r.type = KVIDX_DIR_REC_CAPACITY;
    c->r.capacity = *cap;
    return c->cb(c->ctx, &c->r);
}

int kvidx_directory_dump(const kvidx_directory_t *d,
                         int (*cb)(void *ctx, const kvidx_dir_record_t *rec), void *ctx)
{
    dump_ctx_t c;
    memset(&c, 0, sizeof(c));
    c.cb = cb;
    c.ctx = ctx;
    int rc;
    if ((rc = kvidx_directory_instances(d, dump_instance, &c)) ||
        (rc = kvidx_directory_streams(d, dump_stream, &c)) ||
        (rc = kvidx_directory_capacities(d, dump_capacity, &c)) || (rc = dump_keys(d, cb, ctx)))
        return rc;
    for (uint32_t b = d->age_head; b != NONE; b = d->binds[b]->next) {
        const dbind_t *x = d->binds[b];
        kvidx_dir_record_t r;
        memset(&r, 0, sizeof(r));
        r.type = KVIDX_DIR_REC_BINDING;
        r.binding.hash = K(d, x->rep)->hash;
        r.binding.hash_len = K(d, x->rep)->hash_len;
        r.binding.token_offset = x->offset;
        r.binding.token_ids = x->tok;
        r.binding.num_tokens = x->ntok;
        if ((rc = cb(ctx, &r)))
            return rc;
    }
    return 0;
}

/* ---- load ---- */

static int id_ok(const char *s, size_t n, int may_be_empty)
{
    return n <= KVIDX_DIR_ID_MAX && (n ? s != NULL : may_be_empty);
}

static int load_stream(kvidx_directory_t *d, const kvidx_dir_stream_t *s)
{
    if (!id_ok(s->instance_id, s->instance_len, 0) || !isfinite(s->last_ts))
        return KVIDX_EINVAL;
    inst_t *in;
    if (dr_inst_get(d, s->instance_id, s->instance_len, &in))
        return KVIDX_ENOMEM;
    in->has_cursor = 1;
    in->incarnation = s->incarnation;
    in->last_seq = s->last_seq;
    in->gap = s->gap != 0;
    in->applied = s->applied;
    in->duplicates = s->duplicates;
    in->stale = s->stale;
    in->last_ts = s->last_ts;
    dr_inst_unpin(d, in);
    return 0;
}

static int load_capacity(kvidx_directory_t *d, const kvidx_dir_capacity_t *c)
{
    if (!id_ok(c->instance_id, c->instance_len, 0) || !id_ok(c->backend, c->backend_len, 0) ||
        (c->tier != KVIDX_DIR_L1 && c->tier != KVIDX_DIR_L2))
        return KVIDX_EINVAL;
    inst_t *in;
    uint32_t backend;
    if (dr_inst_get(d, c->instance_id, c->instance_len, &in))
        return KVIDX_ENOMEM;
    int rc = dr_str_get(d, c->backend, c->backend_len, &backend);
    if (rc == 0) {
        rc = dr_caps_reserve(d, in, 1);
        if (rc == 0)
            dr_caps_apply(d, in, c->incarnation, c->capacity_revision, c->tier, backend, c->shared,
                          c->capacity_bytes);
        dr_str_unref(d, backend);
    }
    dr_inst_unpin(d, in);
    return rc;
}

static int same_identity(const kvidx_dir_placement_t *a, const kvidx_dir_placement_t *b)
{
    return a->tier == b->tier && a->shared == b->shared &&
           bytes_cmp(a->backend, a->backend_len, b->backend, b->backend_len) == 0 &&
           (a->shared ||
            bytes_cmp(a->instance_id, a->instance_len, b->instance_id, b->instance_len) == 0);
}

static int key_record_check(const kvidx_dir_record_t *rec)
{
    const kvidx_key_t *k = &rec->key.key;
    if (k->hash_len < KVIDX_HASH_MIN || k->hash_len > KVIDX_HASH_MAX || !k->model ||
        kvidx_key_check_model(k->model, k->model_len, NULL) ||
        (k->salt_len && (!k->salt || kvidx_key_check_salt(k->salt, k->salt_len, NULL))))
        return KVIDX_EINVAL;
    if (!rec->key.num_placements || !rec->key.placements || !isfinite(rec->key.last_access))
        return KVIDX_EINVAL;
    for (size_t i = 0; i < rec->key.num_placements; i++) {
        const kvidx_dir_placement_t *p = &rec->key.placements[i];
        if (!id_ok(p->instance_id, p->instance_len, 0) || !id_ok(p->backend, p->backend_len, 0) ||
            (p->tier != KVIDX_DIR_L1 && p->tier != KVIDX_DIR_L2) ||
            (p->shared != 0 && p->shared != 1))
            return KVIDX_EINVAL;
    }
    for (size_t i = 0; i < rec->key.num_placements; i++)
        for (size_t j = 0; j < i; j++)
            if (same_identity(&rec->key.placements[i], &rec->key.placements[j]))
                return KVIDX_ECONFLICT;
    return 0;
}

typedef struct kprep {
    size_t n;
    inst_t **in;
    uint32_t *backend, *src;
    uint32_t ns;
} kprep_t;

static void key_release(kvidx_directory_t *d, kprep_t *k)
{
    for (size_t i = 0; i < k->n; i++) {
        if (k->src && k->src[i] != NONE)
            dr_src_unpin(d, k->src[i]);
        if (k->backend && k->backend[i] != NONE)
            dr_str_unref(d, k->backend[i]);
        if (k->in && k->in[i])
            dr_inst_unpin(d, k->in[i]);
    }
    if (k->ns != NONE)
        dr_ns_unref(d, k->ns);
    dr_free(d, k->in, k->n * sizeof(inst_t *));
    dr_free(d, k->backend, k->n * sizeof(uint32_t));
    dr_free(d, k->src, k->n * sizeof(uint32_t));
}

static int key_prepare(kvidx_directory_t *d, const kvidx_dir_record_t *rec, kprep_t *k)
{
    size_t n = rec->key.num_placements;
    k->in = dr_alloc(d, n * sizeof(inst_t *));
    k->backend = dr_alloc(d, n * sizeof(uint32_t));
    k->src = dr_alloc(d, n * sizeof(uint32_t));
    if (!k->in || !k->backend || !k->src) {
        dr_free(d, k->in, n * sizeof(inst_t *));
        dr_free(d, k->backend, n * sizeof(uint32_t));
        dr_free(d, k->src, n * sizeof(uint32_t));
        k->in = NULL;
        k->backend = k->src = NULL;
        return KVIDX_ENOMEM;
    }
    k->n = n;
    for (size_t i = 0; i < n; i++) {
        k->in[i] = NULL;
        k->backend[i] = k->src[i] = NONE;
    }
    if (dr_ns_get(d, &rec->key.key, &k->ns)) {
        k->ns = NONE;
        return KVIDX_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const kvidx_dir_placement_t *p = &rec->key.placements[i];
        if (dr_inst_get(d, p->instance_id, p->instance_len, &k->in[i])) {
            k->in[i] = NULL;
            return KVIDX_ENOMEM;
        }
        if (dr_str_get(d, p->backend, p->backend_len, &k->backend[i])) {
            k->backend[i] = NONE;
            return KVIDX_ENOMEM;
        }
        if (dr_srcs_reserve(d, 1))
            return KVIDX_ENOMEM;
        k->src[i] = dr_src_get(d, k->in[i], p->incarnation, p->tier, k->backend[i], p->shared);
    }
    uint32_t per_class[NCLASS] = {0};
    per_class[hash_class(rec->key.key.hash_len)] = 1;
    if (dr_keys_reserve(d, per_class, 1) || dr_pool_reserve(d, n))
        return KVIDX_ENOMEM;
    return 0;
}

static int load_key(kvidx_directory_t *d, const kvidx_dir_record_t *rec)
{
    int rc = key_record_check(rec);
    if (rc)
        return rc;
    const kvidx_key_t *key = &rec->key.key;
    if (dr_key_find(d, dr_ns_find(d, key), key) != NONE)
        return KVIDX_ECONFLICT;
    kprep_t k = {0, NULL, NULL, NULL, NONE};
    rc = key_prepare(d, rec, &k);
    if (rc == 0) {
        uint32_t ref = dr_key_create(d, k.ns, key);
        for (size_t i = 0; i < k.n; i++)
            dr_pl_upsert(d, ref, k.src[i], rec->key.placements[i].size_bytes);
        K(d, ref)->last_access = rec->key.last_access;
    }
    key_release(d, &k);
    return rc;
}

static int load_binding(kvidx_directory_t *d, const kvidx_dir_record_t *rec)
{
    const uint8_t *h = rec->binding.hash;
    size_t hl = rec->binding.hash_len;
    if (!h || hl < KVIDX_HASH_MIN || hl > KVIDX_HASH_MAX || !rec->binding.num_tokens ||
        !rec->binding.token_ids || rec->binding.token_offset < KVIDX_DIR_UNKNOWN_OFFSET)
        return KVIDX_EINVAL;
    uint32_t rep = dr_chunk_find(d, h, hl);
    if (rep == NONE)
        return 0;
    if (dr_binds_reserve(d, 1))
        return KVIDX_ENOMEM;
    dbind_t *b = dr_bind_block(d, rec->binding.token_ids, rec->binding.num_tokens,
                               rec->binding.token_offset);
    if (!b)
        return KVIDX_ENOMEM;
    dr_bind_set(d, rep, b);
    return 0;
}

int kvidx_directory_load(kvidx_directory_t *d, const kvidx_dir_record_t *rec)
{
    switch (rec->type) {
    case KVIDX_DIR_REC_INSTANCE:
        return dr_register(d, &rec->instance, NULL, 0);
    case KVIDX_DIR_REC_STREAM:
        return load_stream(d, &rec->stream);
    case KVIDX_DIR_REC_CAPACITY:
        return load_capacity(d, &rec->capacity);
    case KVIDX_DIR_REC_KEY:
        return load_key(d, rec);
    case KVIDX_DIR_REC_BINDING:
        return load_binding(d, rec);
    }
    return KVIDX_EINVAL;
}
