/*
 * One HTTP/1.1 connection (see conn.h): the answer queue, serialization,
 * writes, timeouts and the close sequence. Parsing is in conn_parse.c, the
 * test transport in conn_test.c; the state they share is in conn_int.h.
 *
 * Flow: bytes -> conn_parse() -> per-request `struct pending` that owns
 * every string the handler sees -> router_dispatch() -> the answer waits in
 * the connection's FIFO until it and all earlier answers are done ->
 * serialized into `out` -> a uv_try_write, then one uv_write for what it
 * left, carries everything serialized before it started; answers
 * serialized while a uv_write is in flight wait for the next one.
 *
 * Output is a short list of buffers in write order: the segments (a ring
 * of at most OUT_SEGS), then `out`, which answers are appended to. A body
 * of OWN_BODY_MIN bytes or more is not copied: `out`, ending with its
 * headers, becomes a segment, the body's buffer becomes the next one, and
 * `out` goes on in a fresh (or the spare) buffer. A write seals `out` as a
 * segment too and hands every segment to one uv_try_write / uv_write as
 * iovecs; a partial write advances the first segments' offsets. So the
 * listing page, about 209 KB for 1000 entries, reaches the kernel from the
 * buffer its handler wrote it in.
 *
 * The test transport (conn_test.c) either takes every answer whole as it is
 * serialized, or, after conn_test_set_writes(), stands in for the
 * socket's two writes (out_try_write, out_write; there is no reading or
 * half-close to do), so that tests drive this same write path with short
 * writes and writes held in flight.
 *
 * Invariants:
 *   - answers leave in request order; a deferred answer holds back the
 *     ones behind it;
 *   - at most one uv_write is in flight (its bytes live in the first
 *     seg_writing segments, which nothing changes or frees before the
 *     write callback);
 *   - memory per connection is bounded: the request limits (conn_parse.c),
 *     <= MAX_PIPELINE queued answers, and parsing (and reading) pauses
 *     while unsent output (`out` and every segment, taken bodies included)
 *     exceeds max_conn_output_bytes; input read while paused (<= one read)
 *     is kept in `in`;
 *   - a body is taken only when two segments are free and one more stays
 *     free, so a write can always seal `out`; past that, bodies are copied;
 *     a taken body's buffer is at most about twice its length (the rest is
 *     given back first), as `out` grown by doubling is;
 *   - a written buffer above BIG_BUF is freed; one smaller is kept as the
 *     spare for the next `out`;
 *   - after a limit or parse error the error answer is the last one;
 *   - nothing is closed inside an llhttp callback;
 *   - the pump (serialize -> resume parsing -> write -> timer) is never
 *     re-entered: res_complete() from inside a handler only marks the
 *     answer done;
 *   - every uv_*_init is paired with a uv_close, and the connection is
 *     freed in the last close callback.
 */
#include "net/conn.h"
#include "net/conn_int.h"

#include "kvidx/err.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_res_complete(struct response *res);

/* ---------------------------------------------------------------------- */
/* Pending requests                                                        */

struct pending *conn_pending_new(struct conn *c)
{
    struct pending *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->conn = c;
    buf_init(&p->url);
    buf_init(&p->ct);
    buf_init(&p->auth);
    buf_init(&p->body);
    buf_init(&p->res.body);
    p->res.owner = p;
    p->res.on_complete = on_res_complete;
    p->req.app = c->app;
    p->req.peer_family = c->peer_family;
    memcpy(p->req.peer_addr, c->peer_addr, sizeof(p->req.peer_addr));
    p->req.method = M_OTHER;
    p->req.method_name = "-";
    p->req.path = "";
    p->req.query = "";
    p->req.body = "";
    p->keep_alive = 1;
    p->route_name = "unknown";
    return p;
}

void conn_pending_drop_body(struct pending *p)
{
    p->conn->budget->body_bytes -= p->body_charged;
    p->body_charged = 0;
    buf_free(&p->body);
    p->req.body = "";
    p->req.body_len = 0;
}

void conn_pending_free(struct pending *p)
{
    conn_pending_drop_body(p);
    buf_free(&p->url);
    buf_free(&p->ct);
    buf_free(&p->auth);
    buf_free(&p->res.body);
    free(p);
}

/* Cancels a deferred answer (the handler's waiter goes away) and frees. */
static void pending_discard(struct pending *p)
{
    if (p->res.deferred && !p->res.done && p->res.cancel)
        p->res.cancel(p->res.waiter);
    conn_pending_free(p);
}

void conn_enqueue(struct conn *c, struct pending *p)
{
    p->next = NULL;
    if (c->qtail)
        c->qtail->next = p;
    else
        c->qhead = p;
    c->qtail = p;
    c->qlen++;
}

static void discard_all(struct conn *c)
{
    while (c->qhead) {
        struct pending *p = c->qhead;
        c->qhead = p->next;
        pending_discard(p);
    }
    c->qtail = NULL;
    c->qlen = 0;
    if (c->cur) {
        conn_pending_free(c->cur);
        c->cur = NULL;
    }
}

/* Parses nothing more and drops the message being received, if any; the
 * requests received whole are still answered. */
void conn_stop_receiving(struct conn *c)
{
    c->stop_parsing = 1;
    if (c->cur) {
        conn_pending_free(c->cur);
        c->cur = NULL;
        c->in_message = 0;
    }
}

size_t conn_unsent(const struct conn *c)
{
    return c->out.len + c->seg_bytes;
}

/* ---------------------------------------------------------------------- */
/* Output segments                                                         */

static struct out_seg *seg_at(struct conn *c, unsigned i)
{
    return &c->seg[(c->seg_first + i) % OUT_SEGS];
}

/* Appends b's bytes as the last segment, taking its memory (b is left
 * empty). The caller checked that a segment is free. */
static void seg_push(struct conn *c, struct buf *b)
{
    struct out_seg *s = seg_at(c, c->seg_count++);
    s->b = *b;
    s->off = 0;
    c->seg_bytes += b->len;
    buf_init(b);
}

/* `out` becomes a segment and goes on in the spare buffer (or none yet). */
static void seal_out(struct conn *c)
{
    seg_push(c, &c->out);
    c->out = c->spare;
    buf_init(&c->spare);
}

/* Drops the first segment, written or not: its memory becomes the spare
 * when there is none and it is not big, else it is freed. */
static void seg_release_first(struct conn *c)
{
    struct out_seg *s = seg_at(c, 0);
    c->seg_bytes -= s->b.len - s->off;
    if (!c->spare.data && s->b.data && s->b.cap <= BIG_BUF) {
        buf_reset(&s->b);
        c->spare = s->b;
    } else {
        buf_free(&s->b);
    }
    buf_init(&s->b);
    s->off = 0;
    c->seg_first = (c->seg_first + 1) % OUT_SEGS;
    c->seg_count--;
}

/* n bytes from the front of the segments reached the kernel. */
static void seg_consume(struct conn *c, size_t n)
{
    while (n > 0 && c->seg_count > 0) {
        struct out_seg *s = seg_at(c, 0);
        size_t left = s->b.len - s->off;
        if (n < left) {
            s->off += n;
            c->seg_bytes -= n;
            return;
        }
        n -= left;
        seg_release_first(c);
    }
}

/* The unwritten bytes of every segment, as iovecs; returns their number. */
static unsigned seg_bufs(struct conn *c, uv_buf_t *b)
{
    for (unsigned i = 0; i < c->seg_count; i++) {
        struct out_seg *s = seg_at(c, i);
        b[i] = uv_buf_init(s->b.data + s->off, (unsigned)(s->b.len - s->off));
    }
    return c->seg_count;
}

void conn_free_output(struct conn *c)
{
    while (c->seg_count > 0)
        seg_release_first(c);
    c->seg_writing = 0;
    buf_free(&c->out);
    buf_free(&c->spare);
}

uint64_t conn_now_ms(const struct conn *c)
{
    return c->test ? 0 : app_now_ms(c->app);
}

void conn_queue_error(struct conn *c, int err, const char *detail)
{
    struct pending *p = c->cur;
    c->cur = NULL;
    c->stop_parsing = 1;
    c->in_message = 0;
    if (!p)
        p = conn_pending_new(c);
    if (!p) {
        /* No memory even for the error: drop the connection after what is
         * already queued. */
        c->close_after = 1;
        return;
    }
    res_problem(&p->res, err, detail, NULL, 0);
    /* A 405 names the methods the target allows; the only 405 decided
     * here is for CONNECT, whose target is no resource: none. */
    if (err == KVIDX_EMETHOD)
        res_header(&p->res, "Allow", "");
    /* Refusals for load (too many connections, too many bodies held) pass
     * soon: say when to try again. */
    if (err == KVIDX_ECONNLIMIT)
        res_header(&p->res, "Retry-After", "1");
    p->res.close = 1;
    p->res.done = 1;
    conn_enqueue(c, p);
}

/* ---------------------------------------------------------------------- */
/* Serializing answers                                                     */

static const char *reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    case 507:
        return "Insufficient Storage";
    default:
        return "Status";
    }
}

/* The answer when not even the out-of-memory problem fits in the body: a
 * constant, so the client still gets a complete problem+json 503 (the same
 * document res_problem writes for KVIDX_ENOMEM). */
static const char NOMEM_PROBLEM[] =
    "{\"type\":\"https://kvidx.dev/problems/internal\",\"title\":\"Out of memory\","
    "\"status\":503,\"detail\":\"Out of memory while building the answer.\","
    "\"code\":\"internal\"}";

static void serialize(struct conn *c, struct pending *p, int close)
{
    struct response *res = &p->res;
    struct buf *o = &c->out;
    if (res->body.failed)
        res_problem(res, KVIDX_ENOMEM, "Out of memory while building the answer.", NULL, 0);
    const char *body = res->body.data;
    size_t body_len = res->body.len;
    if (res->body.failed) {
        body = NOMEM_PROBLEM;
        body_len = sizeof(NOMEM_PROBLEM) - 1;
    }
    size_t logged_len = res->body.len;
    int no_body = res->status == 204 || res->status == 304 || res->status < 200;
    buf_printf(o, "HTTP/1.1 %d %s\r\n", res->status, reason(res->status));
    if (!no_body) {
        buf_puts(o, "Content-Type: ");
        buf_puts(o, res->content_type ? res->content_type : "application/json");
        buf_puts(o, "\r\nContent-Length: ");
        buf_put_u64(o, body_len);
        buf_puts(o, "\r\n");
    }
    buf_append(o, res->extra_headers, res->extra_len);
    if (close)
        buf_puts(o, "Connection: close\r\n");
    else if (p->http10)
        buf_puts(o, "Connection: keep-alive\r\n");
    buf_puts(o, "\r\n");
    if (no_body || p->head_only) {
        /* headers only */
    } else if (body_len >= OWN_BODY_MIN && body == res->body.data && !o->failed &&
               c->seg_count + 3 <= OUT_SEGS) {
        /* Large: the headers end `out`, the body's buffer follows it. A
         * body reserved for far more than it holds (a handler's worst-case
         * bound) first gives the rest back: a taken body holds at most
         * about twice the bytes it counts, as a buffer grown by doubling
         * does. */
        buf_shrink(&res->body, res->body.len + 1);
        seal_out(c);
        seg_push(c, &res->body);
    } else {
        buf_append(o, body, body_len);
    }

    double secs = p->req.start_ns ? (double)(uv_hrtime() - p->req.start_ns) / 1e9 : 0.0;
    if (c->app->metrics)
        metrics_observe_request(c->app->metrics, p->route_name, res->status, secs);
    log_debug("%s %.*s %d %zu %.3fms", p->req.method_name,
              (int)(p->req.path_len > 200 ? 200 : p->req.path_len), p->req.path, res->status,
              logged_len, secs * 1e3);
}

/* 1 when a request that may have changed state succeeded but its answer
 * could not be built (or its handler said so: res->lost, e.g. no memory
 * to wait for the fsync). A 503 would tell the client that nothing happened,
 * so the connection is closed after the earlier answers instead: the
 * client learns that the outcome is unknown, which is the truth. A GET or
 * HEAD changes nothing and answers 503. */
static int answer_lost(const struct pending *p)
{
    const struct response *res = &p->res;
    return res->lost || (res->body.failed && res->status >= 200 && res->status < 300 &&
                         p->req.method != M_GET && p->req.method != M_HEAD);
}

/* Moves every finished answer at the head of the queue into `out`. */
static void serialize_ready(struct conn *c)
{
    while (c->qhead && c->qhead->res.done && !c->close_after) {
        struct pending *p = c->qhead;
        c->qhead = p->next;
        if (!c->qhead)
            c->qtail = NULL;
        c->qlen--;
        if (answer_lost(p)) {
            conn_pending_free(p);
            c->stop_parsing = 1;
            c->close_after = 1;
            discard_all(c);
            break;
        }
        int close = p->res.close || !p->keep_alive || (c->stop_parsing && !c->qhead);
        serialize(c, p, close);
        conn_pending_free(p);
        if (close) {
            c->stop_parsing = 1;
            c->close_after = 1;
            discard_all(c);
        }
        if (!c->qhead)
            c->anchor_ms = conn_now_ms(c);
    }
    if (c->out.failed) {
        /* The answer cannot be built: drop the connection. */
        buf_free(&c->out);
        c->close_after = 1;
        c->stop_parsing = 1;
        discard_all(c);
    }
    if (c->stop_parsing && !c->qhead)
        c->close_after = 1;
}

/* ---------------------------------------------------------------------- */
/* Socket side                                                             */

static void on_close(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->handles_open > 0)
        return;
    conn_free_output(c);
    buf_free(&c->in);
    free(c);
}

void conn_close(struct conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    discard_all(c);
    if (c->test)
        return;
    if (c->host.gone)
        c->host.gone(c->host.ctx, &c->node);
    c->handles_open = 2;
    uv_close((uv_handle_t *)&c->timer, on_close);
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    struct conn *c = h->data;
    (void)suggested;
    b->base = c->host.read_buf;
    b->len = c->host.read_cap;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    struct conn *c = s->data;
    if (c->closing)
        return;
    if (nread > 0) {
        c->last_progress_ms = conn_now_ms(c);
        if (c->lingering)
            return;
        conn_parse(c, b->base, (size_t)nread);
        conn_pump(c);
        return;
    }
    if (nread == 0)
        return;
    if (nread != UV_EOF || c->lingering) {
        conn_close(c);
        return;
    }
    /* EOF: answer what was received completely, then close. */
    c->peer_eof = 1;
    conn_stop_receiving(c);
    conn_pump(c);
}

static void on_shutdown(uv_shutdown_t *r, int status)
{
    struct conn *c = r->data;
    if (status < 0 && !c->closing)
        conn_close(c);
}

static void on_timer(uv_timer_t *t);

static void arm(struct conn *c, uint64_t deadline, enum timer_action a)
{
    uint64_t now = conn_now_ms(c);
    c->timer_action = a;
    c->deadline = deadline;
    uv_timer_start(&c->timer, on_timer, deadline > now ? deadline - now : 0, 0);
}

/* Picks the one deadline that matters in the connection's current state. */
static void arm_timer(struct conn *c)
{
    const struct config *cfg = &c->app->cfg;
    if (c->test || c->closing || c->lingering)
        return;
    if (conn_unsent(c) > 0)
        arm(c, c->last_progress_ms + cfg->idle_timeout_ms, T_CLOSE);
    else if (c->qhead) {
        uv_timer_stop(&c->timer); /* a handler is working (long poll) */
        c->timer_action = T_NONE;
    } else if (c->in_message && !c->headers_done)
        arm(c, c->header_deadline, T_408);
    else if (c->in_message)
        arm(c, c->last_progress_ms + cfg->idle_timeout_ms, T_408);
    else if (c->nreq == 0)
        arm(c, c->anchor_ms + cfg->header_timeout_ms, T_408);
    else
        arm(c, c->anchor_ms + cfg->idle_timeout_ms, T_CLOSE);
}

void conn_fire(struct conn *c, enum timer_action a)
{
    if (a == T_408) {
        conn_queue_error(c, KVIDX_ETIMEDOUT, "The request was not received in time.");
        conn_pump(c);
    } else if (a == T_CLOSE) {
        conn_close(c);
    }
}

static void on_timer(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->closing)
        return;
    if (c->lingering) {
        conn_close(c);
        return;
    }
    arm_timer(c); /* recompute: progress may have moved the deadline */
    if (c->timer_action != T_NONE && conn_now_ms(c) >= c->deadline) {
        uv_timer_stop(&c->timer);
        conn_fire(c, c->timer_action);
    }
}

void conn_on_write(uv_write_t *r, int status)
{
    struct conn *c = r->data;
    c->writing = 0;
    /* Written in full, or failed: either way these bytes are done with. */
    for (; c->seg_writing > 0; c->seg_writing--)
        seg_release_first(c);
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    c->last_progress_ms = conn_now_ms(c);
    conn_pump(c);
}

/* The socket's uv_try_write. The test transport takes at most
 * test_budget bytes of the iovecs, in order. */
static int out_try_write(struct conn *c, const uv_buf_t *b, unsigned n)
{
    if (!c->test)
        return uv_try_write(conn_stream(c), b, n);
    size_t left = c->test_budget, done = 0;
    for (unsigned i = 0; i < n && left > 0; i++) {
        size_t k = b[i].len < left ? b[i].len : left;
        buf_append(&c->test_out, b[i].base, k);
        done += k;
        left -= k;
    }
    return done > 0 ? (int)done : UV_EAGAIN;
}

/* The socket's uv_write. The test transport keeps the iovecs: the bytes
 * they point to are "written" when conn_test_write() completes the write. */
static int out_write(struct conn *c, const uv_buf_t *b, unsigned n)
{
    if (!c->test)
        return uv_write(&c->wreq, conn_stream(c), b, n, conn_on_write);
    memcpy(c->test_wbuf, b, n * sizeof(*b));
    c->test_wn = n;
    return 0;
}

static void start_write(struct conn *c)
{
    uv_buf_t b[OUT_SEGS];
    if (c->writing)
        return;
    for (;;) {
        /* A segment is free here (see the invariants); if one were not,
         * `out` would simply wait for the segments ahead of it. */
        if (c->out.len > 0 && c->seg_count < OUT_SEGS)
            seal_out(c);
        if (c->seg_count == 0)
            return;
        int n = out_try_write(c, b, seg_bufs(c, b));
        if (n < 0 && n != UV_EAGAIN && n != UV_ENOSYS) {
            conn_close(c);
            return;
        }
        if (n > 0) {
            c->last_progress_ms = conn_now_ms(c);
            seg_consume(c, (size_t)n);
        }
        if (c->seg_count > 0)
            break;
    }
    if (c->test && !c->test_hold)
        return; /* the rest waits for the next conn_test_write() */
    c->seg_writing = seg_bufs(c, b);
    c->wreq.data = c;
    if (out_write(c, b, c->seg_writing) < 0) {
        c->seg_writing = 0;
        conn_close(c);
        return;
    }
    c->writing = 1;
}

static void update_reading(struct conn *c)
{
    if (c->test)
        return;
    int want =
        !c->closing && (c->lingering || (!c->paused && !c->stop_parsing && !c->peer_eof &&
                                         conn_unsent(c) <= c->app->cfg.max_conn_output_bytes));
    if (want && !c->reading) {
        if (uv_read_start(conn_stream(c), on_alloc, on_read) == 0)
            c->reading = 1;
    } else if (!want && c->reading) {
        uv_read_stop(conn_stream(c));
        c->reading = 0;
    }
}

/* All output is out and the connection must end: half-close, then read and
 * discard until EOF (or LINGER_MS) so that a client still sending does not
 * get a reset that destroys the answer it has not read yet. */
static void finish(struct conn *c)
{
    if (c->peer_eof || c->out.failed || c->test) {
        conn_close(c);
        return;
    }
    c->lingering = 1;
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, conn_stream(c), on_shutdown) < 0) {
        conn_close(c);
        return;
    }
    update_reading(c);
    uv_timer_start(&c->timer, on_timer, LINGER_MS, 0);
}

/* The test transport without conn_test_set_writes() "writes" everything
 * instantly, in the same order. */
static void test_write(struct conn *c)
{
    while (c->seg_count > 0) {
        struct out_seg *s = seg_at(c, 0);
        buf_append(&c->test_out, s->b.data + s->off, s->b.len - s->off);
        seg_release_first(c);
    }
    buf_append(&c->test_out, c->out.data, c->out.len);
    buf_reset(&c->out);
}

void conn_pump(struct conn *c)
{
    if (c->closing || c->in_pump || c->lingering)
        return;
    c->in_pump = 1;
    for (;;) {
        serialize_ready(c);
        if (c->closing)
            break;
        if (c->test && !c->test_writes) {
            test_write(c);
        } else if (conn_unsent(c) > c->app->cfg.max_conn_output_bytes) {
            /* Past the limit: try to hand the output to the kernel now; if
             * it takes everything, parsing may go on without waiting for a
             * write callback that would never come. */
            start_write(c);
            if (c->closing)
                break;
        }
        if (!conn_can_resume(c))
            break;
        conn_resume_parse(c);
    }
    c->in_pump = 0;
    if (c->closing)
        return;
    if (c->test && !c->test_writes) {
        if (c->close_after)
            conn_close(c);
        return;
    }
    start_write(c);
    if (c->closing)
        return;
    if (c->close_after && !c->writing && conn_unsent(c) == 0) {
        finish(c);
        return;
    }
    update_reading(c);
    arm_timer(c);
}

/* A deferred answer was completed (res_complete): send what is ready. */
static void on_res_complete(struct response *res)
{
    struct pending *p = res->owner;
    if (p && p->conn && !p->conn->in_parse)
        conn_pump(p->conn);
}

/* ---------------------------------------------------------------------- */
/* Construction                                                            */

struct conn *conn_alloc(struct app *app, struct conn_budget *budget)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->app = app;
    c->budget = budget ? budget : &c->own_budget;
    c->node.conn = c;
    buf_init(&c->out);
    buf_init(&c->spare);
    buf_init(&c->in);
    buf_init(&c->test_out);
    conn_parser_init(c);
    return c;
}

struct conn *conn_new(struct app *app, const struct conn_host *host)
{
    struct conn *c = conn_alloc(app, host->budget);
    if (!c)
        return NULL;
    c->host = *host;
    uv_tcp_init(app->loop, &c->tcp);
    uv_timer_init(app->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->anchor_ms = c->last_progress_ms = conn_now_ms(c);
    return c;
}

uv_stream_t *conn_stream(struct conn *c)
{
    return (uv_stream_t *)&c->tcp;
}

struct conn_node *conn_node(struct conn *c)
{
    return &c->node;
}

/* Remembers the client's address for the requests (ingest_allow_from). */
static void note_peer(struct conn *c)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        c->peer_family = 4;
        memcpy(c->peer_addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        c->peer_family = 6;
        memcpy(c->peer_addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    }
}

void conn_start(struct conn *c)
{
    uv_tcp_nodelay(&c->tcp, 1);
    note_peer(c);
    c->anchor_ms = c->last_progress_ms = conn_now_ms(c);
    conn_pump(c);
}

void conn_reject(struct conn *c, int err)
{
    conn_queue_error(c, err, "The server has too many connections; retry later.");
    conn_pump(c);
}

void conn_drain(struct conn *c)
{
    if (c->closing)
        return;
    c->draining = 1;
    conn_stop_receiving(c);
    if (!c->qhead && conn_unsent(c) == 0) {
        conn_close(c);
        return;
    }
    conn_pump(c);
}
