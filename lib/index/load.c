/*
 * The bulk loader of a restore (kvidx_index_load).
 *
 * It inserts keys known to be new, with their tiers, faster than a store:
 * no sort when the input is in key order (each key is then past its
 * tree's last key and appended without a descent), no undo log, and the
 * table inserts deferred and made in slot order in runs of LOAD_PEND. It
 * is not all or nothing: on a failure the items before the failing one
 * stay in. Everything the load can need is reserved before the first
 * insert except tree nodes and namespaces, and the pending table inserts
 * are always flushed before returning, so that every live record is in
 * the table again whatever the outcome; a namespace created for the
 * failing item is dropped. L1 copies enter the LRU in input order (most
 * recent last) and L1 is evicted to fit at the end.
 */
#include "index_int.h"

#define LOAD_PEND 65536 /* table inserts deferred at once by a bulk load */

/* What a load needs reserved: records per class, L1 copies, L2 bytes. */
typedef struct load_need {
    uint64_t per_class[NCLASS];
    uint64_t nl1, l2_bytes;
} load_need_t;

/* Deferred table inserts: pend[i] = the low word of the hash << 32 | ref
 * (the word that gives the home slot), tag[i] its tag; tmp and ttag are
 * the sort's room. */
typedef struct pending {
    uint64_t *pend, *tmp;
    uint8_t *tag, *ttag;
    size_t n;
} pending_t;

static int load_validate(const kvidx_load_t *items, size_t n, size_t *bad_index, load_need_t *need)
{
    memset(need, 0, sizeof(*need));
    for (size_t i = 0; i < n; i++) {
        const kvidx_load_t *it = &items[i];
        if (!key_shape_ok(&it->key) || it->key.model_len == 0 || it->size_bytes == 0 ||
            it->size_bytes > KVIDX_SIZE_MAX || it->tiers == 0 ||
            it->tiers > (KVIDX_DURABLE_L1 | KVIDX_DURABLE_L2)) {
            if (bad_index)
                *bad_index = i;
            return KVIDX_EINVAL;
        }
        need->per_class[hash_class(it->key.hash_len)]++;
        need->nl1 += (it->tiers & KVIDX_DURABLE_L1) != 0;
        if (it->tiers & KVIDX_DURABLE_L2)
            need->l2_bytes += it->size_bytes;
    }
    return 0;
}

/* Checks L2's capacity and reserves table slots, records and L1 slots;
 * then the scratch buffer of the deferred table inserts. */
static int load_reserve(kvidx_index_t *idx, size_t n, const load_need_t *need, pending_t *p)
{
    if (idx->l2_capacity && idx->c.l2_bytes + need->l2_bytes > idx->l2_capacity)
        return KVIDX_ECAPACITY;
    int rc = ix_ht_reserve(idx, n);
    for (unsigned c = 0; !rc && c < NCLASS; c++)
        rc = ix_slab_reserve(&idx->slabs[c], need->per_class[c]);
    if (!rc)
        rc = ix_l1_reserve_slots(idx, need->nl1);
    if (rc)
        return rc;
    /* Table inserts are deferred and made in slot order
     * (ix_ht_insert_sorted): a random probe per key into a table of
     * hundreds of MB is the largest cost of a restore otherwise. */
    void *mem;
    rc = ix_scratch_get(idx, 2 * LOAD_PEND * (sizeof(uint64_t) + 1), &mem);
    if (rc)
        return rc;
    p->pend = mem;
    p->tmp = p->pend + LOAD_PEND;
    p->tag = (uint8_t *)(p->tmp + LOAD_PEND);
    p->ttag = p->tag + LOAD_PEND;
    p->n = 0;
    return 0;
}

static void pending_flush(kvidx_index_t *idx, pending_t *p)
{
    ix_ht_insert_sorted(idx, p->pend, p->tag, p->n, p->tmp, p->ttag);
    p->n = 0;
}

/* Puts ref (hash h) in the table with the next flush. */
static void load_table_insert(kvidx_index_t *idx, pending_t *p, kvidx_ref_t ref, uint64_t h)
{
    if (p->n == LOAD_PEND)
        pending_flush(idx, p);
    p->tag[p->n] = h_tag(h);
    p->pend[p->n++] = (h & UINT32_MAX) << 32 | ref;
}

/* Makes *ns the namespace of items[i], creating it when needed. */
static int load_ns(kvidx_index_t *idx, const kvidx_load_t *items, size_t i, ns_t **ns)
{
    const kvidx_key_t *k = &items[i].key;
    /* Keys decoded from one namespace record share its name pointers:
     * compare the names only when the pointers change. */
    int same = *ns && i > 0 && k->model == items[i - 1].key.model &&
               k->salt == items[i - 1].key.salt && k->model_len == items[i - 1].key.model_len &&
               k->salt_len == items[i - 1].key.salt_len;
    if (!same && (!*ns || ns_cmp(*ns, k->salt, k->salt_len, k->model, k->model_len) != 0))
        return ix_ns_get(idx, k, ns);
    return 0;
}

/* Inserts item it into its namespace ns. KVIDX_ECONFLICT when the key is
 * there already; KVIDX_ENOMEM or KVIDX_ECAPACITY from the tree. */
static int load_item(kvidx_index_t *idx, const kvidx_load_t *it, ns_t *ns, hcache_t *hc,
                     pending_t *p)
{
    const kvidx_key_t *k = &it->key;
    /* Presence is checked in the tree, not the hash table: input in key
     * order (a snapshot) is past the tree's last key, one comparison,
     * while a table probe would read a random record for every occupied
     * slot it passes. */
    tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
    int append = ix_tree_after_last(idx, ns, &t);
    if (!append) {
        cursor_t cur;
        ix_tree_seek(idx, ns, &t, 0, &cur);
        if (cur.leaf && cur.pos < cur.leaf->n &&
            tk_cmp_rec(&t, rec_at(idx, cur.leaf->refs[cur.pos])) == 0)
            return KVIDX_ECONFLICT;
    }
    int rc = tree_prepare(idx, ns);
    if (rc)
        return rc;
    kvidx_ref_t ref = rec_new(idx, ns, k, it->size_bytes);
    uint8_t *r = rec_at(idx, ref);
    if (append) {
        ix_tree_append(idx, ns, ref);
    } else {
        tkey_t rt = rec_tkey(r);
        ix_tree_insert(idx, ns, &rt, ref);
    }
    load_table_insert(idx, p, ref, tk_hash_cached(idx, hc, ns->id, &t));
    ns->nkeys++;
    idx->c.keys++;
    if (it->tiers & KVIDX_DURABLE_L2) {
        rec_set_l2(r, 1);
        idx->c.l2_keys++;
        idx->c.l2_bytes += it->size_bytes;
    }
    if (it->tiers & KVIDX_DURABLE_L1)
        lru_push(idx, l1_create(idx, ref, KVIDX_L1_READY, 0), it->size_bytes);
    return 0;
}

int kvidx_index_load(kvidx_index_t *idx, const kvidx_load_t *items, size_t n, size_t *bad_index)
{
    if (n == 0)
        return 0;
    if (!items || n > (size_t)1 << 24)
        return KVIDX_EINVAL;
    load_need_t need;
    pending_t p;
    int rc = load_validate(items, n, bad_index, &need);
    if (!rc)
        rc = load_reserve(idx, n, &need, &p);
    if (rc)
        return rc;
    hcache_t hc;
    hc.a_valid = 0;
    hc.b_valid = 0;
    ns_t *ns = NULL;
    for (size_t i = 0; i < n; i++) {
        rc = load_ns(idx, items, i, &ns);
        if (!rc)
            rc = load_item(idx, &items[i], ns, &hc, &p);
        if (rc) {
            if (rc == KVIDX_ECONFLICT && bad_index)
                *bad_index = i;
            break;
        }
    }
    pending_flush(idx, &p);
    if (rc && ns)
        ix_ns_drop_if_empty(idx, ns);
    ix_quota_evict_all(idx);
    ix_evict_to_fit(idx);
    return rc;
}
