/*
 * Private header of the fleet directory (lib/directory/): the structures
 * every file of the folder shares and their small inline accessors.
 * directory.c states the invariants; docs/fleet.md shows the layout and
 * its memory figures.
 *
 * Layout, in short:
 *  - strings (instance ids, backends, model names, salts) are interned
 *    once in `strs`, named by a sid, refcounted by their users;
 *  - a namespace is an interned (salt, model) pair, refcounted by its keys;
 *  - a key is a fixed-size record in the slab of its hash-length class
 *    (hash lengths rounded up to 8 bytes), named by a 32-bit ref that never
 *    moves; it is in the key table (exact lookup), in the ordering treap
 *    (canonical order, intrusive left/right links) and in the ring of keys
 *    that share its chunk hash (the chunk table holds one key per ring);
 *  - a placement is a 24-byte record in a pool: the key's placements form
 *    a singly linked list sorted by (instance_id, tier, backend, shared)
 *    whose last link is the key's ref tagged with KEY_TAG, so a placement
 *    finds its key by walking forward; each placement is also in the doubly
 *    linked list of its source;
 *  - a source is one (reporter instance, incarnation, tier, backend,
 *    shared) tuple with the placements reported under it: the reverse index
 *    that makes fencing proportional to what an instance holds;
 *  - an instance record gathers what is known of one instance_id: its
 *    sources, gate cursor, registration and capacity declaration;
 *  - a token binding is one allocation (header + uint32 tokens) named by a
 *    binding id stored in every key of its ring, in an age list.
 *
 * Internal functions shared by the files of the folder carry the prefix
 * dr_; none of them is public.
 */
#ifndef KVIDX_DIRECTORY_INT_H
#define KVIDX_DIRECTORY_INT_H

#include "kvidx/directory.h"
#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <stdint.h>
#include <string.h>

#define NONE    UINT32_MAX
#define KEY_TAG (UINT32_C(1) << 31) /* a placement's `next` that names its key */

/* ---- accounted allocation ----
 * Every allocation goes through these so that d->mem is exact; check.c
 * recomputes it from the structures. */
void *dr_alloc(kvidx_directory_t *d, size_t n);
void *dr_realloc(kvidx_directory_t *d, void *p, size_t old_n, size_t new_n);
void dr_free(kvidx_directory_t *d, void *p, size_t n);
/* Grows an array of elem-sized items to at least need (doubling, min 8);
 * *cap is its capacity in items. 0 or KVIDX_ENOMEM (array unchanged). */
int dr_grow(kvidx_directory_t *d, void **arr, size_t *cap, size_t need, size_t elem);

/* ---- open-addressing tables of u32 ids ---- */

typedef struct tab {
    uint32_t *slot; /* NONE = empty */
    size_t cap;     /* power of two, or 0 */
    size_t count;
} tab_t;

typedef uint64_t (*tab_hash_fn)(const kvidx_directory_t *d, uint32_t id);
typedef int (*tab_eq_fn)(const kvidx_directory_t *d, uint32_t id, const void *probe);

/* Makes room for `need` entries in all (load <= 3/4). 0 or KVIDX_ENOMEM. */
int dr_tab_reserve(kvidx_directory_t *d, tab_t *t, size_t need, tab_hash_fn hf);
/* The id equal to probe, or NONE. */
uint32_t dr_tab_find(const kvidx_directory_t *d, const tab_t *t, uint64_t h, tab_eq_fn eq,
                     const void *probe);
/* Inserts id (not present; room reserved). */
void dr_tab_insert(tab_t *t, uint32_t id, uint64_t h);
/* Removes id (present), shifting back the entries after it. */
void dr_tab_remove(const kvidx_directory_t *d, tab_t *t, uint32_t id, uint64_t h, tab_hash_fn hf);
/* Replaces id by other in its slot (both hash alike). */
void dr_tab_replace(tab_t *t, uint32_t id, uint64_t h, uint32_t other);
void dr_tab_free(kvidx_directory_t *d, tab_t *t);

/* ---- interned strings ---- */

typedef struct dstr {
    char *s; /* NUL-terminated copy; NULL on a free slot */
    uint32_t len;
    uint32_t refs; /* users; on a free slot, the next free sid */
    uint64_t hash;
    struct inst *inst; /* the instance record of this instance_id, or NULL */
} dstr_t;

/* ---- namespaces ---- */

typedef struct dns {
    uint32_t salt, model; /* sids; salt is NONE for the empty salt */
    uint32_t refs;        /* keys + pins; on a free slot, the next free id */
    uint32_t live;
} dns_t;

/* ---- keys ---- */

#define NCLASS      8
#define CLASS_SHIFT 28
#define SLOT_MASK   ((UINT32_C(1) << CLASS_SHIFT) - 1)
#define CHUNK_SHIFT 12
#define CHUNK_RECS  (UINT32_C(1) << CHUNK_SHIFT)

typedef struct krec {
    uint32_t ns; /* NONE on a free record */
    uint32_t rank;
    uint16_t group;
    uint8_t hash_len;
    uint8_t pad_;
    uint32_t plist;       /* first placement; on a free record, the next free slot */
    uint32_t left, right; /* treap children, NONE when absent */
    uint32_t ring;        /* next key with the same chunk hash (itself when alone) */
    uint32_t bind;        /* binding id of the chunk hash, NONE when none */
    double last_access;
    uint8_t hash[]; /* 8 * (class + 1) bytes */
} krec_t;

typedef struct kslab {
    uint8_t **chunks;
    size_t nchunks, chunks_cap;
    uint32_t used;      /* slots handed out by bumping */
    uint32_t free_head; /* NONE when empty */
    uint32_t nfree;
    uint32_t rec_size;
} kslab_t;

/* ---- placements ---- */

typedef struct dpl {
    uint32_t next;  /* next placement of the key, or KEY_TAG | key ref; free: next free */
    uint32_t src;   /* NONE on a free placement */
    uint32_t sprev; /* the source's list */
    uint32_t snext;
    uint64_t size;
} dpl_t;

#define PL_CHUNK_SHIFT 12
#define PL_CHUNK       (UINT32_C(1) << PL_CHUNK_SHIFT)

/* ---- sources ---- */

typedef struct dsrc {
    uint32_t inst;    /* sid of the reporter; NONE on a free slot */
    uint32_t backend; /* sid */
    uint64_t incarnation;
    uint8_t tier;   /* KVIDX_DIR_L1 or KVIDX_DIR_L2 */
    uint8_t shared; /* 0 or 1 */
    uint32_t nplace;
    uint32_t pins;
    uint32_t head;       /* first placement; free slot: next free source */
    uint32_t prev, next; /* the instance's source list */
    uint64_t bytes;      /* sum of its placements' sizes */
} dsrc_t;

/* ---- instances ---- */

typedef struct dcap {
    uint32_t backend; /* sid */
    uint8_t tier, shared;
    uint64_t capacity;
} dcap_t;

typedef struct inst {
    uint32_t sid;      /* its instance_id (one ref) */
    uint32_t src_head; /* its sources */
    uint32_t pins;
    /* gate cursor */
    uint8_t has_cursor, gap;
    uint64_t incarnation, last_seq, applied, duplicates, stale;
    double last_ts;
    /* registration */
    uint8_t registered;
    struct inst *reg_prev, *reg_next;
    char *ip, *p2p, *meta;
    size_t ip_len, p2p_len, meta_len;
    uint32_t http_port, mq_port;
    double reg_time;
    uint64_t last_seen_ms;
    /* capacity declaration */
    uint8_t has_decl;
    uint64_t decl_inc, decl_rev;
    dcap_t *caps;
    size_t ncaps, caps_cap;
} inst_t;

/* ---- token bindings ---- */

typedef struct dbind {
    uint32_t prev, next; /* age list: prev is older */
    uint32_t rep;        /* a key of the ring (the hash bytes' owner) */
    uint32_t ntok;
    int64_t offset;
    uint32_t tok[];
} dbind_t;

static inline size_t bind_bytes(uint32_t ntok)
{
    return sizeof(dbind_t) + 4 * (size_t)ntok;
}

/* ---- the directory ---- */

struct kvidx_directory {
    uint8_t hkey[16];
    uint64_t pseed; /* treap priorities */

    dstr_t *strs;
    size_t strs_cap;
    uint32_t str_used, str_free;
    tab_t strtab;

    dns_t *ns;
    size_t ns_cap;
    uint32_t ns_used, ns_free;
    tab_t nstab;

    kslab_t slabs[NCLASS];
    tab_t ktab; /* every key */
    tab_t ctab; /* one key per chunk-hash ring */
    uint32_t root;
    uint64_t nkeys;

    dpl_t **pl_chunks;
    size_t pl_nchunks, pl_chunks_cap;
    uint32_t pl_used, pl_free, pl_nfree;

    dsrc_t *srcs;
    size_t srcs_cap;
    uint32_t src_used, src_free;

    inst_t **insts; /* sorted by instance_id bytes */
    size_t ninsts, insts_cap;
    inst_t *reg_head, *reg_tail;
    size_t nregistered;

    dbind_t **binds; /* NULL on a free slot */
    uint32_t *bind_free_list;
    size_t binds_cap, nbind_free;
    uint32_t binds_used;
    uint32_t age_head, age_tail; /* oldest, newest */
    uint64_t nbinds, bind_tokens, token_bytes, token_cap;
    uint64_t bind_dropped, tok_dropped;

    uint64_t nplace, tier_place[2], tier_bytes[2];
    uint64_t mem;

    void (*on_change)(void *ctx, const kvidx_dir_change_t *c);
    void *on_change_ctx;
};

/* ---- accessors ---- */

static inline krec_t *K(const kvidx_directory_t *d, uint32_t ref)
{
    const kslab_t *s = &d->slabs[ref >> CLASS_SHIFT];
    uint32_t slot = ref & SLOT_MASK;
    return (krec_t *)(s->chunks[slot >> CHUNK_SHIFT] +
                      (size_t)(slot & (CHUNK_RECS - 1)) * s->rec_size);
}

static inline dpl_t *P(const kvidx_directory_t *d, uint32_t id)
{
    return &d->pl_chunks[id >> PL_CHUNK_SHIFT][id & (PL_CHUNK - 1)];
}

static inline dsrc_t *S(const kvidx_directory_t *d, uint32_t id)
{
    return &d->srcs[id];
}

static inline unsigned hash_class(uint8_t hash_len)
{
    return (unsigned)(hash_len - 1) / 8;
}

static inline int bytes_cmp(const void *a, size_t an, const void *b, size_t bn)
{
    size_t n = an < bn ? an : bn;
    int c = n ? memcmp(a, b, n) : 0;
    if (c != 0)
        return c;
    return an < bn ? -1 : an > bn ? 1 : 0;
}

static inline int str_cmp(const kvidx_directory_t *d, uint32_t a, uint32_t b)
{
    if (a == b)
        return 0;
    return bytes_cmp(d->strs[a].s, d->strs[a].len, d->strs[b].s, d->strs[b].len);
}

/* The key a placement belongs to. */
static inline uint32_t pl_key(const kvidx_directory_t *d, uint32_t p)
{
    uint32_t n = P(d, p)->next;
    while (!(n & KEY_TAG))
        n = P(d, n)->next;
    return n & ~KEY_TAG;
}

/* A view of a key record (model and salt into the interned strings). */
void dr_key_view(const kvidx_directory_t *d, uint32_t ref, kvidx_key_t *out);

/* ---- names.c ---- */

/* The sid of the bytes, or NONE. */
uint32_t dr_str_find(const kvidx_directory_t *d, const char *s, size_t n);
/* The sid of the bytes with one more reference (created when absent).
 * KVIDX_ENOMEM leaves nothing behind. */
int dr_str_get(kvidx_directory_t *d, const char *s, size_t n, uint32_t *sid);
void dr_str_ref(kvidx_directory_t *d, uint32_t sid);
/* Drops one reference; the string is freed with its last. */
void dr_str_unref(kvidx_directory_t *d, uint32_t sid);
/* The namespace of a key, or NONE. */
uint32_t dr_ns_find(const kvidx_directory_t *d, const kvidx_key_t *k);
/* The namespace of a key with one more reference (created when absent). */
int dr_ns_get(kvidx_directory_t *d, const kvidx_key_t *k, uint32_t *ns);
void dr_ns_unref(kvidx_directory_t *d, uint32_t ns);
uint64_t dr_str_hash_fn(const kvidx_directory_t *d, uint32_t sid);
uint64_t dr_ns_hash_fn(const kvidx_directory_t *d, uint32_t ns);
/* The instance record of an id, or NULL. */
inst_t *dr_inst_find(const kvidx_directory_t *d, const char *id, size_t n);
/* The record of an id with one more pin (created when absent). */
int dr_inst_get(kvidx_directory_t *d, const char *id, size_t n, inst_t **out);
/* Drops a pin and frees the record when nothing keeps it. */
void dr_inst_unpin(kvidx_directory_t *d, inst_t *in);
/* Frees the record when it holds nothing (no pins, sources, cursor,
 * registration or declaration). */
void dr_inst_gc(kvidx_directory_t *d, inst_t *in);
size_t dr_inst_index(const kvidx_directory_t *d, const char *id, size_t n, int *found);

/* ---- keys.c ---- */

uint64_t dr_key_hash_fn(const kvidx_directory_t *d, uint32_t ref);
uint64_t dr_chunk_hash_fn(const kvidx_directory_t *d, uint32_t ref);
uint64_t dr_key_hash(const kvidx_directory_t *d, uint32_t ns, const kvidx_key_t *k);
uint64_t dr_chunk_hash(const kvidx_directory_t *d, const uint8_t *hash, size_t len);
/* The key of namespace ns equal to k, or NONE. */
uint32_t dr_key_find(const kvidx_directory_t *d, uint32_t ns, const kvidx_key_t *k);
/* The representative key of a chunk hash's ring, or NONE. */
uint32_t dr_chunk_find(const kvidx_directory_t *d, const uint8_t *hash, size_t len);
/* Makes room for new keys: per-class counts, and `total` more in the tables. */
int dr_keys_reserve(kvidx_directory_t *d, const uint32_t *per_class, size_t total);
/* Creates a key (room reserved): takes a reference on ns; no placements
 * yet (the caller adds one before returning to its caller). */
uint32_t dr_key_create(kvidx_directory_t *d, uint32_t ns, const kvidx_key_t *k);
/* Forgets a key that has no placement left. */
void dr_key_forget(kvidx_directory_t *d, uint32_t ref);
/* Canonical-order comparison of a key and a record. */
int dr_key_cmp_rec(const kvidx_directory_t *d, const kvidx_key_t *k, uint32_t ref);
/* The first key > *k (strict) or >= *k, NONE at the end; k NULL: the first. */
uint32_t dr_tree_seek(const kvidx_directory_t *d, const kvidx_key_t *k, int strict);
/* In-order walk from a starting ref (inclusive). */
typedef struct tree_iter {
    uint32_t stack[96];
    unsigned depth;
    int overflow;
    uint32_t cur;
} tree_iter_t;
void dr_tree_iter_start(const kvidx_directory_t *d, tree_iter_t *it, const kvidx_key_t *k,
                        int strict);
uint32_t dr_tree_iter_next(const kvidx_directory_t *d, tree_iter_t *it);
uint32_t dr_tree_prio(const kvidx_directory_t *d, uint32_t ref);

/* ---- place.c ---- */

int dr_pool_reserve(kvidx_directory_t *d, size_t k);
int dr_srcs_reserve(kvidx_directory_t *d, size_t k);
/* The source of a tuple with one more pin (created when absent; room for
 * one source must be reserved, and the instance pinned). */
uint32_t dr_src_get(kvidx_directory_t *d, inst_t *in, uint64_t inc, unsigned tier, uint32_t backend,
                    int shared);
uint32_t dr_src_find(const kvidx_directory_t *d, const inst_t *in, uint64_t inc, unsigned tier,
                     uint32_t backend, int shared);
void dr_src_unpin(kvidx_directory_t *d, uint32_t src);
/* The placement of key ref with the identity (reporter, tier, backend,
 * shared), or NONE. */
uint32_t dr_pl_find(const kvidx_directory_t *d, uint32_t ref, uint32_t inst_sid, unsigned tier,
                    uint32_t backend, int shared);
/* Upserts the placement of source src on key ref with size (pool room
 * reserved). */
void dr_pl_upsert(kvidx_directory_t *d, uint32_t ref, uint32_t src, uint64_t size);
/* Removes placement p of key ref; forgets the key when it was the last. */
void dr_pl_remove(kvidx_directory_t *d, uint32_t ref, uint32_t p);
/* Drops every L1 placement the instance last reported. */
void dr_fence(kvidx_directory_t *d, inst_t *in);
/* Placement order: (instance_id, tier, backend, shared). */
int dr_pl_cmp(const kvidx_directory_t *d, uint32_t src_a, uint32_t src_b);

/* ---- tokens.c ---- */

dbind_t *dr_bind_block(kvidx_directory_t *d, const uint32_t *tok, size_t n, int64_t offset);
void dr_bind_block_free(kvidx_directory_t *d, dbind_t *b);
int dr_binds_reserve(kvidx_directory_t *d, size_t k);
/* Sets the binding of key ref's chunk hash from a block (consumed), makes
 * it the newest and applies the cap. */
void dr_bind_set(kvidx_directory_t *d, uint32_t ref, dbind_t *blk);
/* Frees binding b (its ring forgets it). */
void dr_bind_drop(kvidx_directory_t *d, uint32_t b);
void dr_bind_enforce_cap(kvidx_directory_t *d);

/* ---- registry.c ---- */

/* Drops an instance's stream: fence, cursor, declaration. */
void dr_drop_stream(kvidx_directory_t *d, inst_t *in);
void dr_caps_clear(kvidx_directory_t *d, inst_t *in);
/* Applies one compartment (room for one more reserved, backend pinned). */
void dr_caps_apply(kvidx_directory_t *d, inst_t *in, uint64_t inc, uint64_t rev, unsigned tier,
                   uint32_t backend, int shared, uint64_t capacity);
int dr_caps_reserve(kvidx_directory_t *d, inst_t *in, size_t k);
void dr_registration_clear(kvidx_directory_t *d, inst_t *in);
int dr_register(kvidx_directory_t *d, const kvidx_dir_instance_t *x, int *re_registered,
                int notify);
void dr_notify(kvidx_directory_t *d, const kvidx_dir_change_t *c);

/* ---- read.c ---- */

/* A read's filter with its strings resolved to sids (NONE: any; NOMATCH:
 * a string the directory does not hold, which nothing matches). */
#define NOMATCH (NONE - 1)
typedef struct rfilter {
    int tier;
    uint32_t inst, backend;
} rfilter_t;

void dr_filter_resolve(const kvidx_directory_t *d, const kvidx_dir_filter_t *f, rfilter_t *out);
void dr_row_fill(const kvidx_directory_t *d, uint32_t ref, const rfilter_t *f,
                 kvidx_dir_row_t *row);
void dr_placement_view(const kvidx_directory_t *d, uint32_t p, kvidx_dir_placement_t *out);

#endif
