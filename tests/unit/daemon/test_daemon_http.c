/*
 * HTTP transport without a socket: requests go through conn_feed() (parse →
 * route → handler → serialize) and the answers are compared as bytes. Every
 * request is fed whole and then one byte at a time; both must give the same
 * output and the same close decision. Also query_get/pct_decode edge cases.
 */
#include "util/context.h"
#include "util/config.h"
#include "net/conn.h"
#include "net/http.h"
#include "kvidx/err.h"
#include "net/router.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct app app;

static int h_hello(const struct request *req, struct response *res)
{
    (void)req;
    buf_puts(&res->body, "{\"hello\":1}");
    res_json(res, 200);
    return 0;
}

static int h_echo(const struct request *req, struct response *res)
{
    buf_printf(&res->body, "{\"len\":%zu,\"q\":\"%s\"}", req->body_len, req->query);
    res_json(res, 200);
    return 0;
}

static int h_param(const struct request *req, struct response *res)
{
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "p");
    jw_strn(&w, req->route_param, req->route_param_len);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

static int h_nocontent(const struct request *req, struct response *res)
{
    (void)req;
    res->status = 204;
    return 0;
}

/* What the request's Authorization was: the code that will check it. */
static int h_auth(const struct request *req, struct response *res)
{
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "auth");
    if (req->authorization)
        jw_str(&w, req->authorization);
    else
        jw_null(&w);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

/* A deferred answer completed later by the test. */
static struct response *deferred;
static int cancelled;

static void cancel_waiter(void *w)
{
    (void)w;
    cancelled++;
    deferred = NULL;
}

static int h_async(const struct request *req, struct response *res)
{
    (void)req;
    res_defer(res, NULL, cancel_waiter);
    deferred = res;
    return HANDLER_ASYNC;
}

static const struct route test_routes[] = {
    {M_GET, "/hello", h_hello, "hello", ROUTE_READ},
    {M_POST, "/echo", h_echo, "echo", ROUTE_READ},
    {M_PUT, "/echo", h_echo, "echo", ROUTE_READ},
    {M_GET, "/item/*", h_param, "item", ROUTE_READ},
    {M_DELETE, "/item/*", h_nocontent, "item_delete", ROUTE_READ},
    {M_GET, "/async", h_async, "async", ROUTE_READ},
    {M_GET, "/auth", h_auth, "auth", ROUTE_READ},
    {M_POST, "/auth", h_auth, "auth", ROUTE_READ},
    {0, NULL, NULL, NULL, 0},
};
static const struct route *const test_tables[] = {test_routes, NULL};

static void setup(void)
{
    memset(&app, 0, sizeof(app));
    config_defaults(&app.cfg);
    app.cfg.max_body_bytes = 1000;
    app.cfg.max_header_bytes = 400;
    app.cfg.max_uri_bytes = 100;
    router_use_tables(test_tables);
    deferred = NULL;
    cancelled = 0;
}

static void teardown(void)
{
    router_use_tables(NULL);
}

TestSuite(http, .init = setup, .fini = teardown);

struct result {
    char *out;
    int closed;
};

static struct result feed(const char *in, size_t n, int bytewise, int eof)
{
    struct conn *c = conn_new_test(&app);
    cr_assert_not_null(c);
    if (bytewise) {
        for (size_t i = 0; i < n; i++)
            conn_feed(c, in + i, 1);
    } else {
        conn_feed(c, in, n);
    }
    if (eof)
        conn_feed_eof(c);
    struct result r;
    struct buf *o = conn_test_output(c);
    r.out = strndup(o->data ? o->data : "", o->len);
    r.closed = conn_test_closed(c);
    conn_free_test(c);
    return r;
}

/* Feeds whole and byte by byte; both must agree. Returns the output. */
static struct result run(const char *in)
{
    struct result a = feed(in, strlen(in), 0, 0);
    struct result b = feed(in, strlen(in), 1, 0);
    cr_assert_str_eq(a.out, b.out, "whole vs bytewise differ for %s", in);
    cr_assert_eq(a.closed, b.closed);
    free(b.out);
    return a;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

Test(http, simple_get)
{
    struct result r = run("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_str_eq(r.out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            "Content-Length: 11\r\n\r\n{\"hello\":1}");
    cr_assert_eq(r.closed, 0);
    free(r.out);
}

Test(http, pipelined_in_order)
{
    struct result r = run("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
                          "GET /item/a HTTP/1.1\r\nHost: x\r\n\r\n"
                          "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                          "GET /item/b%2Fc/d HTTP/1.1\r\nHost: x\r\n\r\n");
    const char *a = strstr(r.out, "{\"hello\":1}");
    const char *b = strstr(r.out, "{\"p\":\"a\"}");
    const char *c = strstr(r.out, "not_found");
    const char *d = strstr(r.out, "{\"p\":\"b/c/d\"}");
    cr_assert(a && b && c && d, "%s", r.out);
    cr_assert(a < b && b < c && c < d);
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 4);
    cr_assert_eq(r.closed, 0);
    free(r.out);
}

Test(http, many_pipelined_pause_and_resume)
{
    /* More than the pipeline depth, in one buffer. */
    struct buf in;
    buf_init(&in);
    for (int i = 0; i < 300; i++)
        buf_printf(&in, "GET /item/%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
    struct result r = feed(in.data, in.len, 0, 0);
    cr_assert_eq(count(r.out, "HTTP/1.1 200"), 300);
    const char *p = r.out;
    for (int i = 0; i < 300; i++) {
        char want[32];
        snprintf(want, sizeof(want), "{\"p\":\"%d\"}", i);
        p = strstr(p, want);
        cr_assert_not_null(p, "answer %d missing or out of order", i);
    }
    free(r.out);
    buf_free(&in);
}

Test(http, connection_close)
{
    struct result r = run("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                          "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(count(r.out, "HTTP/1.1 200"), 1);
    cr_assert(strstr(r.out, "Connection: close\r\n"));
    cr_assert_eq(r.closed, 1);
    free(r.out);
}

Test(http, http10)
{
    struct result r = run("GET /hello HTTP/1.0\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 OK\r\n"));
    cr_assert(strstr(r.out, "Connection: close\r\n"));
    cr_assert_eq(r.closed, 1);
    free(r.out);
    r = run("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    cr_assert(strstr(r.out, "Connection: keep-alive\r\n"));
    cr_assert_eq(r.closed, 0);
    free(r.out);
}

Test(http, head)
{
    struct result r =
        run("HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_str_eq(r.out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            "Content-Length: 11\r\n\r\n"
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            "Content-Length: 11\r\n\r\n{\"hello\":1}");
    free(r.out);
}

Test(http, not_found_problem)
{
    struct result r = run("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 404 Not Found\r\n"));
    cr_assert(strstr(r.out, "Content-Type: application/problem+json\r\n"));
    cr_assert(strstr(r.out, "\"type\":\"https://kvidx.dev/problems/not_found\""));
    cr_assert(strstr(r.out, "\"status\":404"));
    cr_assert(strstr(r.out, "\"code\":\"not_found\""));
    cr_assert(strstr(r.out, "\"title\":"));
    cr_assert(strstr(r.out, "\"detail\":"));
    cr_assert_eq(r.closed, 0);
    free(r.out);
}

Test(http, method_not_allowed)
{
    struct result r = run("PATCH /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 405 "), "%s", r.out);
    cr_assert(strstr(r.out, "Allow: PUT, POST\r\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\"code\":\"method_not_allowed\""));
    free(r.out);
    r = run("POST /item/x HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "Allow: GET, HEAD, DELETE\r\n"), "%s", r.out);
    free(r.out);
}

Test(http, content_type)
{
    struct result r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                          "Content-Length: 2\r\n\r\n{}");
    cr_assert(strstr(r.out, "HTTP/1.1 415 "), "%s", r.out);
    cr_assert(strstr(r.out, "unsupported_media_type"));
    cr_assert_eq(r.closed, 0);
    free(r.out);
    r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    cr_assert(strstr(r.out, "HTTP/1.1 415 "), "%s", r.out);
    free(r.out);
    r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: Application/JSON; charset=utf-8\r\n"
            "Content-Length: 2\r\n\r\n{}");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    cr_assert(strstr(r.out, "{\"len\":2,"));
    free(r.out);
    /* An empty body needs no Content-Type. */
    r = run("POST /echo?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    cr_assert(strstr(r.out, "{\"len\":0,\"q\":\"x=1\"}"), "%s", r.out);
    free(r.out);
}

Test(http, body_too_large_by_length)
{
    struct result r = run("PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: 1001\r\n\r\n{}");
    cr_assert(strstr(r.out, "HTTP/1.1 413 "), "%s", r.out);
    cr_assert(strstr(r.out, "payload_too_large"));
    cr_assert(strstr(r.out, "Connection: close"));
    cr_assert_eq(r.closed, 1);
    free(r.out);
    /* Exactly the limit is served. */
    char req[1200];
    int n = snprintf(req, sizeof(req),
                     "PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n");
    memset(req + n, ' ', 1000);
    req[n + 1000] = '\0';
    r = run(req);
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
}

Test(http, body_too_large_chunked)
{
    struct buf in;
    buf_init(&in);
    buf_puts(&in, "PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        buf_puts(&in, "190\r\n");
        for (int j = 0; j < 400; j++)
            buf_putc(&in, 'x');
        buf_puts(&in, "\r\n");
    }
    buf_puts(&in, "0\r\n\r\n");
    struct result r = run(in.data);
    cr_assert(strstr(r.out, "HTTP/1.1 413 "), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    buf_free(&in);
}

Test(http, chunked_body)
{
    struct result r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n"
                          "3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n"
                          "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "{\"len\":7,"), "%s", r.out);
    cr_assert(strstr(r.out, "{\"hello\":1}"));
    free(r.out);
}

Test(http, headers_too_large)
{
    char req[2048];
    int n = snprintf(req, sizeof(req), "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + n, 'a', 500);
    strcpy(req + n + 500, "\r\n\r\n");
    struct result r = run(req);
    cr_assert(strstr(r.out, "HTTP/1.1 431 "), "%s", r.out);
    cr_assert(strstr(r.out, "headers_too_large"));
    cr_assert(!strstr(r.out, "aaaa"), "echoes request bytes");
    cr_assert_eq(r.closed, 1);
    free(r.out);
}

Test(http, uri_too_long)
{
    char req[2048];
    int n = snprintf(req, sizeof(req), "GET /item/");
    memset(req + n, 'b', 200);
    strcpy(req + n + 200, " HTTP/1.1\r\nHost: x\r\n\r\n");
    struct result r = run(req);
    cr_assert(strstr(r.out, "HTTP/1.1 414 "), "%s", r.out);
    cr_assert(strstr(r.out, "uri_too_long"));
    cr_assert(!strstr(r.out, "bbbb"));
    cr_assert_eq(r.closed, 1);
    free(r.out);
}

Test(http, bad_request)
{
    struct result r = run("GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\x01\x02 / HTTP/9\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert(strstr(r.out, "application/problem+json"));
    cr_assert(strstr(r.out, "200 OK") < strstr(r.out, "400 Bad"));
    cr_assert_eq(r.closed, 1);
    free(r.out);
    r = run("GET /hello HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
    r = run("GET /item/%zz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert_eq(r.closed, 0);
    free(r.out);
    r = run("GET http://x/hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
}

Test(http, no_content)
{
    struct result r = run("DELETE /item/x HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_str_eq(r.out, "HTTP/1.1 204 No Content\r\n\r\n");
    free(r.out);
}

Test(http, header_timeout)
{
    struct conn *c = conn_new_test(&app);
    conn_feed(c, "GET /hel", 8);
    cr_assert_eq(conn_test_fire_timer(c), 1);
    cr_assert(strstr(conn_test_output(c)->data, "HTTP/1.1 408 "));
    cr_assert(strstr(conn_test_output(c)->data, "request_timeout"));
    conn_free_test(c);
}

Test(http, deferred_in_order_and_cancel)
{
    struct conn *c = conn_new_test(&app);
    const char *in = "GET /async HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    conn_feed(c, in, strlen(in));
    cr_assert_eq(conn_test_output(c)->len, 0, "the second answer overtook the first");
    cr_assert_not_null(deferred);
    buf_puts(&deferred->body, "{\"late\":1}");
    res_json(deferred, 200);
    res_complete(deferred);
    const char *o = conn_test_output(c)->data;
    cr_assert(strstr(o, "{\"late\":1}") && strstr(o, "{\"hello\":1}"));
    cr_assert(strstr(o, "{\"late\":1}") < strstr(o, "{\"hello\":1}"));
    conn_free_test(c);
    cr_assert_eq(cancelled, 0);

    c = conn_new_test(&app);
    const char *one = "GET /async HTTP/1.1\r\nHost: x\r\n\r\n";
    conn_feed(c, one, strlen(one));
    conn_free_test(c);
    cr_assert_eq(cancelled, 1);
}

Test(http, eof_answers_complete_requests)
{
    const char *in = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hel";
    struct result r = feed(in, strlen(in), 0, 1);
    cr_assert_eq(count(r.out, "HTTP/1.1 200"), 1);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    /* Answers still waiting when the peer half-closes are sent, the last
     * one saying it is the last. */
    in = "GET /async HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    struct conn *c = conn_new_test(&app);
    conn_feed(c, in, strlen(in));
    cr_assert_eq(conn_feed_eof(c), 0);
    res_json(deferred, 200);
    res_complete(deferred);
    cr_assert_eq(conn_test_closed(c), 1);
    cr_assert_eq(count(conn_test_output(c)->data, "HTTP/1.1 200"), 2);
    cr_assert(strstr(conn_test_output(c)->data, "Connection: close"));
    conn_free_test(c);
}

Test(http, expect_continue)
{
    struct result r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}");
    cr_assert(strncmp(r.out, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ", 38) == 0, "%s", r.out);
    free(r.out);
}

/* What `curl --http2 http://...` sends: an offer to switch to h2c. The
 * offer is declined by answering in HTTP/1.1, and the connection goes on. */
#define H2C_OFFER                                                                                  \
    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"                                      \
    "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"

Test(http, upgrade_offer_ignored)
{
    struct result r = run("GET /hello HTTP/1.1\r\nHost: x\r\n" H2C_OFFER "\r\n"
                          "GET /item/a HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 2, "%s", r.out);
    cr_assert_eq(count(r.out, "HTTP/1.1 200 "), 2, "%s", r.out);
    cr_assert(strstr(r.out, "{\"hello\":1}") < strstr(r.out, "{\"p\":\"a\"}"), "%s", r.out);
    cr_assert(!strstr(r.out, "Connection: close"), "%s", r.out);
    cr_assert(!strstr(r.out, "101 "), "%s", r.out);
    cr_assert_eq(r.closed, 0);
    free(r.out);
    /* With a body, and with a WebSocket offer. */
    r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" H2C_OFFER
            "Content-Length: 2\r\n\r\n{}"
            "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            "GET /item/b HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(count(r.out, "HTTP/1.1 200 "), 3, "%s", r.out);
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 3, "%s", r.out);
    cr_assert(strstr(r.out, "{\"len\":2,") && strstr(r.out, "{\"p\":\"b\"}"), "%s", r.out);
    cr_assert_eq(r.closed, 0);
    free(r.out);
}

Test(http, upgrade_offers_past_the_pipeline_depth)
{
    /* The parser pauses after a full pipeline with an upgrade offer
     * pending; resuming must go on with the next request. */
    struct buf in;
    buf_init(&in);
    for (int i = 0; i < 150; i++)
        buf_printf(&in, "GET /item/%d HTTP/1.1\r\nHost: x\r\n" H2C_OFFER "\r\n", i);
    struct result r = feed(in.data, in.len, 0, 0);
    cr_assert_eq(count(r.out, "HTTP/1.1 200"), 150);
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 150);
    cr_assert_eq(r.closed, 0);
    free(r.out);
    r = feed(in.data, in.len, 1, 0);
    cr_assert_eq(count(r.out, "HTTP/1.1 200"), 150);
    cr_assert_eq(r.closed, 0);
    free(r.out);
    buf_free(&in);
}

Test(http, connect_answered_once)
{
    /* What follows a CONNECT is tunnel data, not HTTP: one 405 answer,
     * then the connection ends. */
    struct result r = run("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
                          "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 1, "%s", r.out);
    cr_assert(strstr(r.out, "HTTP/1.1 405 Method Not Allowed\r\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\"code\":\"method_not_allowed\""), "%s", r.out);
    cr_assert(strstr(r.out, "\r\nAllow: \r\n"), "%s", r.out);
    cr_assert(strstr(r.out, "Connection: close\r\n"), "%s", r.out);
    cr_assert(!strstr(r.out, "example.com"), "echoes request bytes");
    cr_assert_eq(r.closed, 1);
    free(r.out);
    /* After an earlier request, and with tunnel bytes behind it. */
    r = run("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
            "\x16\x03\x01\x02\x00GET /hello HTTP/1.1\r\n\r\n");
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 2, "%s", r.out);
    cr_assert(strstr(r.out, "HTTP/1.1 200 ") < strstr(r.out, "HTTP/1.1 405 "), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
}

Test(http, trailer_fields_are_not_headers)
{
    /* A Content-Type sent only in the trailer does not make the body JSON. */
    struct result r = run("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "2\r\n{}\r\n0\r\nContent-Type: application/json\r\n\r\n"
                          "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 415 "), "%s", r.out);
    cr_assert(!strstr(r.out, "{\"len\":"), "%s", r.out);
    cr_assert(strstr(r.out, "{\"hello\":1}"), "%s", r.out);
    cr_assert_eq(r.closed, 0);
    free(r.out);
    /* Nor does it replace or extend the one in the header. */
    r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
            "Content-Type: text/plain\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    cr_assert(strstr(r.out, "{\"len\":2,"), "%s", r.out);
    free(r.out);
}

Test(http, trailer_authorization_never_counts)
{
    struct result r = run("POST /auth HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
                          "Authorization: Bearer trailer\r\n\r\n");
    cr_assert(strstr(r.out, "{\"auth\":null}"), "%s", r.out);
    free(r.out);
    r = run("POST /auth HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Authorization: Bearer header\r\nTransfer-Encoding: chunked\r\n\r\n"
            "2\r\n{}\r\n0\r\nAuthorization: Bearer trailer\r\n\r\n");
    cr_assert(strstr(r.out, "{\"auth\":\"Bearer header\"}"), "%s", r.out);
    free(r.out);
}

Test(http, repeated_authorization_is_not_glued)
{
    /* Two header lines must not join into one credential. */
    struct result r = run("GET /auth HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ab\r\n"
                          "Authorization: cd\r\n\r\n");
    cr_assert(!strstr(r.out, "Bearer abcd"), "%s", r.out);
    cr_assert(strstr(r.out, "{\"auth\":\"Bearer ab,cd\"}"), "%s", r.out);
    free(r.out);
    r = run("GET /auth HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ab\r\n\r\n");
    cr_assert(strstr(r.out, "{\"auth\":\"Bearer ab\"}"), "%s", r.out);
    free(r.out);
}

static void feed_as(struct conn *c, const char *in, int bytewise)
{
    size_t n = strlen(in);
    if (!bytewise) {
        conn_feed(c, in, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        conn_feed(c, in + i, 1);
}

static void feed_spaces(struct conn *c, size_t n, int bytewise)
{
    char sp[1000];
    memset(sp, ' ', sizeof(sp));
    cr_assert(n <= sizeof(sp));
    if (!bytewise) {
        conn_feed(c, sp, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        conn_feed(c, sp, 1);
}

static const char *out_of(struct conn *c)
{
    struct buf *o = conn_test_output(c);
    return o->data ? o->data : "";
}

#define PUT_LEN(n)                                                                                 \
    "PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"                          \
    "Content-Length: " #n "\r\n\r\n"
#define PUT_CHUNKED                                                                                \
    "PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"                          \
    "Transfer-Encoding: chunked\r\n\r\n"

/* The bodies of all connections together stay under max_total_body_bytes:
 * a body announced past it is refused at once, a chunked one when it grows
 * past it; the other connections are served, and the count goes back to
 * zero as bodies are freed. */
Test(http, total_body_budget)
{
    app.cfg.max_total_body_bytes = 1500;
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct conn_budget b = {0};
        struct conn *a = conn_new_test_shared(&app, &b);
        struct conn *d = conn_new_test_shared(&app, &b);
        struct conn *g = conn_new_test_shared(&app, &b);
        cr_assert(a && d && g);

        /* a announces 800 bytes and sends half: all 800 are counted. */
        feed_as(a, PUT_LEN(800), bytewise);
        feed_spaces(a, 400, bytewise);
        cr_assert_eq(b.body_bytes, 800);
        cr_assert_eq(conn_test_output(a)->len, 0);

        /* d announces 800 more: refused before any of it is read. */
        feed_as(d, PUT_LEN(800), bytewise);
        const char *o = out_of(d);
        cr_assert(strstr(o, "HTTP/1.1 503 Service Unavailable\r\n"), "%s", o);
        cr_assert(strstr(o, "application/problem+json"), "%s", o);
        cr_assert(strstr(o, "\"code\":\"too_many_connections\""), "%s", o);
        cr_assert(strstr(o, "\r\nRetry-After: 1\r\n"), "%s", o);
        cr_assert(strstr(o, "Connection: close\r\n"), "%s", o);
        cr_assert_eq(conn_test_closed(d), 1);
        cr_assert_eq(b.body_bytes, 800);

        /* Others are served: requests without a body, and bodies that fit. */
        feed_as(g, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", bytewise);
        feed_as(g, PUT_LEN(700), bytewise);
        feed_spaces(g, 700, bytewise);
        cr_assert_eq(count(out_of(g), "HTTP/1.1 200 "), 2, "%s", out_of(g));
        cr_assert(strstr(out_of(g), "{\"len\":700,"), "%s", out_of(g));
        cr_assert_eq(b.body_bytes, 800, "an answered body is given back");

        /* A chunked body is counted as it grows: 600 fit, 200 more do not. */
        feed_as(g, PUT_CHUNKED "258\r\n", bytewise);
        feed_spaces(g, 600, bytewise);
        feed_as(g, "\r\n", bytewise);
        cr_assert_eq(b.body_bytes, 1400);
        cr_assert_eq(conn_test_closed(g), 0);
        feed_as(g, "c8\r\n", bytewise);
        feed_spaces(g, 200, bytewise);
        cr_assert(strstr(out_of(g), "HTTP/1.1 503 "), "%s", out_of(g));
        cr_assert_eq(conn_test_closed(g), 1);
        cr_assert_eq(b.body_bytes, 800);

        /* a completes and is answered. */
        feed_spaces(a, 400, bytewise);
        cr_assert(strstr(out_of(a), "HTTP/1.1 200 "), "%s", out_of(a));
        cr_assert(strstr(out_of(a), "{\"len\":800,"), "%s", out_of(a));
        cr_assert_eq(b.body_bytes, 0);

        /* A connection that goes away in the middle of a body gives it back. */
        feed_as(a, PUT_LEN(1000), bytewise);
        feed_spaces(a, 10, bytewise);
        cr_assert_eq(b.body_bytes, 1000);
        conn_free_test(a);
        cr_assert_eq(b.body_bytes, 0);
        conn_free_test(d);
        conn_free_test(g);
    }
}

Test(http, total_body_budget_inclusive_and_per_connection)
{
    /* Exactly the bound is served; one byte more is not. */
    app.cfg.max_total_body_bytes = 1000;
    struct result r = run(PUT_LEN(2) "{}");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
    struct conn_budget b = {0};
    struct conn *c = conn_new_test_shared(&app, &b);
    feed_as(c, PUT_LEN(1000), 0);
    feed_spaces(c, 1000, 0);
    cr_assert(strstr(out_of(c), "HTTP/1.1 200 "), "%s", out_of(c));
    cr_assert_eq(b.body_bytes, 0);
    conn_free_test(c);
    app.cfg.max_total_body_bytes = 999;
    r = run(PUT_LEN(1000));
    cr_assert(strstr(r.out, "HTTP/1.1 503 "), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    /* A connection of its own (conn_new_test) is bound too, chunked or not. */
    char req[1200];
    int n = snprintf(req, sizeof(req), PUT_CHUNKED "3e8\r\n");
    memset(req + n, ' ', 1000);
    strcpy(req + n + 1000, "\r\n0\r\n\r\n");
    r = run(req);
    cr_assert(strstr(r.out, "HTTP/1.1 503 "), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    app.cfg.max_total_body_bytes = 1000;
    r = run(req);
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
}

Test(http, host_required_once)
{
    /* HTTP/1.1 needs exactly one Host. */
    struct result r = run("GET /hello HTTP/1.1\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert(strstr(r.out, "\"code\":\"invalid_argument\""), "%s", r.out);
    cr_assert(strstr(r.out, "Host"), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    r = run("GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert(!strstr(r.out, "{\"hello\":1}"), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    r = run("GET /hello HTTP/1.1\r\nhOsT: a\r\nX: 1\r\nHOST: a\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
    /* Earlier requests are answered first; the one without Host ends it. */
    r = run("GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\n\r\n"
            "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 2, "%s", r.out);
    cr_assert(strstr(r.out, "HTTP/1.1 200 ") < strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    /* HTTP/1.0 may omit it, but not repeat it. */
    r = run("GET /hello HTTP/1.0\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
    r = run("GET /hello HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
    /* Names that only start like it, and a Host in a trailer, do not count. */
    r = run("GET /hello HTTP/1.1\r\nHost: x\r\nHostname: y\r\nX-Host: z\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
    r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nHost: y\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
    r = run("POST /echo HTTP/1.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nHost: y\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
}

Test(http, whitespace_in_header_name)
{
    /* "Host : x" is not a Host header, nor any other: 400 and close. */
    const char *bad[] = {
        "GET /hello HTTP/1.1\r\nHost : x\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: x\r\nContent-Type : text/plain\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: x\r\nX-A\t: 1\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: x\r\nX A: 1\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-T : 1\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct result r = run(bad[i]);
        cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
        cr_assert_eq(count(r.out, "HTTP/1.1 "), 1, "%s", r.out);
        cr_assert(strstr(r.out, "Connection: close"), "%s", r.out);
        cr_assert_eq(r.closed, 1);
        free(r.out);
    }
    /* Whitespace after the colon is fine. */
    struct result r = run("GET /hello HTTP/1.1\r\nHost:x\r\nX-A:   1  \r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 200 "), "%s", r.out);
    free(r.out);
}

Test(http, transfer_encoding_on_http10)
{
    /* HTTP/1.0 has no transfer codings: the framing cannot be trusted. */
    struct result r = run("POST /echo HTTP/1.0\r\nContent-Type: application/json\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert(!strstr(r.out, "{\"len\":"), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    r = run("POST /echo HTTP/1.0\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
            "GET /hello HTTP/1.0\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    cr_assert_eq(count(r.out, "HTTP/1.1 "), 1, "%s", r.out);
    cr_assert(strstr(r.out, "Connection: close"), "%s", r.out);
    cr_assert_eq(r.closed, 1);
    free(r.out);
    /* The same body in HTTP/1.1 is fine. */
    r = run("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    cr_assert(strstr(r.out, "{\"len\":2,"), "%s", r.out);
    free(r.out);
}

#define POST_TE(te)                                                                                \
    "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"                         \
    "Transfer-Encoding: " te "\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n"

Test(http, transfer_codings_other_than_chunked)
{
    /* A coding we cannot undo (gzip before chunked): 501, once, and close. */
    const char *unknown[] = {
        POST_TE("gzip, chunked"),
        POST_TE("identity,chunked"),
        POST_TE("x-custom ,  chunked"),
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        struct result r = run(unknown[i]);
        cr_assert(strstr(r.out, "HTTP/1.1 501 Not Implemented\r\n"), "%s", r.out);
        cr_assert(strstr(r.out, "\"code\":\"not_implemented\""), "%s", r.out);
        cr_assert(strstr(r.out, "\"status\":501"), "%s", r.out);
        cr_assert(!strstr(r.out, "gzip") && !strstr(r.out, "x-custom"), "%s", r.out);
        cr_assert_eq(count(r.out, "HTTP/1.1 "), 1, "%s", r.out);
        cr_assert_eq(r.closed, 1);
        free(r.out);
    }
    /* chunked alone, in any case, and with empty list elements, is served. */
    const char *fine[] = {POST_TE("chunked"), POST_TE("Chunked"), POST_TE(", chunked")};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        struct result r = run(fine[i]);
        cr_assert(strstr(r.out, "{\"len\":2,"), "%s", r.out);
        cr_assert(strstr(r.out, "{\"hello\":1}"), "%s", r.out);
        cr_assert_eq(r.closed, 0);
        free(r.out);
    }
    /* chunked twice, or a last coding that is not chunked: the body's end
     * cannot be found, 400. */
    const char *bad[] = {POST_TE("chunked, chunked"), POST_TE("gzip")};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct result r = run(bad[i]);
        cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
        cr_assert_eq(count(r.out, "HTTP/1.1 "), 1, "%s", r.out);
        cr_assert_eq(r.closed, 1);
        free(r.out);
    }
}

Test(http, http_version_not_supported)
{
    /* Any major version but 1: 505, then close. */
    const char *other[] = {
        "GET /hello HTTP/2.0\r\nHost: x\r\n\r\n",
        "GET /hello HTTP/3.0\r\nHost: x\r\n\r\n",
        "GET /hello HTTP/9.9\r\nHost: x\r\n\r\n",
        "GET /hello HTTP/0.9\r\nHost: x\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/2.0\r\nHost: x\r\n\r\n"
        "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        struct result r = run(other[i]);
        cr_assert(strstr(r.out, "HTTP/1.1 505 HTTP Version Not Supported\r\n"), "%s", r.out);
        cr_assert(strstr(r.out, "\"code\":\"http_version_not_supported\""), "%s", r.out);
        cr_assert(strstr(r.out, "\"status\":505"), "%s", r.out);
        cr_assert(strstr(r.out, "Connection: close\r\n"), "%s", r.out);
        cr_assert_eq(count(r.out, "HTTP/1.1 5"), 1, "%s", r.out);
        cr_assert_eq(count(r.out, "HTTP/1.1 200 "), i == 5, "%s", r.out);
        cr_assert_eq(r.closed, 1);
        free(r.out);
    }
    /* What is no HTTP version at all stays a bad request. */
    struct result r = run("GET /hello HTTP/12.0\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
    r = run("GET /hello HTTP/x.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(r.out, "HTTP/1.1 400 "), "%s", r.out);
    free(r.out);
}

Test(query, get_and_decode)
{
    char out[16];
    size_t n = 0;
    cr_assert_eq(query_get("a=1&b=x%20y+z&c", "b", out, sizeof(out), &n), 1);
    cr_assert_str_eq(out, "x y z");
    cr_assert_eq(n, 5);
    cr_assert_eq(query_get("a=1&b=2", "c", out, sizeof(out), &n), 0);
    cr_assert_eq(query_get("", "a", out, sizeof(out), &n), 0);
    cr_assert_eq(query_get("a=1&c", "c", out, sizeof(out), &n), 1);
    cr_assert_str_eq(out, "");
    cr_assert_eq(query_get("ab=1&a=2", "a", out, sizeof(out), &n), 1);
    cr_assert_str_eq(out, "2");
    cr_assert_eq(query_get("a=%4", "a", out, sizeof(out), &n), KVIDX_EINVAL);
    cr_assert_eq(query_get("a=%g0", "a", out, sizeof(out), &n), KVIDX_EINVAL);
    cr_assert_eq(query_get("a=0123456789abcdef", "a", out, sizeof(out), &n), KVIDX_EINVAL);
    cr_assert_eq(query_get("a=0123456789abcde", "a", out, sizeof(out), &n), 1);
    cr_assert_eq(query_get("a=", "a", out, sizeof(out), &n), 1);
    cr_assert_eq(n, 0);
}

Test(query, pct_decode_edges)
{
    char out[8];
    size_t n = 0;
    cr_assert_eq(pct_decode("a+b%2F", 6, out, sizeof(out), &n, 0), 0);
    cr_assert_str_eq(out, "a+b/");
    cr_assert_eq(pct_decode("%", 1, out, sizeof(out), &n, 0), KVIDX_EINVAL);
    cr_assert_eq(pct_decode("%2", 2, out, sizeof(out), &n, 0), KVIDX_EINVAL);
    cr_assert_eq(pct_decode("%2f%2F", 6, out, sizeof(out), &n, 0), 0);
    cr_assert_str_eq(out, "//");
    cr_assert_eq(pct_decode("%00", 3, out, sizeof(out), &n, 0), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(pct_decode("1234567", 7, out, sizeof(out), &n, 0), 0);
    cr_assert_eq(pct_decode("12345678", 8, out, sizeof(out), &n, 0), KVIDX_EINVAL);
    cr_assert_eq(pct_decode("", 0, out, sizeof(out), &n, 0), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(pct_decode("x", 1, out, 0, &n, 0), KVIDX_EINVAL);
}
