/*
 * The ObjectKey of docs/keys.md: field validation, the canonical and FS string
 * forms, kv_rank packing and the ipc-form expansion arithmetic.
 *
 * Invariants: a kvidx_key_t produced here (by kvidx_key_from_input or either
 * parser) always satisfies every rule of docs/keys.md, so the encoders never
 * have to re-validate and parse(encode(k)) == k for every such key (the one
 * exception, a model name whose FS spelling contains a spurious "-SEP-", is
 * documented in docs/keys.md). The key is a view: model and salt point into
 * caller memory and nothing here allocates. Every rejection names the field
 * and the rule with static strings, never echoing the input bytes.
 */
#include "kvidx/key.h"
#include "bytes_int.h"
#include "kvidx/err.h"

#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static const char hex_digits[] = "0123456789abcdef";

static int reject(kvidx_reason_t *why, const char *field, const char *rule)
{
    if (why) {
        why->field = field;
        why->rule = rule;
    }
    return KVIDX_EKEY;
}

/* Value of each byte as a hex digit (either case), or 0xff: one load per
 * digit instead of a call and three range tests (hex decoding was 14-23 %
 * of a 1000-key lookup). */
static const uint8_t hex_table[256] = {
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
};

int kvidx_hex_value(unsigned char c)
{
    uint8_t v = hex_table[c];
    return v == 0xff ? -1 : v;
}

/* Returns NULL when s[0..n) is well-formed UTF-8, else the rule it breaks.
 * Overlong forms, UTF-16 surrogates and code points past U+10FFFF are
 * refused because JSON encoders and filesystems disagree about them, which
 * would let two spellings name one key. */
static const char *utf8_problem(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xc0 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
            min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
            min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf7) {
            len = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return "must be valid UTF-8 (stray continuation or invalid lead byte)";
        }
        if (n - i < len)
            return "must be valid UTF-8 (truncated sequence)";
        for (size_t k = 1; k < len; k++) {
            unsigned cc = s[i + k];
            if ((cc & 0xc0) != 0x80)
                return "must be valid UTF-8 (truncated sequence)";
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (cp < min)
            return "must be valid UTF-8 (overlong encoding)";
        if (cp >= 0xd800 && cp <= 0xdfff)
            return "must be valid UTF-8 (UTF-16 surrogate)";
        if (cp > 0x10ffff)
            return "must be valid UTF-8 (code point beyond U+10FFFF)";
        i += len;
    }
    return NULL;
}

int kvidx_key_check_model(const char *s, size_t n, kvidx_reason_t *why)
{
    if (n == 0)
        return reject(why, "model_name", "must not be empty");
    if (n > KVIDX_MODEL_MAX)
        return reject(why, "model_name", "must be at most 255 bytes");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '@')
            return reject(why, "model_name", "must not contain '@'");
        if (c == 0)
            return reject(why, "model_name", "must not contain NUL");
        if (c < 0x20)
            return reject(why, "model_name", "must not contain control characters (< 0x20)");
    }
    const char *bad = utf8_problem((const unsigned char *)s, n);
    if (bad)
        return reject(why, "model_name", bad);
    return 0;
}

int kvidx_key_check_salt(const char *s, size_t n, kvidx_reason_t *why)
{
    if (n > KVIDX_SALT_MAX)
        return reject(why, "cache_salt", "must be at most 128 bytes");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '@')
            return reject(why, "cache_salt", "must not contain '@'");
        if (c == '/')
            return reject(why, "cache_salt", "must not contain '/'");
        if (c == '\\')
            return reject(why, "cache_salt", "must not contain '\\'");
        if (c == 0)
            return reject(why, "cache_salt", "must not contain NUL");
    }
    /* docs/keys.md is silent on the salt's encoding; it travels in JSON
     * responses, so it has to be UTF-8 (docs/keys.md). */
    const char *bad = utf8_problem((const unsigned char *)s, n);
    if (bad)
        return reject(why, "cache_salt", bad);
    return 0;
}

#define ONES   UINT64_C(0x0101010101010101)
#define HIGHS  UINT64_C(0x8080808080808080)
#define LANE16 UINT64_C(0x00ff00ff00ff00ff)

/* Decodes 8 hex digits (either case) into 4 bytes, 8 at a time in one
 * 64-bit word; -1 (out untouched) if any byte is not a hex digit. Each
 * byte is below 0x80, so adding a constant below 0x80 never carries into
 * the next byte, and bit 7 of the sum says "at least" per byte. */
static int hex8(const char *in, uint8_t out[4])
{
    uint64_t x = kvidx_le64(in);
    if (x & HIGHS)
        return -1;
    uint64_t ge_0 = x + ONES * (0x80 - '0'), ge_colon = x + ONES * (0x80 - ':');
    uint64_t lc = x | ONES * 0x20; /* letters folded to lower case */
    uint64_t ge_a = lc + ONES * (0x80 - 'a'), ge_g = lc + ONES * (0x80 - 'g');
    uint64_t digit = ge_0 & ~ge_colon, letter = ge_a & ~ge_g;
    if (((digit | letter) & HIGHS) != HIGHS)
        return -1;
    /* '0'..'9' -> low nibble; 'a'..'f' and 'A'..'F' (bit 6 set) -> +9. */
    uint64_t v = (x & ONES * 0x0f) + 9 * ((x >> 6) & ONES);
    /* Bytes (hi, lo) pairs -> one byte per 16-bit lane, then packed. */
    uint64_t t = ((v & LANE16) << 4) | ((v >> 8) & LANE16);
    t = (t | (t >> 8)) & UINT64_C(0x0000ffff0000ffff);
    t = (t | (t >> 16)) & UINT64_C(0x00000000ffffffff);
    uint32_t o = (uint32_t)t;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    o = __builtin_bswap32(o);
#endif
    memcpy(out, &o, 4);
    return 0;
}

#if defined(__SSE2__)
/* 16 hex digits into 8 bytes with SSE2 (every x86-64 has it); -1 (out
 * untouched) if any byte is not a hex digit. Bytes of 0x80 and above are
 * negative as signed bytes and fail both range tests. */
static int hex16(const char *in, uint8_t out[8])
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)in);
    __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8('0' - 1)),
                                  _mm_cmplt_epi8(v, _mm_set1_epi8('9' + 1)));
    __m128i lc = _mm_or_si128(v, _mm_set1_epi8(0x20));
    __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(lc, _mm_set1_epi8('a' - 1)),
                                   _mm_cmplt_epi8(lc, _mm_set1_epi8('f' + 1)));
    if (_mm_movemask_epi8(_mm_or_si128(digit, letter)) != 0xffff)
        return -1;
    __m128i val = _mm_or_si128(_mm_and_si128(digit, _mm_sub_epi8(v, _mm_set1_epi8('0'))),
                               _mm_andnot_si128(digit, _mm_sub_epi8(lc, _mm_set1_epi8('a' - 10))));
    /* 16-bit lanes (first digit low, second high) -> first << 4 | second. */
    __m128i hi = _mm_slli_epi16(_mm_and_si128(val, _mm_set1_epi16(0x00ff)), 4);
    __m128i pair = _mm_or_si128(hi, _mm_srli_epi16(val, 8));
    _mm_storel_epi64((__m128i *)(void *)out, _mm_packus_epi16(pair, pair));
    return 0;
}
#endif

int kvidx_key_hash_from_hex(const char *hex, size_t n, uint8_t *out, uint8_t *out_len,
                            kvidx_reason_t *why)
{
    if (n < 2 * KVIDX_HASH_MIN || n > 2 * KVIDX_HASH_MAX)
        return reject(why, "chunk_hash_hex", "must be 2..128 hex digits");
    if (n % 2 != 0)
        return reject(why, "chunk_hash_hex", "must have an even number of hex digits");
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16)
        if (hex16(hex + i, out + i / 2) != 0)
            return reject(why, "chunk_hash_hex", "must contain only hex digits (no spaces)");
#endif
    for (; i + 8 <= n; i += 8)
        if (hex8(hex + i, out + i / 2) != 0)
            return reject(why, "chunk_hash_hex", "must contain only hex digits (no spaces)");
    for (; i < n; i += 2) {
        unsigned hi = hex_table[(unsigned char)hex[i]];
        unsigned lo = hex_table[(unsigned char)hex[i + 1]];
        if ((hi | lo) > 0xf)
            return reject(why, "chunk_hash_hex", "must contain only hex digits (no spaces)");
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    *out_len = (uint8_t)(n / 2);
    return 0;
}

int kvidx_key_integral(double v, double lo, double hi, uint64_t *out)
{
    /* Written so that NaN fails every comparison and is rejected; the
     * result is unsigned, so nothing below zero is accepted whatever lo is. */
    if (!(v >= lo && v <= hi) || !(v >= 0) || !isfinite(v) || floor(v) != v)
        return KVIDX_EKEY;
    *out = (uint64_t)v;
    return 0;
}

/* One integer member of a key object: a JSON number whose value is
 * integral and in 0..hi. Fractions are refused, never truncated. */
static int integer_field(const kvidx_field_t *f, const char *field, double hi,
                         const char *range_rule, uint64_t *out, kvidx_reason_t *why)
{
    if (f->kind != KVIDX_FIELD_NUMBER)
        return reject(why, field, "must be a JSON number");
    if (!isfinite(f->num) || floor(f->num) != f->num)
        return reject(why, field, "must be an integral number (no fraction)");
    if (kvidx_key_integral(f->num, 0, hi, out) != 0)
        return reject(why, field, range_rule);
    return 0;
}

/* 1 when a..an is the text known..kn (which the caller says passed its
 * check before). */
static int same_text(const char *a, size_t an, const char *known, size_t kn)
{
    return known && an == kn && (an == 0 || memcmp(a, known, an) == 0);
}

int kvidx_key_from_input(const kvidx_key_input_t *in, kvidx_key_t *out, kvidx_reason_t *why)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    if (in->has_unknown_member)
        return reject(why, "key",
                      "has an unknown member (allowed: chunk_hash_hex, model_name, kv_rank, "
                      "object_group_id, cache_salt)");

    if (in->chunk_hash_hex.kind == KVIDX_FIELD_ABSENT)
        return reject(why, "chunk_hash_hex", "is required");
    if (in->chunk_hash_hex.kind != KVIDX_FIELD_STRING)
        return reject(why, "chunk_hash_hex", "must be a string");
    int rc = kvidx_key_hash_from_hex(in->chunk_hash_hex.str, in->chunk_hash_hex.len, k.hash,
                                     &k.hash_len, why);
    if (rc != 0)
        return rc;

    if (in->model_name.kind == KVIDX_FIELD_ABSENT)
        return reject(why, "model_name", "is required");
    if (in->model_name.kind != KVIDX_FIELD_STRING)
        return reject(why, "model_name", "must be a string");
    if (!same_text(in->model_name.str, in->model_name.len, in->valid_model, in->valid_model_len)) {
        rc = kvidx_key_check_model(in->model_name.str, in->model_name.len, why);
        if (rc != 0)
            return rc;
    }
    k.model = in->model_name.str;
    k.model_len = (uint16_t)in->model_name.len;

    uint64_t v;
    if (in->kv_rank.kind == KVIDX_FIELD_ABSENT)
        return reject(why, "kv_rank", "is required");
    rc = integer_field(&in->kv_rank, "kv_rank", 4294967295.0, "must be in 0..4294967295", &v, why);
    if (rc != 0)
        return rc;
    k.kv_rank = (uint32_t)v;

    /* Optional members default only when absent: an explicit null is a
     * type error, as in LMCache's pydantic models. */
    if (in->object_group_id.kind != KVIDX_FIELD_ABSENT) {
        rc = integer_field(&in->object_group_id, "object_group_id", KVIDX_GROUP_MAX,
                           "must be in 0..65535", &v, why);
        if (rc != 0)
            return rc;
        k.group = (uint16_t)v;
    }

    k.salt = "";
    if (in->cache_salt.kind != KVIDX_FIELD_ABSENT) {
        if (in->cache_salt.kind != KVIDX_FIELD_STRING)
            return reject(why, "cache_salt", "must be a string");
        if (!same_text(in->cache_salt.str, in->cache_salt.len, in->valid_salt,
                       in->valid_salt_len)) {
            rc = kvidx_key_check_salt(in->cache_salt.str, in->cache_salt.len, why);
            if (rc != 0)
                return rc;
        }
        if (in->cache_salt.len > 0)
            k.salt = in->cache_salt.str;
        k.salt_len = (uint8_t)in->cache_salt.len;
    }

    *out = k;
    return 0;
}

/* Bytewise order with a proper prefix first; zero lengths never reach
 * memcmp so a NULL pointer with length 0 is fine. */
static int bytes_cmp(const void *a, size_t an, const void *b, size_t bn)
{
    size_t m = an < bn ? an : bn;
    int c = m ? memcmp(a, b, m) : 0;
    if (c != 0)
        return c < 0 ? -1 : 1;
    if (an != bn)
        return an < bn ? -1 : 1;
    return 0;
}

int kvidx_key_equal(const kvidx_key_t *a, const kvidx_key_t *b)
{
    return a->kv_rank == b->kv_rank && a->group == b->group && a->hash_len == b->hash_len &&
           a->model_len == b->model_len && a->salt_len == b->salt_len &&
           bytes_cmp(a->hash, a->hash_len, b->hash, b->hash_len) == 0 &&
           bytes_cmp(a->model, a->model_len, b->model, b->model_len) == 0 &&
           bytes_cmp(a->salt, a->salt_len, b->salt, b->salt_len) == 0;
}

int kvidx_key_cmp(const kvidx_key_t *a, const kvidx_key_t *b)
{
    int c = bytes_cmp(a->salt, a->salt_len, b->salt, b->salt_len);
    if (c != 0)
        return c;
    c = bytes_cmp(a->model, a->model_len, b->model, b->model_len);
    if (c != 0)
        return c;
    if (a->kv_rank != b->kv_rank)
        return a->kv_rank < b->kv_rank ? -1 : 1;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    return bytes_cmp(a->hash, a->hash_len, b->hash, b->hash_len);
}

/* ---- encoders ---- */

static size_t group_digits(uint16_t g)
{
    size_t d = 1;
    while (g >>= 4)
        d++;
    return d;
}

static char *put_bytes(char *p, const char *s, size_t n)
{
    if (n)
        memcpy(p, s, n);
    return p + n;
}

static char *put_hex(char *p, uint32_t v, size_t digits)
{
    for (size_t i = digits; i > 0; i--) {
        p[i - 1] = hex_digits[v & 0xf];
        v >>= 4;
    }
    return p + digits;
}

static char *put_hash(char *p, const kvidx_key_t *k)
{
    for (size_t i = 0; i < k->hash_len; i++) {
        *p++ = hex_digits[k->hash[i] >> 4];
        *p++ = hex_digits[k->hash[i] & 0xf];
    }
    return p;
}

/* Shared tail of both forms: "@<group>@<hash>[@<salt>]". */
static char *put_tail(char *p, const kvidx_key_t *k)
{
    *p++ = '@';
    p = put_hex(p, k->group, group_digits(k->group));
    *p++ = '@';
    p = put_hash(p, k);
    if (k->salt_len) {
        *p++ = '@';
        p = put_bytes(p, k->salt, k->salt_len);
    }
    return p;
}

static size_t tail_len(const kvidx_key_t *k)
{
    return 1 + group_digits(k->group) + 1 + 2 * (size_t)k->hash_len +
           (k->salt_len ? 1 + (size_t)k->salt_len : 0);
}

/* The size protocol of key.h: room for len + NUL, or ENOBUFS with the need. */
static int room(size_t len, size_t *size)
{
    if (*size < len + 1) {
        *size = len + 1;
        return KVIDX_ENOBUFS;
    }
    return 0;
}

static int key_shape_ok(const kvidx_key_t *k)
{
    return k->hash_len >= KVIDX_HASH_MIN && k->hash_len <= KVIDX_HASH_MAX;
}

int kvidx_key_encode_canonical(const kvidx_key_t *k, char *buf, size_t *size)
{
    if (!key_shape_ok(k))
        return KVIDX_EINVAL;
    size_t len = (size_t)k->model_len + 1 + 8 + tail_len(k);
    int rc = room(len, size);
    if (rc != 0)
        return rc;
    char *p = put_bytes(buf, k->model, k->model_len);
    *p++ = '@';
    p = put_hex(p, k->kv_rank, 8);
    p = put_tail(p, k);
    *p = '\0';
    *size = len;
    return 0;
}

int kvidx_key_encode_fs(const kvidx_key_t *k, char *buf, size_t *size)
{
    if (!key_shape_ok(k))
        return KVIDX_EINVAL;
    size_t slashes = 0;
    for (size_t i = 0; i < k->model_len; i++)
        slashes += k->model[i] == '/';
    size_t len = (size_t)k->model_len + 4 * slashes + 1 + 10 + tail_len(k) + 5;
    int rc = room(len, size);
    if (rc != 0)
        return rc;
    char *p = buf;
    for (size_t i = 0; i < k->model_len; i++) {
        if (k->model[i] == '/')
            p = put_bytes(p, "-SEP-", 5);
        else
            *p++ = k->model[i];
    }
    p = put_bytes(p, "@0x", 3);
    p = put_hex(p, k->kv_rank, 8);
    p = put_tail(p, k);
    p = put_bytes(p, ".data", 5);
    *p = '\0';
    *size = len;
    return 0;
}

int kvidx_key_hash_to_hex(const kvidx_key_t *k, char *buf, size_t *size)
{
    if (!key_shape_ok(k))
        return KVIDX_EINVAL;
    size_t len = 2 * (size_t)k->hash_len;
    int rc = room(len, size);
    if (rc != 0)
        return rc;
    *put_hash(buf, k) = '\0';
    *size = len;
    return 0;
}

/* ---- parsers ---- */

#define KEY_FIELDS_MAX 5

struct key_fields {
    const char *p[KEY_FIELDS_MAX];
    size_t n[KEY_FIELDS_MAX];
    int count; /* KEY_FIELDS_MAX + 1 when there are too many */
};

/* Splits at '@'. Neither model nor salt may contain '@', so the split is
 * unambiguous and the field count alone tells the shape. */
static void split_fields(const char *s, size_t n, struct key_fields *f)
{
    f->count = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '@')
            continue;
        if (f->count == KEY_FIELDS_MAX) {
            f->count = KEY_FIELDS_MAX + 1;
            return;
        }
        f->p[f->count] = s + start;
        f->n[f->count] = i - start;
        f->count++;
        start = i + 1;
    }
}

/* Exactly 8 hex digits, optionally after a lowercase "0x": the two
 * spellings LMCache writes. Shorter or longer ranks are refused so that one
 * rank has one spelling per form. */
static int parse_rank(const char *s, size_t n, uint32_t *out, kvidx_reason_t *why)
{
    if (n == 10 && s[0] == '0' && s[1] == 'x') {
        s += 2;
        n -= 2;
    }
    if (n != 8)
        return reject(why, "kv_rank", "must be 8 hex digits, optionally after 0x");
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t d = hex_table[(unsigned char)s[i]];
        if (d == 0xff)
            return reject(why, "kv_rank", "must be 8 hex digits, optionally after 0x");
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* 1..4 hex digits, no leading zeros: the "%x" spelling LMCache writes. */
static int parse_group(const char *s, size_t n, uint16_t *out, kvidx_reason_t *why)
{
    if (n == 0)
        return reject(why, "object_group_id", "must not be empty");
    if (n > 1 && s[0] == '0')
        return reject(why, "object_group_id", "must be hex without leading zeros");
    if (n > 4)
        return reject(why, "object_group_id", "must be in 0..ffff");
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t d = hex_table[(unsigned char)s[i]];
        if (d == 0xff)
            return reject(why, "object_group_id", "must be hex digits");
        v = v << 4 | d;
    }
    *out = (uint16_t)v;
    return 0;
}

/* Fields after the model: rank, [group,] hash [, salt]; has_group is 0
 * only for the legacy 3-field FS form. */
static int parse_rest(const struct key_fields *f, int has_group, kvidx_key_t *k,
                      kvidx_reason_t *why)
{
    int i = 1;
    int rc = parse_rank(f->p[i], f->n[i], &k->kv_rank, why);
    if (rc != 0)
        return rc;
    i++;
    k->group = 0;
    if (has_group) {
        rc = parse_group(f->p[i], f->n[i], &k->group, why);
        if (rc != 0)
            return rc;
        i++;
    }
    rc = kvidx_key_hash_from_hex(f->p[i], f->n[i], k->hash, &k->hash_len, why);
    if (rc != 0)
        return rc;
    i++;
    k->salt = "";
    k->salt_len = 0;
    if (i < f->count) {
        /* The salt field is written only for a non-empty salt, so an empty
         * one cannot come from an encoder. */
        if (f->n[i] == 0)
            return reject(why, "cache_salt", "must not be empty when its field is present");
        rc = kvidx_key_check_salt(f->p[i], f->n[i], why);
        if (rc != 0)
            return rc;
        k->salt = f->p[i];
        k->salt_len = (uint8_t)f->n[i];
    }
    return 0;
}

int kvidx_key_parse_canonical(const char *s, size_t n, kvidx_key_t *out, kvidx_reason_t *why)
{
    struct key_fields f;
    split_fields(s, n, &f);
    if (f.count != 4 && f.count != 5)
        return reject(why, "key", "must have 4 or 5 '@'-separated fields");
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    int rc = kvidx_key_check_model(f.p[0], f.n[0], why);
    if (rc != 0)
        return rc;
    k.model = f.p[0];
    k.model_len = (uint16_t)f.n[0];
    rc = parse_rest(&f, 1, &k, why);
    if (rc != 0)
        return rc;
    *out = k;
    return 0;
}

int kvidx_key_parse_fs(const char *s, size_t n, kvidx_key_t *out, char *model_buf,
                       kvidx_reason_t *why)
{
    static const char suffix[] = ".data";
    const size_t suffix_len = sizeof(suffix) - 1;
    if (n < suffix_len || memcmp(s + n - suffix_len, suffix, suffix_len) != 0)
        return reject(why, "key", "must end in .data");
    struct key_fields f;
    split_fields(s, n - suffix_len, &f);
    if (f.count < 3 || f.count > 5)
        return reject(why, "key", "must have 3, 4 or 5 '@'-separated fields before .data");

    /* Undo the model's "/" -> "-SEP-" spelling, left to right like
     * Python's str.replace in LMCache's adapter. */
    size_t m = 0;
    for (size_t i = 0; i < f.n[0];) {
        char c = f.p[0][i];
        if (c == '/')
            return reject(why, "model_name", "must not contain '/' in a file name (use -SEP-)");
        if (m == KVIDX_MODEL_MAX)
            return reject(why, "model_name", "must be at most 255 bytes");
        if (f.n[0] - i >= 5 && memcmp(f.p[0] + i, "-SEP-", 5) == 0) {
            model_buf[m++] = '/';
            i += 5;
        } else {
            model_buf[m++] = c;
            i++;
        }
    }
    model_buf[m] = '\0';

    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    int rc = kvidx_key_check_model(model_buf, m, why);
    if (rc != 0)
        return rc;
    k.model = model_buf;
    k.model_len = (uint16_t)m;
    rc = parse_rest(&f, f.count != 3, &k, why);
    if (rc != 0)
        return rc;
    *out = k;
    return 0;
}

/* ---- kv_rank ---- */

int kvidx_rank_pack(int64_t world_size, int64_t global_rank, int64_t local_world_size,
                    int64_t local_rank, uint32_t *out, kvidx_reason_t *why)
{
    const int64_t v[4] = {world_size, global_rank, local_world_size, local_rank};
    static const char *const names[4] = {"world_size", "global_rank", "local_world_size",
                                         "local_rank"};
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        /* LMCache shifts without a check and silently collides; refuse. */
        if (v[i] < 0 || v[i] > KVIDX_RANK_FIELD_MAX) {
            if (why) {
                why->field = names[i];
                why->rule = "must be in 0..255";
            }
            return KVIDX_EINVAL;
        }
        r = r << 8 | (uint32_t)v[i];
    }
    *out = r;
    return 0;
}

void kvidx_rank_unpack(uint32_t kv_rank, uint8_t *world_size, uint8_t *global_rank,
                       uint8_t *local_world_size, uint8_t *local_rank)
{
    *world_size = (uint8_t)(kv_rank >> 24);
    *global_rank = (uint8_t)(kv_rank >> 16);
    *local_world_size = (uint8_t)(kv_rank >> 8);
    *local_rank = (uint8_t)kv_rank;
}

/* ---- ipc form ---- */

int kvidx_ipc_check(const kvidx_ipc_t *ipc, kvidx_reason_t *why)
{
    if (ipc->world_size < 1 || ipc->world_size > KVIDX_RANK_FIELD_MAX) {
        if (why) {
            why->field = "world_size";
            why->rule = "must be in 1..255";
        }
        return KVIDX_EINVAL;
    }
    if (ipc->worker_id != -1 &&
        (ipc->worker_id < 0 || (uint32_t)ipc->worker_id >= ipc->world_size)) {
        if (why) {
            why->field = "worker_id";
            why->rule = "must be null or in 0..world_size-1";
        }
        return KVIDX_EINVAL;
    }
    return 0;
}

uint32_t kvidx_ipc_num_ranks(const kvidx_ipc_t *ipc)
{
    return ipc->worker_id == -1 ? ipc->world_size : 1;
}

uint64_t kvidx_ipc_total(const kvidx_ipc_t *ipc)
{
    /* G*C fits in 64 bits but G*C*R might not: saturate so that the
     * caller's limit check still fires instead of seeing a wrapped count. */
    uint64_t gc = (uint64_t)ipc->num_groups * ipc->num_chunks;
    uint64_t r = kvidx_ipc_num_ranks(ipc);
    if (r != 0 && gc > UINT64_MAX / r)
        return UINT64_MAX;
    return gc * r;
}

uint32_t kvidx_ipc_rank(const kvidx_ipc_t *ipc, uint32_t r)
{
    uint32_t w = ipc->worker_id == -1 ? r : (uint32_t)ipc->worker_id;
    uint32_t ws = ipc->world_size & 0xff;
    w &= 0xff;
    return ws << 24 | w << 16 | ws << 8 | w;
}

void kvidx_ipc_split(const kvidx_ipc_t *ipc, uint64_t flat, uint32_t *gi, uint32_t *c, uint32_t *r)
{
    uint64_t ranks = kvidx_ipc_num_ranks(ipc);
    uint64_t per_group = (uint64_t)ipc->num_chunks * ranks;
    if (per_group == 0) {
        *gi = *c = *r = 0;
        return;
    }
    *gi = (uint32_t)(flat / per_group);
    uint64_t rest = flat % per_group;
    *c = (uint32_t)(rest / ranks);
    *r = (uint32_t)(rest % ranks);
}
