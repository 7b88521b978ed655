/*
 * The in-memory key index: its lifetime, settings, statistics and exact
 * lookups. The layout of a record and the shared structures are in
 * index_int.h; docs/index.md describes the design and the figures.
 *
 * Every key is one fixed-size record in a slab of its hash-length class,
 * named by a 32-bit ref that never moves (slab.c). Model names and salts
 * are interned once, refcounted by the namespaces that use them; a
 * namespace is one interned (cache_salt, model_name) pair with its own
 * B+tree of refs ordered by (kv_rank, object_group_id, hash bytes, shorter
 * first), and namespaces sit in an array sorted by (salt, model), so the
 * listing order is "namespaces in order, each tree in order" and a salt or
 * model filter is a range of namespaces (names.c, btree.c, list.c). Exact
 * lookup is an open-addressing table of refs with a tag byte each, hashed
 * with keyed SipHash-1-3 (table.c). L1 copies live in a separate table of
 * metadata allocated only for keys that have one, whose slot 0 is the LRU
 * list head (tier.c). Stores are store.c; the bulk loader of a restore is
 * load.c; kvidx_index_check (check.c) verifies the invariants below.
 *
 * Invariants: every live record is in exactly one tree, its namespace's,
 * and in the table, which holds nothing else (each slot's tag byte is the
 * top byte of its key's hash); free records are reachable from neither;
 * each tree is in strict key order and namespaces in strict (salt, model)
 * order; a key has an L1 copy or an L2 copy (else it is forgotten at once);
 * the per-tier key and byte counts are the sums over the records; an L1
 * copy is in the LRU list exactly when it is ready and unpinned, and
 * lru_bytes is the sum of their sizes; pin counts add up; B+tree leaves are
 * never empty, and separators in inner nodes are copies of keys (never
 * refs), so deleting a record never leaves a dangling separator; an
 * interned string's refcount is the number of its users. Every mutation
 * either completes or, on KVIDX_ENOMEM, is undone before returning;
 * eviction and deletion never allocate.
 */
#include "index_int.h"

/* ---- lifetime ---- */

int kvidx_index_new(const kvidx_index_opts_t *opts, kvidx_index_t **out)
{
    *out = NULL;
    kvidx_index_t *idx = kvidx_calloc(1, sizeof(*idx));
    if (!idx)
        return KVIDX_ENOMEM;
    if (opts && opts->has_seed) {
        memcpy(idx->hkey, opts->seed, sizeof(idx->hkey));
    } else {
        if (sodium_init() < 0) {
            kvidx_free(idx);
            return KVIDX_EINTERNAL;
        }
        randombytes_buf(idx->hkey, sizeof(idx->hkey));
    }
    for (unsigned c = 0; c < NCLASS; c++) {
        idx->slabs[c].rec_size = REC_HDR + 8 * (c + 1);
        idx->slabs[c].free_head = SLOT_NONE;
    }
    idx->ns_free = UINT32_MAX;
    /* Slot 0 of the L1 table is the LRU head. */
    int rc = ix_l1_reserve_slots(idx, 1);
    if (rc) {
        kvidx_free(idx);
        return rc;
    }
    idx->l1_used = 1;
    memset(&idx->l1[0], 0, sizeof(idx->l1[0]));
    idx->gen_next = 1;
    if (opts) {
        idx->l1_capacity = opts->l1_capacity_bytes;
        idx->l2_capacity = opts->l2_capacity_bytes;
        idx->on_evict = opts->on_evict;
        idx->on_evict_ctx = opts->on_evict_ctx;
    }
    *out = idx;
    return 0;
}

void kvidx_index_free(kvidx_index_t *idx)
{
    if (!idx)
        return;
    for (size_t i = 0; i < idx->n_ns; i++) {
        ns_t *ns = idx->ns_sorted[i];
        ix_tree_free(ns->root, ns->height);
        kvidx_free(ns);
    }
    for (size_t i = 0; i < idx->nstrs; i++)
        kvidx_free(idx->strs[i]);
    for (unsigned c = 0; c < NCLASS; c++) {
        for (uint32_t i = 0; i < idx->slabs[c].nblocks; i++)
            kvidx_free(idx->slabs[c].blocks[i]);
        kvidx_free(idx->slabs[c].blocks);
        kvidx_free(idx->slabs[c].chunks);
    }
    kvidx_free(idx->spare_leaf);
    for (uint32_t i = 0; i < idx->nspare_inner; i++)
        kvidx_free(idx->spare_inner[i]);
    kvidx_free(idx->ht); /* the tags are in the same block */
    kvidx_free(idx->strs);
    kvidx_free(idx->ns_sorted);
    kvidx_free(idx->ns_ids);
    kvidx_free(idx->l1);
    kvidx_free(idx->scratch);
    ix_sources_free(idx);
    ix_accounts_free(idx);
    kvidx_free(idx);
}

int kvidx_index_set_capacity(kvidx_index_t *idx, uint64_t l1_capacity_bytes,
                             uint64_t l2_capacity_bytes)
{
    idx->l1_capacity = l1_capacity_bytes;
    idx->l2_capacity = l2_capacity_bytes;
    ix_evict_to_fit(idx);
    return 0;
}

void kvidx_index_set_evict_cb(kvidx_index_t *idx, kvidx_evict_cb cb, void *ctx)
{
    idx->on_evict = cb;
    idx->on_evict_ctx = ctx;
}

int kvidx_index_reserve(kvidx_index_t *idx, uint64_t nkeys)
{
    if (nkeys > ((uint64_t)1 << 31))
        return KVIDX_EINVAL;
    return ix_ht_reserve(idx, (size_t)nkeys);
}

void kvidx_index_set_change_cb(kvidx_index_t *idx, kvidx_change_cb cb, void *ctx)
{
    idx->on_change = cb;
    idx->on_change_ctx = ctx;
}

/* ---- lookup ---- */

/* Fills info from a live record (kvidx_index_info without the check). */
static void info_of(const kvidx_index_t *idx, const uint8_t *r, kvidx_entry_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->size_bytes = rec_size(r);
    info->l2 = rec_l2_any(r);
    info->l2_api = rec_l2(r);
    info->l2_source = rec_src(r);
    uint32_t m = rec_l1(r);
    if (m) {
        const l1m_t *e = &idx->l1[m];
        info->l1_state = (kvidx_l1_state_t)e->state;
        info->pins = e->pins;
        info->temporary = e->temporary;
        info->generation = e->gen;
    }
}

void kvidx_index_find_batch(const kvidx_index_t *idx, const kvidx_key_t *keys, size_t n,
                            kvidx_ref_t *refs, kvidx_entry_info_t *infos)
{
    /* Windows of W keys in passes, so that the cache misses of a window
     * overlap: hash every key and prefetch its table slot; read the slot
     * and prefetch the record it names; probe, and prefetch the L1
     * metadata; fill the infos. The namespace and the hash parts are
     * reused from the previous key where they are the same. */
    enum { W = 16 };
    hcache_t hc;
    hc.a_valid = 0;
    hc.b_valid = 0;
    const ns_t *ns = NULL;
    const kvidx_key_t *prev = NULL;
    uint64_t hs[W];
    const ns_t *nss[W];
    for (size_t w0 = 0; w0 < n; w0 += W) {
        size_t w1 = n - w0 < W ? n : w0 + W;
        for (size_t i = w0; i < w1; i++) {
            const kvidx_key_t *k = &keys[i];
            nss[i - w0] = NULL;
            if (!key_shape_ok(k))
                continue;
            if (!prev || k->model != prev->model || k->salt != prev->salt ||
                k->model_len != prev->model_len || k->salt_len != prev->salt_len) {
                if (!ns || ns_cmp(ns, k->salt, k->salt_len, k->model, k->model_len) != 0)
                    ns = ns_find(idx, k);
                prev = k;
            }
            if (!ns || !idx->ht_cap)
                continue;
            nss[i - w0] = ns;
            tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
            hs[i - w0] = tk_hash_cached(idx, &hc, ns->id, &t);
            PREFETCH(&idx->ht[ht_home(idx, hs[i - w0])]);
            PREFETCH(&idx->ht_tag[ht_home(idx, hs[i - w0])]);
        }
        for (size_t i = w0; i < w1; i++) {
            if (!nss[i - w0])
                continue;
            /* The record of the first slot of the run whose tag matches. */
            size_t j = ht_home(idx, hs[i - w0]);
            uint8_t tag = h_tag(hs[i - w0]);
            for (int step = 0; step < 4 && idx->ht[j] != KVIDX_REF_NONE; step++) {
                if (idx->ht_tag[j] == tag) {
                    PREFETCH(rec_at(idx, idx->ht[j]));
                    break;
                }
                j = ht_next(idx, j);
            }
        }
        for (size_t i = w0; i < w1; i++) {
            const kvidx_key_t *k = &keys[i];
            refs[i] = KVIDX_REF_NONE;
            if (!nss[i - w0])
                continue;
            tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
            refs[i] = ht_find_h(idx, nss[i - w0]->id, &t, hs[i - w0]);
            uint32_t m = refs[i] == KVIDX_REF_NONE ? 0 : rec_l1(rec_at(idx, refs[i]));
            if (infos && m)
                PREFETCH(&idx->l1[m]);
        }
        for (size_t i = w0; infos && i < w1; i++)
            if (refs[i] != KVIDX_REF_NONE)
                info_of(idx, rec_at(idx, refs[i]), &infos[i]);
    }
}

int kvidx_index_find(const kvidx_index_t *idx, const kvidx_key_t *key, kvidx_ref_t *ref)
{
    kvidx_ref_t r = lookup(idx, key);
    if (r == KVIDX_REF_NONE)
        return KVIDX_ENOTFOUND;
    *ref = r;
    return 0;
}

int kvidx_index_info(const kvidx_index_t *idx, kvidx_ref_t ref, kvidx_entry_info_t *info)
{
    if (!ref_live(idx, ref))
        return KVIDX_ENOTFOUND;
    info_of(idx, rec_at(idx, ref), info);
    return 0;
}

int kvidx_index_key(const kvidx_index_t *idx, kvidx_ref_t ref, kvidx_key_t *out)
{
    if (!ref_live(idx, ref))
        return KVIDX_ENOTFOUND;
    make_key(idx, rec_at(idx, ref), out);
    return 0;
}

void kvidx_key_buf_set(kvidx_key_buf_t *b, const kvidx_key_t *k)
{
    b->key = *k;
    if (k->model_len)
        memcpy(b->model, k->model, k->model_len);
    if (k->salt_len)
        memcpy(b->salt, k->salt, k->salt_len);
    b->key.model = b->model;
    b->key.salt = b->salt;
}

void kvidx_index_stats(const kvidx_index_t *idx, kvidx_index_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->keys = idx->c.keys;
    out->l1_keys = idx->c.l1_keys;
    out->l1_bytes = idx->c.l1_bytes;
    out->l1_loading = idx->c.l1_loading;
    out->l1_pinned = idx->c.l1_pinned;
    out->l1_pins = idx->c.l1_pins;
    out->l1_evictable_bytes = idx->c.lru_bytes;
    out->l2_keys = idx->c.l2_keys;
    out->l2_bytes = idx->c.l2_bytes;
    out->l2_source_keys = idx->c.src_keys;
    out->l2_source_bytes = idx->c.src_bytes;
    out->evictions = idx->c.evictions;
    out->names = idx->nstrs;
    out->namespaces = idx->n_ns;
    out->l1_capacity_bytes = idx->l1_capacity;
    out->l2_capacity_bytes = idx->l2_capacity;
}
