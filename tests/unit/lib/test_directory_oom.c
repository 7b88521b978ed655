/* The fleet directory when memory runs out: a workload of every kind of
 * mutation is run with the Nth allocation failing, for every N until it
 * completes. The failing call must answer KVIDX_ENOMEM and leave the state
 * exactly as it was (same dump, invariants hold); the workload then goes on
 * with memory back, and must end in the same state as a run that never
 * failed. */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/directory.h"
#include "kvidx/err.h"

#include "directory_text.h"

static long budget = -1; /* allocations left; -1: unlimited */
static int paused;

static void *fail_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (!paused && budget >= 0 && budget-- == 0)
        return NULL;
    return malloc(n);
}

static void *fail_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (!paused && budget >= 0 && budget-- == 0)
        return NULL;
    return realloc(p, n);
}

static void plain_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static const kvidx_allocator_t failing = {fail_malloc, fail_realloc, plain_free, NULL};

/* ---- the workload: each step is one mutating call ---- */

static uint32_t toks[300][4];

static int w_store(kvidx_directory_t *d, int step)
{
    static const char *models[] = {"m", "m/x", "other"};
    static const char *salts[] = {"", "s", "t"};
    static const uint8_t lens[] = {8, 32, 64, 1, 17};
    kvidx_dir_entry_t e[300];
    size_t n = step == 0 ? 300 : 5;
    for (size_t i = 0; i < n; i++) {
        unsigned h = (unsigned)(i + (size_t)step * 3);
        e[i] = mkentry(
            mkkey_len(models[i % 3], salts[(i / 3) % 3], (uint32_t)(i % 2), 0, h, lens[h % 5]),
            100 + i);
        if (i % 2 == 0) {
            for (int j = 0; j < 4; j++)
                toks[i][j] = (uint32_t)(h + (unsigned)j + (unsigned)step);
            e[i].token_ids = toks[i];
            e[i].num_tokens = 1 + i % 4;
            e[i].token_offset = (int64_t)i;
        }
    }
    const char *inst = step % 2 ? "b" : "a";
    kvidx_dir_batch_t b =
        mkbatch(inst, step >= 4 ? 2 : 1, (uint64_t)step + 1, KVIDX_DIR_STORE,
                step % 3 ? KVIDX_DIR_L1 : KVIDX_DIR_L2, step % 3 == 2 ? "cxl" : "dram", e, n);
    b.shared = step == 2;
    b.ts = step;
    return kvidx_directory_ingest(d, &b, NULL);
}

static int w_simple(kvidx_directory_t *d, kvidx_dir_event_t ev, const char *inst, uint64_t seq)
{
    kvidx_dir_entry_t e[3] = {mkentry(mkkey_len("m", "", 0, 0, 0, 8), 0),
                              mkentry(mkkey_len("m/x", "s", 1, 0, 1, 32), 0),
                              mkentry(mkkey_len("zzz", "", 0, 0, 2, 64), 0)};
    kvidx_dir_batch_t b =
        mkbatch(inst, 1, seq, ev, KVIDX_DIR_L2, ev == KVIDX_DIR_ACCESS ? "" : "dram", e,
                ev == KVIDX_DIR_CONFIG ? 0 : 3);
    b.capacity_revision = seq;
    b.capacity_bytes = 4096;
    b.ts = 77;
    return kvidx_directory_ingest(d, &b, NULL);
}

static int w_register(kvidx_directory_t *d, const char *id)
{
    kvidx_dir_instance_t x = {.instance_id = id,
                              .instance_len = strlen(id),
                              .ip = "127.0.0.1",
                              .ip_len = 9,
                              .http_port = 80,
                              .p2p_advertised_url = "tcp://p",
                              .p2p_len = 7,
                              .metadata = "{\"a\":\"b\"}",
                              .metadata_len = 9,
                              .registration_time = 3.25,
                              .last_seen_ms = 10};
    return kvidx_directory_register(d, &x, NULL);
}

static kvidx_key_t bound;

static int w_load(kvidx_directory_t *d, int which)
{
    kvidx_dir_record_t r;
    memset(&r, 0, sizeof(r));
    kvidx_dir_placement_t p[3] = {{"new1", 4, 7, KVIDX_DIR_L1, "pmem", 4, 10, 0},
                                  {"new2", 4, 1, KVIDX_DIR_L2, "s3", 2, 20, 1},
                                  {"a", 1, 1, KVIDX_DIR_L2, "fs", 2, 30, 0}};
    static const uint32_t tok[] = {9, 8, 7};
    switch (which) {
    case 0:
        r.type = KVIDX_DIR_REC_KEY;
        r.key.key = mkkey_len("loaded", "ls", 3, 5, 200, 40);
        r.key.last_access = 12.5;
        r.key.placements = p;
        r.key.num_placements = 3;
        break;
    case 1:
        r.type = KVIDX_DIR_REC_BINDING;
        bound = mkkey_len("loaded", "ls", 3, 5, 200, 40);
        r.binding.hash = bound.hash;
        r.binding.hash_len = 40;
        r.binding.token_offset = 5;
        r.binding.token_ids = tok;
        r.binding.num_tokens = 3;
        break;
    case 2:
        r.type = KVIDX_DIR_REC_STREAM;
        r.stream = (kvidx_dir_stream_t){"streamonly", 10, 9, 99, 1, 5, 6, 7, 1.5};
        break;
    case 3:
        r.type = KVIDX_DIR_REC_CAPACITY;
        r.capacity = (kvidx_dir_capacity_t){"capsonly", 8, 1, 2, KVIDX_DIR_L1, "hbm", 3, 1000, 0};
        break;
    default:
        r.type = KVIDX_DIR_REC_INSTANCE;
        r.instance = (kvidx_dir_instance_t){"reg2", 4, "::1", 3, 1, 2, "", 0, "{}", 2, 0.5, 3};
        break;
    }
    return kvidx_directory_load(d, &r);
}

static int w_score(kvidx_directory_t *d)
{
    int64_t w[1] = {-1};
    kvidx_fold_shape_t s = {w, 1, 3, 2};
    kvidx_key_t k[6];
    for (unsigned i = 0; i < 6; i++)
        k[i] = mkkey_len("m", "", i % 2, 0, i / 2, 8);
    kvidx_dir_score_t *out;
    size_t n;
    int rc = kvidx_directory_score(d, k, 6, &s, &out, &n);
    if (rc == 0)
        kvidx_directory_score_free(out);
    return rc;
}

#define NSTEPS 22

static int w_step(kvidx_directory_t *d, int i)
{
    switch (i) {
    case 0:
        return w_register(d, "a");
    case 1:
        return w_register(d, "b");
    case 2:
    case 3:
    case 4:
    case 5:
        return w_store(d, i - 2);
    case 6:
        return w_simple(d, KVIDX_DIR_CONFIG, "c", 1);
    case 7:
        return w_simple(d, KVIDX_DIR_CONFIG, "c", 2);
    case 8:
        return w_simple(d, KVIDX_DIR_ACCESS, "d", 1);
    case 9:
        return w_simple(d, KVIDX_DIR_DELETE, "a", 100);
    case 10:
    case 11:
        return w_store(d, i - 6); /* incarnation 2: fences "a" */
    case 12:
    case 13:
    case 14:
    case 15:
    case 16:
        return w_load(d, i - 12);
    case 17:
        return w_score(d);
    case 18:
        kvidx_directory_set_token_cap(d, 600);
        return 0;
    case 19:
        return w_register(d, "a");
    case 20:
        return kvidx_directory_deregister(d, "b", 1);
    default:
        kvidx_directory_expire(d, 100000, 1000, NULL);
        return 0;
    }
}

static char *text(const kvidx_directory_t *d)
{
    paused = 1;
    char *t = dir_text(d);
    cr_assert_eq(kvidx_directory_check(d), 0);
    paused = 0;
    cr_assert_not_null(t);
    return t;
}

static kvidx_directory_t *new_dir(void)
{
    kvidx_dir_options_t o = {.has_seed = 1};
    kvidx_directory_t *d = NULL;
    int rc = kvidx_directory_new(&o, &d);
    cr_assert(rc == 0 || rc == KVIDX_ENOMEM);
    return d;
}

Test(directory_oom, every_failing_allocation_changes_nothing, .timeout = 600)
{
    kvidx_set_allocator(&failing);
    /* The run that never fails. */
    budget = -1;
    kvidx_directory_t *d = new_dir();
    for (int i = 0; i < NSTEPS; i++)
        cr_assert_eq(w_step(d, i), 0, "step %d", i);
    char *want = text(d);
    kvidx_directory_free(d);

    long failures = 0;
    int completed = 0;
    for (long n = 0; !completed; n++) {
        cr_assert_lt(n, 100000, "the workload never completed");
        budget = n;
        d = new_dir();
        if (!d)
            continue;
        int failed = 0;
        for (int i = 0; i < NSTEPS; i++) {
            if (failed) {
                cr_assert_eq(w_step(d, i), 0, "step %d after a failure (n=%ld)", i, n);
                continue;
            }
            char *before = text(d);
            int rc = w_step(d, i);
            if (rc == 0) {
                free(before);
                continue;
            }
            cr_assert_eq(rc, KVIDX_ENOMEM, "step %d (n=%ld)", i, n);
            char *after = text(d);
            cr_assert_str_eq(after, before, "step %d changed the state (n=%ld)", i, n);
            free(before);
            free(after);
            failures++;
            failed = 1;
            budget = -1;
            cr_assert_eq(w_step(d, i), 0, "step %d retried (n=%ld)", i, n);
        }
        completed = !failed;
        char *got = text(d);
        cr_assert_str_eq(got, want, "n=%ld ends elsewhere", n);
        free(got);
        kvidx_directory_free(d);
    }
    cr_assert_gt(failures, 50, "the workload allocates at %ld places only", failures);
    free(want);
    kvidx_set_allocator(NULL);
}
