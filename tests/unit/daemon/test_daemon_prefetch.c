/*
 * POST /v1/lookup, prefetch handles and loads, driven through the router
 * with fake requests and a real uv loop (no socket): the worked examples
 * of LOOKUP (key form) and of the ipc form, single-flight loads, releases, leases, WARM, the
 * external loader, and the rule that lookups change nothing.
 */
#include <criterion/criterion.h>

#include "app.h"
#include "util/context.h"
#include "util/config.h"
#include "state/keystore.h"
#include "util/metrics.h"
#include "state/prefetches.h"
#include "net/router.h"
#include "route_call.h"

#include "kvidx/err.h"
#include "kvidx/index.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct app app;
static uv_loop_t loop;

static void setup_with(void (*tweak)(struct config *))
{
    memset(&app, 0, sizeof(app));
    config_defaults(&app.cfg);
    if (tweak)
        tweak(&app.cfg);
    cr_assert_eq(uv_loop_init(&loop), 0);
    app.loop = &loop;
    app.metrics = metrics_new();
    cr_assert_not_null(app.metrics);
    cr_assert_eq(keystore_init(&app), 0);
    cr_assert_eq(prefetches_init(&app), 0);
    router_use_tables(app_route_tables);
}

static void setup(void)
{
    setup_with(NULL);
}

static void teardown(void)
{
    prefetches_stop(&app);
    uv_run(&loop, UV_RUN_DEFAULT);
    prefetches_free(&app);
    keystore_free(&app);
    metrics_free(app.metrics);
    cr_assert_eq(uv_loop_close(&loop), 0, "a uv handle was leaked");
}

static struct call *call_start(const char *method, const char *target, const char *body)
{
    return route_call(&app, method, target, NULL, body);
}

static cJSON *call_json(struct call *c)
{
    return c->res.body.len ? cJSON_ParseWithLength(c->res.body.data, c->res.body.len) : NULL;
}

static int req(const char *method, const char *target, const char *body, cJSON **out)
{
    struct call *c = call_start(method, target, body);
    cr_assert_eq(c->rc, 0, "%s %s went async", method, target);
    int st = c->res.status;
    if (out)
        *out = call_json(c);
    call_free(c);
    return st;
}

static int req_f(const char *method, const char *target, cJSON **out, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int req_f(const char *method, const char *target, cJSON **out, const char *fmt, ...)
{
    char *body = NULL;
    va_list ap;
    va_start(ap, fmt);
    cr_assert(vasprintf(&body, fmt, ap) >= 0);
    va_end(ap);
    int st = req(method, target, body, out);
    free(body);
    return st;
}

/* "[0,1,3]" of an integer array member. */
static char *ints(const cJSON *o, const char *name)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, name);
    cr_assert(cJSON_IsArray(a), "member %s missing", name);
    return cJSON_PrintUnformatted(a);
}

#define assert_ints(o, name, want)                                                                 \
    do {                                                                                           \
        char *got_ = ints(o, name);                                                                \
        cr_assert_str_eq(got_, want, "%s", name);                                                  \
        free(got_);                                                                                \
    } while (0)

static double num(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    cr_assert(cJSON_IsNumber(v), "member %s missing", name);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    cr_assert(cJSON_IsString(v), "member %s missing", name);
    return v->valuestring;
}

/* Key i of the 6-key examples: model m, rank 0, hash byte i. */
static const char *keyobj(int i)
{
    static char b[8][96];
    snprintf(b[i], sizeof(b[i]), "{\"model_name\":\"m\",\"kv_rank\":0,\"chunk_hash_hex\":\"%02x\"}",
             i);
    return b[i];
}

static const char *six_keys(void)
{
    static char b[1024];
    snprintf(b, sizeof(b), "[%s,%s,%s,%s,%s,%s]", keyobj(0), keyobj(1), keyobj(2), keyobj(3),
             keyobj(4), keyobj(5));
    return b;
}

static void put(const char *tier, const int *ids, size_t n)
{
    char body[4096];
    size_t o = (size_t)snprintf(body, sizeof(body), "{\"tier\":\"%s\",\"entries\":[", tier);
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(body + o, sizeof(body) - o, "%s{\"key\":%s,\"size_bytes\":10}",
                              i ? "," : "", keyobj(ids[i]));
    snprintf(body + o, sizeof(body) - o, "]}");
    cr_assert_eq(req("PUT", "/v1/keys", body, NULL), 200);
}

/* The worked example: L1 holds 0,1,3; L2 holds 2,3,4; 5 is nowhere. */
static void example(void)
{
    static const int l1[] = {0, 1, 3}, l2[] = {2, 3, 4};
    put("l2", l2, 3);
    put("l1", l1, 3);
}

static kvidx_entry_info_t info_of(int i)
{
    kvidx_entry_info_t info;
    memset(&info, 0, sizeof(info));
    char path[128];
    snprintf(path, sizeof(path), "m@00000000@0@%02x", i);
    kvidx_key_t k;
    kvidx_reason_t why;
    cr_assert_eq(kvidx_key_parse_canonical(path, strlen(path), &k, &why), 0);
    kvidx_ref_t ref;
    if (kvidx_index_find(app.keystore->idx, &k, &ref) == 0)
        kvidx_index_info(app.keystore->idx, ref, &info);
    return info;
}

static void run_loop(void)
{
    for (int i = 0; i < 4; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
}

/* Runs the loop until ms of loop time have passed. */
static void sleep_loop(uint64_t ms)
{
    uv_update_time(&loop);
    uint64_t end = uv_now(&loop) + ms;
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    while (uv_now(&loop) < end) {
        uv_timer_start(&t, (uv_timer_cb)(void (*)(void))uv_timer_stop, end - uv_now(&loop), 0);
        uv_run(&loop, UV_RUN_ONCE);
        uv_update_time(&loop);
    }
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* Creates a prefetch; returns its id and the 201 body. */
static int prefetch(const char *extra_members, cJSON **out)
{
    cJSON *j = NULL;
    int st = req_f("POST", "/v1/prefetches", &j, "{\"keys\":%s%s%s}", six_keys(),
                   extra_members[0] ? "," : "", extra_members);
    cr_assert_eq(st, 201, "prefetch answered %d", st);
    int id = (int)num(j, "id");
    if (out)
        *out = j;
    else
        cJSON_Delete(j);
    return id;
}

static cJSON *get_handle(int id, int want_status)
{
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
    cJSON *j = NULL;
    int st = req("GET", path, NULL, &j);
    cr_assert_eq(st, want_status, "GET %s answered %d", path, st);
    return j;
}

TestSuite(lookup, .init = setup, .fini = teardown);
TestSuite(prefetch, .init = setup, .fini = teardown);
/* Tests that choose their settings call setup_with() themselves. */
TestSuite(prefetch_cfg, .fini = teardown);

/* ---- lookup ---- */

Test(lookup, key_form_worked_example)
{
    example();
    cJSON *j;
    cr_assert_eq(req_f("POST", "/v1/lookup", &j, "{\"keys\":%s}", six_keys()), 200);
    cr_assert_eq(num(j, "total_keys"), 6);
    assert_ints(j, "l1_indices", "[0,1,3]");
    assert_ints(j, "l2_indices", "[2,3,4]");
    assert_ints(j, "found_indices", "[0,1,2,3,4]");
    cr_assert_eq(num(j, "hit_keys"), 5);
    cr_assert_eq(num(j, "found_bytes"), 50);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "hit_chunks")));
    cJSON_Delete(j);

    cr_assert_eq(req_f("POST", "/v1/lookup", &j, "{\"tier\":\"l1\",\"keys\":%s}", six_keys()), 200);
    assert_ints(j, "found_indices", "[0,1,3]");
    cr_assert_eq(num(j, "hit_keys"), 2);
    cr_assert_eq(num(j, "found_bytes"), 30);
    cJSON_Delete(j);
}

/* Stores the ipc keys of group gi, chunks listed, world_size 1. */
static void put_ipc(int gi, const int *chunks, size_t n)
{
    char body[8192];
    size_t o = (size_t)snprintf(body, sizeof(body), "{\"tier\":\"l2\",\"entries\":[");
    for (size_t i = 0; i < n; i++)
        o +=
            (size_t)snprintf(body + o, sizeof(body) - o,
                             "%s{\"key\":{\"model_name\":\"m\",\"kv_rank\":%u,"
                             "\"object_group_id\":%d,\"chunk_hash_hex\":\"c%d\"},\"size_bytes\":1}",
                             i ? "," : "", (1u << 24) | (1u << 8), gi, chunks[i]);
    snprintf(body + o, sizeof(body) - o, "]}");
    cr_assert_eq(req("PUT", "/v1/keys", body, NULL), 200);
}

Test(lookup, ipc_form_windows_spec_examples)
{
    static const int g0[] = {0, 1, 2, 3}, g1[] = {2, 3, 4}, g2[] = {1, 3, 5};
    put_ipc(0, g0, 4);
    put_ipc(1, g1, 3);
    put_ipc(2, g2, 3);
    cJSON *j;
    cr_assert_eq(req("POST", "/v1/lookup",
                     "{\"model_name\":\"m\",\"world_size\":1,\"worker_id\":null,"
                     "\"chunk_hashes\":[\"c0\",\"c1\",\"c2\",\"c3\",\"c4\",\"c5\"],"
                     "\"object_group_ids\":[0,1,2],\"attn_window\":[-1,2,1]}",
                     &j),
                 200);
    cr_assert_eq(num(j, "total_keys"), 18);
    cr_assert_eq(num(j, "hit_chunks"), 4);
    cr_assert_eq(num(j, "hit_keys"), 4);
    assert_ints(j, "found_indices", "[0,1,2,3,8,9,10,13,15,17]");
    cJSON_Delete(j);

    static const int all[] = {0, 1, 2, 3, 4, 5, 6, 7}, w[] = {3, 7};
    char body[1024];
    (void)body;
    cJSON *k;
    /* Windows [-1, 1], 8 chunks: group 0 (model m2 via salt) all, group 1 {3, 7}. */
    put_ipc(4, all, 8);
    put_ipc(5, w, 2);
    cr_assert_eq(req("POST", "/v1/lookup",
                     "{\"model_name\":\"m\",\"world_size\":1,"
                     "\"chunk_hashes\":[\"c0\",\"c1\",\"c2\",\"c3\",\"c4\",\"c5\",\"c6\",\"c7\"],"
                     "\"object_group_ids\":[4,5],\"attn_window\":[-1,1]}",
                     &k),
                 200);
    cr_assert_eq(num(k, "hit_chunks"), 8);
    cJSON_Delete(k);
}

Test(lookup, ipc_expansion_is_group_chunk_rank)
{
    /* world_size 2, every worker: rank slot r is ComputeKVRank(2, r, 2, r). */
    char body[512];
    snprintf(body, sizeof(body),
             "{\"tier\":\"l1\",\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":%u,"
             "\"object_group_id\":7,\"chunk_hash_hex\":\"bb\"},\"size_bytes\":3}]}",
             (2u << 24) | (1u << 16) | (2u << 8) | 1u);
    cr_assert_eq(req("PUT", "/v1/keys", body, NULL), 200);
    cJSON *j;
    cr_assert_eq(req("POST", "/v1/lookup",
                     "{\"model_name\":\"m\",\"world_size\":2,\"chunk_hashes\":[\"aa\",\"bb\"],"
                     "\"object_group_ids\":[0,7]}",
                     &j),
                 200);
    cr_assert_eq(num(j, "total_keys"), 8);
    /* group 1 (id 7), chunk 1, rank 1 = 1*4 + 1*2 + 1 = 7 */
    assert_ints(j, "l1_indices", "[7]");
    cJSON_Delete(j);
    cr_assert_eq(req("POST", "/v1/lookup",
                     "{\"model_name\":\"m\",\"world_size\":2,\"worker_id\":1,"
                     "\"chunk_hashes\":[\"aa\",\"bb\"],\"object_group_ids\":[0,7]}",
                     &j),
                 200);
    cr_assert_eq(num(j, "total_keys"), 4);
    assert_ints(j, "l1_indices", "[3]");
    cJSON_Delete(j);
}

Test(lookup, changes_nothing)
{
    app.cfg.l1_capacity_bytes = 30;
    kvidx_index_set_capacity(app.keystore->idx, 30, 0);
    static const int a[] = {0}, b[] = {1}, c[] = {2}, d[] = {3};
    put("l1", a, 1); /* 0 is the least recent */
    put("l1", b, 1);
    put("l1", c, 1);
    kvidx_entry_info_t before[3];
    for (int i = 0; i < 3; i++)
        before[i] = info_of(i);
    cJSON *j;
    for (int n = 0; n < 3; n++) {
        cr_assert_eq(req_f("POST", "/v1/lookup", &j, "{\"keys\":[%s]}", keyobj(0)), 200);
        cJSON_Delete(j);
    }
    for (int i = 0; i < 3; i++) {
        kvidx_entry_info_t now = info_of(i);
        cr_assert_eq(memcmp(&now, &before[i], sizeof(now)), 0, "key %d changed", i);
    }
    /* Recency unchanged: storing a fourth key still evicts key 0. */
    put("l1", d, 1);
    cr_assert_eq(info_of(0).l1_state, KVIDX_L1_NONE);
    cr_assert_eq(info_of(1).l1_state, KVIDX_L1_READY);
}

Test(lookup, bad_input)
{
    cJSON *j;
    /* every bad key index is listed */
    cr_assert_eq(req_f("POST", "/v1/lookup", &j,
                       "{\"keys\":[%s,{\"model_name\":\"m\"},%s,{\"chunk_hash\":\"00\"}]}",
                       keyobj(0), keyobj(1)),
                 400);
    const cJSON *ip = cJSON_GetObjectItem(j, "invalid_params");
    cr_assert_eq(cJSON_GetArraySize(ip), 2);
    /* The name says which field of keys[1] is wrong; keys[3] is wrong as a whole. */
    cr_assert_str_eq(str(cJSON_GetArrayItem(ip, 0), "name"), "keys[1].chunk_hash_hex");
    cr_assert_str_eq(str(cJSON_GetArrayItem(ip, 1), "name"), "keys[3]");
    cr_assert_str_eq(str(j, "code"), "invalid_key",
                     "a key that breaks the key rules is invalid_key");
    cJSON_Delete(j);
    static const char *bad[] = {
        "{\"keys\":[],\"bogus\":1}",
        "{\"keys\":{}}",
        "{}",
        "[]",
        "{\"keys\":[],\"tier\":\"l2\"}",
        "{\"keys\":[],\"model_name\":\"m\"}",
        "{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[\"0\"]}",
        "{\"model_name\":\"m\",\"world_size\":0,\"chunk_hashes\":[]}",
        "{\"model_name\":\"m\",\"world_size\":2,\"worker_id\":2,\"chunk_hashes\":[]}",
        "{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[\"00\"],\"attn_window\":[0]}",
        "{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[\"00\"],\"attn_window\":[-2]}",
        "{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[\"00\"],\"attn_window\":[1,1]}",
        "{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[\"00\"],\"attn_window\":[1.5]}",
        "{\"model_name\":\"m@x\",\"world_size\":1,\"chunk_hashes\":[\"00\"]}",
        "{\"model_name\":\"m\",\"world_size\":1,\"chunk_hashes\":[\"00\"],\"object_group_ids\":[-1]"
        "}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = req("POST", "/v1/lookup", bad[i], NULL);
        cr_assert_eq(st, 400, "%s answered %d", bad[i], st);
    }
    cr_assert_eq(req("POST", "/v1/lookup",
                     "{\"model_name\":\"m\",\"world_size\":1,"
                     "\"chunk_hashes\":[\"00\",\"zz\",\"01\",\"0\"]}",
                     &j),
                 400);
    ip = cJSON_GetObjectItem(j, "invalid_params");
    cr_assert_eq(cJSON_GetArraySize(ip), 2);
    cr_assert_str_eq(str(cJSON_GetArrayItem(ip, 0), "name"), "chunk_hashes[1]");
    cr_assert_str_eq(str(cJSON_GetArrayItem(ip, 1), "name"), "chunk_hashes[3]");
    cJSON_Delete(j);
}

Test(lookup, key_limit_is_inclusive)
{
    app.cfg.max_keys_per_request = 4;
    cJSON *j;
    cr_assert_eq(req("POST", "/v1/lookup",
                     "{\"model_name\":\"m\",\"world_size\":2,\"chunk_hashes\":[\"00\",\"01\"]}",
                     NULL),
                 200);
    cr_assert_eq(
        req("POST", "/v1/lookup",
            "{\"model_name\":\"m\",\"world_size\":2,\"chunk_hashes\":[\"00\",\"01\",\"02\"]}", &j),
        413);
    cr_assert_str_eq(str(j, "code"), "too_many_keys");
    cJSON_Delete(j);
    cr_assert_eq(req_f("POST", "/v1/lookup", NULL, "{\"keys\":[%s,%s,%s,%s]}", keyobj(0), keyobj(1),
                       keyobj(2), keyobj(3)),
                 200);
    cr_assert_eq(req_f("POST", "/v1/prefetches", NULL, "{\"keys\":[%s,%s,%s,%s,%s]}", keyobj(0),
                       keyobj(1), keyobj(2), keyobj(3), keyobj(4)),
                 413);
}

/* ---- LOOKUP ---- */

Test(prefetch, worked_example_all_policies_succeed)
{
    example();
    static const char *pol[] = {"PREFIX", "SEGMENTED_PREFIX", "SPARSE"};
    for (int p = 0; p < 3; p++) {
        char m[64];
        snprintf(m, sizeof(m), "\"trim_policy\":\"%s\"", pol[p]);
        cJSON *j;
        int id = prefetch(m, &j);
        assert_ints(j, "l1_found_indices", "[0,1,3]");
        assert_ints(j, "l2_orig_indices", "[2,4]");
        cr_assert_str_eq(str(j, "status"), "pending");
        cr_assert_eq(num(j, "prefetch_request_id"), id);
        cJSON_Delete(j);
        run_loop();
        j = get_handle(id, 200);
        cr_assert_str_eq(str(j, "status"), "completed");
        assert_ints(j, "found_indices", "[0,1,2,3,4]");
        assert_ints(j, "retained_indices", "[0,1,2,3,4]");
        cr_assert_eq(num(j, "hit_keys"), 5);
        cr_assert_eq(num(j, "pinned_keys"), 5);
        cJSON_Delete(j);
        cr_assert_eq(info_of(2).pins, 1);
        cr_assert(info_of(2).temporary);
        char path[64];
        snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
        cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
        cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
        for (int i = 0; i < 5; i++)
            cr_assert_eq(info_of(i).pins, 0, "key %d still pinned", i);
        /* temporary loaded copies went with their last pin */
        cr_assert_eq(info_of(2).l1_state, KVIDX_L1_NONE);
        cr_assert_eq(info_of(3).l1_state, KVIDX_L1_READY);
        j = get_handle(id, 200);
        cr_assert_str_eq(str(j, "status"), "released");
        cJSON_Delete(j);
    }
}

/* Loader external: key 2's load fails. */
static void ext_loader(struct config *c)
{
    c->loader = LOADER_EXTERNAL;
}

static void finish_task(const char *loaded, const char *failed)
{
    cJSON *j;
    cr_assert_eq(req("GET", "/v1/loads", NULL, &j), 200);
    const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tasks"), 0);
    cr_assert_not_null(t, "no task");
    char path[64];
    snprintf(path, sizeof(path), "/v1/loads/%d", (int)num(t, "task"));
    cJSON_Delete(j);
    char body[256];
    snprintf(body, sizeof(body), "{\"loaded\":%s,\"failed\":%s}", loaded, failed);
    cr_assert_eq(req("POST", path, body, NULL), 200);
}

Test(prefetch_cfg, worked_example_load_failure)
{
    setup_with(ext_loader);
    example();
    static const char *pol[] = {"PREFIX", "SEGMENTED_PREFIX", "SPARSE"};
    static const char *want[] = {"[0,1]", "[0,1,3,4]", "[0,1,3,4]"};
    for (int p = 0; p < 3; p++) {
        char m[64];
        snprintf(m, sizeof(m), "\"trim_policy\":\"%s\"", pol[p]);
        int id = prefetch(m, NULL);
        cJSON *j;
        cr_assert_eq(req("GET", "/v1/loads", NULL, &j), 200);
        const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tasks"), 0);
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(t, "keys")), 2);
        cJSON_Delete(j);
        /* task positions: 0 is key 2, 1 is key 4 */
        finish_task("[1]", "[0]");
        j = get_handle(id, 200);
        cr_assert_str_eq(str(j, "status"), "completed");
        assert_ints(j, "found_indices", "[0,1,3,4]");
        assert_ints(j, "retained_indices", want[p]);
        cr_assert_eq(num(j, "hit_keys"), 2);
        cJSON_Delete(j);
        cr_assert_eq(info_of(0).pins, 1);
        cr_assert_eq(info_of(2).l1_state, KVIDX_L1_NONE);
        if (p == 0) {
            cr_assert_eq(info_of(3).pins, 0, "PREFIX releases key 3");
            cr_assert_eq(info_of(4).l1_state, KVIDX_L1_NONE, "released temporary copy dropped");
        } else {
            cr_assert_eq(info_of(3).pins, 1);
            cr_assert_eq(info_of(4).pins, 1);
        }
        char path[64];
        snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
        cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
        for (int i = 0; i < 6; i++)
            cr_assert_eq(info_of(i).pins, 0);
    }
}

Test(prefetch, worked_example_key_absent)
{
    static const int l1[] = {0, 1, 3}, l2[] = {3, 4};
    put("l2", l2, 2);
    put("l1", l1, 3);
    static const char *pol[] = {"PREFIX", "SEGMENTED_PREFIX", "SPARSE"};
    static const char *l1f[] = {"[0,1]", "[0,1]", "[0,1,3]"};
    static const char *l2o[] = {"[]", "[]", "[4]"};
    for (int p = 0; p < 3; p++) {
        char m[64];
        snprintf(m, sizeof(m), "\"trim_policy\":\"%s\"", pol[p]);
        cJSON *j;
        int id = prefetch(m, &j);
        assert_ints(j, "l1_found_indices", l1f[p]);
        assert_ints(j, "l2_orig_indices", l2o[p]);
        cr_assert_eq(num(j, "prefetch_request_id"), p == 2 ? id : -1);
        cr_assert_str_eq(str(j, "status"), p == 2 ? "pending" : "completed");
        cJSON_Delete(j);
        run_loop();
        j = get_handle(id, 200);
        assert_ints(j, "retained_indices", p == 2 ? "[0,1,3,4]" : "[0,1]");
        cr_assert_eq(num(j, "hit_keys"), 2);
        cJSON_Delete(j);
        char path[64];
        snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
        cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    }
}

Test(prefetch_cfg, single_flight)
{
    setup_with(ext_loader);
    example();
    int a = prefetch("\"extra_count\":2", NULL);
    int b = prefetch("", NULL);
    cr_assert_eq(info_of(2).l1_state, KVIDX_L1_LOADING);
    cJSON *j;
    cr_assert_eq(req("GET", "/v1/loads", NULL, &j), 200);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tasks")), 1, "one load per key");
    cJSON_Delete(j);
    j = get_handle(b, 200);
    assert_ints(j, "l2_orig_indices", "[2,4]");
    cr_assert_str_eq(str(j, "status"), "pending");
    cJSON_Delete(j);
    cr_assert_eq(metrics_get(app.metrics, "kvidx_loads_total"), 2);
    finish_task("[0,1]", "[]");
    cr_assert_eq(info_of(2).pins, 3 + 1);
    cr_assert_eq(info_of(0).pins, 3 + 1);
    /* release one reader of key 2 in a */
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d/release", a);
    cr_assert_eq(req("POST", path, "{\"indices\":[2]}", NULL), 200);
    cr_assert_eq(info_of(2).pins, 3);
    /* more than a holds: 409 and nothing changes */
    cr_assert_eq(req("POST", path, "{\"indices\":[2,2,2]}", &j), 409);
    cJSON_Delete(j);
    cr_assert_eq(info_of(2).pins, 3);
    cr_assert_eq(req("POST", path, "{\"indices\":[5]}", NULL), 409); /* not retained */
    cr_assert_eq(req("POST", path, "{\"indices\":[6]}", NULL), 400); /* out of range */
    /* no body: one reader of every retained key */
    cr_assert_eq(req("POST", path, NULL, NULL), 200);
    cr_assert_eq(info_of(0).pins, 2 + 1);
    snprintf(path, sizeof(path), "/v1/prefetches/%d", b);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    cr_assert_eq(info_of(0).pins, 2);
    snprintf(path, sizeof(path), "/v1/prefetches/%d", a);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(info_of(i).pins, 0);
}

Test(prefetch, release_down_to_zero_is_released)
{
    example();
    int id = prefetch("", NULL);
    run_loop();
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d/release", id);
    cJSON *j;
    cr_assert_eq(req("POST", path, "{\"indices\":[0,1,2,3,4]}", &j), 200);
    cr_assert_str_eq(str(j, "status"), "released");
    cJSON_Delete(j);
    cr_assert_eq(req("POST", path, NULL, NULL), 409);
}

static void short_leases(struct config *c)
{
    c->handle_grace_ms = 60;
    c->load_timeout_ms = 30;
}

Test(prefetch_cfg, lease_expiry_then_410_then_404)
{
    setup_with(short_leases);
    example();
    int id = prefetch("\"lease_ms\":40", NULL);
    run_loop();
    cJSON *j = get_handle(id, 200);
    cJSON_Delete(j);
    cr_assert_eq(info_of(0).pins, 1);
    sleep_loop(50);
    cr_assert_eq(info_of(0).pins, 0, "expiry gives the pins back");
    cr_assert_eq(info_of(2).l1_state, KVIDX_L1_NONE);
    j = get_handle(id, 410);
    cr_assert_str_eq(str(j, "code"), "handle_expired");
    cJSON_Delete(j);
    cr_assert_eq(metrics_get(app.metrics, "kvidx_expirations_total"), 1);
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    sleep_loop(70);
    cJSON_Delete(get_handle(id, 404));
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204, "repeated DELETE stays 204");
}

Test(prefetch_cfg, extend_moves_the_expiry)
{
    setup_with(short_leases);
    example();
    int id = prefetch("\"lease_ms\":30", NULL);
    run_loop();
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d/extend", id);
    cr_assert_eq(req("POST", path, "{\"lease_ms\":0}", NULL), 400);
    cr_assert_eq(req("POST", path, "{\"lease_ms\":1.5}", NULL), 400);
    /* A longer lease than max_lease_ms is cut to it: leases are bounded. */
    cJSON *j = NULL;
    uint64_t before = app_wall_ms();
    cr_assert_eq(req("POST", path, "{\"lease_ms\":99999999}", &j), 200);
    double until = cJSON_GetObjectItem(j, "expires_at_ms")->valuedouble;
    cr_assert_leq(until, (double)(app_wall_ms() + app.cfg.max_lease_ms), "lease not capped");
    cr_assert_geq(until, (double)(before + app.cfg.max_lease_ms) - 1000.0);
    cJSON_Delete(j);
    cr_assert_eq(req("POST", path, "{\"lease_ms\":200}", NULL), 200);
    sleep_loop(60);
    cJSON_Delete(get_handle(id, 200));
    cr_assert_eq(info_of(0).pins, 1);
}

Test(prefetch, bad_options)
{
    static const char *bad[] = {
        "\"mode\":\"lookup\"",       "\"trim_policy\":\"X\"", "\"extra_count\":128",
        "\"extra_count\":-1",        "\"lease_ms\":0",        "\"lease_ms\":-5",
        "\"external_request_id\":5", "\"tier\":\"l1\"",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = req_f("POST", "/v1/prefetches", NULL, "{\"keys\":[],%s}", bad[i]);
        cr_assert_eq(st, 400, "%s answered %d", bad[i], st);
    }
    cr_assert_eq(req("GET", "/v1/prefetches/abc", NULL, NULL), 404);
    cr_assert_eq(req("GET", "/v1/prefetches/77", NULL, NULL), 404);
    cr_assert_eq(req("GET", "/v1/prefetches/1?wait_ms=30001", NULL, NULL), 400);
    cJSON *j;
    cr_assert_eq(req("POST", "/v1/prefetches", "{\"keys\":[],\"external_request_id\":\"r-1\"}", &j),
                 201);
    cr_assert_str_eq(str(j, "external_request_id"), "r-1");
    cr_assert_str_eq(str(j, "status"), "completed");
    cr_assert_eq(num(j, "prefetch_request_id"), -1);
    cJSON_Delete(j);
}

Test(prefetch, warm)
{
    example();
    cJSON *j;
    int id = prefetch("\"mode\":\"WARM\"", &j);
    assert_ints(j, "l1_found_indices", "[]");
    assert_ints(j, "l2_orig_indices", "[2,4]");
    cr_assert_str_eq(str(j, "trim_policy"), "SPARSE");
    cJSON_Delete(j);
    run_loop();
    j = get_handle(id, 200);
    cr_assert_str_eq(str(j, "status"), "completed");
    assert_ints(j, "found_indices", "[0,1,2,3,4]");
    assert_ints(j, "retained_indices", "[]");
    cr_assert_eq(num(j, "pinned_keys"), 0);
    cJSON_Delete(j);
    for (int i = 0; i < 5; i++) {
        kvidx_entry_info_t in = info_of(i);
        cr_assert_eq(in.l1_state, KVIDX_L1_READY, "key %d", i);
        cr_assert_eq(in.pins, 0);
        cr_assert_eq(in.temporary, 0);
    }
}

/* A key a LOOKUP loaded (temporary, pinned) and WARM then reports found
 * must stay resident when the LOOKUP reader lets go. */
Test(prefetch, warm_promotes_temporary_hits)
{
    example();
    int lookup = prefetch("", NULL);
    run_loop();
    cr_assert_eq(info_of(2).temporary, 1, "loaded by LOOKUP: temporary");
    cJSON *j;
    int warm = prefetch("\"mode\":\"WARM\"", &j);
    cJSON_Delete(j);
    run_loop();
    j = get_handle(warm, 200);
    assert_ints(j, "found_indices", "[0,1,2,3,4]");
    cJSON_Delete(j);
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", lookup);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    kvidx_entry_info_t in = info_of(2);
    cr_assert_eq(in.l1_state, KVIDX_L1_READY, "WARM reported key 2 resident; it must stay");
    cr_assert_eq(in.temporary, 0);
    cr_assert_eq(in.pins, 0);
}

Test(prefetch_cfg, long_poll_completes_early)
{
    setup_with(ext_loader);
    example();
    int id = prefetch("", NULL);
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d?wait_ms=5000", id);
    struct call *c = call_start("GET", path, NULL);
    cr_assert_eq(c->rc, HANDLER_ASYNC);
    cr_assert_eq(c->res.done, 0);
    /* another client is not blocked */
    cJSON_Delete(get_handle(id, 200));
    finish_task("[0,1]", "[]");
    cr_assert_eq(c->res.done, 0, "answered on the next loop turn, not inside the POST");
    run_loop();
    cr_assert_eq(c->res.done, 1);
    cJSON *j = call_json(c);
    cr_assert_str_eq(str(j, "status"), "completed");
    cJSON_Delete(j);
    call_free(c);

    /* a poll that times out answers pending (the temporary copies of the
     * first handle go with it, so the second one loads again) */
    snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    id = prefetch("", NULL);
    snprintf(path, sizeof(path), "/v1/prefetches/%d?wait_ms=20", id);
    c = call_start("GET", path, NULL);
    cr_assert_eq(c->rc, HANDLER_ASYNC);
    sleep_loop(30);
    cr_assert_eq(c->res.done, 1);
    j = call_json(c);
    cr_assert_str_eq(str(j, "status"), "pending");
    cJSON_Delete(j);
    call_free(c);

    /* a cancelled poll (connection gone) is forgotten */
    c = call_start("GET", path, NULL);
    cr_assert_eq(c->rc, HANDLER_ASYNC);
    c->res.cancel(c->res.waiter);
    call_free(c);
    run_loop();
}

Test(prefetch_cfg, load_timeout_fails_the_load)
{
    setup_with(ext_loader);
    app.cfg.load_timeout_ms = 20;
    example();
    int id = prefetch("\"trim_policy\":\"SPARSE\"", NULL);
    sleep_loop(40);
    cJSON *j = get_handle(id, 200);
    cr_assert_str_eq(str(j, "status"), "completed");
    assert_ints(j, "retained_indices", "[0,1,3]");
    cJSON_Delete(j);
    cr_assert_eq(info_of(2).l1_state, KVIDX_L1_NONE);
    cr_assert_eq(req("GET", "/v1/loads", NULL, &j), 200);
    assert_ints(j, "tasks", "[]");
    cJSON_Delete(j);
}

Test(prefetch, forced_delete_of_pinned_key_is_lost_not_unpinned_twice)
{
    example();
    int id = prefetch("\"extra_count\":1", NULL);
    run_loop();
    cr_assert_eq(req_f("DELETE", "/v1/keys", NULL, "{\"force\":true,\"keys\":[%s]}", keyobj(3)),
                 200);
    cJSON *j = get_handle(id, 200);
    assert_ints(j, "lost_indices", "[3]");
    cr_assert_eq(num(j, "pinned_keys"), 4);
    cJSON_Delete(j);
    /* the key comes back: its new copy must not lose pins to the old handle */
    static const int k3[] = {3};
    put("l1", k3, 1);
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    cr_assert_eq(info_of(3).l1_state, KVIDX_L1_READY);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(info_of(i).pins, 0);
}

Test(prefetch, pinned_keys_survive_eviction_pressure)
{
    app.cfg.l1_capacity_bytes = 50;
    kvidx_index_set_capacity(app.keystore->idx, 50, 0);
    example();
    int id = prefetch("", NULL);
    run_loop();
    /* L1 is full of pinned keys: a reservation for another key fails */
    static const int k5[] = {5};
    put("l2", k5, 1);
    cJSON *j;
    cr_assert_eq(req_f("POST", "/v1/prefetches", &j, "{\"keys\":[%s]}", keyobj(5)), 201);
    int id2 = (int)num(j, "id");
    cJSON_Delete(j);
    run_loop();
    j = get_handle(id2, 200);
    assert_ints(j, "retained_indices", "[]");
    cJSON_Delete(j);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(info_of(i).l1_state, KVIDX_L1_READY);
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", id);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    cr_assert_eq(req_f("POST", "/v1/prefetches", &j, "{\"keys\":[%s]}", keyobj(5)), 201);
    id2 = (int)num(j, "id");
    cJSON_Delete(j);
    run_loop();
    j = get_handle(id2, 200);
    assert_ints(j, "retained_indices", "[0]");
    cJSON_Delete(j);
}

/* Handle and task ids are canonical decimal: any other spelling of an id
 * (a leading zero, a sign, spaces, a value past 2^64) names nothing. */
Test(prefetch_cfg, ids_are_canonical_decimal)
{
    setup_with(ext_loader);
    example();
    int id = prefetch("", NULL);
    cr_assert_eq(id, 1);
    static const char *bad[] = {"01",
                                "001",
                                "%2B1",
                                "+1",
                                "-1",
                                "%201",
                                "1%20",
                                "18446744073709551617",
                                "18446744073709551616"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char path[96];
        snprintf(path, sizeof(path), "/v1/prefetches/%s", bad[i]);
        cr_assert_eq(req("GET", path, NULL, NULL), 404, "GET %s", path);
        cr_assert_eq(req("DELETE", path, NULL, NULL), 404, "DELETE %s", path);
        snprintf(path, sizeof(path), "/v1/prefetches/%s/extend", bad[i]);
        cr_assert_eq(req("POST", path, "{\"lease_ms\":100}", NULL), 404, "POST %s", path);
        snprintf(path, sizeof(path), "/v1/loads/%s", bad[i]);
        cr_assert_eq(req("POST", path, "{\"loaded\":[0],\"failed\":[]}", NULL), 404, "POST %s",
                     path);
    }
    cJSON *j = get_handle(id, 200);
    cr_assert_str_eq(str(j, "status"), "pending", "nothing above touched the handle");
    cJSON_Delete(j);
    finish_task("[0,1]", "[]");
    cJSON_Delete(get_handle(id, 200));
    cr_assert_eq(req("DELETE", "/v1/prefetches/1", NULL, NULL), 204);
}

/* The long polls' query strings: wait_ms at most once and nothing else,
 * or 400 invalid_argument naming the parameter ("query" for an unknown
 * one, like the listing). */
static void assert_bad_query(const char *path, const char *name)
{
    cJSON *j = NULL;
    cr_assert_eq(req("GET", path, NULL, &j), 400, "GET %s", path);
    cr_assert_str_eq(str(j, "code"), "invalid_argument", "GET %s", path);
    const cJSON *ip = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "invalid_params"), 0);
    cr_assert_not_null(ip, "GET %s: no invalid_params", path);
    cr_assert_str_eq(str(ip, "name"), name, "GET %s", path);
    cJSON_Delete(j);
}

Test(prefetch_cfg, poll_queries_are_validated)
{
    setup_with(ext_loader);
    example();
    int id = prefetch("", NULL);
    cr_assert_eq(id, 1);
    static const char *const bases[] = {"/v1/prefetches/1", "/v1/loads"};
    for (int b = 0; b < 2; b++) {
        char path[128];
        snprintf(path, sizeof(path), "%s?foo=1", bases[b]);
        assert_bad_query(path, "query");
        snprintf(path, sizeof(path), "%s?wait_ms=0&wait", bases[b]);
        assert_bad_query(path, "query");
        snprintf(path, sizeof(path), "%s?wait_ms=0&wait_ms=0", bases[b]);
        assert_bad_query(path, "wait_ms");
        snprintf(path, sizeof(path), "%s?wait_ms=30001", bases[b]);
        assert_bad_query(path, "wait_ms");
        snprintf(path, sizeof(path), "%s?wait_ms=0", bases[b]);
        cr_assert_eq(req("GET", path, NULL, NULL), 200, "GET %s", path);
        snprintf(path, sizeof(path), "%s?&wait%%5Fms=0&", bases[b]);
        cr_assert_eq(req("GET", path, NULL, NULL), 200, "GET %s", path);
    }
}

/* ---- randomized: no pin outlives its handle ----
 * Interleaves LOOKUP and WARM prefetches, releases, DELETEs, lease
 * expiries, evicting stores and (forced) key deletes, and after every step
 * compares every key's pin count in the index with a reference model built
 * only from what the API answered and what the test did. */

#define RK    8  /* keys in the universe */
#define RH    24 /* handles tracked at once */
#define RMAXN 6  /* keys per prefetch */

struct rhandle {
    int id; /* 0: slot free */
    size_t n;
    int key[RMAXN];       /* universe key of each index */
    uint32_t pins[RMAXN]; /* pins the model says this handle holds */
    int retained[RMAXN];
};

static struct rhandle rh[RH];
static int r_pinned_steps, r_lost;
static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void model_forget(struct rhandle *h)
{
    memset(h, 0, sizeof(*h));
}

/* Learns from GET what happened while the loop ran (expiry, completion). */
static void model_refresh(void)
{
    for (int s = 0; s < RH; s++) {
        struct rhandle *h = &rh[s];
        if (!h->id)
            continue;
        char path[64];
        snprintf(path, sizeof(path), "/v1/prefetches/%d", h->id);
        cJSON *j = NULL;
        int st = req("GET", path, NULL, &j);
        if (st == 410 || st == 404) {
            model_forget(h);
        } else {
            cr_assert_eq(st, 200);
            const char *status = str(j, "status");
            cr_assert(strcmp(status, "pending") != 0, "catalog loads finish in one turn");
            if (strcmp(status, "released") == 0)
                model_forget(h);
        }
        cJSON_Delete(j);
    }
}

static void model_check(int step)
{
    uint32_t want[RK] = {0};
    for (int s = 0; s < RH; s++)
        for (size_t i = 0; i < rh[s].n; i++)
            want[rh[s].key[i]] += rh[s].pins[i];
    for (int k = 0; k < RK; k++) {
        kvidx_entry_info_t in = info_of(k);
        cr_assert_eq(in.pins, want[k], "step %d: key %d has %u pins, model %u", step, k, in.pins,
                     want[k]);
        r_pinned_steps += want[k] > 0;
        if (want[k])
            cr_assert_eq(in.l1_state, KVIDX_L1_READY, "step %d: pinned key %d not ready", step, k);
    }
}

static void r_prefetch(void)
{
    int s = 0;
    while (s < RH && rh[s].id)
        s++;
    if (s == RH)
        return;
    struct rhandle *h = &rh[s];
    int warm = rnd(5) == 0;
    uint32_t extra = rnd(3);
    static const char *pol[] = {"PREFIX", "SEGMENTED_PREFIX", "SPARSE"};
    char body[2048];
    size_t n = 1 + rnd(RMAXN), o = 0;
    o += (size_t)snprintf(body + o, sizeof(body) - o, "{\"keys\":[");
    for (size_t i = 0; i < n; i++) {
        h->key[i] = (int)rnd(RK);
        o += (size_t)snprintf(body + o, sizeof(body) - o, "%s%s", i ? "," : "", keyobj(h->key[i]));
    }
    snprintf(body + o, sizeof(body) - o,
             "],\"mode\":\"%s\",\"trim_policy\":\"%s\",\"extra_count\":%u,\"lease_ms\":%u}",
             warm ? "WARM" : "LOOKUP", pol[rnd(3)], extra, 5 + rnd(40));
    cJSON *j = NULL;
    cr_assert_eq(req("POST", "/v1/prefetches", body, &j), 201);
    h->id = (int)num(j, "id");
    h->n = n;
    cJSON_Delete(j);
    run_loop(); /* catalog loads complete */
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", h->id);
    int st = req("GET", path, NULL, &j);
    if (st != 200) { /* expired already */
        cJSON_Delete(j);
        model_forget(h);
        return;
    }
    const cJSON *ret = cJSON_GetObjectItem(j, "retained_indices");
    cr_assert(cJSON_IsArray(ret));
    cr_assert(!warm || cJSON_GetArraySize(ret) == 0);
    for (const cJSON *x = ret->child; x; x = x->next) {
        h->retained[x->valueint] = 1;
        h->pins[x->valueint] = 1 + extra;
    }
    cJSON_Delete(j);
}

static struct rhandle *r_pick(void)
{
    int s = (int)rnd(RH);
    return rh[s].id ? &rh[s] : NULL;
}

static void r_release_one(void)
{
    struct rhandle *h = r_pick();
    if (!h)
        return;
    size_t i = rnd((uint32_t)h->n);
    char path[64], body[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d/release", h->id);
    snprintf(body, sizeof(body), "{\"indices\":[%zu]}", i);
    int st = req("POST", path, body, NULL);
    if (h->pins[i]) {
        cr_assert_eq(st, 200);
        h->pins[i]--;
    } else {
        cr_assert_eq(st, 409, "releasing a pin not held answered %d", st);
    }
}

static void r_release_all(void)
{
    struct rhandle *h = r_pick();
    if (!h)
        return;
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d/release", h->id);
    int st = req("POST", path, NULL, NULL);
    uint32_t left = 0;
    for (size_t i = 0; i < h->n; i++)
        left += h->pins[i];
    cr_assert_eq(st, 200, "release answered %d", st);
    for (size_t i = 0; i < h->n; i++)
        if (h->retained[i] && h->pins[i])
            h->pins[i]--;
    (void)left;
}

static void r_delete_handle(void)
{
    struct rhandle *h = r_pick();
    if (!h)
        return;
    char path[64];
    snprintf(path, sizeof(path), "/v1/prefetches/%d", h->id);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    cr_assert_eq(req("DELETE", path, NULL, NULL), 204);
    model_forget(h);
}

static void r_delete_key(void)
{
    int k = (int)rnd(RK), force = (int)rnd(2);
    static const char *tiers[] = {"l1", "l2", "all"};
    const char *tier = tiers[rnd(3)];
    cr_assert_eq(req_f("DELETE", "/v1/keys", NULL, "{\"tier\":\"%s\",\"force\":%s,\"keys\":[%s]}",
                       tier, force ? "true" : "false", keyobj(k)),
                 200);
    if (!force || strcmp(tier, "l2") == 0)
        return;
    /* The pinned copy is gone: every handle lost its pins on it. */
    for (int s = 0; s < RH; s++)
        for (size_t i = 0; i < rh[s].n; i++)
            if (rh[s].key[i] == k && rh[s].pins[i]) {
                rh[s].pins[i] = 0;
                r_lost++;
            }
}

static void r_store(void)
{
    int k = (int)rnd(RK);
    int st = req_f("PUT", "/v1/keys", NULL,
                   "{\"tier\":\"%s\",\"entries\":[{\"key\":%s,\"size_bytes\":10}]}",
                   rnd(2) ? "l1" : "l2", keyobj(k));
    cr_assert(st == 200 || st == 507, "store answered %d", st);
}

Test(prefetch, randomized_no_pin_outlives_its_handle)
{
    app.cfg.handle_grace_ms = 5;
    app.cfg.l1_capacity_bytes = 50;
    kvidx_index_set_capacity(app.keystore->idx, 50, 0);
    memset(rh, 0, sizeof(rh));
    for (int step = 0; step < 3000; step++) {
        switch (rnd(10)) {
        case 0:
        case 1:
            r_store();
            break;
        case 2:
        case 3:
            r_prefetch();
            break;
        case 4:
            r_release_one();
            break;
        case 5:
            r_release_all();
            break;
        case 6:
            r_delete_handle();
            break;
        case 7:
            r_delete_key();
            break;
        case 8:
            if (rnd(4) == 0)
                sleep_loop(rnd(12));
            break;
        default:
            run_loop();
            break;
        }
        model_refresh();
        model_check(step);
    }
    /* Every handle ends: nothing stays pinned. */
    sleep_loop(60);
    model_refresh();
    for (int s = 0; s < RH; s++)
        cr_assert_eq(rh[s].id, 0, "handle %d outlived its lease", rh[s].id);
    model_check(-1);
    for (int k = 0; k < RK; k++)
        cr_assert_eq(info_of(k).pins, 0);
    /* The run exercised what it claims to. */
    cr_assert_gt(metrics_get(app.metrics, "kvidx_expirations_total"), 10);
    cr_assert_gt(metrics_get(app.metrics, "kvidx_loads_total"), 10);
    kvidx_index_stats_t st;
    kvidx_index_stats(app.keystore->idx, &st);
    cr_assert_gt(st.evictions, 10);
    cr_assert_gt(r_pinned_steps, 100);
    cr_assert_gt(r_lost, 5);
}
