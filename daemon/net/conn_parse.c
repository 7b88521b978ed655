/*
 * Bytes in, requests out: the llhttp callbacks of a connection, the
 * request limits, and the hand-off of each complete request to the router.
 *
 * Owns: c->parser, the request being parsed (c->cur) and its copies of the
 * URL, the headers we keep (Content-Type, Authorization) and the body; what
 * the head's checks need (Expect, the Host count, Transfer-Encoding, the
 * version); the input kept while parsing is paused (c->in).
 *
 * The checks llhttp leaves to us: exactly one Host (HTTP/1.0 may omit it),
 * no whitespace in or before a field name's colon, chunked as the only
 * transfer coding and none in HTTP/1.0, major version 1 (505 otherwise),
 * CONNECT answered once. An upgrade offer is declined by going on in
 * HTTP/1.1. Fields in a chunked trailer are never kept.
 *
 * Invariants:
 *   - memory per request is bounded: URL <= max_uri_bytes, header block
 *     <= max_header_bytes, body <= max_body_bytes; a limit is checked before
 *     the bytes are copied;
 *   - the bodies of all connections sharing c->budget hold at most
 *     max_total_body_bytes: a body is counted (in full when its length is
 *     announced) before its bytes are kept, and p->body_charged is what it
 *     counts, given back by conn_pending_drop_body();
 *   - a callback never closes and never touches the answer queue except to
 *     append a complete request; it records what went wrong in c->err (a
 *     KVIDX_E* code) and returns llhttp's -1, or HPE_PAUSED to stop early;
 *   - after a limit or parse error the parser is never run again on the
 *     connection (conn_queue_error sets stop_parsing);
 *   - no pointer into the caller's bytes survives llhttp_execute: what is
 *     kept is copied into the request's buffers or into c->in;
 *   - the answer does not depend on how the input was split into feeds:
 *     a check on a header name runs when the name is complete.
 *
 * Internal helpers return 0 or a negative KVIDX_E*; only the llhttp
 * callbacks speak llhttp's convention (0, -1, HPE_PAUSED).
 */
#include "net/conn.h"
#include "net/conn_int.h"

#include "kvidx/err.h"
#include "net/router.h"
#include "util/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define BODY_PREALLOC_MAX (256 * 1024)

static llhttp_settings_t parser_settings;
static int parser_settings_ready;

/* Records err (and a static detail text, or NULL for the default) for
 * conn_parse and tells llhttp to stop. */
static int cb_fail_detail(struct conn *c, int err, const char *detail)
{
    c->err = err;
    c->err_detail = detail;
    return -1;
}

static int cb_fail(struct conn *c, int err)
{
    return cb_fail_detail(c, err, NULL);
}

static int cb_message_begin(llhttp_t *h)
{
    struct conn *c = h->data;
    uint64_t now = conn_now_ms(c), ht = c->app->cfg.header_timeout_ms;
    c->cur = conn_pending_new(c);
    if (!c->cur)
        return cb_fail(c, KVIDX_ENOMEM);
    c->in_message = 1;
    c->headers_done = 0;
    c->header_bytes = 0;
    c->hname_len = 0;
    c->hname_over = 0;
    c->hwhich = H_OTHER;
    c->hname_ws = 0;
    c->nhost = 0;
    c->expect_len = 0;
    c->te_len = 0;
    c->te_over = 0;
    c->version_len = 0;
    c->nreq++;
    /* The header timeout runs from accept / the end of the previous answer;
     * a client that was idle past it gets a fresh period from its first
     * byte (idleness is idle_timeout_ms's business). */
    c->header_deadline = (now <= c->anchor_ms + ht) ? c->anchor_ms + ht : now + ht;
    return 0;
}

/* Appends a piece of the URL or body, which llhttp may deliver in several
 * callbacks, refusing to grow past cap. Returns 0, err (the limit's code)
 * or KVIDX_ENOMEM. */
static int append_capped(struct buf *b, const char *at, size_t n, uint64_t cap, int err)
{
    if (b->len + n > cap)
        return err;
    buf_append(b, at, n);
    return b->failed ? KVIDX_ENOMEM : 0;
}

static int cb_url(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    int rc = append_capped(&c->cur->url, at, n, c->app->cfg.max_uri_bytes, KVIDX_EURISIZE);
    return rc ? cb_fail(c, rc) : 0;
}

/* Makes p's body count `total` bytes in the connection's budget (it never
 * counts less than it did). Returns 0, or KVIDX_ECONNLIMIT when the bodies
 * of all connections together would pass max_total_body_bytes. */
static int body_charge(struct conn *c, struct pending *p, uint64_t total)
{
    uint64_t cap = c->app->cfg.max_total_body_bytes, used = c->budget->body_bytes;
    if (total <= p->body_charged)
        return 0;
    uint64_t more = total - p->body_charged;
    if (used > cap || more > cap - used)
        return KVIDX_ECONNLIMIT;
    c->budget->body_bytes = used + more;
    p->body_charged = total;
    return 0;
}

#define BUDGET_DETAIL "The server holds too many request bodies at once; retry later."

static int cb_version(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    for (size_t i = 0; i < n && c->version_len < sizeof(c->version); i++)
        c->version[c->version_len++] = at[i];
    return 0;
}

#define VERSION_DETAIL "This server speaks HTTP/1.x only."

/* llhttp accepts HTTP/0.9 and HTTP/2.0 request lines; we serve only 1.x. */
static int cb_version_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    return h->http_major == 1 ? 0 : cb_fail_detail(c, KVIDX_EHTTPVERSION, VERSION_DETAIL);
}

/* llhttp refuses other versions (HTTP/3.0) as malformed: a well-formed
 * one ("D.D") with a major other than 1 is an unsupported version. */
static int version_unsupported(const struct conn *c)
{
    const char *v = c->version;
    return c->version_len == 3 && v[0] >= '0' && v[0] <= '9' && v[0] != '1' && v[1] == '.' &&
           v[2] >= '0' && v[2] <= '9';
}

/* Counts n more bytes of the header block. Returns 0 or KVIDX_EHEADERSIZE. */
static int count_header(struct conn *c, size_t n)
{
    c->header_bytes += n;
    return c->header_bytes > c->app->cfg.max_header_bytes ? KVIDX_EHEADERSIZE : 0;
}

static int cb_header_field(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    int rc = count_header(c, n);
    if (rc)
        return cb_fail(c, rc);
    /* Judged when the name is complete, so that where the input was split
     * does not change which error is reported. */
    if (memchr(at, ' ', n) || memchr(at, '\t', n))
        c->hname_ws = 1;
    if (c->hname_len + n >= sizeof(c->hname)) {
        c->hname_over = 1;
        return 0;
    }
    memcpy(c->hname + c->hname_len, at, n);
    c->hname_len += n;
    return 0;
}

/* Keeps a piece of a Transfer-Encoding value; one too long to keep is
 * marked, and refused by check_codings. */
static void keep_te(struct conn *c, const char *at, size_t n)
{
    if (c->te_len + n >= sizeof(c->te)) {
        c->te_over = 1;
        return;
    }
    memcpy(c->te + c->te_len, at, n);
    c->te_len += n;
}

/* The transfer codings of a chunked request (llhttp has checked that the
 * last one is chunked): "chunked" is the only one we can undo. Returns 0,
 * KVIDX_ENOTIMPL for another coding, or KVIDX_EBADREQUEST when chunked is
 * applied more than once. */
static int check_codings(const struct conn *c)
{
    if (c->te_over)
        return KVIDX_ENOTIMPL;
    size_t nchunked = 0, i = 0;
    while (i < c->te_len) {
        size_t end = i;
        while (end < c->te_len && c->te[end] != ',')
            end++;
        size_t a = i, b = end;
        while (a < b && (c->te[a] == ' ' || c->te[a] == '\t'))
            a++;
        while (b > a && (c->te[b - 1] == ' ' || c->te[b - 1] == '\t'))
            b--;
        if (b - a == 7 && strncasecmp(c->te + a, "chunked", 7) == 0)
            nchunked++;
        else if (b > a)
            return KVIDX_ENOTIMPL; /* an empty list element is allowed */
        i = end + 1;
    }
    return nchunked > 1 ? KVIDX_EBADREQUEST : 0;
}

static enum header_kind header_kind(const char *name)
{
    static const struct {
        const char *name;
        enum header_kind kind;
    } known[] = {
        {"content-type", H_CONTENT_TYPE},
        {"authorization", H_AUTHORIZATION},
        {"expect", H_EXPECT},
        {"host", H_HOST},
        {"transfer-encoding", H_TRANSFER_ENCODING},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcasecmp(name, known[i].name) == 0)
            return known[i].kind;
    return H_OTHER;
}

static int cb_header_field_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    c->hname[c->hname_len] = '\0';
    c->hwhich = H_OTHER;
    /* llhttp lets "Name : value" through with the space in the name. No
     * whitespace may stand in a field name or before its colon: a
     * recipient that trimmed it would read another header than we do. */
    if (c->hname_ws)
        return cb_fail_detail(c, KVIDX_EBADREQUEST, "A header field name contains whitespace.");
    /* Fields after a chunked body are trailers, not headers: they are
     * counted towards the header block but never kept, so no trailer can
     * supply or change a Content-Type, an Authorization or a Host. */
    if (!c->hname_over && !c->headers_done)
        c->hwhich = header_kind(c->hname);
    switch (c->hwhich) {
    case H_CONTENT_TYPE:
        /* A repeated Content-Type makes the value unusable (-> 415). */
        if (p->has_ct)
            buf_putc(&p->ct, ',');
        p->has_ct = 1;
        break;
    case H_AUTHORIZATION:
        /* Repeated lines are kept apart so that they cannot join into one
         * credential; the result is never a valid one. */
        if (p->has_auth)
            buf_putc(&p->auth, ',');
        p->has_auth = 1;
        break;
    case H_HOST:
        c->nhost++;
        break;
    case H_TRANSFER_ENCODING:
        if (c->te_len > 0)
            keep_te(c, ",", 1);
        break;
    default:
        break;
    }
    c->hname_len = 0;
    c->hname_over = 0;
    /* ": " and CRLF of the line count towards the header block. */
    int rc = count_header(c, 4);
    return rc ? cb_fail(c, rc) : 0;
}

static int cb_header_value(llhttp_t *h, const char *at, size_t n)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    int rc = count_header(c, n);
    if (rc)
        return cb_fail(c, rc);
    switch (c->hwhich) {
    case H_CONTENT_TYPE:
        buf_append(&p->ct, at, n);
        break;
    case H_AUTHORIZATION:
        buf_append(&p->auth, at, n);
        break;
    case H_EXPECT:
        if (c->expect_len + n < sizeof(c->expect)) {
            memcpy(c->expect + c->expect_len, at, n);
            c->expect_len += n;
        }
        break;
    case H_TRANSFER_ENCODING:
        keep_te(c, at, n);
        break;
    default:
        break;
    }
    if (p->ct.failed || p->auth.failed)
        return cb_fail(c, KVIDX_ENOMEM);
    return 0;
}

static int cb_header_value_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    c->hwhich = H_OTHER;
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

/* The checks of a complete request head that do not depend on the body;
 * each refusal ends the connection. Returns 0, or a KVIDX_E* code with its
 * static detail text in *detail. */
static int check_head(const struct conn *c, llhttp_t *h, const char **detail)
{
    int http10 = h->http_major == 1 && h->http_minor == 0;
    /* After a CONNECT the client sends tunnel bytes, not HTTP: answer it
     * once and parse nothing more. The answer's Allow is empty: the target
     * (an authority, not a path) is no resource of ours. */
    if (llhttp_get_method(h) == HTTP_CONNECT) {
        *detail = "CONNECT is not supported: this is not a proxy.";
        return KVIDX_EMETHOD;
    }
    /* Exactly one Host; only HTTP/1.0 may omit it. */
    if (c->nhost > 1 || (c->nhost == 0 && !http10)) {
        *detail = c->nhost ? "The request has more than one Host header."
                           : "A Host header is required (HTTP/1.1).";
        return KVIDX_EBADREQUEST;
    }
    /* HTTP/1.0 has no transfer codings: a Transfer-Encoding there means
     * the body's framing cannot be trusted, whatever else is announced. */
    if (http10 && (h->flags & F_TRANSFER_ENCODING)) {
        *detail = "Transfer-Encoding is not allowed in HTTP/1.0.";
        return KVIDX_EBADREQUEST;
    }
    int rc = (h->flags & F_CHUNKED) ? check_codings(c) : 0;
    if (rc)
        *detail = rc == KVIDX_ENOTIMPL ? "Only the chunked transfer coding is supported."
                                       : "The chunked transfer coding is applied more than once.";
    return rc;
}

static int cb_headers_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    c->headers_done = 1;
    p->req.method = map_method(llhttp_get_method(h));
    p->req.method_name = llhttp_method_name((llhttp_method_t)llhttp_get_method(h));
    p->head_only = p->req.method == M_HEAD;
    const char *detail = NULL;
    int rc = check_head(c, h, &detail);
    if (rc)
        return cb_fail_detail(c, rc, detail);
    if ((h->flags & F_CONTENT_LENGTH) && h->content_length > c->app->cfg.max_body_bytes)
        return cb_fail(c, KVIDX_EBODYSIZE);
    /* An announced body counts in full before any of it is read, so that
     * it is refused early and an accepted one is not cut off later. */
    if ((h->flags & F_CONTENT_LENGTH) && body_charge(c, p, h->content_length) != 0)
        return cb_fail_detail(c, KVIDX_ECONNLIMIT, BUDGET_DETAIL);
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
    struct pending *p = c->cur;
    if (p->body.len + n > c->app->cfg.max_body_bytes)
        return cb_fail(c, KVIDX_EBODYSIZE);
    if (body_charge(c, p, p->body.len + n) != 0)
        return cb_fail_detail(c, KVIDX_ECONNLIMIT, BUDGET_DETAIL);
    int rc = append_capped(&p->body, at, n, c->app->cfg.max_body_bytes, KVIDX_EBODYSIZE);
    return rc ? cb_fail(c, rc) : 0;
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
    /* The handler is done with the body: give its memory back now rather
     * than when the answer leaves (it may wait behind a long poll). */
    conn_pending_drop_body(p);
}

static int cb_message_complete(llhttp_t *h)
{
    struct conn *c = h->data;
    struct pending *p = c->cur;
    c->cur = NULL;
    c->in_message = 0;
    c->headers_done = 0;
    finish_request(p, h);
    conn_enqueue(c, p);
    dispatch(c, p);
    if (!p->keep_alive) {
        c->stop_parsing = 1;
        return HPE_PAUSED;
    }
    if (c->qlen >= MAX_PIPELINE || conn_unsent(c) > c->app->cfg.max_conn_output_bytes)
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
    parser_settings.on_version = cb_version;
    parser_settings.on_version_complete = cb_version_complete;
    parser_settings.on_header_field = cb_header_field;
    parser_settings.on_header_field_complete = cb_header_field_complete;
    parser_settings.on_header_value = cb_header_value;
    parser_settings.on_header_value_complete = cb_header_value_complete;
    parser_settings.on_headers_complete = cb_headers_complete;
    parser_settings.on_body = cb_body;
    parser_settings.on_message_complete = cb_message_complete;
    parser_settings_ready = 1;
}

void conn_parser_init(struct conn *c)
{
    init_settings();
    llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
    c->parser.data = c;
}

/* Keeps input that arrives (or is left over) while parsing is paused. */
static void keep_input(struct conn *c, const char *data, size_t n)
{
    buf_append(&c->in, data, n);
    if (c->in.failed)
        conn_queue_error(c, KVIDX_ENOMEM, "Out of memory.");
}

static const char *default_detail(int err)
{
    switch (err) {
    case KVIDX_EURISIZE:
        return "The request target is too long.";
    case KVIDX_EHEADERSIZE:
        return "The header block is too large.";
    case KVIDX_EBODYSIZE:
        return "The request body is too large.";
    default:
        return NULL;
    }
}

/* Turns a parse that stopped on an error into the connection's last answer. */
static void parse_failed(struct conn *c, llhttp_errno_t e)
{
    if (c->err) {
        int err = c->err;
        const char *detail = c->err_detail ? c->err_detail : default_detail(err);
        c->err = 0;
        c->err_detail = NULL;
        conn_queue_error(c, err, detail);
        return;
    }
    if (e == HPE_INVALID_VERSION && version_unsupported(c)) {
        conn_queue_error(c, KVIDX_EHTTPVERSION, VERSION_DETAIL);
        return;
    }
    /* llhttp's error names are static text, never request bytes. */
    char detail[128];
    snprintf(detail, sizeof(detail), "Malformed HTTP request (%s).", llhttp_errno_name(e));
    conn_queue_error(c, KVIDX_EBADREQUEST, detail);
}

void conn_parse(struct conn *c, const char *data, size_t n)
{
    if (c->stop_parsing || c->closing || n == 0)
        return;
    if (c->paused) {
        keep_input(c, data, n);
        return;
    }
    for (;;) {
        c->in_parse++;
        llhttp_errno_t e = llhttp_execute(&c->parser, data, n);
        c->in_parse--;
        if (e == HPE_OK)
            return;
        if (e != HPE_PAUSED && e != HPE_PAUSED_UPGRADE) {
            parse_failed(c, e);
            return;
        }
        const char *pos = llhttp_get_error_pos(&c->parser);
        size_t used = pos ? (size_t)(pos - data) : n;
        if (c->stop_parsing)
            return;
        if (e == HPE_PAUSED_UPGRADE) {
            /* The request offered to switch protocols (Upgrade: h2c,
             * websocket). The offer is declined by answering in HTTP/1.1,
             * so what follows it is the next request. */
            llhttp_resume_after_upgrade(&c->parser);
            data += used;
            n -= used;
            if (n == 0)
                return;
            continue;
        }
        c->paused = 1;
        if (used < n)
            keep_input(c, data + used, n - used);
        return;
    }
}

int conn_can_resume(const struct conn *c)
{
    return c->paused && !c->stop_parsing && !c->closing && c->qlen < MAX_PIPELINE &&
           conn_unsent(c) <= c->app->cfg.max_conn_output_bytes;
}

void conn_resume_parse(struct conn *c)
{
    struct buf saved = c->in;
    buf_init(&c->in);
    c->paused = 0;
    llhttp_resume(&c->parser);
    conn_parse(c, saved.data, saved.len);
    buf_free(&saved);
}
