/*
 * libFuzzer target for the fleet directory: the input is a program of
 * operations (batches of every type with fuzzed gate fields and keys,
 * registrations, heartbeats, deregistrations, expiries, cap changes, reads
 * and scores). After every operation the invariants must hold; at the end
 * a dump loaded into a fresh directory must hold them too and dump alike.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/directory.h"
#include "kvidx/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader_t;

static unsigned take(reader_t *r, unsigned mod)
{
    if (!r->n)
        return 0;
    unsigned v = *r->p++;
    r->n--;
    return mod ? v % mod : v;
}

static const char *names[] = {"a", "ab", "b", "mp-1"};
static const char *backends[] = {"dram", "fs", "cxl", ""};
static const char *models[] = {"m", "m/x"};
static const char *salts[] = {"", "s"};
static const uint8_t hlens[] = {1, 8, 9, 32, 64};

static kvidx_key_t fkey(reader_t *r)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = models[take(r, 2)];
    k.model_len = (uint16_t)strlen(k.model);
    k.salt = salts[take(r, 2)];
    k.salt_len = (uint8_t)strlen(k.salt);
    k.kv_rank = take(r, 3);
    k.group = (uint16_t)take(r, 2);
    k.hash_len = hlens[take(r, 5)];
    unsigned h = take(r, 8);
    for (unsigned i = 0; i < k.hash_len; i++)
        k.hash[i] = (uint8_t)(h + i);
    return k;
}

static void batch(kvidx_directory_t *d, reader_t *r)
{
    kvidx_dir_entry_t e[8];
    uint32_t tok[8][4];
    kvidx_dir_batch_t b;
    memset(&b, 0, sizeof(b));
    b.instance_id = names[take(r, 4)];
    b.instance_len = strlen(b.instance_id);
    b.incarnation = take(r, 4);
    b.seq = take(r, 8);
    b.event_type = (kvidx_dir_event_t)take(r, 4);
    b.tier = (kvidx_dir_tier_t)take(r, 3);
    b.backend = backends[take(r, 4)];
    b.backend_len = strlen(b.backend);
    b.shared = take(r, 4) == 0;
    b.ts = take(r, 0);
    b.capacity_bytes = take(r, 0);
    b.capacity_revision = take(r, 3);
    b.num_entries = b.event_type == KVIDX_DIR_CONFIG ? 0 : take(r, 9);
    for (size_t i = 0; i < b.num_entries; i++) {
        memset(&e[i], 0, sizeof(e[i]));
        e[i].key = fkey(r);
        e[i].size_bytes = take(r, 0);
        e[i].token_offset = (int64_t)take(r, 4) - 1;
        e[i].num_tokens = take(r, 5);
        for (size_t j = 0; j < e[i].num_tokens; j++)
            tok[i][j] = take(r, 3);
        e[i].token_ids = tok[i];
    }
    b.entries = e;
    int valid = kvidx_directory_batch_check(&b, NULL, NULL) == 0;
    kvidx_dir_verdict_t v = valid ? kvidx_directory_classify(d, &b) : KVIDX_DIR_ADMITTED;
    kvidx_dir_verdict_t got;
    int rc = kvidx_directory_ingest(d, &b, &got);
    check(valid ? rc == 0 && got == v : rc == KVIDX_EINVAL);
}

static int count_row(void *ctx, kvidx_dir_row_t *row)
{
    kvidx_dir_placement_t p;
    size_t n = 0;
    while (kvidx_directory_row_next(row, &p))
        n++;
    check(n == row->num_placements && n > 0);
    ++*(size_t *)ctx;
    return 0;
}

static void reads(const kvidx_directory_t *d, reader_t *r)
{
    kvidx_dir_filter_t f = {.tier = (kvidx_dir_tier_t)take(r, 3)};
    f.instance_id = names[take(r, 4)];
    f.instance_len = take(r, 2) ? strlen(f.instance_id) : 0;
    uint64_t total = 0;
    size_t listed = 0, scanned = 0;
    check(kvidx_directory_list(d, &f, 0, UINT64_MAX, count_row, &listed, &total) == 0);
    check(listed == total);
    kvidx_key_t after, resume;
    char m[16], s[16];
    const kvidx_key_t *ap = NULL;
    size_t page = 1 + take(r, 4);
    for (int more = 1; more;) {
        check(kvidx_directory_scan(d, &f, ap, page, 1 + take(r, 4), count_row, &scanned, &resume,
                                   &more) == 0);
        if (more) {
            after = resume;
            memcpy(m, resume.model, resume.model_len);
            memcpy(s, resume.salt, resume.salt_len);
            after.model = m;
            after.salt = s;
            ap = &after;
        }
    }
    check(scanned == listed);
    int64_t w[2] = {-1, 1 + (int64_t)take(r, 3)};
    kvidx_fold_shape_t shape = {w, 1 + take(r, 2), 1 + take(r, 3), 1 + take(r, 2)};
    kvidx_key_t keys[12];
    size_t n = shape.num_groups * shape.num_chunks * shape.num_ranks;
    for (size_t i = 0; i < n; i++)
        keys[i] = fkey(r);
    kvidx_dir_score_t *sc;
    size_t ns;
    check(kvidx_directory_score(d, keys, n, &shape, &sc, &ns) == 0);
    for (size_t i = 0; i < ns; i++)
        check(sc[i].l1_chunks <= sc[i].any_chunks && sc[i].l2_chunks <= sc[i].any_chunks &&
              sc[i].any_chunks <= shape.num_chunks);
    kvidx_directory_score_free(sc);
}

static int load_rec(void *ctx, const kvidx_dir_record_t *rec)
{
    check(kvidx_directory_load(ctx, rec) == 0);
    return 0;
}

static int count_rec(void *ctx, const kvidx_dir_record_t *rec)
{
    (void)rec;
    ++*(size_t *)ctx;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader_t r = {data, size};
    kvidx_dir_options_t o = {.token_bytes_cap = take(&r, 0) * 4, .has_seed = 1};
    kvidx_directory_t *d;
    check(kvidx_directory_new(&o, &d) == 0);
    uint64_t now = 0;
    while (r.n) {
        unsigned op = take(&r, 16);
        const char *id = names[take(&r, 4)];
        now += take(&r, 0) * 100;
        if (op < 8) {
            batch(d, &r);
        } else if (op < 10) {
            kvidx_dir_instance_t x = {id, strlen(id), "h", 1,  1 + take(&r, 0), 0, "", 0,
                                      "", 0,          0.0, now};
            check(kvidx_directory_register(d, &x, NULL) == 0);
        } else if (op == 10) {
            int rc = kvidx_directory_heartbeat(d, id, strlen(id), now);
            check(rc == 0 || rc == KVIDX_ENOTFOUND);
        } else if (op == 11) {
            int rc = kvidx_directory_deregister(d, id, strlen(id));
            check(rc == 0 || rc == KVIDX_ENOTFOUND);
        } else if (op == 12) {
            kvidx_directory_expire(d, now, take(&r, 0) * 50, NULL);
        } else if (op == 13) {
            kvidx_directory_set_token_cap(d, take(&r, 0) * 2);
        } else {
            reads(d, &r);
        }
        check(kvidx_directory_check(d) == 0);
    }
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    kvidx_directory_t *e;
    check(kvidx_directory_new(&o, &e) == 0);
    kvidx_directory_set_token_cap(e, st.token_bytes_cap);
    check(kvidx_directory_dump(d, load_rec, e) == 0);
    check(kvidx_directory_check(e) == 0);
    size_t na = 0, nb = 0;
    check(kvidx_directory_dump(d, count_rec, &na) == 0 &&
          kvidx_directory_dump(e, count_rec, &nb) == 0);
    check(na == nb);
    kvidx_dir_stats_t se;
    kvidx_directory_stats(e, &se);
    check(se.num_keys == st.num_keys && se.num_placements == st.num_placements &&
          se.bindings == st.bindings && se.token_bytes == st.token_bytes);
    kvidx_directory_free(e);
    kvidx_directory_free(d);
    return 0;
}
