/*
 * libFuzzer target for BLAKE3 (lib/blake3.c) and the token chain
 * (lib/token_hash.c).
 *
 * The first byte picks the cut points: the rest of the input is hashed in
 * one call and again in pieces whose sizes come from a generator seeded with
 * that byte, and the two must agree, for 32 bytes and for a longer output
 * that must start with those 32 bytes. The rest is also read as big-endian
 * tokens whose chain, computed in one call, must equal the chain built link
 * by link. Any mismatch aborts so that libFuzzer records the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/blake3.h"
#include "kvidx/token_hash.h"

#define MAX_TOKENS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint32_t seed = data[0] * 2654435761u + 1;
    const uint8_t *in = data + 1;
    size_t len = size - 1;

    uint8_t one[KVIDX_BLAKE3_OUT_LEN], pieces[200];
    kvidx_blake3(in, len, one);
    kvidx_blake3_t h;
    kvidx_blake3_init(&h);
    size_t done = 0;
    while (done < len) {
        seed = seed * 1103515245u + 12345u;
        size_t step = (seed >> 16) % 1500;
        if (step > len - done)
            step = len - done;
        kvidx_blake3_update(&h, in + done, step);
        done += step;
    }
    kvidx_blake3_final(&h, pieces, sizeof(pieces));
    if (memcmp(one, pieces, sizeof(one)) != 0)
        abort();
    uint8_t again[KVIDX_BLAKE3_OUT_LEN];
    kvidx_blake3_final(&h, again, sizeof(again));
    if (memcmp(one, again, sizeof(one)) != 0)
        abort();

    size_t n = len / 4 < MAX_TOKENS ? len / 4 : MAX_TOKENS;
    static uint32_t tokens[MAX_TOKENS];
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)in[4 * i] << 24 | (uint32_t)in[4 * i + 1] << 16 |
                    (uint32_t)in[4 * i + 2] << 8 | in[4 * i + 3];
    size_t chunk_size = 1 + data[0] % 64;
    static uint8_t chain[MAX_TOKENS][KVIDX_TOKEN_HASH_LEN];
    size_t chunks = kvidx_token_hash_chain(tokens, n, chunk_size, chain, MAX_TOKENS);
    if (chunks != n / chunk_size)
        abort();
    uint8_t link[KVIDX_TOKEN_HASH_LEN];
    kvidx_token_hash_none(link);
    for (size_t c = 0; c < chunks; c++) {
        kvidx_token_hash_step(link, tokens + c * chunk_size, chunk_size, link);
        if (memcmp(link, chain[c], sizeof(link)) != 0)
            abort();
    }
    return 0;
}
