/*
 * Token bindings of the fleet directory: the token ids (and offset) of a
 * chunk hash, as the last store entry that carried any reported them.
 *
 * A binding is one allocation, a 24-byte header and the tokens as uint32,
 * named by a binding id that every key of the chunk hash's ring carries;
 * its representative is one key of the ring (whose record holds the hash
 * bytes). It goes with the ring's last key. Bindings sit in an age list,
 * oldest first; a store that writes a binding (new content, or the same
 * content again) makes it the newest. With a cap, the oldest bindings are
 * dropped until token_bytes, the sum of the bindings' sizes, fits; content
 * larger than the whole cap is dropped at once instead (with the chunk's
 * older content). Each drop is counted. Blocks are allocated before a batch applies (ingest.c),
 * so setting a binding never allocates.
 */
#include "directory_int.h"

dbind_t *dr_bind_block(kvidx_directory_t *d, const uint32_t *tok, size_t n, int64_t offset)
{
    if (n > UINT32_MAX || n > (SIZE_MAX - sizeof(dbind_t)) / 4)
        return NULL;
    dbind_t *b = dr_alloc(d, bind_bytes((uint32_t)n));
    if (!b)
        return NULL;
    b->prev = b->next = b->rep = NONE;
    b->ntok = (uint32_t)n;
    b->offset = offset;
    memcpy(b->tok, tok, 4 * n);
    return b;
}

void dr_bind_block_free(kvidx_directory_t *d, dbind_t *b)
{
    if (b)
        dr_free(d, b, bind_bytes(b->ntok));
}

int dr_binds_reserve(kvidx_directory_t *d, size_t k)
{
    size_t avail = d->nbind_free + (d->binds_cap - d->binds_used);
    if (avail >= k)
        return 0;
    size_t need = d->binds_used + (k - d->nbind_free);
    if (need > NONE)
        return KVIDX_ENOMEM;
    size_t cap = d->binds_cap ? d->binds_cap * 2 : 8;
    while (cap < need)
        cap *= 2;
    dbind_t **nb = dr_alloc(d, cap * sizeof(dbind_t *));
    uint32_t *nf = dr_alloc(d, cap * sizeof(uint32_t));
    if (!nb || !nf) {
        dr_free(d, nb, cap * sizeof(dbind_t *));
        dr_free(d, nf, cap * sizeof(uint32_t));
        return KVIDX_ENOMEM;
    }
    if (d->binds_used)
        memcpy(nb, d->binds, d->binds_used * sizeof(dbind_t *));
    if (d->nbind_free)
        memcpy(nf, d->bind_free_list, d->nbind_free * sizeof(uint32_t));
    dr_free(d, d->binds, d->binds_cap * sizeof(dbind_t *));
    dr_free(d, d->bind_free_list, d->binds_cap * sizeof(uint32_t));
    d->binds = nb;
    d->bind_free_list = nf;
    d->binds_cap = cap;
    return 0;
}

static void age_unlink(kvidx_directory_t *d, uint32_t id)
{
    dbind_t *b = d->binds[id];
    if (b->prev != NONE)
        d->binds[b->prev]->next = b->next;
    else
        d->age_head = b->next;
    if (b->next != NONE)
        d->binds[b->next]->prev = b->prev;
    else
        d->age_tail = b->prev;
    b->prev = b->next = NONE;
}

static void age_append(kvidx_directory_t *d, uint32_t id)
{
    dbind_t *b = d->binds[id];
    b->prev = d->age_tail;
    b->next = NONE;
    if (d->age_tail != NONE)
        d->binds[d->age_tail]->next = id;
    else
        d->age_head = id;
    d->age_tail = id;
}

static void account(kvidx_directory_t *d, const dbind_t *b, int add)
{
    if (add) {
        d->nbinds++;
        d->bind_tokens += b->ntok;
        d->token_bytes += bind_bytes(b->ntok);
    } else {
        d->nbinds--;
        d->bind_tokens -= b->ntok;
        d->token_bytes -= bind_bytes(b->ntok);
    }
}

void dr_bind_set(kvidx_directory_t *d, uint32_t ref, dbind_t *blk)
{
    krec_t *r = K(d, ref);
    uint32_t id = r->bind;
    if (d->token_cap && bind_bytes(blk->ntok) > d->token_cap) {
        /* Content that cannot fit even alone is not kept, and does not
         * push every other binding out first; the older content of the
         * chunk is stale now, so it goes too. */
        if (id != NONE) {
            d->bind_dropped++;
            d->tok_dropped += d->binds[id]->ntok;
            dr_bind_drop(d, id);
        }
        d->bind_dropped++;
        d->tok_dropped += blk->ntok;
        dr_bind_block_free(d, blk);
        return;
    }
    if (id != NONE) {
        dbind_t *old = d->binds[id];
        age_unlink(d, id);
        if (old->ntok == blk->ntok && memcmp(old->tok, blk->tok, 4 * (size_t)blk->ntok) == 0) {
            old->offset = blk->offset;
            dr_bind_block_free(d, blk);
        } else {
            blk->rep = old->rep;
            account(d, old, 0);
            dr_bind_block_free(d, old);
            d->binds[id] = blk;
            account(d, blk, 1);
        }
        age_append(d, id);
    } else {
        id = d->nbind_free ? d->bind_free_list[--d->nbind_free] : d->binds_used++;
        blk->rep = ref;
        d->binds[id] = blk;
        account(d, blk, 1);
        age_append(d, id);
        uint32_t k = ref;
        do {
            K(d, k)->bind = id;
            k = K(d, k)->ring;
        } while (k != ref);
    }
    dr_bind_enforce_cap(d);
}

void dr_bind_drop(kvidx_directory_t *d, uint32_t id)
{
    dbind_t *b = d->binds[id];
    uint32_t k = b->rep;
    do {
        K(d, k)->bind = NONE;
        k = K(d, k)->ring;
    } while (k != b->rep);
    age_unlink(d, id);
    account(d, b, 0);
    dr_bind_block_free(d, b);
    d->binds[id] = NULL;
    d->bind_free_list[d->nbind_free++] = id;
}

void dr_bind_enforce_cap(kvidx_directory_t *d)
{
    if (!d->token_cap)
        return;
    while (d->token_bytes > d->token_cap && d->age_head != NONE) {
        d->bind_dropped++;
        d->tok_dropped += d->binds[d->age_head]->ntok;
        dr_bind_drop(d, d->age_head);
    }
}

int kvidx_directory_tokens(const kvidx_directory_t *d, const uint8_t *hash, size_t hash_len,
                           const uint32_t **tokens, size_t *num_tokens, int64_t *token_offset)
{
    uint32_t rep = dr_chunk_find(d, hash, hash_len);
    const dbind_t *b = rep == NONE || K(d, rep)->bind == NONE ? NULL : d->binds[K(d, rep)->bind];
    if (!b) {
        *tokens = NULL;
        *num_tokens = 0;
        if (token_offset)
            *token_offset = KVIDX_DIR_UNKNOWN_OFFSET;
        return 0;
    }
    *tokens = b->tok;
    *num_tokens = b->ntok;
    if (token_offset)
        *token_offset = b->offset;
    return 1;
}
