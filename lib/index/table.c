/*
 * The exact-lookup hash table and the index's keyed hashes.
 *
 * The table is open addressing over refs with a tag byte per slot (the top
 * byte of the key's hash), linear probing and backward-shift deletion, so
 * that no tombstones exist: every live record is in exactly one slot, at or
 * after its home slot (cyclically) with no empty slot in between, the table
 * holds nothing else, ht_count is the number of occupied slots, and the
 * load stays at or below 0.9 (ix_ht_reserve grows the table before any
 * insert). The size is any number of slots up to 2^32 and the home slot a
 * multiply-high of the hash's low word (ht_home), so the table grows by
 * half rather than doubling: over a growth cycle it is on average a
 * quarter smaller than a doubling table at a 0.8 maximum load, and
 * the 5 bytes a slot costs are most of a small key's overhead.
 * The hash of a key is keyed SipHash-1-3, split in a chunk part and a rank
 * part (index_int.h, tk_hash); the probe and the single insert are inlined
 * there too.
 */
#include "index_int.h"

static uint64_t sip(const kvidx_index_t *idx, const uint8_t *in, size_t n)
{
    unsigned char out[crypto_shorthash_BYTES];
    crypto_shorthash(out, in, n, idx->hkey);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | out[i];
    return v;
}

uint64_t kvidx_index_key_hash64(const kvidx_index_t *idx, const kvidx_key_t *k)
{
    uint8_t buf[2 + KVIDX_SALT_MAX + 2 + KVIDX_MODEL_MAX + 4 + 2 + 1 + KVIDX_HASH_MAX];
    size_t sl = k->salt_len > KVIDX_SALT_MAX ? KVIDX_SALT_MAX : k->salt_len;
    size_t ml = k->model_len > KVIDX_MODEL_MAX ? KVIDX_MODEL_MAX : k->model_len;
    size_t hl = k->hash_len > KVIDX_HASH_MAX ? KVIDX_HASH_MAX : k->hash_len;
    size_t n = 0;
    st16(buf + n, (uint16_t)sl);
    n += 2;
    if (sl)
        memcpy(buf + n, k->salt, sl);
    n += sl;
    st16(buf + n, (uint16_t)ml);
    n += 2;
    if (ml)
        memcpy(buf + n, k->model, ml);
    n += ml;
    st32(buf + n, k->kv_rank);
    n += 4;
    st16(buf + n, k->group);
    n += 2;
    buf[n++] = (uint8_t)hl;
    memcpy(buf + n, k->hash, hl);
    n += hl;
    return sip(idx, buf, n);
}

/* Makes room for extra more refs (rehashing into a larger table). The
 * table grows by half each time, to keep the load at or below 0.9: a
 * probe run at that load is a few slots, which the tag bytes let a lookup
 * pass without reading records. */
int ix_ht_reserve(kvidx_index_t *idx, size_t extra)
{
    size_t want = idx->ht_count + extra;
    size_t cap = idx->ht_cap ? idx->ht_cap : 1024;
    while (want > cap / 10 * 9) {
        if ((uint64_t)cap >= HT_CAP_MAX)
            return KVIDX_ECAPACITY;
        if (cap > SIZE_MAX / 8)
            return KVIDX_ENOMEM;
        cap += cap / 2;
        if ((uint64_t)cap > HT_CAP_MAX)
            cap = (size_t)HT_CAP_MAX;
    }
    if (cap == idx->ht_cap)
        return 0;
    /* Refs and tags are one block, the tags after the refs: a table of
     * more than 32 MiB is then always mapped on its own (glibc's largest
     * mmap threshold) and given back whole when it is replaced, instead of
     * leaving a hole in the heap. */
    uint32_t *t = kvidx_malloc_large(cap * (sizeof(*t) + 1));
    if (!t)
        return KVIDX_ENOMEM;
    uint8_t *tg = (uint8_t *)(t + cap);
    memset(t, 0xff, cap * sizeof(*t));
    memset(tg, 0, cap);
    uint32_t *old = idx->ht;
    size_t old_cap = idx->ht_cap;
    idx->ht = t;
    idx->ht_tag = tg;
    idx->ht_cap = cap;
    /* The old slots are taken in windows of W refs whose records are
     * prefetched before their hashes are computed: the record reads are
     * what a rehash waits for, and a window lets their misses overlap. */
    enum { W = 32 };
    uint32_t win[W];
    size_t nwin = 0;
    for (size_t i = 0; i <= old_cap; i++) {
        if (i < old_cap && old[i] != KVIDX_REF_NONE) {
            win[nwin++] = old[i];
            PREFETCH(rec_at(idx, old[i]));
        }
        if (nwin < W && i < old_cap)
            continue;
        for (size_t k = 0; k < nwin; k++) {
            uint64_t h = ref_hash(idx, win[k]);
            size_t j = ht_home(idx, h);
            while (t[j] != KVIDX_REF_NONE)
                j = ht_next(idx, j);
            t[j] = win[k];
            tg[j] = h_tag(h);
        }
        nwin = 0;
    }
    kvidx_free(old);
    return 0;
}

/* Removes a ref (its record must still be intact), shifting the rest of the
 * probe run back so that lookups never need tombstones. */
void ix_ht_remove(kvidx_index_t *idx, kvidx_ref_t ref)
{
    size_t i = ht_home(idx, ref_hash(idx, ref));
    while (idx->ht[i] != ref)
        i = ht_next(idx, i);
    size_t j = i;
    for (;;) {
        j = ht_next(idx, j);
        uint32_t r = idx->ht[j];
        if (r == KVIDX_REF_NONE)
            break;
        size_t home = ht_home(idx, ref_hash(idx, r));
        /* r may move to i only if its home is not in (i, j] cyclically. */
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            idx->ht[i] = r;
            idx->ht_tag[i] = idx->ht_tag[j];
            i = j;
        }
    }
    idx->ht[i] = KVIDX_REF_NONE;
    idx->ht_count--;
}

/* Inserts n refs known to be absent, each given as the low word of its
 * hash << 32 | ref with its tag in ptag, in slot order (a counting sort on
 * the hash word's top bits into tmp, ttag; the home slot grows with that
 * word): the table is then swept once instead of probed at random.
 * ix_ht_reserve must have made room. */
void ix_ht_insert_sorted(kvidx_index_t *idx, const uint64_t *pend, const uint8_t *ptag, size_t n,
                         uint64_t *tmp, uint8_t *ttag)
{
    enum { BITS = 12 };
    uint32_t count[(1u << BITS) + 1];
    const unsigned shift = 64 - BITS;
    memset(count, 0, sizeof(count));
    for (size_t i = 0; i < n; i++)
        count[(pend[i] >> shift) + 1]++;
    for (uint32_t b = 1; b <= (1u << BITS); b++)
        count[b] += count[b - 1];
    for (size_t i = 0; i < n; i++) {
        uint32_t at = count[pend[i] >> shift]++;
        tmp[at] = pend[i];
        ttag[at] = ptag[i];
    }
    for (size_t i = 0; i < n; i++) {
        size_t j = ht_home(idx, tmp[i] >> 32);
        while (idx->ht[j] != KVIDX_REF_NONE)
            j = ht_next(idx, j);
        idx->ht[j] = (uint32_t)tmp[i];
        idx->ht_tag[j] = ttag[i];
    }
    idx->ht_count += n;
}
