/*
 * Parser of the `GET /v1/keys` query string (docs/page_tokens.md) and the digest of
 * its filters.
 *
 * The parser walks the `&`-separated pairs once and percent-decodes each
 * value straight into the fixed buffer of its field (or, for numbers, into
 * an accumulator), so a query costs O(n) and never allocates. Invariants of
 * a successfully parsed kvidx_list_query_t: each string is NUL-terminated
 * and valid per docs/keys.md; has_model implies model_len >= 1; page_size is in
 * 1..KVIDX_PAGE_SIZE_MAX; fields whose has_* flag is clear are zero, so two
 * parses of equal queries compare equal field by field.
 *
 * Strictness is deliberate: an unknown or repeated parameter is an error, not
 * ignored, because a typo (`modelname=`) would otherwise list every key.
 */
#include "kvidx/list_query.h"

#include "kvidx/err.h"

#include <sodium.h>
#include <string.h>

/* Domain separation for the digest, so it can never equal another BLAKE2b
 * output of libkvidx; bump the version if the encoding below changes. */
static const char digest_domain[] = "kvidx list filters v1";

static int fail(kvidx_reason_t *why, const char *field, const char *rule, int err)
{
    if (why) {
        why->field = field;
        why->rule = rule;
    }
    return err;
}

/* Reads one decoded byte of s[*i..n): a `%XX` escape, `+` as a space (when
 * plus_is_space), or the byte itself. Returns 0..255, or -1 for a `%` not
 * followed by two hex digits. */
static int next_byte_mode(const char *s, size_t n, size_t *i, int plus_is_space)
{
    unsigned char c = (unsigned char)s[*i];
    if (c == '%') {
        if (n - *i < 3)
            return -1;
        int hi = kvidx_hex_value((unsigned char)s[*i + 1]);
        int lo = kvidx_hex_value((unsigned char)s[*i + 2]);
        if (hi < 0 || lo < 0)
            return -1;
        *i += 3;
        return hi << 4 | lo;
    }
    (*i)++;
    return c == '+' && plus_is_space ? ' ' : c;
}

static int next_byte(const char *s, size_t n, size_t *i)
{
    return next_byte_mode(s, n, i, 1);
}

int kvidx_pct_decode(const char *s, size_t n, char *buf, size_t cap, size_t *len, int plus_is_space)
{
    size_t i = 0, k = 0;
    int too_long = cap == 0;
    while (i < n) {
        int c = next_byte_mode(s, n, &i, plus_is_space);
        if (c < 0)
            return KVIDX_EINVAL;
        if (k + 1 < cap)
            buf[k++] = (char)c;
        else
            too_long = 1;
    }
    if (too_long)
        return KVIDX_ENOBUFS;
    buf[k] = '\0';
    if (len)
        *len = k;
    return 0;
}

/* The form decoding of the listing query: 0, -1 for a bad escape, -2 when
 * the value is longer than cap - 1. */
static int decode(const char *s, size_t n, char *buf, size_t cap, size_t *len)
{
    int rc = kvidx_pct_decode(s, n, buf, cap, len, 1);
    return rc == 0 ? 0 : rc == KVIDX_EINVAL ? -1 : -2;
}

/* Parses a decimal (or, when allow_hex, `0x`-prefixed hex) unsigned integer
 * from the encoded value s[0..n). Values past UINT64_MAX saturate, which is
 * enough for every range check below. Returns 0, -1 when not an integer,
 * -2 for a bad escape. */
static int decode_uint(const char *s, size_t n, int allow_hex, uint64_t *out)
{
    size_t i = 0, digits = 0;
    unsigned base = 10;
    uint64_t v = 0;
    int c0 = -1, c1 = -1;
    size_t j = 0;
    /* Peek at the first two decoded bytes for the 0x prefix. */
    if (j < n && (c0 = next_byte(s, n, &j)) < 0)
        return -2;
    if (c0 == '0' && j < n && (c1 = next_byte(s, n, &j)) < 0)
        return -2;
    if (allow_hex && c0 == '0' && (c1 == 'x' || c1 == 'X')) {
        base = 16;
        i = j;
    }
    while (i < n) {
        int c = next_byte(s, n, &i);
        if (c < 0)
            return -2;
        int d =
            base == 16 ? kvidx_hex_value((unsigned char)c) : (c >= '0' && c <= '9' ? c - '0' : -1);
        if (d < 0)
            return -1;
        if (v > (UINT64_MAX - (uint64_t)d) / base)
            v = UINT64_MAX;
        else
            v = v * base + (uint64_t)d;
        digits++;
    }
    if (digits == 0)
        return -1;
    *out = v;
    return 0;
}

enum param { P_MODEL, P_SALT, P_RANK, P_GROUP, P_TIER, P_PAGE_SIZE, P_PAGE_TOKEN, P_COUNT };

static const char *const param_names[P_COUNT] = {
    "model_name", "cache_salt", "kv_rank", "object_group_id", "tier", "page_size", "page_token",
};

/* Returns the parameter named by the encoded name s[0..n), or -1 when
 * unknown (or badly escaped: no known name needs an escape to be spelled,
 * but `model%5Fname` is accepted as form decoders do). */
static int lookup_param(const char *s, size_t n)
{
    char name[24];
    size_t len;
    if (decode(s, n, name, sizeof name, &len) != 0)
        return -1;
    for (int p = 0; p < P_COUNT; p++)
        if (strlen(param_names[p]) == len && memcmp(param_names[p], name, len) == 0)
            return p;
    return -1;
}

static int parse_value(enum param p, const char *v, size_t vn, kvidx_list_query_t *q,
                       kvidx_reason_t *why)
{
    const char *field = param_names[p];
    size_t len = 0;
    uint64_t u = 0;
    int rc;
    switch (p) {
    case P_MODEL:
        rc = decode(v, vn, q->model, sizeof q->model, &len);
        if (rc == -1)
            return fail(why, field, "bad percent-escape (want %XX with two hex digits)",
                        KVIDX_EINVAL);
        if (rc == -2)
            return fail(why, field, "must be at most 255 bytes", KVIDX_EINVAL);
        if (kvidx_key_check_model(q->model, len, why) != 0)
            return KVIDX_EINVAL;
        q->has_model = 1;
        q->model_len = (uint16_t)len;
        return 0;
    case P_SALT:
        rc = decode(v, vn, q->salt, sizeof q->salt, &len);
        if (rc == -1)
            return fail(why, field, "bad percent-escape (want %XX with two hex digits)",
                        KVIDX_EINVAL);
        if (rc == -2)
            return fail(why, field, "must be at most 128 bytes", KVIDX_EINVAL);
        if (kvidx_key_check_salt(q->salt, len, why) != 0)
            return KVIDX_EINVAL;
        q->has_salt = 1;
        q->salt_len = (uint8_t)len;
        return 0;
    case P_RANK:
    case P_GROUP:
        rc = decode_uint(v, vn, 1, &u);
        if (rc == -2)
            return fail(why, field, "bad percent-escape (want %XX with two hex digits)",
                        KVIDX_EINVAL);
        if (rc == -1)
            return fail(why, field, "must be a decimal integer or hex with 0x", KVIDX_EINVAL);
        if (p == P_RANK) {
            if (u > UINT32_MAX)
                return fail(why, field, "must be at most 4294967295", KVIDX_EINVAL);
            q->has_rank = 1;
            q->kv_rank = (uint32_t)u;
        } else {
            if (u > KVIDX_GROUP_MAX)
                return fail(why, field, "must be at most 65535", KVIDX_EINVAL);
            q->has_group = 1;
            q->group = (uint16_t)u;
        }
        return 0;
    case P_TIER: {
        char t[4];
        if (decode(v, vn, t, sizeof t, &len) == -1)
            return fail(why, field, "bad percent-escape (want %XX with two hex digits)",
                        KVIDX_EINVAL);
        if (len == 2 && memcmp(t, "l1", 2) == 0)
            q->tier = KVIDX_LIST_TIER_L1;
        else if (len == 2 && memcmp(t, "l2", 2) == 0)
            q->tier = KVIDX_LIST_TIER_L2;
        else if (len == 3 && memcmp(t, "any", 3) == 0)
            q->tier = KVIDX_LIST_TIER_ANY;
        else
            return fail(why, field, "must be l1, l2 or any", KVIDX_EINVAL);
        return 0;
    }
    case P_PAGE_SIZE:
        rc = decode_uint(v, vn, 0, &u);
        if (rc == -2)
            return fail(why, field, "bad percent-escape (want %XX with two hex digits)",
                        KVIDX_EINVAL);
        if (rc == -1)
            return fail(why, field, "must be a non-negative decimal integer", KVIDX_EINVAL);
        if (u == 0)
            u = KVIDX_PAGE_SIZE_DEFAULT;
        if (u > KVIDX_PAGE_SIZE_MAX)
            u = KVIDX_PAGE_SIZE_MAX;
        q->page_size = (uint32_t)u;
        return 0;
    case P_PAGE_TOKEN:
        rc = decode(v, vn, q->token, sizeof q->token, &len);
        if (rc == -1)
            return fail(why, field, "bad percent-escape (want %XX with two hex digits)",
                        KVIDX_EINVAL);
        if (rc == -2)
            return fail(why, field, "is longer than any token this server issues", KVIDX_ETOKEN);
        q->token_len = (uint16_t)len;
        return 0;
    case P_COUNT:
        break;
    }
    return fail(why, "query", "internal: unhandled parameter", KVIDX_EINTERNAL);
}

int kvidx_query_next(const char *qs, size_t n, size_t *pos, kvidx_query_pair_t *p)
{
    size_t i = *pos;
    while (i < n) {
        size_t start = i;
        while (i < n && qs[i] != '&')
            i++;
        size_t end = i;
        if (i < n)
            i++; /* skip '&' */
        if (end == start)
            continue;
        size_t eq = start;
        while (eq < end && qs[eq] != '=')
            eq++;
        p->name = qs + start;
        p->name_len = eq - start;
        p->value = eq < end ? qs + eq + 1 : qs + end;
        p->value_len = eq < end ? end - eq - 1 : 0;
        p->off = start;
        *pos = i;
        return 1;
    }
    *pos = n;
    return 0;
}

int kvidx_list_query_parse(const char *qs, size_t n, kvidx_list_query_t *out, kvidx_reason_t *why,
                           kvidx_query_span_t *where)
{
    unsigned seen = 0;
    memset(out, 0, sizeof *out);
    out->page_size = KVIDX_PAGE_SIZE_DEFAULT;
    out->tier = KVIDX_LIST_TIER_ANY;

    size_t pos = 0;
    kvidx_query_pair_t qp;
    while (kvidx_query_next(qs, n, &pos, &qp)) {
        const char *v = qp.value;
        size_t vn = qp.value_len;
        if (where) {
            where->off = qp.off;
            where->len = qp.name_len;
        }
        int p = lookup_param(qp.name, qp.name_len);
        if (p < 0)
            return fail(why, "query",
                        "unknown parameter (known: model_name, cache_salt, kv_rank, "
                        "object_group_id, tier, page_size, page_token)",
                        KVIDX_EINVAL);
        if (seen & (1u << p))
            return fail(why, param_names[p], "must not be given more than once", KVIDX_EINVAL);
        seen |= 1u << p;
        int rc = parse_value((enum param)p, v, vn, out, why);
        if (rc != 0)
            return rc;
    }
    if (where) {
        where->off = 0;
        where->len = 0;
    }
    return 0;
}

/* ---- writing a query back ---- */

static int unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

/* An output cursor that counts what it would write past the buffer's end, so
 * one pass gives both the text and the size needed. */
struct out {
    char *buf;
    size_t cap;
    size_t len;
};

static void put(struct out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (o->len < o->cap)
            o->buf[o->len] = s[i];
        o->len++;
    }
}

static void put_str(struct out *o, const char *s)
{
    put(o, s, strlen(s));
}

static void put_escaped(struct out *o, const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (unreserved(c)) {
            put(o, (const char *)&c, 1);
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            put(o, e, 3);
        }
    }
}

static void put_uint(struct out *o, uint64_t v)
{
    char d[20];
    size_t k = sizeof d;
    do {
        d[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(o, d + k, sizeof d - k);
}

int kvidx_list_query_encode(const kvidx_list_query_t *q, char *buf, size_t *size)
{
    struct out o = {buf, *size, 0};
    const char *sep = "";
    if (q->has_model) {
        put_str(&o, "model_name=");
        put_escaped(&o, q->model, q->model_len);
        sep = "&";
    }
    if (q->has_salt) {
        put_str(&o, sep);
        put_str(&o, "cache_salt=");
        put_escaped(&o, q->salt, q->salt_len);
        sep = "&";
    }
    if (q->has_rank) {
        put_str(&o, sep);
        put_str(&o, "kv_rank=");
        put_uint(&o, q->kv_rank);
        sep = "&";
    }
    if (q->has_group) {
        put_str(&o, sep);
        put_str(&o, "object_group_id=");
        put_uint(&o, q->group);
        sep = "&";
    }
    if (q->tier != KVIDX_LIST_TIER_ANY) {
        put_str(&o, sep);
        put_str(&o, q->tier == KVIDX_LIST_TIER_L1 ? "tier=l1" : "tier=l2");
        sep = "&";
    }
    put_str(&o, sep);
    put_str(&o, "page_size=");
    put_uint(&o, q->page_size);
    if (q->token_len) {
        put_str(&o, "&page_token=");
        put_escaped(&o, q->token, q->token_len);
    }
    if (o.len + 1 > *size) {
        *size = o.len + 1;
        return KVIDX_ENOBUFS;
    }
    buf[o.len] = '\0';
    *size = o.len;
    return 0;
}

/* ---- the filter digest ---- */

static void absorb_u8(crypto_generichash_state *st, uint8_t v)
{
    crypto_generichash_update(st, &v, 1);
}

static void absorb_be(crypto_generichash_state *st, uint64_t v, size_t bytes)
{
    uint8_t b[8];
    for (size_t i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    crypto_generichash_update(st, b, bytes);
}

void kvidx_list_query_digest(const kvidx_list_query_t *q, uint8_t out[KVIDX_LIST_DIGEST_LEN])
{
    /* Each filter is a presence byte followed, when present, by its value;
     * strings carry their length first. Every field has a fixed place, so no
     * two different filter sets share an encoding. */
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, KVIDX_LIST_DIGEST_LEN);
    crypto_generichash_update(&st, (const unsigned char *)digest_domain, sizeof digest_domain);
    absorb_u8(&st, q->has_model);
    if (q->has_model) {
        absorb_be(&st, q->model_len, 2);
        crypto_generichash_update(&st, (const unsigned char *)q->model, q->model_len);
    }
    absorb_u8(&st, q->has_salt);
    if (q->has_salt) {
        absorb_be(&st, q->salt_len, 1);
        crypto_generichash_update(&st, (const unsigned char *)q->salt, q->salt_len);
    }
    absorb_u8(&st, q->has_rank);
    if (q->has_rank)
        absorb_be(&st, q->kv_rank, 4);
    absorb_u8(&st, q->has_group);
    if (q->has_group)
        absorb_be(&st, q->group, 2);
    absorb_u8(&st, (uint8_t)q->tier);
    crypto_generichash_final(&st, out, KVIDX_LIST_DIGEST_LEN);
    sodium_memzero(&st, sizeof st);
}

int kvidx_list_query_equal(const kvidx_list_query_t *a, const kvidx_list_query_t *b)
{
    if (a->has_model != b->has_model || a->has_salt != b->has_salt || a->has_rank != b->has_rank ||
        a->has_group != b->has_group || a->tier != b->tier || a->page_size != b->page_size ||
        a->token_len != b->token_len)
        return 0;
    if (a->has_model &&
        (a->model_len != b->model_len || memcmp(a->model, b->model, a->model_len) != 0))
        return 0;
    if (a->has_salt && (a->salt_len != b->salt_len || memcmp(a->salt, b->salt, a->salt_len) != 0))
        return 0;
    if (a->has_rank && a->kv_rank != b->kv_rank)
        return 0;
    if (a->has_group && a->group != b->group)
        return 0;
    return memcmp(a->token, b->token, a->token_len) == 0;
}
