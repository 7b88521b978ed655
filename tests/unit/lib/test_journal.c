/*
 * The journal format (kvidx/journal.h): CRC32C against known values, record
 * round trips, the reader on a torn tail cut at every byte offset of the
 * last record (it must return every record before it and stop exactly at
 * its first byte), single-bit corruption anywhere, the BEGIN/COMMIT frame
 * of a request (complete, torn at every offset, nested), the header
 * versions read, and the index's durable-change hook that feeds the
 * journal.
 */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvidx_key_t mk(const char *model, const char *salt, uint32_t rank, uint8_t h)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)strlen(model);
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.kv_rank = rank;
    k.group = (uint16_t)(rank & 7);
    k.hash_len = 32;
    memset(k.hash, h, 32);
    k.hash[0] = (uint8_t)rank;
    return k;
}

Test(crc32c, known_values)
{
    cr_assert_eq(kvidx_crc32c(0, "123456789", 9), 0xe3069283u);
    cr_assert_eq(kvidx_crc32c(0, "", 0), 0u);
    uint8_t zeros[32] = {0};
    cr_assert_eq(kvidx_crc32c(0, zeros, 32), 0x8a9136aau);
    /* Incremental equals one shot, at every split. */
    const char *s = "The quick brown fox jumps over the lazy dog, twice over.";
    size_t n = strlen(s);
    uint32_t whole = kvidx_crc32c(0, s, n);
    for (size_t i = 0; i <= n; i++)
        cr_assert_eq(kvidx_crc32c(kvidx_crc32c(0, s, i), s + i, n - i), whole);
}

Test(journal, header_round_trip)
{
    uint8_t h[KVIDX_JOURNAL_HEADER_LEN];
    uint64_t g = 0;
    kvidx_journal_header_encode(0x123456789abcull, h);
    cr_assert_eq(kvidx_journal_header_decode(h, sizeof(h), &g), 0);
    cr_assert_eq(g, 0x123456789abcull);
    cr_assert_eq(kvidx_journal_header_decode(h, sizeof(h) - 1, &g), KVIDX_EINVAL);
    for (size_t i = 0; i < sizeof(h); i++) {
        h[i] ^= 0x10;
        cr_assert_eq(kvidx_journal_header_decode(h, sizeof(h), &g), KVIDX_EINVAL, "byte %zu", i);
        h[i] ^= 0x10;
    }
}

Test(journal, header_versions)
{
    /* Version 3 is written; version 2 (no KEYS records) and version 1 (no
     * request frames either) headers are still read; others are refused. */
    uint8_t h[KVIDX_JOURNAL_HEADER_LEN];
    uint64_t g = 0;
    kvidx_journal_header_encode(7, h);
    cr_assert_eq(h[8], 3);
    for (uint32_t v = 0; v < 5; v++) {
        h[8] = (uint8_t)v;
        uint32_t crc = kvidx_crc32c(0, h, 24);
        memcpy(h + 24, &crc, 4); /* little-endian host */
        int want = (v >= 1 && v <= 3) ? 0 : KVIDX_EINVAL;
        cr_assert_eq(kvidx_journal_header_decode(h, sizeof(h), &g), want, "version %u", v);
    }
}

static size_t put_marker(uint8_t *buf, size_t len, kvidx_jrec_type_t t)
{
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = t;
    size_t w = 0;
    cr_assert_eq(kvidx_jrec_size(&r), KVIDX_JREC_HDR_LEN + 1);
    cr_assert_eq(kvidx_jrec_encode(&r, buf + len, 64, &w), 0);
    return len + w;
}

static size_t put_key(uint8_t *buf, size_t len, uint8_t h)
{
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_KEY;
    r.key = mk("m", "", h, h);
    r.tiers = KVIDX_STATE_L2;
    r.size_bytes = 10;
    size_t w = 0;
    cr_assert_eq(kvidx_jrec_encode(&r, buf + len, 256, &w), 0);
    return len + w;
}

Test(journal, request_frames)
{
    uint8_t buf[4096];
    size_t len = put_marker(buf, 0, KVIDX_JREC_BEGIN);
    size_t first = len;
    for (uint8_t i = 0; i < 3; i++)
        len = put_key(buf, len, i);
    len = put_marker(buf, len, KVIDX_JREC_COMMIT);
    size_t whole = len;
    len = put_key(buf, len, 9); /* after the group */

    /* The markers read back as records of their own type. */
    kvidx_jrec_t rec;
    size_t off = 0;
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), 1);
    cr_assert_eq(rec.type, KVIDX_JREC_BEGIN);
    cr_assert_eq(off, first);

    size_t end = 0;
    cr_assert_eq(kvidx_journal_group_end(buf, len, first, &end), 1);
    cr_assert_eq(end, whole);
    /* Cut anywhere before the COMMIT is whole: the group is incomplete. */
    for (size_t cut = first; cut < whole; cut++)
        cr_assert_eq(kvidx_journal_group_end(buf, cut, first, &end), 0, "cut at %zu", cut);
    cr_assert_eq(kvidx_journal_group_end(buf, whole, first, &end), 1);
    /* A corrupt record inside makes it incomplete too. */
    buf[first + KVIDX_JREC_HDR_LEN + 3] ^= 1;
    cr_assert_eq(kvidx_journal_group_end(buf, len, first, &end), 0);
    buf[first + KVIDX_JREC_HDR_LEN + 3] ^= 1;

    /* A second BEGIN before the COMMIT: the first group is incomplete ... */
    uint8_t nest[4096];
    size_t n = put_marker(nest, 0, KVIDX_JREC_BEGIN);
    size_t in = n;
    n = put_key(nest, n, 1);
    size_t second = n;
    n = put_marker(nest, n, KVIDX_JREC_BEGIN);
    n = put_key(nest, n, 2);
    n = put_marker(nest, n, KVIDX_JREC_COMMIT);
    /* ... reported with where the next BEGIN starts, which is whole. */
    cr_assert_eq(kvidx_journal_group_end(nest, n, in, &end), 2);
    cr_assert_eq(end, second);
    cr_assert_eq(kvidx_journal_group_end(nest, n, second + KVIDX_JREC_HDR_LEN + 1, &end), 1);
    cr_assert_eq(end, n);

    /* Markers carry no more than their type byte. */
    uint8_t two[KVIDX_JREC_HDR_LEN + 2] = {2, 0, 0, 0, 0, 0, 0, 0, KVIDX_JREC_COMMIT, 0};
    uint32_t plen = 2, crc = kvidx_crc32c(kvidx_crc32c(0, &plen, 4), two + 8, 2);
    memcpy(two + 4, &crc, 4);
    off = 0;
    cr_assert_eq(kvidx_journal_next(two, sizeof(two), &off, &rec), KVIDX_EINVAL);
}

/* Builds a journal body of n varied records; offsets[i] = start of i. */
static size_t build(uint8_t *buf, size_t cap, size_t n, size_t *offsets)
{
    size_t len = 0;
    static const char blob[] = "{\"model_name\":\"m\",\"world_size\":1}";
    for (size_t i = 0; i < n; i++) {
        kvidx_jrec_t r;
        memset(&r, 0, sizeof(r));
        switch (i % 4) {
        case 0:
        case 1:
            r.type = KVIDX_JREC_KEY;
            r.key = mk(i % 2 ? "model/x" : "m", i % 3 ? "" : "salt", (uint32_t)i, (uint8_t)i);
            r.tiers = (uint8_t)(i % 4 == 0 ? KVIDX_STATE_L2 : KVIDX_STATE_L1 | KVIDX_STATE_L2);
            r.size_bytes = 1000 + i;
            break;
        case 2:
            r.type = KVIDX_JREC_KEY;
            r.key = mk("m", "", (uint32_t)i, 1);
            break; /* gone */
        default:
            r.type = i % 8 == 3 ? KVIDX_JREC_LAYOUT_PUT : KVIDX_JREC_LAYOUT_DEL;
            r.key.model = "m";
            r.key.model_len = 1;
            r.world_size = 2;
            if (r.type == KVIDX_JREC_LAYOUT_PUT) {
                r.blob = (const uint8_t *)blob;
                r.blob_len = sizeof(blob) - 1;
            }
        }
        size_t w = 0;
        offsets[i] = len;
        cr_assert_eq(kvidx_jrec_size(&r) <= cap - len, 1);
        cr_assert_eq(kvidx_jrec_encode(&r, buf + len, cap - len, &w), 0);
        cr_assert_eq(w, kvidx_jrec_size(&r));
        len += w;
    }
    offsets[n] = len;
    return len;
}

/* Reads buf[0..len) and returns the number of records and the stop offset. */
static size_t read_all(const uint8_t *buf, size_t len, size_t *stop, int *rc_out)
{
    size_t off = 0, n = 0;
    kvidx_jrec_t rec;
    int rc;
    while ((rc = kvidx_journal_next(buf, len, &off, &rec)) == 1)
        n++;
    *stop = off;
    *rc_out = rc;
    return n;
}

Test(journal, round_trip_fields)
{
    uint8_t buf[8192];
    size_t offs[33];
    size_t len = build(buf, sizeof(buf), 32, offs);
    size_t off = 0;
    kvidx_jrec_t rec;
    for (size_t i = 0; i < 32; i++) {
        cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), 1);
        cr_assert_eq(off, offs[i + 1]);
        if (i % 4 == 0 || i % 4 == 1) {
            kvidx_key_t k =
                mk(i % 2 ? "model/x" : "m", i % 3 ? "" : "salt", (uint32_t)i, (uint8_t)i);
            cr_assert_eq(rec.type, KVIDX_JREC_KEY);
            cr_assert(kvidx_key_equal(&rec.key, &k));
            cr_assert_eq(rec.size_bytes, 1000 + i);
        } else if (i % 4 == 2) {
            cr_assert_eq(rec.tiers, 0);
            cr_assert_eq(rec.size_bytes, 0);
        } else if (i % 8 == 3) {
            cr_assert_eq(rec.type, KVIDX_JREC_LAYOUT_PUT);
            cr_assert_eq(rec.world_size, 2);
            cr_assert(rec.blob_len > 10);
        } else {
            cr_assert_eq(rec.type, KVIDX_JREC_LAYOUT_DEL);
        }
    }
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), 0);
}

Test(journal, torn_tail_at_every_offset_of_the_last_record)
{
    uint8_t buf[8192];
    size_t offs[17];
    for (size_t nrec = 1; nrec <= 16; nrec++) {
        size_t len = build(buf, sizeof(buf), nrec, offs);
        size_t last = offs[nrec - 1];
        for (size_t cut = last; cut < len; cut++) {
            size_t stop;
            int rc;
            size_t got = read_all(buf, cut, &stop, &rc);
            if (cut == last) {
                cr_assert_eq(rc, 0);
            } else {
                cr_assert_eq(rc, KVIDX_EINVAL, "cut %zu", cut);
            }
            cr_assert_eq(got, nrec - 1, "cut %zu of %zu", cut, len);
            cr_assert_eq(stop, last, "cut %zu", cut);
        }
        size_t stop;
        int rc;
        cr_assert_eq(read_all(buf, len, &stop, &rc), nrec);
        cr_assert_eq(rc, 0);
        cr_assert_eq(stop, len);
    }
}

Test(journal, garbage_after_a_torn_record_is_not_read)
{
    /* A torn record followed by bytes of a later write (a crash that lost
     * a page in the middle): the reader stops at the torn record. */
    uint8_t buf[8192];
    size_t offs[9];
    size_t len = build(buf, sizeof(buf), 8, offs);
    memset(buf + offs[5] + 3, 0, offs[6] - offs[5] - 3);
    size_t stop;
    int rc;
    cr_assert_eq(read_all(buf, len, &stop, &rc), 5);
    cr_assert_eq(stop, offs[5]);
    cr_assert_eq(rc, KVIDX_EINVAL);
}

Test(journal, every_bit_flip_is_detected)
{
    uint8_t buf[4096];
    size_t offs[9];
    size_t len = build(buf, sizeof(buf), 8, offs);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            buf[i] ^= (uint8_t)(1u << bit);
            size_t stop;
            int rc;
            size_t rec = 0;
            while (rec < 8 && offs[rec + 1] <= i)
                rec++;
            size_t got = read_all(buf, len, &stop, &rc);
            cr_assert_eq(rc, KVIDX_EINVAL, "byte %zu bit %d", i, bit);
            cr_assert_eq(got, rec, "byte %zu bit %d", i, bit);
            cr_assert_eq(stop, offs[rec]);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    }
}

Test(journal, encode_rejects_bad_records)
{
    uint8_t buf[512];
    size_t len = 0;
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_KEY;
    r.key = mk("m", "", 1, 1);
    r.tiers = KVIDX_STATE_L2;
    r.size_bytes = 0; /* present with size 0 */
    cr_assert_eq(kvidx_jrec_encode(&r, buf, sizeof(buf), &len), KVIDX_EINVAL);
    r.size_bytes = ((uint64_t)1 << 40) + 1;
    cr_assert_eq(kvidx_jrec_encode(&r, buf, sizeof(buf), &len), KVIDX_EINVAL);
    r.size_bytes = 5;
    cr_assert_eq(kvidx_jrec_encode(&r, buf, 10, &len), KVIDX_ENOBUFS);
    cr_assert_eq(len, kvidx_jrec_size(&r));
    r.type = KVIDX_JREC_SKEY; /* snapshot-only */
    cr_assert_eq(kvidx_jrec_encode(&r, buf, sizeof(buf), &len), KVIDX_EINVAL);
}

/* ---- the index's durable-change hook ---- */

struct change {
    kvidx_key_t key;
    kvidx_durable_t before, after;
};

struct changes {
    struct change c[64];
    size_t n;
};

static void record_change(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *before,
                          const kvidx_durable_t *after)
{
    struct changes *cs = ctx;
    cr_assert(cs->n < 64);
    cs->c[cs->n].key = *key;
    cs->c[cs->n].key.model = "(copied)";
    cs->c[cs->n].before = *before;
    cs->c[cs->n].after = *after;
    cs->n++;
}

#define L1 KVIDX_DURABLE_L1
#define L2 KVIDX_DURABLE_L2

static void expect(const struct changes *cs, size_t i, uint32_t rank, uint64_t bs, unsigned bt,
                   uint64_t as, unsigned at)
{
    cr_assert(i < cs->n, "change %zu of %zu", i, cs->n);
    const struct change *c = &cs->c[i];
    cr_assert_eq(c->key.kv_rank, rank, "change %zu", i);
    cr_assert_eq(c->before.size_bytes, bs, "change %zu", i);
    cr_assert_eq(c->before.tiers, bt, "change %zu", i);
    cr_assert_eq(c->after.size_bytes, as, "change %zu", i);
    cr_assert_eq(c->after.tiers, at, "change %zu", i);
}

Test(index_change_hook, stores_deletes_evictions_loads_temporary)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    o.l1_capacity_bytes = 300;
    kvidx_index_t *idx;
    cr_assert_eq(kvidx_index_new(&o, &idx), 0);
    struct changes cs = {.n = 0};
    kvidx_index_set_change_cb(idx, record_change, &cs);

    kvidx_put_t items[2] = {{mk("m", "", 1, 1), 100}, {mk("m", "", 2, 1), 100}};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L2, items, 2, NULL), 0);
    cr_assert_eq(cs.n, 2);
    expect(&cs, 0, 1, 0, 0, 100, L2);
    expect(&cs, 1, 2, 0, 0, 100, L2);

    /* L1 re-put with a new size: before keeps the old size. */
    cs.n = 0;
    items[0].size_bytes = 150;
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, items, 1, NULL), 0);
    cr_assert_eq(cs.n, 1);
    expect(&cs, 0, 1, 100, L2, 150, L1 | L2);

    /* A new L1 key that evicts key 1 (capacity 300): the store, then the
     * eviction. */
    cs.n = 0;
    kvidx_put_t big = {mk("m", "", 3, 1), 200};
    cr_assert_eq(kvidx_index_put_batch(idx, KVIDX_TIER_L1, &big, 1, NULL), 0);
    cr_assert_eq(cs.n, 2);
    expect(&cs, 0, 3, 0, 0, 200, L1);
    expect(&cs, 1, 1, 150, L1 | L2, 150, L2);

    /* Delete: key 3 is gone. */
    cs.n = 0;
    kvidx_del_outcome_t out;
    cr_assert_eq(kvidx_index_delete(idx, &big.key, KVIDX_TIER_ALL, 0, &out), 0);
    cr_assert_eq(out, KVIDX_DEL_DELETED);
    expect(&cs, 0, 3, 200, L1, 0, 0);
    /* A delete that finds nothing reports nothing. */
    cs.n = 0;
    cr_assert_eq(kvidx_index_delete(idx, &big.key, KVIDX_TIER_ALL, 0, &out), 0);
    cr_assert_eq(cs.n, 0);

    /* A load: loading is not durable, ready is; a temporary copy is not. */
    kvidx_ref_t ref;
    uint64_t gen;
    cr_assert_eq(kvidx_index_find(idx, &items[1].key, &ref), 0);
    cr_assert_eq(kvidx_index_l1_reserve(idx, ref, 0, &gen), 0);
    cr_assert_eq(cs.n, 0);
    cr_assert_eq(kvidx_index_l1_load_done(idx, ref, gen, 1), 0);
    expect(&cs, 0, 2, 100, L2, 100, L1 | L2);
    cs.n = 0;
    cr_assert_eq(kvidx_index_set_temporary(idx, ref, 1), 0);
    expect(&cs, 0, 2, 100, L1 | L2, 100, L2);
    cs.n = 0;
    cr_assert_eq(kvidx_index_set_temporary(idx, ref, 1), 0); /* no change */
    cr_assert_eq(cs.n, 0);
    kvidx_index_free(idx);
}

/* ---- the bulk loader a restore uses ---- */

/* Every item is in idx with its size and its tiers. */
static void assert_loaded(const kvidx_index_t *idx, const kvidx_load_t *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvidx_ref_t r;
        kvidx_entry_info_t info;
        cr_assert_eq(kvidx_index_find(idx, &items[i].key, &r), 0, "key %zu", i);
        cr_assert_eq(kvidx_index_info(idx, r, &info), 0);
        cr_assert_eq(info.size_bytes, items[i].size_bytes);
        cr_assert_eq(info.l2, (items[i].tiers & KVIDX_DURABLE_L2) != 0);
        cr_assert_eq(info.l1_state,
                     items[i].tiers & KVIDX_DURABLE_L1 ? KVIDX_L1_READY : KVIDX_L1_NONE);
    }
}

Test(index_load, same_state_as_stores_and_refuses_duplicates)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    kvidx_index_t *a, *b;
    cr_assert_eq(kvidx_index_new(&o, &a), 0);
    cr_assert_eq(kvidx_index_new(&o, &b), 0);
    enum { N = 3000 };
    static kvidx_load_t items[N];
    static kvidx_put_t l1[N], l2[N];
    size_t n1 = 0, n2 = 0;
    for (size_t i = 0; i < N; i++) {
        /* Three namespaces, keys in order inside each. */
        items[i].key = mk(i < 1000 ? "a" : "b", i < 2000 ? "" : "s", (uint32_t)(i % 1000), 9);
        items[i].size_bytes = 10 + i;
        items[i].tiers = (unsigned)(1 + i % 3);
        if (items[i].tiers & KVIDX_DURABLE_L1)
            l1[n1++] = (kvidx_put_t){items[i].key, items[i].size_bytes};
        if (items[i].tiers & KVIDX_DURABLE_L2)
            l2[n2++] = (kvidx_put_t){items[i].key, items[i].size_bytes};
    }
    cr_assert_eq(kvidx_index_reserve(a, N), 0);
    cr_assert_eq(kvidx_index_load(a, items, 1500, NULL), 0);
    cr_assert_eq(kvidx_index_load(a, items + 1500, N - 1500, NULL), 0);
    cr_assert_eq(kvidx_index_put_batch(b, KVIDX_TIER_L2, l2, n2, NULL), 0);
    cr_assert_eq(kvidx_index_put_batch(b, KVIDX_TIER_L1, l1, n1, NULL), 0);
    kvidx_index_stats_t sa, sb;
    kvidx_index_stats(a, &sa);
    kvidx_index_stats(b, &sb);
    cr_assert_eq(sa.keys, N);
    cr_assert_eq(sa.keys, sb.keys);
    cr_assert_eq(sa.l1_keys, sb.l1_keys);
    cr_assert_eq(sa.l1_bytes, sb.l1_bytes);
    cr_assert_eq(sa.l2_keys, sb.l2_keys);
    cr_assert_eq(sa.l2_bytes, sb.l2_bytes);
    cr_assert_eq(sa.l1_evictable_bytes, sb.l1_evictable_bytes);
    assert_loaded(a, items, N);
    /* A key already present, or twice in one call: ECONFLICT at its index. */
    size_t bad = 0;
    cr_assert_eq(kvidx_index_load(a, items + 7, 1, &bad), KVIDX_ECONFLICT);
    cr_assert_eq(bad, 0);
    kvidx_load_t twice[2] = {items[0], items[0]};
    twice[0].key = twice[1].key = mk("c", "", 1, 1);
    cr_assert_eq(kvidx_index_load(a, twice, 2, &bad), KVIDX_ECONFLICT);
    cr_assert_eq(bad, 1);
    twice[0].tiers = 0;
    cr_assert_eq(kvidx_index_load(a, twice, 1, &bad), KVIDX_EINVAL);
    kvidx_index_free(a);
    kvidx_index_free(b);
}

static int load_cmp(const void *a, const void *b)
{
    return kvidx_key_cmp(&((const kvidx_load_t *)a)->key, &((const kvidx_load_t *)b)->key);
}

/* More keys than the loader defers table inserts for (65,536), in one
 * call, partly in key order (appended along the tree's right edge) and
 * partly shuffled (searched and inserted): every key is found, the tree
 * lists them in key order, deletes find their table slots, and a conflict
 * half-way through a batch leaves the keys before it findable. */
Test(index_load, large_batches_in_and_out_of_order)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.has_seed = 1;
    kvidx_index_t *a;
    cr_assert_eq(kvidx_index_new(&o, &a), 0);
    enum { N = 150000 };
    static kvidx_load_t items[N];
    for (size_t i = 0; i < N; i++) {
        kvidx_key_t k = mk(i % 3 ? "m" : "n", "", (uint32_t)(i * 2654435761u), 0);
        memcpy(k.hash + 4, &i, sizeof(i));
        items[i].key = k;
        items[i].size_bytes = 1 + i;
        items[i].tiers = KVIDX_DURABLE_L2;
    }
    /* Sorted, then the second half shuffled. */
    qsort(items, N, sizeof(items[0]), load_cmp);
    uint64_t s = 12345;
    for (size_t i = N - 1; i > N / 2; i--) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t j = N / 2 + (size_t)(s >> 33) % (i - N / 2 + 1);
        kvidx_load_t t = items[i];
        items[i] = items[j];
        items[j] = t;
    }
    cr_assert_eq(kvidx_index_load(a, items, N, NULL), 0);
    assert_loaded(a, items, N);
    /* Listed in key order. */
    static kvidx_load_t sorted[N];
    memcpy(sorted, items, sizeof(items));
    qsort(sorted, N, sizeof(sorted[0]), load_cmp);
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    static kvidx_ref_t refs[N];
    size_t count = 0, examined = 0;
    int more = 1;
    kvidx_key_buf_t resume;
    cr_assert_eq(kvidx_index_list(a, &f, NULL, N, 4 * N, refs, &count, &resume, &more, &examined),
                 0);
    cr_assert_eq(count, N);
    for (size_t i = 0; i < N; i++) {
        kvidx_key_t k;
        cr_assert_eq(kvidx_index_key(a, refs[i], &k), 0);
        cr_assert(kvidx_key_equal(&k, &sorted[i].key), "position %zu", i);
    }
    /* Every other key deleted: the rest are still found, those are not. */
    for (size_t i = 0; i < N; i += 2) {
        kvidx_del_outcome_t out;
        cr_assert_eq(kvidx_index_delete(a, &items[i].key, KVIDX_TIER_ALL, 0, &out), 0);
        cr_assert_eq(out, KVIDX_DEL_DELETED, "key %zu", i);
    }
    for (size_t i = 0; i < N; i++) {
        kvidx_ref_t r;
        cr_assert_eq(kvidx_index_find(a, &items[i].key, &r), i % 2 ? 0 : KVIDX_ENOTFOUND, "key %zu",
                     i);
    }
    /* Reload the deleted half with one key that is still there in the
     * middle: the keys before it are in, it and those after are not. */
    static kvidx_load_t again[N / 2];
    size_t na = 0;
    for (size_t i = 0; i < N; i += 2)
        again[na++] = items[i];
    again[na / 2] = items[1];
    size_t bad = 0;
    cr_assert_eq(kvidx_index_load(a, again, na, &bad), KVIDX_ECONFLICT);
    cr_assert_eq(bad, na / 2);
    for (size_t i = 0; i < na; i++) {
        kvidx_ref_t r;
        cr_assert_eq(kvidx_index_find(a, &again[i].key, &r), i <= na / 2 ? 0 : KVIDX_ENOTFOUND,
                     "again %zu", i);
    }
    kvidx_index_stats_t st;
    kvidx_index_stats(a, &st);
    cr_assert_eq(st.keys, N / 2 + na / 2);
    kvidx_index_free(a);
}
