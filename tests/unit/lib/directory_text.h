/*
 * Test helpers for the fleet directory: keys and batches built from short
 * literals, and the whole state rendered as canonical text (one line per
 * dump record), so that two directories, or a directory and a reference
 * model, compare with one string comparison.
 */
#ifndef KVIDX_TEST_DIRECTORY_TEXT_H
#define KVIDX_TEST_DIRECTORY_TEXT_H

#include "kvidx/directory.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing string. */
typedef struct tbuf {
    char *s;
    size_t len, cap;
} tbuf_t;

static inline void tb_printf(tbuf_t *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->len + (size_t)n + 1)
            nc *= 2;
        b->s = realloc(b->s, nc);
        b->cap = nc;
    }
}

static inline void tb_room(tbuf_t *b, size_t n)
{
    if (b->len + n + 1 <= b->cap)
        return;
    size_t nc = b->cap ? b->cap * 2 : 4096;
    while (nc < b->len + n + 1)
        nc *= 2;
    b->s = realloc(b->s, nc);
    b->cap = nc;
}

static inline void tb_bytes(tbuf_t *b, const char *s, size_t n)
{
    tb_room(b, n);
    if (n)
        memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static inline void tb_hex(tbuf_t *b, const uint8_t *h, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    tb_room(b, 2 * n);
    for (size_t i = 0; i < n; i++) {
        b->s[b->len++] = digits[h[i] >> 4];
        b->s[b->len++] = digits[h[i] & 15];
    }
    b->s[b->len] = '\0';
}

static inline void tb_u64(tbuf_t *b, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    tb_room(b, n);
    while (n)
        b->s[b->len++] = tmp[--n];
    b->s[b->len] = '\0';
}

/* A double as the bits that make it: exact, and much cheaper than %.17g. */
static inline void tb_f64(tbuf_t *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    tb_u64(b, u);
}

static inline void tb_str(tbuf_t *b, const char *s)
{
    tb_bytes(b, s, strlen(s));
}

static inline const char *tier_name(int t)
{
    return t == KVIDX_DIR_L1 ? "l1" : t == KVIDX_DIR_L2 ? "l2" : "all";
}

static inline void tb_key(tbuf_t *b, const kvidx_key_t *k)
{
    tb_bytes(b, k->salt, k->salt_len);
    tb_str(b, "|");
    tb_bytes(b, k->model, k->model_len);
    tb_str(b, "|");
    tb_u64(b, k->kv_rank);
    tb_str(b, "|");
    tb_u64(b, k->group);
    tb_str(b, "|");
    tb_hex(b, k->hash, k->hash_len);
}

static inline void tb_placement(tbuf_t *b, const kvidx_dir_placement_t *p)
{
    tb_bytes(b, p->instance_id, p->instance_len);
    tb_str(b, ",");
    tb_u64(b, p->incarnation);
    tb_str(b, ",");
    tb_str(b, tier_name(p->tier));
    tb_str(b, ",");
    tb_bytes(b, p->backend, p->backend_len);
    tb_str(b, ",");
    tb_u64(b, p->size_bytes);
    tb_str(b, p->shared ? ",1;" : ",0;");
}

static inline int tb_record(void *ctx, const kvidx_dir_record_t *r)
{
    tbuf_t *b = ctx;
    switch (r->type) {
    case KVIDX_DIR_REC_INSTANCE: {
        const kvidx_dir_instance_t *x = &r->instance;
        tb_printf(b, "I ");
        tb_bytes(b, x->instance_id, x->instance_len);
        tb_printf(b, " ");
        tb_bytes(b, x->ip, x->ip_len);
        tb_printf(b, " %u %u ", x->http_port, x->mq_port);
        tb_bytes(b, x->p2p_advertised_url, x->p2p_len);
        tb_printf(b, " ");
        tb_bytes(b, x->metadata, x->metadata_len);
        tb_printf(b, " %.17g %llu\n", x->registration_time, (unsigned long long)x->last_seen_ms);
        break;
    }
    case KVIDX_DIR_REC_STREAM: {
        const kvidx_dir_stream_t *s = &r->stream;
        tb_printf(b, "S ");
        tb_bytes(b, s->instance_id, s->instance_len);
        tb_printf(b, " %llu %llu %d %llu %llu %llu %.17g\n", (unsigned long long)s->incarnation,
                  (unsigned long long)s->last_seq, s->gap, (unsigned long long)s->applied,
                  (unsigned long long)s->duplicates, (unsigned long long)s->stale, s->last_ts);
        break;
    }
    case KVIDX_DIR_REC_CAPACITY: {
        const kvidx_dir_capacity_t *c = &r->capacity;
        tb_printf(b, "C ");
        tb_bytes(b, c->instance_id, c->instance_len);
        tb_printf(b, " %llu %llu %s ", (unsigned long long)c->incarnation,
                  (unsigned long long)c->capacity_revision, tier_name(c->tier));
        tb_bytes(b, c->backend, c->backend_len);
        tb_printf(b, " %llu %d\n", (unsigned long long)c->capacity_bytes, c->shared);
        break;
    }
    case KVIDX_DIR_REC_KEY:
        tb_str(b, "K ");
        tb_key(b, &r->key.key);
        tb_str(b, " ");
        tb_f64(b, r->key.last_access);
        tb_str(b, " :");
        for (size_t i = 0; i < r->key.num_placements; i++)
            tb_placement(b, &r->key.placements[i]);
        tb_printf(b, "\n");
        break;
    case KVIDX_DIR_REC_BINDING:
        tb_printf(b, "B ");
        tb_hex(b, r->binding.hash, r->binding.hash_len);
        tb_printf(b, " %lld", (long long)r->binding.token_offset);
        for (size_t i = 0; i < r->binding.num_tokens; i++)
            tb_printf(b, "%c%u", i ? ',' : ' ', r->binding.token_ids[i]);
        tb_printf(b, "\n");
        break;
    }
    return 0;
}

/* The state as text; the caller frees it. NULL only when the dump failed. */
static inline char *dir_text(const kvidx_directory_t *d)
{
    tbuf_t b = {0};
    tb_printf(&b, "%s", "");
    if (kvidx_directory_dump(d, tb_record, &b) != 0) {
        free(b.s);
        return NULL;
    }
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    tb_printf(&b, "cap %llu dropped %llu %llu\n", (unsigned long long)st.token_bytes_cap,
              (unsigned long long)st.bindings_dropped, (unsigned long long)st.tokens_dropped);
    return b.s;
}

/* A key with a 32-byte (or hlen-byte) hash made from h. model and salt must
 * outlive the key. */
static inline kvidx_key_t mkkey_len(const char *model, const char *salt, uint32_t rank,
                                    uint16_t group, unsigned h, uint8_t hlen)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)strlen(model);
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.kv_rank = rank;
    k.group = group;
    k.hash_len = hlen;
    for (unsigned i = 0; i < hlen; i++)
        k.hash[i] = (uint8_t)(h * 31 + i * 7 + (h >> 8));
    k.hash[0] = (uint8_t)h;
    return k;
}

static inline kvidx_key_t mkkey(const char *model, const char *salt, uint32_t rank, uint16_t group,
                                unsigned h)
{
    return mkkey_len(model, salt, rank, group, h, 32);
}

static inline kvidx_dir_batch_t mkbatch(const char *inst, uint64_t inc, uint64_t seq,
                                        kvidx_dir_event_t ev, kvidx_dir_tier_t tier,
                                        const char *backend, const kvidx_dir_entry_t *e, size_t n)
{
    kvidx_dir_batch_t b;
    memset(&b, 0, sizeof(b));
    b.instance_id = inst;
    b.instance_len = strlen(inst);
    b.incarnation = inc;
    b.seq = seq;
    b.event_type = ev;
    b.tier = tier;
    b.backend = backend;
    b.backend_len = strlen(backend);
    b.entries = e;
    b.num_entries = n;
    return b;
}

static inline kvidx_dir_entry_t mkentry(kvidx_key_t k, uint64_t size)
{
    kvidx_dir_entry_t e;
    memset(&e, 0, sizeof(e));
    e.key = k;
    e.size_bytes = size;
    e.token_offset = KVIDX_DIR_UNKNOWN_OFFSET;
    return e;
}

#endif
