/*
 * Page tokens of `GET /v1/keys` (docs/page_tokens.md): opaque, URL-safe, authenticated
 * cursors. A token carries the id of the secret that signed it, its issue
 * time, the digest of the listing's filters and the resume key; an HMAC-SHA256
 * tag (truncated to 16 bytes) under the secret covers all of it. The layout,
 * the checks and their order are in docs/page_tokens.md.
 *
 * Secrets live in a keyring (the current secret plus a few previous ones, so
 * that tokens survive a rotation). The clock is injected: every function
 * takes `now_s`, seconds of the caller's wall clock. No I/O, no globals; the
 * only randomness is kvidx_token_secret_generate().
 */
#ifndef KVIDX_PAGE_TOKEN_H
#define KVIDX_PAGE_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/key.h"
#include "kvidx/list_query.h"

#define KVIDX_TOKEN_SECRET_LEN   32 /* bytes of an HMAC-SHA256 key */
#define KVIDX_TOKEN_KEYRING_MAX  4  /* secrets held: current + 3 previous */
#define KVIDX_PAGE_TOKEN_VERSION 1
#define KVIDX_PAGE_TOKEN_TAG_LEN 16 /* bytes of the truncated HMAC-SHA256 tag */
/* A token from up to this many seconds in the future (clock skew between
 * processes sharing a secret, or a clock stepped back) is still accepted. */
#define KVIDX_PAGE_TOKEN_SKEW_S 60
/* Longest encoded token (characters, without NUL): a 502-byte binary token
 * (longest model, salt and hash) in unpadded base64url. */
#define KVIDX_PAGE_TOKEN_STR_MAX 670

/* Cursor flag: resume at the key itself rather than after it. */
#define KVIDX_PAGE_CURSOR_INCLUSIVE 0x01u

typedef struct kvidx_token_secret {
    uint32_t id;                            /* named in every token it signs */
    uint8_t secret[KVIDX_TOKEN_SECRET_LEN]; /* HMAC-SHA256 key */
} kvidx_token_secret_t;

/* secrets[0] is the current (signing) secret; the others still verify. */
typedef struct kvidx_token_keyring {
    size_t count;
    kvidx_token_secret_t secrets[KVIDX_TOKEN_KEYRING_MAX];
} kvidx_token_keyring_t;

/* A decoded token. key.model and key.salt point into model/salt below, so a
 * cursor must not be copied with `=` (use kvidx_page_cursor_copy). */
typedef struct kvidx_page_cursor {
    kvidx_key_t key; /* the resume key */
    unsigned flags;  /* KVIDX_PAGE_CURSOR_* */
    uint32_t secret_id;
    uint64_t issued_s; /* the issuer's now_s */
    char model[KVIDX_MODEL_MAX];
    char salt[KVIDX_SALT_MAX];
} kvidx_page_cursor_t;

/* Fills *out with a random id and a random secret (libsodium's
 * randombytes_buf; calls sodium_init()). Returns 0, or KVIDX_EINTERNAL when
 * libsodium cannot be initialised. Random ids make a token from another
 * process (or a previous run) name an id this one does not hold. */
int kvidx_token_secret_generate(kvidx_token_secret_t *out);

/* Empties the keyring. */
void kvidx_token_keyring_init(kvidx_token_keyring_t *kr);
/* Makes a copy of *s the current secret; the previous ones stay for
 * verification, and the oldest is dropped (and wiped) when the keyring
 * already holds KVIDX_TOKEN_KEYRING_MAX. Returns 0, or KVIDX_EINVAL when
 * the id is already held (generate another secret). */
int kvidx_token_keyring_rotate(kvidx_token_keyring_t *kr, const kvidx_token_secret_t *s);
/* The current secret, or NULL when the keyring is empty. Borrowed. */
const kvidx_token_secret_t *kvidx_token_keyring_current(const kvidx_token_keyring_t *kr);
/* The secret with this id, or NULL. Borrowed. */
const kvidx_token_secret_t *kvidx_token_keyring_find(const kvidx_token_keyring_t *kr, uint32_t id);
/* Wipes every secret (sodium_memzero) and empties the keyring. */
void kvidx_token_keyring_clear(kvidx_token_keyring_t *kr);

/* Encodes a token signed by *s: issued at now_s, for the filters whose
 * digest is `digest` (kvidx_list_query_digest), resuming at *resume (after
 * it, or at it with KVIDX_PAGE_CURSOR_INCLUSIVE in flags). The resume key is
 * copied into the token. Writes NUL-terminated base64url (no padding) to
 * buf: on entry *size is the buffer size; on success it becomes the length
 * (without NUL) and 0 is returned; KVIDX_ENOBUFS when too small, with *size
 * the size needed including the NUL (never more than
 * KVIDX_PAGE_TOKEN_STR_MAX + 1). KVIDX_EINVAL when the resume key breaks
 * docs/keys.md or flags has unknown bits. */
int kvidx_page_token_encode(const kvidx_token_secret_t *s, uint64_t now_s,
                            const uint8_t digest[KVIDX_LIST_DIGEST_LEN], const kvidx_key_t *resume,
                            unsigned flags, char *buf, size_t *size);

/* Decodes and checks tok[0..n) against the keyring, the clock and the
 * current filters' digest, in this order:
 *  1. not base64url, wrong length, wrong version, malformed fields -> KVIDX_ETOKEN
 *  2. secret id not in kr                                         -> KVIDX_ETOKENEXPIRED
 *  3. tag does not verify (constant-time)                         -> KVIDX_ETOKEN
 *  4. now_s - issued > ttl_s, or issued > now_s + SKEW            -> KVIDX_ETOKENEXPIRED
 *     (an age of exactly ttl_s is still valid)
 *  5. digest differs from the token's                             -> KVIDX_ETOKENMISMATCH
 *  6. resume key breaks docs/keys.md                                 -> KVIDX_ETOKEN
 * On success fills *out (the key views point into *out) and returns 0; on
 * error *out is unspecified. */
int kvidx_page_token_decode(const kvidx_token_keyring_t *kr, const char *tok, size_t n,
                            uint64_t now_s, uint64_t ttl_s,
                            const uint8_t digest[KVIDX_LIST_DIGEST_LEN], kvidx_page_cursor_t *out);

/* Copies *src into *dst, re-pointing dst's key views into dst. */
void kvidx_page_cursor_copy(kvidx_page_cursor_t *dst, const kvidx_page_cursor_t *src);

#endif
