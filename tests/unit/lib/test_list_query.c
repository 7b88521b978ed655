/* Tests of the `GET /v1/keys` query parser and the filter digest (docs/page_tokens.md). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/list_query.h"

static int parse(const char *qs, kvidx_list_query_t *q, kvidx_reason_t *why)
{
    kvidx_reason_t dummy;
    return kvidx_list_query_parse(qs, strlen(qs), q, why ? why : &dummy, NULL);
}

static kvidx_list_query_t must_parse(const char *qs)
{
    kvidx_list_query_t q;
    kvidx_reason_t why = {0};
    int rc = parse(qs, &q, &why);
    cr_assert_eq(rc, 0, "parse(%s) = %d (%s: %s)", qs, rc, why.field ? why.field : "-",
                 why.rule ? why.rule : "-");
    return q;
}

Test(list_query, empty_gives_defaults)
{
    kvidx_list_query_t q = must_parse("");
    cr_assert_eq(q.has_model + q.has_salt + q.has_rank + q.has_group, 0);
    cr_assert_eq(q.tier, KVIDX_LIST_TIER_ANY);
    cr_assert_eq(q.page_size, 500);
    cr_assert_eq(q.token_len, 0);
}

Test(list_query, every_parameter)
{
    kvidx_list_query_t q = must_parse("model_name=meta-llama%2FLlama-3.1-8B&cache_salt=alice&"
                                      "kv_rank=33620481&object_group_id=2&tier=l1&page_size=10&"
                                      "page_token=abc-_");
    cr_assert_eq(q.has_model, 1);
    cr_assert_str_eq(q.model, "meta-llama/Llama-3.1-8B");
    cr_assert_eq(q.model_len, strlen("meta-llama/Llama-3.1-8B"));
    cr_assert_eq(q.has_salt, 1);
    cr_assert_str_eq(q.salt, "alice");
    cr_assert_eq(q.has_rank, 1);
    cr_assert_eq(q.kv_rank, 0x02010201u);
    cr_assert_eq(q.has_group, 1);
    cr_assert_eq(q.group, 2);
    cr_assert_eq(q.tier, KVIDX_LIST_TIER_L1);
    cr_assert_eq(q.page_size, 10);
    cr_assert_eq(q.token_len, 5);
    cr_assert_str_eq(q.token, "abc-_");
}

Test(list_query, raw_slash_in_model)
{
    kvidx_list_query_t q = must_parse("model_name=org/model");
    cr_assert_str_eq(q.model, "org/model");
}

Test(list_query, tiers)
{
    cr_assert_eq(must_parse("tier=l1").tier, KVIDX_LIST_TIER_L1);
    cr_assert_eq(must_parse("tier=l2").tier, KVIDX_LIST_TIER_L2);
    cr_assert_eq(must_parse("tier=any").tier, KVIDX_LIST_TIER_ANY);
    cr_assert_eq(must_parse("tier=%6C2").tier, KVIDX_LIST_TIER_L2);
    const char *bad[] = {"tier=", "tier=L1", "tier=l3", "tier=all", "tier=anyx", "tier=l", "tier"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvidx_list_query_t q;
        kvidx_reason_t why = {0};
        cr_assert_eq(parse(bad[i], &q, &why), KVIDX_EINVAL, "%s", bad[i]);
        cr_assert_str_eq(why.field, "tier");
    }
}

struct size_case {
    char qs[64];
    int rc;
    uint32_t size;
};

static struct size_case size_cases[] = {
    {"", 0, 500},
    {"page_size=0", 0, 500},
    {"page_size=000", 0, 500},
    {"page_size=1", 0, 1},
    {"page_size=500", 0, 500},
    {"page_size=4999", 0, 4999},
    {"page_size=5000", 0, 5000},
    {"page_size=5001", 0, 5000},
    {"page_size=99999999999999999999999999999", 0, 5000},
    {"page_size=-1", KVIDX_EINVAL, 0},
    {"page_size=-0", KVIDX_EINVAL, 0},
    {"page_size=%2B5", KVIDX_EINVAL, 0},
    {"page_size=+5", KVIDX_EINVAL, 0},
    {"page_size=1.5", KVIDX_EINVAL, 0},
    {"page_size=10.0", KVIDX_EINVAL, 0},
    {"page_size=1e3", KVIDX_EINVAL, 0},
    {"page_size=abc", KVIDX_EINVAL, 0},
    {"page_size=0x10", KVIDX_EINVAL, 0},
    {"page_size=", KVIDX_EINVAL, 0},
    {"page_size", KVIDX_EINVAL, 0},
    {"page_size=%20", KVIDX_EINVAL, 0},
    {"page_size=5%", KVIDX_EINVAL, 0},
};

ParameterizedTestParameters(list_query, page_size)
{
    return cr_make_param_array(struct size_case, size_cases,
                               sizeof size_cases / sizeof size_cases[0]);
}

ParameterizedTest(struct size_case *c, list_query, page_size)
{
    kvidx_list_query_t q;
    kvidx_reason_t why = {0};
    int rc = parse(c->qs, &q, &why);
    cr_assert_eq(rc, c->rc, "%s: rc %d", c->qs, rc);
    if (rc == 0)
        cr_assert_eq(q.page_size, c->size, "%s: %u", c->qs, q.page_size);
    else
        cr_assert_str_eq(why.field, "page_size");
}

struct num_case {
    char qs[64];
    int rc;
    uint32_t v;
};

static struct num_case num_cases[] = {
    {"kv_rank=0", 0, 0},
    {"kv_rank=4294967295", 0, 4294967295u},
    {"kv_rank=0xffffffff", 0, 4294967295u},
    {"kv_rank=0XFFFFFFFF", 0, 4294967295u},
    {"kv_rank=0x02010201", 0, 0x02010201u},
    {"kv_rank=0x0", 0, 0},
    {"kv_rank=007", 0, 7},
    {"kv_rank=4294967296", KVIDX_EINVAL, 0},
    {"kv_rank=0x100000000", KVIDX_EINVAL, 0},
    {"kv_rank=0x", KVIDX_EINVAL, 0},
    {"kv_rank=x10", KVIDX_EINVAL, 0},
    {"kv_rank=-1", KVIDX_EINVAL, 0},
    {"kv_rank=1.0", KVIDX_EINVAL, 0},
    {"kv_rank=", KVIDX_EINVAL, 0},
    {"kv_rank=1%200", KVIDX_EINVAL, 0},
    {"kv_rank=ff", KVIDX_EINVAL, 0},
    {"kv_rank=99999999999999999999999", KVIDX_EINVAL, 0},
    {"object_group_id=0", 0, 0},
    {"object_group_id=65535", 0, 65535},
    {"object_group_id=0xffff", 0, 65535},
    {"object_group_id=0x1F", 0, 31},
    {"object_group_id=65536", KVIDX_EINVAL, 0},
    {"object_group_id=0x10000", KVIDX_EINVAL, 0},
    {"object_group_id=-1", KVIDX_EINVAL, 0},
    {"object_group_id=abc", KVIDX_EINVAL, 0},
    {"object_group_id=", KVIDX_EINVAL, 0},
};

ParameterizedTestParameters(list_query, numbers)
{
    return cr_make_param_array(struct num_case, num_cases, sizeof num_cases / sizeof num_cases[0]);
}

ParameterizedTest(struct num_case *c, list_query, numbers)
{
    kvidx_list_query_t q;
    kvidx_reason_t why = {0};
    int rc = parse(c->qs, &q, &why);
    cr_assert_eq(rc, c->rc, "%s: rc %d", c->qs, rc);
    int rank = strncmp(c->qs, "kv_rank", 7) == 0;
    if (rc == 0) {
        if (rank) {
            cr_assert_eq(q.has_rank, 1);
            cr_assert_eq(q.kv_rank, c->v, "%s", c->qs);
        } else {
            cr_assert_eq(q.has_group, 1);
            cr_assert_eq(q.group, c->v, "%s", c->qs);
        }
    } else {
        cr_assert_str_eq(why.field, rank ? "kv_rank" : "object_group_id");
    }
}

Test(list_query, salt_absent_vs_empty)
{
    kvidx_list_query_t a = must_parse("model_name=m");
    cr_assert_eq(a.has_salt, 0);
    kvidx_list_query_t b = must_parse("model_name=m&cache_salt=");
    cr_assert_eq(b.has_salt, 1);
    cr_assert_eq(b.salt_len, 0);
    cr_assert_str_eq(b.salt, "");
    kvidx_list_query_t c = must_parse("model_name=m&cache_salt");
    cr_assert_eq(c.has_salt, 1);
    cr_assert_eq(c.salt_len, 0);
    uint8_t da[KVIDX_LIST_DIGEST_LEN], db[KVIDX_LIST_DIGEST_LEN];
    kvidx_list_query_digest(&a, da);
    kvidx_list_query_digest(&b, db);
    cr_assert_neq(memcmp(da, db, sizeof da), 0, "absent salt and empty salt are other filters");
}

Test(list_query, salt_rules)
{
    cr_assert_str_eq(must_parse("cache_salt=a%20b").salt, "a b");
    const char *bad[] = {"cache_salt=a%2Fb", "cache_salt=a/b",   "cache_salt=a%40b",
                         "cache_salt=a%5Cb", "cache_salt=a%00b", "cache_salt=%FF"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvidx_list_query_t q;
        kvidx_reason_t why = {0};
        cr_assert_eq(parse(bad[i], &q, &why), KVIDX_EINVAL, "%s", bad[i]);
        cr_assert_str_eq(why.field, "cache_salt");
    }
    char buf[300] = "cache_salt=";
    memset(buf + strlen(buf), 's', 128);
    cr_assert_eq(must_parse(buf).salt_len, 128);
    strcat(buf, "s");
    kvidx_list_query_t q;
    kvidx_reason_t why = {0};
    cr_assert_eq(parse(buf, &q, &why), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "cache_salt");
}

Test(list_query, percent_decoding)
{
    cr_assert_str_eq(must_parse("model_name=a%2Fb").model, "a/b");
    cr_assert_str_eq(must_parse("model_name=a%2fb").model, "a/b");
    cr_assert_str_eq(must_parse("model_name=a+b").model, "a b");
    cr_assert_str_eq(must_parse("model_name=a%2Bb").model, "a+b");
    cr_assert_str_eq(must_parse("model_name=%E2%82%AC").model, "\xe2\x82\xac");
    cr_assert_str_eq(must_parse("model_name=a%3Db").model, "a=b");
    cr_assert_str_eq(must_parse("model_name=a=b").model, "a=b"); /* first '=' splits */
    cr_assert_str_eq(must_parse("model_name=a%26b").model, "a&b");
    cr_assert_str_eq(must_parse("model%5Fname=x").model, "x"); /* names decode too */
}

Test(list_query, bad_escapes)
{
    const char *bad[] = {"model_name=a%",   "model_name=a%2",     "model_name=a%G0",
                         "model_name=a%0g", "cache_salt=%",       "page_token=%zz",
                         "kv_rank=%3",      "object_group_id=1%", "tier=%"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvidx_list_query_t q;
        kvidx_reason_t why = {0};
        cr_assert_eq(parse(bad[i], &q, &why), KVIDX_EINVAL, "%s", bad[i]);
        cr_assert_not_null(why.field);
        cr_assert_not_null(why.rule);
    }
}

Test(list_query, model_rules)
{
    const char *bad[] = {"model_name=",       "model_name",       "model_name=a%40b",
                         "model_name=a@b",    "model_name=a%00b", "model_name=a%0Ab",
                         "model_name=%C0%AF", "model_name=%FF"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvidx_list_query_t q;
        kvidx_reason_t why = {0};
        cr_assert_eq(parse(bad[i], &q, &why), KVIDX_EINVAL, "%s", bad[i]);
        cr_assert_str_eq(why.field, "model_name", "%s", bad[i]);
    }
    char buf[2048] = "model_name=";
    memset(buf + strlen(buf), 'm', 255);
    cr_assert_eq(must_parse(buf).model_len, 255);
    strcat(buf, "m");
    kvidx_list_query_t q;
    cr_assert_eq(parse(buf, &q, NULL), KVIDX_EINVAL);
    /* 255 bytes spelled with escapes are still 255 bytes. */
    strcpy(buf, "model_name=");
    for (int i = 0; i < 255; i++)
        strcat(buf, "%6D");
    cr_assert_eq(must_parse(buf).model_len, 255);
}

Test(list_query, page_token)
{
    cr_assert_eq(must_parse("page_token=").token_len, 0, "empty token means the first page");
    char buf[2200] = "page_token=";
    memset(buf + strlen(buf), 'A', KVIDX_LIST_TOKEN_MAX);
    cr_assert_eq(must_parse(buf).token_len, KVIDX_LIST_TOKEN_MAX);
    strcat(buf, "A");
    kvidx_list_query_t q;
    kvidx_reason_t why = {0};
    cr_assert_eq(parse(buf, &q, &why), KVIDX_ETOKEN);
    cr_assert_str_eq(why.field, "page_token");
}

Test(list_query, unknown_parameter)
{
    const char *qs = "model_name=m&modelname=x";
    kvidx_list_query_t q;
    kvidx_reason_t why = {0};
    kvidx_query_span_t where = {0, 0};
    cr_assert_eq(kvidx_list_query_parse(qs, strlen(qs), &q, &why, &where), KVIDX_EINVAL);
    cr_assert_str_eq(why.field, "query");
    cr_assert_eq(where.off, 13);
    cr_assert_eq(where.len, 9);
    const char *bad[] = {
        "x", "=1", "Model_name=m", "model_name =m", "page_size%3D1", "?tier=l1", "model_name%=m"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(parse(bad[i], &q, NULL), KVIDX_EINVAL, "%s", bad[i]);
}

Test(list_query, repeated_parameter)
{
    const char *names[] = {"model_name=a", "cache_salt=a", "kv_rank=1",    "object_group_id=1",
                           "tier=l1",      "page_size=1",  "page_token=aa"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char qs[128];
        snprintf(qs, sizeof qs, "%s&%s", names[i], names[i]);
        kvidx_list_query_t q;
        kvidx_reason_t why = {0};
        kvidx_query_span_t where = {0, 0};
        cr_assert_eq(kvidx_list_query_parse(qs, strlen(qs), &q, &why, &where), KVIDX_EINVAL, "%s",
                     qs);
        cr_assert_eq(strncmp(names[i], why.field, strlen(why.field)), 0, "%s", why.field);
        cr_assert_eq(where.off, strlen(names[i]) + 1);
    }
}

Test(list_query, empty_pairs_skipped)
{
    kvidx_list_query_t q = must_parse("&&model_name=m&&page_size=3&");
    cr_assert_str_eq(q.model, "m");
    cr_assert_eq(q.page_size, 3);
}

static void digest_of(const char *qs, uint8_t d[KVIDX_LIST_DIGEST_LEN])
{
    kvidx_list_query_t q = must_parse(qs);
    kvidx_list_query_digest(&q, d);
}

Test(list_query, digest_equal_for_equal_filters)
{
    uint8_t a[KVIDX_LIST_DIGEST_LEN], b[KVIDX_LIST_DIGEST_LEN];
    digest_of("model_name=a%2Fb&cache_salt=s&kv_rank=16&object_group_id=1&tier=l2", a);
    digest_of("tier=l2&object_group_id=0x1&kv_rank=0x10&cache_salt=%73&model_name=a/b", b);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    digest_of("", a);
    digest_of("tier=any", b);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "tier=any is the default");
}

Test(list_query, digest_ignores_page_size_and_token)
{
    uint8_t a[KVIDX_LIST_DIGEST_LEN], b[KVIDX_LIST_DIGEST_LEN];
    digest_of("model_name=m&page_size=10", a);
    digest_of("model_name=m&page_size=4000&page_token=xyz", b);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
}

Test(list_query, digest_differs_for_each_filter)
{
    const char *qs[] = {
        "",
        "model_name=m",
        "model_name=n",
        "model_name=mm",
        "cache_salt=",
        "cache_salt=m",
        "cache_salt=mm",
        "model_name=m&cache_salt=",
        "model_name=m&cache_salt=m",
        "kv_rank=0",
        "kv_rank=1",
        "object_group_id=0",
        "object_group_id=1",
        "kv_rank=0&object_group_id=0",
        "tier=l1",
        "tier=l2",
        "model_name=m&tier=l1",
        "model_name=m&kv_rank=1",
        "model_name=m&object_group_id=1",
        "model_name=m&kv_rank=1&object_group_id=1&cache_salt=s&tier=l1",
        "model_name=m&kv_rank=1&object_group_id=1&cache_salt=s&tier=l2",
    };
    size_t n = sizeof qs / sizeof qs[0];
    uint8_t d[sizeof qs / sizeof qs[0]][KVIDX_LIST_DIGEST_LEN];
    for (size_t i = 0; i < n; i++)
        digest_of(qs[i], d[i]);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            cr_assert_neq(memcmp(d[i], d[j], KVIDX_LIST_DIGEST_LEN), 0, "'%s' vs '%s'", qs[i],
                          qs[j]);
}

Test(list_query, encode_round_trip)
{
    const char *qs[] = {
        "",
        "model_name=a%2Fb+c%E2%82%AC&cache_salt=&kv_rank=0xffffffff&object_group_id=7&tier=l2&"
        "page_size=9999&page_token=a%2Bb%25",
        "cache_salt=x%7Ey&tier=l1",
    };
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        kvidx_list_query_t a = must_parse(qs[i]);
        char buf[4096];
        size_t size = 4;
        cr_assert_eq(kvidx_list_query_encode(&a, buf, &size), KVIDX_ENOBUFS);
        size_t need = size;
        cr_assert_eq(kvidx_list_query_encode(&a, buf, &size), 0);
        cr_assert_eq(size + 1, need);
        cr_assert_eq(strlen(buf), size);
        kvidx_list_query_t b = must_parse(buf);
        cr_assert(kvidx_list_query_equal(&a, &b), "%s -> %s", qs[i], buf);
    }
}

/* The one percent-decoder of the project (paths and query strings). */
Test(pct_decode, modes_and_errors)
{
    char b[8];
    size_t n = 0;
    cr_assert_eq(kvidx_pct_decode("a+b%2Fc", 7, b, sizeof(b), &n, 1), 0);
    cr_assert_str_eq(b, "a b/c");
    cr_assert_eq(n, 5);
    cr_assert_eq(kvidx_pct_decode("a+b%2fc", 7, b, sizeof(b), &n, 0), 0);
    cr_assert_str_eq(b, "a+b/c", "paths keep '+'");
    cr_assert_eq(kvidx_pct_decode("%00", 3, b, sizeof(b), &n, 0), 0);
    cr_assert_eq(n, 1, "an encoded NUL decodes (callers decide)");
    cr_assert_eq(kvidx_pct_decode("%2", 2, b, sizeof(b), &n, 0), KVIDX_EINVAL);
    cr_assert_eq(kvidx_pct_decode("%zz", 3, b, sizeof(b), &n, 0), KVIDX_EINVAL);
    cr_assert_eq(kvidx_pct_decode("12345678", 8, b, sizeof(b), &n, 0), KVIDX_ENOBUFS);
    cr_assert_eq(kvidx_pct_decode("1234567", 7, b, sizeof(b), &n, 0), 0, "exactly fits");
    cr_assert_eq(kvidx_pct_decode("123456789%g", 11, b, sizeof(b), &n, 0), KVIDX_EINVAL,
                 "a bad escape takes precedence over the size");
}
