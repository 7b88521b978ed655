/*
 * The lexing steps the fast JSON scanners share (util/keyscan.c for keys
 * and stores, api/events_scan.c for /events): a plain string found sixteen
 * bytes a step, and a string known to repeat matched by one compare. Both
 * scanners accept a strict subset of what json_parse_text accepts and hand
 * everything else to the cJSON path; these steps keep to that: a string
 * with an escape or a raw control byte is not a plain string.
 *
 * Header only (static inline): the scanners' inner loops call them per
 * string.
 */
#ifndef KVIDXD_JSON_LEX_H
#define KVIDXD_JSON_LEX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define JL_ONES  UINT64_C(0x0101010101010101)
#define JL_HIGHS UINT64_C(0x8080808080808080)

/* Eight bytes at p as a little-endian word (unaligned). */
static inline uint64_t jl_load_le64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* Bit 7 set in every byte of x below 0x20, and in every zero byte
 * (possibly also in bytes above a flagged one, never below: the lowest
 * flagged byte is exact). */
static inline uint64_t jl_control_bytes(uint64_t x)
{
    return (x - JL_ONES * 0x20) & ~x & JL_HIGHS;
}

static inline uint64_t jl_zero_bytes(uint64_t x)
{
    return (x - JL_ONES) & ~x & JL_HIGHS;
}

/* The string opening at p (its '"') when it has no escape and no byte
 * below 0x20 (JSON forbids those raw; json_parse_text answers for them):
 * its bytes in *s and *n, and the byte after its closing quote; NULL
 * otherwise (also when e comes first). */
static inline const char *jl_plain_string(const char *p, const char *e, const char **s, size_t *n)
{
    if (p == e || *p != '"')
        return NULL;
    const char *start = ++p, *q = p;
#if defined(__SSE2__)
    /* A quote, a backslash or a byte whose top three bits are clear. */
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i top3 = _mm_set1_epi8((char)0xe0), zero = _mm_setzero_si128();
    while (e - q >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)q);
        __m128i hit =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                         _mm_cmpeq_epi8(_mm_and_si128(x, top3), zero));
        unsigned m = (unsigned)_mm_movemask_epi8(hit);
        if (m) {
            q += __builtin_ctz(m);
            goto found;
        }
        q += 16;
    }
#endif
    while (e - q >= 8) {
        uint64_t x = jl_load_le64(q);
        uint64_t hit = jl_control_bytes(x) | jl_zero_bytes(x ^ (JL_ONES * '"')) |
                       jl_zero_bytes(x ^ (JL_ONES * '\\'));
        if (hit) {
            q += __builtin_ctzll(hit) / 8;
            goto found;
        }
        q += 8;
    }
    while (q < e && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
        q++;
    if (q == e)
        return NULL;
found:
    if (*q != '"')
        return NULL;
    *s = start;
    *n = (size_t)(q - start);
    return q + 1;
}

/* When p holds exactly the JSON string "known" (bytes a jl_plain_string
 * took before, so without quote, backslash or control byte): the byte
 * after it; else NULL. One compare instead of a scan. */
static inline const char *jl_same_string(const char *p, const char *e, const char *known, size_t n)
{
    if (!known || (size_t)(e - p) < n + 2 || p[0] != '"' || p[n + 1] != '"' ||
        memcmp(p + 1, known, n) != 0)
        return NULL;
    return p + n + 2;
}

#endif
