/*
 * Batch stores (kvidx_index_put_batch): all or nothing.
 *
 * A batch goes through phases, each one function: validate the items, look
 * every key up, collapse duplicates with a hash table over the batch (the
 * last position wins; no sort), count what the batch adds per tier and
 * check the capacities, reserve every table slot, record and L1 slot it
 * can need, apply in batch order, then set recency and report the changes,
 * and finally evict to fit. Until
 * the apply phase nothing is changed; there only a new namespace or tree
 * nodes can still fail to allocate, and every change made so far is then
 * undone from the undo log (put_rollback), counters included, so that the
 * index is exactly as before. Eviction comes last, after the batch is in,
 * and never takes a key of the batch's own.
 */
#include "index_int.h"

/* Per-item working state, in the index's reusable scratch buffer. */
typedef struct work {
    uint64_t h;        /* table hash, when ns is known */
    uint32_t ns;       /* namespace id, or UINT32_MAX when it does not exist */
    kvidx_ref_t ref;   /* existing key, or the new one once created */
    uint8_t effective; /* last occurrence of its key in the batch */
} work_t;

/* What one effective item changed, to undo it on failure. */
typedef struct undo {
    kvidx_ref_t ref;
    uint64_t old_size;
    uint8_t created, old_l2, l1_created;
    uint8_t untemped; /* an existing temporary L1 copy was made permanent */
} undo_t;

/* One batch in progress. order[0..neff) are the effective items in batch
 * order; undo[0..nu) the changes applied so far, in the same order. */
typedef struct batch {
    kvidx_tier_t tier;
    const kvidx_put_t *items;
    size_t n, neff, nu;
    work_t *work;
    uint32_t *order;
    uint32_t *dup; /* duplicate table: 1 + item index, 0 when empty */
    size_t dup_cap;
    undo_t *undo;
    hcache_t hc;
} batch_t;

/* What the effective items add: byte deltas per tier, evictable bytes of
 * the batch's own keys, new L1 copies, new keys and new records per class. */
typedef struct need {
    int64_t d1, d2;
    uint64_t excluded, new_l1, new_keys;
    uint64_t new_recs[NCLASS];
} need_t;

static int put_validate(const kvidx_put_t *items, size_t n, size_t *conflict_index)
{
    for (size_t i = 0; i < n; i++) {
        if (!key_shape_ok(&items[i].key) || items[i].key.model_len == 0 ||
            items[i].size_bytes == 0 || items[i].size_bytes > KVIDX_SIZE_MAX) {
            if (conflict_index)
                *conflict_index = i;
            return KVIDX_EINVAL;
        }
    }
    return 0;
}

/* Carves work[n], order[n], undo[n] and the duplicate table (a power of
 * two of at least 2n slots) from the scratch buffer. */
static int put_scratch(kvidx_index_t *idx, batch_t *b)
{
    size_t n = b->n;
    size_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    size_t bytes =
        n * (sizeof(work_t) + sizeof(uint32_t) + sizeof(undo_t)) + cap * sizeof(uint32_t);
    void *mem;
    int rc = ix_scratch_get(idx, bytes, &mem);
    if (rc)
        return rc;
    b->undo = mem;
    b->work = (work_t *)(b->undo + n);
    b->order = (uint32_t *)(b->work + n);
    b->dup = b->order + n;
    b->dup_cap = cap;
    return 0;
}

/* Looks every item up, in two passes so that the table's cache misses
 * overlap; a pinned or loading copy, or a key a source holds, may not
 * change size. */
static int put_lookup(const kvidx_index_t *idx, batch_t *b, size_t *conflict_index)
{
    const kvidx_put_t *items = b->items;
    work_t *work = b->work;
    const ns_t *last_ns = NULL;
    const kvidx_key_t *prev = NULL;
    for (size_t i = 0; i < b->n; i++) {
        const kvidx_key_t *k = &items[i].key;
        work[i].ns = UINT32_MAX;
        /* The namespace of the key before when the key names the same
         * model and salt memory (a parsed batch usually does): no compare. */
        if (!prev || k->model != prev->model || k->salt != prev->salt ||
            k->model_len != prev->model_len || k->salt_len != prev->salt_len) {
            if (!last_ns || ns_cmp(last_ns, k->salt, k->salt_len, k->model, k->model_len) != 0)
                last_ns = ns_find(idx, k);
            prev = k;
        }
        if (!last_ns || !idx->ht_cap)
            continue;
        tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
        work[i].ns = last_ns->id;
        work[i].h = tk_hash_cached(idx, &b->hc, last_ns->id, &t);
        PREFETCH(&idx->ht[ht_home(idx, work[i].h)]);
        PREFETCH(&idx->ht_tag[ht_home(idx, work[i].h)]);
    }
    for (size_t i = 0; i < b->n; i++) {
        const kvidx_key_t *k = &items[i].key;
        tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
        work[i].ref =
            work[i].ns == UINT32_MAX ? KVIDX_REF_NONE : ht_find_h(idx, work[i].ns, &t, work[i].h);
        work[i].effective = 0;
        if (work[i].ref == KVIDX_REF_NONE)
            continue;
        const uint8_t *r = rec_at(idx, work[i].ref);
        uint32_t m = rec_l1(r);
        if (((m && (idx->l1[m].pins || idx->l1[m].state == KVIDX_L1_LOADING)) || rec_src(r)) &&
            rec_size(r) != items[i].size_bytes) {
            if (conflict_index)
                *conflict_index = i;
            return KVIDX_ECONFLICT;
        }
    }
    return 0;
}

/* Whether items i and j name the same key: existing keys are equal when
 * their refs are; absent keys of a known namespace by their in-namespace
 * part; the others by the whole key. */
static int put_same(const batch_t *b, uint32_t i, uint32_t j)
{
    const work_t *x = &b->work[i], *y = &b->work[j];
    if (x->ref != KVIDX_REF_NONE || y->ref != KVIDX_REF_NONE)
        return x->ref == y->ref;
    if (x->ns != y->ns)
        return 0;
    const kvidx_key_t *p = &b->items[i].key, *q = &b->items[j].key;
    if (x->ns == UINT32_MAX)
        return kvidx_key_equal(p, q);
    return p->kv_rank == q->kv_rank && p->group == q->group && p->hash_len == q->hash_len &&
           hash_eq(p->hash, q->hash, p->hash_len);
}

/* Finds the effective items (the last occurrence of each key) with a hash
 * table over the batch, from the end: no sort. The slot of an existing key
 * comes from its ref, of an absent one from its table hash (keyed), or,
 * when its namespace does not exist yet, from the keyed hash of the whole
 * key, so a batch crafted to collide costs no more than any other.
 * order[0..neff) gets the effective items in batch order. */
static void put_dedup(const kvidx_index_t *idx, batch_t *b)
{
    uint32_t *slot = b->dup;
    size_t mask = b->dup_cap - 1;
    memset(slot, 0, b->dup_cap * sizeof(*slot));
    size_t neff = 0;
    for (size_t i = b->n; i-- > 0;) {
        work_t *w = &b->work[i];
        uint64_t h;
        if (w->ref != KVIDX_REF_NONE)
            h = (uint64_t)w->ref * UINT64_C(0x9e3779b97f4a7c15) >> 20;
        else if (w->ns != UINT32_MAX)
            h = w->h;
        else
            h = kvidx_index_key_hash64(idx, &b->items[i].key);
        size_t j = (size_t)h & mask;
        for (;; j = (j + 1) & mask) {
            if (!slot[j]) {
                slot[j] = (uint32_t)(i + 1);
                w->effective = 1;
                neff++;
                break;
            }
            if (put_same(b, slot[j] - 1, (uint32_t)i))
                break;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++)
        if (b->work[i].effective)
            b->order[k++] = (uint32_t)i;
    b->neff = neff;
}

/* Byte deltas per tier, new records per class, new L1 copies. */
static void put_count(const kvidx_index_t *idx, const batch_t *b, need_t *nd)
{
    memset(nd, 0, sizeof(*nd));
    for (size_t j = 0; j < b->neff; j++) {
        const kvidx_put_t *it = &b->items[b->order[j]];
        int64_t sz = (int64_t)it->size_bytes;
        kvidx_ref_t ref = b->work[b->order[j]].ref;
        if (ref == KVIDX_REF_NONE) {
            nd->new_keys++;
            nd->new_recs[hash_class(it->key.hash_len)]++;
            if (b->tier == KVIDX_TIER_L1) {
                nd->d1 += sz;
                nd->new_l1++;
            } else {
                nd->d2 += sz;
            }
            continue;
        }
        const uint8_t *r = rec_at(idx, ref);
        int64_t old = (int64_t)rec_size(r);
        uint32_t m = rec_l1(r);
        if (m && idx->l1[m].in_lru)
            nd->excluded += (uint64_t)old;
        if (b->tier == KVIDX_TIER_L1) {
            if (m) {
                nd->d1 += sz - old;
            } else {
                nd->d1 += sz;
                nd->new_l1++;
            }
            if (rec_l2(r))
                nd->d2 += sz - old;
        } else {
            nd->d2 += rec_l2(r) ? sz - old : sz;
            if (m)
                nd->d1 += sz - old;
        }
    }
}

/* Checks the capacities, then reserves what the apply phase needs, so
 * that only namespace creation and tree nodes can still fail there. */
static int put_reserve(kvidx_index_t *idx, const need_t *nd)
{
    if (idx->l2_capacity && nd->d2 > 0 && idx->c.l2_bytes + (uint64_t)nd->d2 > idx->l2_capacity)
        return KVIDX_ECAPACITY;
    if (nd->d1 > 0 && !ix_l1_room(idx, (uint64_t)nd->d1, nd->excluded))
        return KVIDX_ECAPACITY;
    int rc = ix_ht_reserve(idx, nd->new_keys);
    for (unsigned c = 0; !rc && c < NCLASS; c++)
        rc = ix_slab_reserve(&idx->slabs[c], nd->new_recs[c]);
    if (!rc)
        rc = ix_l1_reserve_slots(idx, nd->new_l1);
    return rc;
}

/* Each salt's quota (quota.c): what the batch adds to a salt's L1 must fit
 * after evicting that salt's own copies outside the batch. The salts seen
 * stay pending (and are evicted to their quota after the batch is in) until
 * ix_quota_end_pending. */
static int put_quota(kvidx_index_t *idx, const batch_t *b)
{
    if (!idx->acc.nquotas)
        return 0;
    ix_qcache_t c = {0, NULL, 0, 0};
    for (size_t j = 0; j < b->neff; j++) {
        const work_t *w = &b->work[b->order[j]];
        ix_quota_add(idx, &c, b->tier, &b->items[b->order[j]], w->ref, w->ns);
    }
    return ix_quota_check_pending(idx);
}

/* Stores item it into the existing key ref, logging the old state in u. */
static void put_apply_existing(kvidx_index_t *idx, kvidx_tier_t tier, const kvidx_put_t *it,
                               kvidx_ref_t ref, undo_t *u)
{
    uint8_t *r = rec_at(idx, ref);
    u->ref = ref;
    u->created = 0;
    u->old_size = rec_size(r);
    u->old_l2 = (uint8_t)rec_l2(r);
    u->l1_created = 0;
    u->untemped = 0;
    uint32_t m = rec_l1(r);
    if (m) {
        idx->c.l1_bytes = idx->c.l1_bytes - u->old_size + it->size_bytes;
        if (idx->l1[m].in_lru)
            idx->c.lru_bytes = idx->c.lru_bytes - u->old_size + it->size_bytes;
        acct_resize(idx, m, u->old_size, it->size_bytes);
    }
    if (u->old_l2)
        idx->c.l2_bytes = idx->c.l2_bytes - u->old_size + it->size_bytes;
    rec_set_size(r, it->size_bytes);
    if (tier == KVIDX_TIER_L2 && !u->old_l2) {
        rec_set_l2(r, 1);
        idx->c.l2_keys++;
        idx->c.l2_bytes += it->size_bytes;
    } else if (tier == KVIDX_TIER_L1 && !m) {
        l1_create(idx, ref, KVIDX_L1_READY, 0);
        u->l1_created = 1;
    } else if (tier == KVIDX_TIER_L1 && idx->l1[m].temporary) {
        /* A store into L1 makes the copy the caller's: it is no longer
         * dropped at its last unpin (and becomes durable). */
        idx->l1[m].temporary = 0;
        u->untemped = 1;
    }
}

/* Creates the key of item it in namespace *ns (found or created here when
 * it is not the key's); *ref gets the new record. Fails, changing nothing,
 * only when a namespace or tree nodes cannot be allocated. */
static int put_apply_new(kvidx_index_t *idx, batch_t *b, const kvidx_put_t *it, ns_t **ns,
                         kvidx_ref_t *ref)
{
    const kvidx_key_t *k = &it->key;
    if (!*ns || ns_cmp(*ns, k->salt, k->salt_len, k->model, k->model_len) != 0) {
        int rc = ix_ns_get(idx, k, ns);
        if (rc)
            return rc;
    }
    int rc = ix_key_insert(idx, &b->hc, *ns, k, it->size_bytes, ref);
    if (rc)
        return rc;
    uint8_t *r = rec_at(idx, *ref);
    if (b->tier == KVIDX_TIER_L2) {
        rec_set_l2(r, 1);
        idx->c.l2_keys++;
        idx->c.l2_bytes += it->size_bytes;
    } else {
        l1_create(idx, *ref, KVIDX_L1_READY, 0);
    }
    return 0;
}

/* Undoes the first nu changes of undo, newest first, and restores the
 * counters saved before them. */
static void put_rollback(kvidx_index_t *idx, undo_t *u, size_t nu, const counters_t *saved)
{
    while (nu--) {
        undo_t *e = &u[nu];
        if (e->created) {
            if (rec_l1(rec_at(idx, e->ref)))
                ix_l1_drop(idx, e->ref);
            rec_set_l2(rec_at(idx, e->ref), 0);
            ix_forget(idx, e->ref);
            continue;
        }
        if (e->l1_created)
            ix_l1_drop(idx, e->ref);
        uint8_t *r = rec_at(idx, e->ref);
        uint32_t m = rec_l1(r);
        if (e->untemped && m)
            idx->l1[m].temporary = 1;
        if (m && idx->l1[m].in_lru)
            idx->c.lru_bytes = idx->c.lru_bytes - rec_size(r) + e->old_size;
        if (m) /* the salt accounts are not in the saved counters */
            acct_resize(idx, m, rec_size(r), e->old_size);
        rec_set_size(r, e->old_size);
        rec_set_l2(r, e->old_l2);
    }
    idx->c = *saved;
}

/* Applies the effective items in batch order; on failure undoes them all. */
static int put_apply(kvidx_index_t *idx, batch_t *b)
{
    counters_t saved = idx->c;
    /* Generations handed to copies the rollback drops were never seen:
     * they are handed out again, as if the batch had not been tried. */
    uint64_t gen_next = idx->gen_next;
    ns_t *ns = NULL;
    b->nu = 0;
    for (size_t j = 0; j < b->neff; j++) {
        const kvidx_put_t *it = &b->items[b->order[j]];
        kvidx_ref_t ref = b->work[b->order[j]].ref;
        undo_t *u = &b->undo[b->nu];
        if (ref != KVIDX_REF_NONE) {
            put_apply_existing(idx, b->tier, it, ref, u);
            b->nu++;
            continue;
        }
        int rc = put_apply_new(idx, b, it, &ns, &ref);
        if (rc) {
            put_rollback(idx, b->undo, b->nu, &saved);
            idx->gen_next = gen_next;
            return rc;
        }
        b->work[b->order[j]].ref = ref;
        u->ref = ref;
        u->created = 1;
        u->untemped = 0;
        b->nu++;
    }
    return 0;
}

/* Recency: the batch's last key is the least recent. */
static void put_recency(kvidx_index_t *idx, const batch_t *b)
{
    for (size_t i = b->n; i-- > 0;) {
        if (!b->work[i].effective)
            continue;
        const uint8_t *r = rec_at(idx, b->work[i].ref);
        uint32_t m = rec_l1(r);
        if (idx->l1[m].state != KVIDX_L1_READY || idx->l1[m].pins)
            continue;
        uint64_t size = rec_size(r);
        lru_unlink(idx, m, size);
        lru_push(idx, m, size);
    }
}

/* Reports each effective item's durable change. undo[j] holds item
 * order[j]'s state before the batch; a re-put never changes an existing L1
 * copy's state, and its temporary flag only from set to clear (untemped). */
static void put_notify(kvidx_index_t *idx, const batch_t *b)
{
    for (size_t j = 0; j < b->neff; j++) {
        const undo_t *u = &b->undo[j];
        kvidx_durable_t before = {0, 0};
        if (!u->created) {
            before = durable_of(idx, u->ref);
            before.tiers &= u->l1_created || u->untemped ? 0u : KVIDX_DURABLE_L1;
            before.tiers |= u->old_l2 ? KVIDX_DURABLE_L2 : 0u;
            before.size_bytes = before.tiers ? u->old_size : 0;
        }
        ix_notify(idx, u->ref, &before);
    }
}

int kvidx_index_put_batch(kvidx_index_t *idx, kvidx_tier_t tier, const kvidx_put_t *items, size_t n,
                          size_t *conflict_index)
{
    size_t stored;
    return kvidx_index_put_batch_count(idx, tier, items, n, conflict_index, &stored);
}

int kvidx_index_put_batch_count(kvidx_index_t *idx, kvidx_tier_t tier, const kvidx_put_t *items,
                                size_t n, size_t *conflict_index, size_t *stored)
{
    *stored = 0;
    if (tier != KVIDX_TIER_L1 && tier != KVIDX_TIER_L2)
        return KVIDX_EINVAL;
    if (n == 0)
        return 0;
    if (!items || n > (size_t)1 << 24)
        return KVIDX_EINVAL;
    int rc = put_validate(items, n, conflict_index);
    if (rc)
        return rc;
    batch_t b;
    b.tier = tier;
    b.items = items;
    b.n = n;
    b.hc.a_valid = 0;
    b.hc.b_valid = 0;
    rc = put_scratch(idx, &b);
    if (!rc)
        rc = put_lookup(idx, &b, conflict_index);
    if (rc)
        return rc;
    put_dedup(idx, &b);
    need_t nd;
    put_count(idx, &b, &nd);
    rc = put_reserve(idx, &nd);
    if (!rc)
        rc = put_quota(idx, &b);
    if (!rc)
        rc = put_apply(idx, &b);
    if (rc) {
        ix_quota_end_pending(idx, 0);
        return rc;
    }
    if (tier == KVIDX_TIER_L1)
        put_recency(idx, &b);
    if (idx->on_change)
        put_notify(idx, &b);
    ix_quota_end_pending(idx, 1);
    ix_evict_to_fit(idx);
    *stored = b.neff;
    return 0;
}
