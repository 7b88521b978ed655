/*
 * The query string of `GET /v1/keys?...` (docs/page_tokens.md): parsing it into a
 * kvidx_list_query_t, writing it back out, and the digest of its filters
 * that page tokens carry (docs/page_tokens.md).
 *
 * A kvidx_list_query_t owns its decoded strings in fixed buffers; it holds no
 * pointers, so it may be copied with `=` or memcpy. Functions here never
 * allocate and do no I/O.
 */
#ifndef KVIDX_LIST_QUERY_H
#define KVIDX_LIST_QUERY_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/key.h"

#define KVIDX_PAGE_SIZE_DEFAULT 500  /* page_size absent or 0 */
#define KVIDX_PAGE_SIZE_MAX     5000 /* larger page_size values are clamped to this */
#define KVIDX_LIST_TOKEN_MAX    1024 /* bytes of a decoded page_token; longer is ETOKEN */
#define KVIDX_LIST_DIGEST_LEN   16   /* bytes of the filter digest */

typedef enum {
    KVIDX_LIST_TIER_ANY = 0, /* default */
    KVIDX_LIST_TIER_L1,
    KVIDX_LIST_TIER_L2
} kvidx_list_tier_t;

typedef struct kvidx_list_query {
    uint8_t has_model; /* model_name given (never empty when given) */
    uint8_t has_salt;  /* cache_salt given; salt_len 0 then selects the empty salt */
    uint8_t has_rank;  /* kv_rank given */
    uint8_t has_group; /* object_group_id given */
    uint16_t model_len;
    uint8_t salt_len;
    uint16_t token_len; /* 0: no page_token (first page) */
    uint16_t group;
    uint32_t kv_rank;
    uint32_t page_size; /* effective: 1..KVIDX_PAGE_SIZE_MAX */
    kvidx_list_tier_t tier;
    char model[KVIDX_MODEL_MAX + 1]; /* percent-decoded, NUL-terminated */
    char salt[KVIDX_SALT_MAX + 1];
    char token[KVIDX_LIST_TOKEN_MAX + 1]; /* percent-decoded page_token text */
} kvidx_list_query_t;

/* Where in the query string the rejected parameter is: [off, off+len) of the
 * raw (still percent-encoded) parameter name. The daemon may quote a bounded,
 * escaped excerpt of it; the reason strings themselves are static. */
typedef struct kvidx_query_span {
    size_t off;
    size_t len;
} kvidx_query_span_t;

/* Parses qs[0..n), the text after `?` (without `#fragment`), into *out.
 *
 * Form encoding as Python's urllib and Go's net/url read it: `&` separates
 * pairs, empty pairs are skipped, `name` without `=` has the empty value,
 * `%XX` (either case) decodes a byte, `+` decodes to a space (send a literal
 * `+` as `%2B`). Names are decoded too. Parameters: model_name, cache_salt,
 * kv_rank, object_group_id (decimal, or hex after `0x`/`0X`), tier (`l1`,
 * `l2`, `any`; lowercase), page_size (decimal; absent or 0 -> 500, > 5000 ->
 * 5000), page_token (empty means absent). No signs, spaces or fractions in
 * numbers.
 *
 * Returns 0, or:
 *  - KVIDX_EINVAL for an unknown parameter, a repeated one, a bad `%`
 *    escape, a value that is not a valid integer/tier, a number out of range,
 *    an empty model_name, or a model_name / cache_salt breaking the key rules (docs/keys.md)
 *    (the query names filters, not a key, so this is `invalid_argument`);
 *  - KVIDX_ETOKEN for a page_token longer than KVIDX_LIST_TOKEN_MAX bytes.
 * On error, *why (if not NULL) names the parameter in `field` ("query" for
 * an unknown name) and the rule broken; *where (if not NULL) locates the
 * parameter name in qs. *out is then unspecified. */
int kvidx_list_query_parse(const char *qs, size_t n, kvidx_list_query_t *out, kvidx_reason_t *why,
                           kvidx_query_span_t *where);

/* One name[=value] pair of a query string: its raw (still encoded) name
 * and value, and where the name starts. */
typedef struct kvidx_query_pair {
    const char *name, *value;
    size_t name_len, value_len; /* value_len 0 also when there is no '=' */
    size_t off;                 /* of the name in the query string */
} kvidx_query_pair_t;

/* The next non-empty pair of qs[0..n) at or after *pos (empty pairs, as in
 * "a=1&&b=2" or a trailing '&', are skipped): 1 with *p filled and *pos
 * moved past it, or 0 at the end. */
int kvidx_query_next(const char *qs, size_t n, size_t *pos, kvidx_query_pair_t *p);

/* Percent-decodes s[0..n) into buf (cap bytes, NUL-terminated on success);
 * '+' becomes a space when plus_is_space (form encoding, query strings) and
 * stays '+' otherwise (paths). Returns 0 with *len (may be NULL), KVIDX_EINVAL
 * for a '%' not followed by two hex digits, KVIDX_ENOBUFS when the result
 * does not fit (a bad escape anywhere takes precedence). */
int kvidx_pct_decode(const char *s, size_t n, char *buf, size_t cap, size_t *len,
                     int plus_is_space);

/* Writes q back as a query string that kvidx_list_query_parse reads into an
 * equal struct: every parameter that is set, page_size always, tier unless
 * `any`; bytes outside [A-Za-z0-9-._~] are percent-encoded. NUL-terminated.
 * On entry *size is the buffer size; on success it becomes the length
 * (without NUL); KVIDX_ENOBUFS when too small, with *size the size needed
 * including the NUL. */
int kvidx_list_query_encode(const kvidx_list_query_t *q, char *buf, size_t *size);

/* The digest of q's filters: which of model_name, cache_salt, kv_rank,
 * object_group_id are present and their values, and the tier. page_size and
 * page_token are left out (they may change between pages). BLAKE2b over an
 * unambiguous length-prefixed encoding; equal filters give equal digests. */
void kvidx_list_query_digest(const kvidx_list_query_t *q, uint8_t out[KVIDX_LIST_DIGEST_LEN]);

/* 1 when a and b have the same filters, page_size and page_token. */
int kvidx_list_query_equal(const kvidx_list_query_t *a, const kvidx_list_query_t *b);

#endif
