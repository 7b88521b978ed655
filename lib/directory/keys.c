/*
 * Key records of the fleet directory: the slabs that hold them, the key
 * table (exact lookup), the ordering treap (canonical order for listings
 * and resumable scans) and the rings of keys sharing a chunk hash.
 *
 * A record lives in the slab of its hash-length class and is named by
 * class << 28 | slot; slabs grow by chunks of 4096 records, so a ref never
 * moves. The bytes of the hash area past hash_len are zero, so hashing a
 * record reads whole words. The treap is ordered by kvidx_key_cmp (the
 * canonical order) and heap-ordered by a priority mixed from the ref, so
 * its shape does not depend on the order keys arrive in. A ring links every
 * key with the same chunk hash (whatever its model, salt, rank or group):
 * the chunk table holds one member of each, every member carries the ring's
 * binding id, and the ring's last key takes the binding with it.
 */
#include "directory_int.h"

#include "../siphash_int.h"

/* ---- hashing ---- */

static size_t pack_words(uint64_t *w, const uint8_t *hash, size_t len)
{
    size_t nw = (len + 7) / 8;
    w[nw - 1] = 0;
    memcpy(w, hash, len);
    return nw;
}

uint64_t dr_key_hash(const kvidx_directory_t *d, uint32_t ns, const kvidx_key_t *k)
{
    uint64_t w[2 + KVIDX_HASH_MAX / 8];
    w[0] = (uint64_t)ns | (uint64_t)k->kv_rank << 32;
    w[1] = (uint64_t)k->group | (uint64_t)k->hash_len << 16;
    size_t nw = pack_words(w + 2, k->hash, k->hash_len);
    return kvidx_siphash_words(d->hkey, w, 2 + nw, 1, 3);
}

uint64_t dr_chunk_hash(const kvidx_directory_t *d, const uint8_t *hash, size_t len)
{
    uint64_t w[1 + KVIDX_HASH_MAX / 8];
    w[0] = (uint64_t)len | UINT64_C(0xc4) << 56;
    size_t nw = pack_words(w + 1, hash, len);
    return kvidx_siphash_words(d->hkey, w, 1 + nw, 1, 3);
}

void dr_key_view(const kvidx_directory_t *d, uint32_t ref, kvidx_key_t *out)
{
    const krec_t *r = K(d, ref);
    const dns_t *ns = &d->ns[r->ns];
    out->model = d->strs[ns->model].s;
    out->model_len = (uint16_t)d->strs[ns->model].len;
    if (ns->salt == NONE) {
        out->salt = "";
        out->salt_len = 0;
    } else {
        out->salt = d->strs[ns->salt].s;
        out->salt_len = (uint8_t)d->strs[ns->salt].len;
    }
    out->hash_len = r->hash_len;
    out->group = r->group;
    out->kv_rank = r->rank;
    memcpy(out->hash, r->hash, r->hash_len);
}

uint64_t dr_key_hash_fn(const kvidx_directory_t *d, uint32_t ref)
{
    kvidx_key_t k;
    const krec_t *r = K(d, ref);
    k.kv_rank = r->rank;
    k.group = r->group;
    k.hash_len = r->hash_len;
    memcpy(k.hash, r->hash, r->hash_len);
    return dr_key_hash(d, r->ns, &k);
}

uint64_t dr_chunk_hash_fn(const kvidx_directory_t *d, uint32_t ref)
{
    const krec_t *r = K(d, ref);
    return dr_chunk_hash(d, r->hash, r->hash_len);
}

/* ---- lookup ---- */

typedef struct key_probe {
    uint32_t ns;
    const kvidx_key_t *k;
} key_probe_t;

static int key_eq(const kvidx_directory_t *d, uint32_t ref, const void *probe)
{
    const key_probe_t *p = probe;
    const krec_t *r = K(d, ref);
    return r->ns == p->ns && r->rank == p->k->kv_rank && r->group == p->k->group &&
           r->hash_len == p->k->hash_len && memcmp(r->hash, p->k->hash, r->hash_len) == 0;
}

uint32_t dr_key_find(const kvidx_directory_t *d, uint32_t ns, const kvidx_key_t *k)
{
    if (ns == NONE)
        return NONE;
    key_probe_t p = {ns, k};
    return dr_tab_find(d, &d->ktab, dr_key_hash(d, ns, k), key_eq, &p);
}

typedef struct chunk_probe {
    const uint8_t *hash;
    size_t len;
} chunk_probe_t;

static int chunk_eq(const kvidx_directory_t *d, uint32_t ref, const void *probe)
{
    const chunk_probe_t *p = probe;
    const krec_t *r = K(d, ref);
    return r->hash_len == p->len && memcmp(r->hash, p->hash, p->len) == 0;
}

uint32_t dr_chunk_find(const kvidx_directory_t *d, const uint8_t *hash, size_t len)
{
    if (len < KVIDX_HASH_MIN || len > KVIDX_HASH_MAX)
        return NONE;
    chunk_probe_t p = {hash, len};
    return dr_tab_find(d, &d->ctab, dr_chunk_hash(d, hash, len), chunk_eq, &p);
}

/* ---- slabs ---- */

static int slab_reserve(kvidx_directory_t *d, kslab_t *s, size_t k)
{
    size_t avail = s->nfree + s->nchunks * CHUNK_RECS - s->used;
    while (avail < k) {
        if ((s->nchunks + 1) * (size_t)CHUNK_RECS > SLOT_MASK)
            return KVIDX_ENOMEM;
        void *arr = s->chunks;
        int rc = dr_grow(d, &arr, &s->chunks_cap, s->nchunks + 1, sizeof(uint8_t *));
        s->chunks = arr;
        if (rc)
            return rc;
        uint8_t *c = dr_alloc(d, (size_t)CHUNK_RECS * s->rec_size);
        if (!c)
            return KVIDX_ENOMEM;
        s->chunks[s->nchunks++] = c;
        avail += CHUNK_RECS;
    }
    return 0;
}

int dr_keys_reserve(kvidx_directory_t *d, const uint32_t *per_class, size_t total)
{
    for (unsigned c = 0; c < NCLASS; c++)
        if (per_class[c] && slab_reserve(d, &d->slabs[c], per_class[c]))
            return KVIDX_ENOMEM;
    if (dr_tab_reserve(d, &d->ktab, d->nkeys + total, dr_key_hash_fn))
        return KVIDX_ENOMEM;
    if (dr_tab_reserve(d, &d->ctab, d->ctab.count + total, dr_chunk_hash_fn))
        return KVIDX_ENOMEM;
    return 0;
}

static uint32_t slab_take(kvidx_directory_t *d, unsigned c)
{
    kslab_t *s = &d->slabs[c];
    uint32_t slot;
    if (s->free_head != NONE) {
        slot = s->free_head;
        uint32_t ref = (uint32_t)c << CLASS_SHIFT | slot;
        s->free_head = K(d, ref)->plist;
        s->nfree--;
    } else {
        slot = s->used++;
    }
    return (uint32_t)c << CLASS_SHIFT | slot;
}

static void slab_put(kvidx_directory_t *d, uint32_t ref)
{
    kslab_t *s = &d->slabs[ref >> CLASS_SHIFT];
    krec_t *r = K(d, ref);
    r->ns = NONE;
    r->plist = s->free_head;
    s->free_head = ref & SLOT_MASK;
    s->nfree++;
}

/* ---- the treap ---- */

uint32_t dr_tree_prio(const kvidx_directory_t *d, uint32_t ref)
{
    uint64_t x = ref ^ d->pseed;
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return (uint32_t)x;
}

int dr_key_cmp_rec(const kvidx_directory_t *d, const kvidx_key_t *k, uint32_t ref)
{
    kvidx_key_t v;
    dr_key_view(d, ref, &v);
    return kvidx_key_cmp(k, &v);
}

static uint32_t rot_right(const kvidx_directory_t *d, uint32_t y)
{
    uint32_t x = K(d, y)->left;
    K(d, y)->left = K(d, x)->right;
    K(d, x)->right = y;
    return x;
}

static uint32_t rot_left(const kvidx_directory_t *d, uint32_t x)
{
    uint32_t y = K(d, x)->right;
    K(d, x)->right = K(d, y)->left;
    K(d, y)->left = x;
    return y;
}

static uint32_t t_insert(const kvidx_directory_t *d, uint32_t root, uint32_t x,
                         const kvidx_key_t *kx)
{
    if (root == NONE)
        return x;
    krec_t *r = K(d, root);
    if (dr_key_cmp_rec(d, kx, root) < 0) {
        r->left = t_insert(d, r->left, x, kx);
        if (dr_tree_prio(d, r->left) > dr_tree_prio(d, root))
            root = rot_right(d, root);
    } else {
        r->right = t_insert(d, r->right, x, kx);
        if (dr_tree_prio(d, r->right) > dr_tree_prio(d, root))
            root = rot_left(d, root);
    }
    return root;
}

static uint32_t t_merge(const kvidx_directory_t *d, uint32_t a, uint32_t b)
{
    if (a == NONE)
        return b;
    if (b == NONE)
        return a;
    if (dr_tree_prio(d, a) > dr_tree_prio(d, b)) {
        K(d, a)->right = t_merge(d, K(d, a)->right, b);
        return a;
    }
    K(d, b)->left = t_merge(d, a, K(d, b)->left);
    return b;
}

static uint32_t t_remove(const kvidx_directory_t *d, uint32_t root, uint32_t x,
                         const kvidx_key_t *kx)
{
    if (root == x)
        return t_merge(d, K(d, x)->left, K(d, x)->right);
    krec_t *r = K(d, root);
    if (dr_key_cmp_rec(d, kx, root) < 0)
        r->left = t_remove(d, r->left, x, kx);
    else
        r->right = t_remove(d, r->right, x, kx);
    return root;
}

uint32_t dr_tree_seek(const kvidx_directory_t *d, const kvidx_key_t *k, int strict)
{
    uint32_t best = NONE, n = d->root;
    while (n != NONE) {
        int c = k ? dr_key_cmp_rec(d, k, n) : -1;
        if (strict ? c < 0 : c <= 0) {
            best = n;
            n = K(d, n)->left;
        } else {
            n = K(d, n)->right;
        }
    }
    return best;
}

/* The iterator keeps the path of pending ancestors; past the stack's
 * depth (never seen with the treap's random shape, but possible) it falls
 * back to one seek per step. */
static int it_push(tree_iter_t *it, uint32_t n)
{
    if (it->depth == sizeof(it->stack) / sizeof(it->stack[0]))
        return -1;
    it->stack[it->depth++] = n;
    return 0;
}

void dr_tree_iter_start(const kvidx_directory_t *d, tree_iter_t *it, const kvidx_key_t *k,
                        int strict)
{
    it->depth = 0;
    it->overflow = 0;
    it->cur = NONE;
    for (uint32_t n = d->root; n != NONE;) {
        int c = k ? dr_key_cmp_rec(d, k, n) : -1;
        if (strict ? c < 0 : c <= 0) {
            if (it_push(it, n)) {
                it->overflow = 1;
                it->cur = dr_tree_seek(d, k, strict);
                return;
            }
            n = K(d, n)->left;
        } else {
            n = K(d, n)->right;
        }
    }
}

uint32_t dr_tree_iter_next(const kvidx_directory_t *d, tree_iter_t *it)
{
    if (it->overflow) {
        uint32_t r = it->cur;
        if (r != NONE) {
            kvidx_key_t v;
            dr_key_view(d, r, &v);
            it->cur = dr_tree_seek(d, &v, 1);
        }
        return r;
    }
    if (it->depth == 0)
        return NONE;
    uint32_t r = it->stack[--it->depth];
    for (uint32_t n = K(d, r)->right; n != NONE; n = K(d, n)->left) {
        if (it_push(it, n)) {
            kvidx_key_t v;
            dr_key_view(d, r, &v);
            it->overflow = 1;
            it->cur = dr_tree_seek(d, &v, 1);
            break;
        }
    }
    return r;
}

/* ---- create and forget ---- */

uint32_t dr_key_create(kvidx_directory_t *d, uint32_t ns, const kvidx_key_t *k)
{
    unsigned c = hash_class(k->hash_len);
    uint32_t ref = slab_take(d, c);
    krec_t *r = K(d, ref);
    r->ns = ns;
    d->ns[ns].refs++;
    r->rank = k->kv_rank;
    r->group = k->group;
    r->hash_len = k->hash_len;
    r->pad_ = 0;
    r->plist = NONE;
    r->left = r->right = NONE;
    r->last_access = 0.0;
    memset(r->hash, 0, 8 * (c + 1));
    memcpy(r->hash, k->hash, k->hash_len);
    dr_tab_insert(&d->ktab, ref, dr_key_hash(d, ns, k));
    d->root = t_insert(d, d->root, ref, k);
    uint32_t rep = dr_chunk_find(d, k->hash, k->hash_len);
    if (rep != NONE) {
        r->ring = K(d, rep)->ring;
        K(d, rep)->ring = ref;
        r->bind = K(d, rep)->bind;
    } else {
        r->ring = ref;
        r->bind = NONE;
        dr_tab_insert(&d->ctab, ref, dr_chunk_hash(d, k->hash, k->hash_len));
    }
    d->nkeys++;
    return ref;
}

void dr_key_forget(kvidx_directory_t *d, uint32_t ref)
{
    krec_t *r = K(d, ref);
    kvidx_key_t v;
    dr_key_view(d, ref, &v);
    d->root = t_remove(d, d->root, ref, &v);
    dr_tab_remove(d, &d->ktab, ref, dr_key_hash(d, r->ns, &v), dr_key_hash_fn);
    uint64_t ch = dr_chunk_hash(d, r->hash, r->hash_len);
    if (r->ring == ref) {
        if (r->bind != NONE)
            dr_bind_drop(d, r->bind);
        dr_tab_remove(d, &d->ctab, ref, ch, dr_chunk_hash_fn);
    } else {
        uint32_t pred = r->ring;
        while (K(d, pred)->ring != ref)
            pred = K(d, pred)->ring;
        K(d, pred)->ring = r->ring;
        if (dr_chunk_find(d, r->hash, r->hash_len) == ref)
            dr_tab_replace(&d->ctab, ref, ch, pred);
        if (r->bind != NONE && d->binds[r->bind]->rep == ref)
            d->binds[r->bind]->rep = pred;
    }
    dr_ns_unref(d, r->ns);
    slab_put(d, ref);
    d->nkeys--;
}
