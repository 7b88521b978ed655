/* The streaming JSON writer and the JSON helpers of the daemon. */
#include <criterion/criterion.h>

#include "util/json_write.h"
#include "util/context.h"
#include "api/body.h"
#include "util/json_read.h"

#include "kvidx/err.h"

#include <stdio.h>
#include <string.h>

static cJSON *roundtrip_string(const char *s, size_t n, struct buf *b)
{
    struct jw w;
    buf_reset(b);
    jw_init(&w, b);
    jw_arr_begin(&w);
    jw_strn(&w, s, n);
    jw_arr_end(&w);
    cr_assert(!b->failed);
    cJSON *j = cJSON_ParseWithLength(b->data, b->len);
    cr_assert_not_null(j, "writer produced invalid JSON: %s", b->data);
    return j;
}

Test(jw, escapes_round_trip_through_cjson)
{
    struct buf b;
    buf_init(&b);
    const char *cases[] = {"plain",
                           "quote\"back\\slash",
                           "tab\tnl\ncr\r",
                           "\x01\x1f ctl",
                           "утф-8 ü",
                           "emoji \xf0\x9f\x98\x80",
                           ""};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *j = roundtrip_string(cases[i], strlen(cases[i]), &b);
        cr_assert_str_eq(cJSON_GetArrayItem(j, 0)->valuestring, cases[i]);
        cJSON_Delete(j);
    }
    buf_free(&b);
}

Test(jw, invalid_utf8_becomes_replacement_char)
{
    struct buf b;
    buf_init(&b);
    /* lone continuation, overlong '/', surrogate, truncated sequence */
    const char *bad[] = {"a\x80z", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *j = roundtrip_string(bad[i], strlen(bad[i]), &b);
        cr_assert_not_null(strstr(b.data, "\\ufffd"), "case %zu: %s", i, b.data);
        cJSON_Delete(j);
    }
    buf_free(&b);
}

Test(jw, commas_and_nesting)
{
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_obj_begin(&w);
    jw_key(&w, "a");
    jw_arr_begin(&w);
    jw_u64(&w, 1);
    jw_i64(&w, -2);
    jw_obj_begin(&w);
    jw_obj_end(&w);
    jw_arr_end(&w);
    jw_key(&w, "b");
    jw_null(&w);
    jw_key(&w, "c");
    jw_bool(&w, 1);
    jw_key(&w, "d");
    jw_u64(&w, UINT64_MAX);
    jw_obj_end(&w);
    cr_assert_str_eq(b.data, "{\"a\":[1,-2,{}],\"b\":null,\"c\":true,\"d\":18446744073709551615}");
    buf_free(&b);
}

Test(json, depth_counts_brackets_outside_strings)
{
    cr_assert_eq(json_depth("{}", 2, 32), 1);
    cr_assert_eq(json_depth("[[[]]]", 6, 32), 3);
    cr_assert_eq(json_depth("{\"a\":\"[[[[\"}", 12, 32), 1);
    cr_assert_eq(json_depth("[\"\\\"[[\"]", 8, 32), 1);
    cr_assert_eq(json_depth("1", 1, 32), 0);
    char deep[100];
    memset(deep, '[', sizeof(deep));
    cr_assert_eq(json_depth(deep, sizeof(deep), 32), 33, "stops one past the limit");
}

Test(json, key_members)
{
    kvidx_key_t k;
    kvidx_reason_t why;
    cJSON *ok = cJSON_Parse("{\"model_name\":\"m\",\"kv_rank\":2.0,\"chunk_hash_hex\":\"AB\"}");
    cr_assert_eq(json_to_key(ok, &k, &why), 0);
    cr_assert_eq(k.kv_rank, 2);
    cr_assert_eq(k.hash_len, 1);
    cr_assert_eq(k.hash[0], 0xab);
    cJSON_Delete(ok);
    const char *bad[] = {
        "{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash\":\"ab\"}",
        "{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\",\"extra\":1}",
        "{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\",\"kv_rank\":2}",
        "{\"model_name\":\"m\",\"kv_rank\":1.5,\"chunk_hash_hex\":\"ab\"}",
        "{\"model_name\":\"m\",\"kv_rank\":\"1\",\"chunk_hash_hex\":\"ab\"}",
        "{\"model_name\":\"m\",\"kv_rank\":true,\"chunk_hash_hex\":\"ab\"}",
        "[1]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *j = cJSON_Parse(bad[i]);
        cr_assert_not_null(j);
        cr_assert_neq(json_to_key(j, &k, &why), 0, "accepted %s", bad[i]);
        cJSON_Delete(j);
    }
}

Test(json, escaped_nul_in_a_key_string_is_rejected)
{
    const char *body = "{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\","
                       "\"cache_salt\":\"a\\u0000b\"}";
    struct request req;
    struct response res;
    memset(&req, 0, sizeof(req));
    memset(&res, 0, sizeof(res));
    req.body = body;
    req.body_len = strlen(body);
    cJSON *j = NULL;
    cr_assert_eq(json_parse_body(&req, &res, &j), 0);
    kvidx_key_t k;
    kvidx_reason_t why;
    cr_assert_neq(json_to_key(j, &k, &why), 0, "a salt with NUL must not become salt \"a\"");
    cr_assert_str_eq(why.field, "cache_salt");
    cJSON_Delete(j);
    /* An escaped backslash followed by u0000 is a plain string, not a NUL. */
    const char *plain = "{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash_hex\":\"ab\","
                        "\"cache_salt\":\"a\\\\u0000b\"}";
    req.body = plain;
    req.body_len = strlen(plain);
    cr_assert_eq(json_parse_body(&req, &res, &j), 0);
    cr_assert_eq(json_to_key(j, &k, &why), KVIDX_EKEY, "backslash is forbidden in salts");
    cr_assert_str_eq(why.field, "cache_salt");
    cJSON_Delete(j);
    buf_free(&res.body);
}

Test(json, bodies_of_tiny_values_are_refused_before_parsing)
{
    static struct app app;
    app.cfg.max_json_depth = 32;
    app.cfg.max_keys_per_request = 10;
    size_t limit = JSON_VALUES_PER_KEY * 10 + 4096;
    struct buf body;
    buf_init(&body);
    buf_putc(&body, '[');
    for (size_t i = 0; i < limit; i++)
        buf_puts(&body, "0,");
    buf_puts(&body, "0]");
    struct request req;
    struct response res;
    memset(&req, 0, sizeof(req));
    memset(&res, 0, sizeof(res));
    req.app = &app;
    req.body = body.data;
    req.body_len = body.len;
    cJSON *j = NULL;
    cr_assert_eq(json_parse_body(&req, &res, &j), KVIDX_EBODYSIZE);
    cr_assert_eq(res.status, 413);
    cr_assert_null(j);
    buf_free(&res.body);
    /* One value fewer than the bound parses; commas inside strings do not count. */
    buf_reset(&body);
    buf_puts(&body, "[\",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,\"");
    for (size_t i = 0; i + 2 < limit; i++)
        buf_puts(&body, ",0");
    buf_putc(&body, ']');
    req.body = body.data;
    req.body_len = body.len;
    memset(&res, 0, sizeof(res));
    cr_assert_eq(json_parse_body(&req, &res, &j), 0);
    cJSON_Delete(j);
    buf_free(&res.body);
    buf_free(&body);
}

Test(json, param_errors_keep_every_index_but_not_floods)
{
    static const char unknown[] = "unknown member";
    static const char bad[] = "must be an integer";
    struct param_errors pe;
    param_errors_init(&pe);
    for (int i = 0; i < 100000; i++) {
        param_errors_add(&pe, unknown, "body");
        param_errors_add(&pe, unknown, "tier");
    }
    cr_assert_eq(pe.n, 2, "a flood of one error in one object is one entry each");
    for (int i = 0; i < 1000; i++)
        param_errors_add(&pe, bad, "entries[%d].size_bytes", i);
    cr_assert_eq(pe.n, 1002, "every bad index is listed");
    struct response res;
    memset(&res, 0, sizeof(res));
    cr_assert_eq(param_errors_respond(&pe, &res, KVIDX_EINVAL, "bad"), KVIDX_EINVAL);
    cJSON *j = cJSON_ParseWithLength(res.body.data, res.body.len);
    cr_assert_not_null(j);
    const cJSON *ip = cJSON_GetObjectItem(j, "invalid_params");
    cr_assert_eq(cJSON_GetArraySize(ip), 1002);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ip, 1001), "name")->valuestring,
                     "entries[999].size_bytes");
    cJSON_Delete(j);
    buf_free(&res.body);
    param_errors_free(&pe);
}

/* text[0..n) parsed as a request body with the default limits: 0 and the
 * tree, or the error with the answer's status and code checked. */
static int parse_n(const char *text, size_t n, cJSON **out)
{
    struct request req;
    struct response res;
    memset(&req, 0, sizeof(req));
    memset(&res, 0, sizeof(res));
    req.body = text;
    req.body_len = n;
    *out = NULL;
    int rc = json_parse_body(&req, &res, out);
    if (rc == KVIDX_EJSON) {
        cr_assert_eq(res.status, 400);
        cr_assert_not_null(strstr(res.body.data, "\"code\":\"invalid_json\""), "%s", res.body.data);
    }
    buf_free(&res.body);
    return rc;
}

/* tpl with its one '@' replaced by s, into out (cap bytes); the length. */
static size_t fill(char *out, size_t cap, const char *tpl, const char *s)
{
    const char *at = strchr(tpl, '@');
    cr_assert_not_null(at);
    size_t pre = (size_t)(at - tpl), sl = strlen(s), post = strlen(at + 1);
    cr_assert(pre + sl + post < cap);
    memcpy(out, tpl, pre);
    memcpy(out + pre, s, sl);
    memcpy(out + pre + sl, at + 1, post + 1);
    return pre + sl + post;
}

/* RFC 8259 forbids raw bytes below 0x20 inside strings. cJSON copies them,
 * so a raw NUL used to cut a string short: "llama<NUL>@evil" was read as
 * the valid model "llama". Every such body is invalid_json, whatever the
 * string is (a value, a member name, a key field, an array element). */
Test(json, raw_control_characters_in_strings_are_invalid_json)
{
    static const char *const templates[] = {
        "{\"entries\":[{\"key\":{\"chunk_hash_hex\":\"aa\",\"model_name\":\"llamaX@evil\","
        "\"kv_rank\":0},\"size_bytes\":1}]}",
        "{\"keys\":[{\"chunk_hash_hex\":\"bbXzz\",\"model_name\":\"m\",\"kv_rank\":0}]}",
        "{\"tier\":\"l1Xx\"}",
        "{\"tierXjunk\":\"l1\"}",
        "{\"chunk_hashes\":[\"aa\",\"X\"]}",
        "\"X\"",
        "[\"a\",\"bX\"]",
        "{\"a\":\"X\\\"\"}",
    };
    static const unsigned char bytes[] = {0x00, 0x01, 0x09, 0x0a, 0x0d, 0x1f};
    for (size_t t = 0; t < sizeof(templates) / sizeof(templates[0]); t++) {
        for (size_t b = 0; b < sizeof(bytes); b++) {
            char text[256];
            size_t tl = strlen(templates[t]);
            cr_assert(tl < sizeof(text));
            memcpy(text, templates[t], tl + 1);
            int n = (int)tl;
            char *x = memchr(text, 'X', (size_t)n);
            cr_assert_not_null(x);
            cJSON *j = NULL;
            cr_assert_eq(parse_n(text, (size_t)n, &j), 0, "the template parses: %s", text);
            cJSON_Delete(j);
            *x = (char)bytes[b];
            cr_assert_eq(parse_n(text, (size_t)n, &j), KVIDX_EJSON, "byte 0x%02x in %s", bytes[b],
                         templates[t]);
            cr_assert_null(j);
        }
    }
    /* Bytes from 0x20 up, DEL and non-ASCII included, are plain content. */
    static const char ok[] = "[\" \x7f\xc3\xa9\"]";
    cJSON *j = NULL;
    cr_assert_eq(parse_n(ok, sizeof(ok) - 1, &j), 0);
    cJSON_Delete(j);
}

/* Between tokens only the four JSON white-space bytes may stand; cJSON
 * skips any byte up to 0x20 there. A trailing NUL is no exception. */
Test(json, control_bytes_between_tokens_are_invalid_json)
{
    static const char *const bad[] = {"\x01[1]", "[\x0b 1]",      "[1\x00]",
                                      "[1]\x00", "{\"a\"\x1f:1}", "[1,\x0c 2]"};
    static const size_t len[] = {4, 5, 4, 4, 8, 6};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *j = NULL;
        cr_assert_eq(parse_n(bad[i], len[i], &j), KVIDX_EJSON, "case %zu", i);
        cr_assert_null(j);
    }
    static const char ws[] = " \t\r\n{ \"a\" :\t[ 1 ,\r\n2 ] } \n";
    cJSON *j = NULL;
    cr_assert_eq(parse_n(ws, sizeof(ws) - 1, &j), 0);
    cJSON_Delete(j);
}

/* Numbers follow RFC 8259's grammar: -? (0 | [1-9][0-9]*) (.[0-9]+)?
 * ([eE][+-]?[0-9]+)?. cJSON's strtod takes 01, 1., -01 and 1.e5 too. */
Test(json, numbers_follow_the_json_grammar)
{
    static const char *const bad[] = {"01",    "1.",  "-01", "1.e5",  ".5",   "+1",  "-",   "1e",
                                      "1e+",   "00",  "-00", "1.5e",  "0x10", "1E",  "--1", "1..2",
                                      "1e5.5", "-.5", "0.",  "012.5", "1e-",  "2.e0"};
    static const char *const wrap[] = {"@", "[@]", "{\"a\":@}", "[0,@,0]", "{\"a\": @ }"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (size_t w = 0; w < sizeof(wrap) / sizeof(wrap[0]); w++) {
            char text[64];
            size_t n = fill(text, sizeof(text), wrap[w], bad[i]);
            cJSON *j = NULL;
            cr_assert_eq(parse_n(text, n, &j), KVIDX_EJSON, "accepted %s", text);
            cr_assert_null(j);
        }
    }
    static const struct {
        const char *text;
        double v;
    } good[] = {{"0", 0},        {"-0", -0.0},
                {"1", 1},        {"-1", -1},
                {"10", 10},      {"1.5", 1.5},
                {"0.5", 0.5},    {"-0.0", -0.0},
                {"1e5", 1e5},    {"1E5", 1e5},
                {"1e+5", 1e5},   {"1e-5", 1e-5},
                {"2.0", 2},      {"2e0", 2},
                {"0.2e1", 2},    {"4294967295", 4294967295.0},
                {"1.0E+2", 100}, {"-12.25e-2", -0.1225}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        for (size_t w = 0; w < sizeof(wrap) / sizeof(wrap[0]); w++) {
            char text[64];
            size_t n = fill(text, sizeof(text), wrap[w], good[i].text);
            cJSON *j = NULL;
            cr_assert_eq(parse_n(text, n, &j), 0, "refused %s", text);
            const cJSON *v = cJSON_IsArray(j)    ? cJSON_GetArrayItem(j, w == 3 ? 1 : 0)
                             : cJSON_IsObject(j) ? cJSON_GetObjectItem(j, "a")
                                                 : j;
            cr_assert(cJSON_IsNumber(v) && v->valuedouble == good[i].v, "%s", text);
            cJSON_Delete(j);
        }
    }
    /* In a string, digits are just text. */
    cJSON *j = NULL;
    cr_assert_eq(parse_n("[\"01\",\"1.\",\"+1\"]", 16, &j), 0);
    cJSON_Delete(j);
}

/* cJSON ends its strings at a decoded NUL, so "l1\u0000x" would be read as
 * "l1" and "tier\u0000junk" as the member "tier". In the tree an escaped
 * NUL reads as '@' instead: every string keeps its decoded length (strlen
 * is the length), and none equals the shorter name or value it would have
 * been cut to. Key fields all forbid '@' (test above: invalid_key). */
Test(json, escaped_nul_keeps_every_string_its_length)
{
    static const char text[] = "{\"tier\\u0000junk\":\"l1\\u0000x\",\"t\":[\"a\\u0000\","
                               "\"\\u0000\",\"\\\\u0000\"],\"\\u0000\":1}";
    cJSON *j = NULL;
    cr_assert_eq(parse_n(text, sizeof(text) - 1, &j), 0);
    const cJSON *m = j->child;
    cr_assert_str_eq(m->string, "tier@junk");
    cr_assert_str_eq(m->valuestring, "l1@x");
    size_t n = 0;
    cr_assert_eq(json_str(m, &n), m->valuestring);
    cr_assert_eq(n, 4);
    const cJSON *t = m->next;
    cr_assert_str_eq(cJSON_GetArrayItem(t, 0)->valuestring, "a@");
    cr_assert_str_eq(cJSON_GetArrayItem(t, 1)->valuestring, "@");
    cr_assert_str_eq(cJSON_GetArrayItem(t, 2)->valuestring, "\\u0000", "an escaped backslash");
    cr_assert_str_eq(t->next->string, "@");
    cr_assert_null(json_str(t, &n), "an array is no string");
    cJSON_Delete(j);
}

/* A member named twice in a key object is reported as repeated, not as
 * unknown (the name is a valid one). */
Test(json, repeated_key_member_is_called_repeated)
{
    kvidx_key_t k;
    kvidx_reason_t why;
    cJSON *j = cJSON_Parse("{\"model_name\":\"m\",\"kv_rank\":1,\"kv_rank\":1,"
                           "\"chunk_hash_hex\":\"ab\"}");
    cr_assert_eq(json_to_key(j, &k, &why), KVIDX_EKEY);
    cr_assert_str_eq(why.field, "key");
    cr_assert_not_null(strstr(why.rule, "repeated member"), "%s", why.rule);
    cr_assert_null(strstr(why.rule, "unknown"), "%s", why.rule);
    cJSON_Delete(j);
    j = cJSON_Parse("{\"model_name\":\"m\",\"kv_rank\":1,\"chunk_hash\":\"ab\"}");
    cr_assert_eq(json_to_key(j, &k, &why), KVIDX_EKEY);
    cr_assert_not_null(strstr(why.rule, "unknown member"), "%s", why.rule);
    cJSON_Delete(j);
    /* Unknown and repeated together: the unknown one is named first. */
    j = cJSON_Parse("{\"model_name\":\"m\",\"model_name\":\"m\",\"kv_rank\":1,\"x\":1,"
                    "\"chunk_hash_hex\":\"ab\"}");
    cr_assert_eq(json_to_key(j, &k, &why), KVIDX_EKEY);
    cr_assert_not_null(strstr(why.rule, "unknown member"), "%s", why.rule);
    cJSON_Delete(j);
}

/* jw_indices writes the positions whose flag has the bit, as a JSON array
 * of decimals; runs of consecutive positions are written by incrementing
 * the previous digits, so the carries (9 -> 10, 999 -> 1000) and the jumps
 * after a gap must give what a plain conversion gives. jw_hex_at and
 * jw_u64_at, the listing's writers, against snprintf. */
Test(jw, indices_hex_and_decimals_match_snprintf)
{
    enum { N = 12000 };
    static uint8_t flags[N];
    for (int mode = 0; mode < 4; mode++) {
        unsigned seed = 7;
        for (size_t i = 0; i < N; i++) {
            seed = seed * 1103515245u + 12345u;
            flags[i] = mode == 0 ? 1 : mode == 1 ? (uint8_t)(seed >> 16) : mode == 2 ? 0 : 2;
            if (mode == 3 && (i % 1000 == 999 || i % 100 == 0))
                flags[i] = 1;
        }
        struct buf got, want;
        buf_init(&got);
        buf_init(&want);
        struct jw w;
        jw_init(&w, &got);
        jw_indices(&w, flags, N, 1);
        buf_putc(&want, '[');
        int first = 1;
        for (size_t i = 0; i < N; i++) {
            if (!(flags[i] & 1))
                continue;
            buf_printf(&want, first ? "%zu" : ",%zu", i);
            first = 0;
        }
        buf_putc(&want, ']');
        cr_assert(!got.failed && !want.failed);
        cr_assert_eq(got.len, want.len, "mode %d", mode);
        cr_assert(memcmp(got.data, want.data, want.len) == 0, "mode %d", mode);
        buf_free(&got);
        buf_free(&want);
    }
    static const uint64_t vals[] = {
        0,         9,         10,         99,         100,
        65535,     999999999, 1000000000, UINT32_MAX, (uint64_t)UINT32_MAX + 1,
        UINT64_MAX};
    for (size_t v = 0; v < sizeof(vals) / sizeof(vals[0]); v++) {
        char out[32], ref[32];
        char *e = jw_u64_at(out, vals[v]);
        *e = 0;
        snprintf(ref, sizeof(ref), "%llu", (unsigned long long)vals[v]);
        cr_assert_str_eq(out, ref);
    }
    uint8_t bytes[64];
    for (size_t i = 0; i < sizeof(bytes); i++)
        bytes[i] = (uint8_t)(i * 37 + 11);
    for (size_t n = 0; n <= sizeof(bytes); n++) {
        char out[2 * 64 + 1], ref[2 * 64 + 1];
        char *e = jw_hex_at(out, bytes, n);
        cr_assert_eq((size_t)(e - out), 2 * n);
        *e = 0;
        for (size_t i = 0; i < n; i++)
            snprintf(ref + 2 * i, 3, "%02x", bytes[i]);
        ref[2 * n] = 0;
        cr_assert_str_eq(out, ref, "n = %zu", n);
    }
}

Test(buf, shrink_gives_back_slack_past_the_bound_and_keeps_the_bytes)
{
    struct buf b;
    buf_init(&b);
    buf_shrink(&b, 0); /* empty: nothing to do */
    cr_assert_null(b.data);
    cr_assert_eq(buf_reserve(&b, 1u << 20), 0);
    buf_puts(&b, "0123456789");
    cr_assert_geq(b.cap, (size_t)(1u << 20));
    buf_shrink(&b, b.cap); /* within the bound: kept */
    cr_assert_geq(b.cap, (size_t)(1u << 20));
    buf_shrink(&b, 100);
    cr_assert_eq(b.cap, 11, "cap %zu", b.cap);
    cr_assert_eq(b.len, 10);
    cr_assert_str_eq(b.data, "0123456789");
    buf_puts(&b, "ab"); /* still a working buffer */
    cr_assert_str_eq(b.data, "0123456789ab");
    cr_assert(!b.failed);
    size_t cap = b.cap;
    buf_shrink(&b, cap - b.len - 1); /* slack exactly at the bound: kept */
    cr_assert_eq(b.cap, cap);
    buf_free(&b);
}
