/*
 * The access check and the salt rules (state/auth.c), through the router
 * with fake requests: the Authorization header's forms, 401 before 404,
 * 403 by role, open routes, the role every route of the API needs, the
 * principal reset per request, the tokens file's reload (a broken file
 * keeps the tokens in force), and the salt helpers handlers use.
 */
#include <criterion/criterion.h>

#include "app.h"
#include "net/router.h"
#include "route_call.h"
#include "state/auth.h"
#include "state/keystore.h"
#include "state/prefetches.h"
#include "util/config.h"
#include "util/context.h"
#include "util/metrics.h"

#include "kvidx/err.h"
#include "kvidx/index_quota.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct app app;
static uv_loop_t loop;
static char tokens_path[256];

static void write_tokens(const char *text)
{
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.new", tokens_path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    chmod(tmp, 0600);
    cr_assert_eq(rename(tmp, tokens_path), 0);
}

static const char *const TOKENS = "# tenants\n"
                                  "tA-write write salt=a quota_bytes=1KiB\n"
                                  "tB-write write salt=b\n"
                                  "tE-read read salt=\n"
                                  "t-read read\n"
                                  "t-admin admin\n";

static void setup(void)
{
    memset(&app, 0, sizeof(app));
    snprintf(tokens_path, sizeof(tokens_path), "/tmp/kvidx-test-auth-%d.tokens", (int)getpid());
    write_tokens(TOKENS);
    config_defaults(&app.cfg);
    snprintf(app.cfg.auth_tokens_file, sizeof(app.cfg.auth_tokens_file), "%s", tokens_path);
    cr_assert_eq(uv_loop_init(&loop), 0);
    app.loop = &loop;
    app.metrics = metrics_new();
    cr_assert_not_null(app.metrics);
    cr_assert_eq(keystore_init(&app), 0);
    cr_assert_eq(auth_init(&app), 0);
    cr_assert_eq(prefetches_init(&app), 0);
    app.ready = 1;
    router_use_tables(app_route_tables);
}

static void teardown(void)
{
    prefetches_stop(&app);
    uv_run(&loop, UV_RUN_DEFAULT);
    prefetches_free(&app);
    auth_free(&app);
    keystore_free(&app);
    metrics_free(app.metrics);
    cr_assert_eq(uv_loop_close(&loop), 0, "a uv handle was leaked");
    unlink(tokens_path);
}

/* One request through the router with the Authorization value auth (NULL:
 * none). The caller frees it with call_free. */
static struct call *call(const char *method, const char *target, const char *auth, const char *body)
{
    struct call *c = route_call(&app, method, target, auth, body);
    cr_assert_eq(c->rc, 0, "%s %s went async", method, target);
    return c;
}

static int status(const char *method, const char *target, const char *auth, const char *body)
{
    struct call *c = call(method, target, auth, body);
    int st = c->res.status;
    call_free(c);
    return st;
}

static int has_header(const struct call *c, const char *line)
{
    return strstr(c->res.extra_headers, line) != NULL;
}

TestSuite(auth, .init = setup, .fini = teardown);

Test(auth, no_token_is_401_with_the_challenge_even_for_unknown_paths)
{
    static const char *const targets[][2] = {
        {"GET", "/v1/keys"},    {"GET", "/no/such/path"}, {"DELETE", "/v1/layouts"},
        {"GET", "/metrics"},    {"POST", "/v1/lookup"},   {"GET", "/v1/keys/m@00000000@0@aa"},
        {"OTHER", "/v1/stats"},
    };
    for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
        struct call *c = call(targets[i][0], targets[i][1], NULL, NULL);
        cr_assert_eq(c->res.status, 401, "%s %s", targets[i][0], targets[i][1]);
        cr_assert(has_header(c, "WWW-Authenticate: Bearer\r\n"));
        cr_assert(strstr(c->res.body.data, "\"code\":\"unauthorized\""), "%s", c->res.body.data);
        cr_assert_null(c->req.principal);
        call_free(c);
    }
    /* With a valid token the router answers as usual. */
    cr_assert_eq(status("GET", "/no/such/path", "Bearer t-read", NULL), 404);
    cr_assert_eq(status("OTHER", "/v1/stats", "Bearer t-read", NULL), 405);
}

Test(auth, the_header_forms)
{
    static const struct {
        const char *value;
        int status;
    } cases[] = {
        {"Bearer t-read", 200},
        {"bearer t-read", 200},
        {"BEARER   t-read  ", 200},
        {"  Bearer\tt-read", 200},
        {"Bearer t-rea", 401},
        {"Bearer t-read2", 401},
        {"Bearer", 401},
        {"Bearer ", 401},
        {"Bearert-read", 401},
        {"Basic dC1yZWFkOg==", 401},
        {"Bearer t-read x", 401},
        {"Bearer t-read,Bearer t-admin", 401}, /* two header lines joined */
        {"Bearer t-read,t-admin", 401},
        {"", 401},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_assert_eq(status("GET", "/v1/limits", cases[i].value, NULL), cases[i].status, "'%s'",
                     cases[i].value);
}

Test(auth, open_routes_need_nothing)
{
    cr_assert_eq(status("GET", "/livez", NULL, NULL), 200);
    cr_assert_eq(status("GET", "/readyz", NULL, NULL), 200);
    cr_assert_eq(status("HEAD", "/livez", NULL, NULL), 200);
    cr_assert_eq(status("POST", "/livez", NULL, NULL), 405);
    /* A bad token on an open route is not looked at. */
    cr_assert_eq(status("GET", "/livez", "Bearer nope", NULL), 200);
}

Test(auth, roles)
{
    static const char *const put = "{\"entries\":[{\"key\":{\"model_name\":\"m\",\"kv_rank\":0,"
                                   "\"object_group_id\":0,\"chunk_hash_hex\":\"aa\"},"
                                   "\"size_bytes\":1}]}";
    static const char *const layout =
        "{\"model_name\":\"m\",\"world_size\":1,\"kv_shape\":[2,1,16,8,128],\"dtype\":\"float16\"}";
    cr_assert_eq(status("PUT", "/v1/keys", "Bearer t-read", put), 403);
    cr_assert_eq(status("PUT", "/v1/keys", "Bearer t-admin", put), 200);
    cr_assert_eq(status("GET", "/v1/keys", "Bearer t-read", NULL), 200);
    cr_assert_eq(status("POST", "/v1/lookup", "Bearer t-read", "{\"keys\":[]}"), 200);
    cr_assert_eq(status("DELETE", "/v1/keys/m@00000000@0@aa", "Bearer t-read", NULL), 403);
    cr_assert_eq(status("GET", "/metrics", "Bearer tE-read", NULL), 200);
    cr_assert_eq(status("GET", "/v1/stats", "Bearer tE-read", NULL), 200);
    struct call *c = call("PUT", "/v1/layouts", "Bearer tA-write", layout);
    cr_assert_eq(c->res.status, 403);
    cr_assert(strstr(c->res.body.data, "\"code\":\"forbidden\""));
    cr_assert(strstr(c->res.body.data, "admin"), "%s", c->res.body.data);
    cr_assert_null(strstr(c->res.body.data, "tA-write"), "the token is never echoed");
    call_free(c);
    cr_assert_eq(status("DELETE", "/v1/layouts?model_name=m", "Bearer tB-write", NULL), 403);
    cr_assert_neq(status("PUT", "/v1/layouts", "Bearer t-admin", layout), 403);
    cr_assert_eq(status("GET", "/v1/layouts", "Bearer t-read", NULL), 200);
    cr_assert_eq(status("POST", "/v1/prefetches", "Bearer t-read", "{\"keys\":[]}"), 403);
    cr_assert_eq(status("POST", "/v1/loads/1", "Bearer t-read", "{}"), 403);
    cr_assert_eq(status("GET", "/v1/loads", "Bearer t-read", NULL), 200);
}

/* Every route of the API follows the rule: reads need read, writes need
 * write, configuration needs admin, and only liveness and readiness are
 * open. A route added later must be classified here to pass. */
Test(auth, every_route_has_the_role_its_kind_needs)
{
    static const char *const read_posts[] = {"/v1/lookup", "/directory/lookup", "/directory/score",
                                             NULL};
    static const char *const admin_paths[] = {"/v1/layouts", NULL};
    static const char *const open_paths[] = {"/livez", "/readyz", NULL};
    /* LMCache's servers post these without a token from ingest_allow_from
     * (GET /instances, the list, is a plain read). */
    static const char *const ingest_paths[] = {
        "/events", "/instances", "/instances/*/heartbeat", "/instances/*", "/healthz", NULL};
    size_t n = 0;
    for (size_t t = 0; app_route_tables[t]; t++) {
        for (const struct route *r = app_route_tables[t]; r->pattern; r++, n++) {
            int is_read_post = 0, is_admin = 0, is_open = 0, is_ingest = 0;
            for (size_t i = 0; read_posts[i]; i++)
                is_read_post |= strcmp(r->pattern, read_posts[i]) == 0;
            for (size_t i = 0; admin_paths[i]; i++)
                is_admin |= strcmp(r->pattern, admin_paths[i]) == 0 && r->method != M_GET;
            for (size_t i = 0; open_paths[i]; i++)
                is_open |= strcmp(r->pattern, open_paths[i]) == 0;
            for (size_t i = 0; ingest_paths[i]; i++)
                is_ingest |= strcmp(r->pattern, ingest_paths[i]) == 0 &&
                             !(r->method == M_GET && strcmp(r->pattern, "/instances") == 0);
            enum route_access want = is_ingest && r->method == M_GET      ? ROUTE_INGEST_READ
                                     : is_ingest                          ? ROUTE_INGEST
                                     : is_open                            ? ROUTE_OPEN
                                     : is_admin                           ? ROUTE_ADMIN
                                     : r->method == M_GET || is_read_post ? ROUTE_READ
                                                                          : ROUTE_WRITE;
            cr_assert_eq(r->access, want, "%s %s (%s)", r->method == M_GET ? "GET" : "other",
                         r->pattern, r->name);
        }
    }
    cr_assert_gt(n, 15);
}

Test(auth, the_principal_is_set_per_request)
{
    struct call *c = call("GET", "/v1/limits", "Bearer tA-write", NULL);
    cr_assert_eq(c->res.status, 200);
    cr_assert_not_null(c->req.principal);
    cr_assert_eq(c->req.principal->role, KVIDX_ROLE_WRITE);
    cr_assert_str_eq(c->req.principal->salt, "a");
    cr_assert_eq(c->res.principal, c->req.principal);
    /* The same request object again, on an open route: no principal. */
    buf_reset(&c->res.body);
    c->req.path = "/livez";
    c->req.path_len = 6;
    cr_assert_eq(router_dispatch(&c->req, &c->res, NULL), 0);
    cr_assert_null(c->req.principal);
    cr_assert_null(c->res.principal);
    call_free(c);
}

Test(auth, reload_takes_new_tokens_and_keeps_them_on_a_broken_file)
{
    cr_assert_eq(status("GET", "/v1/limits", "Bearer t-new", NULL), 401);
    write_tokens("t-new read\nt-admin admin\n");
    auth_reload(&app);
    cr_assert_eq(status("GET", "/v1/limits", "Bearer t-new", NULL), 200);
    cr_assert_eq(status("GET", "/v1/limits", "Bearer t-read", NULL), 401, "removed");
    /* The quota of salt a went with its token. */
    kvidx_salt_usage_t u;
    kvidx_index_salt_usage(app.keystore->idx, "a", 1, &u);
    cr_assert_eq(u.quota_bytes, 0);
    write_tokens("t-newer read\nt-broken superuser\n");
    auth_reload(&app);
    cr_assert_eq(status("GET", "/v1/limits", "Bearer t-new", NULL), 200, "kept");
    cr_assert_eq(status("GET", "/v1/limits", "Bearer t-newer", NULL), 401);
    unlink(tokens_path);
    auth_reload(&app);
    cr_assert_eq(status("GET", "/v1/limits", "Bearer t-new", NULL), 200, "kept");
    write_tokens(TOKENS);
    auth_reload(&app);
    kvidx_index_salt_usage(app.keystore->idx, "a", 1, &u);
    cr_assert_eq(u.quota_bytes, 1024);
}

Test(auth, two_quotas_for_one_salt_the_smaller_wins)
{
    write_tokens("x1 write salt=s quota_bytes=5MiB\nx2 read salt=s quota_bytes=3MiB\n"
                 "x3 write salt=s\nx4 write salt=t quota_bytes=7\n");
    auth_reload(&app);
    kvidx_salt_usage_t u;
    kvidx_index_salt_usage(app.keystore->idx, "s", 1, &u);
    cr_assert_eq(u.quota_bytes, 3u << 20);
    kvidx_index_salt_usage(app.keystore->idx, "t", 1, &u);
    cr_assert_eq(u.quota_bytes, 7);
}

/* A request with the principal of one token, without the router. */
static void as(struct request *r, const char *token)
{
    memset(r, 0, sizeof(*r));
    r->app = &app;
    struct call *c = call("GET", "/v1/limits", token, NULL);
    r->principal_buf = c->req.principal_buf;
    r->principal = &r->principal_buf;
    call_free(c);
}

static kvidx_key_t key_of(const char *salt)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = "m";
    k.model_len = 1;
    k.salt = salt;
    k.salt_len = (uint8_t)strlen(salt);
    k.hash_len = 2;
    return k;
}

Test(auth, salt_helpers)
{
    struct request ra, re, rr;
    as(&ra, "Bearer tA-write");
    as(&re, "Bearer tE-read");
    as(&rr, "Bearer t-read");
    cr_assert(auth_sees_salt(&ra, "a", 1));
    cr_assert_not(auth_sees_salt(&ra, "", 0));
    cr_assert_not(auth_sees_salt(&ra, "ab", 2));
    cr_assert(auth_sees_salt(&re, "", 0), "salt= binds the empty salt");
    cr_assert_not(auth_sees_salt(&re, "a", 1));
    cr_assert(auth_sees_salt(&rr, "anything", 8));
    cr_assert_not(auth_sees_all_salts(&rr));
    struct request none;
    memset(&none, 0, sizeof(none));
    cr_assert(auth_sees_salt(&none, "x", 1));
    cr_assert(auth_sees_all_salts(&none));

    kvidx_key_t keys[3] = {key_of("a"), key_of("b"), key_of("")};
    auth_hide_keys(&ra, keys, 3);
    cr_assert_str_eq(keys[0].salt, "a");
    cr_assert_neq(strcmp(keys[1].salt, "b"), 0);
    cr_assert_neq(kvidx_key_check_salt(keys[1].salt, keys[1].salt_len, NULL), 0,
                  "a hidden key's salt is one no key can have");
    cr_assert_neq(kvidx_key_check_salt(keys[2].salt, keys[2].salt_len, NULL), 0);

    struct response res;
    memset(&res, 0, sizeof(res));
    buf_init(&res.body);
    kvidx_key_t mixed[2] = {key_of("a"), key_of("b")};
    cr_assert_eq(auth_forbid_keys(&ra, &res, mixed, sizeof(mixed[0]), 1), 0);
    cr_assert_eq(auth_forbid_keys(&ra, &res, mixed, sizeof(mixed[0]), 2), KVIDX_EFORBIDDEN);
    cr_assert_eq(res.status, 403);
    cr_assert_eq(auth_forbid_keys(&rr, &res, mixed, sizeof(mixed[0]), 2), 0);
    buf_free(&res.body);

    kvidx_list_query_t q;
    memset(&q, 0, sizeof(q));
    cr_assert_eq(auth_list_scope(&ra, &q), 0);
    cr_assert(q.has_salt && q.salt_len == 1 && q.salt[0] == 'a', "the salt filter is forced");
    memset(&q, 0, sizeof(q));
    q.has_salt = 1;
    q.salt_len = 1;
    q.salt[0] = 'b';
    cr_assert_eq(auth_list_scope(&ra, &q), 1, "another salt lists nothing");
    memset(&q, 0, sizeof(q));
    cr_assert_eq(auth_list_scope(&rr, &q), 0);
    cr_assert_not(q.has_salt);
}

Test(auth, salt_labels_are_keyed_hashes)
{
    char a[17], b[17], a2[17];
    auth_salt_label(&app, "a", 1, a);
    auth_salt_label(&app, "b", 1, b);
    auth_salt_label(&app, "a", 1, a2);
    cr_assert_eq(strlen(a), 16);
    cr_assert_str_eq(a, a2);
    cr_assert_str_neq(a, b);
    cr_assert_eq(strspn(a, "0123456789abcdef"), 16);
}

/* Without a tokens file nothing is checked. */
Test(auth_off, everything_is_open)
{
    memset(&app, 0, sizeof(app));
    config_defaults(&app.cfg);
    cr_assert_eq(uv_loop_init(&loop), 0);
    app.loop = &loop;
    app.metrics = metrics_new();
    cr_assert_eq(keystore_init(&app), 0);
    cr_assert_eq(auth_init(&app), 0);
    cr_assert_not(auth_enabled(&app));
    router_use_tables(app_route_tables);
    struct call *c = call("GET", "/v1/keys", NULL, NULL);
    cr_assert_eq(c->res.status, 200);
    cr_assert_null(c->req.principal);
    call_free(c);
    cr_assert_eq(status("GET", "/v1/limits", "Bearer whatever", NULL), 200);
    auth_free(&app);
    keystore_free(&app);
    metrics_free(app.metrics);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(auth_file, a_bad_file_stops_the_start)
{
    memset(&app, 0, sizeof(app));
    snprintf(tokens_path, sizeof(tokens_path), "/tmp/kvidx-test-auth-bad-%d.tokens", (int)getpid());
    config_defaults(&app.cfg);
    snprintf(app.cfg.auth_tokens_file, sizeof(app.cfg.auth_tokens_file), "%s", tokens_path);
    cr_assert_eq(uv_loop_init(&loop), 0);
    app.loop = &loop;
    app.metrics = metrics_new();
    cr_assert_eq(keystore_init(&app), 0);
    cr_assert_eq(auth_init(&app), KVIDX_EINVAL, "missing file");
    write_tokens("ok read\nbad read quota_bytes=1\n");
    cr_assert_eq(auth_init(&app), KVIDX_EINVAL, "a quota without a salt");
    cr_assert_null(app.auth);
    unlink(tokens_path);
    keystore_free(&app);
    metrics_free(app.metrics);
    cr_assert_eq(uv_loop_close(&loop), 0);
    router_use_guard(NULL, NULL);
}
