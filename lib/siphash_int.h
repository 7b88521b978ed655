/*
 * SipHash (Aumasson & Bernstein), inline, for the index's hash table.
 * libsodium's crypto_shorthash is SipHash-2-4 behind a call that takes and
 * gives bytes; the table hashes a key part per lookup, so the call, the
 * byte shuffling and the extra rounds were a tenth of a 1000-key lookup.
 * The table uses SipHash-1-3 (the variant Rust's HashMap uses: still a
 * keyed pseudo-random function against hash flooding, at about half the
 * rounds). The round counts are parameters so that tests can run this code
 * as SipHash-2-4 and check it against libsodium.
 */
#ifndef KVIDX_SIPHASH_INT_H
#define KVIDX_SIPHASH_INT_H

#include "bytes_int.h"

#include <stddef.h>
#include <stdint.h>

#define KVIDX_SIP_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define KVIDX_SIP_ROUND                                                                            \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = KVIDX_SIP_ROTL(v1, 13);                                                               \
        v1 ^= v0;                                                                                  \
        v0 = KVIDX_SIP_ROTL(v0, 32);                                                               \
        v2 += v3;                                                                                  \
        v3 = KVIDX_SIP_ROTL(v3, 16);                                                               \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = KVIDX_SIP_ROTL(v3, 21);                                                               \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = KVIDX_SIP_ROTL(v1, 17);                                                               \
        v1 ^= v2;                                                                                  \
        v2 = KVIDX_SIP_ROTL(v2, 32);                                                               \
    } while (0)

/* SipHash-c-d, under the 16-byte key, of the 8n-byte message whose bytes
 * are the n words' little-endian bytes; the u64 whose little-endian bytes
 * are the reference output. Messages are whole words: callers build them
 * so, without byte copies. */
static inline uint64_t kvidx_siphash_words(const uint8_t key[16], const uint64_t *w, size_t n,
                                           int c, int d)
{
    uint64_t k0 = kvidx_le64(key), k1 = kvidx_le64(key + 8);
    uint64_t v0 = k0 ^ UINT64_C(0x736f6d6570736575), v1 = k1 ^ UINT64_C(0x646f72616e646f6d);
    uint64_t v2 = k0 ^ UINT64_C(0x6c7967656e657261), v3 = k1 ^ UINT64_C(0x7465646279746573);
    for (size_t i = 0; i < n; i++) {
        v3 ^= w[i];
        for (int r = 0; r < c; r++)
            KVIDX_SIP_ROUND;
        v0 ^= w[i];
    }
    uint64_t b = (uint64_t)(8 * n) << 56;
    v3 ^= b;
    for (int r = 0; r < c; r++)
        KVIDX_SIP_ROUND;
    v0 ^= b;
    v2 ^= 0xff;
    for (int r = 0; r < d; r++)
        KVIDX_SIP_ROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

#endif
