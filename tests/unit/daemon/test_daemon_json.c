/* The streaming JSON writer and the JSON helpers of the daemon. */
#include <criterion/criterion.h>

#include "util/json_write.h"
#include "util/context.h"
#include "util/json_read.h"

#include "kvidx/err.h"

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
