/*
 * Private header of the key index (lib/index/): the structures every file
 * of the folder shares, the record accessors, and the helpers that the
 * lookup and store paths of several files must have inlined (the keyed
 * hash, the table probe, the namespace search, the L1 copy bookkeeping).
 * index.c states the invariants these structures keep.
 *
 * Every key is one fixed-size record in a slab of its hash-length class
 * (hash lengths rounded up to a multiple of 8 bytes: 8 classes). A record is
 * named by a 32-bit ref = class << 29 | slot; slabs grow by chunks of 4096
 * records, so a ref never moves. A record holds, packed and unaligned:
 *
 *   off  0  u32  namespace id (NS_FREE on a free record)
 *   off  4  u32  kv_rank (next free slot on a free record)
 *   off  8  u32  L1 metadata index (bits 0..30; 0 = no L1 copy) |
 *                held by a source (bit 31, SRC_BIT)
 *   off 12  u16  object_group_id
 *   off 14  u8   hash_len (bits 0..6) | L2 present (bit 7)
 *   off 15  u40  size_bytes - 1, little endian
 *   off 20  u8[8 * (class + 1)] hash bytes
 *
 * so a key with a 32-byte hash costs 52 bytes of record.
 *
 * Functions shared between the files of the folder and not inlined carry
 * the prefix ix_; none of them is part of the public API.
 */
#ifndef KVIDX_INDEX_INT_H
#define KVIDX_INDEX_INT_H

#include "kvidx/index.h"
#include "../alloc_int.h"
#include "../bytes_int.h"
#include "kvidx/err.h"
#include "../siphash_int.h"

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

static inline int bytes_cmp(const void *a, size_t an, const void *b, size_t bn)
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
/* L1 copies are capped below 2^31 (ix_l1_reserve_slots), so the top bit
 * of a record's L1 index is free: it says that one or more sources hold an
 * L2 copy of the key (source.c). L2_BIT is the L2 copy stored through the
 * API, the one that is durable. */
#define SRC_BIT 0x80000000u
#define L1_MASK 0x7fffffffu

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
    uint32_t acct; /* the account of its salt (quota.c) */
    struct leaf *first;
} ns_t;

typedef struct ns_slot {
    ns_t *ns;
    uint32_t next_free;
} ns_slot_t;

/* ---- B+tree ---- */

/* 129 refs make a leaf 536 bytes, which a malloc of 528 would round up
 * to anyway (glibc's chunks are 8 bytes of header plus a multiple of 16). */
#define LEAF_CAP  129
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

typedef struct cursor {
    const leaf_t *leaf;
    uint32_t pos;
} cursor_t;

/* ---- L1 metadata ---- */

typedef struct l1m {
    uint32_t ref;
    uint32_t prev, next; /* LRU links (slot 0 is the list head), or free list */
    uint32_t pins;
    uint64_t gen;
    uint32_t acct;         /* the account of its key's salt (quota.c) */
    uint32_t sprev, snext; /* links in that account's LRU while in_lru (0 ends) */
    uint8_t state;         /* KVIDX_L1_*; KVIDX_L1_NONE on a free slot */
    uint8_t temporary;
    uint8_t in_lru;
} l1m_t;

/* ---- salt accounts and quotas (quota.c) ---- */

/* One account per salt that has namespaces: its L1 copies, their bytes,
 * and its own LRU list (newest .. oldest through sprev/snext) of the
 * copies that are in the index's LRU, in the same relative order. */
typedef struct ix_acct {
    const istr_t *salt; /* its namespaces' interned salt; NULL on a free slot */
    uint32_t nns;       /* namespaces of this salt */
    uint32_t newest, oldest;
    uint32_t next_free;
    uint32_t qi;    /* 1 + its entry in the quota table, 0: none */
    uint64_t quota; /* that entry's bytes, 0: none */
    uint64_t l1_keys, l1_bytes, lru_bytes;
    uint64_t evictions; /* copies evicted for its quota */
} ix_acct_t;

/* A quota, with what the batch store in progress adds to its salt. */
typedef struct ix_quota {
    uint64_t bytes;
    int64_t pend_d1;    /* L1 bytes the batch adds */
    uint64_t pend_excl; /* evictable bytes of the batch's own keys */
    size_t pend_next;   /* 1 + the next pending entry, 0 ends */
    uint8_t pend_on;
    uint8_t len;
    char salt[KVIDX_SALT_MAX];
} ix_quota_t;

typedef struct ix_accounts {
    ix_acct_t *v;         /* v[0] is never used: account 0 means none */
    uint32_t n, cap;      /* slots handed out (0 included), allocated */
    uint32_t free, nfree; /* free slots threaded through next_free (0 ends) */
    ix_quota_t *quotas;   /* sorted by salt bytes */
    size_t nquotas;
    size_t pend_head;   /* 1 + the first pending quota, 0: none (only inside a store) */
    uint64_t evictions; /* quota evictions, all salts */
} ix_accounts_t;

typedef struct counters {
    uint64_t keys, l1_keys, l1_bytes, l1_loading, l1_pinned, l1_pins, lru_bytes;
    uint64_t l2_keys, l2_bytes, evictions;
    uint64_t src_keys, src_bytes; /* keys with SRC_BIT, and their sizes */
} counters_t;

struct ix_sources; /* source.c: the membership of each source */

struct kvidx_index {
    uint8_t hkey[crypto_shorthash_KEYBYTES];
    slab_t slabs[NCLASS];

    uint32_t *ht;
    uint8_t *ht_tag; /* per slot: the top byte of its key's hash (after ht[], one block) */
    size_t ht_cap;   /* slots (at most HT_CAP_MAX), or 0 */
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

    struct ix_sources *src; /* NULL until a source is added */

    ix_accounts_t acc; /* per-salt L1 accounts and quotas (quota.c) */
};

/* ---- record accessors ---- */

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
    return ld32(r + 8) & L1_MASK;
}
static inline int rec_src(const uint8_t *r)
{
    return (ld32(r + 8) & SRC_BIT) != 0;
}
/* Writes the L1 index m, keeping the source bit. */
static inline void rec_set_l1(uint8_t *r, uint32_t m)
{
    st32(r + 8, (ld32(r + 8) & SRC_BIT) | m);
}
static inline void rec_set_src(uint8_t *r, int on)
{
    uint32_t v = ld32(r + 8);
    st32(r + 8, on ? v | SRC_BIT : v & ~SRC_BIT);
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
/* An L2 copy of any owner: the API's or a source's (what lookups, the
 * listing and prefetch planning see). */
static inline int rec_l2_any(const uint8_t *r)
{
    return (r[14] & L2_BIT) || (ld32(r + 8) & SRC_BIT);
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

static inline int ref_live(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    unsigned cls = ref >> CLASS_SHIFT;
    uint32_t slot = ref & SLOT_MASK;
    if (cls >= NCLASS || slot >= idx->slabs[cls].used)
        return 0;
    return rec_ns(rec_at(idx, ref)) != NS_FREE;
}

/* Takes a record slot; ix_slab_reserve must have made room. */
static inline kvidx_ref_t rec_take(kvidx_index_t *idx, unsigned cls)
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
 * bytes, no L1 copy and no L2 copy yet; ix_slab_reserve must have made
 * room. */
static inline kvidx_ref_t rec_new(kvidx_index_t *idx, const ns_t *ns, const kvidx_key_t *k,
                                  uint64_t size)
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

static inline void rec_release(kvidx_index_t *idx, kvidx_ref_t ref)
{
    slab_t *s = &idx->slabs[ref >> CLASS_SHIFT];
    uint8_t *r = rec_at(idx, ref);
    st32(r, NS_FREE);
    st32(r + 4, s->free_head);
    st32(r + 8, 0);
    s->free_head = ref & SLOT_MASK;
    s->nfree++;
}

/* ---- keyed hash of a key (for the table) ---- */

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
static inline uint64_t hash_a(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t)
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

static inline uint64_t hash_b(const kvidx_index_t *idx, uint32_t rank)
{
    uint64_t w = rank;
    return kvidx_siphash_words(idx->hkey, &w, 1, 1, 3);
}

static inline uint64_t tk_hash(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t)
{
    return hash_a(idx, ns_id, t) ^ hash_b(idx, t->rank);
}

/* Reuses the parts of tk_hash across the keys of one batch: A of the last
 * (namespace, group, hash), B of the last 8 ranks (direct-mapped on the
 * rank's low 3 bits, the low bits of the worker's local rank in a packed
 * kv_rank). Start one with a_valid = b_valid = 0. */
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

static inline uint64_t tk_hash_cached(const kvidx_index_t *idx, hcache_t *c, uint32_t ns_id,
                                      const tkey_t *t)
{
    /* Key-form batches name a new hash with every key: the first word
     * usually tells, before the whole compare. */
    if (!c->a_valid || c->ns_id != ns_id || c->group != t->group || c->hash_len != t->hash_len ||
        (t->hash_len >= 8 && kvidx_le64(c->hash) != kvidx_le64(t->hash)) ||
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

static inline uint64_t ref_hash(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    const uint8_t *r = rec_at(idx, ref);
    tkey_t t = rec_tkey(r);
    return tk_hash(idx, rec_ns(r), &t);
}

/* ---- key order inside a namespace ---- */

static inline int tk_cmp(const tkey_t *a, const tkey_t *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    return bytes_cmp(a->hash, a->hash_len, b->hash, b->hash_len);
}

static inline int tk_cmp_rec(const tkey_t *a, const uint8_t *r)
{
    tkey_t b = rec_tkey(r);
    return tk_cmp(a, &b);
}

static inline int tk_cmp_sep(const tkey_t *a, const skey_t *s)
{
    tkey_t b = {s->rank, s->group, s->hash_len, s->hash};
    return tk_cmp(a, &b);
}

/* ---- hash table probe and insert (table.c has the rest) ---- */

/* Each slot keeps a byte of its key's hash beside the ref, so a probe reads
 * a record (a cache miss) only when that byte matches: 1 in 256 of the
 * other keys of a probe run instead of all of them. */
static inline uint8_t h_tag(uint64_t h)
{
    return (uint8_t)(h >> 56);
}

/* The table has any number of slots up to 2^32 (3.8 billion keys at its
 * 0.9 load), so that it can grow by half instead of doubling and a home
 * slot is a 32-bit multiply-high. */
#define HT_CAP_MAX ((uint64_t)1 << 32)

/* The home slot of hash h: its low 32 bits scaled to the table's size by
 * a multiply-high (no division, no power-of-two size). The tag is the top
 * byte, so a slot's neighbours do not share their tags. */
static inline size_t ht_home(const kvidx_index_t *idx, uint64_t h)
{
    return (size_t)(((h & UINT32_MAX) * (uint64_t)idx->ht_cap) >> 32);
}

/* The slot after j, wrapping at the end. */
static inline size_t ht_next(const kvidx_index_t *idx, size_t j)
{
    return ++j == idx->ht_cap ? 0 : j;
}

static inline kvidx_ref_t ht_find_h(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t,
                                    uint64_t h)
{
    if (!idx->ht_cap)
        return KVIDX_REF_NONE;
    size_t j = ht_home(idx, h);
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
        j = ht_next(idx, j);
    }
}

static inline kvidx_ref_t ht_find(const kvidx_index_t *idx, uint32_t ns_id, const tkey_t *t)
{
    return ht_find_h(idx, ns_id, t, tk_hash(idx, ns_id, t));
}

/* Inserts a ref known to be absent, whose hash is h; ix_ht_reserve must
 * have made room. */
static inline void ht_insert(kvidx_index_t *idx, kvidx_ref_t ref, uint64_t h)
{
    size_t j = ht_home(idx, h);
    while (idx->ht[j] != KVIDX_REF_NONE)
        j = ht_next(idx, j);
    idx->ht[j] = ref;
    idx->ht_tag[j] = h_tag(h);
    idx->ht_count++;
}

/* ---- namespace search (names.c has the rest) ---- */

static inline int ns_cmp(const ns_t *ns, const char *salt, size_t sl, const char *model, size_t ml)
{
    int c = bytes_cmp(ns->salt->s, ns->salt->len, salt, sl);
    if (c)
        return c;
    return bytes_cmp(ns->model->s, ns->model->len, model, ml);
}

/* First namespace >= (salt, model) in the sorted array. */
static inline size_t ns_lower_bound(const kvidx_index_t *idx, const char *salt, size_t sl,
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

static inline ns_t *ns_find(const kvidx_index_t *idx, const kvidx_key_t *k)
{
    size_t i = ns_lower_bound(idx, k->salt, k->salt_len, k->model, k->model_len);
    if (i < idx->n_ns &&
        ns_cmp(idx->ns_sorted[i], k->salt, k->salt_len, k->model, k->model_len) == 0)
        return idx->ns_sorted[i];
    return NULL;
}

static inline int key_shape_ok(const kvidx_key_t *k)
{
    return k->hash_len >= KVIDX_HASH_MIN && k->hash_len <= KVIDX_HASH_MAX &&
           k->model_len <= KVIDX_MODEL_MAX && k->salt_len <= KVIDX_SALT_MAX &&
           (k->model || !k->model_len) && (k->salt || !k->salt_len);
}

/* The ref of key k, or KVIDX_REF_NONE. */
static inline kvidx_ref_t lookup(const kvidx_index_t *idx, const kvidx_key_t *k)
{
    if (!key_shape_ok(k))
        return KVIDX_REF_NONE;
    const ns_t *ns = ns_find(idx, k);
    if (!ns)
        return KVIDX_REF_NONE;
    tkey_t t = {k->kv_rank, k->group, k->hash_len, k->hash};
    return ht_find(idx, ns->id, &t);
}

static inline void make_key(const kvidx_index_t *idx, const uint8_t *r, kvidx_key_t *k)
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

/* ---- L1 copies and the LRU (tier.c has the rest) ---- */

static inline uint32_t l1_take(kvidx_index_t *idx)
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

static inline void lru_unlink(kvidx_index_t *idx, uint32_t m, uint64_t size)
{
    l1m_t *e = &idx->l1[m];
    if (!e->in_lru)
        return;
    idx->l1[e->prev].next = e->next;
    idx->l1[e->next].prev = e->prev;
    e->in_lru = 0;
    idx->c.lru_bytes -= size;
    /* And out of its salt's list. */
    ix_acct_t *a = &idx->acc.v[e->acct];
    if (e->sprev)
        idx->l1[e->sprev].snext = e->snext;
    else
        a->newest = e->snext;
    if (e->snext)
        idx->l1[e->snext].sprev = e->sprev;
    else
        a->oldest = e->sprev;
    a->lru_bytes -= size;
}

/* Links m as the most recent (slot 0 is the head: 0.next = most recent). */
static inline void lru_push(kvidx_index_t *idx, uint32_t m, uint64_t size)
{
    l1m_t *e = &idx->l1[m];
    e->prev = 0;
    e->next = idx->l1[0].next;
    idx->l1[e->next].prev = m;
    idx->l1[0].next = m;
    e->in_lru = 1;
    idx->c.lru_bytes += size;
    /* And the newest of its salt's list. */
    ix_acct_t *a = &idx->acc.v[e->acct];
    e->sprev = 0;
    e->snext = a->newest;
    if (a->newest)
        idx->l1[a->newest].sprev = m;
    else
        a->oldest = m;
    a->newest = m;
    a->lru_bytes += size;
}

/* A resize of the key of L1 copy m from `from` to `to` bytes, in its salt's
 * account (the caller keeps the index's own counters). */
static inline void acct_resize(kvidx_index_t *idx, uint32_t m, uint64_t from, uint64_t to)
{
    ix_acct_t *a = &idx->acc.v[idx->l1[m].acct];
    a->l1_bytes = a->l1_bytes - from + to;
    if (idx->l1[m].in_lru)
        a->lru_bytes = a->lru_bytes - from + to;
}

/* Creates an L1 copy for ref (slot reserved); not linked in the LRU. */
static inline uint32_t l1_create(kvidx_index_t *idx, kvidx_ref_t ref, uint8_t state, int temporary)
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
    e->sprev = e->snext = 0;
    uint8_t *r = rec_at(idx, ref);
    rec_set_l1(r, m);
    uint64_t size = rec_size(r);
    idx->c.l1_keys++;
    idx->c.l1_bytes += size;
    if (state == KVIDX_L1_LOADING)
        idx->c.l1_loading++;
    e->acct = idx->ns_ids[rec_ns(r)].ns->acct;
    ix_acct_t *a = &idx->acc.v[e->acct];
    a->l1_keys++;
    a->l1_bytes += size;
    return m;
}

/* The durable state of a live ref (see kvidx_durable_t). */
static inline kvidx_durable_t durable_of(const kvidx_index_t *idx, kvidx_ref_t ref)
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

/* ---- shared functions of the folder ---- */

/* slab.c */
int ix_slab_reserve(slab_t *s, uint64_t k);
int ix_scratch_get(kvidx_index_t *idx, size_t bytes, void **out);

/* table.c */
int ix_ht_reserve(kvidx_index_t *idx, size_t extra);
void ix_ht_remove(kvidx_index_t *idx, kvidx_ref_t ref);
void ix_ht_insert_sorted(kvidx_index_t *idx, const uint64_t *pend, const uint8_t *ptag, size_t n,
                         uint64_t *tmp, uint8_t *ttag);

/* names.c */
int ix_ns_get(kvidx_index_t *idx, const kvidx_key_t *k, ns_t **out);
void ix_ns_drop_if_empty(kvidx_index_t *idx, ns_t *ns);
size_t ix_str_lower_bound(const kvidx_index_t *idx, const char *s, size_t n);

/* btree.c */
int ix_tree_prepare_slow(kvidx_index_t *idx, const ns_t *ns);
void ix_tree_insert(kvidx_index_t *idx, ns_t *ns, const tkey_t *t, kvidx_ref_t ref);
int ix_tree_after_last(const kvidx_index_t *idx, const ns_t *ns, const tkey_t *t);
void ix_tree_append(kvidx_index_t *idx, ns_t *ns, kvidx_ref_t ref);
void ix_tree_remove(kvidx_index_t *idx, ns_t *ns, const tkey_t *t, kvidx_ref_t ref);
void ix_tree_seek(const kvidx_index_t *idx, const ns_t *ns, const tkey_t *t, int strict,
                  cursor_t *c);
void ix_tree_free(void *node, uint32_t height);

/* Makes sure one insert into ns can allocate nothing: one leaf and
 * height + 1 inner nodes in reserve (the common case, nothing to do, is
 * decided here without a call). */
static inline int tree_prepare(kvidx_index_t *idx, const ns_t *ns)
{
    if (idx->spare_leaf && idx->nspare_inner > ns->height)
        return 0;
    return ix_tree_prepare_slow(idx, ns);
}

/* Creates key k of size bytes in ns as a record with no copy yet: in the
 * tree and the table, counted. The caller has reserved the record and the
 * table slot; tree nodes are reserved here. Returns 0 and *ref, or
 * KVIDX_ENOMEM after dropping ns if it is left empty (nothing else
 * changed). */
static inline int ix_key_insert(kvidx_index_t *idx, hcache_t *hc, ns_t *ns, const kvidx_key_t *k,
                                uint64_t size, kvidx_ref_t *ref)
{
    int rc = tree_prepare(idx, ns);
    if (rc) {
        ix_ns_drop_if_empty(idx, ns);
        return rc;
    }
    *ref = rec_new(idx, ns, k, size);
    tkey_t t = rec_tkey(rec_at(idx, *ref));
    ix_tree_insert(idx, ns, &t, *ref);
    ht_insert(idx, *ref, tk_hash_cached(idx, hc, ns->id, &t));
    ns->nkeys++;
    idx->c.keys++;
    return 0;
}

/* source.c */
void ix_sources_free(kvidx_index_t *idx);
int ix_check_sources(const kvidx_index_t *idx);

/* tier.c */
int ix_l1_reserve_slots(kvidx_index_t *idx, uint64_t k);
void ix_l1_drop(kvidx_index_t *idx, kvidx_ref_t ref);
void ix_forget(kvidx_index_t *idx, kvidx_ref_t ref);
void ix_notify(kvidx_index_t *idx, kvidx_ref_t ref, const kvidx_durable_t *before);
void ix_evict_to_fit(kvidx_index_t *idx);
void ix_evict_copy(kvidx_index_t *idx, uint32_t m);
int ix_l1_room(const kvidx_index_t *idx, uint64_t extra, uint64_t excluded);

/* quota.c */

/* The account of a live ref's salt. */
static inline uint32_t acct_of_ref(const kvidx_index_t *idx, kvidx_ref_t ref)
{
    return idx->ns_ids[rec_ns(rec_at(idx, ref))].ns->acct;
}

/* The quota entry of the last salt looked up by ix_quota_add for a key
 * whose namespace does not exist yet. */
typedef struct ix_qcache {
    int valid;
    const char *salt;
    size_t salt_len;
    size_t qi;
} ix_qcache_t;

int ix_acct_attach(kvidx_index_t *idx, ns_t *ns, size_t pos);
void ix_acct_detach(kvidx_index_t *idx, ns_t *ns);
void ix_accounts_free(kvidx_index_t *idx);
int ix_check_accounts(const kvidx_index_t *idx);
int ix_quota_room(const kvidx_index_t *idx, uint32_t acct, uint64_t extra, uint64_t excluded);
void ix_quota_evict(kvidx_index_t *idx, uint32_t acct);
void ix_quota_evict_all(kvidx_index_t *idx);
void ix_quota_add(kvidx_index_t *idx, ix_qcache_t *c, kvidx_tier_t tier, const kvidx_put_t *it,
                  kvidx_ref_t ref, uint32_t ns_id);
int ix_quota_check_pending(const kvidx_index_t *idx);
void ix_quota_end_pending(kvidx_index_t *idx, int evict);

#endif
