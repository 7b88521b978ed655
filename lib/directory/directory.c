/*
 * The fleet directory: its lifetime, the accounted allocator every file of
 * the folder uses, the open-addressing tables of u32 ids, and the summary
 * statistics. The layout is described in directory_int.h.
 *
 * Invariants (kvidx_directory_check, check.c, verifies each):
 *  - every live key record is in the key table, in the treap (in strict
 *    canonical order, with the heap property on its priorities) and in
 *    exactly one chunk-hash ring, whose members share the hash bytes and
 *    the binding id; the chunk table holds one member of every ring and
 *    nothing else;
 *  - a key has at least one placement; its list is strictly sorted by
 *    (instance_id, tier, backend, shared), its identities are distinct, and
 *    it ends with the key's own tagged ref;
 *  - every placement is in the list of its source, a source's count and
 *    bytes are the sums over its list, and a source with no placement and
 *    no pin does not exist; every source is in its instance's list;
 *  - an instance record exists exactly while it has sources, a cursor, a
 *    registration, a declaration or a pin; the sorted array and the
 *    string's back pointer agree; the registered list holds the registered;
 *  - a binding's representative is a key of its ring and every key of the
 *    ring names it; the age list holds every binding once; token_bytes is
 *    the sum of their sizes and stays within the cap;
 *  - a string's and a namespace's refcount is the number of their users;
 *  - the per-tier counters are sums over the placements, and `mem` is the
 *    sum of every allocation's size.
 * Outside a call no pin is held. A mutation either completes or, on
 * KVIDX_ENOMEM, is undone before it returns (ingest.c: reserve, then apply);
 * removals never allocate.
 */
#include "directory_int.h"

#include <sodium.h>

/* ---- accounted allocation ---- */

void *dr_alloc(kvidx_directory_t *d, size_t n)
{
    void *p = kvidx_malloc(n ? n : 1);
    if (p)
        d->mem += n;
    return p;
}

void *dr_realloc(kvidx_directory_t *d, void *p, size_t old_n, size_t new_n)
{
    void *q = kvidx_realloc(p, new_n ? new_n : 1);
    if (q)
        d->mem += new_n - old_n;
    return q;
}

void dr_free(kvidx_directory_t *d, void *p, size_t n)
{
    if (!p)
        return;
    d->mem -= n;
    kvidx_free(p);
}

int dr_grow(kvidx_directory_t *d, void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 8;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem)
            return KVIDX_ENOMEM;
        n *= 2;
    }
    void *p = dr_realloc(d, *arr, *cap * elem, n * elem);
    if (!p)
        return KVIDX_ENOMEM;
    *arr = p;
    *cap = n;
    return 0;
}

/* ---- tables ----
 * Linear probing; a removal shifts back the entries of its cluster that
 * would otherwise become unreachable, so there are no tombstones. */

static size_t tab_home(const tab_t *t, uint64_t h)
{
    return (size_t)(h & (t->cap - 1));
}

int dr_tab_reserve(kvidx_directory_t *d, tab_t *t, size_t need, tab_hash_fn hf)
{
    size_t cap = t->cap ? t->cap : 16;
    while (need > cap / 4 * 3) {
        if (cap > SIZE_MAX / 8)
            return KVIDX_ENOMEM;
        cap *= 2;
    }
    if (cap == t->cap)
        return 0;
    uint32_t *slot = dr_alloc(d, cap * sizeof(uint32_t));
    if (!slot)
        return KVIDX_ENOMEM;
    memset(slot, 0xff, cap * sizeof(uint32_t));
    tab_t nt = {slot, cap, 0};
    for (size_t i = 0; i < t->cap; i++)
        if (t->slot[i] != NONE)
            dr_tab_insert(&nt, t->slot[i], hf(d, t->slot[i]));
    dr_free(d, t->slot, t->cap * sizeof(uint32_t));
    *t = nt;
    return 0;
}

uint32_t dr_tab_find(const kvidx_directory_t *d, const tab_t *t, uint64_t h, tab_eq_fn eq,
                     const void *probe)
{
    if (!t->cap)
        return NONE;
    for (size_t i = tab_home(t, h);; i = (i + 1) & (t->cap - 1)) {
        uint32_t id = t->slot[i];
        if (id == NONE)
            return NONE;
        if (eq(d, id, probe))
            return id;
    }
}

void dr_tab_insert(tab_t *t, uint32_t id, uint64_t h)
{
    size_t i = tab_home(t, h);
    while (t->slot[i] != NONE)
        i = (i + 1) & (t->cap - 1);
    t->slot[i] = id;
    t->count++;
}

static size_t tab_slot_of(const tab_t *t, uint32_t id, uint64_t h)
{
    size_t i = tab_home(t, h);
    while (t->slot[i] != id)
        i = (i + 1) & (t->cap - 1);
    return i;
}

void dr_tab_remove(const kvidx_directory_t *d, tab_t *t, uint32_t id, uint64_t h, tab_hash_fn hf)
{
    size_t mask = t->cap - 1;
    size_t hole = tab_slot_of(t, id, h);
    t->slot[hole] = NONE;
    t->count--;
    for (size_t j = (hole + 1) & mask; t->slot[j] != NONE; j = (j + 1) & mask) {
        size_t home = tab_home(t, hf(d, t->slot[j]));
        /* The entry at j may move into the hole when its home is not in
         * the cyclic range (hole, j]. */
        int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            t->slot[hole] = t->slot[j];
            t->slot[j] = NONE;
            hole = j;
        }
    }
}

void dr_tab_replace(tab_t *t, uint32_t id, uint64_t h, uint32_t other)
{
    t->slot[tab_slot_of(t, id, h)] = other;
}

void dr_tab_free(kvidx_directory_t *d, tab_t *t)
{
    dr_free(d, t->slot, t->cap * sizeof(uint32_t));
    memset(t, 0, sizeof(*t));
}

/* ---- lifetime ---- */

int kvidx_directory_new(const kvidx_dir_options_t *opts, kvidx_directory_t **out)
{
    *out = NULL;
    kvidx_directory_t *d = kvidx_calloc(1, sizeof(*d));
    if (!d)
        return KVIDX_ENOMEM;
    if (opts && opts->has_seed) {
        memcpy(d->hkey, opts->seed, sizeof(d->hkey));
    } else {
        if (sodium_init() < 0) {
            kvidx_free(d);
            return KVIDX_EINTERNAL;
        }
        randombytes_buf(d->hkey, sizeof(d->hkey));
    }
    memcpy(&d->pseed, d->hkey, sizeof(d->pseed));
    d->mem = sizeof(*d);
    d->token_cap = opts ? opts->token_bytes_cap : 0;
    d->str_free = d->ns_free = d->src_free = d->pl_free = NONE;
    d->root = d->age_head = d->age_tail = NONE;
    for (unsigned c = 0; c < NCLASS; c++) {
        d->slabs[c].free_head = NONE;
        d->slabs[c].rec_size = (uint32_t)(sizeof(krec_t) + 8 * (c + 1));
    }
    *out = d;
    return 0;
}

static void inst_free_all(kvidx_directory_t *d, inst_t *in)
{
    dr_free(d, in->ip, in->ip_len + 1);
    dr_free(d, in->p2p, in->p2p_len + 1);
    dr_free(d, in->meta, in->meta_len + 1);
    dr_free(d, in->caps, in->caps_cap * sizeof(dcap_t));
    dr_free(d, in, sizeof(*in));
}

void kvidx_directory_free(kvidx_directory_t *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->ninsts; i++)
        inst_free_all(d, d->insts[i]);
    dr_free(d, d->insts, d->insts_cap * sizeof(inst_t *));
    for (uint32_t i = 0; i < d->str_used; i++)
        if (d->strs[i].s)
            dr_free(d, d->strs[i].s, d->strs[i].len + 1);
    dr_free(d, d->strs, d->strs_cap * sizeof(dstr_t));
    dr_tab_free(d, &d->strtab);
    dr_free(d, d->ns, d->ns_cap * sizeof(dns_t));
    dr_tab_free(d, &d->nstab);
    for (unsigned c = 0; c < NCLASS; c++) {
        kslab_t *s = &d->slabs[c];
        for (size_t i = 0; i < s->nchunks; i++)
            dr_free(d, s->chunks[i], (size_t)CHUNK_RECS * s->rec_size);
        dr_free(d, s->chunks, s->chunks_cap * sizeof(uint8_t *));
    }
    dr_tab_free(d, &d->ktab);
    dr_tab_free(d, &d->ctab);
    for (size_t i = 0; i < d->pl_nchunks; i++)
        dr_free(d, d->pl_chunks[i], PL_CHUNK * sizeof(dpl_t));
    dr_free(d, d->pl_chunks, d->pl_chunks_cap * sizeof(dpl_t *));
    dr_free(d, d->srcs, d->srcs_cap * sizeof(dsrc_t));
    for (uint32_t i = 0; i < d->binds_used; i++)
        if (d->binds[i])
            dr_free(d, d->binds[i], bind_bytes(d->binds[i]->ntok));
    dr_free(d, d->binds, d->binds_cap * sizeof(dbind_t *));
    dr_free(d, d->bind_free_list, d->binds_cap * sizeof(uint32_t));
    kvidx_free(d);
}

void kvidx_directory_set_token_cap(kvidx_directory_t *d, uint64_t token_bytes_cap)
{
    d->token_cap = token_bytes_cap;
    dr_bind_enforce_cap(d);
    kvidx_dir_change_t c = {.type = KVIDX_DIR_CHG_TOKEN_CAP, .token_bytes_cap = token_bytes_cap};
    dr_notify(d, &c);
}

void kvidx_directory_on_change(kvidx_directory_t *d,
                               void (*cb)(void *ctx, const kvidx_dir_change_t *c), void *ctx)
{
    d->on_change = cb;
    d->on_change_ctx = ctx;
}

void dr_notify(kvidx_directory_t *d, const kvidx_dir_change_t *c)
{
    if (d->on_change)
        d->on_change(d->on_change_ctx, c);
}

/* ---- statistics ---- */

void kvidx_directory_stats(const kvidx_directory_t *d, kvidx_dir_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->num_keys = d->nkeys;
    out->num_placements = d->nplace;
    for (int t = 0; t < 2; t++) {
        out->placements[t] = d->tier_place[t];
        out->bytes[t] = d->tier_bytes[t];
    }
    out->num_instances = d->ninsts;
    out->num_registered = d->nregistered;
    for (size_t i = 0; i < d->ninsts; i++)
        out->num_streams += d->insts[i]->has_cursor;
    out->bindings = d->nbinds;
    out->binding_tokens = d->bind_tokens;
    out->token_bytes = d->token_bytes;
    out->token_bytes_cap = d->token_cap;
    out->bindings_dropped = d->bind_dropped;
    out->tokens_dropped = d->tok_dropped;
    out->memory_bytes = d->mem;
}
