/*
 * One HTTP/1.1 connection (see conn.h).
 *
 * Flow: bytes → llhttp (conn_parse) → per-request `struct pending` that
 * owns every string the handler sees → router_dispatch() → the answer
 * waits in the connection's FIFO until it and all earlier answers are done
 * → serialized into `out` → one uv_write (after a uv_try_write) carries
 * every answer serialized since the previous write.
 *
 * Invariants:
 *   - answers leave in request order; a deferred answer holds back the
 *     ones behind it;
 *   - at most one uv_write is in flight (its bytes live in `wbuf` until
 *     the write callback);
 *   - memory per connection is bounded: URL ≤ max_uri_bytes, header block
 *     ≤ max_header_bytes (only Content-Type, Authorization and Expect are
 *     kept), body ≤ max_body_bytes, ≤ MAX_PIPELINE queued answers, and
 *     parsing (and reading) pauses while unsent output exceeds
 *     max_conn_output_bytes; input read while paused (≤ one read) is kept
 *     in `in`;
 *   - after a limit or parse error the error answer is the last one: the
 *     parser is never run again on that connection;
 *   - nothing is closed inside an llhttp callback: callbacks only record
 *     state and return an error or HPE_PAUSED;
 *   - the pump (serialize → resume parsing → write → timer) is never
 *     re-entered: res_complete() from inside a handler only marks the
 *     answer done.
 */
#include "net/conn.h"

#include "util/context.h"
#include "net/http.h"
#include "kvidx/err.h"
#include "util/log.h"
#include "util/metrics.h"
#include "net/router.h"

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    MAX_PIPELINE = 64,  /* queued answers before parsing pauses */
    LINGER_MS = 2000,   /* after the last answer: wait this long for EOF */
    BIG_BUF = 1u << 20, /* output buffers above this are freed, not kept */
    HNAME_MAX = 32,     /* longest header name we care about, plus room */
    EXPECT_MAX = 32,
};

enum timer_action { T_NONE = 0, T_408, T_CLOSE };

struct pending {
    struct pending *next;
    struct conn *conn; /* NULL once the connection is gone */
    struct request req;
    struct response res;
    struct buf url, ct, auth, body;
    int has_ct, has_auth;
    int head_only;
    int keep_alive;
    int http10;
    const char *route_name;
};

struct conn {
    struct conn_node node;
    struct app *app;
    struct conn_host host; /* socket mode: read buffer and owner */
    int test;
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    int handles_open;
    llhttp_t parser;

    struct pending *cur; /* the request being parsed */
    struct pending *qhead, *qtail;
    size_t qlen;

    struct buf out;  /* serialized, not yet written */
    struct buf wbuf; /* being written */
    struct buf in;   /* input kept while parsing is paused */
    struct buf test_out;

    int writing, reading, paused, in_parse, in_pump;
    int stop_parsing; /* no further request will be parsed */
    int close_after;  /* close once `out` is written */
    int closing;
    int lingering;
    int peer_eof;
    int draining;
    int err; /* KVIDX_E* recorded by a callback that stopped the parser */

    int in_message, headers_done;
    size_t header_bytes;
    char hname[HNAME_MAX];
    size_t hname_len;
    int hname_over;
    int hwhich; /* 1 content-type, 2 authorization, 3 expect */
    char expect[EXPECT_MAX];
    size_t expect_len;

    uint64_t nreq;      /* requests begun on this connection */
    uint64_t anchor_ms; /* accept or end of the previous answer */
    uint64_t header_deadline;
    uint64_t last_progress_ms; /* last read or completed write */
    uint64_t deadline;
    enum timer_action timer_action;
};

static llhttp_settings_t parser_settings;
static int parser_settings_ready;

static void pump(struct conn *c);
static void on_res_complete(struct response *res);

/* ---------------------------------------------------------------------- */
/* Pending requests                                                        */

static struct pending *pending_new(struct conn *c)
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
    p->req.method = M_OTHER;
    p->req.method_name = "-";
    p->req.path = "";
    p->req.query = "";
    p->req.body = "";
    p->keep_alive = 1;
    p->route_name = "unknown";
    return p;
}

static void pending_free(struct pending *p)
{
    buf_free(&p->url);
    buf_free(&p->ct);
    buf_free(&p->auth);
    buf_free(&p->body);
    buf_free(&p->res.body);
    free(p);
}

/* Cancels a deferred answer (the handler's waiter goes away) and frees. */
static void pending_discard(struct pending *p)
{
    if (p->res.deferred && !p->res.done && p->res.cancel)
        p->res.cancel(p->res.waiter);
    pending_free(p);
}

static void enqueue(struct conn *c, struct pending *p)
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
        pending_free(c->cur);
        c->cur = NULL;
    }
}

/* Parses nothing more and drops the message being received, if any; the
 * requests received whole are still answered. */
static void stop_receiving(struct conn *c)
{
    c->stop_parsing = 1;
    if (c->cur) {
        pending_free(c->cur);
        c->cur = NULL;
        c->in_message = 0;
    }
}

static size_t unsent(const struct conn *c)
{
    return c->out.len + c->wbuf.len;
}

static uint64_t now_ms(const struct conn *c)
{
    return c->test ? 0 : app_now_ms(c->app);
}

/* Queues an error answer that ends the connection: it replaces the request
 * being parsed (if any) and nothing after it is parsed. */
static void queue_error(struct conn *c, int err, const char *detail)
{
    struct pending *p = c->cur;
    c->cur = NULL;
    c->stop_parsing = 1;
    c->in_message = 0;
    if (!p)
        p = pending_new(c);
    if (!p) {
        /* No memory even for the error: drop the connection after what is
         * already queued. */
        c->close_after = 1;
        return;
    }
    res_problem(&p->res, err, detail, NULL, 0);
    p->res.close = 1;
    p->res.done = 1;
    enqueue(c, p);
}

/* ---------------------------------------------------------------------- */
/* llhttp callbacks                                                        */

static int cb_message_begin(llhttp_t *h)
{
    struct conn *c = h->data;
    uint64_t now = now_ms(c), ht = c->app->cfg.header_timeout_ms;
    c->cur = pending_new(c);
    if (!c->cur) {
        c->err = KVIDX_ENOMEM;
        return -1;
    }
    c->in_message = 1;
    c->headers_done = 0;
    c->header_bytes = 0;
    c->hname_len = 0;
    c->hname_over = 0;
    c->hwhich = 0;
    c->expect_len = 0;
    c->nreq++;
    /* The header timeout runs from accept / the end of the previous answer;
     * a client that was idle past it gets a fresh period from its first
     * byte (idleness is idle_timeout_ms's business). */
    c->header_deadline = (now <= c->anchor_ms + ht) ? c->anchor_ms + ht : now + ht;
    return 0;
}

/* Appends a piece of the URL or body, which llhttp may deliver in several
 * callbacks, refusing to grow past cap (err names the limit). */
static int append_capped(struct conn *c, struct buf *b, const char *at, size_t n, uint64_t cap,
                         int err)
{
    if (b->len + n > cap) {
        c->err = err;
        return -1;
    }
    buf_append(b, at, n);
    if (b->failed) {
        c->err = KVIDX_ENOMEM;
        return -1;
    }
    return 0;
}

static int cb_url(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    return append_capped(c, &c->cur->url, at, n, c->app->cfg.max_uri_bytes, KVIDX_EURISIZE);
}

static int count_header(struct conn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->app->cfg.max_header_bytes) {
        c->err = KVIDX_EHEADERSIZE;
        return -1;
    }
    return 0;
}

static int cb_header_field(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    if (count_header(c, n))
        return -1;
    if (c->hname_len + n >= sizeof(c->hname)) {
        c->hname_over = 1;
        return 0;
    }
    memcpy(c->hname + c->hname_len, at, n);
    c->hname_len += n;
    return 0;
}

static int cb_header_field_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    c->hname[c->hname_len] = '\0';
    c->hwhich = 0;
    if (!c->hname_over) {
        if (strcasecmp(c->hname, "content-type") == 0)
            c->hwhich = 1;
        else if (strcasecmp(c->hname, "authorization") == 0)
            c->hwhich = 2;
        else if (strcasecmp(c->hname, "expect") == 0)
            c->hwhich = 3;
    }
    if (c->hwhich == 1) {
        /* A repeated Content-Type makes the value unusable (→ 415). */
        if (c->cur->has_ct)
            buf_putc(&c->cur->ct, ',');
        c->cur->has_ct = 1;
    }
    if (c->hwhich == 2)
        c->cur->has_auth = 1;
    c->hname_len = 0;
    c->hname_over = 0;
    /* ": " and CRLF of the line count towards the header block. */
    return count_header(c, 4);
}

static int cb_header_value(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    if (count_header(c, n))
        return -1;
    switch (c->hwhich) {
    case 1:
        buf_append(&p->ct, at, n);
        break;
    case 2:
        buf_append(&p->auth, at, n);
        break;
    case 3:
        if (c->expect_len + n < sizeof(c->expect)) {
            memcpy(c->expect + c->expect_len, at, n);
            c->expect_len += n;
        }
        break;
    default:
        break;
    }
    if (p->ct.failed || p->auth.failed) {
        c->err = KVIDX_ENOMEM;
        return -1;
    }
    return 0;
}

static int cb_header_value_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    c->hwhich = 0;
    return 0;
}

static enum http_method map_method(uint8_t m)
{
    switch (m) {
    case HTTP_GET:
        return M_GET;
    case HTTP_HEAD:
        return M_HEAD;
    case HTTP_PUT:
        return M_PUT;
    case HTTP_POST:
        return M_POST;
    case HTTP_DELETE:
        return M_DELETE;
    default:
        return M_OTHER;
    }
}

#define BODY_PREALLOC_MAX (256 * 1024)

static int cb_headers_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    c->headers_done = 1;
    p->req.method = map_method(llhttp_get_method(h));
    p->req.method_name = llhttp_method_name((llhttp_method_t)llhttp_get_method(h));
    p->head_only = p->req.method == M_HEAD;
    if ((h->flags & F_CONTENT_LENGTH) && h->content_length > c->app->cfg.max_body_bytes) {
        c->err = KVIDX_EBODYSIZE;
        return -1;
    }
    /* A known body size gets its buffer at once, not by doublings that
     * copy it (a 1000-key body is ~150 KB). Up to 256 KiB only: the
     * announced size costs memory before any of it has arrived. A failure
     * here is left to the appends. */
    if ((h->flags & F_CONTENT_LENGTH) && h->content_length > 0 &&
        h->content_length <= BODY_PREALLOC_MAX && buf_reserve(&p->body, h->content_length) != 0)
        p->body.failed = 0;
    /* Answer "100 Continue" only when it cannot overtake an earlier answer. */
    if (c->expect_len == 12 && strncasecmp(c->expect, "100-continue", 12) == 0 && !c->qhead &&
        ((h->flags & F_CHUNKED) || h->content_length > 0) && h->http_minor >= 1)
        buf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
    return 0;
}

static int cb_body(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    return append_capped(c, &c->cur->body, at, n, c->app->cfg.max_body_bytes, KVIDX_EBODYSIZE);
}

static void finish_request(struct pending *p, llhttp_t *h)
{
    struct request *r = &p->req;
    /* One allocation holds the URL, its NUL, and the router's scratch
     * space after it (a decoded path is never longer than the raw one).
     * Appending nothing NUL-terminates (and allocates: data != NULL). */
    buf_reserve(&p->url, p->url.len + 1);
    buf_append(&p->url, "", 0);
    if (p->has_ct)
        buf_append(&p->ct, "", 0);
    if (p->has_auth)
        buf_append(&p->auth, "", 0);
    /* After an allocation failure dispatch() answers 503; the request only
     * has to be safe to log. */
    size_t ulen = p->url.failed || !p->url.data ? 0 : p->url.len;
    char *url = ulen ? p->url.data : "";
    char *q = memchr(url, '?', ulen);
    r->path = url;
    r->path_len = q ? (size_t)(q - url) : ulen;
    if (q) {
        *q = '\0';
        r->query = q + 1;
        r->query_len = ulen - r->path_len - 1;
        r->has_query = 1;
    }
    r->body = p->body.len && p->body.data ? p->body.data : "";
    r->body_len = p->body.len;
    r->content_type = p->has_ct && p->ct.data ? p->ct.data : NULL;
    r->authorization = p->has_auth && p->auth.data ? p->auth.data : NULL;
    r->http_major = h->http_major;
    r->http_minor = h->http_minor;
    r->start_ns = uv_hrtime();
    p->http10 = h->http_major == 1 && h->http_minor == 0;
    p->keep_alive = llhttp_should_keep_alive(h);
    if (!p->url.failed) {
        r->scratch = p->url.data + p->url.len + 1;
        r->scratch_cap = p->url.len + 1;
    }
}

static void dispatch(struct conn *c, struct pending *p)
{
    struct response *res = &p->res;
    int rc;
    if (p->url.failed || p->ct.failed || p->auth.failed || p->body.failed) {
        res_problem(res, KVIDX_ENOMEM, "Out of memory.", NULL, 0);
        rc = 0;
    } else if (p->req.path_len == 0 || p->req.path[0] != '/') {
        /* Only origin-form targets ("/path?query") are served. */
        res_problem(res, KVIDX_EBADREQUEST, "The request target must start with '/'.", NULL, 0);
        rc = 0;
    } else {
        c->in_parse++;
        rc = router_dispatch(&p->req, res, &p->route_name);
        c->in_parse--;
    }
    if (rc == HANDLER_ASYNC && res->deferred)
        return; /* done already if the handler completed synchronously */
    if (rc < 0)
        res_problem(res, rc, NULL, NULL, 0);
    else if (res->status < 100 || res->status > 999)
        res_problem(res, KVIDX_EINTERNAL, "The handler produced no answer.", NULL, 0);
    res->done = 1;
}

static int cb_message_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    c->cur = NULL;
    c->in_message = 0;
    c->headers_done = 0;
    finish_request(p, h);
    enqueue(c, p);
    dispatch(c, p);
    if (!p->keep_alive) {
        c->stop_parsing = 1;
        return HPE_PAUSED;
    }
    if (c->qlen >= MAX_PIPELINE || unsent(c) > c->app->cfg.max_conn_output_bytes)
        return HPE_PAUSED;
    return 0;
}

static void init_settings(void)
{
    if (parser_settings_ready)
        return;
    llhttp_settings_init(&parser_settings);
    parser_settings.on_message_begin = cb_message_begin;
    parser_settings.on_url = cb_url;
    parser_settings.on_header_field = cb_header_field;
    parser_settings.on_header_field_complete = cb_header_field_complete;
    parser_settings.on_header_value = cb_header_value;
    parser_settings.on_header_value_complete = cb_header_value_complete;
    parser_settings.on_headers_complete = cb_headers_complete;
    parser_settings.on_body = cb_body;
    parser_settings.on_message_complete = cb_message_complete;
    parser_settings_ready = 1;
}

/* Runs the parser over data; on pause keeps the rest in c->in. */
static void conn_parse(struct conn *c, const char *data, size_t n)
{
    if (c->stop_parsing || c->closing || n == 0)
        return;
    if (c->paused) {
        buf_append(&c->in, data, n);
        if (c->in.failed)
            queue_error(c, KVIDX_ENOMEM, "Out of memory.");
        return;
    }
    c->in_parse++;
    llhttp_errno_t e = llhttp_execute(&c->parser, data, n);
    c->in_parse--;
    if (e == HPE_OK)
        return;
    if (e == HPE_PAUSED) {
        const char *pos = llhttp_get_error_pos(&c->parser);
        size_t used = pos ? (size_t)(pos - data) : n;
        if (c->stop_parsing || used >= n) {
            if (!c->stop_parsing)
                c->paused = 1;
            return;
        }
        c->paused = 1;
        buf_append(&c->in, data + used, n - used);
        if (c->in.failed)
            queue_error(c, KVIDX_ENOMEM, "Out of memory.");
        return;
    }
    if (c->err) {
        int err = c->err;
        c->err = 0;
        queue_error(c, err,
                    err == KVIDX_EURISIZE      ? "The request target is too long."
                    : err == KVIDX_EHEADERSIZE ? "The header block is too large."
                    : err == KVIDX_EBODYSIZE   ? "The request body is too large."
                                               : NULL);
        return;
    }
    /* llhttp's error names are static text, never request bytes. */
    char detail[128];
    snprintf(detail, sizeof(detail), "Malformed HTTP request (%s).", llhttp_errno_name(e));
    queue_error(c, KVIDX_EBADREQUEST, detail);
}

static int can_resume(const struct conn *c)
{
    return c->paused && !c->stop_parsing && !c->closing && c->qlen < MAX_PIPELINE &&
           unsent(c) <= c->app->cfg.max_conn_output_bytes;
}

static void resume_parse(struct conn *c)
{
    struct buf saved = c->in;
    buf_init(&c->in);
    c->paused = 0;
    llhttp_resume(&c->parser);
    conn_parse(c, saved.data, saved.len);
    buf_free(&saved);
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
    case 507:
        return "Insufficient Storage";
    default:
        return "Status";
    }
}

static void serialize(struct conn *c, struct pending *p, int close)
{
    struct response *res = &p->res;
    struct buf *o = &c->out;
    if (res->body.failed)
        res_problem(res, KVIDX_ENOMEM, "Out of memory while building the answer.", NULL, 0);
    int no_body = res->status == 204 || res->status == 304 || res->status < 200;
    buf_printf(o, "HTTP/1.1 %d %s\r\n", res->status, reason(res->status));
    if (!no_body) {
        buf_puts(o, "Content-Type: ");
        buf_puts(o, res->content_type ? res->content_type : "application/json");
        buf_puts(o, "\r\nContent-Length: ");
        buf_put_u64(o, res->body.failed ? 0 : res->body.len);
        buf_puts(o, "\r\n");
    }
    buf_append(o, res->extra_headers, res->extra_len);
    if (close)
        buf_puts(o, "Connection: close\r\n");
    else if (p->http10)
        buf_puts(o, "Connection: keep-alive\r\n");
    buf_puts(o, "\r\n");
    if (!no_body && !p->head_only && !res->body.failed)
        buf_append(o, res->body.data, res->body.len);

    double secs = p->req.start_ns ? (double)(uv_hrtime() - p->req.start_ns) / 1e9 : 0.0;
    if (c->app->metrics)
        metrics_observe_request(c->app->metrics, p->route_name, res->status, secs);
    log_debug("%s %.*s %d %zu %.3fms", p->req.method_name,
              (int)(p->req.path_len > 200 ? 200 : p->req.path_len), p->req.path, res->status,
              res->body.len, secs * 1e3);
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
        int close = p->res.close || !p->keep_alive || (c->stop_parsing && !c->qhead);
        serialize(c, p, close);
        pending_free(p);
        if (close) {
            c->stop_parsing = 1;
            c->close_after = 1;
            discard_all(c);
        }
        if (!c->qhead)
            c->anchor_ms = now_ms(c);
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
    buf_free(&c->out);
    buf_free(&c->wbuf);
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
        c->last_progress_ms = now_ms(c);
        if (c->lingering)
            return;
        conn_parse(c, b->base, (size_t)nread);
        pump(c);
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
    stop_receiving(c);
    pump(c);
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
    uint64_t now = now_ms(c);
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
    if (unsent(c) > 0)
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

static void fire(struct conn *c, enum timer_action a)
{
    if (a == T_408) {
        queue_error(c, KVIDX_ETIMEDOUT, "The request was not received in time.");
        pump(c);
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
    if (c->timer_action != T_NONE && now_ms(c) >= c->deadline) {
        uv_timer_stop(&c->timer);
        fire(c, c->timer_action);
    }
}

static void on_write(uv_write_t *r, int status)
{
    struct conn *c = r->data;
    c->writing = 0;
    if (c->wbuf.cap > BIG_BUF)
        buf_free(&c->wbuf);
    else
        buf_reset(&c->wbuf);
    c->wbuf.len = 0;
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    c->last_progress_ms = now_ms(c);
    pump(c);
}

static void start_write(struct conn *c)
{
    if (c->writing || c->out.len == 0)
        return;
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    int n = uv_try_write(conn_stream(c), &b, 1);
    if (n == (int)c->out.len) {
        c->last_progress_ms = now_ms(c);
        if (c->out.cap > BIG_BUF)
            buf_free(&c->out);
        else
            buf_reset(&c->out);
        return;
    }
    if (n < 0 && n != UV_EAGAIN && n != UV_ENOSYS) {
        conn_close(c);
        return;
    }
    size_t off = n > 0 ? (size_t)n : 0;
    struct buf t = c->wbuf;
    c->wbuf = c->out;
    c->out = t;
    buf_reset(&c->out);
    b = uv_buf_init(c->wbuf.data + off, (unsigned)(c->wbuf.len - off));
    c->wbuf.len -= off; /* only the bytes still unsent count */
    c->wreq.data = c;
    int rc = uv_write(&c->wreq, conn_stream(c), &b, 1, on_write);
    if (rc < 0) {
        conn_close(c);
        return;
    }
    if (n > 0)
        c->last_progress_ms = now_ms(c);
    c->writing = 1;
}

static void update_reading(struct conn *c)
{
    int want = !c->closing && (c->lingering || (!c->paused && !c->stop_parsing && !c->peer_eof &&
                                                unsent(c) <= c->app->cfg.max_conn_output_bytes));
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
    if (c->peer_eof || c->out.failed) {
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

static void pump(struct conn *c)
{
    if (c->closing || c->in_pump || c->lingering)
        return;
    c->in_pump = 1;
    for (;;) {
        serialize_ready(c);
        if (c->closing)
            break;
        if (c->test) {
            /* The test transport "writes" instantly. */
            buf_append(&c->test_out, c->out.data, c->out.len);
            buf_reset(&c->out);
        } else if (unsent(c) > c->app->cfg.max_conn_output_bytes) {
            /* Past the limit: try to hand the output to the kernel now; if
             * it takes everything, parsing may go on without waiting for a
             * write callback that would never come. */
            start_write(c);
            if (c->closing)
                break;
        }
        if (!can_resume(c))
            break;
        resume_parse(c);
    }
    c->in_pump = 0;
    if (c->closing)
        return;
    if (c->test) {
        if (c->close_after)
            conn_close(c);
        return;
    }
    start_write(c);
    if (c->closing)
        return;
    if (c->close_after && !c->writing && c->out.len == 0) {
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
        pump(p->conn);
}

/* ---------------------------------------------------------------------- */
/* Construction                                                            */

static struct conn *alloc_conn(struct app *app)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    init_settings();
    c->app = app;
    c->node.conn = c;
    buf_init(&c->out);
    buf_init(&c->wbuf);
    buf_init(&c->in);
    buf_init(&c->test_out);
    llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
    c->parser.data = c;
    return c;
}

struct conn *conn_new(struct app *app, const struct conn_host *host)
{
    struct conn *c = alloc_conn(app);
    if (!c)
        return NULL;
    c->host = *host;
    uv_tcp_init(app->loop, &c->tcp);
    uv_timer_init(app->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->anchor_ms = c->last_progress_ms = now_ms(c);
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

void conn_start(struct conn *c)
{
    uv_tcp_nodelay(&c->tcp, 1);
    c->anchor_ms = c->last_progress_ms = now_ms(c);
    pump(c);
}

void conn_reject(struct conn *c, int err)
{
    queue_error(c, err, "The server has too many connections; retry later.");
    pump(c);
}

void conn_drain(struct conn *c)
{
    if (c->closing)
        return;
    c->draining = 1;
    stop_receiving(c);
    if (!c->qhead && unsent(c) == 0) {
        conn_close(c);
        return;
    }
    pump(c);
}

struct conn *conn_new_test(struct app *app)
{
    struct conn *c = alloc_conn(app);
    if (c)
        c->test = 1;
    return c;
}

int conn_feed(struct conn *c, const char *data, size_t n)
{
    if (!c->closing) {
        conn_parse(c, data, n);
        pump(c);
    }
    return c->closing;
}

int conn_feed_eof(struct conn *c)
{
    if (!c->closing) {
        c->peer_eof = 1;
        c->stop_parsing = 1;
        if (c->cur) {
            pending_free(c->cur);
            c->cur = NULL;
            c->in_message = 0;
        }
        pump(c);
    }
    return c->closing;
}

int conn_test_fire_timer(struct conn *c)
{
    if (!c->closing) {
        if (c->qhead)
            return 0;
        fire(c, (c->in_message || c->nreq == 0) ? T_408 : T_CLOSE);
    }
    return c->closing;
}

struct buf *conn_test_output(struct conn *c)
{
    return &c->test_out;
}

int conn_test_closed(const struct conn *c)
{
    return c->closing;
}

size_t conn_test_queued(const struct conn *c)
{
    return c->qlen;
}

void conn_free_test(struct conn *c)
{
    if (!c)
        return;
    conn_close(c);
    buf_free(&c->out);
    buf_free(&c->wbuf);
    buf_free(&c->in);
    buf_free(&c->test_out);
    free(c);
}
