/*
 * L2 copies held by sources (kvidx/index_source.h): each source's
 * membership, a refset of the keys it holds with a mark per member for
 * resynchronisations, and the source bit of the records (SRC_BIT, the top
 * bit of a record's L1 index, see index_int.h).
 *
 * Invariants, verified by ix_check_sources: a record has SRC_BIT exactly
 * when at least one source's membership holds it; every member is a live
 * record; a source's byte count is the sum of its members' sizes, and the
 * index's src_keys/src_bytes counters the count and sum over records with
 * SRC_BIT. A record with SRC_BIT is never forgotten (tier.c checks
 * rec_l2_any), so a member's ref stays valid while it is a member. Puts
 * are all or nothing: everything they change is logged and undone on
 * KVIDX_ENOMEM; removals never allocate. Nothing here is reported to the
 * change callback except a resize of a key with a durable copy, because a
 * source's copy is not durable.
 */
#include "index_int.h"

#include "kvidx/index_source.h"
#include "kvidx/refset.h"

typedef struct ix_source {
    kvidx_refset_t set;
    uint64_t bytes;
    int resyncing;
} ix_source_t;

struct ix_sources {
    ix_source_t s[KVIDX_INDEX_SOURCES_MAX];
    unsigned n;
};

/* What one put item changed, to undo it. */
typedef struct sundo {
    kvidx_ref_t ref;
    uint64_t old_size;
    uint8_t created, old_src, was_member, was_marked;
    uint8_t notify;     /* a durable copy changed size: report it */
    unsigned old_tiers; /* its durable tiers, for the report */
} sundo_t;

static ix_source_t *source_at(const kvidx_index_t *idx, unsigned id)
{
    if (!idx->src || id >= idx->src->n)
        return NULL;
    return &idx->src->s[id];
}

void ix_sources_free(kvidx_index_t *idx)
{
    if (!idx->src)
        return;
    for (unsigned i = 0; i < idx->src->n; i++)
        kvidx_refset_free(&idx->src->s[i].set);
    kvidx_free(idx->src);
    idx->src = NULL;
}

int kvidx_index_source_add(kvidx_index_t *idx, unsigned *id)
{
    if (!idx->src) {
        idx->src = kvidx_calloc(1, sizeof(*idx->src));
        if (!idx->src)
            return KVIDX_ENOMEM;
    }
    if (idx->src->n == KVIDX_INDEX_SOURCES_MAX)
        return KVIDX_ECAPACITY;
    ix_source_t *s = &idx->src->s[idx->src->n];
    memset(s, 0, sizeof(*s));
    kvidx_refset_init(&s->set);
    *id = idx->src->n++;
    return 0;
}

/* 1 when a source other than skip holds ref. */
static int held_by_other(const kvidx_index_t *idx, const ix_source_t *skip, kvidx_ref_t ref)
{
    for (unsigned i = 0; i < idx->src->n; i++)
        if (&idx->src->s[i] != skip && kvidx_refset_has(&idx->src->s[i].set, ref))
            return 1;
    return 0;
}

/* Gives key ref a new size, keeping every counter it is part of. */
static void resize(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t size)
{
    uint8_t *r = rec_at(idx, ref);
    uint64_t old = rec_size(r);
    if (old == size)
        return;
    uint32_t m = rec_l1(r);
    if (m) {
        idx->c.l1_bytes = idx->c.l1_bytes - old + size;
        if (idx->l1[m].in_lru)
            idx->c.lru_bytes = idx->c.lru_bytes - old + size;
        acct_resize(idx, m, old, size);
    }
    if (rec_l2(r))
        idx->c.l2_bytes = idx->c.l2_bytes - old + size;
    if (rec_src(r)) {
        idx->c.src_bytes = idx->c.src_bytes - old + size;
        for (unsigned i = 0; i < idx->src->n; i++)
            if (kvidx_refset_has(&idx->src->s[i].set, ref))
                idx->src->s[i].bytes = idx->src->s[i].bytes - old + size;
    }
    rec_set_size(r, size);
}

/* Removes member ref from source s (already taken out of s->set by the
 * caller): clears the source bit when no other source holds it, and
 * forgets a key left with no copy. */
static void drop_member(kvidx_index_t *idx, ix_source_t *s, kvidx_ref_t ref)
{
    uint8_t *r = rec_at(idx, ref);
    uint64_t size = rec_size(r);
    s->bytes -= size;
    if (held_by_other(idx, s, ref))
        return;
    rec_set_src(r, 0);
    idx->c.src_keys--;
    idx->c.src_bytes -= size;
    if (!rec_l1(r) && !rec_l2(r))
        ix_forget(idx, ref);
}

/* Creates key k with size in the namespace *ns (found or made here) as a
 * record with no copy yet; h is filled with its table hash. Fails, having
 * changed nothing, only on KVIDX_ENOMEM or KVIDX_ECAPACITY. */
static int create_key(kvidx_index_t *idx, hcache_t *hc, const kvidx_key_t *k, uint64_t size,
                      ns_t **ns, kvidx_ref_t *ref)
{
    int rc = ix_ht_reserve(idx, 1);
    if (!rc)
        rc = ix_slab_reserve(&idx->slabs[hash_class(k->hash_len)], 1);
    if (!rc && (!*ns || ns_cmp(*ns, k->salt, k->salt_len, k->model, k->model_len) != 0))
        rc = ix_ns_get(idx, k, ns);
    if (rc)
        return rc;
    rc = ix_key_insert(idx, hc, *ns, k, size, ref);
    if (rc)
        *ns = NULL;
    return rc;
}

/* Undoes the first nu changes of a put, newest first, and puts the
 * counters back. */
static void put_undo(kvidx_index_t *idx, ix_source_t *s, const sundo_t *u, size_t nu,
                     const counters_t *saved, const uint64_t *saved_bytes)
{
    while (nu--) {
        const sundo_t *e = &u[nu];
        uint8_t *r = rec_at(idx, e->ref);
        if (!e->was_member)
            kvidx_refset_remove(&s->set, e->ref);
        else if (!e->was_marked)
            kvidx_refset_unmark(&s->set, e->ref);
        rec_set_src(r, e->old_src);
        if (e->created) {
            ix_forget(idx, e->ref);
            continue;
        }
        if (rec_l1(r)) /* the salt accounts are not in the saved counters */
            acct_resize(idx, rec_l1(r), rec_size(r), e->old_size);
        rec_set_size(r, e->old_size);
    }
    idx->c = *saved;
    for (unsigned i = 0; i < idx->src->n; i++)
        idx->src->s[i].bytes = saved_bytes[i];
}

static int put_validate(const kvidx_key_t *keys, const uint64_t *sizes, size_t n, size_t *bad_index)
{
    for (size_t i = 0; i < n; i++) {
        if (!key_shape_ok(&keys[i]) || keys[i].model_len == 0 || sizes[i] == 0 ||
            sizes[i] > KVIDX_SIZE_MAX) {
            if (bad_index)
                *bad_index = i;
            return KVIDX_EINVAL;
        }
    }
    return 0;
}

int kvidx_index_source_put(kvidx_index_t *idx, unsigned id, const kvidx_key_t *keys,
                           const uint64_t *sizes, size_t n, size_t *bad_index)
{
    ix_source_t *s = source_at(idx, id);
    if (!s || (n && (!keys || !sizes)) || n > ((size_t)1 << 24))
        return KVIDX_EINVAL;
    int rc = put_validate(keys, sizes, n, bad_index);
    if (rc || n == 0)
        return rc;
    void *mem;
    if ((rc = kvidx_refset_reserve(&s->set, n)) != 0 ||
        (rc = ix_scratch_get(idx, n * sizeof(sundo_t), &mem)) != 0)
        return rc;
    sundo_t *undo = mem;
    counters_t saved = idx->c;
    uint64_t saved_bytes[KVIDX_INDEX_SOURCES_MAX];
    for (unsigned i = 0; i < idx->src->n; i++)
        saved_bytes[i] = idx->src->s[i].bytes;
    hcache_t hc;
    hc.a_valid = 0;
    hc.b_valid = 0;
    ns_t *ns = NULL;
    int any_notify = 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_key_t *k = &keys[i];
        if (!ns || ns_cmp(ns, k->salt, k->salt_len, k->model, k->model_len) != 0)
            ns = ns_find(idx, k);
        kvidx_ref_t ref = KVIDX_REF_NONE;
        if (ns && idx->ht_cap) {
            tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
            ref = ht_find_h(idx, ns->id, &t, tk_hash_cached(idx, &hc, ns->id, &t));
        }
        sundo_t *u = &undo[i];
        memset(u, 0, sizeof(*u));
        if (ref == KVIDX_REF_NONE) {
            rc = create_key(idx, &hc, k, sizes[i], &ns, &ref);
            if (rc) {
                put_undo(idx, s, undo, i, &saved, saved_bytes);
                return rc;
            }
            u->created = 1;
        } else {
            const uint8_t *r = rec_at(idx, ref);
            kvidx_durable_t d = durable_of(idx, ref);
            u->old_size = rec_size(r);
            u->old_src = (uint8_t)rec_src(r);
            u->was_member = (uint8_t)kvidx_refset_has(&s->set, ref);
            u->was_marked = (uint8_t)kvidx_refset_marked(&s->set, ref);
            if (d.tiers && u->old_size != sizes[i]) {
                u->notify = 1;
                u->old_tiers = d.tiers;
                any_notify = 1;
            }
        }
        u->ref = ref;
        /* Membership first, so that resize counts this source's bytes
         * only for a key it already held. */
        resize(idx, ref, sizes[i]);
        uint8_t *r = rec_at(idx, ref);
        if (!rec_src(r)) {
            rec_set_src(r, 1);
            idx->c.src_keys++;
            idx->c.src_bytes += sizes[i];
        }
        if (kvidx_refset_add(&s->set, ref, 1) == 1)
            s->bytes += sizes[i];
    }
    if (any_notify && idx->on_change) {
        for (size_t i = 0; i < n; i++) {
            if (!undo[i].notify)
                continue;
            kvidx_durable_t before = {undo[i].old_size, undo[i].old_tiers};
            ix_notify(idx, undo[i].ref, &before);
        }
    }
    ix_evict_to_fit(idx);
    return 0;
}

int kvidx_index_source_del(kvidx_index_t *idx, unsigned id, const kvidx_key_t *keys, size_t n,
                           size_t *removed)
{
    ix_source_t *s = source_at(idx, id);
    if (removed)
        *removed = 0;
    if (!s || (n && !keys))
        return KVIDX_EINVAL;
    for (size_t i = 0; i < n; i++) {
        kvidx_ref_t ref = lookup(idx, &keys[i]);
        if (ref == KVIDX_REF_NONE || !kvidx_refset_remove(&s->set, ref))
            continue;
        drop_member(idx, s, ref);
        if (removed)
            (*removed)++;
    }
    return 0;
}

int kvidx_index_source_resync_begin(kvidx_index_t *idx, unsigned id)
{
    ix_source_t *s = source_at(idx, id);
    if (!s)
        return KVIDX_EINVAL;
    kvidx_refset_unmark_all(&s->set);
    s->resyncing = 1;
    return 0;
}

int kvidx_index_source_resync_end(kvidx_index_t *idx, unsigned id, uint64_t *removed)
{
    ix_source_t *s = source_at(idx, id);
    if (removed)
        *removed = 0;
    if (!s || !s->resyncing)
        return KVIDX_EINVAL;
    size_t pos = 0;
    kvidx_ref_t ref;
    int mark;
    uint64_t n = 0;
    if (s->set.marked < s->set.count) {
        while (kvidx_refset_next(&s->set, &pos, &ref, &mark)) {
            if (mark)
                continue;
            kvidx_refset_remove(&s->set, ref);
            drop_member(idx, s, ref);
            n++;
        }
    }
    s->resyncing = 0;
    if (removed)
        *removed = n;
    return 0;
}

int kvidx_index_source_resync_abort(kvidx_index_t *idx, unsigned id)
{
    ix_source_t *s = source_at(idx, id);
    if (!s)
        return KVIDX_EINVAL;
    s->resyncing = 0;
    return 0;
}

int kvidx_index_source_holds(const kvidx_index_t *idx, unsigned id, kvidx_ref_t ref)
{
    const ix_source_t *s = source_at(idx, id);
    return s && kvidx_refset_has(&s->set, ref);
}

uint32_t kvidx_index_source_mask(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    uint32_t mask = 0;
    if (!idx->src || !ref_live(idx, ref) || !rec_src(rec_at(idx, ref)))
        return 0;
    for (unsigned i = 0; i < idx->src->n; i++)
        if (kvidx_refset_has(&idx->src->s[i].set, ref))
            mask |= UINT32_C(1) << i;
    return mask;
}

int kvidx_index_source_stats(const kvidx_index_t *idx, unsigned id, kvidx_source_stats_t *out)
{
    const ix_source_t *s = source_at(idx, id);
    if (!s)
        return KVIDX_EINVAL;
    out->keys = s->set.count;
    out->bytes = s->bytes;
    out->resyncing = s->resyncing;
    return 0;
}

/* ---- consistency (called by kvidx_index_check) ---- */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return KVIDX_EINTERNAL;                                                                \
    } while (0)

int ix_check_sources(const kvidx_index_t *idx)
{
    if (!idx->src) {
        CHECK(idx->c.src_keys == 0 && idx->c.src_bytes == 0);
        return 0;
    }
    CHECK(idx->src->n <= KVIDX_INDEX_SOURCES_MAX);
    uint64_t distinct = 0;
    for (unsigned i = 0; i < idx->src->n; i++) {
        const ix_source_t *s = &idx->src->s[i];
        CHECK(kvidx_refset_check(&s->set) == 0);
        uint64_t bytes = 0;
        size_t pos = 0;
        kvidx_ref_t ref;
        while (kvidx_refset_next(&s->set, &pos, &ref, NULL)) {
            CHECK(ref_live(idx, ref) && rec_src(rec_at(idx, ref)));
            bytes += rec_size(rec_at(idx, ref));
            unsigned j = 0;
            while (j < i && !kvidx_refset_has(&idx->src->s[j].set, ref))
                j++;
            distinct += j == i;
        }
        CHECK(bytes == s->bytes);
    }
    /* Every member has the bit and the records with the bit are counted
     * in src_keys (check_counters), so equal counts mean the memberships
     * cover exactly the records with the bit. */
    CHECK(distinct == idx->c.src_keys);
    return 0;
}
