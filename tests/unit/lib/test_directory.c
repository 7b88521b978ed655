/* The fleet directory's rules, one test each: the gate, placement
 * identities, deletes, token bindings and their cap, fencing, the instance
 * registry, declarations, reads, the score and persistence. */
#include <criterion/criterion.h>

#include "kvidx/directory.h"
#include "kvidx/err.h"

#include "directory_text.h"

static kvidx_directory_t *fresh(uint64_t token_cap)
{
    kvidx_dir_options_t o = {.token_bytes_cap = token_cap, .has_seed = 1};
    kvidx_directory_t *d;
    cr_assert_eq(kvidx_directory_new(&o, &d), 0);
    return d;
}

static void ok(const kvidx_directory_t *d)
{
    cr_assert_eq(kvidx_directory_check(d), 0, "an invariant broke");
}

static kvidx_dir_verdict_t ingest(kvidx_directory_t *d, kvidx_dir_batch_t b)
{
    kvidx_dir_verdict_t v = 99;
    cr_assert_eq(kvidx_directory_ingest(d, &b, &v), 0);
    ok(d);
    return v;
}

/* Stores one key (size 100) for inst at (inc, seq). */
static kvidx_dir_verdict_t store1(kvidx_directory_t *d, const char *inst, uint64_t inc,
                                  uint64_t seq, kvidx_dir_tier_t tier, const char *backend,
                                  int shared, kvidx_key_t k)
{
    kvidx_dir_entry_t e = mkentry(k, 100);
    kvidx_dir_batch_t b = mkbatch(inst, inc, seq, KVIDX_DIR_STORE, tier, backend, &e, 1);
    b.shared = shared;
    return ingest(d, b);
}

static kvidx_dir_verdict_t delete1(kvidx_directory_t *d, const char *inst, uint64_t inc,
                                   uint64_t seq, kvidx_dir_tier_t tier, const char *backend,
                                   int shared, kvidx_key_t k)
{
    kvidx_dir_entry_t e = mkentry(k, 0);
    kvidx_dir_batch_t b = mkbatch(inst, inc, seq, KVIDX_DIR_DELETE, tier, backend, &e, 1);
    b.shared = shared;
    return ingest(d, b);
}

/* The placements of a key as "inst/tier/backend/shared ..." ("-" when absent). */
static char *placements(const kvidx_directory_t *d, kvidx_key_t k)
{
    kvidx_dir_row_t row;
    tbuf_t b = {0};
    tb_printf(&b, "%s", "");
    if (kvidx_directory_lookup(d, &k, &row) != 0) {
        tb_printf(&b, "-");
        return b.s;
    }
    kvidx_dir_placement_t p;
    for (int i = 0; kvidx_directory_row_next(&row, &p); i++) {
        tb_printf(&b, "%s", i ? " " : "");
        tb_bytes(&b, p.instance_id, p.instance_len);
        tb_printf(&b, "/%s/", tier_name(p.tier));
        tb_bytes(&b, p.backend, p.backend_len);
        tb_printf(&b, "/%d/%llu", p.shared, (unsigned long long)p.incarnation);
    }
    return b.s;
}

#define assert_placements(d, k, want)                                                              \
    do {                                                                                           \
        char *got_ = placements(d, k);                                                             \
        cr_assert_str_eq(got_, want);                                                              \
        free(got_);                                                                                \
    } while (0)

typedef struct stream_probe {
    const char *id;
    kvidx_dir_stream_t s;
    int found;
} stream_probe_t;

static int find_stream(void *ctx, const kvidx_dir_stream_t *s)
{
    stream_probe_t *p = ctx;
    if (s->instance_len == strlen(p->id) && memcmp(s->instance_id, p->id, s->instance_len) == 0) {
        p->s = *s;
        p->found = 1;
    }
    return 0;
}

static stream_probe_t stream_of(const kvidx_directory_t *d, const char *id)
{
    stream_probe_t p = {.id = id};
    kvidx_directory_streams(d, find_stream, &p);
    return p;
}

/* ---- the gate ---- */

Test(directory_gate, first_batch_opens_a_cursor_and_duplicates_are_dropped)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    cr_assert_eq(store1(d, "a", 5, 1, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert_eq(store1(d, "a", 5, 1, KVIDX_DIR_L1, "fs", 0, k), KVIDX_DIR_DUPLICATE);
    cr_assert_eq(store1(d, "a", 5, 2, KVIDX_DIR_L2, "fs", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert_eq(store1(d, "a", 5, 2, KVIDX_DIR_L2, "s3", 0, k), KVIDX_DIR_DUPLICATE);
    cr_assert_eq(store1(d, "a", 5, 1, KVIDX_DIR_L2, "s3", 0, k), KVIDX_DIR_DUPLICATE);
    assert_placements(d, k, "a/l1/dram/0/5 a/l2/fs/0/5");
    stream_probe_t s = stream_of(d, "a");
    cr_assert(s.found);
    cr_assert_eq(s.s.incarnation, 5);
    cr_assert_eq(s.s.last_seq, 2);
    cr_assert_eq(s.s.gap, 0);
    cr_assert_eq(s.s.applied, 2);
    cr_assert_eq(s.s.duplicates, 3);
    cr_assert_eq(s.s.stale, 0);
    kvidx_directory_free(d);
}

Test(directory_gate, gap_is_admitted_and_sticks_for_the_incarnation)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    cr_assert_eq(store1(d, "a", 1, 3, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert(stream_of(d, "a").s.gap, "a first seq above 1 is a gap (LMCache: last_seq 0)");
    kvidx_directory_free(d);

    d = fresh(0);
    cr_assert_eq(store1(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert_eq(store1(d, "a", 1, 2, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert_not(stream_of(d, "a").s.gap);
    cr_assert_eq(store1(d, "a", 1, 7, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert(stream_of(d, "a").s.gap);
    cr_assert_eq(stream_of(d, "a").s.last_seq, 7);
    cr_assert_eq(store1(d, "a", 1, 5, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_DUPLICATE,
                 "a seq skipped by the gap is now a duplicate");
    cr_assert_eq(store1(d, "a", 1, 8, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert(stream_of(d, "a").s.gap, "the gap flag stays set");
    /* A new incarnation opens a fresh cursor without the gap. */
    cr_assert_eq(store1(d, "a", 2, 1, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert_not(stream_of(d, "a").s.gap);
    cr_assert_eq(stream_of(d, "a").s.applied, 1, "the counters start again");
    kvidx_directory_free(d);
}

Test(directory_gate, lower_incarnation_is_stale_and_counted)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1), k2 = mkkey("m", "", 0, 0, 2);
    cr_assert_eq(store1(d, "a", 10, 1, KVIDX_DIR_L1, "dram", 0, k), KVIDX_DIR_ADMITTED);
    cr_assert_eq(store1(d, "a", 9, 50, KVIDX_DIR_L1, "dram", 0, k2), KVIDX_DIR_STALE);
    assert_placements(d, k2, "-");
    stream_probe_t s = stream_of(d, "a");
    cr_assert_eq(s.s.stale, 1);
    cr_assert_eq(s.s.incarnation, 10);
    cr_assert_eq(s.s.last_seq, 1);
    kvidx_dir_batch_t b = mkbatch("a", 9, 2, KVIDX_DIR_ACCESS, KVIDX_DIR_L1, "", NULL, 0);
    cr_assert_eq(kvidx_directory_classify(d, &b), KVIDX_DIR_STALE);
    b.incarnation = 10;
    cr_assert_eq(kvidx_directory_classify(d, &b), KVIDX_DIR_ADMITTED);
    b.seq = 1;
    cr_assert_eq(kvidx_directory_classify(d, &b), KVIDX_DIR_DUPLICATE);
    b.incarnation = 11;
    cr_assert_eq(kvidx_directory_classify(d, &b), KVIDX_DIR_ADMITTED);
    kvidx_directory_free(d);
}

Test(directory_gate, higher_incarnation_fences_l1_and_keeps_l2)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t only_l1 = mkkey("m", "", 0, 0, 1), both = mkkey("m", "", 0, 0, 2);
    kvidx_key_t shared_l1 = mkkey("m", "", 0, 0, 3), other = mkkey("m", "", 0, 0, 4);
    store1(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 0, only_l1);
    store1(d, "a", 1, 2, KVIDX_DIR_L1, "dram", 0, both);
    store1(d, "a", 1, 3, KVIDX_DIR_L2, "fs", 0, both);
    store1(d, "a", 1, 4, KVIDX_DIR_L1, "cxl", 1, shared_l1);
    store1(d, "b", 1, 1, KVIDX_DIR_L1, "dram", 0, other);
    store1(d, "b", 1, 2, KVIDX_DIR_L1, "dram", 0, both);
    /* A restart: incarnation 2, seq starting at 1 again. */
    cr_assert_eq(store1(d, "a", 2, 1, KVIDX_DIR_L2, "fs", 0, other), KVIDX_DIR_ADMITTED);
    assert_placements(d, only_l1, "-");
    assert_placements(d, both, "a/l2/fs/0/1 b/l1/dram/0/1");
    assert_placements(d, shared_l1, "-");
    assert_placements(d, other, "a/l2/fs/0/2 b/l1/dram/0/1");
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.num_keys, 2);
    cr_assert_eq(st.num_placements, 4);
    cr_assert_eq(st.placements[0], 2);
    cr_assert_eq(st.placements[1], 2);
    kvidx_directory_free(d);
}

Test(directory_gate, shared_l1_taken_over_survives_the_first_reporters_fence)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    store1(d, "a", 1, 1, KVIDX_DIR_L1, "cxl", 1, k);
    store1(d, "b", 1, 1, KVIDX_DIR_L1, "cxl", 1, k);
    assert_placements(d, k, "b/l1/cxl/1/1");
    store1(d, "a", 2, 1, KVIDX_DIR_L2, "fs", 0, mkkey("m", "", 0, 0, 9));
    assert_placements(d, k, "b/l1/cxl/1/1");
    store1(d, "b", 2, 1, KVIDX_DIR_L2, "fs", 0, mkkey("m", "", 0, 0, 9));
    assert_placements(d, k, "-");
    kvidx_directory_free(d);
}

/* ---- identities ---- */

Test(directory_identity, private_placements_are_per_instance)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    store1(d, "b", 1, 1, KVIDX_DIR_L1, "dram", 0, k);
    store1(d, "a", 3, 1, KVIDX_DIR_L1, "dram", 0, k);
    store1(d, "a", 3, 2, KVIDX_DIR_L2, "fs", 0, k);
    store1(d, "a", 3, 3, KVIDX_DIR_L1, "dram", 0, k); /* an upsert */
    assert_placements(d, k, "a/l1/dram/0/3 a/l2/fs/0/3 b/l1/dram/0/1");
    /* Another instance's delete leaves a's private placement. */
    delete1(d, "b", 1, 2, KVIDX_DIR_L2, "fs", 0, k);
    assert_placements(d, k, "a/l1/dram/0/3 a/l2/fs/0/3 b/l1/dram/0/1");
    delete1(d, "b", 1, 3, KVIDX_DIR_L1, "dram", 0, k);
    assert_placements(d, k, "a/l1/dram/0/3 a/l2/fs/0/3");
    kvidx_directory_free(d);
}

Test(directory_identity, shared_placements_are_fleet_wide)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    store1(d, "a", 1, 1, KVIDX_DIR_L2, "s3", 1, k);
    store1(d, "b", 7, 1, KVIDX_DIR_L2, "s3", 1, k);
    assert_placements(d, k, "b/l2/s3/1/7");
    /* A private placement on the same backend is another identity. */
    store1(d, "a", 1, 2, KVIDX_DIR_L2, "s3", 0, k);
    assert_placements(d, k, "a/l2/s3/0/1 b/l2/s3/1/7");
    /* Any instance's shared delete removes the shared placement. */
    delete1(d, "c", 1, 1, KVIDX_DIR_L2, "s3", 1, k);
    assert_placements(d, k, "a/l2/s3/0/1");
    kvidx_directory_free(d);
}

Test(directory_identity, store_replaces_size_and_incarnation)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    kvidx_dir_entry_t e = mkentry(k, 100);
    ingest(d, mkbatch("a", 1, 1, KVIDX_DIR_STORE, KVIDX_DIR_L2, "fs", &e, 1));
    e.size_bytes = 250;
    ingest(d, mkbatch("a", 2, 1, KVIDX_DIR_STORE, KVIDX_DIR_L2, "fs", &e, 1));
    kvidx_dir_row_t row;
    cr_assert_eq(kvidx_directory_lookup(d, &k, &row), 0);
    cr_assert_eq(row.num_placements, 1);
    kvidx_dir_placement_t p;
    cr_assert(kvidx_directory_row_next(&row, &p));
    cr_assert_eq(p.size_bytes, 250);
    cr_assert_eq(p.incarnation, 2);
    cr_assert_not(kvidx_directory_row_next(&row, &p));
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.bytes[1], 250);
    kvidx_directory_free(d);
}

/* ---- delete and access ---- */

Test(directory_delete, last_placement_forgets_the_key)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "salt", 0, 0, 1);
    store1(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 0, k);
    store1(d, "a", 1, 2, KVIDX_DIR_L2, "fs", 0, k);
    delete1(d, "a", 1, 3, KVIDX_DIR_L1, "dram", 0, k);
    assert_placements(d, k, "a/l2/fs/0/1");
    delete1(d, "a", 1, 4, KVIDX_DIR_L1, "dram", 0, k); /* absent: a no-op */
    delete1(d, "a", 1, 5, KVIDX_DIR_L2, "nosuch", 0, k);
    assert_placements(d, k, "a/l2/fs/0/1");
    delete1(d, "a", 1, 6, KVIDX_DIR_L2, "fs", 0, k);
    assert_placements(d, k, "-");
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.num_keys, 0);
    cr_assert_eq(st.num_placements, 0);
    delete1(d, "a", 1, 7, KVIDX_DIR_L2, "fs", 0, k);
    kvidx_directory_free(d);
}

Test(directory_access, raises_last_access_and_never_creates)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1), absent = mkkey("m", "", 0, 0, 2);
    kvidx_dir_entry_t e = mkentry(k, 10);
    kvidx_dir_batch_t b = mkbatch("a", 1, 1, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", &e, 1);
    b.ts = 100.5;
    ingest(d, b);
    kvidx_dir_row_t row;
    cr_assert_eq(kvidx_directory_lookup(d, &k, &row), 0);
    cr_assert_eq(row.last_access, 100.5, "a store raises last_access too (LMCache)");
    kvidx_dir_entry_t acc[2] = {mkentry(k, 0), mkentry(absent, 0)};
    b = mkbatch("a", 1, 2, KVIDX_DIR_ACCESS, KVIDX_DIR_L1, "", acc, 2);
    b.ts = 200;
    ingest(d, b);
    cr_assert_eq(kvidx_directory_lookup(d, &k, &row), 0);
    cr_assert_eq(row.last_access, 200);
    cr_assert_eq(kvidx_directory_lookup(d, &absent, &row), KVIDX_ENOTFOUND);
    b.seq = 3;
    b.ts = 150; /* never lowered */
    ingest(d, b);
    cr_assert_eq(kvidx_directory_lookup(d, &k, &row), 0);
    cr_assert_eq(row.last_access, 200);
    kvidx_directory_free(d);
}

/* ---- token bindings ---- */

static void store_tokens(kvidx_directory_t *d, const char *inst, uint64_t seq, kvidx_key_t k,
                         const uint32_t *tok, size_t n, int64_t offset)
{
    kvidx_dir_entry_t e = mkentry(k, 10);
    e.token_ids = tok;
    e.num_tokens = n;
    e.token_offset = offset;
    ingest(d, mkbatch(inst, 1, seq, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", &e, 1));
}

static size_t tokens_of(const kvidx_directory_t *d, kvidx_key_t k, uint32_t *first)
{
    const uint32_t *t;
    size_t n;
    int64_t off;
    if (!kvidx_directory_tokens(d, k.hash, k.hash_len, &t, &n, &off))
        return 0;
    if (first)
        *first = t[0];
    return n;
}

Test(directory_tokens, last_non_empty_wins_and_ranks_share_it)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t r0 = mkkey("m", "", 0, 0, 1), r1 = mkkey("m", "", 1, 0, 1);
    uint32_t t1[] = {1, 2, 3}, t2[] = {7, 8};
    store_tokens(d, "a", 1, r0, t1, 3, 0);
    uint32_t first = 0;
    cr_assert_eq(tokens_of(d, r1, &first), 3, "bound by chunk hash, whatever the rank");
    store_tokens(d, "a", 2, r1, NULL, 0, -1);
    cr_assert_eq(tokens_of(d, r0, &first), 3, "an empty store leaves the binding");
    cr_assert_eq(first, 1);
    store_tokens(d, "a", 3, r1, t2, 2, 256);
    cr_assert_eq(tokens_of(d, r0, &first), 2);
    cr_assert_eq(first, 7);
    kvidx_dir_row_t row;
    cr_assert_eq(kvidx_directory_lookup(d, &r0, &row), 0);
    cr_assert_eq(row.num_tokens, 2);
    cr_assert_eq(row.token_offset, 256);
    /* A key that is absent still sees its chunk's tokens (LMCache's
     * get_token_ids is by chunk hash). */
    kvidx_key_t r2 = mkkey("m", "", 2, 0, 1);
    cr_assert_eq(kvidx_directory_lookup(d, &r2, &row), KVIDX_ENOTFOUND);
    cr_assert_eq(row.num_tokens, 2);
    kvidx_directory_free(d);
}

Test(directory_tokens, freed_with_the_last_key_of_the_hash)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t a = mkkey("m", "", 0, 0, 1), b = mkkey("other", "s", 3, 1, 1);
    uint32_t t[] = {5, 6};
    store_tokens(d, "a", 1, a, t, 2, 0);
    store_tokens(d, "a", 2, b, NULL, 0, -1);
    delete1(d, "a", 1, 3, KVIDX_DIR_L1, "dram", 0, a);
    cr_assert_eq(tokens_of(d, a, NULL), 2, "b still holds the chunk hash");
    delete1(d, "a", 1, 4, KVIDX_DIR_L1, "dram", 0, b);
    cr_assert_eq(tokens_of(d, a, NULL), 0);
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.bindings, 0);
    cr_assert_eq(st.token_bytes, 0);
    /* A new key of that hash starts without tokens. */
    store_tokens(d, "a", 5, a, NULL, 0, -1);
    cr_assert_eq(tokens_of(d, a, NULL), 0);
    kvidx_directory_free(d);
}

Test(directory_tokens, cap_drops_oldest_first_and_counts)
{
    /* Each 4-token binding costs 24 + 16 = 40 bytes: room for three. */
    kvidx_directory_t *d = fresh(3 * (KVIDX_DIR_BINDING_OVERHEAD + 16));
    kvidx_key_t k[5];
    uint32_t t[4] = {1, 2, 3, 4};
    for (unsigned i = 0; i < 4; i++) {
        k[i] = mkkey("m", "", 0, 0, 10 + i);
        t[0] = i;
        store_tokens(d, "a", i + 1, k[i], t, 4, 0);
    }
    cr_assert_eq(tokens_of(d, k[0], NULL), 0, "the oldest went");
    for (unsigned i = 1; i < 4; i++)
        cr_assert_eq(tokens_of(d, k[i], NULL), 4);
    /* Rewriting k[1] (same tokens) makes it the newest: k[2] goes next. */
    t[0] = 1;
    store_tokens(d, "a", 5, k[1], t, 4, 0);
    k[4] = mkkey("m", "", 0, 0, 99);
    store_tokens(d, "a", 6, k[4], t, 4, 0);
    cr_assert_eq(tokens_of(d, k[2], NULL), 0);
    cr_assert_eq(tokens_of(d, k[1], NULL), 4);
    cr_assert_eq(tokens_of(d, k[3], NULL), 4);
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.bindings_dropped, 2);
    cr_assert_eq(st.tokens_dropped, 8);
    cr_assert_eq(st.bindings, 3);
    cr_assert_eq(st.token_bytes, 120);
    /* The keys themselves stay. */
    assert_placements(d, k[0], "a/l1/dram/0/1");
    /* A binding larger than the whole cap is dropped at once (and counted)
     * without pushing the others out. */
    uint32_t big[64] = {0};
    store_tokens(d, "a", 7, k[0], big, 64, 0);
    cr_assert_eq(tokens_of(d, k[0], NULL), 0);
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.bindings, 3);
    cr_assert_eq(st.bindings_dropped, 3);
    cr_assert_eq(st.tokens_dropped, 72);
    /* ... and it takes the older content of its chunk with it. */
    store_tokens(d, "a", 8, k[3], big, 64, 0);
    cr_assert_eq(tokens_of(d, k[3], NULL), 0);
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.bindings, 2);
    cr_assert_eq(st.bindings_dropped, 5);
    kvidx_directory_set_token_cap(d, 40);
    ok(d);
    kvidx_directory_stats(d, &st);
    cr_assert_eq(st.bindings, 1);
    cr_assert_eq(tokens_of(d, k[4], NULL), 4, "the newest stays");
    kvidx_directory_free(d);
}

/* ---- instances ---- */

static kvidx_dir_instance_t inst_reg(const char *id, uint64_t now_ms)
{
    kvidx_dir_instance_t x = {.instance_id = id,
                              .instance_len = strlen(id),
                              .ip = "10.0.0.1",
                              .ip_len = 8,
                              .http_port = 8080,
                              .metadata = "{}",
                              .metadata_len = 2,
                              .registration_time = 1.5,
                              .last_seen_ms = now_ms};
    return x;
}

static int collect_ids(void *ctx, const kvidx_dir_instance_t *in)
{
    tb_bytes(ctx, in->instance_id, in->instance_len);
    tb_printf(ctx, ";");
    return 0;
}

static char *registered(const kvidx_directory_t *d)
{
    tbuf_t b = {0};
    tb_printf(&b, "%s", "");
    kvidx_directory_instances(d, collect_ids, &b);
    return b.s;
}

Test(directory_instances, register_heartbeat_deregister)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_dir_instance_t x = inst_reg("b", 0);
    int re = -1;
    cr_assert_eq(kvidx_directory_register(d, &x, &re), 0);
    cr_assert_eq(re, 0);
    x = inst_reg("a", 0);
    cr_assert_eq(kvidx_directory_register(d, &x, &re), 0);
    x.http_port = 9090;
    cr_assert_eq(kvidx_directory_register(d, &x, &re), 0);
    cr_assert_eq(re, 1);
    ok(d);
    char *ids = registered(d);
    cr_assert_str_eq(ids, "b;a;", "registration order, kept by a re-registration");
    free(ids);
    kvidx_dir_instance_t got;
    cr_assert_eq(kvidx_directory_instance(d, "a", 1, &got), 0);
    cr_assert_eq(got.http_port, 9090);
    cr_assert_eq(kvidx_directory_heartbeat(d, "a", 1, 500), 0);
    cr_assert_eq(kvidx_directory_heartbeat(d, "zz", 2, 500), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_directory_deregister(d, "b", 1), 0);
    cr_assert_eq(kvidx_directory_deregister(d, "b", 1), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_directory_heartbeat(d, "b", 1, 500), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_directory_instance_count(d), 1);
    x.http_port = 0;
    cr_assert_eq(kvidx_directory_register(d, &x, NULL), KVIDX_EINVAL);
    x = inst_reg("c", 0);
    x.ip_len = 0;
    cr_assert_eq(kvidx_directory_register(d, &x, NULL), KVIDX_EINVAL);
    ok(d);
    kvidx_directory_free(d);
}

Test(directory_instances, expiry_fences_and_forgets_the_cursor)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t l1 = mkkey("m", "", 0, 0, 1), l2 = mkkey("m", "", 0, 0, 2);
    kvidx_dir_instance_t x = inst_reg("a", 1000);
    cr_assert_eq(kvidx_directory_register(d, &x, NULL), 0);
    x = inst_reg("b", 1000);
    cr_assert_eq(kvidx_directory_register(d, &x, NULL), 0);
    store1(d, "a", 5, 1, KVIDX_DIR_L1, "dram", 0, l1);
    store1(d, "a", 5, 2, KVIDX_DIR_L2, "fs", 0, l2);
    store1(d, "b", 5, 1, KVIDX_DIR_L1, "dram", 0, l1);
    cr_assert_eq(kvidx_directory_heartbeat(d, "b", 1, 20000), 0);
    size_t n = 9;
    kvidx_directory_expire(d, 31000, 30000, &n);
    cr_assert_eq(n, 0, "silent for exactly the timeout is not yet expired");
    kvidx_directory_expire(d, 31001, 30000, &n);
    cr_assert_eq(n, 1);
    ok(d);
    assert_placements(d, l1, "b/l1/dram/0/5");
    assert_placements(d, l2, "a/l2/fs/0/5");
    cr_assert_not(stream_of(d, "a").found, "the cursor is forgotten");
    cr_assert_eq(kvidx_directory_heartbeat(d, "a", 1, 31001), KVIDX_ENOTFOUND);
    /* A restarted stream may begin at any incarnation, even a lower one. */
    cr_assert_eq(store1(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 0, l1), KVIDX_DIR_ADMITTED);
    assert_placements(d, l1, "a/l1/dram/0/1 b/l1/dram/0/5");
    /* Deregistration drops the stream too. */
    cr_assert_eq(kvidx_directory_deregister(d, "b", 1), 0);
    ok(d);
    assert_placements(d, l1, "a/l1/dram/0/1");
    cr_assert_not(stream_of(d, "b").found);
    kvidx_directory_free(d);
}

/* ---- declarations ---- */

static kvidx_dir_verdict_t config(kvidx_directory_t *d, const char *inst, uint64_t inc,
                                  uint64_t seq, kvidx_dir_tier_t tier, const char *backend,
                                  uint64_t rev, uint64_t cap)
{
    kvidx_dir_batch_t b = mkbatch(inst, inc, seq, KVIDX_DIR_CONFIG, tier, backend, NULL, 0);
    b.capacity_revision = rev;
    b.capacity_bytes = cap;
    return ingest(d, b);
}

static int capacity_line(void *ctx, const kvidx_dir_capacity_t *c)
{
    tbuf_t *b = ctx;
    tb_bytes(b, c->instance_id, c->instance_len);
    tb_printf(b, ":%llu/%llu:%s:", (unsigned long long)c->incarnation,
              (unsigned long long)c->capacity_revision, tier_name(c->tier));
    tb_bytes(b, c->backend, c->backend_len);
    tb_printf(b, "=%llu ", (unsigned long long)c->capacity_bytes);
    return 0;
}

static char *capacities(const kvidx_directory_t *d)
{
    tbuf_t b = {0};
    tb_printf(&b, "%s", "");
    kvidx_directory_capacities(d, capacity_line, &b);
    return b.s;
}

#define assert_caps(d, want)                                                                       \
    do {                                                                                           \
        char *got_ = capacities(d);                                                                \
        cr_assert_str_eq(got_, want);                                                              \
        free(got_);                                                                                \
    } while (0)

Test(directory_config, declarations_group_by_stamp)
{
    kvidx_directory_t *d = fresh(0);
    config(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 1, 100);
    config(d, "a", 1, 2, KVIDX_DIR_L2, "fs", 1, 0);
    assert_caps(d, "a:1/1:l1:dram=100 a:1/1:l2:fs=0 ");
    config(d, "a", 1, 3, KVIDX_DIR_L1, "dram", 1, 150); /* same stamp: the last wins */
    assert_caps(d, "a:1/1:l1:dram=150 a:1/1:l2:fs=0 ");
    config(d, "a", 1, 4, KVIDX_DIR_L1, "dram", 2, 200); /* newer: a fresh set */
    assert_caps(d, "a:1/2:l1:dram=200 ");
    config(d, "a", 1, 5, KVIDX_DIR_L2, "fs", 1, 7); /* a straggler */
    assert_caps(d, "a:1/2:l1:dram=200 ");
    config(d, "a", 2, 1, KVIDX_DIR_L2, "fs", 1, 9); /* new incarnation, revision restarts */
    assert_caps(d, "a:2/1:l2:fs=9 ");
    kvidx_dir_batch_t b = mkbatch("a", 2, 2, KVIDX_DIR_CONFIG, KVIDX_DIR_L2, "fs", NULL, 0);
    kvidx_dir_entry_t e = mkentry(mkkey("m", "", 0, 0, 1), 1);
    b.entries = &e;
    b.num_entries = 1;
    cr_assert_eq(kvidx_directory_ingest(d, &b, NULL), KVIDX_EINVAL);
    cr_assert_eq(kvidx_directory_deregister(d, "a", 1), KVIDX_ENOTFOUND);
    kvidx_dir_instance_t x = inst_reg("a", 0);
    cr_assert_eq(kvidx_directory_register(d, &x, NULL), 0);
    cr_assert_eq(kvidx_directory_deregister(d, "a", 1), 0);
    assert_caps(d, "");
    ok(d);
    kvidx_directory_free(d);
}

/* ---- validation ---- */

Test(directory_check, batch_rules)
{
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    kvidx_dir_entry_t e = mkentry(k, 1);
    kvidx_dir_batch_t b = mkbatch("a", 0, 1, KVIDX_DIR_STORE, KVIDX_DIR_L1, "dram", &e, 1);
    kvidx_reason_t why;
    size_t bad;
    cr_assert_eq(kvidx_directory_batch_check(&b, &bad, &why), 0);
    kvidx_dir_batch_t x = b;
    x.instance_len = 0;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "instance_id");
    cr_assert_eq(bad, SIZE_MAX);
    x = b;
    x.seq = 0;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "seq");
    x = b;
    x.backend_len = 0;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "backend");
    x.event_type = KVIDX_DIR_ACCESS;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), 0, "access may name no backend");
    x = b;
    x.tier = KVIDX_DIR_ALL;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "tier");
    x = b;
    x.ts = -1;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "ts");
    kvidx_dir_entry_t es[2] = {e, e};
    es[1].token_offset = -2;
    x = b;
    x.entries = es;
    x.num_entries = 2;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "token_offset");
    cr_assert_eq(bad, 1);
    es[1] = e;
    es[1].key.model = "bad@model";
    es[1].key.model_len = 9;
    cr_assert_eq(kvidx_directory_batch_check(&x, &bad, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "model_name");
    cr_assert_eq(bad, 1);
    /* A rejected batch changes nothing, not even the gate. */
    kvidx_directory_t *d = fresh(0);
    cr_assert_eq(kvidx_directory_ingest(d, &x, NULL), KVIDX_EINVAL);
    cr_assert_not(stream_of(d, "a").found);
    ok(d);
    kvidx_directory_free(d);
}

/* ---- reads ---- */

static int list_line(void *ctx, kvidx_dir_row_t *row)
{
    tbuf_t *b = ctx;
    tb_key(b, &row->key);
    tb_printf(b, "[%zu] ", row->num_placements);
    return 0;
}

Test(directory_read, list_orders_filters_and_counts)
{
    kvidx_directory_t *d = fresh(0);
    /* Canonical order: salt, model, rank, group, hash. */
    kvidx_key_t ks[] = {mkkey_len("m", "z", 0, 0, 1, 2), mkkey_len("m", "", 1, 0, 1, 2),
                        mkkey_len("b", "", 9, 9, 1, 2),  mkkey_len("m", "", 0, 1, 1, 2),
                        mkkey_len("m", "", 0, 0, 2, 2),  mkkey_len("m", "", 0, 0, 1, 2),
                        mkkey_len("m", "", 0, 0, 1, 1)};
    for (size_t i = 0; i < 7; i++)
        store1(d, i % 2 ? "a" : "b", 1, i / 2 + 1, i % 3 ? KVIDX_DIR_L1 : KVIDX_DIR_L2,
               i % 3 ? "dram" : "fs", 0, ks[i]);
    tbuf_t b = {0};
    uint64_t total = 0;
    tb_printf(&b, "%s", "");
    cr_assert_eq(kvidx_directory_list(d, NULL, 0, 100, list_line, &b, &total), 0);
    cr_assert_eq(total, 7);
    cr_assert_str_eq(b.s, "|b|9|9|0126[1] |m|0|0|01[1] |m|0|0|0126[1] |m|0|0|0245[1] "
                          "|m|0|1|0126[1] |m|1|0|0126[1] z|m|0|0|0126[1] ");
    b.len = 0;
    cr_assert_eq(kvidx_directory_list(d, NULL, 2, 2, list_line, &b, &total), 0);
    cr_assert_eq(total, 7);
    cr_assert_str_eq(b.s, "|m|0|0|0126[1] |m|0|0|0245[1] ");
    kvidx_dir_filter_t f = {.tier = KVIDX_DIR_L2};
    b.len = 0;
    cr_assert_eq(kvidx_directory_list(d, &f, 0, 1, list_line, &b, &total), 0);
    cr_assert_eq(total, 3, "ks[0], ks[3], ks[6] are L2");
    cr_assert_str_eq(b.s, "|m|0|0|01[1] ");
    f = (kvidx_dir_filter_t){
        .instance_id = "a", .instance_len = 1, .backend = "dram", .backend_len = 4};
    cr_assert_eq(kvidx_directory_list(d, &f, 0, 0, list_line, &b, &total), 0);
    cr_assert_eq(total, 2, "ks[1], ks[5]");
    f.backend = "nosuch";
    f.backend_len = 6;
    cr_assert_eq(kvidx_directory_list(d, &f, 0, 10, list_line, &b, &total), 0);
    cr_assert_eq(total, 0);
    free(b.s);
    kvidx_directory_free(d);
}

Test(directory_read, lookup_sorts_placements)
{
    kvidx_directory_t *d = fresh(0);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    store1(d, "zeta", 1, 1, KVIDX_DIR_L2, "fs", 0, k);
    store1(d, "alpha", 1, 1, KVIDX_DIR_L2, "s3", 0, k);
    store1(d, "alpha", 1, 2, KVIDX_DIR_L2, "fs", 0, k);
    store1(d, "alpha", 1, 3, KVIDX_DIR_L1, "dram", 0, k);
    store1(d, "mid", 1, 1, KVIDX_DIR_L2, "fs", 1, k);
    assert_placements(d, k,
                      "alpha/l1/dram/0/1 alpha/l2/fs/0/1 alpha/l2/s3/0/1 mid/l2/fs/1/1 "
                      "zeta/l2/fs/0/1");
    /* The shared placement moves when another reporter takes it over. */
    store1(d, "aaa", 1, 1, KVIDX_DIR_L2, "fs", 1, k);
    assert_placements(d, k,
                      "aaa/l2/fs/1/1 alpha/l1/dram/0/1 alpha/l2/fs/0/1 alpha/l2/s3/0/1 "
                      "zeta/l2/fs/0/1");
    kvidx_directory_free(d);
}

typedef struct scan_ctx {
    kvidx_key_t seen[512];
    char strs[512][2][16];
    size_t n;
} scan_ctx_t;

static int scan_collect(void *ctx, kvidx_dir_row_t *row)
{
    scan_ctx_t *c = ctx;
    cr_assert_lt(c->n, 512);
    kvidx_key_t *k = &c->seen[c->n];
    *k = row->key;
    memcpy(c->strs[c->n][0], row->key.model, row->key.model_len);
    memcpy(c->strs[c->n][1], row->key.salt, row->key.salt_len);
    k->model = c->strs[c->n][0];
    k->salt = c->strs[c->n][1];
    c->n++;
    return 0;
}

Test(directory_read, scan_returns_each_surviving_key_once_under_mutation)
{
    kvidx_directory_t *d = fresh(0);
    const char *models[] = {"ma", "mb", "mc"};
    unsigned seed = 12345;
    uint64_t seq = 1;
    int present[300] = {0};
    /* Keys 0..299; those below 150 are never deleted. */
    for (unsigned i = 0; i < 300; i += 2) {
        store1(d, "a", 1, seq++, KVIDX_DIR_L2, "fs", 0, mkkey(models[i % 3], "", i % 4, 0, i));
        present[i] = 1;
    }
    scan_ctx_t *c = calloc(1, sizeof(*c));
    kvidx_key_t after, resume;
    char after_model[16], after_salt[16];
    const kvidx_key_t *ap = NULL;
    int more = 1, pages = 0;
    while (more) {
        size_t before = c->n;
        cr_assert_eq(kvidx_directory_scan(d, NULL, ap, 7, 20, scan_collect, c, &resume, &more), 0);
        pages++;
        if (more) {
            after = resume;
            memcpy(after_model, resume.model, resume.model_len);
            memcpy(after_salt, resume.salt, resume.salt_len);
            after.model = after_model;
            after.salt = after_salt;
            ap = &after;
        }
        (void)before;
        /* Mutate between pages: insert odd keys, delete some of 150..299. */
        for (int j = 0; j < 10; j++) {
            seed = seed * 1103515245 + 12345;
            unsigned i = (seed >> 8) % 300;
            kvidx_key_t k = mkkey(models[i % 3], "", i % 4, 0, i);
            if (i >= 150 && present[i]) {
                delete1(d, "a", 1, seq++, KVIDX_DIR_L2, "fs", 0, k);
                present[i] = 0;
            } else if (!present[i]) {
                store1(d, "a", 1, seq++, KVIDX_DIR_L2, "fs", 0, k);
                present[i] = 1;
            }
        }
    }
    cr_assert_gt(pages, 5);
    for (size_t i = 1; i < c->n; i++)
        cr_assert_lt(kvidx_key_cmp(&c->seen[i - 1], &c->seen[i]), 0, "strictly ascending");
    for (unsigned i = 0; i < 150; i += 2) {
        kvidx_key_t k = mkkey(models[i % 3], "", i % 4, 0, i);
        size_t hits = 0;
        for (size_t j = 0; j < c->n; j++)
            hits += kvidx_key_equal(&k, &c->seen[j]);
        cr_assert_eq(hits, 1, "key %u seen %zu times", i, hits);
    }
    free(c);
    kvidx_directory_free(d);
}

/* ---- score ---- */

Test(directory_score, every_rank_rule_windows_and_shared)
{
    kvidx_directory_t *d = fresh(0);
    /* 2 groups x 4 chunks x 2 ranks; group 1 has a window of 1 chunk. */
    int64_t windows[2] = {-1, 1};
    kvidx_fold_shape_t shape = {windows, 2, 4, 2};
    kvidx_key_t keys[16];
    for (unsigned g = 0; g < 2; g++)
        for (unsigned c = 0; c < 4; c++)
            for (unsigned r = 0; r < 2; r++)
                keys[g * 8 + c * 2 + r] = mkkey("m", "", r, (uint16_t)g, 100 + c);
    uint64_t seq = 1;
    /* "a": group 0 chunks 0..2 in L1 on both ranks, chunk 3 on rank 0 only;
     * group 1 chunk 2 on both ranks -> servable prefix 3 from L1. */
    for (unsigned c = 0; c < 3; c++)
        for (unsigned r = 0; r < 2; r++)
            store1(d, "a", 1, seq++, KVIDX_DIR_L1, "dram", 0, keys[c * 2 + r]);
    store1(d, "a", 1, seq++, KVIDX_DIR_L1, "dram", 0, keys[3 * 2]);
    store1(d, "a", 1, seq++, KVIDX_DIR_L1, "dram", 0, keys[8 + 2 * 2]);
    store1(d, "a", 1, seq++, KVIDX_DIR_L1, "dram", 0, keys[8 + 2 * 2 + 1]);
    /* "b": everything of group 0 in L2, group 1 chunk 3 in L1 only. */
    for (unsigned c = 0; c < 4; c++)
        for (unsigned r = 0; r < 2; r++)
            store1(d, "b", 1, seq++, KVIDX_DIR_L2, "fs", 0, keys[c * 2 + r]);
    store1(d, "b", 1, seq++, KVIDX_DIR_L1, "dram", 0, keys[8 + 3 * 2]);
    store1(d, "b", 1, seq++, KVIDX_DIR_L1, "dram", 0, keys[8 + 3 * 2 + 1]);
    /* Shared storage: chunk 0 of group 0, both ranks, and group 1 chunk 0. */
    store1(d, "c", 1, 1, KVIDX_DIR_L2, "s3", 1, keys[0]);
    store1(d, "c", 1, 2, KVIDX_DIR_L2, "s3", 1, keys[1]);
    store1(d, "c", 1, 3, KVIDX_DIR_L2, "s3", 1, keys[8]);
    store1(d, "c", 1, 4, KVIDX_DIR_L2, "s3", 1, keys[9]);
    kvidx_dir_score_t *s;
    size_t n;
    cr_assert_eq(kvidx_directory_score(d, keys, 16, &shape, &s, &n), 0);
    cr_assert_eq(n, 3, "a, b and shared storage (c holds only shared placements)");
    cr_assert_eq(s[0].any_chunks, 4);
    cr_assert_eq(s[0].instance_len, 1);
    cr_assert_eq(s[0].instance_id[0], 'b');
    cr_assert_eq(s[0].l1_chunks, 0);
    cr_assert_eq(s[0].l2_chunks, 0, "group 1's window chunk is only in L1");
    cr_assert_eq(s[1].instance_id[0], 'a');
    cr_assert_eq(s[1].l1_chunks, 3);
    cr_assert_eq(s[1].any_chunks, 3);
    cr_assert_eq(s[1].l2_chunks, 0);
    cr_assert(s[2].shared);
    cr_assert_null(s[2].instance_id);
    cr_assert_eq(s[2].l2_chunks, 1);
    cr_assert_eq(s[2].any_chunks, 1);
    kvidx_directory_score_free(s);
    cr_assert_eq(kvidx_directory_score(d, keys, 15, &shape, &s, &n), KVIDX_EINVAL);
    cr_assert_eq(kvidx_directory_score(d, keys, 0, &(kvidx_fold_shape_t){windows, 1, 0, 2}, &s, &n),
                 0);
    cr_assert_eq(n, 0);
    kvidx_directory_free(d);
}

/* ---- persistence and changes ---- */

static int load_into(void *ctx, const kvidx_dir_record_t *r)
{
    cr_assert_eq(kvidx_directory_load(ctx, r), 0, "record type %d", r->type);
    return 0;
}

Test(directory_persist, dump_and_load_give_an_equal_directory)
{
    kvidx_directory_t *d = fresh(1000);
    kvidx_dir_instance_t x = inst_reg("a", 77);
    cr_assert_eq(kvidx_directory_register(d, &x, NULL), 0);
    uint32_t t1[] = {1, 2, 3}, t2[] = {4};
    store_tokens(d, "a", 1, mkkey("m", "s", 0, 0, 1), t1, 3, 0);
    store_tokens(d, "a", 2, mkkey("m", "", 1, 2, 2), t2, 1, 256);
    store_tokens(d, "a", 3, mkkey("m", "", 1, 3, 1), NULL, 0, -1);
    store1(d, "b", 4, 9, KVIDX_DIR_L2, "s3", 1, mkkey("m", "", 1, 3, 1));
    config(d, "b", 4, 10, KVIDX_DIR_L1, "dram", 3, 1 << 20);
    char *before = dir_text(d);
    kvidx_directory_t *e = fresh(1000);
    cr_assert_eq(kvidx_directory_dump(d, load_into, e), 0);
    ok(e);
    char *after = dir_text(e);
    cr_assert_str_eq(after, before);
    kvidx_dir_record_t dup;
    memset(&dup, 0, sizeof(dup));
    dup.type = KVIDX_DIR_REC_KEY;
    dup.key.key = mkkey("m", "s", 0, 0, 1);
    kvidx_dir_placement_t p[2] = {{"a", 1, 1, KVIDX_DIR_L1, "dram", 4, 5, 0},
                                  {"a", 1, 1, KVIDX_DIR_L1, "dram", 4, 5, 0}};
    dup.key.placements = p;
    dup.key.num_placements = 1;
    cr_assert_eq(kvidx_directory_load(e, &dup), KVIDX_ECONFLICT, "the key exists");
    dup.key.key = mkkey("m", "s", 0, 0, 77);
    dup.key.num_placements = 2;
    cr_assert_eq(kvidx_directory_load(e, &dup), KVIDX_ECONFLICT, "one identity twice");
    ok(e);
    free(before);
    free(after);
    kvidx_directory_free(d);
    kvidx_directory_free(e);
}

typedef struct change_log {
    int n[8];
    kvidx_dir_verdict_t last;
} change_log_t;

static void on_change(void *ctx, const kvidx_dir_change_t *c)
{
    change_log_t *l = ctx;
    l->n[c->type]++;
    if (c->type == KVIDX_DIR_CHG_BATCH)
        l->last = c->verdict;
}

Test(directory_persist, change_callback_reports_every_change)
{
    kvidx_directory_t *d = fresh(0);
    change_log_t log = {0};
    kvidx_directory_on_change(d, on_change, &log);
    kvidx_key_t k = mkkey("m", "", 0, 0, 1);
    store1(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 0, k);
    store1(d, "a", 1, 1, KVIDX_DIR_L1, "dram", 0, k);
    cr_assert_eq(log.n[KVIDX_DIR_CHG_BATCH], 2);
    cr_assert_eq(log.last, KVIDX_DIR_DUPLICATE);
    kvidx_dir_instance_t x = inst_reg("a", 0);
    kvidx_directory_register(d, &x, NULL);
    kvidx_directory_heartbeat(d, "a", 1, 5);
    kvidx_directory_expire(d, 100, 10, NULL);
    kvidx_directory_set_token_cap(d, 10);
    cr_assert_eq(log.n[KVIDX_DIR_CHG_REGISTER], 1);
    cr_assert_eq(log.n[KVIDX_DIR_CHG_HEARTBEAT], 1);
    cr_assert_eq(log.n[KVIDX_DIR_CHG_EXPIRE], 1);
    cr_assert_eq(log.n[KVIDX_DIR_CHG_TOKEN_CAP], 1);
    kvidx_directory_free(d);
}
