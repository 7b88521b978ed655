/*
 * kvidx_directory_check: verifies every invariant directory.c states, by
 * walking the whole state and recomputing what the counters, refcounts and
 * memory accounting should be. Its only allocations are two scratch arrays
 * of counts.
 */
#include "directory_int.h"

#include "kvidx/alloc.h"

#include <stdlib.h>

#if defined(__GNUC__)
__attribute__((noinline))
#endif
static int
fail(void)
{
    /* A place for a breakpoint: every failed invariant comes through here. */
    return KVIDX_EINTERNAL;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return fail();                                                                         \
    } while (0)

static int live_key(const kvidx_directory_t *d, uint32_t ref)
{
    unsigned c = ref >> CLASS_SHIFT;
    if (ref & KEY_TAG || c >= NCLASS || (ref & SLOT_MASK) >= d->slabs[c].used)
        return 0;
    return K(d, ref)->ns != NONE;
}

static int live_pl(const kvidx_directory_t *d, uint32_t p)
{
    return !(p & KEY_TAG) && p < d->pl_used && P(d, p)->src != NONE;
}

static int live_src(const kvidx_directory_t *d, uint32_t s)
{
    return s < d->src_used && S(d, s)->inst != NONE;
}

/* ---- strings and namespaces ---- */

static int check_strings(const kvidx_directory_t *d, const uint32_t *want)
{
    uint32_t live = 0, free = 0;
    for (uint32_t i = 0; i < d->str_used; i++) {
        const dstr_t *s = &d->strs[i];
        if (!s->s)
            continue;
        live++;
        CHECK(s->refs == want[i] && s->refs > 0);
        CHECK(s->s[s->len] == '\0');
        CHECK(dr_str_find(d, s->s, s->len) == i);
        if (s->inst)
            CHECK(s->inst->sid == i);
    }
    for (uint32_t f = d->str_free; f != NONE; f = d->strs[f].refs) {
        CHECK(f < d->str_used && !d->strs[f].s && !d->strs[f].inst);
        CHECK(++free <= d->str_used);
    }
    CHECK(live + free == d->str_used && live == d->strtab.count);
    return 0;
}

static int check_namespaces(const kvidx_directory_t *d, const uint32_t *keys_of, uint32_t *want)
{
    uint32_t live = 0, free = 0;
    for (uint32_t i = 0; i < d->ns_used; i++) {
        const dns_t *ns = &d->ns[i];
        if (!ns->live)
            continue;
        live++;
        CHECK(ns->refs == keys_of[i] && ns->refs > 0);
        CHECK(ns->model < d->str_used && d->strs[ns->model].s);
        want[ns->model]++;
        if (ns->salt != NONE) {
            CHECK(ns->salt < d->str_used && d->strs[ns->salt].s && d->strs[ns->salt].len);
            want[ns->salt]++;
        }
        kvidx_key_t k = {0};
        k.model = d->strs[ns->model].s;
        k.model_len = (uint16_t)d->strs[ns->model].len;
        k.salt = ns->salt == NONE ? "" : d->strs[ns->salt].s;
        k.salt_len = ns->salt == NONE ? 0 : (uint8_t)d->strs[ns->salt].len;
        CHECK(dr_ns_find(d, &k) == i);
    }
    for (uint32_t f = d->ns_free; f != NONE; f = d->ns[f].refs) {
        CHECK(f < d->ns_used && !d->ns[f].live);
        CHECK(++free <= d->ns_used);
    }
    CHECK(live + free == d->ns_used && live == d->nstab.count);
    return 0;
}

/* ---- keys: slabs, table, treap, rings, placement lists ---- */

static int ring_has(const kvidx_directory_t *d, uint32_t ring, uint32_t x)
{
    uint64_t steps = 0;
    uint32_t k = ring;
    do {
        if (k == x)
            return 1;
        k = K(d, k)->ring;
    } while (k != ring && ++steps <= d->nkeys);
    return 0;
}

static int check_plist(const kvidx_directory_t *d, uint32_t ref, uint64_t *nplace)
{
    const krec_t *r = K(d, ref);
    CHECK(r->plist != NONE && live_pl(d, r->plist));
    uint32_t prev = NONE, p = r->plist;
    uint64_t steps = 0;
    for (; !(p & KEY_TAG); prev = p, p = P(d, p)->next) {
        CHECK(live_pl(d, p) && ++steps <= d->nplace);
        CHECK(live_src(d, P(d, p)->src));
        if (prev != NONE)
            CHECK(dr_pl_cmp(d, P(d, prev)->src, P(d, p)->src) < 0);
        const dsrc_t *s = S(d, P(d, p)->src);
        if (s->shared)
            for (uint32_t q = r->plist; q != p; q = P(d, q)->next) {
                const dsrc_t *o = S(d, P(d, q)->src);
                CHECK(!(o->shared && o->tier == s->tier && o->backend == s->backend));
            }
    }
    CHECK(p == (KEY_TAG | ref));
    *nplace += steps;
    return 0;
}

static int check_key(const kvidx_directory_t *d, uint32_t ref, uint32_t *keys_of, uint64_t *np)
{
    const krec_t *r = K(d, ref);
    CHECK(r->ns < d->ns_used && d->ns[r->ns].live);
    keys_of[r->ns]++;
    unsigned c = ref >> CLASS_SHIFT;
    CHECK(r->hash_len >= KVIDX_HASH_MIN && hash_class(r->hash_len) == c);
    for (unsigned i = r->hash_len; i < 8 * (c + 1); i++)
        CHECK(r->hash[i] == 0);
    kvidx_key_t v;
    dr_key_view(d, ref, &v);
    CHECK(dr_key_find(d, r->ns, &v) == ref);
    /* Its ring: the same hash and binding throughout, and the chunk
     * table's member for the hash is one of it. */
    uint64_t steps = 0;
    uint32_t k = ref;
    do {
        CHECK(live_key(d, k) && ++steps <= d->nkeys);
        const krec_t *x = K(d, k);
        CHECK(x->hash_len == r->hash_len && memcmp(x->hash, r->hash, r->hash_len) == 0);
        CHECK(x->bind == r->bind);
        k = x->ring;
    } while (k != ref);
    uint32_t rep = dr_chunk_find(d, r->hash, r->hash_len);
    CHECK(rep != NONE && ring_has(d, ref, rep));
    if (r->bind != NONE) {
        CHECK(r->bind < d->binds_used && d->binds[r->bind]);
        CHECK(ring_has(d, ref, d->binds[r->bind]->rep));
    }
    return check_plist(d, ref, np);
}

static int check_tree(const kvidx_directory_t *d, uint32_t n, const kvidx_key_t *lo,
                      const kvidx_key_t *hi, unsigned depth, uint64_t *count)
{
    if (n == NONE)
        return 0;
    CHECK(live_key(d, n) && depth < 1000 && ++*count <= d->nkeys);
    kvidx_key_t v;
    dr_key_view(d, n, &v);
    if (lo)
        CHECK(kvidx_key_cmp(lo, &v) < 0);
    if (hi)
        CHECK(kvidx_key_cmp(&v, hi) < 0);
    const krec_t *r = K(d, n);
    if (r->left != NONE)
        CHECK(live_key(d, r->left) && dr_tree_prio(d, r->left) <= dr_tree_prio(d, n));
    if (r->right != NONE)
        CHECK(live_key(d, r->right) && dr_tree_prio(d, r->right) <= dr_tree_prio(d, n));
    if (check_tree(d, r->left, lo, &v, depth + 1, count))
        return fail();
    return check_tree(d, r->right, &v, hi, depth + 1, count);
}

static int check_keys(const kvidx_directory_t *d, uint32_t *keys_of)
{
    uint64_t live = 0, np = 0, rings = 0;
    for (unsigned c = 0; c < NCLASS; c++) {
        const kslab_t *s = &d->slabs[c];
        CHECK(s->used <= s->nchunks * CHUNK_RECS && s->nchunks <= s->chunks_cap);
        uint32_t free = 0;
        for (uint32_t f = s->free_head; f != NONE; f = K(d, c << CLASS_SHIFT | f)->plist) {
            CHECK(f < s->used && K(d, c << CLASS_SHIFT | f)->ns == NONE);
            CHECK(++free <= s->used);
        }
        CHECK(free == s->nfree);
        for (uint32_t i = 0; i < s->used; i++) {
            uint32_t ref = (uint32_t)c << CLASS_SHIFT | i;
            if (K(d, ref)->ns == NONE)
                continue;
            live++;
            if (check_key(d, ref, keys_of, &np))
                return fail();
            rings += dr_chunk_find(d, K(d, ref)->hash, K(d, ref)->hash_len) == ref;
        }
        CHECK(live <= d->nkeys);
    }
    CHECK(live == d->nkeys && d->ktab.count == live && np == d->nplace);
    CHECK(d->ctab.count == rings);
    for (size_t i = 0; i < d->ktab.cap; i++)
        CHECK(d->ktab.slot[i] == NONE || live_key(d, d->ktab.slot[i]));
    for (size_t i = 0; i < d->ctab.cap; i++)
        CHECK(d->ctab.slot[i] == NONE || live_key(d, d->ctab.slot[i]));
    uint64_t count = 0;
    if (check_tree(d, d->root, NULL, NULL, 0, &count))
        return fail();
    CHECK(count == d->nkeys);
    return 0;
}

/* ---- sources, the pool, instances ---- */

static int check_source(const kvidx_directory_t *d, uint32_t id, uint64_t *tp, uint64_t *tb)
{
    const dsrc_t *s = S(d, id);
    CHECK(s->pins == 0 && s->nplace > 0);
    CHECK(s->tier == KVIDX_DIR_L1 || s->tier == KVIDX_DIR_L2);
    CHECK(s->inst < d->str_used && d->strs[s->inst].inst);
    CHECK(s->backend < d->str_used && d->strs[s->backend].s);
    uint32_t n = 0, prev = NONE;
    uint64_t bytes = 0;
    for (uint32_t p = s->head; p != NONE; prev = p, p = P(d, p)->snext) {
        CHECK(live_pl(d, p) && P(d, p)->src == id && P(d, p)->sprev == prev);
        CHECK(++n <= s->nplace);
        bytes += P(d, p)->size;
        /* The placement is in its key's list. */
        uint32_t ref = pl_key(d, p), q = K(d, ref)->plist;
        CHECK(live_key(d, ref));
        while (q != p && !(q & KEY_TAG))
            q = P(d, q)->next;
        CHECK(q == p);
    }
    CHECK(n == s->nplace && bytes == s->bytes);
    tp[s->tier - 1] += n;
    tb[s->tier - 1] += bytes;
    return 0;
}

static int check_sources(const kvidx_directory_t *d, uint32_t *want)
{
    uint64_t tp[2] = {0, 0}, tb[2] = {0, 0};
    uint32_t live = 0, free = 0;
    for (uint32_t i = 0; i < d->src_used; i++) {
        if (!live_src(d, i))
            continue;
        live++;
        want[S(d, i)->backend]++;
        if (check_source(d, i, tp, tb))
            return fail();
    }
    for (uint32_t f = d->src_free; f != NONE; f = S(d, f)->head) {
        CHECK(f < d->src_used && S(d, f)->inst == NONE);
        CHECK(++free <= d->src_used);
    }
    CHECK(live + free == d->src_used);
    CHECK(tp[0] == d->tier_place[0] && tp[1] == d->tier_place[1]);
    CHECK(tb[0] == d->tier_bytes[0] && tb[1] == d->tier_bytes[1]);
    CHECK(d->pl_used <= d->pl_nchunks * PL_CHUNK);
    uint32_t pfree = 0;
    for (uint32_t f = d->pl_free; f != NONE; f = P(d, f)->next) {
        CHECK(f < d->pl_used && P(d, f)->src == NONE);
        CHECK(++pfree <= d->pl_used);
    }
    CHECK(pfree == d->pl_nfree && d->pl_used - pfree == d->nplace);
    /* Every source is in its instance's list exactly once. */
    uint32_t listed = 0;
    for (size_t i = 0; i < d->ninsts; i++) {
        const inst_t *in = d->insts[i];
        uint32_t prev = NONE;
        for (uint32_t s = in->src_head; s != NONE; prev = s, s = S(d, s)->next) {
            CHECK(live_src(d, s) && S(d, s)->inst == in->sid && S(d, s)->prev == prev);
            CHECK(++listed <= live);
            const dsrc_t *x = S(d, s);
            CHECK(dr_src_find(d, in, x->incarnation, x->tier, x->backend, x->shared) == s);
        }
    }
    CHECK(listed == live);
    return 0;
}

static int check_insts(const kvidx_directory_t *d, uint32_t *want)
{
    size_t reg = 0;
    for (size_t i = 0; i < d->ninsts; i++) {
        const inst_t *in = d->insts[i];
        CHECK(in->sid < d->str_used && d->strs[in->sid].inst == in);
        want[in->sid]++;
        CHECK(in->pins == 0);
        CHECK(in->src_head != NONE || in->has_cursor || in->registered || in->has_decl);
        if (i > 0)
            CHECK(str_cmp(d, d->insts[i - 1]->sid, in->sid) < 0);
        reg += in->registered;
        if (!in->registered)
            CHECK(!in->ip && !in->p2p && !in->meta);
        else
            CHECK(in->ip && in->p2p && in->meta);
        CHECK(in->has_decl ? in->ncaps > 0 : in->ncaps == 0);
        CHECK(in->ncaps <= in->caps_cap);
        for (size_t j = 0; j < in->ncaps; j++) {
            const dcap_t *c = &in->caps[j];
            CHECK(c->backend < d->str_used && d->strs[c->backend].s);
            CHECK(c->tier == KVIDX_DIR_L1 || c->tier == KVIDX_DIR_L2);
            want[c->backend]++;
            for (size_t k = 0; k < j; k++)
                CHECK(!(in->caps[k].tier == c->tier && in->caps[k].backend == c->backend));
        }
        if (!in->has_cursor)
            CHECK(!in->gap && !in->applied && !in->duplicates && !in->stale);
    }
    CHECK(reg == d->nregistered);
    size_t n = 0;
    const inst_t *prev = NULL;
    for (const inst_t *in = d->reg_head; in; prev = in, in = in->reg_next) {
        CHECK(in->registered && in->reg_prev == prev && ++n <= reg);
        CHECK(d->strs[in->sid].inst == in);
    }
    CHECK(n == reg && d->reg_tail == prev);
    return 0;
}

/* ---- bindings ---- */

static int check_binds(const kvidx_directory_t *d)
{
    uint64_t live = 0, toks = 0, bytes = 0;
    CHECK(d->binds_used <= d->binds_cap && d->nbind_free <= d->binds_used);
    for (uint32_t i = 0; i < d->binds_used; i++) {
        const dbind_t *b = d->binds[i];
        if (!b)
            continue;
        live++;
        toks += b->ntok;
        bytes += bind_bytes(b->ntok);
        CHECK(b->ntok > 0 && b->offset >= KVIDX_DIR_UNKNOWN_OFFSET);
        CHECK(live_key(d, b->rep) && K(d, b->rep)->bind == i);
    }
    for (size_t i = 0; i < d->nbind_free; i++) {
        uint32_t id = d->bind_free_list[i];
        CHECK(id < d->binds_used && !d->binds[id]);
        for (size_t j = 0; j < i; j++)
            CHECK(d->bind_free_list[j] != id);
    }
    CHECK(live + d->nbind_free == d->binds_used);
    CHECK(live == d->nbinds && toks == d->bind_tokens && bytes == d->token_bytes);
    CHECK(!d->token_cap || d->token_bytes <= d->token_cap);
    uint64_t n = 0;
    uint32_t prev = NONE;
    for (uint32_t b = d->age_head; b != NONE; prev = b, b = d->binds[b]->next) {
        CHECK(b < d->binds_used && d->binds[b] && d->binds[b]->prev == prev && ++n <= live);
    }
    CHECK(n == live && d->age_tail == prev);
    return 0;
}

/* ---- memory ---- */

static uint64_t expected_mem(const kvidx_directory_t *d)
{
    uint64_t m = sizeof(*d);
    m += d->strs_cap * sizeof(dstr_t) + d->strtab.cap * sizeof(uint32_t);
    for (uint32_t i = 0; i < d->str_used; i++)
        if (d->strs[i].s)
            m += d->strs[i].len + 1;
    m += d->ns_cap * sizeof(dns_t) + d->nstab.cap * sizeof(uint32_t);
    for (unsigned c = 0; c < NCLASS; c++) {
        const kslab_t *s = &d->slabs[c];
        m += s->chunks_cap * sizeof(uint8_t *) + s->nchunks * (uint64_t)CHUNK_RECS * s->rec_size;
    }
    m += (d->ktab.cap + d->ctab.cap) * sizeof(uint32_t);
    m += d->pl_chunks_cap * sizeof(dpl_t *) + d->pl_nchunks * (uint64_t)PL_CHUNK * sizeof(dpl_t);
    m += d->srcs_cap * sizeof(dsrc_t) + d->insts_cap * sizeof(inst_t *);
    for (size_t i = 0; i < d->ninsts; i++) {
        const inst_t *in = d->insts[i];
        m += sizeof(*in) + in->caps_cap * sizeof(dcap_t);
        if (in->registered)
            m += in->ip_len + in->p2p_len + in->meta_len + 3;
    }
    m += d->binds_cap * (sizeof(dbind_t *) + sizeof(uint32_t)) + d->token_bytes;
    return m;
}

int kvidx_directory_check(const kvidx_directory_t *d)
{
    uint32_t *want = kvidx_calloc((size_t)d->str_used + 1, sizeof(uint32_t));
    uint32_t *keys_of = kvidx_calloc((size_t)d->ns_used + 1, sizeof(uint32_t));
    int rc = KVIDX_ENOMEM;
    if (want && keys_of) {
        rc = check_keys(d, keys_of);
        if (!rc)
            rc = check_namespaces(d, keys_of, want);
        if (!rc)
            rc = check_sources(d, want);
        if (!rc)
            rc = check_insts(d, want);
        if (!rc)
            rc = check_strings(d, want);
        if (!rc)
            rc = check_binds(d);
        if (!rc && expected_mem(d) != d->mem)
            rc = fail();
    }
    kvidx_free(want);
    kvidx_free(keys_of);
    return rc;
}
