/*
 * The snapshot format (kvidx/journal.h): writer/reader round trip across
 * namespaces and layouts, refusal of every single-byte corruption and every
 * truncation (a corrupt snapshot must never load as a smaller catalogue),
 * and records that are well checksummed but malformed or miscounted. Each
 * refusal is checked with both readers: the one that verifies the checksum
 * at open and the streaming one that verifies it at the end.
 */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/journal.h"

#include <stdlib.h>
#include <string.h>

static kvidx_key_t mk(const char *model, const char *salt, uint32_t rank)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = model;
    k.model_len = (uint16_t)strlen(model);
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.kv_rank = rank;
    k.hash_len = (uint8_t)(1 + rank % 64);
    for (int i = 0; i < k.hash_len; i++)
        k.hash[i] = (uint8_t)(rank * 7 + (uint32_t)i);
    return k;
}

static const char *const models[] = {"a", "b/model", "c"};
static const char *const salts[] = {"", "s1"};
static const char layout_json[] = "{\"model_name\":\"a\",\"world_size\":1}";

/* Writes a snapshot of 1 layout and nkeys keys spread over namespaces. */
static size_t write_snapshot(uint8_t *buf, size_t cap, size_t nkeys)
{
    kvidx_snapshot_writer_t w;
    kvidx_snapshot_begin(&w, 42, buf);
    size_t len = KVIDX_SNAPSHOT_HEADER_LEN, n = 0;
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_LAYOUT_PUT;
    r.key.model = "a";
    r.key.model_len = 1;
    r.world_size = 1;
    r.blob = (const uint8_t *)layout_json;
    r.blob_len = sizeof(layout_json) - 1;
    cr_assert_eq(kvidx_snapshot_add(&w, &r, buf + len, cap - len, &n), 0);
    len += n;
    for (size_t i = 0; i < nkeys; i++) {
        memset(&r, 0, sizeof(r));
        r.type = KVIDX_JREC_KEY;
        r.key = mk(models[(i / 4) % 3], salts[(i / 12) % 2], (uint32_t)i);
        r.tiers = (uint8_t)(1 + i % 3);
        r.size_bytes = 1 + i;
        cr_assert_eq(kvidx_snapshot_add(&w, &r, buf + len, cap - len, &n), 0);
        len += n;
    }
    kvidx_snapshot_finish(&w, buf + len);
    return len + KVIDX_SNAPSHOT_TRAILER_LEN;
}

/* 0 when the whole snapshot reads back with one reader; else the failing
 * code. */
static int read_with(const uint8_t *buf, size_t len, size_t *nkeys, int streaming)
{
    kvidx_snapshot_reader_t r;
    int rc = streaming ? kvidx_snapshot_open_streaming(&r, buf, len, NULL)
                       : kvidx_snapshot_open(&r, buf, len, NULL);
    if (rc)
        return rc;
    kvidx_jrec_t rec;
    *nkeys = 0;
    while ((rc = kvidx_snapshot_next(&r, &rec)) == 1)
        if (rec.type == KVIDX_JREC_KEY)
            (*nkeys)++;
    if (rc)
        cr_assert_not_null(r.why);
    /* The end repeats: asking again gives the same answer. */
    cr_assert_eq(kvidx_snapshot_next(&r, &rec), rc);
    cr_assert_eq(kvidx_snapshot_next(&r, &rec), rc);
    return rc;
}

/* Both readers, which must agree. */
static int read_snapshot(const uint8_t *buf, size_t len, size_t *nkeys)
{
    size_t ns = 0;
    int rc = read_with(buf, len, nkeys, 0);
    int src = read_with(buf, len, &ns, 1);
    cr_assert_eq(rc, src, "checked-first %d, streaming %d", rc, src);
    if (rc == 0)
        cr_assert_eq(*nkeys, ns);
    return rc;
}

Test(snapshot, round_trip)
{
    static uint8_t buf[1 << 16];
    size_t len = write_snapshot(buf, sizeof(buf), 100);
    kvidx_snapshot_reader_t r;
    const char *why = NULL;
    cr_assert_eq(kvidx_snapshot_open(&r, buf, len, &why), 0, "%s", why);
    cr_assert_eq(r.next_generation, 42);
    cr_assert_eq(r.keys, 100);
    cr_assert_eq(r.layouts, 1);
    kvidx_jrec_t rec;
    cr_assert_eq(kvidx_snapshot_next(&r, &rec), 1);
    cr_assert_eq(rec.type, KVIDX_JREC_LAYOUT_PUT);
    cr_assert_eq(rec.blob_len, sizeof(layout_json) - 1);
    cr_assert_eq(memcmp(rec.blob, layout_json, rec.blob_len), 0);
    for (size_t i = 0; i < 100; i++) {
        cr_assert_eq(kvidx_snapshot_next(&r, &rec), 1);
        kvidx_key_t k = mk(models[(i / 4) % 3], salts[(i / 12) % 2], (uint32_t)i);
        cr_assert_eq(rec.type, KVIDX_JREC_KEY);
        cr_assert(kvidx_key_equal(&rec.key, &k), "key %zu", i);
        cr_assert_eq(rec.tiers, 1 + i % 3);
        cr_assert_eq(rec.size_bytes, 1 + i);
    }
    cr_assert_eq(kvidx_snapshot_next(&r, &rec), 0);
}

Test(snapshot, empty)
{
    uint8_t buf[KVIDX_SNAPSHOT_HEADER_LEN + KVIDX_SNAPSHOT_TRAILER_LEN];
    kvidx_snapshot_writer_t w;
    kvidx_snapshot_begin(&w, 1, buf);
    kvidx_snapshot_finish(&w, buf + KVIDX_SNAPSHOT_HEADER_LEN);
    size_t n = 7;
    cr_assert_eq(read_snapshot(buf, sizeof(buf), &n), 0);
    cr_assert_eq(n, 0);
}

Test(snapshot, every_corrupted_byte_is_refused)
{
    static uint8_t buf[1 << 14];
    size_t len = write_snapshot(buf, sizeof(buf), 30);
    for (size_t i = 0; i < len; i++) {
        size_t n;
        buf[i] ^= 0x21;
        cr_assert_neq(read_snapshot(buf, len, &n), 0, "byte %zu of %zu", i, len);
        buf[i] ^= 0x21;
    }
    size_t n;
    cr_assert_eq(read_snapshot(buf, len, &n), 0);
    cr_assert_eq(n, 30);
}

Test(snapshot, every_truncation_is_refused)
{
    static uint8_t buf[1 << 14];
    size_t len = write_snapshot(buf, sizeof(buf), 30);
    for (size_t cut = 0; cut < len; cut++) {
        size_t n;
        cr_assert_neq(read_snapshot(buf, cut, &n), 0, "cut at %zu of %zu", cut, len);
    }
}

/* Rewrites the trailer checksum so that only the structure is wrong. */
static void reseal(uint8_t *buf, size_t len)
{
    uint32_t c = kvidx_crc32c(0, buf, len - 8);
    for (int i = 0; i < 4; i++)
        buf[len - 8 + (size_t)i] = (uint8_t)(c >> (8 * i));
}

Test(snapshot, well_sealed_but_miscounted_or_malformed)
{
    static uint8_t buf[1 << 14];
    size_t len = write_snapshot(buf, sizeof(buf), 10);
    size_t n;
    /* The trailer announces one key more. */
    buf[len - KVIDX_SNAPSHOT_TRAILER_LEN + 8]++;
    reseal(buf, len);
    cr_assert_eq(read_snapshot(buf, len, &n), KVIDX_EINVAL);
    /* One key fewer announced. */
    buf[len - KVIDX_SNAPSHOT_TRAILER_LEN + 8] -= 2;
    reseal(buf, len);
    cr_assert_eq(read_snapshot(buf, len, &n), KVIDX_EINVAL);
    buf[len - KVIDX_SNAPSHOT_TRAILER_LEN + 8]++;
    reseal(buf, len);
    cr_assert_eq(read_snapshot(buf, len, &n), 0);
    /* A record whose own checksum is wrong, file checksum resealed. */
    buf[KVIDX_SNAPSHOT_HEADER_LEN + 9] ^= 1;
    reseal(buf, len);
    cr_assert_eq(read_snapshot(buf, len, &n), KVIDX_EINVAL);
}

Test(snapshot, writer_reports_short_buffers)
{
    uint8_t hdr[KVIDX_SNAPSHOT_HEADER_LEN], out[16];
    kvidx_snapshot_writer_t w;
    kvidx_snapshot_begin(&w, 1, hdr);
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_KEY;
    r.key = mk("a", "", 5);
    r.tiers = KVIDX_STATE_L2;
    r.size_bytes = 9;
    size_t n = 0;
    cr_assert_eq(kvidx_snapshot_add(&w, &r, out, sizeof(out), &n), KVIDX_ENOBUFS);
    cr_assert(n > sizeof(out) && n <= KVIDX_SNAPSHOT_KEY_MAX);
    cr_assert_eq(w.keys, 0);
    r.tiers = 0; /* gone keys are not snapshotted */
    cr_assert_eq(kvidx_snapshot_add(&w, &r, out, sizeof(out), &n), KVIDX_EINVAL);
}

/* A snapshot larger than the streaming reader's checksum step (64 KiB):
 * damage early, in the middle and in the last record is found at the end,
 * with the reason. */
Test(snapshot, streaming_reader_finds_damage_anywhere)
{
    static uint8_t buf[1 << 20];
    size_t len = write_snapshot(buf, sizeof(buf), 6000);
    cr_assert_gt(len, 4 * 65536);
    size_t n;
    cr_assert_eq(read_snapshot(buf, len, &n), 0);
    cr_assert_eq(n, 6000);
    const size_t at[] = {KVIDX_SNAPSHOT_HEADER_LEN + 30, 65536, 65537, 3 * 65536 + 5,
                         len - KVIDX_SNAPSHOT_TRAILER_LEN - 3};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        /* Most of these bytes are hash bytes, which only the checksum
         * can tell; whatever the byte, the reader must not end with 0. */
        size_t off = at[i];
        buf[off] ^= 0x40;
        kvidx_snapshot_reader_t r;
        cr_assert_eq(kvidx_snapshot_open_streaming(&r, buf, len, NULL), 0);
        kvidx_jrec_t rec;
        int rc;
        while ((rc = kvidx_snapshot_next(&r, &rec)) == 1)
            ;
        cr_assert_eq(rc, KVIDX_EINVAL, "byte %zu", off);
        cr_assert_not_null(r.why);
        buf[off] ^= 0x40;
    }
}

Test(snapshot, trailer_counts_bounded_by_the_file)
{
    static uint8_t buf[1 << 14];
    size_t len = write_snapshot(buf, sizeof(buf), 10);
    /* 2^40 keys announced, resealed: refused at open by either reader, so
     * nobody sizes an index for them. */
    buf[len - KVIDX_SNAPSHOT_TRAILER_LEN + 8 + 5] = 1;
    reseal(buf, len);
    kvidx_snapshot_reader_t r;
    const char *why = NULL;
    cr_assert_eq(kvidx_snapshot_open_streaming(&r, buf, len, &why), KVIDX_EINVAL);
    cr_assert(strstr(why, "more records"), "%s", why);
    cr_assert_eq(kvidx_snapshot_open(&r, buf, len, &why), KVIDX_EINVAL);
}
