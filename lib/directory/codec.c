/*
 * The fleet directory's changes and state records as bytes
 * (kvidx/directory_codec.h), and their replay.
 *
 * Invariants: every blob fits max_blob bytes; the scratch buffer a blob is
 * built in starts at WR_FIRST bytes and grows (doubling, up to max_blob)
 * before anything is written past it, so that a small change does not take
 * max_blob of memory; a batch's entries are never
 * split inside an entry (the daemon bounds an entry's token ids well below
 * a blob); the replay ingests a batch only when all its announced entries
 * arrived, so a torn tail never applies part of a batch; decoding checks
 * every length against the blob before reading and refuses trailing bytes.
 */
#include "kvidx/directory_codec.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <string.h>

enum {
    B_BATCH = 1,
    B_MORE = 2,
    B_REGISTER = 3,
    B_DROP = 4, /* a deregistration or an expiry: the instance is dropped */
    B_TOKEN_CAP = 5,
    B_S_INSTANCE = 10,
    B_S_STREAM = 11,
    B_S_CAPACITY = 12,
    B_S_KEY = 13,
    B_S_BINDING = 14,
};

/* ---- writing ---- */

enum {
    /* First size of the scratch buffer: holds any drop, token cap or batch
     * header (whose two names are at most KVIDX_DIR_ID_MAX bytes each). */
    WR_FIRST = 4096,
};

typedef struct wr {
    uint8_t *p;
    size_t len, cap; /* cap: the blob bound (max_blob) */
    size_t room;     /* bytes allocated at p, at most cap */
    kvidx_dir_emit_fn emit;
    void *ctx;
} wr_t;

static void w_bytes(wr_t *w, const void *s, size_t n)
{
    if (n)
        memcpy(w->p + w->len, s, n);
    w->len += n;
}
static void w_u8(wr_t *w, uint8_t v)
{
    w->p[w->len++] = v;
}
static void w_u16(wr_t *w, uint16_t v)
{
    w_u8(w, (uint8_t)v);
    w_u8(w, (uint8_t)(v >> 8));
}
static void w_u32(wr_t *w, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        w_u8(w, (uint8_t)(v >> (8 * i)));
}
static void w_u64(wr_t *w, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        w_u8(w, (uint8_t)(v >> (8 * i)));
}
static void w_f64(wr_t *w, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    w_u64(w, u);
}
static void w_str(wr_t *w, const char *s, size_t n)
{
    w_u16(w, (uint16_t)n);
    w_bytes(w, s, n);
}

static size_t key_size(const kvidx_key_t *k)
{
    return 2 + k->model_len + 2 + k->salt_len + 4 + 2 + 1 + k->hash_len;
}
static void w_key(wr_t *w, const kvidx_key_t *k)
{
    w_str(w, k->model, k->model_len);
    w_str(w, k->salt, k->salt_len);
    w_u32(w, k->kv_rank);
    w_u16(w, k->group);
    w_u8(w, k->hash_len);
    w_bytes(w, k->hash, k->hash_len);
}

static size_t entry_size(const kvidx_dir_entry_t *e)
{
    return key_size(&e->key) + 8 + 8 + 4 + 4 * e->num_tokens;
}
static void w_entry(wr_t *w, const kvidx_dir_entry_t *e)
{
    w_key(w, &e->key);
    w_u64(w, e->size_bytes);
    w_u64(w, (uint64_t)e->token_offset);
    w_u32(w, (uint32_t)e->num_tokens);
    for (size_t i = 0; i < e->num_tokens; i++)
        w_u32(w, e->token_ids[i]);
}

static int flush(wr_t *w)
{
    int rc = w->len ? w->emit(w->ctx, w->p, w->len) : 0;
    w->len = 0;
    return rc;
}

static int wr_open(wr_t *w, size_t max_blob, kvidx_dir_emit_fn emit, void *ctx)
{
    if (max_blob < WR_FIRST)
        return KVIDX_EINVAL;
    w->p = kvidx_malloc(WR_FIRST);
    if (!w->p)
        return KVIDX_ENOMEM;
    w->len = 0;
    w->cap = max_blob;
    w->room = WR_FIRST;
    w->emit = emit;
    w->ctx = ctx;
    return 0;
}

/* Makes room for a blob of total bytes (total <= cap, checked by the caller). */
static int wr_reserve(wr_t *w, size_t total)
{
    if (total <= w->room)
        return 0;
    size_t n = w->room;
    while (n < total)
        n = n > w->cap / 2 ? w->cap : n * 2;
    uint8_t *p = kvidx_realloc(w->p, n);
    if (!p)
        return KVIDX_ENOMEM;
    w->p = p;
    w->room = n;
    return 0;
}

static int encode_batch(wr_t *w, const kvidx_dir_batch_t *b, kvidx_dir_verdict_t v)
{
    size_t n = v == KVIDX_DIR_ADMITTED ? b->num_entries : 0;
    if (b->instance_len > KVIDX_DIR_ID_MAX || b->backend_len > KVIDX_DIR_ID_MAX)
        return KVIDX_EINVAL;
    w_u8(w, B_BATCH);
    w_u8(w, (uint8_t)v);
    w_str(w, b->instance_id, b->instance_len);
    w_u64(w, b->incarnation);
    w_u64(w, b->seq);
    w_u8(w, (uint8_t)b->event_type);
    w_u8(w, (uint8_t)b->tier);
    w_str(w, b->backend, b->backend_len);
    w_u8(w, (uint8_t)(b->shared != 0));
    w_f64(w, b->ts);
    w_u64(w, b->capacity_bytes);
    w_u64(w, b->capacity_revision);
    w_u64(w, n);
    size_t count_at = w->len;
    w_u32(w, 0);
    uint32_t here = 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_dir_entry_t *e = &b->entries[i];
        size_t need = entry_size(e);
        if (need + 8 > w->cap)
            return KVIDX_EINVAL;
        if (w->len + need > w->cap) {
            memcpy(w->p + count_at,
                   (uint8_t[4]){(uint8_t)here, (uint8_t)(here >> 8), (uint8_t)(here >> 16),
                                (uint8_t)(here >> 24)},
                   4);
            int rc = flush(w);
            if (rc)
                return rc;
            w_u8(w, B_MORE);
            count_at = w->len;
            w_u32(w, 0);
            here = 0;
        }
        int rc = wr_reserve(w, w->len + need);
        if (rc)
            return rc;
        w_entry(w, e);
        here++;
    }
    memcpy(w->p + count_at,
           (uint8_t[4]){(uint8_t)here, (uint8_t)(here >> 8), (uint8_t)(here >> 16),
                        (uint8_t)(here >> 24)},
           4);
    return flush(w);
}

static size_t instance_size(const kvidx_dir_instance_t *in)
{
    return 1 + 2 + in->instance_len + 2 + in->ip_len + 4 + 4 + 2 + in->p2p_len + 4 +
           in->metadata_len + 8 + 8;
}
static void w_instance(wr_t *w, int kind, const kvidx_dir_instance_t *in)
{
    w_u8(w, (uint8_t)kind);
    w_str(w, in->instance_id, in->instance_len);
    w_str(w, in->ip, in->ip_len);
    w_u32(w, in->http_port);
    w_u32(w, in->mq_port);
    w_str(w, in->p2p_advertised_url, in->p2p_len);
    w_u32(w, (uint32_t)in->metadata_len);
    w_bytes(w, in->metadata, in->metadata_len);
    w_f64(w, in->registration_time);
    w_u64(w, in->last_seen_ms);
}

int kvidx_dir_change_encode(const kvidx_dir_change_t *c, size_t max_blob, kvidx_dir_emit_fn emit,
                            void *ctx)
{
    if (c->type == KVIDX_DIR_CHG_HEARTBEAT)
        return 0;
    wr_t w;
    int rc = wr_open(&w, max_blob, emit, ctx);
    if (rc)
        return rc;
    switch (c->type) {
    case KVIDX_DIR_CHG_BATCH:
        rc = encode_batch(&w, c->batch, c->verdict);
        break;
    case KVIDX_DIR_CHG_REGISTER:
        if (instance_size(c->instance) > w.cap) {
            rc = KVIDX_EINVAL;
            break;
        }
        if ((rc = wr_reserve(&w, instance_size(c->instance))) != 0)
            break;
        w_instance(&w, B_REGISTER, c->instance);
        rc = flush(&w);
        break;
    case KVIDX_DIR_CHG_DEREGISTER:
    case KVIDX_DIR_CHG_EXPIRE:
        if (c->instance_len > KVIDX_DIR_ID_MAX) {
            rc = KVIDX_EINVAL;
            break;
        }
        w_u8(&w, B_DROP);
        w_str(&w, c->instance_id, c->instance_len);
        rc = flush(&w);
        break;
    case KVIDX_DIR_CHG_TOKEN_CAP:
        w_u8(&w, B_TOKEN_CAP);
        w_u64(&w, c->token_bytes_cap);
        rc = flush(&w);
        break;
    default:
        rc = KVIDX_EINVAL;
    }
    kvidx_free(w.p);
    return rc;
}

int kvidx_dir_record_encode(const kvidx_dir_record_t *r, size_t max_blob, kvidx_dir_emit_fn emit,
                            void *ctx)
{
    wr_t w;
    int rc = wr_open(&w, max_blob, emit, ctx);
    if (rc)
        return rc;
    size_t need = 0;
    switch (r->type) {
    case KVIDX_DIR_REC_INSTANCE:
        need = instance_size(&r->instance);
        break;
    case KVIDX_DIR_REC_STREAM:
        need = 1 + 2 + r->stream.instance_len + 8 * 7 + 1;
        break;
    case KVIDX_DIR_REC_CAPACITY:
        need = 1 + 2 + r->capacity.instance_len + 8 * 3 + 1 + 2 + r->capacity.backend_len + 1;
        break;
    case KVIDX_DIR_REC_KEY:
        need = 1 + key_size(&r->key.key) + 8 + 4;
        for (size_t i = 0; i < r->key.num_placements; i++)
            need += 2 + r->key.placements[i].instance_len + 8 + 1 + 2 +
                    r->key.placements[i].backend_len + 8 + 1;
        break;
    case KVIDX_DIR_REC_BINDING:
        need = 1 + 1 + r->binding.hash_len + 8 + 4 + 4 * r->binding.num_tokens;
        break;
    default:
        kvidx_free(w.p);
        return KVIDX_EINVAL;
    }
    if (need > w.cap || (rc = wr_reserve(&w, need)) != 0) {
        kvidx_free(w.p);
        return need > w.cap ? KVIDX_EINVAL : rc;
    }
    switch (r->type) {
    case KVIDX_DIR_REC_INSTANCE:
        w_instance(&w, B_S_INSTANCE, &r->instance);
        break;
    case KVIDX_DIR_REC_STREAM: {
        const kvidx_dir_stream_t *s = &r->stream;
        w_u8(&w, B_S_STREAM);
        w_str(&w, s->instance_id, s->instance_len);
        w_u64(&w, s->incarnation);
        w_u64(&w, s->last_seq);
        w_u8(&w, (uint8_t)(s->gap != 0));
        w_u64(&w, s->applied);
        w_u64(&w, s->duplicates);
        w_u64(&w, s->stale);
        w_f64(&w, s->last_ts);
        break;
    }
    case KVIDX_DIR_REC_CAPACITY: {
        const kvidx_dir_capacity_t *c = &r->capacity;
        w_u8(&w, B_S_CAPACITY);
        w_str(&w, c->instance_id, c->instance_len);
        w_u64(&w, c->incarnation);
        w_u64(&w, c->capacity_revision);
        w_u8(&w, (uint8_t)c->tier);
        w_str(&w, c->backend, c->backend_len);
        w_u64(&w, c->capacity_bytes);
        w_u8(&w, (uint8_t)(c->shared != 0));
        break;
    }
    case KVIDX_DIR_REC_KEY:
        w_u8(&w, B_S_KEY);
        w_key(&w, &r->key.key);
        w_f64(&w, r->key.last_access);
        w_u32(&w, (uint32_t)r->key.num_placements);
        for (size_t i = 0; i < r->key.num_placements; i++) {
            const kvidx_dir_placement_t *p = &r->key.placements[i];
            w_str(&w, p->instance_id, p->instance_len);
            w_u64(&w, p->incarnation);
            w_u8(&w, (uint8_t)p->tier);
            w_str(&w, p->backend, p->backend_len);
            w_u64(&w, p->size_bytes);
            w_u8(&w, (uint8_t)(p->shared != 0));
        }
        break;
    default: /* KVIDX_DIR_REC_BINDING */
        w_u8(&w, B_S_BINDING);
        w_u8(&w, (uint8_t)r->binding.hash_len);
        w_bytes(&w, r->binding.hash, r->binding.hash_len);
        w_u64(&w, (uint64_t)r->binding.token_offset);
        w_u32(&w, (uint32_t)r->binding.num_tokens);
        for (size_t i = 0; i < r->binding.num_tokens; i++)
            w_u32(&w, r->binding.token_ids[i]);
        break;
    }
    rc = flush(&w);
    kvidx_free(w.p);
    return rc;
}

/* ---- reading ---- */

typedef struct rd {
    const uint8_t *p;
    size_t len, off;
    int bad;
} rd_t;

static int r_need(rd_t *r, size_t n)
{
    if (r->bad || r->len - r->off < n) {
        r->bad = 1;
        return 0;
    }
    return 1;
}
static uint64_t r_uint(rd_t *r, int bytes)
{
    if (!r_need(r, (size_t)bytes))
        return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)r->p[r->off + (size_t)i] << (8 * i);
    r->off += (size_t)bytes;
    return v;
}
static double r_f64(rd_t *r)
{
    uint64_t u = r_uint(r, 8);
    double v;
    memcpy(&v, &u, sizeof(v));
    return v;
}
static const char *r_bytes(rd_t *r, size_t n)
{
    if (!r_need(r, n))
        return NULL;
    const char *s = (const char *)r->p + r->off;
    r->off += n;
    return s;
}
static const char *r_str(rd_t *r, size_t *n)
{
    *n = (size_t)r_uint(r, 2);
    return r_bytes(r, *n);
}
static void r_key(rd_t *r, kvidx_key_t *k)
{
    size_t ml, sl;
    memset(k, 0, sizeof(*k));
    k->model = r_str(r, &ml);
    k->salt = r_str(r, &sl);
    k->kv_rank = (uint32_t)r_uint(r, 4);
    k->group = (uint16_t)r_uint(r, 2);
    size_t hl = (size_t)r_uint(r, 1);
    if (ml > KVIDX_MODEL_MAX || sl > KVIDX_SALT_MAX || hl < KVIDX_HASH_MIN || hl > KVIDX_HASH_MAX) {
        r->bad = 1;
        return;
    }
    k->model_len = (uint16_t)ml;
    k->salt_len = (uint8_t)sl;
    k->hash_len = (uint8_t)hl;
    const char *h = r_bytes(r, hl);
    if (h)
        memcpy(k->hash, h, hl);
}
static void r_instance(rd_t *r, kvidx_dir_instance_t *in)
{
    memset(in, 0, sizeof(*in));
    in->instance_id = r_str(r, &in->instance_len);
    in->ip = r_str(r, &in->ip_len);
    in->http_port = (uint32_t)r_uint(r, 4);
    in->mq_port = (uint32_t)r_uint(r, 4);
    in->p2p_advertised_url = r_str(r, &in->p2p_len);
    in->metadata_len = (size_t)r_uint(r, 4);
    in->metadata = r_bytes(r, in->metadata_len);
    in->registration_time = r_f64(r);
    in->last_seen_ms = r_uint(r, 8);
}

/* ---- replay ---- */

void kvidx_dir_replay_init(kvidx_dir_replay_t *rp, uint64_t now_ms)
{
    memset(rp, 0, sizeof(*rp));
    rp->now_ms = now_ms;
}

void kvidx_dir_replay_free(kvidx_dir_replay_t *rp)
{
    kvidx_free(rp->entries);
    kvidx_free(rp->tokens);
    kvidx_free(rp->tok_off);
    kvidx_free(rp->strings);
    memset(rp, 0, sizeof(*rp));
}

int kvidx_dir_replay_pending(const kvidx_dir_replay_t *rp)
{
    return rp->open;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *np = kvidx_realloc(*p, nc * elem);
    if (!np)
        return KVIDX_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

/* Copies n bytes into the gathered strings: their offset, or SIZE_MAX. */
static size_t keep_str(kvidx_dir_replay_t *rp, const char *s, size_t n)
{
    if (grow((void **)&rp->strings, &rp->strings_cap, rp->strings_len + n + 1, 1))
        return SIZE_MAX;
    size_t at = rp->strings_len;
    if (n)
        memcpy(rp->strings + at, s, n);
    rp->strings_len += n;
    return at;
}

/* Bytes of the smallest encoded entry: empty model and salt, a 1-byte
 * hash, no tokens. */
#define ENTRY_MIN (2 + 2 + 4 + 2 + 1 + KVIDX_HASH_MIN + 8 + 8 + 4)

/* Reads `count` entries into the gathered batch; string and token
 * pointers are offsets until the batch is complete. */
static int gather(kvidx_dir_replay_t *rp, rd_t *r, uint32_t count)
{
    /* The count comes from the blob: it must fit the bytes left (an entry
     * takes at least ENTRY_MIN of them) before anything is sized by it. */
    if (rp->have + count > rp->total || count > (r->len - r->off) / ENTRY_MIN)
        return KVIDX_EINVAL;
    if (grow((void **)&rp->entries, &rp->entries_cap, (size_t)(rp->have + count),
             sizeof(*rp->entries)) ||
        grow((void **)&rp->tok_off, &rp->tok_off_cap, (size_t)(rp->have + count),
             sizeof(*rp->tok_off)))
        return KVIDX_ENOMEM;
    for (uint32_t i = 0; i < count; i++) {
        kvidx_dir_entry_t *e = &rp->entries[rp->have];
        memset(e, 0, sizeof(*e));
        r_key(r, &e->key);
        e->size_bytes = r_uint(r, 8);
        e->token_offset = (int64_t)r_uint(r, 8);
        size_t nt = (size_t)r_uint(r, 4);
        if (r->bad || !r_need(r, 4 * nt))
            return KVIDX_EINVAL;
        size_t mo = keep_str(rp, e->key.model, e->key.model_len);
        size_t so = keep_str(rp, e->key.salt, e->key.salt_len);
        if (mo == SIZE_MAX || so == SIZE_MAX ||
            grow((void **)&rp->tokens, &rp->tokens_cap, rp->tokens_len + nt, sizeof(uint32_t)))
            return KVIDX_ENOMEM;
        e->key.model = (const char *)(uintptr_t)mo;
        e->key.salt = (const char *)(uintptr_t)so;
        rp->tok_off[rp->have] = rp->tokens_len;
        for (size_t t = 0; t < nt; t++)
            rp->tokens[rp->tokens_len++] = (uint32_t)r_uint(r, 4);
        e->num_tokens = nt;
        rp->have++;
    }
    return 0;
}

static int finish_batch(kvidx_dir_replay_t *rp, kvidx_directory_t *d)
{
    kvidx_dir_batch_t *b = &rp->batch;
    const char *base = (const char *)rp->strings;
    b->instance_id = base + (uintptr_t)b->instance_id;
    b->backend = base + (uintptr_t)b->backend;
    for (uint64_t i = 0; i < rp->have; i++) {
        kvidx_dir_entry_t *e = &rp->entries[i];
        e->key.model = base + (uintptr_t)e->key.model;
        e->key.salt = base + (uintptr_t)e->key.salt;
        e->token_ids = e->num_tokens ? rp->tokens + rp->tok_off[i] : NULL;
    }
    b->entries = rp->entries;
    b->num_entries = (size_t)rp->have;
    rp->open = 0;
    kvidx_dir_verdict_t v;
    int rc = kvidx_directory_ingest(d, b, &v);
    if (rc == 0) {
        rp->batches++;
        if (v != rp->verdict)
            rp->mismatches++;
    } else if (rc == KVIDX_ENOMEM) {
        /* Back to offsets, so that the caller can replay the last blob again. */
        b->instance_id = (const char *)(uintptr_t)(b->instance_id - base);
        b->backend = (const char *)(uintptr_t)(b->backend - base);
        for (uint64_t i = 0; i < rp->have; i++) {
            kvidx_dir_entry_t *e = &rp->entries[i];
            e->key.model = (const char *)(uintptr_t)(e->key.model - base);
            e->key.salt = (const char *)(uintptr_t)(e->key.salt - base);
        }
    }
    return rc;
}

static int replay_batch(kvidx_dir_replay_t *rp, kvidx_directory_t *d, rd_t *r)
{
    rp->open = 0;
    rp->have = rp->tokens_len = rp->strings_len = 0;
    kvidx_dir_batch_t *b = &rp->batch;
    memset(b, 0, sizeof(*b));
    rp->verdict = (kvidx_dir_verdict_t)r_uint(r, 1);
    size_t il, bl;
    const char *inst = r_str(r, &il);
    b->incarnation = r_uint(r, 8);
    b->seq = r_uint(r, 8);
    b->event_type = (kvidx_dir_event_t)r_uint(r, 1);
    b->tier = (kvidx_dir_tier_t)r_uint(r, 1);
    const char *be = r_str(r, &bl);
    b->shared = (int)r_uint(r, 1);
    b->ts = r_f64(r);
    b->capacity_bytes = r_uint(r, 8);
    b->capacity_revision = r_uint(r, 8);
    rp->total = r_uint(r, 8);
    uint32_t count = (uint32_t)r_uint(r, 4);
    if (r->bad || rp->verdict > KVIDX_DIR_STALE)
        return KVIDX_EINVAL;
    size_t io = keep_str(rp, inst, il), bo = keep_str(rp, be, bl);
    if (io == SIZE_MAX || bo == SIZE_MAX)
        return KVIDX_ENOMEM;
    b->instance_id = (const char *)(uintptr_t)io;
    b->instance_len = il;
    b->backend = (const char *)(uintptr_t)bo;
    b->backend_len = bl;
    rp->open = 1;
    int rc = gather(rp, r, count);
    if (rc)
        return rc;
    if (r->off != r->len)
        return KVIDX_EINVAL;
    return rp->have == rp->total ? finish_batch(rp, d) : 0;
}

/* A key record of a snapshot: its key and placements (*pl, which the
 * caller frees, points into r's bytes for the strings). */
static int read_key(rd_t *r, kvidx_dir_record_t *rec, kvidx_dir_placement_t **pl)
{
    rec->type = KVIDX_DIR_REC_KEY;
    r_key(r, &rec->key.key);
    rec->key.last_access = r_f64(r);
    size_t n = (size_t)r_uint(r, 4);
    /* A placement takes at least 2 + 8 + 1 + 2 + 8 + 1 bytes. */
    if (r->bad || n > (r->len - r->off) / 22)
        return KVIDX_EINVAL;
    kvidx_dir_placement_t *p = kvidx_malloc((n ? n : 1) * sizeof(*p));
    if (!p)
        return KVIDX_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        p[i].instance_id = r_str(r, &p[i].instance_len);
        p[i].incarnation = r_uint(r, 8);
        p[i].tier = (kvidx_dir_tier_t)r_uint(r, 1);
        p[i].backend = r_str(r, &p[i].backend_len);
        p[i].size_bytes = r_uint(r, 8);
        p[i].shared = (int)r_uint(r, 1);
    }
    rec->key.placements = p;
    rec->key.num_placements = n;
    *pl = p;
    return 0;
}

/* A token binding record of a snapshot, loaded into d. */
static int replay_binding(rd_t *r, kvidx_directory_t *d)
{
    kvidx_dir_record_t rec;
    memset(&rec, 0, sizeof(rec));
    rec.type = KVIDX_DIR_REC_BINDING;
    rec.binding.hash_len = (size_t)r_uint(r, 1);
    rec.binding.hash = (const uint8_t *)r_bytes(r, rec.binding.hash_len);
    rec.binding.token_offset = (int64_t)r_uint(r, 8);
    size_t n = (size_t)r_uint(r, 4);
    if (r->bad || !r_need(r, 4 * n))
        return KVIDX_EINVAL;
    uint32_t *t = kvidx_malloc((n ? n : 1) * sizeof(*t));
    if (!t)
        return KVIDX_ENOMEM;
    for (size_t i = 0; i < n; i++)
        t[i] = (uint32_t)r_uint(r, 4);
    rec.binding.token_ids = t;
    rec.binding.num_tokens = n;
    int rc = r->off != r->len ? KVIDX_EINVAL : kvidx_directory_load(d, &rec);
    kvidx_free(t);
    return rc;
}

/* A registration, a drop, a token cap or a state record (every kind but
 * the batches'), from r after its kind byte. */
static int replay_record(kvidx_dir_replay_t *rp, kvidx_directory_t *d, rd_t *r, int kind)
{
    kvidx_dir_record_t rec;
    memset(&rec, 0, sizeof(rec));
    kvidx_dir_placement_t *pl = NULL;
    int rc = 0;
    switch (kind) {
    case B_REGISTER:
    case B_S_INSTANCE:
        r_instance(r, &rec.instance);
        rec.instance.last_seen_ms = rp->now_ms;
        if (r->bad || r->off != r->len)
            return KVIDX_EINVAL;
        if (kind == B_REGISTER)
            return kvidx_directory_register(d, &rec.instance, NULL);
        rec.type = KVIDX_DIR_REC_INSTANCE;
        break;
    case B_DROP: {
        size_t n;
        const char *id = r_str(r, &n);
        if (r->bad || r->off != r->len)
            return KVIDX_EINVAL;
        kvidx_directory_deregister(d, id, n);
        return 0;
    }
    case B_TOKEN_CAP: {
        uint64_t cap = r_uint(r, 8);
        if (r->bad || r->off != r->len)
            return KVIDX_EINVAL;
        kvidx_directory_set_token_cap(d, cap);
        return 0;
    }
    case B_S_STREAM: {
        kvidx_dir_stream_t *s = &rec.stream;
        rec.type = KVIDX_DIR_REC_STREAM;
        s->instance_id = r_str(r, &s->instance_len);
        s->incarnation = r_uint(r, 8);
        s->last_seq = r_uint(r, 8);
        s->gap = (int)r_uint(r, 1);
        s->applied = r_uint(r, 8);
        s->duplicates = r_uint(r, 8);
        s->stale = r_uint(r, 8);
        s->last_ts = r_f64(r);
        break;
    }
    case B_S_CAPACITY: {
        kvidx_dir_capacity_t *c = &rec.capacity;
        rec.type = KVIDX_DIR_REC_CAPACITY;
        c->instance_id = r_str(r, &c->instance_len);
        c->incarnation = r_uint(r, 8);
        c->capacity_revision = r_uint(r, 8);
        c->tier = (kvidx_dir_tier_t)r_uint(r, 1);
        c->backend = r_str(r, &c->backend_len);
        c->capacity_bytes = r_uint(r, 8);
        c->shared = (int)r_uint(r, 1);
        break;
    }
    case B_S_KEY:
        rc = read_key(r, &rec, &pl);
        if (rc)
            return rc;
        break;
    case B_S_BINDING:
        return replay_binding(r, d);
    default:
        return KVIDX_EINVAL;
    }
    if (r->bad || r->off != r->len)
        rc = KVIDX_EINVAL;
    else
        rc = kvidx_directory_load(d, &rec);
    kvidx_free(pl);
    return rc;
}

int kvidx_dir_replay_blob(kvidx_dir_replay_t *rp, kvidx_directory_t *d, const uint8_t *blob,
                          size_t len)
{
    rd_t r = {blob, len, 0, 0};
    int kind = (int)r_uint(&r, 1);
    if (r.bad)
        return KVIDX_EINVAL;
    /* Out of memory in a batch's blob leaves the gathering as it was
     * before the blob (the directory is unchanged too), so that the blob
     * can be replayed again. */
    uint64_t total = rp->total, have = rp->have;
    size_t tokens_len = rp->tokens_len, strings_len = rp->strings_len;
    if (kind == B_MORE) {
        if (!rp->open)
            return KVIDX_EINVAL;
        uint32_t count = (uint32_t)r_uint(&r, 4);
        int rc = gather(rp, &r, count);
        if (rc == 0 && r.off != r.len)
            return KVIDX_EINVAL;
        if (rc == 0 && rp->have == rp->total)
            rc = finish_batch(rp, d);
        if (rc == KVIDX_ENOMEM) {
            rp->have = have;
            rp->tokens_len = tokens_len;
            rp->strings_len = strings_len;
            rp->open = 1;
        }
        return rc;
    }
    /* A batch whose blobs stop before its last entry is one the journal
     * could not take whole (out of memory opened a gap there): it was
     * never acknowledged, and is dropped. */
    if (rp->open) {
        rp->open = 0;
        rp->dropped++;
    }
    if (kind == B_BATCH) {
        int rc = replay_batch(rp, d, &r);
        if (rc == KVIDX_ENOMEM) {
            /* A batch that was open before is dropped all the same. */
            rp->total = total;
            rp->have = have;
            rp->tokens_len = tokens_len;
            rp->strings_len = strings_len;
            rp->open = 0;
        }
        return rc;
    }
    return replay_record(rp, d, &r, kind);
}
