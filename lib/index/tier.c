/*
 * Tier state: L1 copies, the LRU, eviction, deletes and the pin, reserve
 * and load primitives that prefetch handles are built from.
 *
 * L1 copies live in a table of metadata (state, pins, temporary,
 * generation, LRU links) allocated only for keys that have one; a record's
 * L1 index names its slot and the slot's ref names the record back. Slot 0
 * is the head of the LRU list, a doubly linked ring through prev/next;
 * free slots are state KVIDX_L1_NONE, l1_nfree of them threaded through
 * next from l1_free. A copy is in the LRU exactly when it is ready and
 * unpinned, and lru_bytes is the sum of their sizes; l1_pinned and l1_pins
 * count the copies with pins and their pins. A key keeps an L1 copy, an
 * L2 copy of its own or one held by a source (source.c), or it is
 * forgotten at once (ix_forget: out of its tree, the table and its
 * namespace, record freed). Eviction takes the least recent copy
 * first and, like deletion, never allocates; every change of a key's
 * durable state is reported through on_change (ix_notify).
 */
#include "index_int.h"

/* Makes sure k more L1 copies can be created without allocating. */
int ix_l1_reserve_slots(kvidx_index_t *idx, uint64_t k)
{
    uint64_t room = (uint64_t)idx->l1_cap - idx->l1_used + idx->l1_nfree;
    if (room >= k)
        return 0;
    uint64_t want = (uint64_t)idx->l1_used + (k - idx->l1_nfree);
    if (want >= UINT32_MAX / 2)
        return KVIDX_ECAPACITY;
    uint64_t cap = idx->l1_cap ? idx->l1_cap : 64;
    while (cap < want)
        cap *= 2;
    l1m_t *a = kvidx_realloc(idx->l1, (size_t)cap * sizeof(*a));
    if (!a)
        return KVIDX_ENOMEM;
    idx->l1 = a;
    idx->l1_cap = (uint32_t)cap;
    return 0;
}

static void l1_release(kvidx_index_t *idx, uint32_t m)
{
    idx->l1[m].state = KVIDX_L1_NONE;
    idx->l1[m].next = idx->l1_free;
    idx->l1_free = m;
    idx->l1_nfree++;
}

/* Removes the L1 copy of ref (any state). */
void ix_l1_drop(kvidx_index_t *idx, kvidx_ref_t ref)
{
    uint8_t *r = rec_at(idx, ref);
    uint32_t m = rec_l1(r);
    uint64_t size = rec_size(r);
    l1m_t *e = &idx->l1[m];
    lru_unlink(idx, m, size);
    idx->c.l1_keys--;
    idx->c.l1_bytes -= size;
    idx->acc.v[e->acct].l1_keys--;
    idx->acc.v[e->acct].l1_bytes -= size;
    if (e->state == KVIDX_L1_LOADING)
        idx->c.l1_loading--;
    if (e->pins) {
        idx->c.l1_pinned--;
        idx->c.l1_pins -= e->pins;
    }
    l1_release(idx, m);
    rec_set_l1(r, 0);
}

/* Removes a key that has no copy left. */
void ix_forget(kvidx_index_t *idx, kvidx_ref_t ref)
{
    uint8_t *r = rec_at(idx, ref);
    ns_t *ns = idx->ns_ids[rec_ns(r)].ns;
    tkey_t t = rec_tkey(r);
    ix_tree_remove(idx, ns, &t, ref);
    ix_ht_remove(idx, ref);
    rec_release(idx, ref);
    idx->c.keys--;
    ns->nkeys--;
    ix_ns_drop_if_empty(idx, ns);
}

static void forget_if_empty(kvidx_index_t *idx, kvidx_ref_t ref)
{
    const uint8_t *r = rec_at(idx, ref);
    if (!rec_l1(r) && !rec_l2_any(r))
        ix_forget(idx, ref);
}

/* Reports a live ref's change from *before to its current state. */
void ix_notify(kvidx_index_t *idx, kvidx_ref_t ref, const kvidx_durable_t *before)
{
    if (!idx->on_change)
        return;
    kvidx_durable_t after = durable_of(idx, ref);
    kvidx_key_t k;
    make_key(idx, rec_at(idx, ref), &k);
    idx->on_change(idx->on_change_ctx, &k, before, &after);
}

/* Evicts the L1 copy m, which must be in the LRU. */
void ix_evict_copy(kvidx_index_t *idx, uint32_t m)
{
    kvidx_ref_t ref = idx->l1[m].ref;
    const uint8_t *r = rec_at(idx, ref);
    uint64_t size = rec_size(r);
    int forgotten = !rec_l2_any(r);
    kvidx_durable_t before = durable_of(idx, ref);
    if (idx->on_evict) {
        kvidx_key_t k;
        make_key(idx, r, &k);
        idx->on_evict(idx->on_evict_ctx, &k, size, forgotten);
    }
    ix_l1_drop(idx, ref);
    idx->c.evictions++;
    ix_notify(idx, ref, &before);
    if (forgotten)
        ix_forget(idx, ref);
}

void ix_evict_to_fit(kvidx_index_t *idx)
{
    while (idx->l1_capacity && idx->c.l1_bytes > idx->l1_capacity && idx->l1[0].prev != 0)
        ix_evict_copy(idx, idx->l1[0].prev);
}

/* Whether `extra` more L1 bytes fit after evicting, ignoring `excluded`
 * evictable bytes (copies that must stay). */
int ix_l1_room(const kvidx_index_t *idx, uint64_t extra, uint64_t excluded)
{
    if (!idx->l1_capacity || extra == 0)
        return 1;
    uint64_t after = idx->c.l1_bytes + extra;
    if (after <= idx->l1_capacity)
        return 1;
    return after - idx->l1_capacity <= idx->c.lru_bytes - excluded;
}

/* ---- delete ---- */

int kvidx_index_delete(kvidx_index_t *idx, const kvidx_key_t *key, kvidx_tier_t tier, int force,
                       kvidx_del_outcome_t *outcome)
{
    if (tier != KVIDX_TIER_L1 && tier != KVIDX_TIER_L2 && tier != KVIDX_TIER_ALL)
        return KVIDX_EINVAL;
    *outcome = KVIDX_DEL_NOT_FOUND;
    kvidx_ref_t ref = lookup(idx, key);
    if (ref == KVIDX_REF_NONE)
        return 0;
    uint8_t *r = rec_at(idx, ref);
    int deleted = 0, skipped = 0;
    kvidx_durable_t before = durable_of(idx, ref);
    if (tier & KVIDX_TIER_L1) {
        uint32_t m = rec_l1(r);
        if (m) {
            if (!force && (idx->l1[m].pins || idx->l1[m].state == KVIDX_L1_LOADING)) {
                skipped = 1;
            } else {
                ix_l1_drop(idx, ref);
                deleted = 1;
            }
        }
    }
    if ((tier & KVIDX_TIER_L2) && rec_l2(r)) {
        idx->c.l2_keys--;
        idx->c.l2_bytes -= rec_size(r);
        rec_set_l2(r, 0);
        deleted = 1;
    }
    if (skipped)
        *outcome = KVIDX_DEL_SKIPPED_PINNED;
    else if (deleted)
        *outcome = KVIDX_DEL_DELETED;
    else if ((tier & KVIDX_TIER_L2) && rec_src(r))
        *outcome = KVIDX_DEL_SKIPPED_SOURCE; /* a source's copy is not the API's to delete */
    if (deleted)
        ix_notify(idx, ref, &before);
    forget_if_empty(idx, ref);
    return 0;
}

/* ---- prefetch primitives ---- */

/* The L1 copy of ref when it matches generation (0 = any), else 0. */
static uint32_t copy_of(const kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation)
{
    if (!ref_live(idx, ref))
        return 0;
    uint32_t m = rec_l1(rec_at(idx, ref));
    if (!m || (generation && idx->l1[m].gen != generation))
        return 0;
    return m;
}

int kvidx_index_pin(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation, uint32_t n)
{
    uint32_t m = copy_of(idx, ref, generation);
    if (!m)
        return KVIDX_ENOTFOUND;
    l1m_t *e = &idx->l1[m];
    if (n == 0 || e->pins > UINT32_MAX - n)
        return KVIDX_EINVAL;
    if (!e->pins) {
        lru_unlink(idx, m, rec_size(rec_at(idx, ref)));
        idx->c.l1_pinned++;
    }
    e->pins += n;
    idx->c.l1_pins += n;
    return 0;
}

int kvidx_index_unpin(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation, uint32_t n)
{
    uint32_t m = copy_of(idx, ref, generation);
    if (!m)
        return KVIDX_ENOTFOUND;
    l1m_t *e = &idx->l1[m];
    if (n == 0 || n > e->pins)
        return KVIDX_EINVAL;
    e->pins -= n;
    idx->c.l1_pins -= n;
    if (e->pins)
        return 0;
    idx->c.l1_pinned--;
    if (e->temporary) {
        ix_l1_drop(idx, ref);
        forget_if_empty(idx, ref);
    } else if (e->state == KVIDX_L1_READY) {
        lru_push(idx, m, rec_size(rec_at(idx, ref)));
    }
    return 0;
}

int kvidx_index_l1_reserve(kvidx_index_t *idx, kvidx_ref_t ref, int temporary, uint64_t *generation)
{
    if (!ref_live(idx, ref))
        return KVIDX_ENOTFOUND;
    const uint8_t *r = rec_at(idx, ref);
    if (rec_l1(r))
        return KVIDX_ECONFLICT;
    if (!ix_l1_room(idx, rec_size(r), 0))
        return KVIDX_ECAPACITY;
    uint32_t acct = acct_of_ref(idx, ref);
    if (!ix_quota_room(idx, acct, rec_size(r), 0))
        return KVIDX_EQUOTA;
    int rc = ix_l1_reserve_slots(idx, 1);
    if (rc)
        return rc;
    uint32_t m = l1_create(idx, ref, KVIDX_L1_LOADING, temporary);
    if (generation)
        *generation = idx->l1[m].gen;
    /* The new copy is not in the LRU, so eviction cannot take it; its
     * salt's quota is met first, from that salt's own copies. */
    ix_quota_evict(idx, acct);
    ix_evict_to_fit(idx);
    return 0;
}

int kvidx_index_l1_load_done(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t generation, int ok)
{
    uint32_t m = copy_of(idx, ref, generation);
    if (!m)
        return KVIDX_ENOTFOUND;
    l1m_t *e = &idx->l1[m];
    if (e->state != KVIDX_L1_LOADING)
        return KVIDX_EINVAL;
    if (!ok) {
        ix_l1_drop(idx, ref);
        forget_if_empty(idx, ref);
        return 0;
    }
    e->state = KVIDX_L1_READY;
    idx->c.l1_loading--;
    if (!e->pins)
        lru_push(idx, m, rec_size(rec_at(idx, ref)));
    if (!e->temporary) {
        kvidx_durable_t before = durable_of(idx, ref);
        before.tiers &= ~KVIDX_DURABLE_L1;
        before.size_bytes = before.tiers ? before.size_bytes : 0;
        ix_notify(idx, ref, &before);
    }
    return 0;
}

int kvidx_index_touch(kvidx_index_t *idx, kvidx_ref_t ref)
{
    uint32_t m = copy_of(idx, ref, 0);
    if (!m)
        return KVIDX_ENOTFOUND;
    if (idx->l1[m].in_lru) {
        uint64_t size = rec_size(rec_at(idx, ref));
        lru_unlink(idx, m, size);
        lru_push(idx, m, size);
    }
    return 0;
}

int kvidx_index_set_temporary(kvidx_index_t *idx, kvidx_ref_t ref, int temporary)
{
    uint32_t m = copy_of(idx, ref, 0);
    if (!m)
        return KVIDX_ENOTFOUND;
    uint8_t t = (uint8_t)(temporary != 0);
    if (idx->l1[m].temporary == t)
        return 0;
    kvidx_durable_t before = durable_of(idx, ref);
    idx->l1[m].temporary = t;
    if (idx->l1[m].state == KVIDX_L1_READY)
        ix_notify(idx, ref, &before);
    return 0;
}
