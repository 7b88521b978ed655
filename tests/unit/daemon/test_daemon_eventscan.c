/*
 * Differential test of the /events scanner (daemon/api/events_scan.c)
 * against the cJSON path (json_parse_body + events_decode) it stands in
 * for. For every body generated here (LMCache's shape with every field,
 * token id arrays, members in any order, white space variants, unknown
 * members, escapes, big and odd numbers, repeated members, invalid
 * batches, and seeded random mutations of all of them) events_scan either
 * falls back with nothing allocated, or the reference accepts the body
 * and decodes it into the very same batches. The generator is
 * deterministic (fixed seed), so a failure reproduces;
 * tests/fuzz/fuzz_daemon_eventscan.c runs the same check on arbitrary
 * bytes.
 */
#include <criterion/criterion.h>

#include "eventscan_compare.h"

#include "kvidx/err.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static size_t n_fast, n_fallback;

static int check(const char *body, size_t len, struct app *app)
{
    int rc = ev_diff(body, len, app);
    cr_assert_neq(rc, -1, "scanner and reference disagree on: %.*s", (int)(len > 600 ? 600 : len),
                  body);
    if (rc)
        n_fast++;
    else
        n_fallback++;
    return rc;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static size_t pick(size_t n)
{
    return (size_t)(rnd() % n);
}

/* JSON white space, mostly none; odd adds bytes the scanner leaves alone. */
static void ws(struct buf *b, int odd)
{
    static const char *const w[] = {"", "", "", "", " ", "\n", " \t\r\n ", "\x0b", "\x01"};
    buf_puts(b, w[pick(odd && pick(8) == 0 ? 9 : 7)]);
}

static const char *const good_strings[] = {"mp-1", "dram", "a b", "caf\xc3\xa9", "x\x7fy", "\xff"};
static const char *const odd_strings[] = {"mp\\u0041", "a\\\"b", "\\\\", "a\\/b",
                                          "a\\u0000",  "",       "a\tb", "\\n"};

static void str_value(struct buf *b, int odd)
{
    buf_printf(b, "\"%s\"", odd && pick(5) == 0 ? odd_strings[pick(8)] : good_strings[pick(6)]);
}

/* An integer literal: mostly plain, sometimes big or odd. */
static void int_value(struct buf *b, int odd, uint64_t plain)
{
    static const char *const big[] = {"0",
                                      "9007199254740993",
                                      "9223372036854775807",
                                      "9223372036854775808",
                                      "18446744073709549568",
                                      "18446744073709551615",
                                      "1234567890123456789",
                                      "9999999999999999999",
                                      "4294967295",
                                      "4294967296"};
    static const char *const weird[] = {
        "-1",    "-0",   "1.0", "1e3", "01", "1.5", "-7", "1E+2", "null",
        "\"3\"", "true", "[]",  "{}",  "00", "1.",  ".5", "+1",   "99999999999999999999"};
    size_t r = pick(10);
    if (odd && r == 0)
        buf_puts(b, weird[pick(18)]);
    else if (r == 1)
        buf_puts(b, big[pick(10)]);
    else
        buf_printf(b, "%llu", (unsigned long long)plain);
}

static void gen_key(struct buf *b, int odd, int same_model)
{
    const char *members[6];
    char tmp[6][200];
    size_t n = 0;
    snprintf(tmp[n], sizeof(tmp[n]), "\"model_name\":\"%s\"",
             same_model ? "meta-llama/Llama-3-8B" : (odd && pick(6) == 0 ? "m@x" : "m"));
    members[n] = tmp[n];
    n++;
    snprintf(tmp[n], sizeof(tmp[n]), "\"kv_rank\":%s",
             odd && pick(8) == 0 ? "1.5" : (pick(3) ? "0" : "4294967295"));
    members[n] = tmp[n];
    n++;
    snprintf(tmp[n], sizeof(tmp[n]), "\"chunk_hash_hex\":\"%s\"",
             odd && pick(8) == 0
                 ? "abc"
                 : (pick(2) ? "00112233445566778899aabbccddeeff00112233445566778899aa"
                              "bbccddeeff"
                            : "AbCd"));
    members[n] = tmp[n];
    n++;
    if (pick(2)) {
        snprintf(tmp[n], sizeof(tmp[n]), "\"object_group_id\":%u", (unsigned)pick(3));
        members[n] = tmp[n];
        n++;
    }
    if (pick(2)) {
        snprintf(tmp[n], sizeof(tmp[n]), "\"cache_salt\":\"%s\"", pick(2) ? "" : "salt1");
        members[n] = tmp[n];
        n++;
    }
    if (odd && pick(8) == 0) {
        snprintf(tmp[n], sizeof(tmp[n]), "%s", pick(2) ? "\"extra\":1" : "\"kv_rank\":2");
        members[n] = tmp[n];
        n++;
    }
    /* LMCache's order, or shuffled. */
    if (pick(3) == 0)
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = pick(i + 1);
            const char *t = members[i];
            members[i] = members[j];
            members[j] = t;
        }
    buf_putc(b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        ws(b, odd);
        buf_puts(b, members[i]);
        ws(b, odd);
    }
    buf_putc(b, '}');
}

static void gen_tokens(struct buf *b, int odd)
{
    buf_putc(b, '[');
    size_t n = pick(4) == 0 ? 0 : 1 + pick(pick(4) == 0 ? 300 : 8);
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        ws(b, odd);
        if (odd && pick(40) == 0)
            int_value(b, 1, 0);
        else if (pick(20) == 0)
            buf_puts(b, pick(2) ? "4294967295" : "0");
        else
            buf_printf(b, "%u", (unsigned)(rnd() % 200000));
        ws(b, odd);
    }
    buf_putc(b, ']');
}

/* An unknown member's value: scalars the scanner skips, or nested ones
 * it leaves to the reference. */
static void unknown_value(struct buf *b, int odd)
{
    static const char *const v[] = {"\"abc\"",   "12",           "-3.5e2", "true",
                                    "false",     "null",         "0",      "[1,2]",
                                    "{\"a\":1}", "\"a\\u00e9\"", "[]"};
    buf_puts(b, v[pick(odd ? 11 : 7)]);
}

static void gen_entry(struct buf *b, int odd, int i)
{
    int kinds[6];
    size_t n = 0;
    kinds[n++] = 0; /* key */
    if (pick(4))
        kinds[n++] = 1; /* size_bytes */
    if (pick(2))
        kinds[n++] = 2; /* token_ids */
    if (pick(2))
        kinds[n++] = 3; /* token_offset */
    if (pick(6) == 0)
        kinds[n++] = 4; /* unknown */
    if (odd && pick(10) == 0) {
        int again = kinds[pick(n)]; /* a repeated member */
        kinds[n++] = again;
    }
    if (pick(3) == 0)
        for (size_t k = n - 1; k > 0; k--) {
            size_t j = pick(k + 1);
            int t = kinds[k];
            kinds[k] = kinds[j];
            kinds[j] = t;
        }
    buf_putc(b, '{');
    for (size_t k = 0; k < n; k++) {
        if (k)
            buf_putc(b, ',');
        ws(b, odd);
        switch (kinds[k]) {
        case 0:
            buf_puts(b, "\"key\":");
            ws(b, odd);
            if (odd && pick(30) == 0)
                buf_puts(b, pick(2) ? "null" : "[]");
            else
                gen_key(b, odd, pick(4) != 0);
            break;
        case 1:
            buf_puts(b, "\"size_bytes\":");
            ws(b, odd);
            int_value(b, odd, 2097152);
            break;
        case 2:
            buf_puts(b, "\"token_ids\":");
            ws(b, odd);
            if (odd && pick(30) == 0)
                buf_puts(b, "{}");
            else
                gen_tokens(b, odd);
            break;
        case 3:
            buf_puts(b, "\"token_offset\":");
            ws(b, odd);
            if (pick(2))
                buf_puts(b, "-1");
            else
                int_value(b, odd, (uint64_t)i * 256);
            break;
        default:
            buf_puts(b, pick(2) ? "\"content_hash_hex\":" : "\"future\":");
            ws(b, odd);
            unknown_value(b, odd);
        }
        ws(b, odd);
    }
    buf_putc(b, '}');
}

static void gen_batch(struct buf *b, int odd, uint64_t seq)
{
    static const char *const names[] = {
        "instance_id",       "incarnation", "seq",    "event_type", "tier",
        "backend",           "entries",     "shared", "ts",         "capacity_bytes",
        "capacity_revision", "unknown"};
    int kinds[16];
    size_t n = 0;
    for (int k = 0; k < 12; k++) {
        int required = k < 6;
        if (k == 11 ? pick(6) == 0 : required ? !(odd && pick(30) == 0) : pick(3) != 0)
            kinds[n++] = k;
    }
    if (odd && pick(10) == 0 && n) {
        int again = kinds[pick(n)];
        kinds[n++] = again;
    }
    if (pick(3) == 0)
        for (size_t k = n - 1; k > 0; k--) {
            size_t j = pick(k + 1);
            int t = kinds[k];
            kinds[k] = kinds[j];
            kinds[j] = t;
        }
    const char *type =
        pick(5) ? "store"
                : (const char *[]){"delete", "access", "config", "all", "STORE"}[pick(odd ? 5 : 3)];
    buf_putc(b, '{');
    for (size_t k = 0; k < n; k++) {
        if (k)
            buf_putc(b, ',');
        ws(b, odd);
        buf_printf(b, "\"%s\":", kinds[k] == 11 ? (pick(2) ? "future" : "x") : names[kinds[k]]);
        ws(b, odd);
        switch (kinds[k]) {
        case 0:
            str_value(b, odd);
            break;
        case 1:
            int_value(b, odd, 1716800000);
            break;
        case 2:
            int_value(b, odd, seq);
            break;
        case 3:
            buf_printf(b, "\"%s\"", type);
            break;
        case 4:
            buf_puts(b, pick(8) ? (pick(2) ? "\"l1\"" : "\"l2\"")
                                : (const char *[]){"\"all\"", "\"l3\"", "\"L1\"", "1",
                                                   "\"l\\u0031\""}[pick(odd ? 5 : 3)]);
            break;
        case 5:
            if (pick(10) == 0)
                buf_puts(b, "\"\"");
            else
                str_value(b, odd);
            break;
        case 6: {
            buf_putc(b, '[');
            size_t ne = pick(4) == 0 ? 0 : 1 + pick(6);
            if (!strcmp(type, "config") && pick(2))
                ne = 0;
            for (size_t i = 0; i < ne; i++) {
                if (i)
                    buf_putc(b, ',');
                ws(b, odd);
                gen_entry(b, odd, (int)i);
                ws(b, odd);
            }
            buf_putc(b, ']');
            break;
        }
        case 7:
            buf_puts(b, pick(2) ? "true" : (odd && pick(4) == 0 ? "1" : "false"));
            break;
        case 8: {
            static const char *const ts[] = {"1716800000.5",
                                             "0",
                                             "0.0",
                                             "1716800123.4567816",
                                             "1e9",
                                             "1E+2",
                                             "2.5e-3",
                                             "-0.0",
                                             "123456789012345678901",
                                             "-1.5",
                                             "1e400",
                                             "\"1\"",
                                             "1.7976931348623157e308"};
            buf_puts(b, ts[pick(odd ? 13 : 11)]);
            break;
        }
        case 9:
        case 10:
            int_value(b, odd, pick(2) ? 0 : 1 << 30);
            break;
        default:
            unknown_value(b, odd);
        }
        ws(b, odd);
    }
    buf_putc(b, '}');
}

static void gen_body(struct buf *b, int odd)
{
    buf_reset(b);
    ws(b, odd);
    buf_putc(b, '{');
    ws(b, odd);
    if (pick(8) == 0) {
        buf_puts(b, "\"note\":\"x\",");
        ws(b, odd);
    }
    if (pick(20)) {
        buf_puts(b, "\"batches\":");
        ws(b, odd);
        buf_putc(b, '[');
        size_t nb = pick(5) == 0 ? 0 : 1 + pick(3);
        for (size_t i = 0; i < nb; i++) {
            if (i)
                buf_putc(b, ',');
            ws(b, odd);
            gen_batch(b, odd, 1 + i);
            ws(b, odd);
        }
        buf_putc(b, ']');
        ws(b, odd);
        if (odd && pick(10) == 0)
            buf_puts(b, ",\"batches\":[]");
    }
    buf_putc(b, '}');
    ws(b, odd);
    if (odd && pick(20) == 0)
        buf_puts(b, pick(2) ? " x" : "{}");
}

static void mutate(struct buf *dst, const struct buf *src)
{
    static const char bytes[] = "{}[]\",:\\ 0123456789.eE-+abfnrtuxyzl\x00\x01\xff@/";
    buf_reset(dst);
    buf_append(dst, src->data, src->len);
    size_t edits = 1 + pick(3);
    for (size_t e = 0; e < edits && dst->len; e++) {
        size_t at = pick(dst->len);
        char c = bytes[pick(sizeof(bytes) - 1)];
        switch (pick(3)) {
        case 0:
            dst->data[at] = c;
            break;
        case 1:
            memmove(dst->data + at, dst->data + at + 1, dst->len - at - 1);
            dst->len--;
            break;
        default:
            buf_putc(dst, '\0');
            memmove(dst->data + at + 1, dst->data + at, dst->len - at - 1);
            dst->data[at] = c;
        }
    }
}

/* The emitter's usual request (the benchmark's shape too) must be taken. */
Test(eventscan, lmcache_bodies_take_the_fast_path)
{
    const char *bodies[] = {
        "{\"batches\":[{\"instance_id\":\"mp-1\",\"incarnation\":1716800000,\"seq\":42,"
        "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\",\"entries\":[{\"key\":"
        "{\"model_name\":\"m\",\"kv_rank\":0,\"object_group_id\":0,\"chunk_hash_hex\":\"ab\","
        "\"cache_salt\":\"\"},\"size_bytes\":1048576,\"token_ids\":[1,2,3],\"token_offset\":0}],"
        "\"shared\":false,\"ts\":1716800123.5,\"capacity_bytes\":0,\"capacity_revision\":0}]}",
        /* Python's default separators, and LMCache's unknown offset. */
        "{\"batches\": [{\"instance_id\": \"mp-1\", \"incarnation\": 1, \"seq\": 1, "
        "\"event_type\": \"delete\", \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": "
        "[{\"key\": {\"model_name\": \"m\", \"kv_rank\": 0, \"object_group_id\": 0, "
        "\"chunk_hash_hex\": \"ab\", \"cache_salt\": \"\"}, \"size_bytes\": 0, \"token_ids\": "
        "[], \"token_offset\": -1}], \"shared\": true, \"ts\": 0.0, \"capacity_bytes\": 0, "
        "\"capacity_revision\": 0}]}",
        "{\"batches\":[{\"instance_id\":\"mp-1\",\"incarnation\":2,\"seq\":3,"
        "\"event_type\":\"config\",\"tier\":\"l1\",\"backend\":\"dram\",\"entries\":[],"
        "\"capacity_bytes\":107374182400,\"capacity_revision\":7}]}",
        "{\"batches\":[{\"instance_id\":\"mp-1\",\"incarnation\":2,\"seq\":4,"
        "\"event_type\":\"access\",\"tier\":\"l1\",\"backend\":\"\",\"entries\":[{\"key\":"
        "{\"model_name\":\"m\",\"kv_rank\":0,\"chunk_hash_hex\":\"ab\"},"
        "\"content_hash_hex\":\"ff\"}]}]}",
        "{\"batches\":[]}",
        "{}",
        " {\"batches\" : [ ] } \n",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        cr_assert_eq(check(bodies[i], strlen(bodies[i]), NULL), 1, "%s", bodies[i]);
}

/* Each kind of unusual or invalid body goes to the reference. */
Test(eventscan, unusual_bodies_fall_back)
{
    const char *head = "{\"batches\":[{\"instance_id\":\"mp-1\",\"incarnation\":1,\"seq\":1,"
                       "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\"";
    const char *tails[] = {
        ",\"instance_id\":\"mp-2\"}]}",         /* repeated member */
        ",\"x\":{\"y\":1}}]}",                  /* nested unknown value */
        ",\"x\":\"\\u0041\"}]}",                /* escape */
        ",\"shared\":1}]}",                     /* wrong type */
        ",\"ts\":-1}]}",                        /* refused value */
        ",\"entries\":[{\"size_bytes\":1}]}]}", /* entry without a key */
        ",\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,\"chunk_hash_hex\":\"a\"}}]}]}",
        ",\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,\"chunk_hash_hex\":\"ab\"},"
        "\"token_ids\":[4294967296]}]}]}", /* id beyond 32 bits: the reference's rule */
        ",\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,\"chunk_hash_hex\":\"ab\"},"
        "\"token_offset\":-2}]}]}",
        ",\"capacity_bytes\":1.0}]}",
        ",\"seq\":01}]}",
        "}]}x",
        "}],}",
        "}]",
    };
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
        struct buf b;
        buf_init(&b);
        buf_puts(&b, head);
        buf_puts(&b, tails[i]);
        cr_assert_eq(check(b.data, b.len, NULL), 0, "%s", b.data);
        buf_free(&b);
    }
    /* seq 0 and an empty instance_id are refused by the reference. */
    const char *refused[] = {
        "{\"batches\":[{\"instance_id\":\"\",\"incarnation\":1,\"seq\":1,\"event_type\":\"store\","
        "\"tier\":\"l1\",\"backend\":\"dram\"}]}",
        "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":0,\"event_type\":\"store\","
        "\"tier\":\"l1\",\"backend\":\"dram\"}]}",
        "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":1,\"event_type\":\"store\","
        "\"tier\":\"l1\",\"backend\":\"\"}]}",
        "{\"batches\":null}",
        "[]",
        "",
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        cr_assert_eq(check(refused[i], strlen(refused[i]), NULL), 0, "%s", refused[i]);
}

/* Key objects sit at depth 6: a lower max_json_depth is the reference's. */
Test(eventscan, depth_limit_below_six_falls_back)
{
    static struct app app;
    app.cfg.max_keys_per_request = 1000;
    const char *body = "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":1,"
                       "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\","
                       "\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,"
                       "\"chunk_hash_hex\":\"ab\"}}]}]}";
    app.cfg.max_json_depth = 5;
    cr_assert_eq(check(body, strlen(body), &app), 0);
    app.cfg.max_json_depth = 6;
    cr_assert_eq(check(body, strlen(body), &app), 1);
}

/* Around the value limit the two paths agree body by body, and both
 * sides of it occur. */
Test(eventscan, value_count_matches_the_reference)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 10;
    size_t limit = JSON_VALUES_PER_KEY * 10 + 4096;
    struct buf b;
    buf_init(&b);
    int took = 0, refused = 0;
    for (size_t ids = limit - 30; ids < limit + 10; ids++) {
        buf_reset(&b);
        buf_puts(&b, "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":1,"
                     "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\","
                     "\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,"
                     "\"chunk_hash_hex\":\"ab\"},\"token_ids\":[0");
        for (size_t z = 1; z < ids; z++)
            buf_puts(&b, ",0");
        buf_puts(&b, "]}]}]}");
        if (check(b.data, b.len, &app)) {
            took++;
        } else {
            refused++;
            cJSON *root;
            struct ev_body ref;
            cr_assert_eq(ev_reference(b.data, b.len, &app, &root, &ref), KVIDX_EBODYSIZE);
            ev_body_free(&ref);
            cJSON_Delete(root);
        }
    }
    cr_assert(took > 0 && refused > 0, "the boundary was not crossed (%d/%d)", took, refused);
    buf_free(&b);
}

/* Big integers round as cJSON's strtod rounds them; values at the edge of
 * each range are decided as the reference decides them. */
Test(eventscan, big_numbers_agree)
{
    static const char *const nums[] = {"9007199254740993",
                                       "9223372036854775807",
                                       "9223372036854775808",
                                       "18446744073709549568",
                                       "18446744073709550591",
                                       "18446744073709550592",
                                       "1844674407370955161",
                                       "9999999999999999999",
                                       "4294967295",
                                       "4294967296",
                                       "0",
                                       "1"};
    static const char *const fields[] = {"incarnation", "seq", "capacity_bytes",
                                         "capacity_revision"};
    for (size_t f = 0; f < 4; f++)
        for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
            char body[600];
            snprintf(body, sizeof(body),
                     "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":1,"
                     "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\","
                     "\"%s\":%s,\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,"
                     "\"chunk_hash_hex\":\"ab\"},\"size_bytes\":%s,\"token_offset\":%s}]}]}",
                     fields[f], nums[i], nums[i], nums[i]);
            /* The repeated member makes incarnation and seq fall back; the
             * sizes and offsets are still read by the first two. */
            check(body, strlen(body), NULL);
            snprintf(body, sizeof(body),
                     "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":%s,\"seq\":%s,"
                     "\"event_type\":\"config\",\"tier\":\"l1\",\"backend\":\"dram\","
                     "\"capacity_bytes\":%s}]}",
                     nums[i], nums[i], nums[i]);
            check(body, strlen(body), NULL);
        }
    cr_assert(n_fast > 0);
}

Test(eventscan, generated_and_mutated_bodies_agree)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 262144;
    struct buf b, m;
    buf_init(&b);
    buf_init(&m);
    n_fast = n_fallback = 0;
    size_t fast_valid = 0;
    for (int i = 0; i < 20000; i++) {
        int odd = i % 3 == 0;
        gen_body(&b, odd);
        int rc = check(b.data, b.len, &app);
        if (!odd)
            fast_valid += (size_t)rc;
        for (int k = 0; k < 3; k++) {
            mutate(&m, &b);
            check(m.data, m.len, &app);
        }
    }
    /* Both outcomes are exercised, and most well-formed bodies are taken. */
    cr_assert(n_fast > 5000 && n_fallback > 5000, "fast %zu, fallback %zu", n_fast, n_fallback);
    cr_assert(fast_valid > 4000, "only %zu of the plain bodies were taken", fast_valid);
    buf_free(&b);
    buf_free(&m);
}

/* An entry holds at most 65536 token ids: one more is the reference's 422. */
Test(eventscan, token_cap_of_an_entry)
{
    struct buf b;
    buf_init(&b);
    for (size_t ids = 65535; ids <= 65537; ids++) {
        buf_reset(&b);
        buf_puts(&b, "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":1,"
                     "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\","
                     "\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,"
                     "\"chunk_hash_hex\":\"ab\"},\"token_ids\":[7");
        for (size_t z = 1; z < ids; z++)
            buf_printf(&b, ",%zu", z);
        buf_puts(&b, "]}]}]}");
        cr_assert_eq(check(b.data, b.len, NULL), ids <= 65536, "%zu ids", ids);
    }
    buf_free(&b);
}
