/*
 * LMCache's default token hashing: BLAKE3 chained over complete chunks of
 * tokens, each token as a big-endian uint32, each link prefixed by the raw
 * 32-byte hash of the previous chunk (NONE_HASH, the hash of 12 zero bytes,
 * before the first); and the fan-out of chunk hashes to per-rank keys.
 *
 * Invariants: the bytes hashed are exactly prefix || tokens (no length, salt
 * or separator), so a chain computed here equals LMCache's for the same
 * tokens and chunk size; a partial last chunk never produces a hash. Tokens
 * are serialised through a small stack buffer, a batch at a time. The keys
 * made by kvidx_token_hash_keys satisfy every key rule, because the model
 * and salt are checked with key.c's own checks and the ranks come from its
 * ipc expansion.
 */
#include "kvidx/token_hash.h"

#include "kvidx/err.h"

#include <string.h>

/* Tokens serialised per update call (1 KiB of bytes). */
#define TOKEN_BATCH 256

void kvidx_token_hash_none(uint8_t out[KVIDX_TOKEN_HASH_LEN])
{
    /* LMCache hashes (prefix 0, tokens (0,)): the prefix as an 8-byte
     * signed big-endian integer, the single token as 4 bytes. */
    static const uint8_t zeros[8 + 4] = {0};
    kvidx_blake3(zeros, sizeof(zeros), out);
}

void kvidx_token_hash_step(const uint8_t prev[KVIDX_TOKEN_HASH_LEN], const uint32_t *tokens,
                           size_t n, uint8_t out[KVIDX_TOKEN_HASH_LEN])
{
    kvidx_blake3_t h;
    uint8_t buf[4 * TOKEN_BATCH];
    kvidx_blake3_init(&h);
    kvidx_blake3_update(&h, prev, KVIDX_TOKEN_HASH_LEN);
    while (n > 0) {
        size_t k = n < TOKEN_BATCH ? n : TOKEN_BATCH;
        for (size_t i = 0; i < k; i++) {
            uint32_t t = tokens[i];
            buf[4 * i] = (uint8_t)(t >> 24);
            buf[4 * i + 1] = (uint8_t)(t >> 16);
            buf[4 * i + 2] = (uint8_t)(t >> 8);
            buf[4 * i + 3] = (uint8_t)t;
        }
        kvidx_blake3_update(&h, buf, 4 * k);
        tokens += k;
        n -= k;
    }
    kvidx_blake3_final(&h, out, KVIDX_TOKEN_HASH_LEN);
}

size_t kvidx_token_hash_chain(const uint32_t *tokens, size_t n, size_t chunk_size,
                              uint8_t (*out)[KVIDX_TOKEN_HASH_LEN], size_t max_out)
{
    if (chunk_size == 0)
        return 0;
    size_t chunks = n / chunk_size;
    size_t todo = chunks < max_out ? chunks : max_out;
    uint8_t prev[KVIDX_TOKEN_HASH_LEN];
    kvidx_token_hash_none(prev);
    for (size_t c = 0; c < todo; c++) {
        kvidx_token_hash_step(prev, tokens + c * chunk_size, chunk_size, out[c]);
        memcpy(prev, out[c], sizeof(prev));
    }
    return chunks;
}

int kvidx_token_hash_keys(const uint8_t (*hashes)[KVIDX_TOKEN_HASH_LEN], size_t num_chunks,
                          uint32_t world_size, const char *model, size_t model_len,
                          const char *salt, size_t salt_len, kvidx_key_t *out, size_t *count,
                          kvidx_reason_t *why)
{
    kvidx_ipc_t ipc = {.world_size = world_size, .worker_id = -1, .num_chunks = 0, .num_groups = 1};
    int rc = kvidx_ipc_check(&ipc, why);
    if (rc != 0)
        return rc;
    if ((rc = kvidx_key_check_model(model, model_len, why)) != 0 ||
        (rc = kvidx_key_check_salt(salt, salt_len, why)) != 0)
        return rc;
    if (num_chunks > UINT32_MAX)
        return KVIDX_ETOOMANYKEYS;
    ipc.num_chunks = (uint32_t)num_chunks;
    uint64_t total = kvidx_ipc_total(&ipc);
    if (total > UINT32_MAX)
        return KVIDX_ETOOMANYKEYS;
    if (*count < total) {
        *count = (size_t)total;
        return KVIDX_ENOBUFS;
    }
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)model_len;
    k.salt = salt;
    k.salt_len = (uint8_t)salt_len;
    k.hash_len = KVIDX_TOKEN_HASH_LEN;
    k.group = 0;
    uint32_t ranks = kvidx_ipc_num_ranks(&ipc);
    size_t i = 0;
    for (size_t c = 0; c < num_chunks; c++) {
        memcpy(k.hash, hashes[c], KVIDX_TOKEN_HASH_LEN);
        for (uint32_t r = 0; r < ranks; r++) {
            k.kv_rank = kvidx_ipc_rank(&ipc, r);
            out[i++] = k;
        }
    }
    *count = i;
    return 0;
}
