/*
 * BLAKE3, the plain (unkeyed) hash mode with extendable output.
 *
 * A kvidx_blake3_t is an incremental hasher that lives wherever the caller
 * puts it (stack, struct member): it holds one 64-byte block, the running
 * chaining value of the current 1024-byte chunk and a stack of at most
 * KVIDX_BLAKE3_STACK_MAX chaining values of finished subtrees, so nothing is
 * ever allocated and no call can fail. The output is byte-for-byte the one of
 * the BLAKE3 specification (and of the `b3sum` tool): the first 32 bytes are
 * the default hash, and any longer output extends it (a shorter output is a
 * prefix of a longer one).
 */
#ifndef KVIDX_BLAKE3_H
#define KVIDX_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_BLAKE3_OUT_LEN   32   /* bytes of the default hash */
#define KVIDX_BLAKE3_BLOCK_LEN 64   /* bytes of one compression input */
#define KVIDX_BLAKE3_CHUNK_LEN 1024 /* bytes of one leaf of the tree */
/* A BLAKE3 input holds fewer than 2^64 bytes, so fewer than 2^54 chunks,
 * and the stack of subtree chaining values never holds more than 54. */
#define KVIDX_BLAKE3_STACK_MAX 54

typedef struct kvidx_blake3 {
    uint32_t cv[8];                            /* chaining value of the current chunk so far */
    uint64_t chunk_counter;                    /* index of the current chunk in the input */
    uint8_t block[KVIDX_BLAKE3_BLOCK_LEN];     /* input not compressed yet */
    uint8_t block_len;                         /* bytes in block, 0..64 */
    uint8_t blocks_done;                       /* blocks of the current chunk compressed, 0..15 */
    uint8_t stack_len;                         /* entries in stack */
    uint32_t stack[KVIDX_BLAKE3_STACK_MAX][8]; /* left subtrees, oldest first */
} kvidx_blake3_t;

/* Starts a hash of the empty input. */
void kvidx_blake3_init(kvidx_blake3_t *h);

/* Appends len bytes at data (data may be NULL when len is 0). */
void kvidx_blake3_update(kvidx_blake3_t *h, const void *data, size_t len);

/* Writes out_len bytes of output for everything appended so far (out may be
 * NULL when out_len is 0). The hasher is not changed: more input may be
 * appended afterwards, and final may be called again. out_len 32 gives the
 * default hash; any other length gives the extendable output. */
void kvidx_blake3_final(const kvidx_blake3_t *h, uint8_t *out, size_t out_len);

/* One-shot: the 32-byte hash of len bytes at data. */
void kvidx_blake3(const void *data, size_t len, uint8_t out[KVIDX_BLAKE3_OUT_LEN]);

#endif
