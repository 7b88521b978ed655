/*
 * BLAKE3 in its plain hash mode with extendable output, written from the
 * BLAKE3 specification; portable C11, one block at a time.
 *
 * The input is cut into 1024-byte chunks and each chunk into 64-byte blocks.
 * A chunk's blocks are compressed in a chain that starts from the IV, all
 * with the chunk's index as counter; the first block is flagged CHUNK_START
 * and the last CHUNK_END. The chunk's chaining value (CV) is a leaf of a
 * binary tree whose inner nodes compress (left CV || right CV) flagged
 * PARENT, and whose left subtrees are as large (complete) as possible. The
 * stack keeps the CVs of the finished left subtrees: when chunk number t
 * (counting from 1) is finished, its CV is merged with the stack top as many
 * times as t has trailing zero bits, so the stack holds one entry per set bit
 * of t. The last node of the tree (the last chunk's last block when there is
 * one chunk, else the root parent) is compressed once more per 64 bytes of
 * output, flagged ROOT, with the output block number as counter.
 *
 * Invariants: a block is compressed only once more input has arrived after
 * it, and a chunk is finished only then too, because the last block and the
 * last chunk must be kept for the root. So after any non-empty update
 * block_len is 1..64, blocks_done is 0..15, and a chunk on the stack is never
 * the last one of the input.
 */
#include "kvidx/blake3.h"

#include <string.h>

enum {
    CHUNK_START = 1u << 0,
    CHUNK_END = 1u << 1,
    PARENT = 1u << 2,
    ROOT = 1u << 3,
};

static const uint32_t IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                               0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

/* Word i of the next round's message is word PERMUTATION[i] of this round's. */
static const uint8_t PERMUTATION[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};

static inline uint32_t rotr32(uint32_t x, unsigned n)
{
    return x >> n | x << (32 - n);
}

/* Words are little-endian; the shifts compile to one load on such hosts. */
static inline uint32_t load32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void store32(uint8_t *p, uint32_t w)
{
    p[0] = (uint8_t)w;
    p[1] = (uint8_t)(w >> 8);
    p[2] = (uint8_t)(w >> 16);
    p[3] = (uint8_t)(w >> 24);
}

static void load_block(const uint8_t *p, uint32_t m[16])
{
    for (int i = 0; i < 16; i++)
        m[i] = load32(p + 4 * i);
}

/* The quarter-round mixing function G on state words a, b, c, d. */
static inline void mix(uint32_t s[16], int a, int b, int c, int d, uint32_t x, uint32_t y)
{
    s[a] = s[a] + s[b] + x;
    s[d] = rotr32(s[d] ^ s[a], 16);
    s[c] = s[c] + s[d];
    s[b] = rotr32(s[b] ^ s[c], 12);
    s[a] = s[a] + s[b] + y;
    s[d] = rotr32(s[d] ^ s[a], 8);
    s[c] = s[c] + s[d];
    s[b] = rotr32(s[b] ^ s[c], 7);
}

static void one_round(uint32_t s[16], const uint32_t m[16])
{
    /* The columns of the 4x4 state, then its diagonals. */
    mix(s, 0, 4, 8, 12, m[0], m[1]);
    mix(s, 1, 5, 9, 13, m[2], m[3]);
    mix(s, 2, 6, 10, 14, m[4], m[5]);
    mix(s, 3, 7, 11, 15, m[6], m[7]);
    mix(s, 0, 5, 10, 15, m[8], m[9]);
    mix(s, 1, 6, 11, 12, m[10], m[11]);
    mix(s, 2, 7, 8, 13, m[12], m[13]);
    mix(s, 3, 4, 9, 14, m[14], m[15]);
}

/* The seven rounds of the compression function on state s, which the caller
 * set up as (cv, IV[0..3], counter low, counter high, block_len, flags). */
static void rounds(uint32_t s[16], const uint32_t block[16])
{
    uint32_t m[16], next[16];
    memcpy(m, block, sizeof(m));
    for (int r = 0; r < 7; r++) {
        one_round(s, m);
        if (r == 6)
            break;
        for (int i = 0; i < 16; i++)
            next[i] = m[PERMUTATION[i]];
        memcpy(m, next, sizeof(m));
    }
}

static void setup(uint32_t s[16], const uint32_t cv[8], uint64_t counter, uint32_t block_len,
                  uint32_t flags)
{
    memcpy(s, cv, 8 * sizeof(uint32_t));
    memcpy(s + 8, IV, 4 * sizeof(uint32_t));
    s[12] = (uint32_t)counter;
    s[13] = (uint32_t)(counter >> 32);
    s[14] = block_len;
    s[15] = flags;
}

/* Compresses one block into cv, replacing it by the new chaining value. */
static void compress_cv(uint32_t cv[8], const uint32_t block[16], uint64_t counter,
                        uint32_t block_len, uint32_t flags)
{
    uint32_t s[16];
    setup(s, cv, counter, block_len, flags);
    rounds(s, block);
    for (int i = 0; i < 8; i++)
        cv[i] = s[i] ^ s[i + 8];
}

/* The full 16-word output of one compression (used for the root). */
static void compress_out(const uint32_t cv[8], const uint32_t block[16], uint64_t counter,
                         uint32_t block_len, uint32_t flags, uint32_t out[16])
{
    uint32_t s[16];
    setup(s, cv, counter, block_len, flags);
    rounds(s, block);
    for (int i = 0; i < 8; i++) {
        out[i] = s[i] ^ s[i + 8];
        out[i + 8] = s[i + 8] ^ cv[i];
    }
}

/* The block of a parent node: its left child's CV, then its right child's. */
static void parent_block(const uint32_t left[8], const uint32_t right[8], uint32_t m[16])
{
    memcpy(m, left, 8 * sizeof(uint32_t));
    memcpy(m + 8, right, 8 * sizeof(uint32_t));
}

/* Moves the finished current chunk's CV onto the stack, merging finished
 * pairs of equal subtrees, and starts the next chunk. */
static void finish_chunk(kvidx_blake3_t *h)
{
    uint32_t cv[8], m[16];
    memcpy(cv, h->cv, sizeof(cv));
    for (uint64_t done = h->chunk_counter + 1; (done & 1) == 0; done >>= 1) {
        h->stack_len--;
        parent_block(h->stack[h->stack_len], cv, m);
        memcpy(cv, IV, sizeof(cv));
        compress_cv(cv, m, 0, KVIDX_BLAKE3_BLOCK_LEN, PARENT);
    }
    memcpy(h->stack[h->stack_len++], cv, sizeof(cv));
    memcpy(h->cv, IV, sizeof(h->cv));
    h->chunk_counter++;
    h->blocks_done = 0;
}

/* Compresses one full block of the current chunk, known not to be the last
 * block of the input; the chunk's 16th block also finishes the chunk. */
static void absorb_block(kvidx_blake3_t *h, const uint8_t *p)
{
    uint32_t m[16];
    load_block(p, m);
    uint32_t flags = h->blocks_done == 0 ? CHUNK_START : 0;
    if (h->blocks_done == KVIDX_BLAKE3_CHUNK_LEN / KVIDX_BLAKE3_BLOCK_LEN - 1)
        flags |= CHUNK_END;
    compress_cv(h->cv, m, h->chunk_counter, KVIDX_BLAKE3_BLOCK_LEN, flags);
    if (++h->blocks_done == KVIDX_BLAKE3_CHUNK_LEN / KVIDX_BLAKE3_BLOCK_LEN)
        finish_chunk(h);
}

void kvidx_blake3_init(kvidx_blake3_t *h)
{
    memcpy(h->cv, IV, sizeof(h->cv));
    h->chunk_counter = 0;
    h->block_len = 0;
    h->blocks_done = 0;
    h->stack_len = 0;
}

void kvidx_blake3_update(kvidx_blake3_t *h, const void *data, size_t len)
{
    const uint8_t *p = data;
    if (len == 0)
        return;
    if (h->block_len > 0) {
        size_t take = KVIDX_BLAKE3_BLOCK_LEN - h->block_len;
        if (take > len)
            take = len;
        memcpy(h->block + h->block_len, p, take);
        h->block_len = (uint8_t)(h->block_len + take);
        p += take;
        len -= take;
        if (len == 0)
            return; /* the block may still be the input's last: keep it */
        absorb_block(h, h->block);
        h->block_len = 0;
    }
    /* Whole blocks straight from the input, keeping back the one that may be
     * the last (1..64 bytes always stay buffered). */
    while (len > KVIDX_BLAKE3_BLOCK_LEN) {
        absorb_block(h, p);
        p += KVIDX_BLAKE3_BLOCK_LEN;
        len -= KVIDX_BLAKE3_BLOCK_LEN;
    }
    memcpy(h->block, p, len);
    h->block_len = (uint8_t)len;
}

void kvidx_blake3_final(const kvidx_blake3_t *h, uint8_t *out, size_t out_len)
{
    /* The node that will be the root, first the current chunk's last block
     * (zero-padded; the empty input is one empty block), then each parent
     * above it. It is described by the inputs of its compression. */
    uint8_t last[KVIDX_BLAKE3_BLOCK_LEN] = {0};
    memcpy(last, h->block, h->block_len);
    uint32_t cv[8], m[16];
    memcpy(cv, h->cv, sizeof(cv));
    load_block(last, m);
    uint64_t counter = h->chunk_counter;
    uint32_t block_len = h->block_len;
    uint32_t flags = CHUNK_END | (h->blocks_done == 0 ? CHUNK_START : 0);

    for (size_t i = h->stack_len; i-- > 0;) {
        compress_cv(cv, m, counter, block_len, flags); /* the right child's CV */
        parent_block(h->stack[i], cv, m);
        memcpy(cv, IV, sizeof(cv));
        counter = 0;
        block_len = KVIDX_BLAKE3_BLOCK_LEN;
        flags = PARENT;
    }

    uint32_t words[16];
    uint8_t bytes[KVIDX_BLAKE3_BLOCK_LEN];
    for (uint64_t block = 0; out_len > 0; block++) {
        compress_out(cv, m, block, block_len, flags | ROOT, words);
        for (int i = 0; i < 16; i++)
            store32(bytes + 4 * i, words[i]);
        size_t n = out_len < sizeof(bytes) ? out_len : sizeof(bytes);
        memcpy(out, bytes, n);
        out += n;
        out_len -= n;
    }
}

void kvidx_blake3(const void *data, size_t len, uint8_t out[KVIDX_BLAKE3_OUT_LEN])
{
    kvidx_blake3_t h;
    kvidx_blake3_init(&h);
    kvidx_blake3_update(&h, data, len);
    kvidx_blake3_final(&h, out, KVIDX_BLAKE3_OUT_LEN);
}
