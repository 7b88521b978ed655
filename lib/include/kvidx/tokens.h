/*
 * Bearer tokens: the parsed tokens file and the constant-time lookup of a
 * presented token.
 *
 * The file has one token a line:
 *
 *     <token> <role> [salt=<cache_salt>] [quota_bytes=<size>]
 *
 * roles `read`, `write` (implies read) and `admin` (everything, every
 * salt). `salt=` binds the token to one cache_salt (`salt=` with nothing
 * after it binds the empty salt); a token without it reaches every salt.
 * `quota_bytes=` (a size with an optional KiB/MiB/GiB/TiB suffix) caps the
 * L1 bytes of the token's salt and needs `salt=`. A line whose first
 * non-blank character is `#` is a comment, as is a blank line; a `#` later
 * in a line is part of it. Tokens are 1..256 bytes of printable ASCII
 * other than ',' (where repeated Authorization lines are joined).
 *
 * The table keeps no token in the clear: each is kept as a keyed BLAKE2b
 * digest (the key is random per table), and a lookup digests the presented
 * token and finds that digest in a hash table, comparing whole digests in
 * constant time: the time it takes depends only on the presented token's
 * digest (unpredictable without the key), never on which bytes of a stored
 * token it shares, and hardly on how many tokens there are.
 */
#ifndef KVIDX_TOKENS_H
#define KVIDX_TOKENS_H

#include "kvidx/key.h"

#include <stddef.h>
#include <stdint.h>

#define KVIDX_TOKEN_MAX 256 /* bytes of one token */

typedef enum {
    KVIDX_ROLE_NONE = 0, /* no token (auth off, or a route that needs none) */
    KVIDX_ROLE_READ = 1,
    KVIDX_ROLE_WRITE = 2,
    KVIDX_ROLE_ADMIN = 3,
} kvidx_role_t;

/* What a token grants. */
typedef struct kvidx_principal {
    kvidx_role_t role;
    int salt_bound; /* 1: only keys whose cache_salt is salt */
    uint8_t salt_len;
    char salt[KVIDX_SALT_MAX + 1]; /* NUL-terminated copy */
    uint64_t quota_bytes;          /* 0: none */
    uint32_t id;                   /* the token's line number, for logs (never the token) */
} kvidx_principal_t;

typedef struct kvidx_tokens kvidx_tokens_t;

/* Parses a tokens file's text (n bytes; it need not be NUL-terminated).
 * 0 and *out (free with kvidx_tokens_free), or KVIDX_EINVAL with the line
 * number in *err_line and a static reason in *why (never the line's bytes),
 * or KVIDX_ENOMEM. Errors: an unknown role or option, a bad salt or size, a
 * quota without a salt, a token twice, a token too long or not printable. */
int kvidx_tokens_parse(const char *text, size_t n, kvidx_tokens_t **out, unsigned *err_line,
                       const char **why);
void kvidx_tokens_free(kvidx_tokens_t *t);
size_t kvidx_tokens_count(const kvidx_tokens_t *t);

/* Finds the principal of a presented token, in time that tells nothing of
 * the stored tokens (see above). 0 and *out, or KVIDX_EUNAUTHORIZED. */
int kvidx_tokens_find(const kvidx_tokens_t *t, const char *token, size_t n, kvidx_principal_t *out);

/* The i-th principal, in file order (0 or KVIDX_ENOTFOUND). */
int kvidx_tokens_at(const kvidx_tokens_t *t, size_t i, kvidx_principal_t *out);

/* The quota of a salt: the smallest quota_bytes of any token bound to it,
 * 0 when none has one. */
uint64_t kvidx_tokens_salt_quota(const kvidx_tokens_t *t, const char *salt, size_t salt_len);

/* 1 when p may act on keys of salt (a token without a salt reaches every
 * salt; admin reaches every salt), else 0. */
int kvidx_principal_sees_salt(const kvidx_principal_t *p, const char *salt, size_t salt_len);

/* Parses a size: decimal digits with an optional space and a KiB, MiB, GiB
 * or TiB suffix (case-insensitive). 0 and *out, or KVIDX_EINVAL. */
int kvidx_parse_size(const char *s, size_t n, uint64_t *out);

#endif
