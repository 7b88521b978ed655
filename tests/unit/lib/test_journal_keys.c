/*
 * KEYS journal records (kvidx/journal.h): the states of many keys of one
 * namespace in one record. Built one state at a time (begin, room, add,
 * close) and read back state for state; encoded again from what the
 * reader hands out to the same bytes; a payload filled to exactly
 * KVIDX_JREC_PAYLOAD_MAX and refused one state further; and the strict
 * reader: a count of 0, a count that says more or fewer states than the
 * payload holds, a state or a namespace out of range, a record cut short
 * or left open (no checksum), and every bit flip are refused as a corrupt
 * record, the reader left at its first byte. The journal version that
 * carries them is written, and the older ones still read.
 */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/journal.h"

#include <stdlib.h>
#include <string.h>

static kvidx_key_t mk(const char *model, const char *salt, uint32_t rank, uint8_t hl)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)strlen(model);
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.kv_rank = rank;
    k.group = (uint16_t)(rank * 7u);
    k.hash_len = hl;
    for (uint8_t i = 0; i < hl; i++)
        k.hash[i] = (uint8_t)(rank * 31u + i);
    return k;
}

/* The i-th state of the varied batches below: every tier combination (0:
 * gone), hash lengths 1..64, large ranks and sizes. */
static kvidx_jrec_t state(const char *model, const char *salt, uint32_t i)
{
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_KEY;
    r.key = mk(model, salt, i * 0x01000193u, (uint8_t)(1 + i % 64));
    r.tiers = (uint8_t)(i % 4);
    r.size_bytes = r.tiers ? (i % 5 == 0 ? (uint64_t)1 << 40 : 1 + (uint64_t)i * 4099) : 0;
    return r;
}

/* A present key's KEY record. */
static kvidx_jrec_t present(kvidx_key_t k, uint8_t tiers, uint64_t size)
{
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_KEY;
    r.key = k;
    r.tiers = tiers;
    r.size_bytes = size;
    return r;
}

/* Builds one closed KEYS record of n states at out: its framed length. */
static size_t build(uint8_t *out, size_t cap, const char *model, const char *salt, uint32_t n)
{
    kvidx_jrec_t r = state(model, salt, 0);
    size_t len = 0;
    cr_assert_eq(kvidx_jkeys_begin(&r, out, cap, &len), 0);
    cr_assert_eq(len, kvidx_jkeys_size(&r));
    for (uint32_t i = 1; i < n; i++) {
        r = state(model, salt, i);
        size_t room = kvidx_jkeys_room(out, &r);
        cr_assert_eq(room, KVIDX_JKEYS_STATE_FIXED + r.key.hash_len, "state %u", i);
        cr_assert(len + room <= cap);
        cr_assert_eq(kvidx_jkeys_add(out, &r), room);
        len += room;
    }
    kvidx_jkeys_close(out);
    return len;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes the length and a right checksum for the payload at rec + 8 of n
 * bytes: whatever the reader then refuses, it refuses for the payload. */
static void reframe(uint8_t *rec, size_t n)
{
    put32(rec, (uint32_t)n);
    put32(rec + 4, kvidx_crc32c(kvidx_crc32c(0, rec, 4), rec + KVIDX_JREC_HDR_LEN, n));
}

/* The reader refuses the record at buf[0..len) and stays at its start. */
static void refused(const uint8_t *buf, size_t len, const char *what)
{
    size_t off = 0;
    kvidx_jrec_t rec;
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), KVIDX_EINVAL, "%s", what);
    cr_assert_eq(off, 0, "%s", what);
}

static uint8_t *big(size_t n)
{
    uint8_t *b = malloc(n);
    cr_assert_not_null(b);
    return b;
}

Test(journal_keys, round_trip_state_for_state)
{
    size_t cap = 64 * 1024;
    uint8_t *buf = big(cap), *again = big(cap);
    const char *salts[] = {"", "tenant-7"};
    for (int s = 0; s < 2; s++) {
        for (uint32_t n = 1; n <= 300; n += n < 4 ? 1 : 37) {
            size_t len = build(buf, cap, "org/model-A", salts[s], n);
            size_t off = 0;
            kvidx_jrec_t rec;
            cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), 1, "n %u", n);
            cr_assert_eq(off, len);
            cr_assert_eq(rec.type, KVIDX_JREC_KEYS);
            cr_assert_eq(rec.count, n);
            cr_assert_eq(rec.key.model_len, strlen("org/model-A"));
            cr_assert_eq(memcmp(rec.key.model, "org/model-A", rec.key.model_len), 0);
            cr_assert_eq(rec.key.salt_len, strlen(salts[s]));
            cr_assert_eq(memcmp(rec.key.salt, salts[s], rec.key.salt_len), 0);
            size_t pos = 0;
            kvidx_jrec_t k;
            for (uint32_t i = 0; i < n; i++) {
                cr_assert_eq(kvidx_jkeys_next(&rec, &pos, &k), 1, "state %u", i);
                kvidx_jrec_t want = state("org/model-A", salts[s], i);
                cr_assert_eq(k.type, KVIDX_JREC_KEY);
                cr_assert(kvidx_key_equal(&k.key, &want.key), "state %u", i);
                cr_assert_eq(k.tiers, want.tiers);
                cr_assert_eq(k.size_bytes, want.size_bytes);
            }
            cr_assert_eq(kvidx_jkeys_next(&rec, &pos, &k), 0);
            cr_assert_eq(kvidx_jkeys_next(&rec, &pos, &k), 0);
            /* One encoding per record: what was read encodes to the same
             * bytes. */
            size_t elen = 0;
            cr_assert_eq(kvidx_jrec_size(&rec), len);
            cr_assert_eq(kvidx_jrec_encode(&rec, again, cap, &elen), 0);
            cr_assert_eq(elen, len);
            cr_assert_eq(memcmp(again, buf, len), 0);
        }
    }
    free(buf);
    free(again);
}

Test(journal_keys, a_batch_is_smaller_than_key_records)
{
    /* 1000 keys of one namespace, 32-byte hashes: one record instead of
     * 1000, the model name and the salt once. */
    size_t cap = 128 * 1024;
    uint8_t *buf = big(cap);
    kvidx_jrec_t r = present(mk("meta-llama/Llama-3.1-8B", "", 1, 32), KVIDX_STATE_L2, 2097152);
    size_t len = 0, keys = 1000 * kvidx_jrec_size(&r);
    cr_assert_eq(kvidx_jkeys_begin(&r, buf, cap, &len), 0);
    for (uint32_t i = 1; i < 1000; i++) {
        r.key.kv_rank = i;
        len += kvidx_jkeys_add(buf, &r);
    }
    kvidx_jkeys_close(buf);
    cr_assert_eq(len, KVIDX_JREC_HDR_LEN + KVIDX_JKEYS_FIXED + 23 + 1000 * (16 + 32));
    cr_assert(len * 10 < keys * 7, "%zu bytes vs %zu", len, keys);
    free(buf);
}

Test(journal_keys, room_is_refused_across_namespaces_and_for_bad_states)
{
    uint8_t buf[1024];
    size_t len = build(buf, sizeof(buf), "m", "s", 2);
    kvidx_jrec_t r = state("m", "s", 9);
    cr_assert_gt(kvidx_jkeys_room(buf, &r), 0);
    kvidx_jrec_t o = state("n", "s", 9); /* another model */
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o = state("mm", "s", 9);
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o = state("m", "", 9); /* another salt */
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o = state("m", "t", 9);
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o = r;
    o.type = KVIDX_JREC_LAYOUT_DEL;
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o = r;
    o.tiers = KVIDX_STATE_L2;
    o.size_bytes = 0; /* present with size 0 */
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o.size_bytes = ((uint64_t)1 << 40) + 1;
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    o = r;
    o.key.hash_len = 0;
    cr_assert_eq(kvidx_jkeys_room(buf, &o), 0);
    /* add writes nothing for what room refuses. */
    uint8_t copy[1024];
    memcpy(copy, buf, sizeof(buf));
    cr_assert_eq(kvidx_jkeys_add(buf, &o), 0);
    cr_assert_eq(memcmp(copy, buf, sizeof(buf)), 0);
    /* begin refuses what is not a KEY record it can encode. */
    size_t w = 0;
    cr_assert_eq(kvidx_jkeys_size(&o), 0);
    cr_assert_eq(kvidx_jkeys_begin(&o, buf, sizeof(buf), &w), KVIDX_EINVAL);
    cr_assert_eq(kvidx_jkeys_begin(&r, buf, 10, &w), KVIDX_ENOBUFS);
    (void)len;
}

Test(journal_keys, a_payload_of_exactly_the_maximum)
{
    /* Model "m", no salt: 8 bytes before the states; 21845 states of 48
     * bytes (32-byte hashes), 8 of them a byte longer, fill the payload to
     * exactly KVIDX_JREC_PAYLOAD_MAX. */
    size_t cap = KVIDX_JREC_HDR_LEN + KVIDX_JREC_PAYLOAD_MAX + 256;
    uint8_t *buf = big(cap), *again = big(cap);
    kvidx_jrec_t r = present(mk("m", "", 0, 33), KVIDX_STATE_L1, 7);
    size_t len = 0;
    cr_assert_eq(kvidx_jkeys_begin(&r, buf, cap, &len), 0);
    uint32_t n = 1;
    for (; n < 21845; n++) {
        r.key = mk("m", "", n, n < 8 ? 33 : 32);
        size_t room = kvidx_jkeys_room(buf, &r);
        cr_assert_gt(room, 0, "state %u", n);
        len += kvidx_jkeys_add(buf, &r);
    }
    cr_assert_eq(len, KVIDX_JREC_HDR_LEN + KVIDX_JREC_PAYLOAD_MAX);
    cr_assert_eq(get32(buf), KVIDX_JREC_PAYLOAD_MAX);
    /* Full: not one more state, not even the smallest. */
    r.key = mk("m", "", n, KVIDX_HASH_MIN);
    cr_assert_eq(kvidx_jkeys_room(buf, &r), 0);
    cr_assert_eq(kvidx_jkeys_add(buf, &r), 0);
    kvidx_jkeys_close(buf);
    size_t off = 0;
    kvidx_jrec_t rec;
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), 1);
    cr_assert_eq(rec.count, 21845);
    size_t elen = 0;
    cr_assert_eq(kvidx_jrec_encode(&rec, again, cap, &elen), 0);
    cr_assert_eq(elen, len);
    cr_assert_eq(memcmp(again, buf, len), 0);
    /* One byte short of the maximum: the state that would pass it by one
     * is refused, the one that ends exactly at it is taken. */
    len = 0;
    r.key = mk("m", "", 0, 32);
    cr_assert_eq(kvidx_jkeys_begin(&r, buf, cap, &len), 0);
    for (n = 1; n < 21844; n++) {
        r.key = mk("m", "", n, n < 8 ? 33 : 32);
        len += kvidx_jkeys_add(buf, &r);
    }
    size_t left = KVIDX_JREC_HDR_LEN + KVIDX_JREC_PAYLOAD_MAX - len;
    cr_assert_eq(left, 48 + 1);
    r.key = mk("m", "", n, 34);
    cr_assert_eq(kvidx_jkeys_room(buf, &r), 0);
    r.key = mk("m", "", n, 33);
    cr_assert_eq(kvidx_jkeys_room(buf, &r), left);
    free(buf);
    free(again);
}

Test(journal_keys, count_zero_is_refused)
{
    uint8_t buf[512];
    size_t len = build(buf, sizeof(buf), "m", "", 1);
    /* The one state's bytes are still there: the count says 0. */
    put32(buf + KVIDX_JREC_HDR_LEN + 3, 0);
    reframe(buf, len - KVIDX_JREC_HDR_LEN);
    refused(buf, len, "count 0, one state");
    /* No state at all, count 0. */
    size_t ns = KVIDX_JREC_HDR_LEN + KVIDX_JKEYS_FIXED + 1;
    reframe(buf, ns - KVIDX_JREC_HDR_LEN);
    refused(buf, ns, "count 0, no state");
    /* Nor is a record of no state encoded. */
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_KEYS;
    r.key.model = "m";
    r.key.model_len = 1;
    size_t w = 0;
    cr_assert_eq(kvidx_jrec_size(&r), 0);
    cr_assert_eq(kvidx_jrec_encode(&r, buf, sizeof(buf), &w), KVIDX_EINVAL);
}

Test(journal_keys, a_lying_count_is_refused)
{
    uint8_t buf[4096];
    size_t len = build(buf, sizeof(buf), "m", "s", 5);
    uint8_t *count = buf + KVIDX_JREC_HDR_LEN + 3;
    cr_assert_eq(get32(count), 5);
    const uint32_t lies[] = {4, 6, 1, 0xffffffffu, 0x80000005u};
    for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++) {
        put32(count, lies[i]);
        reframe(buf, len - KVIDX_JREC_HDR_LEN);
        refused(buf, len, "lying count");
        /* and kvidx_jkeys_next on such a record, made by hand, stops. */
        kvidx_jrec_t rec, k;
        memset(&rec, 0, sizeof(rec));
        rec.type = KVIDX_JREC_KEYS;
        rec.key.model = "m";
        rec.key.model_len = 1;
        rec.blob = buf + KVIDX_JREC_HDR_LEN + KVIDX_JKEYS_FIXED + 2;
        rec.blob_len = len - KVIDX_JREC_HDR_LEN - KVIDX_JKEYS_FIXED - 2;
        rec.count = lies[i];
        size_t pos = 0;
        int rc;
        uint32_t got = 0;
        while ((rc = kvidx_jkeys_next(&rec, &pos, &k)) == 1)
            got++;
        cr_assert_eq(rc, KVIDX_EINVAL, "count %u", lies[i]);
        cr_assert_leq(got, 5);
        size_t w = 0;
        cr_assert_eq(kvidx_jrec_encode(&rec, buf + 2048, 2048, &w), KVIDX_EINVAL);
    }
}

Test(journal_keys, a_cut_record_is_refused)
{
    uint8_t buf[4096];
    size_t len = build(buf, sizeof(buf), "model", "salt", 7);
    /* Torn: cut at every byte, the reader stays at the record's start. */
    for (size_t cut = 1; cut < len; cut++)
        refused(buf, cut, "torn");
    /* Cut and framed again with a right checksum, at every payload length
     * short of the whole: the states do not add up. */
    uint8_t copy[4096];
    for (size_t n = 1; n < len - KVIDX_JREC_HDR_LEN; n++) {
        memcpy(copy, buf, len);
        reframe(copy, n);
        refused(copy, KVIDX_JREC_HDR_LEN + n, "short payload");
    }
    /* Bytes after the last state, counted in the length. */
    memcpy(copy, buf, len);
    copy[len] = 0;
    reframe(copy, len + 1 - KVIDX_JREC_HDR_LEN);
    refused(copy, len + 1, "trailing byte");
}

Test(journal_keys, states_and_namespaces_out_of_range_are_refused)
{
    uint8_t buf[1024], copy[1024];
    kvidx_jrec_t r = state("m", "s", 1); /* present (L1), a 2-byte hash */
    size_t len = 0;
    cr_assert_eq(kvidx_jkeys_begin(&r, buf, sizeof(buf), &len), 0);
    kvidx_jkeys_close(buf);
    uint8_t *pl = buf + KVIDX_JREC_HDR_LEN;
    size_t st = KVIDX_JREC_HDR_LEN + KVIDX_JKEYS_FIXED + 2; /* the state */
    struct {
        size_t at;
        uint8_t v;
        const char *what;
    } bad[] = {
        {KVIDX_JREC_HDR_LEN + 1, 0, "model length 0"},
        {KVIDX_JREC_HDR_LEN + 1, 2, "model length past the namespace"},
        {KVIDX_JREC_HDR_LEN + 2, 0, "salt length short"},
        {KVIDX_JREC_HDR_LEN + 2, KVIDX_SALT_MAX + 1, "salt length over the maximum"},
        {st, 4, "unknown tier bit"},
        {st + 1, 0, "hash length 0"},
        {st + 1, KVIDX_HASH_MAX + 1, "hash length over the maximum"},
        {st + 1, 3, "hash length past the payload"},
        {st + 1, 1, "hash length short of the payload"},
    };
    cr_assert_eq(pl[1], 1);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memcpy(copy, buf, len);
        copy[bad[i].at] = bad[i].v;
        reframe(copy, len - KVIDX_JREC_HDR_LEN);
        refused(copy, len, bad[i].what);
    }
    /* Sizes: a present key of size 0 or over 2^40, a gone one with a size. */
    uint8_t tiers = buf[st];
    uint64_t sizes[] = {0, ((uint64_t)1 << 40) + 1};
    cr_assert_neq(tiers, 0);
    for (size_t i = 0; i < 2; i++) {
        memcpy(copy, buf, len);
        for (int b = 0; b < 8; b++)
            copy[st + 8 + (size_t)b] = (uint8_t)(sizes[i] >> (8 * b));
        reframe(copy, len - KVIDX_JREC_HDR_LEN);
        refused(copy, len, "size out of range");
    }
    memcpy(copy, buf, len);
    copy[st] = 0;
    reframe(copy, len - KVIDX_JREC_HDR_LEN);
    refused(copy, len, "gone with a size");
}

Test(journal_keys, an_open_record_is_not_read)
{
    /* Until it is closed a record has no checksum: a reader never takes
     * it for a whole record. */
    uint8_t buf[1024];
    kvidx_jrec_t r = state("m", "", 1);
    size_t len = 0;
    cr_assert_eq(kvidx_jkeys_begin(&r, buf, sizeof(buf), &len), 0);
    r = state("m", "", 2);
    len += kvidx_jkeys_add(buf, &r);
    refused(buf, len, "open");
    kvidx_jkeys_close(buf);
    size_t off = 0;
    kvidx_jrec_t rec;
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &rec), 1);
    cr_assert_eq(rec.count, 2);
}

Test(journal_keys, every_bit_flip_is_detected)
{
    uint8_t buf[2048];
    size_t len = build(buf, sizeof(buf), "mod", "x", 6);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1u << bit);
            refused(buf, len, "bit flip");
            buf[i] ^= (uint8_t)(1u << bit);
        }
    }
}

Test(journal_keys, inside_a_request_frame)
{
    uint8_t buf[8192];
    kvidx_jrec_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVIDX_JREC_BEGIN;
    size_t len = 0, w = 0;
    cr_assert_eq(kvidx_jrec_encode(&m, buf, sizeof(buf), &w), 0);
    len += w;
    size_t first = len;
    len += build(buf + len, sizeof(buf) - len, "a", "", 40);
    size_t second = len;
    len += build(buf + len, sizeof(buf) - len, "b", "s", 3);
    m.type = KVIDX_JREC_COMMIT;
    cr_assert_eq(kvidx_jrec_encode(&m, buf + len, sizeof(buf) - len, &w), 0);
    len += w;
    size_t end = 0;
    cr_assert_eq(kvidx_journal_group_end(buf, len, first, &end), 1);
    cr_assert_eq(end, len);
    for (size_t cut = first; cut < len; cut++)
        cr_assert_eq(kvidx_journal_group_end(buf, cut, first, &end), 0, "cut %zu", cut);
    buf[second + 20] ^= 1;
    cr_assert_eq(kvidx_journal_group_end(buf, len, first, &end), 0);
}

Test(journal_keys, versions)
{
    /* Version 3 is written (KEYS records); 1 and 2 are still read. */
    uint8_t h[KVIDX_JOURNAL_HEADER_LEN];
    uint64_t g = 0;
    kvidx_journal_header_encode(9, h);
    cr_assert_eq(get32(h + 8), 3);
    for (uint32_t v = 0; v < 6; v++) {
        put32(h + 8, v);
        put32(h + 24, kvidx_crc32c(0, h, 24));
        int want = v >= 1 && v <= 3 ? 0 : KVIDX_EINVAL;
        cr_assert_eq(kvidx_journal_header_decode(h, sizeof(h), &g), want, "version %u", v);
    }
}

Test(journal_keys, not_a_snapshot_record)
{
    /* A snapshot holds no KEYS record: its reader refuses one. */
    uint8_t body[1024];
    kvidx_snapshot_writer_t w;
    uint8_t *f = body;
    kvidx_snapshot_begin(&w, 1, f);
    size_t len = KVIDX_SNAPSHOT_HEADER_LEN;
    len += build(f + len, sizeof(body) - len, "m", "", 2);
    w.keys = 1; /* within what the file can hold */
    w.crc = kvidx_crc32c(0, f, len);
    kvidx_snapshot_finish(&w, f + len);
    len += KVIDX_SNAPSHOT_TRAILER_LEN;
    kvidx_snapshot_reader_t r;
    cr_assert_eq(kvidx_snapshot_open(&r, f, len, NULL), 0);
    kvidx_jrec_t rec;
    cr_assert_eq(kvidx_snapshot_next(&r, &rec), KVIDX_EINVAL);
}
