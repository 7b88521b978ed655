/*
 * libFuzzer target for page tokens. Each input is used twice:
 *  1. as a token: decoding arbitrary bytes must never crash and never
 *     succeed (nobody but the encoder below knows the secret);
 *  2. as the description of a resume key: if the derived key is valid,
 *     encode -> decode must give back the same key, flags and time.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "kvidx/err.h"
#include "kvidx/page_token.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A fixed secret keeps runs reproducible. */
    kvidx_token_secret_t s = {.id = 0x01020304u};
    memset(s.secret, 0x5a, sizeof s.secret);
    kvidx_token_keyring_t kr;
    kvidx_token_keyring_init(&kr);
    check(kvidx_token_keyring_rotate(&kr, &s) == 0);
    uint8_t digest[KVIDX_LIST_DIGEST_LEN] = {0};
    kvidx_page_cursor_t c;

    int rc = kvidx_page_token_decode(&kr, (const char *)data, size, 1000, 3600, digest, &c);
    check(rc == KVIDX_ETOKEN || rc == KVIDX_ETOKENEXPIRED);

    /* Derive a key: 1 byte salt length, 1 byte model length, 1 byte hash
     * length, 4 bytes rank, 2 bytes group, 1 byte flags, then the bytes. */
    if (size < 10)
        return 0;
    size_t sl = data[0] % (KVIDX_SALT_MAX + 1), ml = data[1], hl = data[2] % (KVIDX_HASH_MAX + 1);
    if (size < 10 + sl + ml + hl)
        return 0;
    kvidx_key_t k;
    memset(&k, 0, sizeof k);
    k.kv_rank =
        (uint32_t)data[3] << 24 | (uint32_t)data[4] << 16 | (uint32_t)data[5] << 8 | data[6];
    k.group = (uint16_t)(data[7] << 8 | data[8]);
    unsigned flags = data[9] & 3u;
    const uint8_t *p = data + 10;
    k.salt = (const char *)p;
    k.salt_len = (uint8_t)sl;
    k.model = (const char *)p + sl;
    k.model_len = (uint16_t)ml;
    k.hash_len = (uint8_t)hl;
    memcpy(k.hash, p + sl + ml, hl);
    uint64_t now = (uint64_t)data[9] << 20;

    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t n = sizeof tok;
    rc = kvidx_page_token_encode(&s, now, digest, &k, flags, tok, &n);
    int valid = (flags & ~KVIDX_PAGE_CURSOR_INCLUSIVE) == 0 && hl >= KVIDX_HASH_MIN &&
                kvidx_key_check_model(k.model, ml, NULL) == 0 &&
                kvidx_key_check_salt(k.salt, sl, NULL) == 0;
    check(valid ? rc == 0 : rc == KVIDX_EINVAL);
    if (rc != 0)
        return 0;
    check(n <= KVIDX_PAGE_TOKEN_STR_MAX && strlen(tok) == n);
    rc = kvidx_page_token_decode(&kr, tok, n, now, 0, digest, &c);
    check(rc == 0);
    check(kvidx_key_equal(&c.key, &k));
    check(c.flags == flags && c.issued_s == now && c.secret_id == s.id);
    /* One step past the ttl, and another digest, must be refused. */
    check(kvidx_page_token_decode(&kr, tok, n, now + 1, 0, digest, &c) == KVIDX_ETOKENEXPIRED);
    uint8_t other[KVIDX_LIST_DIGEST_LEN] = {1};
    check(kvidx_page_token_decode(&kr, tok, n, now, 0, other, &c) == KVIDX_ETOKENMISMATCH);
    return 0;
}
