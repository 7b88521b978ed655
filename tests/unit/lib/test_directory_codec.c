/*
 * The fleet directory's persistence bytes (kvidx/directory_codec.h): a
 * random workload's changes, encoded into small blobs (so that batches
 * split) and replayed on an empty directory, give the same state as text;
 * the dump's records round-trip; a batch whose last blobs are missing is
 * dropped whole; every truncation and corruption of a blob is refused or
 * harmless, never read past its end.
 */
#include "directory_text.h"

#include "kvidx/directory_codec.h"
#include "kvidx/err.h"

#include <criterion/criterion.h>

#define NOW 5000

typedef struct blobs {
    uint8_t **b;
    size_t *len;
    size_t n, cap;
} blobs_t;

static int keep(void *ctx, const uint8_t *blob, size_t len)
{
    blobs_t *bs = ctx;
    if (bs->n == bs->cap) {
        bs->cap = bs->cap ? bs->cap * 2 : 64;
        bs->b = realloc(bs->b, bs->cap * sizeof(*bs->b));
        bs->len = realloc(bs->len, bs->cap * sizeof(*bs->len));
    }
    bs->b[bs->n] = malloc(len);
    memcpy(bs->b[bs->n], blob, len);
    bs->len[bs->n++] = len;
    return 0;
}

static void blobs_free(blobs_t *bs)
{
    for (size_t i = 0; i < bs->n; i++)
        free(bs->b[i]);
    free(bs->b);
    free(bs->len);
}

static size_t max_blob = 4096;

static void on_change(void *ctx, const kvidx_dir_change_t *c)
{
    cr_assert_eq(kvidx_dir_change_encode(c, max_blob, keep, ctx), 0);
}

static kvidx_directory_t *new_dir(uint64_t cap)
{
    kvidx_directory_t *d;
    kvidx_dir_options_t o = {.token_bytes_cap = cap, .has_seed = 1};
    cr_assert_eq(kvidx_directory_new(&o, &d), 0);
    return d;
}

static const char *insts[] = {"mp-a", "mp-b", "mp-c"};
static const char *backends[] = {"dram", "fs", "s3"};

/* A random workload on d; its changes go to bs. */
static void workload(kvidx_directory_t *d, blobs_t *bs, unsigned seed, int steps)
{
    srand(seed);
    uint64_t inc[3] = {1, 1, 1}, seq[3] = {0, 0, 0};
    kvidx_directory_on_change(d, on_change, bs);
    static uint32_t toks[300];
    for (int i = 0; i < 300; i++)
        toks[i] = (uint32_t)(i * 2654435761u);
    for (int step = 0; step < steps; step++) {
        int w = rand() % 3, op = rand() % 100;
        if (op < 60) {
            kvidx_dir_entry_t e[40];
            size_t n = (size_t)(rand() % 40);
            for (size_t i = 0; i < n; i++) {
                e[i] = mkentry(mkkey(rand() % 2 ? "m" : "model/x", rand() % 3 ? "" : "s",
                                     (uint32_t)(rand() % 2), 0, (unsigned)(rand() % 60)),
                               (uint64_t)(1 + rand() % 1000));
                if (rand() % 2) {
                    e[i].token_ids = toks + rand() % 40;
                    e[i].num_tokens = (size_t)(rand() % 256);
                    e[i].token_offset = rand() % 2 ? 0 : KVIDX_DIR_UNKNOWN_OFFSET;
                }
            }
            kvidx_dir_event_t ev = op < 40   ? KVIDX_DIR_STORE
                                   : op < 55 ? KVIDX_DIR_DELETE
                                             : KVIDX_DIR_ACCESS;
            /* now and then a replayed or skipped seq */
            uint64_t s = rand() % 10 == 0 && seq[w] ? seq[w] : ++seq[w] + (rand() % 15 == 0);
            if (s > seq[w])
                seq[w] = s;
            kvidx_dir_batch_t b =
                mkbatch(insts[w], inc[w], s, ev, rand() % 2 ? KVIDX_DIR_L1 : KVIDX_DIR_L2,
                        ev == KVIDX_DIR_ACCESS ? "" : backends[rand() % 3], e, n);
            b.shared = rand() % 4 == 0;
            b.ts = step * 0.5;
            kvidx_dir_verdict_t v;
            cr_assert_eq(kvidx_directory_ingest(d, &b, &v), 0);
        } else if (op < 66) {
            inc[w] += 1 + (uint64_t)(rand() % 2);
            seq[w] = 0;
        } else if (op < 70) {
            kvidx_dir_batch_t b = mkbatch(insts[w], inc[w] ? inc[w] - 1 : 0, 1, KVIDX_DIR_STORE,
                                          KVIDX_DIR_L1, "dram", NULL, 0);
            kvidx_dir_verdict_t v;
            cr_assert_eq(kvidx_directory_ingest(d, &b, &v), 0);
        } else if (op < 80) {
            kvidx_dir_instance_t in;
            memset(&in, 0, sizeof(in));
            in.instance_id = insts[w];
            in.instance_len = strlen(insts[w]);
            in.ip = "10.0.0.1";
            in.ip_len = 8;
            in.http_port = 8080;
            in.metadata = "{\"a\":\"b\"}";
            in.metadata_len = 9;
            in.registration_time = step;
            in.last_seen_ms = NOW;
            cr_assert_eq(kvidx_directory_register(d, &in, NULL), 0);
        } else if (op < 86) {
            kvidx_directory_deregister(d, insts[w], strlen(insts[w]));
            seq[w] = 0;
        } else if (op < 88) {
            kvidx_dir_batch_t b = mkbatch(insts[w], inc[w], ++seq[w], KVIDX_DIR_CONFIG,
                                          KVIDX_DIR_L1, backends[rand() % 3], NULL, 0);
            b.capacity_bytes = (uint64_t)rand();
            b.capacity_revision = (uint64_t)(rand() % 3);
            kvidx_dir_verdict_t v;
            cr_assert_eq(kvidx_directory_ingest(d, &b, &v), 0);
        } else if (op < 90) {
            kvidx_directory_set_token_cap(d, (uint64_t)(rand() % 3) * 20000);
        }
    }
    kvidx_directory_on_change(d, NULL, NULL);
}

static kvidx_directory_t *replay(const blobs_t *bs, size_t upto)
{
    kvidx_directory_t *d = new_dir(0);
    kvidx_dir_replay_t rp;
    kvidx_dir_replay_init(&rp, NOW);
    for (size_t i = 0; i < upto; i++)
        cr_assert_eq(kvidx_dir_replay_blob(&rp, d, bs->b[i], bs->len[i]), 0, "blob %zu", i);
    cr_assert_eq(rp.mismatches, 0);
    kvidx_dir_replay_free(&rp);
    cr_assert_eq(kvidx_directory_check(d), 0);
    return d;
}

Test(directory_codec, changes_replay_to_the_same_state)
{
    for (unsigned seed = 1; seed <= 6; seed++) {
        kvidx_directory_t *a = new_dir(0);
        blobs_t bs = {0};
        workload(a, &bs, seed, 400);
        kvidx_directory_t *b = replay(&bs, bs.n);
        char *ta = dir_text(a), *tb = dir_text(b);
        cr_assert_str_eq(ta, tb, "seed %u", seed);
        free(ta);
        free(tb);
        kvidx_directory_free(b);
        kvidx_directory_free(a);
        blobs_free(&bs);
    }
}

static int dump_keep(void *ctx, const kvidx_dir_record_t *r)
{
    return kvidx_dir_record_encode(r, max_blob, keep, ctx);
}

Test(directory_codec, records_round_trip)
{
    kvidx_directory_t *a = new_dir(50000);
    blobs_t ch = {0}, bs = {0};
    workload(a, &ch, 11, 500);
    cr_assert_eq(kvidx_directory_dump(a, dump_keep, &bs), 0);
    kvidx_directory_t *b = replay(&bs, bs.n);
    /* The cap is a setting, not a record: the daemon sets it first. */
    kvidx_directory_set_token_cap(b, 50000);
    char *ta = dir_text(a), *tb = dir_text(b);
    /* The dropped counters are since creation: not part of the records. */
    *strstr(ta, "cap ") = '\0';
    *strstr(tb, "cap ") = '\0';
    cr_assert_str_eq(ta, tb);
    free(ta);
    free(tb);
    kvidx_directory_free(b);
    kvidx_directory_free(a);
    blobs_free(&bs);
    blobs_free(&ch);
}

Test(directory_codec, a_torn_batch_is_dropped_whole)
{
    kvidx_directory_t *a = new_dir(0);
    blobs_t bs = {0};
    kvidx_directory_on_change(a, on_change, &bs);
    static uint32_t toks[256];
    kvidx_dir_entry_t e[100];
    for (int i = 0; i < 100; i++) {
        e[i] = mkentry(mkkey("m", "", 0, 0, (unsigned)i), 10);
        e[i].token_ids = toks;
        e[i].num_tokens = 256;
    }
    kvidx_dir_batch_t b1 = mkbatch("mp-a", 1, 1, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", e, 3);
    kvidx_dir_verdict_t v;
    cr_assert_eq(kvidx_directory_ingest(a, &b1, &v), 0);
    size_t after_first = bs.n;
    char *want = dir_text(a);
    kvidx_dir_batch_t b2 = mkbatch("mp-a", 1, 2, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", e, 100);
    cr_assert_eq(kvidx_directory_ingest(a, &b2, &v), 0);
    cr_assert_gt(bs.n - after_first, 2, "a 100-entry batch spans several 4 KiB blobs");
    kvidx_directory_on_change(a, NULL, NULL);
    /* Without the last blob the second batch never applies, and the next
     * kind of blob drops it. */
    kvidx_directory_t *d = new_dir(0);
    kvidx_dir_replay_t rp;
    kvidx_dir_replay_init(&rp, NOW);
    for (size_t i = 0; i + 1 < bs.n; i++)
        cr_assert_eq(kvidx_dir_replay_blob(&rp, d, bs.b[i], bs.len[i]), 0);
    cr_assert(kvidx_dir_replay_pending(&rp));
    char *got = dir_text(d);
    cr_assert_str_eq(got, want);
    free(got);
    uint8_t cap_blob[9] = {5, 0, 0, 0, 0, 0, 0, 0, 0}; /* B_TOKEN_CAP 0 */
    cr_assert_eq(kvidx_dir_replay_blob(&rp, d, cap_blob, sizeof(cap_blob)), 0);
    cr_assert_not(kvidx_dir_replay_pending(&rp));
    cr_assert_eq(rp.dropped, 1);
    kvidx_dir_replay_free(&rp);
    free(want);
    kvidx_directory_free(d);
    kvidx_directory_free(a);
    blobs_free(&bs);
}

Test(directory_codec, truncated_and_corrupt_blobs)
{
    kvidx_directory_t *a = new_dir(0);
    blobs_t bs = {0}, recs = {0};
    workload(a, &bs, 3, 120);
    cr_assert_eq(kvidx_directory_dump(a, dump_keep, &recs), 0);
    blobs_t *sets[2] = {&bs, &recs};
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < sets[s]->n && i < 60; i++) {
            const uint8_t *b = sets[s]->b[i];
            size_t len = sets[s]->len[i];
            for (size_t cut = 0; cut < len; cut += 1 + cut / 8) {
                /* A copy of exactly cut bytes, so that ASan sees any read
                 * past the end. */
                uint8_t *c = malloc(cut ? cut : 1);
                memcpy(c, b, cut);
                kvidx_directory_t *d = new_dir(0);
                kvidx_dir_replay_t rp;
                kvidx_dir_replay_init(&rp, NOW);
                kvidx_dir_replay_blob(&rp, d, c, cut);
                cr_assert_eq(kvidx_directory_check(d), 0);
                kvidx_dir_replay_free(&rp);
                kvidx_directory_free(d);
                free(c);
            }
            uint8_t *c = malloc(len);
            for (size_t at = 0; at < len; at += 1 + len / 16) {
                memcpy(c, b, len);
                c[at] ^= 0xa5;
                kvidx_directory_t *d = new_dir(0);
                kvidx_dir_replay_t rp;
                kvidx_dir_replay_init(&rp, NOW);
                kvidx_dir_replay_blob(&rp, d, c, len);
                cr_assert_eq(kvidx_directory_check(d), 0);
                kvidx_dir_replay_free(&rp);
                kvidx_directory_free(d);
            }
            free(c);
        }
    }
    /* A MORE blob announcing 2^32 - 1 entries in 5 bytes is refused
     * before anything is sized by its count (after a BATCH that opened
     * a batch of as many). */
    {
        kvidx_dir_entry_t e1 = mkentry(mkkey("m", "", 0, 0, 1), 1);
        kvidx_dir_batch_t b1 = mkbatch("mp-z", 1, 1, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", &e1, 1);
        kvidx_dir_change_t ch;
        memset(&ch, 0, sizeof(ch));
        ch.type = KVIDX_DIR_CHG_BATCH;
        ch.batch = &b1;
        blobs_t one = {0};
        cr_assert_eq(kvidx_dir_change_encode(&ch, 4096, keep, &one), 0);
        cr_assert_eq(one.n, 1);
        /* total (8 bytes) and count (4 bytes) precede the entry: make the
         * total and the count huge and drop the entry. */
        size_t entry_len = 2 + 1 + 2 + 0 + 4 + 2 + 1 + 32 + 8 + 8 + 4;
        size_t head = one.len[0] - entry_len;
        memset(one.b[0] + head - 12, 0xff, 12);
        kvidx_directory_t *z = new_dir(0);
        kvidx_dir_replay_t zr;
        kvidx_dir_replay_init(&zr, NOW);
        cr_assert_eq(kvidx_dir_replay_blob(&zr, z, one.b[0], head), KVIDX_EINVAL);
        uint8_t more[5] = {2, 0xff, 0xff, 0xff, 0xff};
        cr_assert_eq(kvidx_dir_replay_blob(&zr, z, more, sizeof(more)), KVIDX_EINVAL);
        kvidx_dir_replay_free(&zr);
        kvidx_directory_free(z);
        blobs_free(&one);
    }
    uint8_t none[1] = {99};
    kvidx_dir_replay_t rp;
    kvidx_dir_replay_init(&rp, NOW);
    cr_assert_eq(kvidx_dir_replay_blob(&rp, a, none, 1), KVIDX_EINVAL);
    cr_assert_eq(kvidx_dir_replay_blob(&rp, a, none, 0), KVIDX_EINVAL);
    kvidx_dir_replay_free(&rp);
    kvidx_directory_free(a);
    blobs_free(&bs);
    blobs_free(&recs);
}

Test(directory_codec, heartbeats_write_nothing_and_small_blobs_are_refused)
{
    kvidx_dir_change_t c;
    memset(&c, 0, sizeof(c));
    c.type = KVIDX_DIR_CHG_HEARTBEAT;
    blobs_t bs = {0};
    cr_assert_eq(kvidx_dir_change_encode(&c, 4096, keep, &bs), 0);
    cr_assert_eq(bs.n, 0);
    c.type = KVIDX_DIR_CHG_TOKEN_CAP;
    cr_assert_eq(kvidx_dir_change_encode(&c, 100, keep, &bs), KVIDX_EINVAL);
    blobs_free(&bs);
}

#include "kvidx/journal.h"

/* DIR records in the journal and the snapshot formats: framed with their
 * CRC, handed back unchanged, not counted in the snapshot's trailer. */
Test(directory_codec, dir_records_in_journal_and_snapshot)
{
    uint8_t blob[300];
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (uint8_t)(i * 7);
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_DIR;
    r.blob = blob;
    r.blob_len = sizeof(blob);
    uint8_t buf[1024];
    size_t len = 0;
    cr_assert_eq(kvidx_jrec_encode(&r, buf, sizeof(buf), &len), 0);
    cr_assert_eq(len, kvidx_jrec_size(&r));
    size_t off = 0;
    kvidx_jrec_t got;
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &got), 1);
    cr_assert_eq(got.type, KVIDX_JREC_DIR);
    cr_assert_eq(got.blob_len, sizeof(blob));
    cr_assert_eq(memcmp(got.blob, blob, sizeof(blob)), 0);
    buf[KVIDX_JREC_HDR_LEN + 5] ^= 1;
    off = 0;
    cr_assert_eq(kvidx_journal_next(buf, len, &off, &got), KVIDX_EINVAL, "the CRC covers it");
    r.blob_len = 0;
    cr_assert_eq(kvidx_jrec_size(&r), 0);
    r.blob_len = KVIDX_JREC_DIR_BLOB_MAX + 1;
    cr_assert_eq(kvidx_jrec_size(&r), 0);
    r.blob_len = sizeof(blob);

    static uint8_t snap[4096];
    kvidx_snapshot_writer_t w;
    kvidx_snapshot_begin(&w, 7, snap);
    size_t n = KVIDX_SNAPSHOT_HEADER_LEN, add = 0;
    cr_assert_eq(kvidx_snapshot_add(&w, &r, snap + n, sizeof(snap) - n, &add), 0);
    n += add;
    kvidx_snapshot_finish(&w, snap + n);
    n += KVIDX_SNAPSHOT_TRAILER_LEN;
    kvidx_snapshot_reader_t rd;
    const char *why = NULL;
    cr_assert_eq(kvidx_snapshot_open(&rd, snap, n, &why), 0, "%s", why);
    cr_assert_eq(kvidx_snapshot_next(&rd, &got), 1);
    cr_assert_eq(got.type, KVIDX_JREC_DIR);
    cr_assert_eq(memcmp(got.blob, blob, sizeof(blob)), 0);
    cr_assert_eq(kvidx_snapshot_next(&rd, &got), 0);
}

#include "kvidx/alloc.h"

/* The largest block an encode asks lib's allocator for (only while one runs). */
static size_t enc_peak;
static int enc_on;

static void *peak_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (enc_on && n > enc_peak)
        enc_peak = n;
    return malloc(n);
}
static void *peak_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (enc_on && n > enc_peak)
        enc_peak = n;
    return realloc(p, n);
}
static void peak_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void on_change_journal(void *ctx, const kvidx_dir_change_t *c)
{
    enc_on = 1;
    cr_assert_eq(kvidx_dir_change_encode(c, KVIDX_JREC_DIR_BLOB_MAX, keep, ctx), 0);
    enc_on = 0;
}

static int dump_journal(void *ctx, const kvidx_dir_record_t *r)
{
    enc_on = 1;
    int rc = kvidx_dir_record_encode(r, KVIDX_JREC_DIR_BLOB_MAX, keep, ctx);
    enc_on = 0;
    return rc;
}

/* With the journal's bound on a blob (about 1 MiB), encoding a small change
 * or record takes a few KiB, not the bound; a batch bigger than the bound
 * grows the buffer to it, splits, and replays to the same state. */
Test(directory_codec, the_scratch_buffer_follows_the_blob_not_its_bound)
{
    kvidx_allocator_t a = {peak_malloc, peak_realloc, peak_free, NULL};
    kvidx_set_allocator(&a);
    kvidx_directory_t *d = new_dir(0);
    blobs_t bs = {0};
    kvidx_directory_on_change(d, on_change_journal, &bs);

    kvidx_dir_instance_t in;
    memset(&in, 0, sizeof(in));
    in.instance_id = "mp-a";
    in.instance_len = 4;
    in.ip = "10.0.0.1";
    in.ip_len = 8;
    in.http_port = 8080;
    in.last_seen_ms = NOW;
    cr_assert_eq(kvidx_directory_register(d, &in, NULL), 0);
    kvidx_dir_entry_t small[3];
    for (unsigned i = 0; i < 3; i++)
        small[i] = mkentry(mkkey("m", "", 0, 0, i), 100);
    kvidx_dir_batch_t b = mkbatch("mp-a", 1, 1, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", small, 3);
    kvidx_dir_verdict_t v;
    cr_assert_eq(kvidx_directory_ingest(d, &b, &v), 0);
    cr_assert_eq(bs.n, 2);
    cr_assert_leq(enc_peak, 16384, "a small change took %zu bytes", enc_peak);

    enum { N = 1500, TOKENS = 256 };
    static uint32_t toks[TOKENS];
    for (unsigned i = 0; i < TOKENS; i++)
        toks[i] = i * 7u;
    kvidx_dir_entry_t *big = calloc(N, sizeof(*big));
    for (unsigned i = 0; i < N; i++) {
        big[i] = mkentry(mkkey("m", "", 0, 0, 100 + i), 100);
        big[i].token_ids = toks;
        big[i].num_tokens = TOKENS;
        big[i].token_offset = 0;
    }
    b = mkbatch("mp-a", 1, 2, KVIDX_DIR_STORE, KVIDX_DIR_L2, "fs", big, N);
    cr_assert_eq(kvidx_directory_ingest(d, &b, &v), 0);
    cr_assert_geq(bs.n, 4, "a batch of ~1.6 MB must split: %zu blobs", bs.n);
    cr_assert_gt(enc_peak, 16384);
    cr_assert_leq(enc_peak, KVIDX_JREC_DIR_BLOB_MAX);
    for (size_t i = 0; i < bs.n; i++)
        cr_assert_leq(bs.len[i], KVIDX_JREC_DIR_BLOB_MAX);
    kvidx_directory_on_change(d, NULL, NULL);

    kvidx_directory_t *r = replay(&bs, bs.n);
    char *ta = dir_text(d), *tb = dir_text(r);
    cr_assert_str_eq(ta, tb);
    free(ta);
    free(tb);
    kvidx_directory_free(r);

    blobs_t recs = {0};
    enc_peak = 0;
    cr_assert_eq(kvidx_directory_dump(d, dump_journal, &recs), 0);
    cr_assert_gt(recs.n, N);
    cr_assert_leq(enc_peak, 16384, "a record took %zu bytes", enc_peak);
    blobs_free(&recs);
    blobs_free(&bs);
    free(big);
    kvidx_directory_free(d);
    kvidx_set_allocator(NULL);
}
