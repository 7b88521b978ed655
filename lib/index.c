/*
 * The in-memory key index (SPEC §2, §3.1, §3.2; layout in docs/index.md).
 *
 * Every key is one fixed-size record in a slab of its hash-length class
 * (hash lengths rounded up to a multiple of 8 bytes: 8 classes). A record is
 * named by a 32-bit ref = class << 29 | slot; slabs grow by chunks of 4096
 * records, so a ref never moves. A record holds, packed and unaligned:
 *
 *   off  0  u32  namespace id (NS_FREE on a free record)
 *   off  4  u32  kv_rank (next free slot on a free record)
 *   off  8  u32  L1 metadata index (0 = no L1 copy)
 *   off 12  u16  object_group_id
 *   off 14  u8   hash_len (bits 0..6) | L2 present (bit 7)
 *   off 15  u40  size_bytes - 1, little endian
 *   off 20  u8[8 * (class + 1)] hash bytes
 *
 * so a key with a 32-byte hash costs 52 bytes of record. Model names and
 * salts are interned once (refcounted by the namespaces that use them); a
 * namespace is one interned (cache_salt, model_name) pair with its own
 * B+tree of refs ordered by (kv_rank, object_group_id, hash bytes, shorter
 * first). Namespaces sit in an array sorted by (salt, model), so the SPEC
 * §3.2 order is "namespaces in order, each tree in order" and a salt or
 * model filter is a range of namespaces. Exact lookup is an open-addressing
 * table of refs with a tag byte each (linear probing, backward-shift
 * deletion, load <= 0.8) hashed with keyed SipHash-1-3 (split in a chunk
 * part and a rank part, see tk_hash). L1 copies live in a separate table of
 * metadata (state, pins, temporary, generation, LRU links), allocated only
 * for keys that have one; slot 0 of that table is the LRU list head.
 *
 * Invariants: every live record is in exactly one tree and in the table;
 * a key has an L1 copy or an L2 copy (else it is forgotten at once); an L1
 * copy is in the LRU list exactly when it is ready and unpinned, and
 * lru_bytes is the sum of their sizes; B+tree leaves are never empty, and
 * separators in inner nodes are copies of keys (never refs), so deleting a
 * record never leaves a dangling separator. Every mutation either completes
 * or, on KVIDX_ENOMEM, is undone before returning; eviction and deletion
 * never allocate.
 */
#include "kvidx/index.h"
#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/siphash.h"

#include <sodium.h>
#include <string.h>

/* ---- small helpers ---- */

#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void st32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline void st16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, 2);
}

/* Equality of two hashes of n bytes: word compares, inlined (a memcmp call
 * cost a lookup more than the compare itself). */
static inline int hash_eq(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint64_t diff = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        diff |= x ^ y;
    }
    for (; i < n; i++)
        diff |= (uint64_t)(a[i] ^ b[i]);
    return diff == 0;
}

static int bytes_cmp(const void *a, size_t an, const void *b, size_t bn)
{
    size_t n = an < bn ? an : bn;
    int c = n ? memcmp(a, b, n) : 0;
    if (c != 0)
        return c;
    return an < bn ? -1 : an > bn ? 1 : 0;
}

/* ---- records ---- */

#define NCLASS      8
#define CLASS_SHIFT 29
#define SLOT_MASK   ((UINT32_C(1) << CLASS_SHIFT) - 1)
#define SLOT_NONE   SLOT_MASK /* never handed out: keeps KVIDX_REF_NONE unused */
#define CHUNK_SHIFT 12
#define CHUNK_RECS  (UINT32_C(1) << CHUNK_SHIFT)
#define REC_HDR     20
#define NS_FREE     UINT32_MAX
#define L2_BIT      0x80

typedef struct slab {
    uint8_t **chunks;
    uint32_t nchunks, chunks_cap;
    uint8_t **blocks; /* chunks are carved from a few large blocks */
    uint32_t nblocks, blocks_cap;
    uint32_t used;      /* slots handed out by bumping */
    uint32_t free_head; /* SLOT_NONE when empty */
    uint32_t nfree;
    uint32_t rec_size;
} slab_t;

/* ---- interned names and namespaces ---- */

typedef struct istr {
    uint32_t refs;
    uint16_t len;
    char s[];
} istr_t;

typedef struct ns {
    istr_t *salt, *model;
    uint64_t nkeys;
    void *root;      /* leaf_t when height == 0, inner_t otherwise; NULL if empty */
    uint32_t height; /* number of inner levels */
    uint32_t id;
    struct leaf *first;
} ns_t;

typedef struct ns_slot {
    ns_t *ns;
    uint32_t next_free;
} ns_slot_t;

/* ---- B+tree ---- */

#define LEAF_CAP  126
#define INNER_CAP 64
#define MAXH      48 /* no rebalancing on delete: allow generous heights */

typedef struct leaf {
    struct leaf *prev, *next;
    uint32_t n;
    uint32_t refs[LEAF_CAP];
} leaf_t;

/* A separator: a copy of a key's in-namespace part. */
typedef struct skey {
    uint32_t rank;
    uint16_t group;
    uint8_t hash_len;
    uint8_t hash[KVIDX_HASH_MAX];
} skey_t;

typedef struct inner {
    uint32_t n; /* children */
    skey_t sep[INNER_CAP - 1];
    void *child[INNER_CAP];
} inner_t;

/* A search key: the in-namespace part of a key, viewing caller memory. */
typedef struct tkey {
    uint32_t rank;
    uint16_t group;
    uint8_t hash_len;
    const uint8_t *hash;
} tkey_t;

/* ---- L1 metadata ---- */

typedef struct l1m {
    uint32_t ref;
    uint32_t prev, next; /* LRU links (slot 0 is the list head), or free list */
    uint32_t pins;
    uint64_t gen;
    uint8_t state; /* KVIDX_L1_*; KVIDX_L1_NONE on a free slot */
    uint8_t temporary;
    uint8_t in_lru;
} l1m_t;

typedef struct counters {
    uint64_t keys, l1_keys, l1_bytes, l1_loading, l1_pinned, l1_pins, lru_bytes;
    uint64_t l2_keys, l2_bytes, evictions;
} counters_t;

struct kvidx_index {
    uint8_t hkey[crypto_shorthash_KEYBYTES];
    slab_t slabs[NCLASS];

    uint32_t *ht;
    uint8_t *ht_tag; /* per slot: the top byte of its key's hash */
    size_t ht_cap;   /* power of two, or 0 */
    size_t ht_count;

    istr_t **strs; /* sorted by bytes */
    size_t nstrs, strs_cap;

    ns_t **ns_sorted; /* sorted by (salt, model) */
    size_t n_ns, ns_sorted_cap;
    ns_slot_t *ns_ids;
    uint32_t ns_ids_n, ns_ids_cap, ns_free;

    l1m_t *l1;
    uint32_t l1_used, l1_cap, l1_free, l1_nfree;
    uint64_t gen_next;

    leaf_t *spare_leaf;
    inner_t *spare_inner[MAXH + 1];
    uint32_t nspare_inner;

    counters_t c;
    uint64_t l1_capacity, l2_capacity;
    kvidx_evict_cb on_evict;
    void *on_evict_ctx;
    kvidx_change_cb on_change;
    void *on_change_ctx;

    void *scratch;
    size_t scratch_cap;
};

static inline uint8_t *rec_at(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    const slab_t *s = &idx->slabs[ref >> CLASS_SHIFT];
    uint32_t slot = ref & SLOT_MASK;
    return s->chunks[slot >> CHUNK_SHIFT] + (size_t)(slot & (CHUNK_RECS - 1)) * s->rec_size;
}

static inline uint32_t rec_ns(const uint8_t *r)
{
    return ld32(r);
}
static inline uint32_t rec_rank(const uint8_t *r)
{
    return ld32(r + 4);
}
static inline uint32_t rec_l1(const uint8_t *r)
{
    return ld32(r + 8);
}
static inline uint16_t rec_group(const uint8_t *r)
{
    return ld16(r + 12);
}
static inline uint8_t rec_hl(const uint8_t *r)
{
    return r[14] & 0x7f;
}
static inline int rec_l2(const uint8_t *r)
{
    return (r[14] & L2_BIT) != 0;
}
static inline const uint8_t *rec_hash(const uint8_t *r)
{
    return r + REC_HDR;
}
static inline uint64_t rec_size(const uint8_t *r)
{
    uint64_t v = 0;
    for (int i = 4; i >= 0; i--)
        v = v << 8 | r[15 + i];
    return v + 1;
}
static inline void rec_set_size(uint8_t *r, uint64_t size)
{
    uint64_t v = size - 1;
    for (int i = 0; i < 5; i++, v >>= 8)
        r[15 + i] = (uint8_t)v;
}
static inline void rec_set_l2(uint8_t *r, int on)
{
    r[14] = (uint8_t)(on ? r[14] | L2_BIT : r[14] & ~L2_BIT);
}

static inline tkey_t rec_tkey(const uint8_t *r)
{
    tkey_t t = {rec_rank(r), rec_group(r), rec_hl(r), rec_hash(r)};
    return t;
}

static inline unsigned hash_class(uint8_t hash_len)
{
    return (unsigned)(hash_len - 1) / 8;
}

static int ref_live(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    unsigned cls = ref >> CLASS_SHIFT;
    uint32_t slot = ref & SLOT_MASK;
    if (cls >= NCLASS || slot >= idx->slabs[cls].used)
        return 0;
    return rec_ns(rec_at(idx, ref)) != NS_FREE;
}

/* Grows an array of pointers to hold want entries. */
static int ptrs_reserve(uint8_t ***a, uint32_t *cap, uint32_t want)
{
    if (want <= *cap)
        return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < want)
        c *= 2;
    uint8_t **n = kvidx_realloc(*a, (size_t)c * sizeof(*n));
    if (!n)
        return KVIDX_ENOMEM;
    *a = n;
    *cap = c;
    return 0;
}

/* Makes sure k more records of class cls can be taken without allocating.
 * Chunks come in blocks that double with the slab (up to 64 chunks, 7-21
 * MiB), so a big index is a few dozen huge-page-backed blocks instead of
 * thousands of small mappings. */
static int slab_reserve(slab_t *s, uint64_t k)
{
    uint64_t room = (uint64_t)s->nchunks * CHUNK_RECS - s->used + s->nfree;
    if (room >= k)
        return 0;
    uint64_t need = (k - room + CHUNK_RECS - 1) / CHUNK_RECS;
    uint64_t limit = SLOT_MASK >> CHUNK_SHIFT;
    if ((uint64_t)s->nchunks + need > limit)
        return KVIDX_ECAPACITY; /* 2^29 - 1 keys of one hash-length class */
    uint64_t grow = s->nchunks < 64 ? s->nchunks : 64;
    if (grow < need || s->nchunks + grow > limit)
        grow = need;
    if (ptrs_reserve(&s->chunks, &s->chunks_cap, s->nchunks + (uint32_t)grow) ||
        ptrs_reserve(&s->blocks, &s->blocks_cap, s->nblocks + 1))
        return KVIDX_ENOMEM;
    size_t chunk_bytes = (size_t)CHUNK_RECS * s->rec_size;
    uint8_t *block = kvidx_malloc_large((size_t)grow * chunk_bytes);
    if (!block && grow > need) {
        grow = need;
        block = kvidx_malloc_large((size_t)grow * chunk_bytes);
    }
    if (!block)
        return KVIDX_ENOMEM;
    s->blocks[s->nblocks++] = block;
    for (uint64_t i = 0; i < grow; i++)
        s->chunks[s->nchunks++] = block + i * chunk_bytes;
    return 0;
}

/* Takes a record slot; slab_reserve must have made room. */
static kvidx_ref_t rec_take(kvidx_index_t *idx, unsigned cls)
{
    slab_t *s = &idx->slabs[cls];
    uint32_t slot;
    if (s->nfree) {
        slot = s->free_head;
        uint8_t *r = rec_at(idx, (kvidx_ref_t)cls << CLASS_SHIFT | slot);
        s->free_head = ld32(r + 4);
        s->nfree--;
    } else {
        slot = s->used++;
    }
    return (kvidx_ref_t)cls << CLASS_SHIFT | slot;
}

/* Takes a record and writes key k of namespace ns into it, with size
 * bytes, no L1 copy and no L2 copy yet; slab_reserve must have made room. */
static kvidx_ref_t rec_new(kvidx_index_t *idx, const ns_t *ns, const kvidx_key_t *k, uint64_t size)
{
    kvidx_ref_t ref = rec_take(idx, hash_class(k->hash_len));
    uint8_t *r = rec_at(idx, ref);
    st32(r, ns->id);
    st32(r + 4, k->kv_rank);
    st32(r + 8, 0);
    st16(r + 12, k->group);
    r[14] = k->hash_len;
    rec_set_size(r, size);
    memcpy(r + REC_HDR, k->hash, k->hash_len);
    return ref;
}

static void rec_release(kvidx_index_t *idx, kvidx_ref_t ref)
{
    slab_t *s = &idx->slabs[ref >> CLASS_SHIFT];
    uint8_t *r = rec_at(idx, ref);
    st32(r, NS_FREE);
    st32(r + 4, s->free_head);
    st32(r + 8, 0);
    s->free_head = ref & SLOT_MASK;
    s->nfree++;
}

/* ---- keyed hash ---- */

static uint64_t sip(const kvidx_index_t *idx, const uint8_t *in, size_t n)
{
    unsigned char out[crypto_shorthash_BYTES];
    crypto_shorthash(out, in, n, idx->hkey);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | out[i];
    return v;
}

/* The table hash of a key is A(namespace, group, hash bytes) ^ B(kv_rank),
 * both keyed SipHash (different input lengths keep them apart). The split
 * lets a batch reuse A across the ranks of one chunk (an ipc request names
 * every chunk once per rank, consecutively) and B across the chunks of one
 * rank; both parts are pseudo-random functions of the secret key, so an
 * attacker still cannot predict which keys share a probe run. */
/* A's message is whole words: namespace, group and hash length, then the
 * hash bytes zero-padded to a word. A hash is always readable up to its
 * next multiple of 8 bytes (a kvidx_key_t's 64-byte array, a separator's,
 * or a record's slot of its length class), so it is read a word at a
 * time and the last word masked. */
static uint64_t hash_a(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t)
{
    uint64_t w[1 + KVIDX_HASH_MAX / 8];
    w[0] = (uint64_t)ns_id | (uint64_t)t->group << 32 | (uint64_t)t->hash_len << 48;
    size_t nw = ((size_t)t->hash_len + 7) / 8;
    for (size_t i = 0; i < nw; i++)
        w[1 + i] = kvidx_le64(t->hash + 8 * i);
    if (t->hash_len % 8)
        w[nw] &= (UINT64_C(1) << (8 * (t->hash_len % 8))) - 1;
    return kvidx_siphash_words(idx->hkey, w, 1 + nw, 1, 3);
}

static uint64_t hash_b(const kvidx_index_t *idx, uint32_t rank)
{
    uint64_t w = rank;
    return kvidx_siphash_words(idx->hkey, &w, 1, 1, 3);
}

static uint64_t tk_hash(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t)
{
    return hash_a(idx, ns_id, t) ^ hash_b(idx, t->rank);
}

/* Reuses the parts of tk_hash across the keys of one batch: A of the last
 * (namespace, group, hash), B of the last 8 ranks (direct-mapped on the
 * rank's low 3 bits, the low bits of the worker's local rank in a packed
 * kv_rank). */
typedef struct hcache {
    int a_valid;
    uint32_t ns_id;
    uint16_t group;
    uint8_t hash_len;
    uint8_t hash[KVIDX_HASH_MAX];
    uint64_t a;
    uint8_t b_valid;
    uint32_t rank[8];
    uint64_t b[8];
} hcache_t;

static uint64_t tk_hash_cached(const kvidx_index_t *idx, hcache_t *c, uint32_t ns_id,
                               const tkey_t *t)
{
    if (!c->a_valid || c->ns_id != ns_id || c->group != t->group || c->hash_len != t->hash_len ||
        !hash_eq(c->hash, t->hash, t->hash_len)) {
        c->a = hash_a(idx, ns_id, t);
        c->a_valid = 1;
        c->ns_id = ns_id;
        c->group = t->group;
        c->hash_len = t->hash_len;
        memcpy(c->hash, t->hash, t->hash_len);
    }
    unsigned slot = t->rank & 7;
    if (!(c->b_valid & (1u << slot)) || c->rank[slot] != t->rank) {
        c->b[slot] = hash_b(idx, t->rank);
        c->rank[slot] = t->rank;
        c->b_valid |= (uint8_t)(1u << slot);
    }
    return c->a ^ c->b[slot];
}

static uint64_t ref_hash(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    const uint8_t *r = rec_at(idx, ref);
    tkey_t t = rec_tkey(r);
    return tk_hash(idx, rec_ns(r), &t);
}

uint64_t kvidx_index_key_hash64(const kvidx_index_t *idx, const kvidx_key_t *k)
{
    uint8_t buf[2 + KVIDX_SALT_MAX + 2 + KVIDX_MODEL_MAX + 4 + 2 + 1 + KVIDX_HASH_MAX];
    size_t sl = k->salt_len > KVIDX_SALT_MAX ? KVIDX_SALT_MAX : k->salt_len;
    size_t ml = k->model_len > KVIDX_MODEL_MAX ? KVIDX_MODEL_MAX : k->model_len;
    size_t hl = k->hash_len > KVIDX_HASH_MAX ? KVIDX_HASH_MAX : k->hash_len;
    size_t n = 0;
    st16(buf + n, (uint16_t)sl);
    n += 2;
    if (sl)
        memcpy(buf + n, k->salt, sl);
    n += sl;
    st16(buf + n, (uint16_t)ml);
    n += 2;
    if (ml)
        memcpy(buf + n, k->model, ml);
    n += ml;
    st32(buf + n, k->kv_rank);
    n += 4;
    st16(buf + n, k->group);
    n += 2;
    buf[n++] = (uint8_t)hl;
    memcpy(buf + n, k->hash, hl);
    n += hl;
    return sip(idx, buf, n);
}

/* ---- comparisons ---- */

static int tk_cmp(const tkey_t *a, const tkey_t *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    return bytes_cmp(a->hash, a->hash_len, b->hash, b->hash_len);
}

static int tk_cmp_rec(const tkey_t *a, const uint8_t *r)
{
    tkey_t b = rec_tkey(r);
    return tk_cmp(a, &b);
}

static int tk_cmp_sep(const tkey_t *a, const skey_t *s)
{
    tkey_t b = {s->rank, s->group, s->hash_len, s->hash};
    return tk_cmp(a, &b);
}

static void sep_from_rec(skey_t *s, const uint8_t *r)
{
    s->rank = rec_rank(r);
    s->group = rec_group(r);
    s->hash_len = rec_hl(r);
    memcpy(s->hash, rec_hash(r), s->hash_len);
}

/* ---- hash table ---- */

/* Each slot keeps a byte of its key's hash beside the ref, so a probe reads
 * a record (a cache miss) only when that byte matches: 1 in 256 of the
 * other keys of a probe run instead of all of them. */
static inline uint8_t h_tag(uint64_t h)
{
    return (uint8_t)(h >> 56);
}

static int ht_reserve(kvidx_index_t *idx, size_t extra)
{
    size_t want = idx->ht_count + extra;
    size_t cap = idx->ht_cap ? idx->ht_cap : 1024;
    while (want > cap / 5 * 4) {
        if (cap > SIZE_MAX / 8)
            return KVIDX_ENOMEM;
        cap *= 2;
    }
    if (cap == idx->ht_cap)
        return 0;
    uint32_t *t = kvidx_malloc_large(cap * sizeof(*t));
    uint8_t *tg = kvidx_malloc_large(cap);
    if (!t || !tg) {
        kvidx_free(t);
        kvidx_free(tg);
        return KVIDX_ENOMEM;
    }
    memset(t, 0xff, cap * sizeof(*t));
    memset(tg, 0, cap);
    size_t mask = cap - 1;
    for (size_t i = 0; i < idx->ht_cap; i++) {
        uint32_t ref = idx->ht[i];
        if (ref == KVIDX_REF_NONE)
            continue;
        uint64_t h = ref_hash(idx, ref);
        size_t j = (size_t)h & mask;
        while (t[j] != KVIDX_REF_NONE)
            j = (j + 1) & mask;
        t[j] = ref;
        tg[j] = h_tag(h);
    }
    kvidx_free(idx->ht);
    kvidx_free(idx->ht_tag);
    idx->ht = t;
    idx->ht_tag = tg;
    idx->ht_cap = cap;
    return 0;
}

static kvidx_ref_t ht_find_h(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t, uint64_t h)
{
    if (!idx->ht_cap)
        return KVIDX_REF_NONE;
    size_t mask = idx->ht_cap - 1;
    size_t j = (size_t)h & mask;
    uint8_t tag = h_tag(h);
    for (;;) {
        uint32_t ref = idx->ht[j];
        if (ref == KVIDX_REF_NONE)
            return KVIDX_REF_NONE;
        if (idx->ht_tag[j] == tag) {
            const uint8_t *r = rec_at(idx, ref);
            if (rec_ns(r) == ns_id && rec_rank(r) == t->rank && rec_group(r) == t->group &&
                rec_hl(r) == t->hash_len && hash_eq(rec_hash(r), t->hash, t->hash_len))
                return ref;
        }
        j = (j + 1) & mask;
    }
}

static kvidx_ref_t ht_find(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t)
{
    return ht_find_h(idx, ns_id, t, tk_hash(idx, ns_id, t));
}

/* Inserts a ref known to be absent, whose hash is h; ht_reserve must have
 * made room. */
static void ht_insert(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t h)
{
    size_t mask = idx->ht_cap - 1;
    size_t j = (size_t)h & mask;
    while (idx->ht[j] != KVIDX_REF_NONE)
        j = (j + 1) & mask;
    idx->ht[j] = ref;
    idx->ht_tag[j] = h_tag(h);
    idx->ht_count++;
}

/* Removes a ref (its record must still be intact), shifting the rest of the
 * probe run back so that lookups never need tombstones. */
static void ht_remove(kvidx_index_t *idx, kvidx_ref_t ref)
{
    size_t mask = idx->ht_cap - 1;
    size_t i = (size_t)ref_hash(idx, ref) & mask;
    while (idx->ht[i] != ref)
        i = (i + 1) & mask;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint32_t r = idx->ht[j];
        if (r == KVIDX_REF_NONE)
            break;
        size_t home = (size_t)ref_hash(idx, r) & mask;
        /* r may move to i only if its home is not in (i, j] cyclically. */
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            idx->ht[i] = r;
            idx->ht_tag[i] = idx->ht_tag[j];
            i = j;
        }
    }
    idx->ht[i] = KVIDX_REF_NONE;
    idx->ht_count--;
}

/* ---- interned names ---- */

static size_t str_lower_bound(const kvidx_index_t *idx, const char *s, size_t n)
{
    size_t lo = 0, hi = idx->nstrs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bytes_cmp(idx->strs[mid]->s, idx->strs[mid]->len, s, n) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Interns s (taking one reference) or fails with KVIDX_ENOMEM. */
static int str_get(kvidx_index_t *idx, const char *s, size_t n, istr_t **out)
{
    size_t i = str_lower_bound(idx, s, n);
    if (i < idx->nstrs && bytes_cmp(idx->strs[i]->s, idx->strs[i]->len, s, n) == 0) {
        idx->strs[i]->refs++;
        *out = idx->strs[i];
        return 0;
    }
    if (idx->nstrs == idx->strs_cap) {
        size_t cap = idx->strs_cap ? idx->strs_cap * 2 : 8;
        istr_t **a = kvidx_realloc(idx->strs, cap * sizeof(*a));
        if (!a)
            return KVIDX_ENOMEM;
        idx->strs = a;
        idx->strs_cap = cap;
    }
    istr_t *str = kvidx_malloc(sizeof(*str) + n + 1);
    if (!str)
        return KVIDX_ENOMEM;
    str->refs = 1;
    str->len = (uint16_t)n;
    if (n)
        memcpy(str->s, s, n);
    str->s[n] = '\0';
    memmove(idx->strs + i + 1, idx->strs + i, (idx->nstrs - i) * sizeof(*idx->strs));
    idx->strs[i] = str;
    idx->nstrs++;
    *out = str;
    return 0;
}

static void str_put(kvidx_index_t *idx, istr_t *str)
{
    if (--str->refs)
        return;
    size_t i = str_lower_bound(idx, str->s, str->len);
    memmove(idx->strs + i, idx->strs + i + 1, (idx->nstrs - i - 1) * sizeof(*idx->strs));
    idx->nstrs--;
    kvidx_free(str);
}

/* ---- namespaces ---- */

static int ns_cmp(const ns_t *ns, const char *salt, size_t sl, const char *model, size_t ml)
{
    int c = bytes_cmp(ns->salt->s, ns->salt->len, salt, sl);
    if (c)
        return c;
    return bytes_cmp(ns->model->s, ns->model->len, model, ml);
}

/* First namespace >= (salt, model) in the sorted array. */
static size_t ns_lower_bound(const kvidx_index_t *idx, const char *salt, size_t sl,
                             const char *model, size_t ml)
{
    size_t lo = 0, hi = idx->n_ns;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ns_cmp(idx->ns_sorted[mid], salt, sl, model, ml) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static ns_t *ns_find(const kvidx_index_t *idx, const kvidx_key_t *k)
{
    size_t i = ns_lower_bound(idx, k->salt, k->salt_len, k->model, k->model_len);
    if (i < idx->n_ns &&
        ns_cmp(idx->ns_sorted[i], k->salt, k->salt_len, k->model, k->model_len) == 0)
        return idx->ns_sorted[i];
    return NULL;
}

/* Finds or creates the namespace of k. A namespace created here has no
 * keys; ns_drop_if_empty undoes it. */
static int ns_get(kvidx_index_t *idx, const kvidx_key_t *k, ns_t **out)
{
    size_t i = ns_lower_bound(idx, k->salt, k->salt_len, k->model, k->model_len);
    if (i < idx->n_ns &&
        ns_cmp(idx->ns_sorted[i], k->salt, k->salt_len, k->model, k->model_len) == 0) {
        *out = idx->ns_sorted[i];
        return 0;
    }
    if (idx->n_ns == idx->ns_sorted_cap) {
        size_t cap = idx->ns_sorted_cap ? idx->ns_sorted_cap * 2 : 8;
        ns_t **a = kvidx_realloc(idx->ns_sorted, cap * sizeof(*a));
        if (!a)
            return KVIDX_ENOMEM;
        idx->ns_sorted = a;
        idx->ns_sorted_cap = cap;
    }
    if (idx->ns_free == UINT32_MAX && idx->ns_ids_n == idx->ns_ids_cap) {
        if (idx->ns_ids_cap >= UINT32_MAX / 4)
            return KVIDX_ECAPACITY;
        uint32_t cap = idx->ns_ids_cap ? idx->ns_ids_cap * 2 : 8;
        ns_slot_t *a = kvidx_realloc(idx->ns_ids, (size_t)cap * sizeof(*a));
        if (!a)
            return KVIDX_ENOMEM;
        idx->ns_ids = a;
        idx->ns_ids_cap = cap;
    }
    ns_t *ns = kvidx_calloc(1, sizeof(*ns));
    if (!ns)
        return KVIDX_ENOMEM;
    int rc = str_get(idx, k->salt, k->salt_len, &ns->salt);
    if (rc) {
        kvidx_free(ns);
        return rc;
    }
    rc = str_get(idx, k->model, k->model_len, &ns->model);
    if (rc) {
        str_put(idx, ns->salt);
        kvidx_free(ns);
        return rc;
    }
    uint32_t id;
    if (idx->ns_free != UINT32_MAX) {
        id = idx->ns_free;
        idx->ns_free = idx->ns_ids[id].next_free;
    } else {
        id = idx->ns_ids_n++;
    }
    idx->ns_ids[id].ns = ns;
    ns->id = id;
    memmove(idx->ns_sorted + i + 1, idx->ns_sorted + i, (idx->n_ns - i) * sizeof(ns_t *));
    idx->ns_sorted[i] = ns;
    idx->n_ns++;
    *out = ns;
    return 0;
}

static void ns_drop_if_empty(kvidx_index_t *idx, ns_t *ns)
{
    if (ns->nkeys)
        return;
    size_t i = ns_lower_bound(idx, ns->salt->s, ns->salt->len, ns->model->s, ns->model->len);
    memmove(idx->ns_sorted + i, idx->ns_sorted + i + 1, (idx->n_ns - i - 1) * sizeof(ns_t *));
    idx->n_ns--;
    idx->ns_ids[ns->id].ns = NULL;
    idx->ns_ids[ns->id].next_free = idx->ns_free;
    idx->ns_free = ns->id;
    str_put(idx, ns->salt);
    str_put(idx, ns->model);
    kvidx_free(ns);
}

/* ---- B+tree ---- */

/* Number of separators <= t: the child to descend into. */
static uint32_t inner_pick(const inner_t *in, const tkey_t *t)
{
    uint32_t lo = 0, hi = in->n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (tk_cmp_sep(t, &in->sep[mid]) >= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* First position in the leaf whose key is > t (strict) or >= t. */
static uint32_t leaf_pos(const kvidx_index_t *idx, const leaf_t *l, const tkey_t *t, int strict)
{
    uint32_t lo = 0, hi = l->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        int c = tk_cmp_rec(t, rec_at(idx, l->refs[mid]));
        if (c > 0 || (strict && c == 0))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Makes sure one insert into ns can allocate nothing: one leaf and
 * height + 1 inner nodes in reserve. */
static int tree_prepare(kvidx_index_t *idx, const ns_t *ns)
{
    if (!idx->spare_leaf) {
        idx->spare_leaf = kvidx_malloc(sizeof(leaf_t));
        if (!idx->spare_leaf)
            return KVIDX_ENOMEM;
    }
    uint32_t need = ns->height + 1;
    if (need > MAXH)
        return KVIDX_ECAPACITY;
    while (idx->nspare_inner < need) {
        inner_t *in = kvidx_malloc(sizeof(inner_t));
        if (!in)
            return KVIDX_ENOMEM;
        idx->spare_inner[idx->nspare_inner++] = in;
    }
    return 0;
}

static leaf_t *take_leaf(kvidx_index_t *idx)
{
    leaf_t *l = idx->spare_leaf;
    idx->spare_leaf = NULL;
    return l;
}

static inner_t *take_inner(kvidx_index_t *idx)
{
    return idx->spare_inner[--idx->nspare_inner];
}

/* Inserts (sep, child) as child number pos of the inner node at level d of
 * the path, splitting upward as needed. */
static void inner_insert(kvidx_index_t *idx, ns_t *ns, inner_t **path, uint32_t *pidx, int d,
                         const skey_t *sep, void *child)
{
    skey_t up;
    for (;; d--) {
        inner_t *in = path[d];
        uint32_t pos = pidx[d] + 1;
        if (in->n < INNER_CAP) {
            memmove(&in->sep[pos], &in->sep[pos - 1], (in->n - pos) * sizeof(skey_t));
            memmove(&in->child[pos + 1], &in->child[pos], (in->n - pos) * sizeof(void *));
            in->sep[pos - 1] = *sep;
            in->child[pos] = child;
            in->n++;
            return;
        }
        /* Split: gather n + 1 children and n separators, halve them. */
        skey_t seps[INNER_CAP];
        void *kids[INNER_CAP + 1];
        memcpy(seps, in->sep, (pos - 1) * sizeof(skey_t));
        seps[pos - 1] = *sep;
        memcpy(seps + pos, in->sep + pos - 1, (INNER_CAP - pos) * sizeof(skey_t));
        memcpy(kids, in->child, pos * sizeof(void *));
        kids[pos] = child;
        memcpy(kids + pos + 1, in->child + pos, (INNER_CAP - pos) * sizeof(void *));
        uint32_t total = INNER_CAP + 1, m = total / 2;
        inner_t *right = take_inner(idx);
        in->n = m;
        memcpy(in->child, kids, m * sizeof(void *));
        memcpy(in->sep, seps, (m - 1) * sizeof(skey_t));
        up = seps[m - 1];
        right->n = total - m;
        memcpy(right->child, kids + m, right->n * sizeof(void *));
        memcpy(right->sep, seps + m, (right->n - 1) * sizeof(skey_t));
        if (d == 0) {
            inner_t *root = take_inner(idx);
            root->n = 2;
            root->child[0] = in;
            root->child[1] = right;
            root->sep[0] = up;
            ns->root = root;
            ns->height++;
            return;
        }
        sep = &up;
        child = right;
    }
}

/* Walks from the root to the leaf where t belongs, recording the inner
 * nodes passed and the child index taken at each depth. */
static leaf_t *tree_descend(const ns_t *ns, const tkey_t *t, inner_t **path, uint32_t *pidx)
{
    void *node = ns->root;
    for (uint32_t d = 0; d < ns->height; d++) {
        inner_t *in = node;
        path[d] = in;
        pidx[d] = inner_pick(in, t);
        node = in->child[pidx[d]];
    }
    return node;
}

/* Inserts ref at position pos of leaf l, reached by path/pidx; splits
 * upward as needed. tree_prepare must have succeeded. */
static void tree_insert_at(kvidx_index_t *idx, ns_t *ns, inner_t **path, uint32_t *pidx, leaf_t *l,
                           uint32_t pos, kvidx_ref_t ref)
{
    if (l->n < LEAF_CAP) {
        memmove(&l->refs[pos + 1], &l->refs[pos], (l->n - pos) * sizeof(uint32_t));
        l->refs[pos] = ref;
        l->n++;
        return;
    }
    /* Split. Appending at the end of a full leaf (ascending inserts) moves
     * only the new key to the right, so such leaves stay full. */
    leaf_t *r = take_leaf(idx);
    if (pos == LEAF_CAP) {
        r->n = 1;
        r->refs[0] = ref;
    } else {
        uint32_t m = LEAF_CAP / 2;
        r->n = LEAF_CAP - m;
        memcpy(r->refs, l->refs + m, r->n * sizeof(uint32_t));
        l->n = m;
        leaf_t *dst = pos <= m ? l : r;
        uint32_t p = pos <= m ? pos : pos - m;
        memmove(&dst->refs[p + 1], &dst->refs[p], (dst->n - p) * sizeof(uint32_t));
        dst->refs[p] = ref;
        dst->n++;
    }
    r->prev = l;
    r->next = l->next;
    if (l->next)
        l->next->prev = r;
    l->next = r;
    skey_t sep;
    sep_from_rec(&sep, rec_at(idx, r->refs[0]));
    if (ns->height == 0) {
        inner_t *root = take_inner(idx);
        root->n = 2;
        root->child[0] = l;
        root->child[1] = r;
        root->sep[0] = sep;
        ns->root = root;
        ns->height = 1;
        return;
    }
    inner_insert(idx, ns, path, pidx, (int)ns->height - 1, &sep, r);
}

/* Makes ref the only key of an empty tree. */
static void tree_start(kvidx_index_t *idx, ns_t *ns, kvidx_ref_t ref)
{
    leaf_t *l = take_leaf(idx);
    l->prev = l->next = NULL;
    l->n = 1;
    l->refs[0] = ref;
    ns->root = l;
    ns->height = 0;
    ns->first = l;
}

/* Inserts ref (whose record holds key t, absent from the tree);
 * tree_prepare must have succeeded. */
static void tree_insert(kvidx_index_t *idx, ns_t *ns, const tkey_t *t, kvidx_ref_t ref)
{
    if (!ns->root) {
        tree_start(idx, ns, ref);
        return;
    }
    inner_t *path[MAXH];
    uint32_t pidx[MAXH];
    leaf_t *l = tree_descend(ns, t, path, pidx);
    tree_insert_at(idx, ns, path, pidx, l, leaf_pos(idx, l, t, 0), ref);
}

/* The last leaf of a non-empty tree, with the path to it. */
static leaf_t *tree_rightmost(const ns_t *ns, inner_t **path, uint32_t *pidx)
{
    void *node = ns->root;
    for (uint32_t d = 0; d < ns->height; d++) {
        inner_t *in = node;
        path[d] = in;
        pidx[d] = in->n - 1;
        node = in->child[in->n - 1];
    }
    return node;
}

/* 1 if t is greater than every key of the tree (or it is empty): then
 * tree_append inserts it with no descent, and it is known to be absent.
 * Sorted input, such as a snapshot being restored, takes that path for
 * every key: one comparison instead of a search and a descent. */
static int tree_after_last(const kvidx_index_t *idx, const ns_t *ns, const tkey_t *t)
{
    if (!ns->root)
        return 1;
    const void *node = ns->root;
    for (uint32_t d = 0; d < ns->height; d++) {
        const inner_t *in = node;
        node = in->child[in->n - 1];
    }
    const leaf_t *l = node;
    return tk_cmp_rec(t, rec_at(idx, l->refs[l->n - 1])) > 0;
}

/* Inserts ref as the new last key; tree_after_last must have said so and
 * tree_prepare must have succeeded. */
static void tree_append(kvidx_index_t *idx, ns_t *ns, kvidx_ref_t ref)
{
    if (!ns->root) {
        tree_start(idx, ns, ref);
        return;
    }
    inner_t *path[MAXH];
    uint32_t pidx[MAXH];
    leaf_t *l = tree_rightmost(ns, path, pidx);
    tree_insert_at(idx, ns, path, pidx, l, l->n, ref);
}

/* Removes ref (key t) from the tree. Empty nodes are freed and a root with
 * one child collapses; there is no other rebalancing. Never allocates. */
static void tree_remove(kvidx_index_t *idx, ns_t *ns, const tkey_t *t, kvidx_ref_t ref)
{
    inner_t *path[MAXH];
    uint32_t pidx[MAXH];
    leaf_t *l = tree_descend(ns, t, path, pidx);
    uint32_t pos = leaf_pos(idx, l, t, 0);
    (void)ref; /* keys are unique: the ref at pos is this one */
    memmove(&l->refs[pos], &l->refs[pos + 1], (l->n - pos - 1) * sizeof(uint32_t));
    l->n--;
    if (l->n)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else
        ns->first = l->next;
    if (l->next)
        l->next->prev = l->prev;
    kvidx_free(l);
    int d = (int)ns->height - 1;
    for (; d >= 0; d--) {
        inner_t *in = path[d];
        uint32_t i = pidx[d];
        /* Drop child i and the separator on its left (sep[0] for child 0). */
        uint32_t s = i ? i - 1 : 0;
        if (in->n >= 2)
            memmove(&in->sep[s], &in->sep[s + 1], (in->n - 2 - s) * sizeof(skey_t));
        memmove(&in->child[i], &in->child[i + 1], (in->n - 1 - i) * sizeof(void *));
        in->n--;
        if (in->n)
            break;
        kvidx_free(in);
    }
    if (d < 0) {
        ns->root = NULL;
        ns->height = 0;
        ns->first = NULL;
        return;
    }
    while (ns->height > 0 && ((inner_t *)ns->root)->n == 1) {
        inner_t *old = ns->root;
        ns->root = old->child[0];
        ns->height--;
        kvidx_free(old);
    }
}

typedef struct cursor {
    const leaf_t *leaf;
    uint32_t pos;
} cursor_t;

/* Positions c at the first key > t (strict) or >= t; leaf NULL at the end. */
static void tree_seek(const kvidx_index_t *idx, const ns_t *ns, const tkey_t *t, int strict,
                      cursor_t *c)
{
    c->leaf = NULL;
    c->pos = 0;
    const void *node = ns->root;
    if (!node)
        return;
    for (uint32_t d = 0; d < ns->height; d++) {
        const inner_t *in = node;
        node = in->child[inner_pick(in, t)];
    }
    const leaf_t *l = node;
    uint32_t pos = leaf_pos(idx, l, t, strict);
    if (pos == l->n) {
        l = l->next;
        pos = 0;
    }
    c->leaf = l;
    c->pos = pos;
}

static void tree_free(void *node, uint32_t height)
{
    if (!node)
        return;
    if (height) {
        inner_t *in = node;
        for (uint32_t i = 0; i < in->n; i++)
            tree_free(in->child[i], height - 1);
    }
    kvidx_free(node);
}

/* ---- L1 metadata and the LRU ---- */

static int l1_reserve_slots(kvidx_index_t *idx, uint64_t k)
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

static uint32_t l1_take(kvidx_index_t *idx)
{
    uint32_t m;
    if (idx->l1_nfree) {
        m = idx->l1_free;
        idx->l1_free = idx->l1[m].next;
        idx->l1_nfree--;
    } else {
        m = idx->l1_used++;
    }
    return m;
}

static void l1_release(kvidx_index_t *idx, uint32_t m)
{
    idx->l1[m].state = KVIDX_L1_NONE;
    idx->l1[m].next = idx->l1_free;
    idx->l1_free = m;
    idx->l1_nfree++;
}

static void lru_unlink(kvidx_index_t *idx, uint32_t m, uint64_t size)
{
    l1m_t *e = &idx->l1[m];
    if (!e->in_lru)
        return;
    idx->l1[e->prev].next = e->next;
    idx->l1[e->next].prev = e->prev;
    e->in_lru = 0;
    idx->c.lru_bytes -= size;
}

/* Links m as the most recent (slot 0 is the head: 0.next = most recent). */
static void lru_push(kvidx_index_t *idx, uint32_t m, uint64_t size)
{
    l1m_t *e = &idx->l1[m];
    e->prev = 0;
    e->next = idx->l1[0].next;
    idx->l1[e->next].prev = m;
    idx->l1[0].next = m;
    e->in_lru = 1;
    idx->c.lru_bytes += size;
}

/* Creates an L1 copy for ref (slot reserved); not linked in the LRU. */
static uint32_t l1_create(kvidx_index_t *idx, kvidx_ref_t ref, uint8_t state, int temporary)
{
    uint32_t m = l1_take(idx);
    l1m_t *e = &idx->l1[m];
    e->ref = ref;
    e->prev = e->next = 0;
    e->pins = 0;
    e->gen = idx->gen_next++;
    e->state = state;
    e->temporary = (uint8_t)(temporary != 0);
    e->in_lru = 0;
    uint8_t *r = rec_at(idx, ref);
    st32(r + 8, m);
    idx->c.l1_keys++;
    idx->c.l1_bytes += rec_size(r);
    if (state == KVIDX_L1_LOADING)
        idx->c.l1_loading++;
    return m;
}

/* Removes the L1 copy of ref (any state). */
static void l1_drop(kvidx_index_t *idx, kvidx_ref_t ref)
{
    uint8_t *r = rec_at(idx, ref);
    uint32_t m = rec_l1(r);
    uint64_t size = rec_size(r);
    l1m_t *e = &idx->l1[m];
    lru_unlink(idx, m, size);
    idx->c.l1_keys--;
    idx->c.l1_bytes -= size;
    if (e->state == KVIDX_L1_LOADING)
        idx->c.l1_loading--;
    if (e->pins) {
        idx->c.l1_pinned--;
        idx->c.l1_pins -= e->pins;
    }
    l1_release(idx, m);
    st32(r + 8, 0);
}

/* Removes a key that has no copy left. */
static void forget(kvidx_index_t *idx, kvidx_ref_t ref)
{
    uint8_t *r = rec_at(idx, ref);
    ns_t *ns = idx->ns_ids[rec_ns(r)].ns;
    tkey_t t = rec_tkey(r);
    tree_remove(idx, ns, &t, ref);
    ht_remove(idx, ref);
    rec_release(idx, ref);
    idx->c.keys--;
    ns->nkeys--;
    ns_drop_if_empty(idx, ns);
}

static void forget_if_empty(kvidx_index_t *idx, kvidx_ref_t ref)
{
    const uint8_t *r = rec_at(idx, ref);
    if (!rec_l1(r) && !rec_l2(r))
        forget(idx, ref);
}

static void make_key(const kvidx_index_t *idx, const uint8_t *r, kvidx_key_t *k)
{
    const ns_t *ns = idx->ns_ids[rec_ns(r)].ns;
    k->model = ns->model->s;
    k->model_len = ns->model->len;
    k->salt = ns->salt->s;
    k->salt_len = (uint8_t)ns->salt->len;
    k->kv_rank = rec_rank(r);
    k->group = rec_group(r);
    k->hash_len = rec_hl(r);
    memcpy(k->hash, rec_hash(r), k->hash_len);
}

/* The durable state of a live ref (see kvidx_durable_t). */
static kvidx_durable_t durable_of(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    const uint8_t *r = rec_at(idx, ref);
    uint32_t m = rec_l1(r);
    kvidx_durable_t d = {0, rec_l2(r) ? KVIDX_DURABLE_L2 : 0};
    if (m && idx->l1[m].state == KVIDX_L1_READY && !idx->l1[m].temporary)
        d.tiers |= KVIDX_DURABLE_L1;
    if (d.tiers)
        d.size_bytes = rec_size(r);
    return d;
}

/* Reports a live ref's change from *before to its current state. */
static void notify(kvidx_index_t *idx, kvidx_ref_t ref, const kvidx_durable_t *before)
{
    if (!idx->on_change)
        return;
    kvidx_durable_t after = durable_of(idx, ref);
    kvidx_key_t k;
    make_key(idx, rec_at(idx, ref), &k);
    idx->on_change(idx->on_change_ctx, &k, before, &after);
}

/* Evicts the least recent evictable copy. The LRU must not be empty. */
static void evict_one(kvidx_index_t *idx)
{
    uint32_t m = idx->l1[0].prev;
    kvidx_ref_t ref = idx->l1[m].ref;
    const uint8_t *r = rec_at(idx, ref);
    uint64_t size = rec_size(r);
    int forgotten = !rec_l2(r);
    kvidx_durable_t before = durable_of(idx, ref);
    if (idx->on_evict) {
        kvidx_key_t k;
        make_key(idx, r, &k);
        idx->on_evict(idx->on_evict_ctx, &k, size, forgotten);
    }
    l1_drop(idx, ref);
    idx->c.evictions++;
    notify(idx, ref, &before);
    if (forgotten)
        forget(idx, ref);
}

static void evict_to_fit(kvidx_index_t *idx)
{
    while (idx->l1_capacity && idx->c.l1_bytes > idx->l1_capacity && idx->l1[0].prev != 0)
        evict_one(idx);
}

/* Whether `extra` more L1 bytes fit after evicting, ignoring `excluded`
 * evictable bytes (copies that must stay). */
static int l1_room(const kvidx_index_t *idx, uint64_t extra, uint64_t excluded)
{
    if (!idx->l1_capacity || extra == 0)
        return 1;
    uint64_t after = idx->c.l1_bytes + extra;
    if (after <= idx->l1_capacity)
        return 1;
    return after - idx->l1_capacity <= idx->c.lru_bytes - excluded;
}

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
    int rc = l1_reserve_slots(idx, 1);
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
        tree_free(ns->root, ns->height);
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
    kvidx_free(idx->ht);
    kvidx_free(idx->ht_tag);
    kvidx_free(idx->strs);
    kvidx_free(idx->ns_sorted);
    kvidx_free(idx->ns_ids);
    kvidx_free(idx->l1);
    kvidx_free(idx->scratch);
    kvidx_free(idx);
}

int kvidx_index_set_capacity(kvidx_index_t *idx, uint64_t l1_capacity_bytes,
                             uint64_t l2_capacity_bytes)
{
    idx->l1_capacity = l1_capacity_bytes;
    idx->l2_capacity = l2_capacity_bytes;
    evict_to_fit(idx);
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
    return ht_reserve(idx, (size_t)nkeys);
}

void kvidx_index_set_change_cb(kvidx_index_t *idx, kvidx_change_cb cb, void *ctx)
{
    idx->on_change = cb;
    idx->on_change_ctx = ctx;
}

/* ---- lookup ---- */

static int key_shape_ok(const kvidx_key_t *k)
{
    return k->hash_len >= KVIDX_HASH_MIN && k->hash_len <= KVIDX_HASH_MAX &&
           k->model_len <= KVIDX_MODEL_MAX && k->salt_len <= KVIDX_SALT_MAX &&
           (k->model || !k->model_len) && (k->salt || !k->salt_len);
}

static kvidx_ref_t lookup(const kvidx_index_t *idx, const kvidx_key_t *k)
{
    if (!key_shape_ok(k))
        return KVIDX_REF_NONE;
    const ns_t *ns = ns_find(idx, k);
    if (!ns)
        return KVIDX_REF_NONE;
    tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
    return ht_find(idx, ns->id, &t);
}

/* Fills info from a live record (kvidx_index_info without the check). */
static void info_of(const kvidx_index_t *idx, const uint8_t *r, kvidx_entry_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->size_bytes = rec_size(r);
    info->l2 = rec_l2(r);
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
    size_t mask = idx->ht_cap ? idx->ht_cap - 1 : 0;
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
            PREFETCH(&idx->ht[hs[i - w0] & mask]);
            PREFETCH(&idx->ht_tag[hs[i - w0] & mask]);
        }
        for (size_t i = w0; i < w1; i++) {
            if (!nss[i - w0])
                continue;
            /* The record of the first slot of the run whose tag matches. */
            size_t j = hs[i - w0] & mask;
            uint8_t tag = h_tag(hs[i - w0]);
            for (int step = 0; step < 4 && idx->ht[j] != KVIDX_REF_NONE; step++) {
                if (idx->ht_tag[j] == tag) {
                    PREFETCH(rec_at(idx, idx->ht[j]));
                    break;
                }
                j = (j + 1) & mask;
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
    out->evictions = idx->c.evictions;
    out->names = idx->nstrs;
    out->namespaces = idx->n_ns;
    out->l1_capacity_bytes = idx->l1_capacity;
    out->l2_capacity_bytes = idx->l2_capacity;
}

/* ---- batch store ---- */

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

static int put_item_cmp(const kvidx_put_t *items, uint32_t a, uint32_t b)
{
    int c = kvidx_key_cmp(&items[a].key, &items[b].key);
    if (c)
        return c;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* Bottom-up merge sort of item indices by (key, position). */
static void sort_items(const kvidx_put_t *items, uint32_t *a, uint32_t *tmp, size_t n)
{
    /* Input already in key order (a snapshot being restored, a listing
     * being copied) costs n - 1 comparisons instead of n log n. */
    size_t sorted = 1;
    while (sorted < n && put_item_cmp(items, a[sorted - 1], a[sorted]) <= 0)
        sorted++;
    if (sorted == n)
        return;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n;
            size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = put_item_cmp(items, a[i], a[j]) <= 0 ? a[i++] : a[j++];
            while (i < mid)
                tmp[k++] = a[i++];
            while (j < hi)
                tmp[k++] = a[j++];
        }
        memcpy(a, tmp, n * sizeof(*a));
    }
}

static int scratch_get(kvidx_index_t *idx, size_t bytes, void **out)
{
    if (bytes > idx->scratch_cap) {
        void *p = kvidx_malloc(bytes);
        if (!p)
            return KVIDX_ENOMEM;
        kvidx_free(idx->scratch);
        idx->scratch = p;
        idx->scratch_cap = bytes;
    }
    *out = idx->scratch;
    return 0;
}

static void put_rollback(kvidx_index_t *idx, undo_t *u, size_t nu, const counters_t *saved)
{
    while (nu--) {
        undo_t *e = &u[nu];
        if (e->created) {
            if (rec_l1(rec_at(idx, e->ref)))
                l1_drop(idx, e->ref);
            rec_set_l2(rec_at(idx, e->ref), 0);
            forget(idx, e->ref);
            continue;
        }
        if (e->l1_created)
            l1_drop(idx, e->ref);
        uint8_t *r = rec_at(idx, e->ref);
        uint32_t m = rec_l1(r);
        if (e->untemped && m)
            idx->l1[m].temporary = 1;
        if (m && idx->l1[m].in_lru)
            idx->c.lru_bytes = idx->c.lru_bytes - rec_size(r) + e->old_size;
        rec_set_size(r, e->old_size);
        rec_set_l2(r, e->old_l2);
    }
    idx->c = *saved;
}

int kvidx_index_put_batch(kvidx_index_t *idx, kvidx_tier_t tier, const kvidx_put_t *items, size_t n,
                          size_t *conflict_index)
{
    if (tier != KVIDX_TIER_L1 && tier != KVIDX_TIER_L2)
        return KVIDX_EINVAL;
    if (n == 0)
        return 0;
    if (!items || n > (size_t)1 << 24)
        return KVIDX_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!key_shape_ok(&items[i].key) || items[i].key.model_len == 0 ||
            items[i].size_bytes == 0 || items[i].size_bytes > KVIDX_SIZE_MAX) {
            if (conflict_index)
                *conflict_index = i;
            return KVIDX_EINVAL;
        }
    }

    /* Scratch: work[n], order[n], tmp[n], undo[n]. */
    size_t bytes = n * (sizeof(work_t) + 2 * sizeof(uint32_t) + sizeof(undo_t));
    void *mem;
    int rc = scratch_get(idx, bytes, &mem);
    if (rc)
        return rc;
    undo_t *undo = mem;
    work_t *work = (work_t *)(undo + n);
    uint32_t *order = (uint32_t *)(work + n);
    uint32_t *tmp = order + n;

    /* Look every item up, in two passes so that the table's cache misses
     * overlap; a pinned or loading copy may not change size. */
    const ns_t *last_ns = NULL;
    hcache_t hc;
    hc.a_valid = 0;
    hc.b_valid = 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_key_t *k = &items[i].key;
        work[i].ns = UINT32_MAX;
        if (!last_ns || ns_cmp(last_ns, k->salt, k->salt_len, k->model, k->model_len) != 0)
            last_ns = ns_find(idx, k);
        if (!last_ns || !idx->ht_cap)
            continue;
        tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
        work[i].ns = last_ns->id;
        work[i].h = tk_hash_cached(idx, &hc, last_ns->id, &t);
        PREFETCH(&idx->ht[work[i].h & (idx->ht_cap - 1)]);
        PREFETCH(&idx->ht_tag[work[i].h & (idx->ht_cap - 1)]);
    }
    for (size_t i = 0; i < n; i++) {
        const kvidx_key_t *k = &items[i].key;
        tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
        work[i].ref =
            work[i].ns == UINT32_MAX ? KVIDX_REF_NONE : ht_find_h(idx, work[i].ns, &t, work[i].h);
        work[i].effective = 0;
        if (work[i].ref == KVIDX_REF_NONE)
            continue;
        const uint8_t *r = rec_at(idx, work[i].ref);
        uint32_t m = rec_l1(r);
        if (m && (idx->l1[m].pins || idx->l1[m].state == KVIDX_L1_LOADING) &&
            rec_size(r) != items[i].size_bytes) {
            if (conflict_index)
                *conflict_index = i;
            return KVIDX_ECONFLICT;
        }
    }

    /* Sort by key: duplicates become runs (the last position wins) and new
     * keys reach each tree in order. */
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    sort_items(items, order, tmp, n);
    size_t neff = 0;
    for (size_t j = 0; j < n; j++) {
        if (j + 1 < n && kvidx_key_equal(&items[order[j]].key, &items[order[j + 1]].key))
            continue;
        work[order[j]].effective = 1;
        order[neff++] = order[j];
    }

    /* Byte deltas per tier, new records per class, new L1 copies. */
    int64_t d1 = 0, d2 = 0;
    uint64_t excluded = 0, new_l1 = 0, new_keys = 0;
    uint64_t new_recs[NCLASS] = {0};
    for (size_t j = 0; j < neff; j++) {
        const kvidx_put_t *it = &items[order[j]];
        int64_t sz = (int64_t)it->size_bytes;
        kvidx_ref_t ref = work[order[j]].ref;
        if (ref == KVIDX_REF_NONE) {
            new_keys++;
            new_recs[hash_class(it->key.hash_len)]++;
            if (tier == KVIDX_TIER_L1) {
                d1 += sz;
                new_l1++;
            } else {
                d2 += sz;
            }
            continue;
        }
        const uint8_t *r = rec_at(idx, ref);
        int64_t old = (int64_t)rec_size(r);
        uint32_t m = rec_l1(r);
        if (m && idx->l1[m].in_lru)
            excluded += (uint64_t)old;
        if (tier == KVIDX_TIER_L1) {
            if (m) {
                d1 += sz - old;
            } else {
                d1 += sz;
                new_l1++;
            }
            if (rec_l2(r))
                d2 += sz - old;
        } else {
            d2 += rec_l2(r) ? sz - old : sz;
            if (m)
                d1 += sz - old;
        }
    }
    if (idx->l2_capacity && d2 > 0 && idx->c.l2_bytes + (uint64_t)d2 > idx->l2_capacity)
        return KVIDX_ECAPACITY;
    if (d1 > 0 && !l1_room(idx, (uint64_t)d1, excluded))
        return KVIDX_ECAPACITY;

    /* Reserve what the apply phase needs, so that only namespace creation
     * and tree nodes can still fail there. */
    rc = ht_reserve(idx, new_keys);
    for (unsigned c = 0; !rc && c < NCLASS; c++)
        rc = slab_reserve(&idx->slabs[c], new_recs[c]);
    if (!rc)
        rc = l1_reserve_slots(idx, new_l1);
    if (rc)
        return rc;

    /* Apply, in key order. */
    counters_t saved = idx->c;
    size_t nu = 0;
    ns_t *ns = NULL;
    for (size_t j = 0; j < neff; j++) {
        const kvidx_put_t *it = &items[order[j]];
        kvidx_ref_t ref = work[order[j]].ref;
        undo_t *u = &undo[nu];
        if (ref != KVIDX_REF_NONE) {
            uint8_t *r = rec_at(idx, ref);
            u->ref = ref;
            u->created = 0;
            u->old_size = rec_size(r);
            u->old_l2 = (uint8_t)rec_l2(r);
            u->l1_created = 0;
            u->untemped = 0;
            nu++;
            uint32_t m = rec_l1(r);
            if (m) {
                idx->c.l1_bytes = idx->c.l1_bytes - u->old_size + it->size_bytes;
                if (idx->l1[m].in_lru)
                    idx->c.lru_bytes = idx->c.lru_bytes - u->old_size + it->size_bytes;
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
                /* A store into L1 makes the copy the caller's: it is no
                 * longer dropped at its last unpin (and becomes durable). */
                idx->l1[m].temporary = 0;
                u->untemped = 1;
            }
            continue;
        }
        const kvidx_key_t *k = &it->key;
        if (!ns || ns_cmp(ns, k->salt, k->salt_len, k->model, k->model_len) != 0) {
            rc = ns_get(idx, k, &ns);
            if (rc)
                goto fail;
        }
        rc = tree_prepare(idx, ns);
        if (rc) {
            ns_drop_if_empty(idx, ns);
            goto fail;
        }
        ref = rec_new(idx, ns, k, it->size_bytes);
        uint8_t *r = rec_at(idx, ref);
        tkey_t t = rec_tkey(r);
        tree_insert(idx, ns, &t, ref);
        ht_insert(idx, ref, tk_hash_cached(idx, &hc, ns->id, &t));
        ns->nkeys++;
        idx->c.keys++;
        if (tier == KVIDX_TIER_L2) {
            rec_set_l2(r, 1);
            idx->c.l2_keys++;
            idx->c.l2_bytes += it->size_bytes;
        } else {
            l1_create(idx, ref, KVIDX_L1_READY, 0);
        }
        work[order[j]].ref = ref;
        u->ref = ref;
        u->created = 1;
        u->untemped = 0;
        nu++;
    }

    /* Recency: the batch's last key is the least recent. Then make room. */
    if (tier == KVIDX_TIER_L1) {
        for (size_t i = n; i-- > 0;) {
            if (!work[i].effective)
                continue;
            const uint8_t *r = rec_at(idx, work[i].ref);
            uint32_t m = rec_l1(r);
            if (idx->l1[m].state != KVIDX_L1_READY || idx->l1[m].pins)
                continue;
            uint64_t size = rec_size(r);
            lru_unlink(idx, m, size);
            lru_push(idx, m, size);
        }
    }
    if (idx->on_change) {
        /* undo[j] holds item order[j]'s state before the batch; a re-put
         * never changes an existing L1 copy's state, and its temporary
         * flag only from set to clear (untemped). */
        for (size_t j = 0; j < neff; j++) {
            const undo_t *u = &undo[j];
            kvidx_durable_t before = {0, 0};
            if (!u->created) {
                before = durable_of(idx, u->ref);
                before.tiers &= u->l1_created || u->untemped ? 0u : KVIDX_DURABLE_L1;
                before.tiers |= u->old_l2 ? KVIDX_DURABLE_L2 : 0u;
                before.size_bytes = before.tiers ? u->old_size : 0;
            }
            notify(idx, u->ref, &before);
        }
    }
    evict_to_fit(idx);
    return 0;

fail:
    put_rollback(idx, undo, nu, &saved);
    return rc;
}

/* ---- bulk load ---- */

#define LOAD_PEND 65536 /* table inserts deferred at once by a bulk load */

/* Inserts n refs known to be absent, each given as home slot << 32 | ref
 * with its tag in ptag, in slot order (a counting sort on the slot's top
 * bits into tmp, ttag): the table is then swept once instead of probed at
 * random. */
static void ht_insert_sorted(kvidx_index_t *idx, const uint64_t *pend, const uint8_t *ptag,
                             size_t n, uint64_t *tmp, uint8_t *ttag)
{
    enum { BITS = 12 };
    uint32_t count[(1u << BITS) + 1];
    unsigned lg = 0;
    while (((size_t)1 << lg) < idx->ht_cap)
        lg++;
    unsigned shift = 32 + (lg > BITS ? lg - BITS : 0);
    memset(count, 0, sizeof(count));
    for (size_t i = 0; i < n; i++)
        count[(pend[i] >> shift) + 1]++;
    for (uint32_t b = 1; b <= (1u << BITS); b++)
        count[b] += count[b - 1];
    for (size_t i = 0; i < n; i++) {
        uint32_t at = count[pend[i] >> shift]++;
        tmp[at] = pend[i];
        ttag[at] = ptag[i];
    }
    size_t mask = idx->ht_cap - 1;
    for (size_t i = 0; i < n; i++) {
        size_t j = (size_t)(tmp[i] >> 32);
        while (idx->ht[j] != KVIDX_REF_NONE)
            j = (j + 1) & mask;
        idx->ht[j] = (uint32_t)tmp[i];
        idx->ht_tag[j] = ttag[i];
    }
    idx->ht_count += n;
}

int kvidx_index_load(kvidx_index_t *idx, const kvidx_load_t *items, size_t n, size_t *bad_index)
{
    if (n == 0)
        return 0;
    if (!items || n > (size_t)1 << 24)
        return KVIDX_EINVAL;
    uint64_t per_class[NCLASS] = {0}, nl1 = 0, l2_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_load_t *it = &items[i];
        if (!key_shape_ok(&it->key) || it->key.model_len == 0 || it->size_bytes == 0 ||
            it->size_bytes > KVIDX_SIZE_MAX || it->tiers == 0 ||
            it->tiers > (KVIDX_DURABLE_L1 | KVIDX_DURABLE_L2)) {
            if (bad_index)
                *bad_index = i;
            return KVIDX_EINVAL;
        }
        per_class[hash_class(it->key.hash_len)]++;
        nl1 += (it->tiers & KVIDX_DURABLE_L1) != 0;
        if (it->tiers & KVIDX_DURABLE_L2)
            l2_bytes += it->size_bytes;
    }
    if (idx->l2_capacity && idx->c.l2_bytes + l2_bytes > idx->l2_capacity)
        return KVIDX_ECAPACITY;
    int rc = ht_reserve(idx, n);
    for (unsigned c = 0; !rc && c < NCLASS; c++)
        rc = slab_reserve(&idx->slabs[c], per_class[c]);
    if (!rc)
        rc = l1_reserve_slots(idx, nl1);
    if (rc)
        return rc;

    /* Table inserts are deferred and made in slot order (ht_insert_sorted):
     * a random probe per key into a table of hundreds of MB is the largest
     * cost of a restore otherwise. */
    void *mem;
    size_t npend = 0;
    rc = scratch_get(idx, 2 * LOAD_PEND * (sizeof(uint64_t) + 1), &mem);
    if (rc)
        return rc;
    uint64_t *pend = mem, *ptmp = pend + LOAD_PEND;
    uint8_t *ptag = (uint8_t *)(ptmp + LOAD_PEND), *ttag = ptag + LOAD_PEND;
    hcache_t hc;
    hc.a_valid = 0;
    hc.b_valid = 0;
    ns_t *ns = NULL;
    for (size_t i = 0; i < n; i++) {
        const kvidx_load_t *it = &items[i];
        const kvidx_key_t *k = &it->key;
        /* Keys decoded from one namespace record share its name pointers:
         * compare the names only when the pointers change. */
        int same = ns && i > 0 && k->model == items[i - 1].key.model &&
                   k->salt == items[i - 1].key.salt && k->model_len == items[i - 1].key.model_len &&
                   k->salt_len == items[i - 1].key.salt_len;
        if (!same && (!ns || ns_cmp(ns, k->salt, k->salt_len, k->model, k->model_len) != 0)) {
            rc = ns_get(idx, k, &ns);
            if (rc)
                goto fail;
        }
        /* Presence is checked in the tree, not the hash table: input in key
         * order (a snapshot) is past the tree's last key, one comparison,
         * while a table probe would read a random record for every
         * occupied slot it passes. */
        tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
        int append = tree_after_last(idx, ns, &t);
        if (!append) {
            cursor_t cur;
            tree_seek(idx, ns, &t, 0, &cur);
            if (cur.leaf && cur.pos < cur.leaf->n &&
                tk_cmp_rec(&t, rec_at(idx, cur.leaf->refs[cur.pos])) == 0) {
                if (bad_index)
                    *bad_index = i;
                rc = KVIDX_ECONFLICT;
                goto fail;
            }
        }
        rc = tree_prepare(idx, ns);
        if (rc)
            goto fail;
        kvidx_ref_t ref = rec_new(idx, ns, k, it->size_bytes);
        uint8_t *r = rec_at(idx, ref);
        if (append) {
            tree_append(idx, ns, ref);
        } else {
            tkey_t rt = rec_tkey(r);
            tree_insert(idx, ns, &rt, ref);
        }
        uint64_t h = tk_hash_cached(idx, &hc, ns->id, &t);
        if (idx->ht_cap > (size_t)UINT32_MAX + 1) {
            ht_insert(idx, ref, h); /* slots no longer fit the packing */
        } else {
            if (npend == LOAD_PEND) {
                ht_insert_sorted(idx, pend, ptag, npend, ptmp, ttag);
                npend = 0;
            }
            ptag[npend] = h_tag(h);
            pend[npend++] = (h & (idx->ht_cap - 1)) << 32 | ref;
        }
        ns->nkeys++;
        idx->c.keys++;
        if (it->tiers & KVIDX_DURABLE_L2) {
            rec_set_l2(r, 1);
            idx->c.l2_keys++;
            idx->c.l2_bytes += it->size_bytes;
        }
        if (it->tiers & KVIDX_DURABLE_L1)
            lru_push(idx, l1_create(idx, ref, KVIDX_L1_READY, 0), it->size_bytes);
    }
    ht_insert_sorted(idx, pend, ptag, npend, ptmp, ttag);
    evict_to_fit(idx);
    return 0;
fail:
    ht_insert_sorted(idx, pend, ptag, npend, ptmp, ttag);
    if (ns)
        ns_drop_if_empty(idx, ns);
    evict_to_fit(idx);
    return rc;
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
                l1_drop(idx, ref);
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
    if (deleted)
        notify(idx, ref, &before);
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
        l1_drop(idx, ref);
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
    if (!l1_room(idx, rec_size(r), 0))
        return KVIDX_ECAPACITY;
    int rc = l1_reserve_slots(idx, 1);
    if (rc)
        return rc;
    uint32_t m = l1_create(idx, ref, KVIDX_L1_LOADING, temporary);
    if (generation)
        *generation = idx->l1[m].gen;
    /* The new copy is not in the LRU, so eviction cannot take it. */
    evict_to_fit(idx);
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
        l1_drop(idx, ref);
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
        notify(idx, ref, &before);
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
        notify(idx, ref, &before);
    return 0;
}

/* ---- listing ---- */

static int ns_salt_is(const ns_t *ns, const kvidx_list_filter_t *f)
{
    return bytes_cmp(ns->salt->s, ns->salt->len, f->salt, f->salt_len);
}

int kvidx_index_list(const kvidx_index_t *idx, const kvidx_list_filter_t *f,
                     const kvidx_key_t *after, size_t page_size, size_t max_scan, kvidx_ref_t *refs,
                     size_t *count, kvidx_key_buf_t *resume, int *more, size_t *examined)
{
    *count = 0;
    *more = 0;
    if (examined)
        *examined = 0;
    if (!page_size || !max_scan)
        return KVIDX_EINVAL;
    kvidx_list_filter_t none = {0};
    if (!f)
        f = &none;
    kvidx_tier_t tier = f->tier ? f->tier : KVIDX_TIER_ALL;

    size_t s = 0;
    if (after)
        s = ns_lower_bound(idx, after->salt, after->salt_len, after->model, after->model_len);
    if (f->has_salt) {
        size_t s2 = ns_lower_bound(idx, f->salt, f->salt_len, "", 0);
        if (s2 > s)
            s = s2;
    }
    size_t n_out = 0, seen = 0;
    kvidx_ref_t last_seen = KVIDX_REF_NONE, last_out = KVIDX_REF_NONE;
    const ns_t *last_skipped = NULL; /* set when a skipped namespace was examined last */
    int stop = 0, full_and_more = 0;
    for (; s < idx->n_ns && !stop; s++) {
        const ns_t *ns = idx->ns_sorted[s];
        if (f->has_salt && ns_salt_is(ns, f) != 0)
            break; /* past the salt's range */
        if (f->has_model && bytes_cmp(ns->model->s, ns->model->len, f->model, f->model_len) != 0) {
            /* A model filter without a salt passes over every other
             * namespace; each one counts against the budget so that a
             * page stays bounded however many salts there are. */
            if (after &&
                ns_cmp(ns, after->salt, after->salt_len, after->model, after->model_len) == 0)
                continue; /* the namespace the page resumes in: examined before */
            if (seen == max_scan) {
                stop = 1;
                break;
            }
            seen++;
            last_skipped = ns;
            continue;
        }
        cursor_t c;
        tkey_t lo = {0, 0, 0, NULL};
        int strict = 0;
        if (after &&
            ns_cmp(ns, after->salt, after->salt_len, after->model, after->model_len) == 0) {
            lo.rank = after->kv_rank;
            lo.group = after->group;
            lo.hash_len = after->hash_len;
            lo.hash = after->hash;
            strict = 1;
        }
        if (f->has_rank) {
            tkey_t fl = {f->kv_rank, f->has_group ? f->group : 0, 0, NULL};
            if (tk_cmp(&lo, &fl) < 0) {
                lo = fl;
                strict = 0;
            }
        }
        tree_seek(idx, ns, &lo, strict, &c);
        while (c.leaf) {
            if (seen == max_scan) {
                stop = 1;
                break;
            }
            kvidx_ref_t ref = c.leaf->refs[c.pos];
            const uint8_t *r = rec_at(idx, ref);
            seen++;
            last_seen = ref;
            last_skipped = NULL;
            if (++c.pos == c.leaf->n) {
                c.leaf = c.leaf->next;
                c.pos = 0;
            }
            uint32_t rank = rec_rank(r);
            uint16_t group = rec_group(r);
            if (f->has_rank && rank != f->kv_rank)
                break; /* past the rank's range in this namespace */
            if (f->has_group && group != f->group) {
                if (f->has_rank && group > f->group)
                    break;
                /* Seek to the group within this rank or the next rank. */
                tkey_t t = {rank, f->group, 0, NULL};
                if (group > f->group) {
                    if (rank == UINT32_MAX)
                        break;
                    t.rank = rank + 1;
                }
                tree_seek(idx, ns, &t, 0, &c);
                continue;
            }
            /* A loading copy is reserved, not readable (SPEC §2): it does
             * not make a key listable as an L1 key. */
            uint32_t l1m = rec_l1(r);
            int l1_ready = l1m && idx->l1[l1m].state == KVIDX_L1_READY;
            if ((tier == KVIDX_TIER_L1 && !l1_ready) || (tier == KVIDX_TIER_L2 && !rec_l2(r)) ||
                (tier == KVIDX_TIER_ALL && !l1_ready && !rec_l2(r)))
                continue;
            if (n_out == page_size) {
                full_and_more = 1;
                stop = 1;
                break;
            }
            refs[n_out++] = ref;
            last_out = ref;
        }
    }
    *count = n_out;
    if (examined)
        *examined = seen;
    if (stop && !full_and_more && last_skipped) {
        /* The budget ran out among skipped namespaces: resume after the
         * largest key the last one could hold (it holds no match). */
        kvidx_key_t k;
        memset(&k, 0, sizeof(k));
        k.salt = last_skipped->salt->s;
        k.salt_len = (uint8_t)last_skipped->salt->len;
        k.model = last_skipped->model->s;
        k.model_len = (uint16_t)last_skipped->model->len;
        k.kv_rank = UINT32_MAX;
        k.group = UINT16_MAX;
        k.hash_len = KVIDX_HASH_MAX;
        memset(k.hash, 0xff, sizeof(k.hash));
        kvidx_key_buf_set(resume, &k);
        *more = 1;
    } else if (stop) {
        /* max_scan >= 1, so a key or a namespace was examined before the
         * budget ran out: last_seen is set when last_skipped is not. */
        kvidx_key_t k;
        make_key(idx, rec_at(idx, full_and_more ? last_out : last_seen), &k);
        kvidx_key_buf_set(resume, &k);
        *more = 1;
    }
    return 0;
}
