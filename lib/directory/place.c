/*
 * Placements and sources of the fleet directory.
 *
 * A placement is a 24-byte record in a pool of 4096-record chunks, named by
 * an id below 2^31 (the top bit of a `next` link marks the key's ref that
 * ends a key's list). A key's placements are kept sorted by (instance_id,
 * tier, backend, shared), which is the order lookups answer in and makes
 * the L1 placements of one instance adjacent. A source is the tuple a
 * placement was reported under (reporter, incarnation, tier, backend,
 * shared); it owns a doubly linked list of its placements and sits in its
 * instance's list of sources, so fencing walks exactly the L1 placements an
 * instance last reported. A source exists while it has placements or pins;
 * it holds one reference on its backend string, and keeps its instance
 * record alive.
 */
#include "directory_int.h"

/* ---- the pool ---- */

int dr_pool_reserve(kvidx_directory_t *d, size_t k)
{
    size_t avail = d->pl_nfree + d->pl_nchunks * PL_CHUNK - d->pl_used;
    while (avail < k) {
        if ((d->pl_nchunks + 1) * (size_t)PL_CHUNK >= KEY_TAG)
            return KVIDX_ENOMEM;
        void *arr = d->pl_chunks;
        int rc = dr_grow(d, &arr, &d->pl_chunks_cap, d->pl_nchunks + 1, sizeof(dpl_t *));
        d->pl_chunks = arr;
        if (rc)
            return rc;
        dpl_t *c = dr_alloc(d, PL_CHUNK * sizeof(dpl_t));
        if (!c)
            return KVIDX_ENOMEM;
        d->pl_chunks[d->pl_nchunks++] = c;
        avail += PL_CHUNK;
    }
    return 0;
}

static uint32_t pl_take(kvidx_directory_t *d)
{
    uint32_t id;
    if (d->pl_free != NONE) {
        id = d->pl_free;
        d->pl_free = P(d, id)->next;
        d->pl_nfree--;
    } else {
        id = d->pl_used++;
    }
    return id;
}

static void pl_put(kvidx_directory_t *d, uint32_t id)
{
    dpl_t *p = P(d, id);
    p->src = NONE;
    p->next = d->pl_free;
    d->pl_free = id;
    d->pl_nfree++;
}

/* ---- sources ---- */

int dr_srcs_reserve(kvidx_directory_t *d, size_t k)
{
    void *arr = d->srcs;
    int rc = dr_grow(d, &arr, &d->srcs_cap, (size_t)d->src_used + k, sizeof(dsrc_t));
    d->srcs = arr;
    return rc;
}

uint32_t dr_src_find(const kvidx_directory_t *d, const inst_t *in, uint64_t inc, unsigned tier,
                     uint32_t backend, int shared)
{
    for (uint32_t s = in->src_head; s != NONE; s = S(d, s)->next) {
        const dsrc_t *x = S(d, s);
        if (x->incarnation == inc && x->tier == tier && x->backend == backend &&
            x->shared == (shared != 0))
            return s;
    }
    return NONE;
}

uint32_t dr_src_get(kvidx_directory_t *d, inst_t *in, uint64_t inc, unsigned tier, uint32_t backend,
                    int shared)
{
    uint32_t id = dr_src_find(d, in, inc, tier, backend, shared);
    if (id != NONE) {
        S(d, id)->pins++;
        return id;
    }
    if (d->src_free != NONE) {
        id = d->src_free;
        d->src_free = S(d, id)->head;
    } else {
        id = d->src_used++;
    }
    dsrc_t *s = S(d, id);
    *s = (dsrc_t){.inst = in->sid,
                  .backend = backend,
                  .incarnation = inc,
                  .tier = (uint8_t)tier,
                  .shared = (uint8_t)(shared != 0),
                  .pins = 1,
                  .head = NONE,
                  .prev = NONE,
                  .next = in->src_head};
    if (in->src_head != NONE)
        S(d, in->src_head)->prev = id;
    in->src_head = id;
    dr_str_ref(d, backend);
    return id;
}

static void src_gc(kvidx_directory_t *d, uint32_t id)
{
    dsrc_t *s = S(d, id);
    if (s->nplace || s->pins)
        return;
    inst_t *in = d->strs[s->inst].inst;
    if (s->prev != NONE)
        S(d, s->prev)->next = s->next;
    else
        in->src_head = s->next;
    if (s->next != NONE)
        S(d, s->next)->prev = s->prev;
    dr_str_unref(d, s->backend);
    s->inst = NONE;
    s->head = d->src_free;
    d->src_free = id;
    dr_inst_gc(d, in);
}

void dr_src_unpin(kvidx_directory_t *d, uint32_t id)
{
    S(d, id)->pins--;
    src_gc(d, id);
}

static void src_link(kvidx_directory_t *d, uint32_t src, uint32_t p)
{
    dsrc_t *s = S(d, src);
    dpl_t *x = P(d, p);
    x->src = src;
    x->sprev = NONE;
    x->snext = s->head;
    if (s->head != NONE)
        P(d, s->head)->sprev = p;
    s->head = p;
    s->nplace++;
    s->bytes += x->size;
    d->tier_place[s->tier - 1]++;
    d->tier_bytes[s->tier - 1] += x->size;
}

static void src_unlink(kvidx_directory_t *d, uint32_t p)
{
    dpl_t *x = P(d, p);
    dsrc_t *s = S(d, x->src);
    if (x->sprev != NONE)
        P(d, x->sprev)->snext = x->snext;
    else
        s->head = x->snext;
    if (x->snext != NONE)
        P(d, x->snext)->sprev = x->sprev;
    s->nplace--;
    s->bytes -= x->size;
    d->tier_place[s->tier - 1]--;
    d->tier_bytes[s->tier - 1] -= x->size;
}

/* ---- a key's sorted list ---- */

int dr_pl_cmp(const kvidx_directory_t *d, uint32_t src_a, uint32_t src_b)
{
    const dsrc_t *a = S(d, src_a), *b = S(d, src_b);
    int c = str_cmp(d, a->inst, b->inst);
    if (c)
        return c;
    if (a->tier != b->tier)
        return a->tier < b->tier ? -1 : 1;
    c = str_cmp(d, a->backend, b->backend);
    if (c)
        return c;
    return (int)a->shared - (int)b->shared;
}

static void key_link(kvidx_directory_t *d, uint32_t ref, uint32_t p)
{
    krec_t *r = K(d, ref);
    uint32_t src = P(d, p)->src;
    uint32_t prev = NONE, n = r->plist;
    while (n != NONE && !(n & KEY_TAG) && dr_pl_cmp(d, P(d, n)->src, src) < 0) {
        prev = n;
        n = P(d, n)->next;
    }
    P(d, p)->next = n == NONE ? (KEY_TAG | ref) : n;
    if (prev == NONE)
        r->plist = p;
    else
        P(d, prev)->next = p;
}

static void key_unlink(kvidx_directory_t *d, uint32_t ref, uint32_t p)
{
    krec_t *r = K(d, ref);
    uint32_t next = P(d, p)->next;
    if (r->plist == p) {
        r->plist = (next & KEY_TAG) ? NONE : next;
        return;
    }
    uint32_t prev = r->plist;
    while (P(d, prev)->next != p)
        prev = P(d, prev)->next;
    P(d, prev)->next = next;
}

uint32_t dr_pl_find(const kvidx_directory_t *d, uint32_t ref, uint32_t inst_sid, unsigned tier,
                    uint32_t backend, int shared)
{
    for (uint32_t n = K(d, ref)->plist; n != NONE && !(n & KEY_TAG); n = P(d, n)->next) {
        const dsrc_t *s = S(d, P(d, n)->src);
        if (s->tier == tier && s->backend == backend && s->shared == (shared != 0) &&
            (shared || s->inst == inst_sid))
            return n;
    }
    return NONE;
}

void dr_pl_upsert(kvidx_directory_t *d, uint32_t ref, uint32_t src, uint64_t size)
{
    const dsrc_t *s = S(d, src);
    uint32_t p = dr_pl_find(d, ref, s->inst, s->tier, s->backend, s->shared);
    if (p == NONE) {
        p = pl_take(d);
        P(d, p)->size = size;
        src_link(d, src, p);
        key_link(d, ref, p);
        d->nplace++;
        return;
    }
    uint32_t old = P(d, p)->src;
    int moved = old != src && S(d, old)->inst != s->inst;
    src_unlink(d, p);
    P(d, p)->size = size;
    src_link(d, src, p);
    if (moved) {
        /* A shared placement taken over by another reporter changes its
         * place in the key's order. */
        key_unlink(d, ref, p);
        key_link(d, ref, p);
    }
    if (old != src)
        src_gc(d, old);
}

void dr_pl_remove(kvidx_directory_t *d, uint32_t ref, uint32_t p)
{
    uint32_t src = P(d, p)->src;
    key_unlink(d, ref, p);
    src_unlink(d, p);
    pl_put(d, p);
    d->nplace--;
    src_gc(d, src);
    if (K(d, ref)->plist == NONE)
        dr_key_forget(d, ref);
}

/* The caller holds a pin on in, so that it survives its sources. */
void dr_fence(kvidx_directory_t *d, inst_t *in)
{
    uint32_t s = in->src_head;
    while (s != NONE) {
        uint32_t next = S(d, s)->next;
        if (S(d, s)->tier == KVIDX_DIR_L1) {
            /* Pinned so that removing its last placement does not free it
             * (and reuse its slot) while the walk still reads it. */
            S(d, s)->pins++;
            while (S(d, s)->head != NONE) {
                uint32_t p = S(d, s)->head;
                dr_pl_remove(d, pl_key(d, p), p);
            }
            S(d, s)->pins--;
            next = S(d, s)->next;
            src_gc(d, s);
        }
        s = next;
    }
}
