/*
 * Differential test of the key-form fast path (daemon/keyscan.c) against
 * the cJSON path it stands in for. For every body generated here, valid
 * ones in many spellings, each kind of invalid one, and seeded random
 * mutations of valid ones, keyscan_text either falls back, or json_parse_body
 * accepts the same body and the fast path's keys equal what json_to_key
 * makes of each element of "keys", and its rest tree equals cJSON's tree of
 * the whole body with that array emptied. Ipc-form bodies are checked the
 * same way for their "chunk_hashes" array: the fast path's strings must be
 * the bytes of cJSON's strings. The generator is deterministic
 * (fixed seed), so a failure reproduces; tests/fuzz/fuzz_daemon_keyscan.c
 * runs the same check on arbitrary bytes.
 */
#include <criterion/criterion.h>

#include "util/context.h"
#include "util/json_write.h"
#include "api/body.h"
#include "util/json_read.h"
#include "util/keyscan.h"
#include "keyscan_compare.h"

#include "kvidx/err.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static size_t n_fast, n_fallback, n_fast_hashes;

/* 1 when the fast path took the body (and agreed), 0 when it fell back;
 * fails the test on any disagreement. */
static int diff_check(const char *body, size_t len, struct app *app)
{
    struct request req;
    memset(&req, 0, sizeof(req));
    req.body = len ? body : "";
    req.body_len = len;
    req.app = app;
    struct keyscan ks;
    if (keyscan_text(req.body, req.body_len, req.app, KEYSCAN_KEYS | KEYSCAN_CHUNK_HASHES, &ks) !=
        0) {
        cr_assert_null(ks.rest);
        cr_assert_null(ks.keys);
        cr_assert_null(ks.strs);
        n_fallback++;
        return 0;
    }
    n_fast++;
    struct response res;
    memset(&res, 0, sizeof(res));
    cJSON *full = NULL;
    int rc = json_parse_body(&req, &res, &full);
    buf_free(&res.body);
    cr_assert_eq(rc, 0, "fast path took a body json_parse_body refuses (%d): %.*s", rc,
                 (int)(len > 300 ? 300 : len), body);
    if (ks.chunk_hashes) {
        n_fast_hashes++;
        cr_assert_null(ks.keys);
        const cJSON *hs = cJSON_GetObjectItemCaseSensitive(full, "chunk_hashes");
        cr_assert(cJSON_IsArray(hs), "no chunk_hashes array: %.*s", (int)(len > 300 ? 300 : len),
                  body);
        cr_assert_eq((size_t)cJSON_GetArraySize(hs), ks.nstrs, "count differs: %.*s",
                     (int)(len > 300 ? 300 : len), body);
        size_t i = 0;
        for (const cJSON *e = hs->child; e; e = e->next, i++) {
            cr_assert(cJSON_IsString(e), "chunk_hashes[%zu] is no string for cJSON", i);
            cr_assert(strlen(e->valuestring) == ks.strs[i].n &&
                          memcmp(e->valuestring, ks.strs[i].s, ks.strs[i].n) == 0,
                      "chunk_hashes[%zu] differs: %.*s", i, (int)(len > 300 ? 300 : len), body);
        }
        cr_assert(
            cJSON_ReplaceItemInObjectCaseSensitive(full, "chunk_hashes", cJSON_CreateArray()));
        cr_assert(same_tree(full, ks.rest), "rest tree differs: %.*s", (int)(len > 300 ? 300 : len),
                  body);
        cJSON_Delete(full);
        keyscan_free(&ks);
        return 1;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(full, "keys");
    cr_assert(cJSON_IsArray(arr), "no keys array: %.*s", (int)(len > 300 ? 300 : len), body);
    cr_assert_eq((size_t)cJSON_GetArraySize(arr), ks.n, "key count differs: %.*s",
                 (int)(len > 300 ? 300 : len), body);
    size_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        kvidx_key_t k;
        kvidx_reason_t why;
        cr_assert_eq(json_to_key(e, &k, &why), 0, "fast path took keys[%zu] that cJSON refuses", i);
        cr_assert(same_key(&k, &ks.keys[i]), "keys[%zu] differs: %.*s", i,
                  (int)(len > 300 ? 300 : len), body);
    }
    cr_assert(cJSON_ReplaceItemInObjectCaseSensitive(full, "keys", cJSON_CreateArray()));
    cr_assert(same_tree(full, ks.rest), "rest tree differs: %.*s", (int)(len > 300 ? 300 : len),
              body);
    cJSON_Delete(full);
    keyscan_free(&ks);
    return 1;
}

/* ---- generator ---- */

static uint64_t rng = 0x6b76696478313421ULL;

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

static void ws(struct buf *b)
{
    static const char *const w[] = {"", "", "", "", " ", "\n", " \t\r\n ", "\x0b", "\x01"};
    buf_puts(b, w[pick(rnd() % 16 ? 6 : 9)]);
}

static const char *const models[] = {"m",        "meta-llama/Llama-3-8B",
                                     "a b",      "caf\xc3\xa9",
                                     "\xc3",     "\xed\xa0\x80",
                                     "m@x",      "m\\/x",
                                     "m\\u0041", "m\\\"q",
                                     "m\\u0000", "m\tx",
                                     "",         "\xf0\x9f\x98\x80",
                                     "m\x7f"};
static const char *const hashes[] = {
    "ab",
    "00",
    "0123456789abcdef",
    "ABCDEF",
    "aB",
    "a",
    "abc",
    "zz",
    "a b",
    "",
    "0x12",
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    "0123456789abcdef0123456789abcdef0123456789abcdef",
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    "0123456789abcdef0123456789abcdef0123456789abcdef00"};
static const char *const numbers[] = {"0",
                                      "1",
                                      "7",
                                      "65535",
                                      "65536",
                                      "4294967295",
                                      "4294967296",
                                      "123456789012345",
                                      "1234567890123456",
                                      "01",
                                      "00",
                                      "-0",
                                      "-1",
                                      "2.0",
                                      "2e0",
                                      "1E2",
                                      "0.5",
                                      "true",
                                      "null",
                                      "\"1\"",
                                      "[]",
                                      "{}",
                                      "1x",
                                      "+1"};
static const char *const salts[] = {"",       "s",       "salt-1",  "a/b",  "a@b",
                                    "a\\\\b", "\\u0041", "\\u0000", "x\\ny"};

static void value_string(struct buf *b, const char *s)
{
    buf_putc(b, '"');
    buf_puts(b, s);
    buf_putc(b, '"');
}

/* A key object; with odd != 0, sometimes an unusual one. */
static void gen_key(struct buf *b, int odd)
{
    const char *names[7] = {"chunk_hash_hex", "model_name", "kv_rank", "object_group_id",
                            "cache_salt",     "extra",      "kv_rank"};
    size_t order[7] = {0, 1, 2, 3, 4, 5, 6};
    size_t nm = 5;
    if (odd && pick(4) == 0)
        nm = 5 + pick(3); /* unknown or repeated member */
    for (size_t i = nm; i > 1; i--) {
        size_t j = pick(i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    buf_putc(b, '{');
    int first = 1;
    for (size_t i = 0; i < nm; i++) {
        size_t m = order[i];
        if ((m == 3 || m == 4) && pick(2))
            continue; /* optional members */
        if (odd && pick(12) == 0)
            continue; /* a required one missing, now and then */
        if (!first)
            buf_putc(b, ',');
        first = 0;
        ws(b);
        value_string(b, names[m]);
        ws(b);
        buf_putc(b, ':');
        ws(b);
        switch (m) {
        case 0:
            value_string(b, hashes[odd ? pick(13) : pick(5)]);
            break;
        case 1:
            value_string(b, models[odd ? pick(15) : pick(4)]);
            break;
        case 4:
            value_string(b, salts[odd ? pick(9) : pick(3)]);
            break;
        default:
            buf_puts(b, numbers[odd ? pick(24) : pick(m == 3 ? 4 : 6)]);
        }
        ws(b);
    }
    buf_putc(b, '}');
}

static void gen_body(struct buf *b, int odd)
{
    buf_reset(b);
    ws(b);
    buf_putc(b, '{');
    ws(b);
    if (pick(3) == 0) {
        static const char *const pre[] = {
            "\"tier\":\"l1\",",  "\"mode\":\"LOOKUP\",", "\"lease_ms\":10,",  "\"worker_id\":null,",
            "\"x\":\"a\\\"b\",", "\"x\":[1],",           "\"k\\u0065ys\":1,", "\"keys\":[],"};
        buf_puts(b, pre[pick(odd ? 8 : 4)]);
        ws(b);
    }
    buf_puts(b, "\"keys\"");
    ws(b);
    buf_putc(b, ':');
    ws(b);
    buf_putc(b, '[');
    size_t n = pick(9);
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        ws(b);
        gen_key(b, odd && pick(3) == 0);
        ws(b);
    }
    buf_putc(b, ']');
    ws(b);
    if (pick(3) == 0) {
        static const char *const post[] = {",\"tier\":\"any\"",
                                           ",\"mode\":\"WARM\"",
                                           ",\"extra_count\":2",
                                           ",\"keys\":[]",
                                           ",\"x\":{\"y\":[1,2]}",
                                           ",\"model_name\":\"m\"",
                                           ","};
        buf_puts(b, post[pick(odd ? 7 : 3)]);
    }
    ws(b);
    buf_putc(b, '}');
    if (odd && pick(8) == 0)
        buf_puts(b, pick(2) ? " x" : "\n");
}

/* An ipc-form body; with odd != 0, sometimes an unusual one. */
static void gen_ipc_body(struct buf *b, int odd)
{
    static const char *const odd_elems[] = {"1",           "null",         "[]",
                                            "{}",          "\"a\\u0062\"", "\"a\\\"b\"",
                                            "\"\\u0000\"", "\"ab\"x",      "\"ab\" \"cd\""};
    buf_reset(b);
    ws(b);
    buf_putc(b, '{');
    ws(b);
    static const char *const pre[] = {"\"model_name\":\"m\",",
                                      "\"model_name\":\"m\",\"world_size\":8,\"worker_id\":null,",
                                      "\"cache_salt\":\"\",\"world_size\":2,",
                                      "",
                                      "\"object_group_ids\":[0],",
                                      "\"keys\":[],",
                                      "\"model_name\":\"a\\\"b\","};
    buf_puts(b, pre[pick(odd ? 7 : 4)]);
    ws(b);
    buf_puts(b, "\"chunk_hashes\"");
    ws(b);
    buf_putc(b, ':');
    ws(b);
    buf_putc(b, '[');
    size_t n = pick(9);
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        ws(b);
        if (odd && pick(4) == 0)
            buf_puts(b, odd_elems[pick(9)]);
        else
            value_string(b, hashes[odd ? pick(13) : pick(5)]);
        ws(b);
    }
    buf_putc(b, ']');
    ws(b);
    if (pick(2) == 0) {
        static const char *const post[] = {
            ",\"world_size\":8",    ",\"object_group_ids\":[0,1],\"attn_window\":[-1,4]",
            ",\"mode\":\"LOOKUP\"", ",\"chunk_hashes\":[]",
            ",\"keys\":[{}]",       ","};
        buf_puts(b, post[pick(odd ? 6 : 3)]);
    }
    ws(b);
    buf_putc(b, '}');
    if (odd && pick(8) == 0)
        buf_puts(b, pick(2) ? " x" : "\n");
}

static void mutate(struct buf *dst, const struct buf *src)
{
    static const char bytes[] = "{}[]\",:\\ 0123456789.eE-+abfnrtuxyz\x00\x01\xff@/";
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
        case 1: /* delete */
            memmove(dst->data + at, dst->data + at + 1, dst->len - at - 1);
            dst->len--;
            break;
        default: /* insert */
            buf_putc(dst, '\0');
            memmove(dst->data + at + 1, dst->data + at, dst->len - at - 1);
            dst->data[at] = c;
        }
    }
}

Test(keyscan, common_bodies_take_the_fast_path)
{
    const char *bodies[] = {
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"mode\":\"LOOKUP\",\"keys\":[{\"model_name\":\"meta/x\",\"kv_rank\":4294967295,"
        "\"chunk_hash_hex\":\"ABcd\",\"object_group_id\":65535,\"cache_salt\":\"s\"}]}",
        " { \"keys\" : [ ] , \"tier\" : \"l1\" } \n",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},\n"
        " {\"chunk_hash_hex\":\"cd\",\"kv_rank\":0,\"model_name\":\"caf\xc3\xa9\"}],"
        "\"x\":{\"y\":[1]}}",
        /* DEL and bytes from 0x80 up are plain content */
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\","
        "\"cache_salt\":\"a\x7f\xc3\xa9 b\"}]}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        cr_assert_eq(diff_check(bodies[i], strlen(bodies[i]), NULL), 1, "%s", bodies[i]);
}

Test(keyscan, unusual_bodies_fall_back)
{
    const char *bodies[] = {
        "",
        "[]",
        "{}",
        "{\"keys\":{}}",
        "{\"x\":[],\"keys\":[]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1.0,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1e0,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":-0,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":01,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\\/x\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\",\"x\":1}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"a\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]} x",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}],}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]",
        "{\"keys\":[{\"model_name\":\"m\",\x0b\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        cr_assert_eq(diff_check(bodies[i], strlen(bodies[i]), NULL), 0, "%s", bodies[i]);
}

/* A raw byte below 0x20 in any string of the body (a key field, a member
 * name, a chunk hash, a member before or after the array) is not JSON: the
 * fast path leaves the body, and json_parse_body answers invalid_json. The
 * same bodies with 'c' in that place take the fast path. */
Test(keyscan, raw_control_bytes_fall_back_to_invalid_json)
{
    static const char *const templates[] = {
        "{\"keys\":[{\"model_name\":\"llamaXevil\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"abXd\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\","
        "\"cache_salt\":\"saltXsalt\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"cd\",\"cache_salt\":\"X\"}]}",
        "{\"tier\":\"l1X\",\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}"
        "]}",
        "{\"tierX\":\"l1\",\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}"
        "]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}],"
        "\"mode\":\"LOOKUPX\"}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}],"
        "\"x\":{\"yX\":1}}",
        "{\"model_name\":\"m\",\"chunk_hashes\":[\"aa\",\"bbXzz\"]}",
        "{\"model_name\":\"nulXother\",\"chunk_hashes\":[\"aa\"]}",
        "{\"model_name\":\"m\",\"chunk_hashes\":[\"aa\"],\"cache_salt\":\"X\"}",
    };
    static const unsigned char bytes[] = {0x00, 0x01, 0x0a, 0x1f};
    for (size_t t = 0; t < sizeof(templates) / sizeof(templates[0]); t++) {
        size_t n = strlen(templates[t]);
        char body[256];
        cr_assert(n < sizeof(body));
        memcpy(body, templates[t], n);
        char *x = memchr(body, 'X', n);
        cr_assert_not_null(x);
        /* A valid byte there (a hex digit for the hash) takes the fast path. */
        *x = 'c';
        cr_assert_eq(diff_check(body, n, NULL), 1, "the template takes the fast path: %s",
                     templates[t]);
        for (size_t b = 0; b < sizeof(bytes); b++) {
            *x = (char)bytes[b];
            cr_assert_eq(diff_check(body, n, NULL), 0, "byte 0x%02x in %s", bytes[b], templates[t]);
            struct request req;
            memset(&req, 0, sizeof(req));
            req.body = body;
            req.body_len = n;
            struct response res;
            memset(&res, 0, sizeof(res));
            cJSON *j = NULL;
            cr_assert_eq(json_parse_body(&req, &res, &j), KVIDX_EJSON, "byte 0x%02x in %s",
                         bytes[b], templates[t]);
            cr_assert_eq(res.status, 400);
            buf_free(&res.body);
        }
    }
}

/* Numbers the fast path would read as digits must follow the JSON grammar
 * as json_parse_body does: a leading zero, a bare '.', a '+' fall back and
 * are refused there. */
Test(keyscan, numbers_outside_the_json_grammar_fall_back_to_invalid_json)
{
    static const char *const nums[] = {"01", "00", "-01", "1.", "1.e5", ".5", "+1", "007"};
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        for (int where = 0; where < 3; where++) {
            char body[200];
            int n = snprintf(body, sizeof(body),
                             where == 0   ? "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":%s,"
                                            "\"chunk_hash_hex\":\"ab\"}]}"
                             : where == 1 ? "{\"lease_ms\":%s,\"keys\":[{\"model_name\":\"m\","
                                            "\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}"
                                          : "{\"model_name\":\"m\",\"world_size\":%s,"
                                            "\"chunk_hashes\":[\"aa\"]}",
                             nums[i]);
            cr_assert_eq(diff_check(body, (size_t)n, NULL), 0, "%s", body);
            struct request req;
            memset(&req, 0, sizeof(req));
            req.body = body;
            req.body_len = (size_t)n;
            struct response res;
            memset(&res, 0, sizeof(res));
            cJSON *j = NULL;
            cr_assert_eq(json_parse_body(&req, &res, &j), KVIDX_EJSON, "%s", body);
            buf_free(&res.body);
        }
    }
}

Test(keyscan, depth_limit_below_three_falls_back)
{
    static struct app app;
    app.cfg.max_keys_per_request = 100;
    const char *body =
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}";
    app.cfg.max_json_depth = 2;
    cr_assert_eq(diff_check(body, strlen(body), &app), 0);
    app.cfg.max_json_depth = 3;
    cr_assert_eq(diff_check(body, strlen(body), &app), 1);
}

static void key_elem(struct buf *b, int i)
{
    buf_printf(b, "%s{\"model_name\":\"m\",\"kv_rank\":%d,\"chunk_hash_hex\":\"ab\"}", i ? "," : "",
               i);
}

static void hash_elem(struct buf *b, int i)
{
    buf_printf(b, "%s\"%02x\"", i ? "," : "", i);
}

/* Bodies head + 10 elements + "],\"x\":[0,0,...]}" with the value count
 * from limit - below to limit + above: each one the fast path takes is
 * checked against cJSON, each one it leaves must be the cJSON path's 413,
 * and both kinds must occur. */
static void value_count_boundary(const char *head, void (*elem)(struct buf *, int), size_t below,
                                 size_t above)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 10;
    size_t limit = JSON_VALUES_PER_KEY * 10 + 4096;
    struct buf b;
    buf_init(&b);
    int took = 0, refused = 0;
    for (size_t zeros = limit - below; zeros < limit + above; zeros++) {
        buf_reset(&b);
        buf_puts(&b, head);
        for (int i = 0; i < 10; i++)
            elem(&b, i);
        buf_puts(&b, "],\"x\":[0");
        for (size_t z = 1; z < zeros; z++)
            buf_puts(&b, ",0");
        buf_puts(&b, "]}");
        if (diff_check(b.data, b.len, &app)) {
            took++;
        } else {
            refused++;
            struct request req;
            memset(&req, 0, sizeof(req));
            req.body = b.data;
            req.body_len = b.len;
            req.app = &app;
            struct response res;
            memset(&res, 0, sizeof(res));
            cJSON *j = NULL;
            cr_assert_eq(json_parse_body(&req, &res, &j), KVIDX_EBODYSIZE);
            buf_free(&res.body);
        }
    }
    cr_assert(took > 0 && refused > 0, "the boundary was not crossed (%d/%d)", took, refused);
    buf_free(&b);
}

/* The rest of the body plus the cut-out keys must be counted like the
 * whole body: around the limit the two paths agree value by value. */
Test(keyscan, value_count_matches_the_whole_body)
{
    value_count_boundary("{\"keys\":[", key_elem, 60, 0);
}

/* The same for a cut-out chunk_hashes array. */
Test(keyscan, value_count_matches_the_whole_body_for_chunk_hashes)
{
    value_count_boundary("{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[", hash_elem, 30,
                         10);
}

Test(keyscan, generated_and_mutated_bodies_agree)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 6;
    struct buf b, m;
    buf_init(&b);
    buf_init(&m);
    n_fast = n_fallback = n_fast_hashes = 0;
    for (int round = 0; round < 50000; round++) {
        if (round % 4 == 3)
            gen_ipc_body(&b, round % 2);
        else
            gen_body(&b, round % 2);
        cr_assert(!b.failed);
        struct app *a = round % 5 == 0 ? &app : NULL;
        diff_check(b.data, b.len, a);
        if (round % 50 == 0) /* every truncation of one body */
            for (size_t cut = 0; cut < b.len; cut++)
                diff_check(b.data, cut, a);
        for (int k = 0; k < 3; k++) {
            mutate(&m, &b);
            cr_assert(!m.failed);
            diff_check(m.data, m.len, a);
        }
    }
    /* Both paths must be exercised for the comparison to mean anything. */
    cr_assert(n_fast > 15000 && n_fallback > 100000 && n_fast_hashes > 3000,
              "fast %zu (chunk_hashes %zu), fallback %zu", n_fast, n_fast_hashes, n_fallback);
    cr_log_info("keyscan: %zu bodies on the fast path (%zu by chunk_hashes), %zu fell back", n_fast,
                n_fast_hashes, n_fallback);
    buf_free(&b);
    buf_free(&m);
}

/* The table behind kvidx_hex_value and the hash, rank and group decoders
 * (lib/key.c) gives what the range tests it replaced gave, for every byte. */
Test(keyscan, hex_table_matches_the_range_tests)
{
    for (int c = 0; c < 256; c++) {
        int want = c >= '0' && c <= '9'   ? c - '0'
                   : c >= 'a' && c <= 'f' ? c - 'a' + 10
                   : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : -1;
        cr_assert_eq(kvidx_hex_value((unsigned char)c), want, "byte 0x%02x", c);
        char hex[2] = {(char)c, '0'};
        uint8_t out[KVIDX_HASH_MAX], n = 0;
        int rc = kvidx_key_hash_from_hex(hex, 2, out, &n, NULL);
        cr_assert_eq(rc == 0, want >= 0, "byte 0x%02x", c);
        if (want >= 0)
            cr_assert(n == 1 && out[0] == (uint8_t)(want << 4), "byte 0x%02x", c);
        hex[0] = '0';
        hex[1] = (char)c;
        rc = kvidx_key_hash_from_hex(hex, 2, out, &n, NULL);
        cr_assert_eq(rc == 0, want >= 0, "byte 0x%02x", c);
        if (want >= 0)
            cr_assert(n == 1 && out[0] == (uint8_t)want, "byte 0x%02x", c);
    }
}

/* ---- store bodies: entries and the single-key body ---- */

static size_t n_fast_entries, n_fast_one;

/* The entries counterpart of diff_check, with the flags keys_put uses: 1
 * when the fast path took the body's entries (and agreed with cJSON), 0
 * when it fell back or took chunk hashes (checked above). */
static int diff_check_entries(const char *body, size_t len, struct app *app)
{
    struct request req;
    memset(&req, 0, sizeof(req));
    req.body = len ? body : "";
    req.body_len = len;
    req.app = app;
    struct keyscan ks;
    if (keyscan_text(req.body, req.body_len, req.app, KEYSCAN_ENTRIES | KEYSCAN_CHUNK_HASHES,
                     &ks) != 0) {
        cr_assert_null(ks.rest);
        cr_assert_null(ks.items);
        cr_assert_null(ks.strs);
        return 0;
    }
    int took = ks.entries;
    cr_assert_null(ks.keys);
    struct response res;
    memset(&res, 0, sizeof(res));
    cJSON *full = NULL;
    int rc = json_parse_body(&req, &res, &full);
    buf_free(&res.body);
    cr_assert_eq(rc, 0, "fast path took a body json_parse_body refuses (%d): %.*s", rc,
                 (int)(len > 300 ? 300 : len), body);
    const char *member = ks.entries ? "entries" : "chunk_hashes";
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(full, member);
    cr_assert(cJSON_IsArray(arr), "no %s array: %.*s", member, (int)(len > 300 ? 300 : len), body);
    if (ks.entries) {
        n_fast_entries++;
        cr_assert_eq((size_t)cJSON_GetArraySize(arr), ks.n, "entry count differs: %.*s",
                     (int)(len > 300 ? 300 : len), body);
        size_t i = 0;
        for (const cJSON *e = arr->child; e; e = e->next, i++) {
            cr_assert(cJSON_IsObject(e), "entries[%zu] is no object for cJSON", i);
            /* Only "key" and "size_bytes", each at most once, as keys_put
             * requires. */
            int nk = 0, ns = 0, other = 0;
            for (const cJSON *m = e->child; m; m = m->next) {
                if (strcmp(m->string, "key") == 0)
                    nk++;
                else if (strcmp(m->string, "size_bytes") == 0)
                    ns++;
                else
                    other++;
            }
            cr_assert(nk == 1 && ns <= 1 && !other, "entries[%zu] members: %.*s", i,
                      (int)(len > 300 ? 300 : len), body);
            kvidx_key_t k;
            kvidx_reason_t why;
            cr_assert_eq(json_to_key(cJSON_GetObjectItemCaseSensitive(e, "key"), &k, &why), 0,
                         "fast path took entries[%zu].key that cJSON refuses: %.*s", i,
                         (int)(len > 300 ? 300 : len), body);
            cr_assert(same_key(&k, &ks.items[i].key), "entries[%zu].key differs: %.*s", i,
                      (int)(len > 300 ? 300 : len), body);
            uint64_t size = 0;
            int src = json_uint(cJSON_GetObjectItemCaseSensitive(e, "size_bytes"), 1,
                                (double)KVIDX_SIZE_MAX, &size);
            cr_assert(src == 0 || src == 1, "fast path took a size cJSON refuses: %.*s",
                      (int)(len > 300 ? 300 : len), body);
            cr_assert_eq(src == 1 ? 0 : size, ks.items[i].size_bytes,
                         "entries[%zu].size_bytes differs: %.*s", i, (int)(len > 300 ? 300 : len),
                         body);
        }
    } else {
        size_t i = 0;
        cr_assert_eq((size_t)cJSON_GetArraySize(arr), ks.nstrs);
        for (const cJSON *e = arr->child; e; e = e->next, i++)
            cr_assert(cJSON_IsString(e) && strlen(e->valuestring) == ks.strs[i].n &&
                      memcmp(e->valuestring, ks.strs[i].s, ks.strs[i].n) == 0);
    }
    cr_assert(cJSON_ReplaceItemInObjectCaseSensitive(full, member, cJSON_CreateArray()));
    cr_assert(same_tree(full, ks.rest), "rest tree differs: %.*s", (int)(len > 300 ? 300 : len),
              body);
    cJSON_Delete(full);
    keyscan_free(&ks);
    return took;
}

/* 1 when keyscan_put_one took the body (and agreed with what key_put's
 * cJSON path reads from it), else 0. */
static int diff_check_one(const char *body, size_t len)
{
    uint64_t size = 7;
    int tier = 9;
    if (keyscan_put_one(len ? body : "", len, &size, &tier) != 0)
        return 0;
    n_fast_one++;
    struct request req;
    memset(&req, 0, sizeof(req));
    req.body = len ? body : "";
    req.body_len = len;
    struct response res;
    memset(&res, 0, sizeof(res));
    cJSON *full = NULL;
    int rc = json_parse_body(&req, &res, &full);
    buf_free(&res.body);
    cr_assert_eq(rc, 0, "fast path took a body json_parse_body refuses: %.*s", (int)len, body);
    cr_assert(cJSON_IsObject(full));
    int nsz = 0, nt = 0, other = 0;
    for (const cJSON *m = full->child; m; m = m->next) {
        if (strcmp(m->string, "size_bytes") == 0)
            nsz++;
        else if (strcmp(m->string, "tier") == 0)
            nt++;
        else
            other++;
    }
    cr_assert(nsz <= 1 && nt <= 1 && !other, "members: %.*s", (int)len, body);
    uint64_t want = 0;
    int src = json_uint(cJSON_GetObjectItemCaseSensitive(full, "size_bytes"), 1,
                        (double)KVIDX_SIZE_MAX, &want);
    cr_assert(src == 0 || src == 1, "fast path took a size cJSON refuses: %.*s", (int)len, body);
    cr_assert_eq(src == 1 ? 0 : want, size, "size differs: %.*s", (int)len, body);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(full, "tier");
    size_t tn = 0;
    const char *ts = t ? json_str(t, &tn) : NULL;
    int want_tier = !t                                      ? 0
                    : ts && tn == 2 && !memcmp(ts, "l1", 2) ? 1
                    : ts && tn == 2 && !memcmp(ts, "l2", 2) ? 2
                                                            : -1;
    cr_assert_eq(want_tier, tier, "tier differs: %.*s", (int)len, body);
    cJSON_Delete(full);
    return 1;
}

static const char *const sizes[] = {"2097152",
                                    "1",
                                    "1099511627776",
                                    "1099511627777",
                                    "0",
                                    "-1",
                                    "1.5",
                                    "1e3",
                                    "01",
                                    "\"5\"",
                                    "null",
                                    "123456789012345",
                                    "[]",
                                    "10000000000000000"};

/* A store body: {"tier", "entries": [KeyEntry...]}; with odd != 0,
 * sometimes an unusual one. */
static void gen_entries_body(struct buf *b, int odd)
{
    buf_reset(b);
    ws(b);
    buf_putc(b, '{');
    ws(b);
    if (pick(2) == 0) {
        static const char *const pre[] = {"\"tier\":\"l1\",",     "\"tier\":\"l2\",",
                                          "\"tier\":\"all\",",    "\"x\":[1],",
                                          "\"entr\\u0069es\":1,", "\"entries\":[],"};
        buf_puts(b, pre[pick(odd ? 6 : 2)]);
        ws(b);
    }
    buf_puts(b, "\"entries\"");
    ws(b);
    buf_putc(b, ':');
    ws(b);
    buf_putc(b, '[');
    size_t n = pick(9);
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        ws(b);
        if (odd && pick(16) == 0) {
            static const char *const odd_elems[] = {"1", "null", "[]", "{}", "\"x\""};
            buf_puts(b, odd_elems[pick(5)]);
            ws(b);
            continue;
        }
        /* Members key and size_bytes in either order; now and then one
         * missing, repeated or unknown. */
        int order = (int)pick(2), with_size = odd ? (int)pick(4) != 0 : 1;
        buf_putc(b, '{');
        ws(b);
        for (int m = 0; m < 2; m++) {
            int is_key = (m == 0) == (order == 0);
            if (!is_key && !with_size)
                continue;
            if (m && (is_key || with_size))
                buf_putc(b, ',');
            ws(b);
            if (is_key) {
                buf_puts(b, odd && pick(20) == 0 ? "\"k\\u0065y\"" : "\"key\"");
                ws(b);
                buf_putc(b, ':');
                ws(b);
                gen_key(b, odd && pick(3) == 0);
            } else {
                buf_puts(b, "\"size_bytes\"");
                ws(b);
                buf_putc(b, ':');
                ws(b);
                buf_puts(b, sizes[odd ? pick(14) : pick(3)]);
            }
            ws(b);
        }
        if (odd && pick(10) == 0)
            buf_puts(b, pick(2) ? ",\"size_bytes\":5" : ",\"x\":1");
        buf_putc(b, '}');
        ws(b);
    }
    buf_putc(b, ']');
    ws(b);
    if (pick(3) == 0) {
        static const char *const post[] = {",\"tier\":\"l2\"",     ",\"tier\":\"l1\"",
                                           ",\"entries\":[]",      ",\"model_name\":\"m\"",
                                           ",\"x\":{\"y\":[1,2]}", ","};
        buf_puts(b, post[pick(odd ? 6 : 2)]);
    }
    ws(b);
    buf_putc(b, '}');
    if (odd && pick(8) == 0)
        buf_puts(b, pick(2) ? " x" : "\n");
}

/* A single-key store body; with odd != 0, sometimes an unusual one. */
static void gen_one_body(struct buf *b, int odd)
{
    static const char *const tiers[] = {"\"l1\"", "\"l2\"", "\"l3\"", "\"L1\"", "\"l\\u0031\"",
                                        "1",      "null",   "\"\"",   "\"l1 \""};
    buf_reset(b);
    ws(b);
    buf_putc(b, '{');
    int first = 1;
    size_t nm = odd ? pick(4) : pick(3);
    int start = (int)pick(2);
    for (size_t i = 0; i < nm; i++) {
        if (!first)
            buf_putc(b, ',');
        first = 0;
        ws(b);
        int which = odd && pick(8) == 0 ? 2 : (start + (int)i) % 2;
        if (which == 0) {
            buf_puts(b, "\"size_bytes\"");
            ws(b);
            buf_putc(b, ':');
            ws(b);
            buf_puts(b, sizes[odd ? pick(14) : pick(3)]);
        } else if (which == 1) {
            buf_puts(b, "\"tier\"");
            ws(b);
            buf_putc(b, ':');
            ws(b);
            buf_puts(b, tiers[odd ? pick(9) : pick(2)]);
        } else {
            buf_puts(b, pick(2) ? "\"x\":1" : "\"ti\\u0065r\":\"l1\"");
        }
        ws(b);
    }
    buf_putc(b, '}');
    ws(b);
    if (odd && pick(8) == 0)
        buf_puts(b, pick(2) ? " x" : ",");
}

Test(keyscan, common_store_bodies_take_the_fast_path)
{
    const char *bodies[] = {
        "{\"tier\":\"l2\",\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,"
        "\"chunk_hash_hex\":\"ab\"},\"size_bytes\":2097152}]}",
        "{\"entries\":[{\"size_bytes\":1,\"key\":{\"model_name\":\"m\",\"kv_rank\":1,"
        "\"chunk_hash_hex\":\"ab\"}},{\"key\":{\"model_name\":\"m\",\"kv_rank\":2,"
        "\"chunk_hash_hex\":\"cd\",\"object_group_id\":3}}],\"tier\":\"l1\"}",
        " { \"entries\" : [ ] } ",
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "\"size_bytes\":1099511627776}]}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        cr_assert_eq(diff_check_entries(bodies[i], strlen(bodies[i]), NULL), 1, "%s", bodies[i]);
    const char *ones[] = {"{}", "{\"size_bytes\":5}", " {\"tier\":\"l1\", \"size_bytes\":5}\n",
                          "{\"size_bytes\":1099511627776,\"tier\":\"l2\"}"};
    for (size_t i = 0; i < sizeof(ones) / sizeof(ones[0]); i++)
        cr_assert_eq(diff_check_one(ones[i], strlen(ones[i])), 1, "%s", ones[i]);
}

Test(keyscan, unusual_store_bodies_fall_back)
{
    const char *bodies[] = {
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "\"size_bytes\":0}]}",
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "\"size_bytes\":1099511627777}]}",
        "{\"entries\":[{\"size_bytes\":5}]}",
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}}]}",
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "\"size_bytes\":5,\"size_bytes\":5}]}",
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "\"x\":1}]}",
        "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"a\"}}]}",
        "{\"entries\":[1]}",
        "{\"entries\":{}}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        cr_assert_eq(diff_check_entries(bodies[i], strlen(bodies[i]), NULL), 0, "%s", bodies[i]);
    const char *ones[] = {"",
                          "[]",
                          "{\"size_bytes\":0}",
                          "{\"size_bytes\":5,\"size_bytes\":5}",
                          "{\"tier\":\"l3\"}",
                          "{\"tier\":\"all\"}",
                          "{\"x\":1}",
                          "{\"size_bytes\":5} x",
                          "{\"size_bytes\":5,}",
                          "{\"size_bytes\":1.0}"};
    for (size_t i = 0; i < sizeof(ones) / sizeof(ones[0]); i++)
        cr_assert_eq(diff_check_one(ones[i], strlen(ones[i])), 0, "%s", ones[i]);
}

Test(keyscan, entries_depth_limit_below_four_falls_back)
{
    static struct app app;
    app.cfg.max_keys_per_request = 100;
    const char *body = "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":1,"
                       "\"chunk_hash_hex\":\"ab\"},\"size_bytes\":5}]}";
    app.cfg.max_json_depth = 3;
    cr_assert_eq(diff_check_entries(body, strlen(body), &app), 0);
    app.cfg.max_json_depth = 4;
    cr_assert_eq(diff_check_entries(body, strlen(body), &app), 1);
}

static void entry_elem(struct buf *b, int i)
{
    buf_printf(b,
               "%s{\"key\":{\"model_name\":\"m\",\"kv_rank\":%d,\"chunk_hash_hex\":\"ab\"},"
               "\"size_bytes\":5}",
               i ? "," : "", i);
}

static int diff_check_entries_app(const char *body, size_t len, struct app *app)
{
    return diff_check_entries(body, len, app);
}

/* The value count of a body with its entries cut out, around the limit. */
Test(keyscan, value_count_matches_the_whole_body_for_entries)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 10;
    size_t limit = JSON_VALUES_PER_KEY * 10 + 4096;
    struct buf b;
    buf_init(&b);
    int took = 0, refused = 0;
    for (size_t zeros = limit - 80; zeros < limit; zeros++) {
        buf_reset(&b);
        buf_puts(&b, "{\"entries\":[");
        for (int i = 0; i < 10; i++)
            entry_elem(&b, i);
        buf_puts(&b, "],\"x\":[0");
        for (size_t z = 1; z < zeros; z++)
            buf_puts(&b, ",0");
        buf_puts(&b, "]}");
        if (diff_check_entries_app(b.data, b.len, &app)) {
            took++;
        } else {
            refused++;
            struct request req;
            memset(&req, 0, sizeof(req));
            req.body = b.data;
            req.body_len = b.len;
            req.app = &app;
            struct response res;
            memset(&res, 0, sizeof(res));
            cJSON *j = NULL;
            cr_assert_eq(json_parse_body(&req, &res, &j), KVIDX_EBODYSIZE);
            buf_free(&res.body);
        }
    }
    cr_assert(took > 0 && refused > 0, "the boundary was not crossed (%d/%d)", took, refused);
    buf_free(&b);
}

Test(keyscan, generated_and_mutated_store_bodies_agree)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 6;
    struct buf b, m;
    buf_init(&b);
    buf_init(&m);
    n_fast_entries = n_fast_one = 0;
    size_t tried_one = 0;
    for (int round = 0; round < 40000; round++) {
        struct app *a = round % 5 == 0 ? &app : NULL;
        if (round % 4 == 3) {
            gen_one_body(&b, round % 2);
            cr_assert(!b.failed);
            diff_check_one(b.data, b.len);
            for (int k = 0; k < 3; k++) {
                mutate(&m, &b);
                diff_check_one(m.data, m.len);
            }
            tried_one++;
            continue;
        }
        if (round % 8 == 2)
            gen_ipc_body(&b, round % 2);
        else
            gen_entries_body(&b, round % 2);
        cr_assert(!b.failed);
        diff_check_entries(b.data, b.len, a);
        if (round % 50 == 0)
            for (size_t cut = 0; cut < b.len; cut++)
                diff_check_entries(b.data, cut, a);
        for (int k = 0; k < 3; k++) {
            mutate(&m, &b);
            cr_assert(!m.failed);
            diff_check_entries(m.data, m.len, a);
        }
    }
    cr_assert(n_fast_entries > 4000 && n_fast_one > 2000, "entries %zu, single %zu of %zu",
              n_fast_entries, n_fast_one, tried_one);
    cr_log_info("keyscan: %zu store bodies and %zu single-key bodies on the fast path",
                n_fast_entries, n_fast_one);
    buf_free(&b);
    buf_free(&m);
}

/* Strings are scanned several bytes a step: a quote, a backslash, a raw
 * control byte or a stray UTF-8 lead byte at any offset of a long model
 * name, salt or hash (and a second key's model equal to the first one's
 * but for that byte) must give what cJSON gives. Each template is cut at
 * "@": the long string goes between the pieces. */
Test(keyscan, special_bytes_at_every_offset_of_long_strings)
{
    static const char *const templates[] = {
        "{\"keys\":[{\"model_name\":\"@\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\","
        "\"cache_salt\":\"@\"}]}",
        "{\"keys\":[{\"model_name\":\"0123456789abcdef0123456789abcdef0123456789abcdef\","
        "\"kv_rank\":1,\"chunk_hash_hex\":\"ab\"},"
        "{\"model_name\":\"@\",\"kv_rank\":2,\"chunk_hash_hex\":\"cd\"}]}",
        "{\"keys\":[{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"@\"}]}",
    };
    static const char specials[] = {'"', '\\', 0x01, 0x1f, 0x0a, (char)0xc3, 'x'};
    enum { LEN = 48 };
    for (size_t t = 0; t < sizeof(templates) / sizeof(templates[0]); t++) {
        const char *cut = strchr(templates[t], '@');
        cr_assert_not_null(cut);
        size_t head = (size_t)(cut - templates[t]), tail = strlen(cut + 1);
        for (size_t at = 0; at < LEN; at++) {
            for (size_t b = 0; b < sizeof(specials); b++) {
                char body[512];
                cr_assert(head + LEN + tail < sizeof(body));
                memcpy(body, templates[t], head);
                for (size_t i = 0; i < LEN; i++)
                    body[head + i] = "0123456789abcdef"[i % 16];
                body[head + at] = specials[b];
                memcpy(body + head + LEN, cut + 1, tail);
                size_t n = head + LEN + tail;
                /* diff_check asserts that a body taken on the fast path
                 * gives cJSON's keys and tree. Only 'x' leaves a valid
                 * string (a name byte, not a hex digit). */
                int want = specials[b] == 'x' && t != 3;
                cr_assert_eq(diff_check(body, n, NULL), want, "byte 0x%02x at %zu of template %zu",
                             (unsigned char)specials[b], at, t);
            }
        }
    }
}
