/*
 * Growable buffer and streaming JSON writer (see buf.h). The escaper is the
 * one piece every answer goes through; it is fuzzed by tests/fuzz/fuzz_jw.c,
 * which checks that whatever bytes go in, cJSON can parse what comes out.
 */
#include "util/json_write.h"

#include "kvidx/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

void buf_init(struct buf *b)
{
    memset(b, 0, sizeof(*b));
}

void buf_free(struct buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void buf_reset(struct buf *b)
{
    b->len = 0;
    b->failed = 0;
    if (b->data)
        b->data[0] = '\0';
}

int buf_reserve(struct buf *b, size_t extra)
{
    if (b->failed)
        return KVIDX_ENOMEM;
    if (extra >= SIZE_MAX - b->len - 1) {
        b->failed = 1;
        return KVIDX_ENOMEM;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return KVIDX_ENOMEM;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void buf_shrink(struct buf *b, size_t max_slack)
{
    if (!b->data || b->failed || b->cap - (b->len + 1) <= max_slack)
        return;
    char *p = realloc(b->data, b->len + 1);
    if (p) {
        b->data = p;
        b->cap = b->len + 1;
    }
}

void buf_append(struct buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, n) != 0)
        return;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void buf_puts(struct buf *b, const char *s)
{
    buf_append(b, s, strlen(s));
}

void buf_putc(struct buf *b, char c)
{
    if (buf_reserve(b, 1) != 0)
        return;
    b->data[b->len++] = c;
    b->data[b->len] = '\0';
}

void buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return;
    }
    if ((size_t)n < sizeof(tmp)) {
        buf_append(b, tmp, (size_t)n);
    } else if (buf_reserve(b, (size_t)n) == 0) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void buf_put_u64(struct buf *b, uint64_t v)
{
    char tmp[24];
    char *p = tmp + sizeof(tmp);
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    buf_append(b, p, (size_t)(tmp + sizeof(tmp) - p));
}

static const char digit_pairs[201] = "00010203040506070809101112131415161718192021222324"
                                     "25262728293031323334353637383940414243444546474849"
                                     "50515253545556575859606162636465666768697071727374"
                                     "75767778798081828384858687888990919293949596979899";

/* Writes v in decimal at p (room for 10 bytes); returns the end. The
 * digits are written in place from the end, whose position the digit
 * count gives: no copy. */
static char *u32_dec(char *p, uint32_t v)
{
    size_t n = v < 10           ? 1
               : v < 100        ? 2
               : v < 1000       ? 3
               : v < 10000      ? 4
               : v < 100000     ? 5
               : v < 1000000    ? 6
               : v < 10000000   ? 7
               : v < 100000000  ? 8
               : v < 1000000000 ? 9
                                : 10;
    char *q = p + n;
    while (v >= 100) {
        q -= 2;
        memcpy(q, digit_pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10) {
        q -= 2;
        memcpy(q, digit_pairs + 2 * v, 2);
    } else {
        *--q = (char)('0' + v);
    }
    return p + n;
}

char *jw_u64_at(char *p, uint64_t v)
{
    if (v <= UINT32_MAX)
        return u32_dec(p, (uint32_t)v);
    char tmp[24];
    char *q = tmp + sizeof(tmp);
    while (v >= 100) {
        q -= 2;
        memcpy(q, digit_pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10) {
        q -= 2;
        memcpy(q, digit_pairs + 2 * v, 2);
    } else {
        *--q = (char)('0' + v);
    }
    size_t n = (size_t)(tmp + sizeof(tmp) - q);
    memcpy(p, q, n);
    return p + n;
}

/* The two lowercase hex digits of every byte value. */
static const char hex_pairs[513] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
    "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"
    "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
    "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
    "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
    "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";

/* The 8 lowercase hex digits of the 4 bytes of v (first byte in the low
 * bits), first digit in the low byte of the result. Each byte's nibbles
 * are spread into two bytes (high nibble first); a nibble n becomes
 * '0' + n, plus 'a' - '0' - 10 where n > 9 (n + 6 carries into bit 4
 * exactly then). No byte ever carries into the next one. */
static inline uint64_t hex8_of(uint32_t v)
{
    uint64_t t = v;
    t = (t | t << 16) & UINT64_C(0x0000ffff0000ffff);
    t = (t | t << 8) & UINT64_C(0x00ff00ff00ff00ff);
    uint64_t n = (t >> 4 & UINT64_C(0x000f000f000f000f)) | (t & UINT64_C(0x000f000f000f000f)) << 8;
    uint64_t above9 = (n + UINT64_C(0x0606060606060606)) >> 4 & UINT64_C(0x0101010101010101);
    return n + UINT64_C(0x3030303030303030) + above9 * 0x27;
}

#if defined(__SSE2__)
/* The 32 lowercase hex digits of 16 bytes: nibbles split and interleaved
 * (high first), then '0' + n, plus 'a' - '0' - 10 where n > 9. */
static inline void hex16_at(char *p, const uint8_t *bytes)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)bytes);
    __m128i lo_mask = _mm_set1_epi8(0x0f);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), lo_mask);
    __m128i lo = _mm_and_si128(v, lo_mask);
    __m128i a = _mm_unpacklo_epi8(hi, lo), b = _mm_unpackhi_epi8(hi, lo);
    __m128i nine = _mm_set1_epi8(9), zero = _mm_set1_epi8('0'), gap = _mm_set1_epi8(0x27);
    a = _mm_add_epi8(_mm_add_epi8(a, zero), _mm_and_si128(_mm_cmpgt_epi8(a, nine), gap));
    b = _mm_add_epi8(_mm_add_epi8(b, zero), _mm_and_si128(_mm_cmpgt_epi8(b, nine), gap));
    _mm_storeu_si128((__m128i *)(void *)p, a);
    _mm_storeu_si128((__m128i *)(void *)(p + 16), b);
}
#endif

char *jw_hex_at(char *p, const uint8_t *bytes, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16, p += 32)
        hex16_at(p, bytes + i);
#endif
    /* Four bytes a step: eight digits computed in one word, stored once. */
    for (; i + 4 <= n; i += 4, p += 8) {
        uint32_t v = (uint32_t)bytes[i] | (uint32_t)bytes[i + 1] << 8 |
                     (uint32_t)bytes[i + 2] << 16 | (uint32_t)bytes[i + 3] << 24;
        uint64_t d = hex8_of(v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        d = __builtin_bswap64(d);
#endif
        memcpy(p, &d, 8);
    }
    for (; i < n; i++, p += 2)
        memcpy(p, hex_pairs + 2 * bytes[i], 2);
    return p;
}

void buf_put_i64(struct buf *b, int64_t v)
{
    if (v < 0) {
        buf_putc(b, '-');
        buf_put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        buf_put_u64(b, (uint64_t)v);
    }
}

void jw_init(struct jw *w, struct buf *b)
{
    memset(w, 0, sizeof(*w));
    w->b = b;
}

/* Called before every value: a comma when a sibling came before. */
static void jw_pre_value(struct jw *w)
{
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->need_comma[w->depth])
        buf_putc(w->b, ',');
    w->need_comma[w->depth] = 1;
}

static void jw_open(struct jw *w, char c)
{
    jw_pre_value(w);
    buf_putc(w->b, c);
    if (w->depth < JW_MAX_DEPTH)
        w->depth++;
    w->need_comma[w->depth] = 0;
}

static void jw_close(struct jw *w, char c)
{
    buf_putc(w->b, c);
    if (w->depth > 0)
        w->depth--;
}

void jw_obj_begin(struct jw *w)
{
    jw_open(w, '{');
}

void jw_obj_end(struct jw *w)
{
    jw_close(w, '}');
}

void jw_arr_begin(struct jw *w)
{
    jw_open(w, '[');
}

void jw_arr_end(struct jw *w)
{
    jw_close(w, ']');
}

void jw_key(struct jw *w, const char *key)
{
    jw_pre_value(w);
    buf_putc(w->b, '"');
    buf_puts(w->b, key);
    buf_append(w->b, "\":", 2);
    w->after_key = 1;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

void jw_strn(struct jw *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    struct buf *b = w->b;
    const unsigned char *p = (const unsigned char *)s;
    jw_pre_value(w);
    /* Worst case every byte becomes \ufffd (6 bytes). */
    if (n > (SIZE_MAX - 3) / 6 || buf_reserve(b, n * 6 + 2) != 0)
        return;
    char *o = b->data + b->len;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c < 0x20) {
            *o++ = '\\';
            switch (c) {
            case '\n':
                *o++ = 'n';
                break;
            case '\r':
                *o++ = 'r';
                break;
            case '\t':
                *o++ = 't';
                break;
            case '\b':
                *o++ = 'b';
                break;
            case '\f':
                *o++ = 'f';
                break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
            i++;
            continue;
        }
        size_t l = utf8_seq(p + i, n - i);
        if (l == 0) {
            memcpy(o, "\\ufffd", 6);
            o += 6;
            i++;
        } else {
            memcpy(o, p + i, l);
            o += l;
            i += l;
        }
    }
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->data);
}

void jw_str(struct jw *w, const char *s)
{
    jw_strn(w, s, strlen(s));
}

void jw_u64(struct jw *w, uint64_t v)
{
    jw_pre_value(w);
    buf_put_u64(w->b, v);
}

void jw_i64(struct jw *w, int64_t v)
{
    jw_pre_value(w);
    buf_put_i64(w->b, v);
}

void jw_bool(struct jw *w, int v)
{
    jw_pre_value(w);
    buf_puts(w->b, v ? "true" : "false");
}

void jw_null(struct jw *w)
{
    jw_pre_value(w);
    buf_puts(w->b, "null");
}

void jw_indices(struct jw *w, const uint8_t *flags, size_t n, uint8_t bit)
{
    jw_arr_begin(w);
    /* At most 10 digits and a comma per index, and the slack of the last
     * fixed-size copy below. */
    if (n > SIZE_MAX / 11 - 16 || buf_reserve(w->b, n * 11 + 16) != 0)
        return;
    char *p = w->b->data + w->b->len, *start = p;
    /* The decimal digits of the last index written, kept so that the next
     * index, usually the one after it, is one increment of them (a carry
     * through trailing nines at worst) rather than a conversion. */
    char num[16];
    size_t len = 0, last = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(flags[i] & bit))
            continue;
        if (p != start)
            *p++ = ',';
        if (len && i == last + 1) {
            size_t k = len;
            while (k > 0 && num[k - 1] == '9')
                num[--k] = '0';
            if (k > 0) {
                num[k - 1]++;
            } else {
                memmove(num + 1, num, len);
                num[0] = '1';
                len++;
            }
        } else {
            len = (size_t)(u32_dec(num, (uint32_t)i) - num);
        }
        last = i;
        memcpy(p, num, sizeof(num));
        p += len;
    }
    w->b->len = (size_t)(p - w->b->data);
    w->b->data[w->b->len] = '\0';
    jw_arr_end(w);
}

void jw_u32s(struct jw *w, const uint32_t *v, size_t n)
{
    jw_arr_begin(w);
    if (n > SIZE_MAX / 11 || buf_reserve(w->b, n * 11) != 0)
        return;
    char *p = w->b->data + w->b->len;
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        p = u32_dec(p, v[i]);
    }
    w->b->len = (size_t)(p - w->b->data);
    w->b->data[w->b->len] = '\0';
    jw_arr_end(w);
}

void jw_raw(struct jw *w, const char *json, size_t n)
{
    jw_pre_value(w);
    buf_append(w->b, json, n);
}
