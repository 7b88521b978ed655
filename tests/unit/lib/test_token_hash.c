/*
 * LMCache's token hashing (lib/token_hash.c) against a chain the test builds
 * itself: the bytes prefix || tokens are put together here (tokens through
 * htonl, not through the code under test) and hashed by the `b3sum` tool.
 * Covers NONE_HASH, chains of 1..5 chunks with several chunk sizes, partial
 * last chunks, tokens with high bits set (big-endian layout), short output
 * arrays, and the fan-out of chunk hashes to per-rank keys.
 */
#include "kvidx/err.h"
#include "kvidx/key.h"
#include "kvidx/token_hash.h"
#include "b3sum_ref.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HLEN      KVIDX_TOKEN_HASH_LEN
#define MAXCHUNKS 5

/* NONE_HASH as documented in docs/blake3.md: BLAKE3 of 12 zero bytes. */
static const char NONE_HASH_HEX[] =
    "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b";

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* Tokens of every size, with the high bits set in many of them. */
static void fill_tokens(uint64_t *s, uint32_t *t, size_t n)
{
    static const uint32_t edges[] = {0xFFFFFFFFu, 0x80000000u, 0x01020304u, 0u, 0x00FF00FFu};
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_rand(s);
        t[i] = (r & 3) == 0 ? edges[(r >> 2) % 5] : (uint32_t)(r >> 32);
    }
}

/* b3sum(prev || tokens as big-endian uint32), the bytes assembled here. */
static void reference_step(const uint8_t prev[HLEN], const uint32_t *tokens, size_t n,
                           uint8_t out[HLEN])
{
    uint8_t *buf = malloc(HLEN + 4 * n);
    cr_assert(buf != NULL);
    memcpy(buf, prev, HLEN);
    for (size_t i = 0; i < n; i++) {
        uint32_t be = htonl(tokens[i]);
        memcpy(buf + HLEN + 4 * i, &be, 4);
    }
    b3sum_one(buf, HLEN + 4 * n, HLEN, out);
    free(buf);
}

static void reference_none(uint8_t out[HLEN])
{
    const uint8_t zeros[12] = {0};
    b3sum_one(zeros, sizeof(zeros), HLEN, out);
}

static void reference_chain(const uint32_t *tokens, size_t chunks, size_t chunk_size,
                            uint8_t (*out)[HLEN])
{
    uint8_t prev[HLEN];
    reference_none(prev);
    for (size_t c = 0; c < chunks; c++) {
        reference_step(prev, tokens + c * chunk_size, chunk_size, out[c]);
        memcpy(prev, out[c], HLEN);
    }
}

Test(token_hash, none_hash_is_blake3_of_12_zero_bytes)
{
    uint8_t got[HLEN], want[HLEN], documented[HLEN];
    kvidx_token_hash_none(got);
    reference_none(want);
    cr_assert(b3sum_unhex(NONE_HASH_HEX, HLEN, documented) == 0);
    cr_expect(memcmp(got, want, HLEN) == 0, "NONE_HASH differs from b3sum of 12 zero bytes");
    cr_expect(memcmp(got, documented, HLEN) == 0, "NONE_HASH differs from the documented value");
}

Test(token_hash, chains_of_one_to_five_chunks_match_the_reference)
{
    static const size_t sizes[] = {KVIDX_TOKEN_CHUNK_SIZE_DEFAULT, 4, 1, 3};
    cr_assert(KVIDX_TOKEN_CHUNK_SIZE_DEFAULT == 256);
    uint64_t seed = 256;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t cs = sizes[si];
        size_t cap = MAXCHUNKS * cs + cs; /* room for a partial chunk */
        uint32_t *tokens = malloc(cap * sizeof(*tokens));
        cr_assert(tokens != NULL);
        fill_tokens(&seed, tokens, cap);
        uint8_t want[MAXCHUNKS][HLEN];
        reference_chain(tokens, MAXCHUNKS, cs, want);
        for (size_t k = 0; k <= MAXCHUNKS; k++) {
            /* Partial last chunks (none, one token, one short of full). */
            const size_t partials[] = {0, cs > 1 ? 1 : 0, cs - 1};
            for (size_t pi = 0; pi < 3; pi++) {
                size_t n = k * cs + partials[pi];
                uint8_t got[MAXCHUNKS + 1][HLEN];
                memset(got, 0xAA, sizeof(got));
                size_t m = kvidx_token_hash_chain(tokens, n, cs, got, MAXCHUNKS + 1);
                cr_expect_eq(m, k, "chunk_size %zu, %zu tokens: %zu hashes, want %zu", cs, n, m, k);
                for (size_t c = 0; c < k && c < m; c++)
                    cr_expect(memcmp(got[c], want[c], HLEN) == 0,
                              "chunk_size %zu, %zu tokens: hash %zu differs from the reference", cs,
                              n, c);
                uint8_t untouched[HLEN];
                memset(untouched, 0xAA, HLEN);
                cr_expect(memcmp(got[k], untouched, HLEN) == 0,
                          "chunk_size %zu, %zu tokens: a partial chunk was written", cs, n);
            }
        }
        free(tokens);
    }
}

Test(token_hash, tokens_are_big_endian)
{
    const uint32_t tokens[2] = {0x01020304u, 0xFFFFFF00u};
    uint8_t none[HLEN];
    kvidx_token_hash_none(none);
    uint8_t bytes[HLEN + 8];
    memcpy(bytes, none, HLEN);
    const uint8_t be[8] = {0x01, 0x02, 0x03, 0x04, 0xFF, 0xFF, 0xFF, 0x00};
    const uint8_t le[8] = {0x04, 0x03, 0x02, 0x01, 0x00, 0xFF, 0xFF, 0xFF};
    uint8_t want_be[HLEN], want_le[HLEN], got[1][HLEN];
    memcpy(bytes + HLEN, be, 8);
    b3sum_one(bytes, sizeof(bytes), HLEN, want_be);
    memcpy(bytes + HLEN, le, 8);
    b3sum_one(bytes, sizeof(bytes), HLEN, want_le);
    cr_assert_eq(kvidx_token_hash_chain(tokens, 2, 2, got, 1), 1);
    cr_expect(memcmp(got[0], want_be, HLEN) == 0, "tokens are not hashed as big-endian uint32");
    cr_expect(memcmp(got[0], want_le, HLEN) != 0);
}

Test(token_hash, short_output_gets_the_leading_hashes)
{
    uint64_t seed = 5;
    uint32_t tokens[5 * 4 + 2];
    fill_tokens(&seed, tokens, sizeof(tokens) / sizeof(tokens[0]));
    uint8_t all[5][HLEN], some[3][HLEN];
    cr_assert_eq(kvidx_token_hash_chain(tokens, 22, 4, all, 5), 5);
    memset(some, 0x55, sizeof(some));
    cr_expect_eq(kvidx_token_hash_chain(tokens, 22, 4, some, 2), 5, "the count is the total");
    cr_expect(memcmp(some, all, 2 * HLEN) == 0);
    uint8_t untouched[HLEN];
    memset(untouched, 0x55, HLEN);
    cr_expect(memcmp(some[2], untouched, HLEN) == 0, "wrote past max_out");
    cr_expect_eq(kvidx_token_hash_chain(tokens, 22, 4, NULL, 0), 5);
    cr_expect_eq(kvidx_token_hash_chain(tokens, 3, 4, NULL, 0), 0);
    cr_expect_eq(kvidx_token_hash_chain(NULL, 0, 256, NULL, 0), 0);
    cr_expect_eq(kvidx_token_hash_chain(tokens, 22, 0, all, 5), 0, "chunk_size 0 hashes nothing");
}

Test(token_hash, step_is_one_link_and_may_work_in_place)
{
    uint64_t seed = 6;
    uint32_t tokens[3 * 300];
    fill_tokens(&seed, tokens, sizeof(tokens) / sizeof(tokens[0]));
    uint8_t chain[3][HLEN];
    cr_assert_eq(kvidx_token_hash_chain(tokens, 900, 300, chain, 3), 3);
    uint8_t h[HLEN];
    kvidx_token_hash_none(h);
    for (size_t c = 0; c < 3; c++) {
        kvidx_token_hash_step(h, tokens + 300 * c, 300, h);
        cr_expect(memcmp(h, chain[c], HLEN) == 0, "link %zu differs", c);
    }
}

/* ---- fan-out to keys ---- */

Test(token_hash, keys_fan_out_chunk_major_with_packed_ranks)
{
    uint8_t hashes[3][HLEN];
    for (size_t c = 0; c < 3; c++)
        memset(hashes[c], (int)(0x10 + c), HLEN);
    static const uint32_t world_sizes[] = {1, 2, 3, 8, 255};
    const char model[] = "meta-llama/Llama-3.1-8B", salt[] = "tenant-a";
    for (size_t wi = 0; wi < sizeof(world_sizes) / sizeof(world_sizes[0]); wi++) {
        uint32_t ws = world_sizes[wi];
        kvidx_key_t keys[3 * 255];
        size_t count = sizeof(keys) / sizeof(keys[0]);
        int rc = kvidx_token_hash_keys((const uint8_t(*)[HLEN])hashes, 3, ws, model, strlen(model),
                                       salt, strlen(salt), keys, &count, NULL);
        cr_assert_eq(rc, 0, "world_size %u: rc %d", ws, rc);
        cr_assert_eq(count, 3 * ws);
        for (size_t c = 0; c < 3; c++)
            for (uint32_t r = 0; r < ws; r++) {
                const kvidx_key_t *k = &keys[c * ws + r];
                uint32_t want = ws << 24 | r << 16 | ws << 8 | r;
                cr_expect_eq(k->kv_rank, want, "ws %u chunk %zu rank %u: kv_rank %08x", ws, c, r,
                             k->kv_rank);
                cr_expect_eq(k->group, 0);
                cr_expect_eq(k->hash_len, HLEN);
                cr_expect(memcmp(k->hash, hashes[c], HLEN) == 0);
                cr_expect(k->model == model && k->model_len == strlen(model));
                cr_expect(k->salt == salt && k->salt_len == strlen(salt));
                char buf[KVIDX_KEY_STR_MAX];
                size_t size = sizeof(buf);
                cr_expect_eq(kvidx_key_encode_canonical(k, buf, &size), 0);
            }
    }
}

Test(token_hash, keys_ranks_written_out)
{
    uint8_t hashes[2][HLEN] = {{1}, {2}};
    kvidx_key_t keys[4];
    size_t count = 4;
    cr_assert_eq(kvidx_token_hash_keys((const uint8_t(*)[HLEN])hashes, 2, 2, "m", 1, NULL, 0, keys,
                                       &count, NULL),
                 0);
    cr_assert_eq(count, 4);
    const uint32_t want[4] = {0x02000200u, 0x02010201u, 0x02000200u, 0x02010201u};
    for (size_t i = 0; i < 4; i++) {
        cr_expect_eq(keys[i].kv_rank, want[i], "key %zu", i);
        cr_expect_eq(keys[i].hash[0], i < 2 ? 1 : 2, "key %zu is not chunk-major", i);
        cr_expect_eq(keys[i].salt_len, 0);
    }
}

Test(token_hash, keys_errors)
{
    uint8_t hashes[2][HLEN] = {{0}};
    const uint8_t(*h)[HLEN] = (const uint8_t(*)[HLEN])hashes;
    kvidx_key_t keys[4];
    kvidx_reason_t why = {0};
    size_t count = 3;
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 2, "m", 1, "", 0, keys, &count, &why), KVIDX_ENOBUFS);
    cr_expect_eq(count, 4, "ENOBUFS reports the count needed");
    count = 0;
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 2, "m", 1, "", 0, NULL, &count, &why), KVIDX_ENOBUFS);
    cr_expect_eq(count, 4);

    count = 4;
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 0, "m", 1, "", 0, keys, &count, &why), KVIDX_EINVAL);
    cr_expect_str_eq(why.field, "world_size");
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 256, "m", 1, "", 0, keys, &count, &why), KVIDX_EINVAL);
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 2, "", 0, "", 0, keys, &count, &why), KVIDX_EKEY);
    cr_expect_str_eq(why.field, "model_name");
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 2, "a@b", 3, "", 0, keys, &count, &why), KVIDX_EKEY);
    cr_expect_eq(kvidx_token_hash_keys(h, 2, 2, "m", 1, "a/b", 3, keys, &count, &why), KVIDX_EKEY);
    cr_expect_str_eq(why.field, "cache_salt");
    cr_expect_eq(count, 4, "a failed call changes *count only for ENOBUFS");

    count = 0;
    cr_expect_eq(kvidx_token_hash_keys(NULL, 0, 8, "m", 1, "", 0, NULL, &count, NULL), 0);
    cr_expect_eq(count, 0, "no chunks, no keys");
}
