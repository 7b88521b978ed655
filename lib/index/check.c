/*
 * kvidx_index_check: verifies every invariant that index.c states, for
 * tests and fuzzers. It reads the index only, allocates nothing and
 * returns KVIDX_EINTERNAL at the first broken invariant instead of
 * aborting (a debugger can stop in check_failed to see which one).
 *
 * The order of the checks makes each one safe to run on what the previous
 * ones vouched for: the table's load first (so a probe ends), then the
 * interned strings' order (so a name can be searched), the namespaces and
 * their trees (every ref checked live before its record is read), the
 * records with their L1 copies and table slots, the L1 table's free list
 * and LRU ring, then the counters against the sums gathered on the way,
 * and last the sources' membership against the records' source bits
 * (ix_check_sources, source.c). Cost: one pass over records, table slots, tree nodes and L1 slots,
 * plus names × namespaces for the refcounts.
 */
#include "index_int.h"

/* Sums over the live records, compared with the counters at the end. */
typedef struct sums {
    uint64_t keys, l1_keys, l1_bytes, l1_loading, l1_pinned, l1_pins;
    uint64_t lru_bytes, lru_n, l2_keys, l2_bytes, tree_keys;
    uint64_t src_keys, src_bytes;
} sums_t;

/* One tree walk: the leaf and the record met last, the keys counted. */
typedef struct walk {
    const kvidx_index_t *idx;
    const ns_t *ns;
    const leaf_t *prev_leaf;
    const uint8_t *prev_rec;
    uint64_t keys;
} walk_t;

#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline, cold))
#else
#define NOINLINE
#endif

/* The one place every failed check returns through. */
static NOINLINE int check_failed(void)
{
    return KVIDX_EINTERNAL;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return check_failed();                                                                 \
    } while (0)

#define CHECK_RC(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* Every occupied slot names a live record and carries its hash's tag,
 * with no empty slot between its home and it (so a probe finds it);
 * ht_count counts them and stays within the 0.9 load. */
static int check_table(const kvidx_index_t *idx)
{
    if (!idx->ht_cap) {
        CHECK(idx->ht_count == 0);
        return 0;
    }
    CHECK((uint64_t)idx->ht_cap <= HT_CAP_MAX);
    CHECK(idx->ht_count <= idx->ht_cap / 10 * 9);
    size_t occupied = 0;
    for (size_t j = 0; j < idx->ht_cap; j++) {
        kvidx_ref_t ref = idx->ht[j];
        if (ref == KVIDX_REF_NONE)
            continue;
        occupied++;
        CHECK(ref_live(idx, ref));
        uint64_t h = ref_hash(idx, ref);
        CHECK(idx->ht_tag[j] == h_tag(h));
        for (size_t i = ht_home(idx, h); i != j; i = ht_next(idx, i))
            CHECK(idx->ht[i] != KVIDX_REF_NONE);
    }
    CHECK(occupied == idx->ht_count);
    return 0;
}

/* Interned strings: strictly sorted, NUL-terminated, referenced. */
static int check_strings(const kvidx_index_t *idx)
{
    CHECK(idx->nstrs <= idx->strs_cap);
    for (size_t i = 0; i < idx->nstrs; i++) {
        const istr_t *s = idx->strs[i];
        CHECK(s && s->refs > 0 && s->s[s->len] == '\0');
        if (i > 0)
            CHECK(bytes_cmp(idx->strs[i - 1]->s, idx->strs[i - 1]->len, s->s, s->len) < 0);
    }
    return 0;
}

/* Each string's refcount is the number of namespaces using it as salt
 * plus those using it as model. */
static int check_string_users(const kvidx_index_t *idx)
{
    for (size_t i = 0; i < idx->nstrs; i++) {
        const istr_t *s = idx->strs[i];
        uint64_t users = 0;
        for (size_t k = 0; k < idx->n_ns; k++)
            users += (uint64_t)(idx->ns_sorted[k]->salt == s) + (idx->ns_sorted[k]->model == s);
        CHECK(users == s->refs);
    }
    return 0;
}

static int is_interned(const kvidx_index_t *idx, const istr_t *s)
{
    size_t i = ix_str_lower_bound(idx, s->s, s->len);
    return i < idx->nstrs && idx->strs[i] == s;
}

/* A leaf: not empty, chained after the previous leaf, its keys live
 * records of this namespace, in strict order and within [lo, hi). */
static int check_leaf(walk_t *w, const leaf_t *l, const skey_t *lo, const skey_t *hi)
{
    CHECK(l->n >= 1 && l->n <= LEAF_CAP);
    CHECK(l->prev == w->prev_leaf);
    CHECK(w->prev_leaf ? w->prev_leaf->next == l : w->ns->first == l);
    for (uint32_t i = 0; i < l->n; i++) {
        CHECK(ref_live(w->idx, l->refs[i]));
        const uint8_t *r = rec_at(w->idx, l->refs[i]);
        CHECK(rec_ns(r) == w->ns->id);
        tkey_t t = rec_tkey(r);
        CHECK(!lo || tk_cmp_sep(&t, lo) >= 0);
        CHECK(!hi || tk_cmp_sep(&t, hi) < 0);
        CHECK(!w->prev_rec || tk_cmp_rec(&t, w->prev_rec) > 0);
        w->prev_rec = r;
        w->keys++;
    }
    w->prev_leaf = l;
    return 0;
}

/* The subtree of node at depth d, whose keys must lie in [lo, hi) (NULL:
 * unbounded). Separators are strictly increasing and within the bounds,
 * and child i's keys lie between separators i - 1 and i. */
static int check_node(walk_t *w, const void *node, uint32_t d, const skey_t *lo, const skey_t *hi)
{
    CHECK(node != NULL);
    if (d == w->ns->height)
        return check_leaf(w, node, lo, hi);
    const inner_t *in = node;
    CHECK(in->n >= (d == 0 ? 2u : 1u) && in->n <= INNER_CAP);
    for (uint32_t i = 0; i + 1 < in->n; i++) {
        const skey_t *s = &in->sep[i];
        CHECK(s->hash_len <= KVIDX_HASH_MAX);
        tkey_t t = {s->rank, s->group, s->hash_len, s->hash};
        CHECK(!lo || tk_cmp_sep(&t, lo) >= 0);
        CHECK(!hi || tk_cmp_sep(&t, hi) < 0);
        CHECK(i == 0 || tk_cmp_sep(&t, &in->sep[i - 1]) > 0);
    }
    for (uint32_t i = 0; i < in->n; i++) {
        const skey_t *clo = i ? &in->sep[i - 1] : lo;
        const skey_t *chi = i + 1 < in->n ? &in->sep[i] : hi;
        CHECK_RC(check_node(w, in->child[i], d + 1, clo, chi));
    }
    return 0;
}

/* A namespace's tree holds exactly its nkeys keys, none empty. */
static int check_tree(const kvidx_index_t *idx, const ns_t *ns)
{
    CHECK(ns->root != NULL && ns->height <= MAXH);
    walk_t w = {idx, ns, NULL, NULL, 0};
    CHECK_RC(check_node(&w, ns->root, 0, NULL, NULL));
    CHECK(w.prev_leaf->next == NULL);
    CHECK(w.keys == ns->nkeys);
    return 0;
}

/* Namespaces: strictly sorted by (salt, model), interned names, ids that
 * name them back, free ids on the free list, a non-empty valid tree each. */
static int check_namespaces(const kvidx_index_t *idx, sums_t *sum)
{
    CHECK(idx->n_ns <= idx->ns_sorted_cap && idx->ns_ids_n <= idx->ns_ids_cap);
    for (size_t i = 0; i < idx->n_ns; i++) {
        const ns_t *ns = idx->ns_sorted[i];
        CHECK(ns && ns->salt && ns->model);
        CHECK(ns->id < idx->ns_ids_n && idx->ns_ids[ns->id].ns == ns);
        CHECK(is_interned(idx, ns->salt) && is_interned(idx, ns->model));
        if (i > 0)
            CHECK(ns_cmp(idx->ns_sorted[i - 1], ns->salt->s, ns->salt->len, ns->model->s,
                         ns->model->len) < 0);
        CHECK(ns->nkeys > 0);
        CHECK_RC(check_tree(idx, ns));
        sum->tree_keys += ns->nkeys;
    }
    size_t used = 0;
    for (uint32_t id = 0; id < idx->ns_ids_n; id++)
        used += idx->ns_ids[id].ns != NULL;
    CHECK(used == idx->n_ns);
    uint32_t id = idx->ns_free;
    for (size_t k = used; k < idx->ns_ids_n; k++) {
        CHECK(id < idx->ns_ids_n && idx->ns_ids[id].ns == NULL);
        id = idx->ns_ids[id].next_free;
    }
    CHECK(id == UINT32_MAX);
    return 0;
}

/* A live record: a namespace, a hash length of its class, a tier; its L1
 * copy names it back and is in the LRU exactly when ready and unpinned;
 * the table finds it under its own key. */
static int check_record(const kvidx_index_t *idx, unsigned cls, kvidx_ref_t ref, sums_t *sum)
{
    const uint8_t *r = rec_at(idx, ref);
    uint32_t id = rec_ns(r);
    CHECK(id < idx->ns_ids_n && idx->ns_ids[id].ns != NULL);
    uint8_t hl = rec_hl(r);
    CHECK(hl >= KVIDX_HASH_MIN && hl <= KVIDX_HASH_MAX && hash_class(hl) == cls);
    uint32_t m = rec_l1(r);
    uint64_t size = rec_size(r);
    CHECK(m || rec_l2_any(r));
    sum->keys++;
    if (rec_l2(r)) {
        sum->l2_keys++;
        sum->l2_bytes += size;
    }
    if (rec_src(r)) {
        sum->src_keys++;
        sum->src_bytes += size;
    }
    if (m) {
        CHECK(m < idx->l1_used);
        const l1m_t *e = &idx->l1[m];
        CHECK(e->ref == ref && (e->state == KVIDX_L1_READY || e->state == KVIDX_L1_LOADING));
        CHECK(e->temporary <= 1 && e->gen > 0 && e->gen < idx->gen_next);
        CHECK(e->in_lru == (e->state == KVIDX_L1_READY && e->pins == 0));
        sum->l1_keys++;
        sum->l1_bytes += size;
        sum->l1_loading += e->state == KVIDX_L1_LOADING;
        sum->l1_pinned += e->pins != 0;
        sum->l1_pins += e->pins;
        sum->lru_n += e->in_lru;
        sum->lru_bytes += e->in_lru ? size : 0;
    }
    tkey_t t = rec_tkey(r);
    CHECK(ht_find(idx, id, &t) == ref);
    return 0;
}

/* A slab: its free list (ended by SLOT_NONE, so without a cycle) holds
 * exactly its free records; every other slot below used is live. */
static int check_slab(const kvidx_index_t *idx, unsigned cls, sums_t *sum)
{
    const slab_t *s = &idx->slabs[cls];
    CHECK(s->rec_size == REC_HDR + 8 * (cls + 1));
    CHECK(s->nchunks <= s->chunks_cap && s->nblocks <= s->blocks_cap);
    CHECK(s->used <= (uint64_t)s->nchunks * CHUNK_RECS && s->used <= SLOT_NONE);
    CHECK(s->nfree <= s->used);
    uint32_t slot = s->free_head;
    for (uint32_t k = 0; k < s->nfree; k++) {
        CHECK(slot < s->used);
        const uint8_t *r = rec_at(idx, (kvidx_ref_t)cls << CLASS_SHIFT | slot);
        CHECK(rec_ns(r) == NS_FREE);
        slot = ld32(r + 4);
    }
    CHECK(slot == SLOT_NONE);
    uint32_t nfree = 0;
    for (slot = 0; slot < s->used; slot++) {
        kvidx_ref_t ref = (kvidx_ref_t)cls << CLASS_SHIFT | slot;
        if (rec_ns(rec_at(idx, ref)) == NS_FREE) {
            nfree++;
            continue;
        }
        CHECK_RC(check_record(idx, cls, ref, sum));
    }
    CHECK(nfree == s->nfree);
    return 0;
}

/* The L1 slot after m on the free list, or UINT32_MAX past the table. */
static uint32_t free_next(const kvidx_index_t *idx, uint32_t m)
{
    return m < idx->l1_used ? idx->l1[m].next : UINT32_MAX;
}

/* Whether the first k slots of the L1 free list, already known to be
 * free slots, are distinct. The list is counted, not terminated, so the
 * cycle of its next links (tortoise and hare) is located exactly: a slot
 * repeats among the first k iff the cycle starts at mu, has length lambda
 * and mu + lambda <= k - 1, and then the two meet within k - 1 steps. */
static int free_list_distinct(const kvidx_index_t *idx, uint32_t k)
{
    uint32_t t = idx->l1_free, h = idx->l1_free;
    for (uint32_t i = 1; i < k; i++) {
        t = free_next(idx, t);
        h = free_next(idx, free_next(idx, h));
        if (h == UINT32_MAX)
            return 1; /* the links leave the table: no cycle */
        if (t != h)
            continue;
        uint32_t mu = 0, lambda = 1, p = idx->l1_free;
        for (; p != t; mu++) {
            p = free_next(idx, p);
            t = free_next(idx, t);
        }
        for (h = free_next(idx, p); h != p; lambda++)
            h = free_next(idx, h);
        return (uint64_t)mu + lambda >= k;
    }
    return 1;
}

/* The L1 table: in-use slots name records that name them back; free slots
 * are exactly the l1_nfree on the free list; the LRU ring from slot 0 runs
 * through exactly the copies in the LRU (each link's prev pointing back,
 * which also rules out a repeated slot). */
static int check_l1(const kvidx_index_t *idx, const sums_t *sum)
{
    CHECK(idx->l1_used >= 1 && idx->l1_used <= idx->l1_cap && idx->l1_nfree < idx->l1_used);
    uint64_t in_use = 0;
    for (uint32_t m = 1; m < idx->l1_used; m++) {
        const l1m_t *e = &idx->l1[m];
        if (e->state == KVIDX_L1_NONE)
            continue;
        in_use++;
        CHECK(ref_live(idx, e->ref) && rec_l1(rec_at(idx, e->ref)) == m);
    }
    CHECK(in_use == sum->l1_keys && in_use + idx->l1_nfree + 1 == idx->l1_used);
    uint32_t m = idx->l1_free;
    for (uint32_t k = 0; k < idx->l1_nfree; k++) {
        CHECK(m >= 1 && m < idx->l1_used && idx->l1[m].state == KVIDX_L1_NONE);
        m = idx->l1[m].next;
    }
    CHECK(free_list_distinct(idx, idx->l1_nfree));
    uint32_t prev = 0;
    uint64_t n = 0;
    for (m = idx->l1[0].next; m != 0; m = idx->l1[m].next, n++) {
        CHECK(n < sum->lru_n && m < idx->l1_used);
        const l1m_t *e = &idx->l1[m];
        CHECK(e->in_lru && e->state == KVIDX_L1_READY && e->pins == 0 && e->prev == prev);
        prev = m;
    }
    CHECK(idx->l1[0].prev == prev && n == sum->lru_n);
    return 0;
}

static int check_counters(const kvidx_index_t *idx, const sums_t *sum)
{
    const counters_t *c = &idx->c;
    CHECK(c->keys == sum->keys && c->keys == sum->tree_keys && c->keys == idx->ht_count);
    CHECK(c->l1_keys == sum->l1_keys && c->l1_bytes == sum->l1_bytes);
    CHECK(c->l1_loading == sum->l1_loading);
    CHECK(c->l1_pinned == sum->l1_pinned && c->l1_pins == sum->l1_pins);
    CHECK(c->lru_bytes == sum->lru_bytes);
    CHECK(c->l2_keys == sum->l2_keys && c->l2_bytes == sum->l2_bytes);
    CHECK(c->src_keys == sum->src_keys && c->src_bytes == sum->src_bytes);
    return 0;
}

int kvidx_index_check(const kvidx_index_t *idx)
{
    sums_t sum;
    memset(&sum, 0, sizeof(sum));
    CHECK_RC(check_table(idx));
    CHECK_RC(check_strings(idx));
    CHECK_RC(check_namespaces(idx, &sum));
    CHECK_RC(check_string_users(idx));
    for (unsigned cls = 0; cls < NCLASS; cls++)
        CHECK_RC(check_slab(idx, cls, &sum));
    CHECK_RC(check_l1(idx, &sum));
    CHECK_RC(check_counters(idx, &sum));
    CHECK_RC(ix_check_sources(idx));
    return ix_check_accounts(idx);
}
