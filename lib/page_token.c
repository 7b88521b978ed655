/*
 * Page tokens: an authenticated, base64url-encoded listing cursor.
 *
 * Binary layout (big-endian integers; docs/page_tokens.md):
 *
 *   off  size  field
 *   0    1     version (1)
 *   1    4     secret id
 *   5    8     issue time, seconds
 *   13   16    filter digest (kvidx_list_query_digest)
 *   29   1     flags (KVIDX_PAGE_CURSOR_*)
 *   30   1+s   salt length s (0..128), salt bytes
 *   .    1+m   model length m (1..255), model bytes
 *   .    4     kv_rank
 *   .    2     object_group_id
 *   .    1+h   hash length h (1..64), hash bytes
 *   .    16    HMAC-SHA256(secret, every byte before the tag), truncated
 *
 * Invariants: the encoder only writes tokens the decoder accepts (it checks
 * the resume key with key.h's rules first); the decoder checks structure,
 * then the secret id, then the tag in constant time, and only then trusts
 * the time, digest and key it carries. It never reads past the n bytes it
 * is given and never allocates.
 */
#include "kvidx/page_token.h"

#include "kvidx/err.h"

#include <sodium.h>
#include <string.h>

#define HEADER_LEN  30 /* version .. flags */
#define BIN_MIN_LEN (HEADER_LEN + 1 + 1 + 1 + 4 + 2 + 1 + KVIDX_HASH_MIN + KVIDX_PAGE_TOKEN_TAG_LEN)
#define BIN_MAX_LEN                                                                                \
    (HEADER_LEN + 1 + KVIDX_SALT_MAX + 1 + KVIDX_MODEL_MAX + 4 + 2 + 1 + KVIDX_HASH_MAX +          \
     KVIDX_PAGE_TOKEN_TAG_LEN)
#define B64_VARIANT sodium_base64_VARIANT_URLSAFE_NO_PADDING

_Static_assert(sodium_base64_ENCODED_LEN(BIN_MAX_LEN, B64_VARIANT) == KVIDX_PAGE_TOKEN_STR_MAX + 1,
               "KVIDX_PAGE_TOKEN_STR_MAX must match the longest binary token");
_Static_assert(KVIDX_PAGE_TOKEN_STR_MAX <= KVIDX_LIST_TOKEN_MAX,
               "the query parser must accept every token we issue");
_Static_assert(KVIDX_TOKEN_SECRET_LEN == crypto_auth_hmacsha256_KEYBYTES, "HMAC key size");
_Static_assert(KVIDX_PAGE_TOKEN_TAG_LEN <= crypto_auth_hmacsha256_BYTES, "tag size");

int kvidx_token_secret_generate(kvidx_token_secret_t *out)
{
    if (sodium_init() < 0)
        return KVIDX_EINTERNAL;
    randombytes_buf(&out->id, sizeof out->id);
    randombytes_buf(out->secret, sizeof out->secret);
    return 0;
}

void kvidx_token_keyring_init(kvidx_token_keyring_t *kr)
{
    memset(kr, 0, sizeof *kr);
}

int kvidx_token_keyring_rotate(kvidx_token_keyring_t *kr, const kvidx_token_secret_t *s)
{
    if (kvidx_token_keyring_find(kr, s->id) != NULL)
        return KVIDX_EINVAL;
    if (kr->count == KVIDX_TOKEN_KEYRING_MAX)
        kr->count--;
    memmove(&kr->secrets[1], &kr->secrets[0], kr->count * sizeof kr->secrets[0]);
    kr->secrets[0] = *s;
    kr->count++;
    /* Wipe the slots past count, including the dropped oldest secret. */
    sodium_memzero(&kr->secrets[kr->count],
                   (KVIDX_TOKEN_KEYRING_MAX - kr->count) * sizeof kr->secrets[0]);
    return 0;
}

const kvidx_token_secret_t *kvidx_token_keyring_current(const kvidx_token_keyring_t *kr)
{
    return kr->count ? &kr->secrets[0] : NULL;
}

const kvidx_token_secret_t *kvidx_token_keyring_find(const kvidx_token_keyring_t *kr, uint32_t id)
{
    for (size_t i = 0; i < kr->count; i++)
        if (kr->secrets[i].id == id)
            return &kr->secrets[i];
    return NULL;
}

void kvidx_token_keyring_clear(kvidx_token_keyring_t *kr)
{
    sodium_memzero(kr, sizeof *kr);
}

static uint8_t *put_be(uint8_t *p, uint64_t v, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    return p + bytes;
}

static uint64_t get_be(const uint8_t *p, size_t bytes)
{
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* The full HMAC-SHA256 of msg; callers use its first TAG_LEN bytes. */
static void mac(const kvidx_token_secret_t *s, const uint8_t *msg, size_t n,
                uint8_t out[crypto_auth_hmacsha256_BYTES])
{
    crypto_auth_hmacsha256(out, msg, n, s->secret);
}

/* docs/keys.md rules for a key carried in a token (shape and field rules). */
static int key_ok(const kvidx_key_t *k)
{
    if (k->hash_len < KVIDX_HASH_MIN || k->hash_len > KVIDX_HASH_MAX)
        return 0;
    if (k->model == NULL || kvidx_key_check_model(k->model, k->model_len, NULL) != 0)
        return 0;
    if (k->salt_len && (k->salt == NULL || kvidx_key_check_salt(k->salt, k->salt_len, NULL) != 0))
        return 0;
    return 1;
}

int kvidx_page_token_encode(const kvidx_token_secret_t *s, uint64_t now_s,
                            const uint8_t digest[KVIDX_LIST_DIGEST_LEN], const kvidx_key_t *resume,
                            unsigned flags, char *buf, size_t *size)
{
    if (!key_ok(resume) || (flags & ~KVIDX_PAGE_CURSOR_INCLUSIVE) != 0)
        return KVIDX_EINVAL;

    uint8_t bin[BIN_MAX_LEN];
    uint8_t *p = bin;
    *p++ = KVIDX_PAGE_TOKEN_VERSION;
    p = put_be(p, s->id, 4);
    p = put_be(p, now_s, 8);
    memcpy(p, digest, KVIDX_LIST_DIGEST_LEN);
    p += KVIDX_LIST_DIGEST_LEN;
    *p++ = (uint8_t)flags;
    *p++ = resume->salt_len;
    if (resume->salt_len)
        memcpy(p, resume->salt, resume->salt_len);
    p += resume->salt_len;
    *p++ = (uint8_t)resume->model_len;
    memcpy(p, resume->model, resume->model_len);
    p += resume->model_len;
    p = put_be(p, resume->kv_rank, 4);
    p = put_be(p, resume->group, 2);
    *p++ = resume->hash_len;
    memcpy(p, resume->hash, resume->hash_len);
    p += resume->hash_len;

    uint8_t tag[crypto_auth_hmacsha256_BYTES];
    mac(s, bin, (size_t)(p - bin), tag);
    memcpy(p, tag, KVIDX_PAGE_TOKEN_TAG_LEN);
    p += KVIDX_PAGE_TOKEN_TAG_LEN;
    size_t bin_len = (size_t)(p - bin);

    size_t need = sodium_base64_ENCODED_LEN(bin_len, B64_VARIANT);
    if (*size < need) {
        *size = need;
        return KVIDX_ENOBUFS;
    }
    sodium_bin2base64(buf, need, bin, bin_len, B64_VARIANT);
    *size = need - 1;
    return 0;
}

/* 1 when s[0..n) holds only base64url characters. libsodium 1.0.18's
 * sodium_base642bin maps bytes >= 0x80 onto alphabet values instead of
 * rejecting them, which would give a token many spellings (and let a
 * tampered token through); so the alphabet is checked here first. */
static int b64url_only(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return 0;
    }
    return 1;
}

/* A bounds-checked reader over the binary token. */
struct rd {
    const uint8_t *p;
    const uint8_t *end;
};

static int rd_take(struct rd *r, size_t n, const uint8_t **out)
{
    if ((size_t)(r->end - r->p) < n)
        return -1;
    *out = r->p;
    r->p += n;
    return 0;
}

int kvidx_page_token_decode(const kvidx_token_keyring_t *kr, const char *tok, size_t n,
                            uint64_t now_s, uint64_t ttl_s,
                            const uint8_t digest[KVIDX_LIST_DIGEST_LEN], kvidx_page_cursor_t *out)
{
    /* 1. Structure. Lengths are checked before decoding so that the binary
     * buffer below is always large enough. */
    if (n < sodium_base64_ENCODED_LEN(BIN_MIN_LEN, B64_VARIANT) - 1 || n > KVIDX_PAGE_TOKEN_STR_MAX)
        return KVIDX_ETOKEN;
    if (!b64url_only(tok, n))
        return KVIDX_ETOKEN;
    uint8_t bin[BIN_MAX_LEN];
    size_t bin_len = 0;
    /* With b64_end NULL, libsodium fails unless the whole input is base64url
     * (and, for the last character, unused bits are zero), so every token
     * has exactly one spelling. */
    if (sodium_base642bin(bin, sizeof bin, tok, n, NULL, &bin_len, NULL, B64_VARIANT) != 0)
        return KVIDX_ETOKEN;
    if (bin_len < BIN_MIN_LEN || bin[0] != KVIDX_PAGE_TOKEN_VERSION)
        return KVIDX_ETOKEN;

    struct rd r = {bin + HEADER_LEN, bin + bin_len - KVIDX_PAGE_TOKEN_TAG_LEN};
    const uint8_t *salt, *model, *fixed, *hash, *lenp;
    unsigned flags = bin[29];
    if (flags & ~KVIDX_PAGE_CURSOR_INCLUSIVE)
        return KVIDX_ETOKEN;
    if (rd_take(&r, 1, &lenp) || lenp[0] > KVIDX_SALT_MAX || rd_take(&r, lenp[0], &salt))
        return KVIDX_ETOKEN;
    size_t salt_len = lenp[0];
    if (rd_take(&r, 1, &lenp) || lenp[0] == 0 || rd_take(&r, lenp[0], &model))
        return KVIDX_ETOKEN;
    size_t model_len = lenp[0];
    if (rd_take(&r, 6, &fixed))
        return KVIDX_ETOKEN;
    if (rd_take(&r, 1, &lenp) || lenp[0] < KVIDX_HASH_MIN || lenp[0] > KVIDX_HASH_MAX ||
        rd_take(&r, lenp[0], &hash))
        return KVIDX_ETOKEN;
    size_t hash_len = lenp[0];
    if (r.p != r.end)
        return KVIDX_ETOKEN; /* trailing bytes before the tag */

    /* 2. The secret. */
    uint32_t id = (uint32_t)get_be(bin + 1, 4);
    const kvidx_token_secret_t *s = kvidx_token_keyring_find(kr, id);
    if (s == NULL)
        return KVIDX_ETOKENEXPIRED;

    /* 3. The tag, compared in constant time. */
    uint8_t tag[crypto_auth_hmacsha256_BYTES];
    mac(s, bin, (size_t)(r.end - bin), tag);
    int bad = sodium_memcmp(tag, r.end, KVIDX_PAGE_TOKEN_TAG_LEN);
    sodium_memzero(tag, sizeof tag);
    if (bad != 0)
        return KVIDX_ETOKEN;

    /* 4. Age. A token from the future (beyond the skew) is treated as
     * expired, not tampered: its tag is good, only the clocks disagree. */
    uint64_t issued = get_be(bin + 5, 8);
    if (issued > now_s) {
        if (issued - now_s > KVIDX_PAGE_TOKEN_SKEW_S)
            return KVIDX_ETOKENEXPIRED;
    } else if (now_s - issued > ttl_s) {
        return KVIDX_ETOKENEXPIRED;
    }

    /* 5. Filters. */
    if (sodium_memcmp(bin + 13, digest, KVIDX_LIST_DIGEST_LEN) != 0)
        return KVIDX_ETOKENMISMATCH;

    /* 6. The resume key. A validly tagged token came from our encoder, which
     * checks keys; this guards against a bug there or a leaked secret. */
    memset(out, 0, sizeof *out);
    memcpy(out->salt, salt, salt_len);
    memcpy(out->model, model, model_len);
    out->key.salt = out->salt;
    out->key.salt_len = (uint8_t)salt_len;
    out->key.model = out->model;
    out->key.model_len = (uint16_t)model_len;
    out->key.kv_rank = (uint32_t)get_be(fixed, 4);
    out->key.group = (uint16_t)get_be(fixed + 4, 2);
    out->key.hash_len = (uint8_t)hash_len;
    memcpy(out->key.hash, hash, hash_len);
    out->flags = flags;
    out->secret_id = id;
    out->issued_s = issued;
    if (!key_ok(&out->key))
        return KVIDX_ETOKEN;
    return 0;
}

void kvidx_page_cursor_copy(kvidx_page_cursor_t *dst, const kvidx_page_cursor_t *src)
{
    if (dst == src)
        return;
    *dst = *src;
    dst->key.model = dst->model;
    dst->key.salt = dst->salt;
}
