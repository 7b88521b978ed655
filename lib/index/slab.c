/*
 * Record slabs and the index's scratch buffer.
 *
 * A slab holds the records of one hash-length class in chunks of 4096
 * records carved from a few large blocks; a chunk never moves, so a ref
 * stays valid while its record lives. Free records form a list threaded
 * through their kv_rank field (SLOT_NONE ends it); slots below `used` are
 * either live or on that list. Taking and releasing records are inlined
 * in index_int.h; this file only grows slabs, which is the one step that
 * can fail, before any mutation starts.
 */
#include "index_int.h"

/* Grows an array of pointers to hold want entries. */
static int ptrs_reserve(uint8_t ***a, uint32_t *cap, uint32_t want)
{
    if (want <= *cap)
        return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < want)
        c *= 2;
    uint8_t **n = kvidx_realloc(*a, (size_t)c * sizeof(*n));
    if (!n)
        return KVIDX_ENOMEM;
    *a = n;
    *cap = c;
    return 0;
}

/* Makes sure k more records of class cls can be taken without allocating.
 * Chunks come in blocks that double with the slab (up to 64 chunks, 7-21
 * MiB), so a big index is a few dozen huge-page-backed blocks instead of
 * thousands of small mappings. */
int ix_slab_reserve(slab_t *s, uint64_t k)
{
    uint64_t room = (uint64_t)s->nchunks * CHUNK_RECS - s->used + s->nfree;
    if (room >= k)
        return 0;
    uint64_t need = (k - room + CHUNK_RECS - 1) / CHUNK_RECS;
    uint64_t limit = SLOT_MASK >> CHUNK_SHIFT;
    if ((uint64_t)s->nchunks + need > limit)
        return KVIDX_ECAPACITY; /* 2^29 - 1 keys of one hash-length class */
    uint64_t grow = s->nchunks < 64 ? s->nchunks : 64;
    if (grow < need || s->nchunks + grow > limit)
        grow = need;
    if (ptrs_reserve(&s->chunks, &s->chunks_cap, s->nchunks + (uint32_t)grow) ||
        ptrs_reserve(&s->blocks, &s->blocks_cap, s->nblocks + 1))
        return KVIDX_ENOMEM;
    size_t chunk_bytes = (size_t)CHUNK_RECS * s->rec_size;
    uint8_t *block = kvidx_malloc_large((size_t)grow * chunk_bytes);
    if (!block && grow > need) {
        grow = need;
        block = kvidx_malloc_large((size_t)grow * chunk_bytes);
    }
    if (!block)
        return KVIDX_ENOMEM;
    s->blocks[s->nblocks++] = block;
    for (uint64_t i = 0; i < grow; i++)
        s->chunks[s->nchunks++] = block + i * chunk_bytes;
    return 0;
}

/* The index's reusable scratch buffer, at least bytes long. */
int ix_scratch_get(kvidx_index_t *idx, size_t bytes, void **out)
{
    if (bytes > idx->scratch_cap) {
        void *p = kvidx_malloc(bytes);
        if (!p)
            return KVIDX_ENOMEM;
        kvidx_free(idx->scratch);
        idx->scratch = p;
        idx->scratch_cap = bytes;
    }
    *out = idx->scratch;
    return 0;
}
