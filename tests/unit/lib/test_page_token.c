/* Tests of page tokens (docs/page_tokens.md): round trip, tampering, truncation,
 * filter mismatch, expiry with an injected clock, and secret rotation. */
#include <criterion/criterion.h>

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/list_query.h"
#include "kvidx/page_token.h"

#define TTL 3600
#define T0  1700000000u

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static kvidx_token_secret_t sec_a, sec_b;
static kvidx_token_keyring_t ring;

static void setup(void)
{
    cr_assert_geq(sodium_init(), 0);
    cr_assert_eq(kvidx_token_secret_generate(&sec_a), 0);
    do
        cr_assert_eq(kvidx_token_secret_generate(&sec_b), 0);
    while (sec_b.id == sec_a.id);
    kvidx_token_keyring_init(&ring);
    cr_assert_eq(kvidx_token_keyring_rotate(&ring, &sec_a), 0);
}

static void digest_of(const char *qs, uint8_t d[KVIDX_LIST_DIGEST_LEN])
{
    kvidx_list_query_t q;
    cr_assert_eq(kvidx_list_query_parse(qs, strlen(qs), &q, NULL, NULL), 0, "%s", qs);
    kvidx_list_query_digest(&q, d);
}

/* A resume key with the longest fields, so every layout byte is exercised. */
static kvidx_key_t long_key(char *model, char *salt)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof k);
    memset(model, 'm', KVIDX_MODEL_MAX);
    model[3] = '/';
    memset(salt, 's', KVIDX_SALT_MAX);
    k.model = model;
    k.model_len = KVIDX_MODEL_MAX;
    k.salt = salt;
    k.salt_len = KVIDX_SALT_MAX;
    k.kv_rank = 0x02010201u;
    k.group = 65535;
    k.hash_len = KVIDX_HASH_MAX;
    for (int i = 0; i < KVIDX_HASH_MAX; i++)
        k.hash[i] = (uint8_t)(i * 37 + 1);
    return k;
}

static kvidx_key_t small_key(void)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof k);
    k.model = "org/model";
    k.model_len = 9;
    k.salt = "alice";
    k.salt_len = 5;
    k.kv_rank = 7;
    k.group = 1;
    k.hash_len = 16;
    for (int i = 0; i < 16; i++)
        k.hash[i] = (uint8_t)(0xa0 + i);
    return k;
}

static size_t encode(const kvidx_token_secret_t *s, uint64_t now, const uint8_t *d,
                     const kvidx_key_t *k, char *buf)
{
    size_t size = KVIDX_PAGE_TOKEN_STR_MAX + 1;
    int rc = kvidx_page_token_encode(s, now, d, k, 0, buf, &size);
    cr_assert_eq(rc, 0, "encode: %d", rc);
    cr_assert_eq(strlen(buf), size);
    return size;
}

TestSuite(page_token, .init = setup);

Test(page_token, round_trip)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN];
    digest_of("model_name=org/model&tier=l1", d);
    char m[KVIDX_MODEL_MAX], s[KVIDX_SALT_MAX];
    kvidx_key_t keys[2] = {small_key(), long_key(m, s)};
    for (int i = 0; i < 2; i++) {
        char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
        size_t n = encode(&sec_a, T0, d, &keys[i], tok);
        cr_assert_leq(n, KVIDX_PAGE_TOKEN_STR_MAX);
        for (size_t j = 0; j < n; j++)
            cr_assert_not_null(strchr(b64url, tok[j]), "URL-safe");
        kvidx_page_cursor_t c;
        cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0 + 5, TTL, d, &c), 0);
        cr_assert(kvidx_key_equal(&c.key, &keys[i]));
        cr_assert_eq(c.flags, 0);
        cr_assert_eq(c.issued_s, T0);
        cr_assert_eq(c.secret_id, sec_a.id);
        kvidx_page_cursor_t copy;
        kvidx_page_cursor_copy(&copy, &c);
        cr_assert_eq(copy.key.model, copy.model);
        cr_assert(kvidx_key_equal(&copy.key, &keys[i]));
    }
    cr_assert_eq(KVIDX_PAGE_TOKEN_STR_MAX, 670);
}

Test(page_token, empty_salt_and_inclusive_flag)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN];
    digest_of("", d);
    kvidx_key_t k = small_key();
    k.salt = NULL;
    k.salt_len = 0;
    k.hash_len = 1;
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t size = sizeof tok;
    cr_assert_eq(
        kvidx_page_token_encode(&sec_a, T0, d, &k, KVIDX_PAGE_CURSOR_INCLUSIVE, tok, &size), 0);
    kvidx_page_cursor_t c;
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, size, T0, TTL, d, &c), 0);
    cr_assert_eq(c.flags, KVIDX_PAGE_CURSOR_INCLUSIVE);
    cr_assert_eq(c.key.salt_len, 0);
    cr_assert(kvidx_key_equal(&c.key, &k));
}

Test(page_token, encode_buffer_sizes)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    kvidx_key_t k = small_key();
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t size = 0;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_ENOBUFS);
    size_t need = size;
    size = need - 1;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_ENOBUFS);
    cr_assert_eq(size, need);
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), 0);
    cr_assert_eq(size, need - 1);
}

Test(page_token, encode_rejects_bad_keys)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t size = sizeof tok;
    kvidx_key_t k = small_key();
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0x80, tok, &size), KVIDX_EINVAL);
    k.model = "a@b";
    k.model_len = 3;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_EINVAL);
    k = small_key();
    k.model_len = 0;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_EINVAL);
    k = small_key();
    k.salt = "a/b";
    k.salt_len = 3;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_EINVAL);
    k = small_key();
    k.hash_len = 0;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_EINVAL);
    k.hash_len = KVIDX_HASH_MAX + 1;
    cr_assert_eq(kvidx_page_token_encode(&sec_a, T0, d, &k, 0, tok, &size), KVIDX_EINVAL);
}

/* Decodes with the test ring at T0 and the given digest. */
static int dec(const char *tok, size_t n, const uint8_t *d)
{
    kvidx_page_cursor_t c;
    return kvidx_page_token_decode(&ring, tok, n, T0, TTL, d, &c);
}

/* Bytes 1..4 of the binary token are the secret id. A change that alters the
 * id but keeps the structure (version, flags, lengths: byte 0 and bytes 29
 * on) names a secret the keyring does not hold, which docs/page_tokens.md answers with
 * 410 before the tag is looked at. */
static int id_changed_structure_kept(const uint8_t *a, const uint8_t *b, size_t n)
{
    if (a[0] != b[0] || memcmp(a + 29, b + 29, n - 29) != 0)
        return 0;
    return memcmp(a + 1, b + 1, 4) != 0;
}

Test(page_token, tamper_every_character)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN];
    digest_of("model_name=org/model", d);
    char m[KVIDX_MODEL_MAX], s[KVIDX_SALT_MAX];
    kvidx_key_t keys[2] = {small_key(), long_key(m, s)};
    for (int ki = 0; ki < 2; ki++) {
        char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
        size_t n = encode(&sec_a, T0, d, &keys[ki], tok);
        uint8_t orig[600], got[600];
        size_t orig_len, got_len;
        cr_assert_eq(sodium_base642bin(orig, sizeof orig, tok, n, NULL, &orig_len, NULL,
                                       sodium_base64_VARIANT_URLSAFE_NO_PADDING),
                     0);
        char t[KVIDX_PAGE_TOKEN_STR_MAX + 1];
        const char extra[] = "=+/.% \x01\x80";
        for (size_t i = 0; i < n; i++) {
            for (size_t r = 0; r < sizeof b64url - 1 + sizeof extra - 1; r++) {
                char c = r < sizeof b64url - 1 ? b64url[r] : extra[r - (sizeof b64url - 1)];
                if (c == tok[i])
                    continue;
                memcpy(t, tok, n);
                t[i] = c;
                int rc = dec(t, n, d);
                /* The oracle decodes with libsodium, which (1.0.18) also
                 * takes bytes >= 0x80: only alphabet characters count. */
                int id_only = r < sizeof b64url - 1 &&
                              sodium_base642bin(got, sizeof got, t, n, NULL, &got_len, NULL,
                                                sodium_base64_VARIANT_URLSAFE_NO_PADDING) == 0 &&
                              got_len == orig_len && id_changed_structure_kept(orig, got, orig_len);
                cr_assert_eq(rc, id_only ? KVIDX_ETOKENEXPIRED : KVIDX_ETOKEN,
                             "key %d pos %zu char %c: rc %d", ki, i, c, rc);
            }
        }
    }
}

Test(page_token, tamper_every_bit_of_binary)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN];
    digest_of("model_name=org/model", d);
    char m[KVIDX_MODEL_MAX], s[KVIDX_SALT_MAX];
    kvidx_key_t keys[2] = {small_key(), long_key(m, s)};
    for (int ki = 0; ki < 2; ki++) {
        char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
        size_t n = encode(&sec_a, T0, d, &keys[ki], tok);
        uint8_t bin[600];
        size_t bin_len;
        cr_assert_eq(sodium_base642bin(bin, sizeof bin, tok, n, NULL, &bin_len, NULL,
                                       sodium_base64_VARIANT_URLSAFE_NO_PADDING),
                     0);
        for (size_t i = 0; i < bin_len; i++) {
            for (int b = 0; b < 8; b++) {
                bin[i] ^= (uint8_t)(1u << b);
                char t[KVIDX_PAGE_TOKEN_STR_MAX + 2];
                sodium_bin2base64(t, sizeof t, bin, bin_len,
                                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
                int rc = dec(t, strlen(t), d);
                int want = (i >= 1 && i <= 4) ? KVIDX_ETOKENEXPIRED : KVIDX_ETOKEN;
                cr_assert_eq(rc, want, "key %d byte %zu bit %d: rc %d", ki, i, b, rc);
                bin[i] ^= (uint8_t)(1u << b);
            }
        }
        /* Appending or removing a byte of the binary is malformed too. */
        for (size_t len = 0; len < bin_len; len++) {
            char t[KVIDX_PAGE_TOKEN_STR_MAX + 2];
            sodium_bin2base64(t, sizeof t, bin, len, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
            cr_assert_eq(dec(t, strlen(t), d), KVIDX_ETOKEN, "binary prefix %zu", len);
        }
    }
}

Test(page_token, truncation_at_every_length)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN];
    digest_of("", d);
    char m[KVIDX_MODEL_MAX], s[KVIDX_SALT_MAX];
    kvidx_key_t k = long_key(m, s);
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&sec_a, T0, d, &k, tok);
    for (size_t len = 0; len < n; len++) {
        /* Copy so that a read past len would be caught by ASan builds. */
        char t[KVIDX_PAGE_TOKEN_STR_MAX];
        memcpy(t, tok, len);
        cr_assert_eq(dec(len ? t : "", len, d), KVIDX_ETOKEN, "length %zu", len);
    }
    cr_assert_eq(dec(tok, n, d), 0);
}

Test(page_token, garbage)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    char big[2048];
    memset(big, 'A', sizeof big);
    cr_assert_eq(dec(big, sizeof big, d), KVIDX_ETOKEN);
    cr_assert_eq(dec(big, KVIDX_PAGE_TOKEN_STR_MAX + 1, d), KVIDX_ETOKEN);
    /* All-'A' decodes to zero bytes: version 0. */
    cr_assert_eq(dec(big, 100, d), KVIDX_ETOKEN);
    cr_assert_eq(dec("not a token", 11, d), KVIDX_ETOKEN);
}

Test(page_token, every_filter_mismatch)
{
    const char *qs[] = {
        "model_name=m&cache_salt=s&kv_rank=1&object_group_id=1&tier=l1",
        "model_name=n&cache_salt=s&kv_rank=1&object_group_id=1&tier=l1",
        "cache_salt=s&kv_rank=1&object_group_id=1&tier=l1",
        "model_name=m&cache_salt=t&kv_rank=1&object_group_id=1&tier=l1",
        "model_name=m&cache_salt=&kv_rank=1&object_group_id=1&tier=l1",
        "model_name=m&kv_rank=1&object_group_id=1&tier=l1",
        "model_name=m&cache_salt=s&kv_rank=2&object_group_id=1&tier=l1",
        "model_name=m&cache_salt=s&object_group_id=1&tier=l1",
        "model_name=m&cache_salt=s&kv_rank=1&object_group_id=2&tier=l1",
        "model_name=m&cache_salt=s&kv_rank=1&tier=l1",
        "model_name=m&cache_salt=s&kv_rank=1&object_group_id=1&tier=l2",
        "model_name=m&cache_salt=s&kv_rank=1&object_group_id=1",
    };
    uint8_t d0[KVIDX_LIST_DIGEST_LEN];
    digest_of(qs[0], d0);
    kvidx_key_t k = small_key();
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&sec_a, T0, d0, &k, tok);
    cr_assert_eq(dec(tok, n, d0), 0);
    uint8_t same[KVIDX_LIST_DIGEST_LEN];
    digest_of("tier=l1&object_group_id=1&kv_rank=1&cache_salt=s&model_name=m&page_size=7", same);
    cr_assert_eq(dec(tok, n, same), 0, "page_size and parameter order do not matter");
    for (size_t i = 1; i < sizeof qs / sizeof qs[0]; i++) {
        uint8_t d[KVIDX_LIST_DIGEST_LEN];
        digest_of(qs[i], d);
        cr_assert_eq(dec(tok, n, d), KVIDX_ETOKENMISMATCH, "%s", qs[i]);
    }
}

Test(page_token, expiry_with_injected_clock)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {1};
    kvidx_key_t k = small_key();
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&sec_a, T0, d, &k, tok);
    kvidx_page_cursor_t c;
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0, TTL, d, &c), 0);
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0 + TTL, TTL, d, &c), 0,
                 "an age of exactly ttl is valid");
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0 + TTL + 1, TTL, d, &c),
                 KVIDX_ETOKENEXPIRED);
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, UINT64_MAX, TTL, d, &c),
                 KVIDX_ETOKENEXPIRED);
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0, 0, d, &c), 0, "ttl 0: same second");
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0 + 1, 0, d, &c), KVIDX_ETOKENEXPIRED);
    /* From the future: within the skew it is fine, beyond it expired. */
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0 - KVIDX_PAGE_TOKEN_SKEW_S, TTL, d, &c),
                 0);
    cr_assert_eq(
        kvidx_page_token_decode(&ring, tok, n, T0 - KVIDX_PAGE_TOKEN_SKEW_S - 1, TTL, d, &c),
        KVIDX_ETOKENEXPIRED);
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, 0, TTL, d, &c), KVIDX_ETOKENEXPIRED);
    /* Expiry is checked before the filters: an old token is expired either way. */
    uint8_t other[KVIDX_LIST_DIGEST_LEN] = {2};
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0 + TTL + 1, TTL, other, &c),
                 KVIDX_ETOKENEXPIRED);
    cr_assert_eq(kvidx_page_token_decode(&ring, tok, n, T0, TTL, other, &c), KVIDX_ETOKENMISMATCH);
}

Test(page_token, unknown_secret_id_is_expired)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    kvidx_key_t k = small_key();
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&sec_b, T0, d, &k, tok);
    cr_assert_eq(dec(tok, n, d), KVIDX_ETOKENEXPIRED);
    kvidx_token_keyring_t empty;
    kvidx_token_keyring_init(&empty);
    kvidx_page_cursor_t c;
    cr_assert_eq(kvidx_page_token_decode(&empty, tok, n, T0, TTL, d, &c), KVIDX_ETOKENEXPIRED);
}

Test(page_token, known_id_other_secret_is_invalid)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    kvidx_key_t k = small_key();
    kvidx_token_secret_t forged = sec_b;
    forged.id = sec_a.id;
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&forged, T0, d, &k, tok);
    cr_assert_eq(dec(tok, n, d), KVIDX_ETOKEN);
}

Test(page_token, rotation)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    kvidx_key_t k = small_key();
    char old_tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t old_n = encode(kvidx_token_keyring_current(&ring), T0, d, &k, old_tok);

    cr_assert_eq(kvidx_token_keyring_rotate(&ring, &sec_b), 0);
    cr_assert_eq(kvidx_token_keyring_rotate(&ring, &sec_b), KVIDX_EINVAL, "duplicate id");
    cr_assert_eq(kvidx_token_keyring_current(&ring)->id, sec_b.id);
    cr_assert_eq(ring.count, 2);
    cr_assert_eq(dec(old_tok, old_n, d), 0, "the previous secret still verifies");
    char new_tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t new_n = encode(kvidx_token_keyring_current(&ring), T0, d, &k, new_tok);
    cr_assert_eq(dec(new_tok, new_n, d), 0);

    /* Rotate until sec_a falls off the end of the keyring. */
    for (int i = 0; i < KVIDX_TOKEN_KEYRING_MAX - 1; i++) {
        kvidx_token_secret_t s;
        do
            cr_assert_eq(kvidx_token_secret_generate(&s), 0);
        while (kvidx_token_keyring_find(&ring, s.id) != NULL);
        cr_assert_eq(kvidx_token_keyring_rotate(&ring, &s), 0);
    }
    cr_assert_eq(ring.count, KVIDX_TOKEN_KEYRING_MAX);
    cr_assert_null(kvidx_token_keyring_find(&ring, sec_a.id));
    cr_assert_eq(dec(old_tok, old_n, d), KVIDX_ETOKENEXPIRED);
    cr_assert_eq(dec(new_tok, new_n, d), 0);

    kvidx_token_keyring_clear(&ring);
    cr_assert_eq(ring.count, 0);
    cr_assert_null(kvidx_token_keyring_current(&ring));
    cr_assert_eq(dec(new_tok, new_n, d), KVIDX_ETOKENEXPIRED);
}

Test(page_token, token_passes_query_parser)
{
    char m[KVIDX_MODEL_MAX], s[KVIDX_SALT_MAX];
    kvidx_key_t k = long_key(m, s);
    uint8_t d[KVIDX_LIST_DIGEST_LEN];
    digest_of("model_name=x", d);
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&sec_a, T0, d, &k, tok);
    char qs[KVIDX_PAGE_TOKEN_STR_MAX + 64];
    snprintf(qs, sizeof qs, "model_name=x&page_token=%s", tok);
    kvidx_list_query_t q;
    cr_assert_eq(kvidx_list_query_parse(qs, strlen(qs), &q, NULL, NULL), 0);
    cr_assert_eq(q.token_len, n);
    uint8_t qd[KVIDX_LIST_DIGEST_LEN];
    kvidx_list_query_digest(&q, qd);
    kvidx_page_cursor_t c;
    cr_assert_eq(kvidx_page_token_decode(&ring, q.token, q.token_len, T0, TTL, qd, &c), 0);
    cr_assert(kvidx_key_equal(&c.key, &k));
}

/* libsodium 1.0.18 decodes bytes >= 0x80 as if they were alphabet
 * characters; the decoder must not, or one token would have many spellings. */
Test(page_token, non_ascii_bytes_rejected)
{
    uint8_t d[KVIDX_LIST_DIGEST_LEN] = {0};
    kvidx_key_t k = small_key();
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = encode(&sec_a, T0, d, &k, tok);
    for (size_t i = 0; i < n; i++) {
        for (int c = 0x80; c <= 0xff; c++) {
            char t[KVIDX_PAGE_TOKEN_STR_MAX + 1];
            memcpy(t, tok, n);
            t[i] = (char)c;
            cr_assert_eq(dec(t, n, d), KVIDX_ETOKEN, "pos %zu byte 0x%02x", i, c);
        }
    }
}
