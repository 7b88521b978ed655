/*
 * Large answer bodies through the test transport: a body of 16 KiB or more
 * leaves the connection in its own buffer, behind the headers of its
 * answer. Pipelined sequences mixing small and large answers (on both sides
 * of that size, more large ones than the connection keeps apart at once, a
 * deferred large answer, HEAD, Connection: close) must give exactly the
 * bytes that the same requests give one at a time, fed whole or byte by
 * byte. With deterministic writes (conn_test_set_writes) the output goes
 * through the socket's write path: cut k bytes at a time, behind a write
 * held in flight, freed while segments are held, with more large answers
 * than the connection keeps apart; and a taken body holds little more
 * memory than its bytes.
 */
#include "util/config.h"
#include "util/context.h"
#include "net/conn.h"
#include "net/http.h"
#include "net/router.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVIDX_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVIDX_LSAN 1
#endif
#endif
#ifdef KVIDX_LSAN
#include <sanitizer/lsan_interface.h>
#endif

static struct app app;

/* In the ASan build: 1 when memory no longer reachable was found (the
 * report goes to stderr). The check at exit comes after the test has
 * passed, too late to fail it, so tests about freeing ask here. Without
 * ASan: 0. */
static int leaked(void)
{
#ifdef KVIDX_LSAN
    return __lsan_do_recoverable_leak_check();
#else
    return 0;
#endif
}

/* {"n":N,"fill":"..."}: a body of about n bytes that differs per n. */
static void big_body(struct buf *b, size_t n)
{
    buf_printf(b, "{\"n\":%zu,\"fill\":\"", n);
    for (size_t i = b->len; i + 2 < n; i++)
        buf_putc(b, (char)('a' + (i * 7 + n) % 26));
    buf_puts(b, "\"}");
}

static int h_big(const struct request *req, struct response *res)
{
    char v[32];
    size_t vn;
    size_t n = 100;
    if (query_get(req->query, "n", v, sizeof(v), &vn) == 1)
        n = (size_t)strtoull(v, NULL, 10);
    big_body(&res->body, n);
    res_json(res, 200);
    return 0;
}

/* The same body in a buffer reserved for far more (a worst-case bound). */
static int h_reserved(const struct request *req, struct response *res)
{
    cr_assert_eq(buf_reserve(&res->body, 4u << 20), 0);
    return h_big(req, res);
}

static int h_small(const struct request *req, struct response *res)
{
    (void)req;
    buf_puts(&res->body, "{\"small\":1}");
    res_json(res, 200);
    return 0;
}

/* A large answer completed later by the test. */
static struct response *deferred;

static void cancel_waiter(void *w)
{
    (void)w;
    deferred = NULL;
}

static int h_later(const struct request *req, struct response *res)
{
    (void)req;
    res_defer(res, NULL, cancel_waiter);
    deferred = res;
    return HANDLER_ASYNC;
}

static const struct route routes[] = {
    {M_GET, "/big", h_big, "big", ROUTE_READ},
    {M_GET, "/small", h_small, "small", ROUTE_READ},
    {M_GET, "/reserved", h_reserved, "reserved", ROUTE_READ},
    {M_GET, "/later", h_later, "later", ROUTE_READ},
    {0, NULL, NULL, NULL, 0},
};
static const struct route *const tables[] = {routes, NULL};

static void setup(void)
{
    memset(&app, 0, sizeof(app));
    config_defaults(&app.cfg);
    router_use_tables(tables);
    deferred = NULL;
}

static void teardown(void)
{
    router_use_tables(NULL);
}

TestSuite(bigbody, .init = setup, .fini = teardown);

static char *req(const char *method, const char *target, const char *extra)
{
    char *s = NULL;
    cr_assert(asprintf(&s, "%s %s HTTP/1.1\r\nHost: x\r\n%s\r\n", method, target, extra) > 0);
    return s;
}

/* The output of feeding in (whole, or one byte at a time) to a fresh
 * connection; *closed says whether it closed. */
static struct buf output(const char *in, int bytewise, int *closed)
{
    struct conn *c = conn_new_test(&app);
    cr_assert_not_null(c);
    size_t n = strlen(in);
    if (bytewise) {
        for (size_t i = 0; i < n; i++)
            conn_feed(c, in + i, 1);
    } else {
        conn_feed(c, in, n);
    }
    struct buf out;
    buf_init(&out);
    struct buf *o = conn_test_output(c);
    buf_append(&out, o->data, o->len);
    cr_assert(!out.failed);
    if (closed)
        *closed = conn_test_closed(c);
    conn_free_test(c);
    return out;
}

/* Feeds the requests pipelined and checks the output against the answers
 * given one at a time on a connection of their own. */
static void check_sequence(char **reqs, size_t n)
{
    struct buf all, want;
    buf_init(&all);
    buf_init(&want);
    for (size_t i = 0; i < n; i++) {
        buf_puts(&all, reqs[i]);
        struct buf one = output(reqs[i], 0, NULL);
        buf_append(&want, one.data, one.len);
        buf_free(&one);
    }
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct buf got = output(all.data, bytewise, NULL);
        cr_assert_eq(got.len, want.len, "bytewise %d: %zu bytes, want %zu", bytewise, got.len,
                     want.len);
        cr_assert(memcmp(got.data, want.data, want.len) == 0, "bytewise %d: bytes differ",
                  bytewise);
        buf_free(&got);
    }
    buf_free(&all);
    buf_free(&want);
    for (size_t i = 0; i < n; i++)
        free(reqs[i]);
}

static size_t content_length(const char *out)
{
    const char *p = strstr(out, "Content-Length: ");
    cr_assert_not_null(p);
    return (size_t)strtoull(p + 16, NULL, 10);
}

Test(bigbody, sizes_around_the_threshold_are_exact)
{
    size_t sizes[] = {16383, 16384, 16385, 1 << 20, (1 << 20) + 1, 3 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char target[64];
        snprintf(target, sizeof(target), "/big?n=%zu", sizes[i]);
        char *r = req("GET", target, "");
        struct buf out = output(r, 0, NULL);
        struct buf body;
        buf_init(&body);
        big_body(&body, sizes[i]);
        const char *end = strstr(out.data, "\r\n\r\n");
        cr_assert_not_null(end);
        size_t hl = (size_t)(end + 4 - out.data);
        cr_assert_eq(content_length(out.data), body.len);
        cr_assert_eq(out.len, hl + body.len);
        cr_assert(memcmp(out.data + hl, body.data, body.len) == 0);
        buf_free(&body);
        buf_free(&out);
        free(r);
    }
}

Test(bigbody, small_big_small_in_order)
{
    char *r[] = {
        req("GET", "/small", ""),
        req("GET", "/big?n=300000", ""),
        req("GET", "/small", ""),
        req("GET", "/big?n=16384", ""),
        req("GET", "/big?n=16383", ""),
        req("GET", "/nope", ""),
        req("GET", "/big?n=20000", ""),
        req("GET", "/big?n=70000", ""),
        req("HEAD", "/big?n=50000", ""),
        req("GET", "/small", ""),
        req("GET", "/reserved?n=40000", ""),
        req("GET", "/reserved?n=100", ""),
        req("GET", "/small", ""),
    };
    check_sequence(r, sizeof(r) / sizeof(r[0]));
}

Test(bigbody, more_big_answers_than_segments)
{
    /* 40 large answers in a row: the connection keeps a few apart and
     * copies the others; the bytes are the same either way. */
    char *r[60];
    size_t n = 0;
    for (int i = 0; i < 40; i++) {
        char target[64];
        snprintf(target, sizeof(target), "/big?n=%d", 17000 + 997 * i);
        r[n++] = req("GET", target, "");
        if (i % 2)
            r[n++] = req("GET", "/small", "");
    }
    check_sequence(r, n);
}

Test(bigbody, head_of_big_answer)
{
    char *get = req("GET", "/big?n=100000", "");
    char *head = req("HEAD", "/big?n=100000", "");
    struct buf g = output(get, 0, NULL), h = output(head, 0, NULL);
    cr_assert(g.len > 100000);
    cr_assert(h.len > 0 && h.len < 300);
    cr_assert(memcmp(g.data, h.data, h.len) == 0, "HEAD gives GET's headers");
    cr_assert_eq(memcmp(h.data + h.len - 4, "\r\n\r\n", 4), 0);
    buf_free(&g);
    buf_free(&h);
    free(get);
    free(head);
    char *r[] = {req("HEAD", "/big?n=100000", ""), req("GET", "/small", ""),
                 req("HEAD", "/big?n=100000", ""), req("GET", "/big?n=100000", ""),
                 req("GET", "/small", "")};
    check_sequence(r, sizeof(r) / sizeof(r[0]));
}

Test(bigbody, big_answer_then_connection_close)
{
    char *in = NULL;
    cr_assert(asprintf(&in, "%s%s%s", "GET /big?n=200000 HTTP/1.1\r\nHost: x\r\n\r\n",
                       "GET /big?n=200000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       "GET /small HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
    char *one = req("GET", "/big?n=200000", "");
    char *last = req("GET", "/big?n=200000", "Connection: close\r\n");
    int closed = 0;
    struct buf a = output(one, 0, NULL), b = output(last, 0, NULL);
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct buf got = output(in, bytewise, &closed);
        cr_assert(closed);
        cr_assert_eq(got.len, a.len + b.len);
        cr_assert(memcmp(got.data, a.data, a.len) == 0);
        cr_assert(memcmp(got.data + a.len, b.data, b.len) == 0);
        buf_free(&got);
    }
    cr_assert_not_null(strstr(b.data, "\r\nConnection: close\r\n"));
    buf_free(&a);
    buf_free(&b);
    free(one);
    free(last);
    free(in);
}

Test(bigbody, deferred_big_answer_holds_back_the_rest)
{
    struct conn *c = conn_new_test(&app);
    const char *in = "GET /big?n=40000 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /big?n=50000 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /small HTTP/1.1\r\nHost: x\r\n\r\n";
    conn_feed(c, in, strlen(in));
    cr_assert_not_null(deferred);
    struct buf first = output("GET /big?n=40000 HTTP/1.1\r\nHost: x\r\n\r\n", 0, NULL);
    struct buf *o = conn_test_output(c);
    cr_assert_eq(o->len, first.len, "only the answer before the deferred one");
    cr_assert(memcmp(o->data, first.data, first.len) == 0);
    big_body(&deferred->body, 60000);
    res_json(deferred, 200);
    res_complete(deferred);
    struct buf x = output("GET /big?n=50000 HTTP/1.1\r\nHost: x\r\n\r\n", 0, NULL);
    struct buf y = output("GET /small HTTP/1.1\r\nHost: x\r\n\r\n", 0, NULL);
    o = conn_test_output(c);
    const char *second = o->data + first.len;
    cr_assert_eq(strncmp(second, "HTTP/1.1 200 OK\r\n", 17), 0);
    struct buf body;
    buf_init(&body);
    big_body(&body, 60000);
    size_t l2 = content_length(second);
    cr_assert_eq(l2, body.len);
    const char *b2 = strstr(second, "\r\n\r\n") + 4;
    cr_assert(memcmp(b2, body.data, body.len) == 0);
    const char *after = b2 + l2;
    size_t tail = (size_t)(o->data + o->len - after);
    cr_assert_eq(tail, x.len + y.len);
    cr_assert(memcmp(after, x.data, x.len) == 0);
    cr_assert(memcmp(after + x.len, y.data, y.len) == 0);
    buf_free(&first);
    buf_free(&body);
    buf_free(&x);
    buf_free(&y);
    conn_free_test(c);
}

Test(bigbody, cancelled_with_big_answers_queued)
{
    /* Freed with a large answer serialized and one behind a deferred
     * answer: nothing leaks (the ASan build checks). */
    struct conn *c = conn_new_test(&app);
    const char *in = "GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /big?n=90000 HTTP/1.1\r\nHost: x\r\n\r\n";
    conn_feed(c, in, strlen(in));
    cr_assert_not_null(deferred);
    cr_assert_eq(conn_test_queued(c), 2);
    conn_free_test(c);
    cr_assert_null(deferred, "the waiter was cancelled");
    cr_assert(!leaked());
}

/* ---------------------------------------------------------------------- */
/* Deterministic writes                                                    */

static void check_state(struct conn *c)
{
    struct conn_test_out st;
    conn_test_out_state(c, &st);
    cr_assert_leq(st.segs, st.segs_max);
    cr_assert_leq(st.writing, st.segs);
}

/* Writes until nothing is left; returns the number of write steps. */
static size_t drain(struct conn *c)
{
    size_t steps = 0;
    for (;;) {
        struct conn_test_out st;
        conn_test_out_state(c, &st);
        if (st.unsent == 0 || conn_test_closed(c))
            break;
        cr_assert_lt(steps, (size_t)50 << 20, "no progress");
        conn_test_write(c);
        check_state(c);
        steps++;
    }
    return steps;
}

static void want_output(char **reqs, size_t n, struct buf *want)
{
    buf_init(want);
    for (size_t i = 0; i < n; i++) {
        struct buf one = output(reqs[i], 0, NULL);
        buf_append(want, one.data, one.len);
        buf_free(&one);
    }
}

static void cmp_output(struct conn *c, const struct buf *want, const char *what, size_t k, int hold)
{
    struct buf *got = conn_test_output(c);
    cr_assert(!got->failed);
    size_t i = 0;
    while (i < got->len && i < want->len && got->data[i] == want->data[i])
        i++;
    cr_assert(i == want->len && got->len == want->len,
              "%s, k %zu, hold %d: %zu bytes, want %zu; first difference at %zu", what, k, hold,
              got->len, want->len, i);
}

Test(bigbody, written_k_bytes_at_a_time_gives_the_same_bytes)
{
    char *r[] = {
        req("GET", "/small", ""),        req("GET", "/big?n=16384", ""),
        req("GET", "/small", ""),        req("GET", "/big?n=40000", ""),
        req("GET", "/big?n=16383", ""),  req("GET", "/big?n=16385", ""),
        req("GET", "/small", ""),        req("GET", "/reserved?n=30000", ""),
        req("HEAD", "/big?n=50000", ""), req("GET", "/big?n=20000", ""),
        req("GET", "/small", ""),
    };
    size_t n = sizeof(r) / sizeof(r[0]);
    struct buf want;
    want_output(r, n, &want);
    size_t ks[] = {1, 7, 4096, 16383, 16384, 16385};
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        for (int hold = 0; hold < 2; hold++) {
            /* Pipelined, one request at a time with a write step after
             * every other one: answers are serialized behind segments
             * cut mid-buffer and behind a write in flight. */
            struct conn *c = conn_new_test(&app);
            cr_assert_not_null(c);
            conn_test_set_writes(c, ks[ki], hold);
            for (size_t i = 0; i < n; i++) {
                conn_feed(c, r[i], strlen(r[i]));
                check_state(c);
                if (i % 2)
                    conn_test_write(c);
            }
            drain(c);
            cmp_output(c, &want, "one at a time", ks[ki], hold);
            conn_free_test(c);
            /* All at once. */
            struct buf all;
            buf_init(&all);
            for (size_t i = 0; i < n; i++)
                buf_puts(&all, r[i]);
            c = conn_new_test(&app);
            conn_test_set_writes(c, ks[ki], hold);
            conn_feed(c, all.data, all.len);
            size_t steps = drain(c);
            if (ks[ki] < want.len)
                cr_assert_gt(steps, 0, "k %zu: the output was cut", ks[ki]);
            cmp_output(c, &want, "all at once", ks[ki], hold);
            conn_free_test(c);
            buf_free(&all);
        }
    }
    buf_free(&want);
    for (size_t i = 0; i < n; i++)
        free(r[i]);
}

Test(bigbody, freed_with_segments_held_and_mid_write)
{
    /* Nothing leaks and nothing is freed twice (the ASan build checks):
     * after 0, 1 or 2 write steps, cut inside a buffer, with or without a
     * write in flight. */
    const char *in = "GET /big?n=30000 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /big?n=70000 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /big?n=20000 HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t ks[] = {7, 20000};
    for (size_t ki = 0; ki < 2; ki++) {
        for (int hold = 0; hold < 2; hold++) {
            for (int steps = 0; steps < 3; steps++) {
                struct conn *c = conn_new_test(&app);
                conn_test_set_writes(c, ks[ki], hold);
                conn_feed(c, in, strlen(in));
                for (int i = 0; i < steps; i++)
                    conn_test_write(c);
                /* A write in flight with more behind it. */
                const char *more = "GET /big?n=50000 HTTP/1.1\r\nHost: x\r\n\r\n";
                conn_feed(c, more, strlen(more));
                struct conn_test_out st;
                conn_test_out_state(c, &st);
                cr_assert_geq(st.segs, 1, "k %zu hold %d steps %d", ks[ki], hold, steps);
                cr_assert_gt(st.unsent, 0);
                cr_assert_eq(st.writing > 0, hold);
                conn_free_test(c);
                cr_assert(!leaked(), "k %zu hold %d steps %d", ks[ki], hold, steps);
            }
        }
    }
}

Test(bigbody, ring_full_behind_a_held_write)
{
    /* A write held in flight while 30 large answers are serialized behind
     * it: the connection keeps as many bodies apart as its ring allows
     * (leaving one segment free), copies the others, and the bytes leave
     * in order. */
    char *r[50];
    size_t n = 0;
    size_t copied_min = 0;
    r[n++] = req("GET", "/big?n=20000", "");
    for (int i = 0; i < 30; i++) {
        char target[64];
        snprintf(target, sizeof(target), "/big?n=%d", 17000 + 997 * i);
        r[n++] = req("GET", target, "");
        if (i % 3 == 0)
            r[n++] = req("GET", "/small", "");
        if (i >= 6)
            copied_min += 17000 + 997 * (size_t)i;
    }
    struct buf want;
    want_output(r, n, &want);
    struct conn *c = conn_new_test(&app);
    conn_test_set_writes(c, 0, 1);
    conn_feed(c, r[0], strlen(r[0]));
    struct conn_test_out st;
    conn_test_out_state(c, &st);
    cr_assert_eq(st.segs, 2, "headers and body");
    cr_assert_eq(st.writing, 2, "in flight");
    cr_assert_eq(conn_test_output(c)->len, 0);
    struct buf rest;
    buf_init(&rest);
    for (size_t i = 1; i < n; i++)
        buf_puts(&rest, r[i]);
    conn_feed(c, rest.data, rest.len);
    conn_test_out_state(c, &st);
    cr_assert_eq(st.writing, 2, "the write in flight is left alone");
    cr_assert_lt(st.segs, st.segs_max, "a segment stays free");
    cr_assert_gt(st.segs + 3, st.segs_max, "the ring took bodies until it had no room");
    cr_assert_geq(st.out_len, copied_min, "the bodies past the ring are copied: %zu < %zu",
                  st.out_len, copied_min);
    cr_assert_eq(conn_test_queued(c), 0, "every answer is serialized");
    /* The first write completes; the next carries everything else. */
    conn_test_write(c);
    conn_test_out_state(c, &st);
    cr_assert_eq(st.out_len, 0);
    cr_assert_eq(st.writing, st.segs);
    cr_assert_leq(st.segs, st.segs_max);
    drain(c);
    cmp_output(c, &want, "ring", 0, 1);
    conn_free_test(c);
    buf_free(&rest);
    buf_free(&want);
    for (size_t i = 0; i < n; i++)
        free(r[i]);
}

Test(bigbody, taken_body_reserved_for_far_more_is_shrunk)
{
    /* A body in a 4 MiB reservation, held in flight: the output holds
     * about its bytes, not the reservation. */
    struct conn *c = conn_new_test(&app);
    conn_test_set_writes(c, 0, 1);
    const char *in = "GET /reserved?n=40000 HTTP/1.1\r\nHost: x\r\n\r\n";
    conn_feed(c, in, strlen(in));
    struct conn_test_out st;
    conn_test_out_state(c, &st);
    cr_assert_eq(st.segs, 2, "the body was taken");
    cr_assert_eq(st.writing, 2);
    cr_assert_geq(st.mem, 40000);
    cr_assert_lt(st.mem, 2 * 40000 + 4096, "output holds %zu bytes of memory", st.mem);
    drain(c);
    struct buf want = output(in, 0, NULL);
    cmp_output(c, &want, "reserved", 0, 1);
    buf_free(&want);
    conn_free_test(c);
}
