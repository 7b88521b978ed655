/*
 * LMCache's default token hashing (its TokenHasher with the "blake3"
 * algorithm) and the fan-out of a chunk hash to the per-rank keys of the
 * fleet directory's tokens form.
 *
 * A token sequence is cut into chunks of chunk_size tokens (256 by
 * default); only complete chunks are hashed, a partial last chunk is
 * ignored. The hashes are chained:
 *
 *   NONE_HASH = BLAKE3(8 zero bytes || 4 zero bytes)         (12 zero bytes)
 *   h_1       = BLAKE3(NONE_HASH || chunk 1's tokens)
 *   h_i       = BLAKE3(h_{i-1}   || chunk i's tokens)
 *
 * where each prefix is the raw 32-byte digest and each token is written as
 * a big-endian uint32. No salt, model or other key takes part: cache_salt
 * only goes into the keys. docs/blake3.md says where this comes from.
 *
 * Nothing here allocates.
 */
#ifndef KVIDX_TOKEN_HASH_H
#define KVIDX_TOKEN_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/blake3.h"
#include "kvidx/key.h"

#define KVIDX_TOKEN_HASH_LEN           KVIDX_BLAKE3_OUT_LEN /* 32 bytes per chunk hash */
#define KVIDX_TOKEN_CHUNK_SIZE_DEFAULT 256

/* The chain's starting value, NONE_HASH. */
void kvidx_token_hash_none(uint8_t out[KVIDX_TOKEN_HASH_LEN]);

/* One link of the chain: out = BLAKE3(prev || tokens as big-endian uint32).
 * n may be any count (chunk_size for a complete chunk); out may be prev. */
void kvidx_token_hash_step(const uint8_t prev[KVIDX_TOKEN_HASH_LEN], const uint32_t *tokens,
                           size_t n, uint8_t out[KVIDX_TOKEN_HASH_LEN]);

/* The chunk hashes of n tokens, from NONE_HASH. Returns the number of
 * complete chunks, n / chunk_size (0 when chunk_size is 0), and writes the
 * first min(that, max_out) hashes to out[0..] (out may be NULL when max_out
 * is 0, to ask for the count). Since the hashes are chained, a short out
 * gets the leading hashes, exactly as a longer one would begin. */
size_t kvidx_token_hash_chain(const uint32_t *tokens, size_t n, size_t chunk_size,
                              uint8_t (*out)[KVIDX_TOKEN_HASH_LEN], size_t max_out);

/* The keys a tokens-form lookup names: each chunk hash fans out to
 * world_size keys, chunk-major (key c*world_size + r is chunk c, rank slot
 * r), with kv_rank = ws<<24 | r<<16 | ws<<8 | r and object_group_id 0. This
 * is the ipc expansion of key.h with one object group and every worker
 * (worker_id -1), so ranks come from kvidx_ipc_rank.
 *
 * model and salt are checked once (as kvidx_key_check_model/_salt do) and
 * every key points at them; they must outlive the keys. On entry *count is
 * the capacity of out; on success it becomes num_chunks*world_size.
 * Returns 0; KVIDX_EINVAL when world_size is not 1..255; KVIDX_EKEY for a
 * model or salt that breaks the key rules (*why names it when why is not
 * NULL); KVIDX_ETOOMANYKEYS when the key count does not fit in a uint32_t;
 * KVIDX_ENOBUFS when out is too small, with *count set to the number
 * needed (out may be NULL then). */
int kvidx_token_hash_keys(const uint8_t (*hashes)[KVIDX_TOKEN_HASH_LEN], size_t num_chunks,
                          uint32_t world_size, const char *model, size_t model_len,
                          const char *salt, size_t salt_len, kvidx_key_t *out, size_t *count,
                          kvidx_reason_t *why);

#endif
