/*
 * The listening socket and the live connections.
 *
 * Accepting: every pending connection is accepted. Past max_connections it
 * gets a 503 too_many_connections problem and is closed (at most
 * MAX_REJECTING such answers are in flight; beyond that the connection is
 * closed without an answer). When accept() fails for lack of file
 * descriptors, libuv's reserve-fd trick drops the pending connection; we log
 * (at most once a second) and keep serving. When a connection cannot be
 * allocated it is accepted into a spare handle and closed, because libuv
 * stops watching the listener until the pending connection is taken. The
 * spare is one embedded handle (a failed allocation cannot be answered with
 * another allocation): while it is closing, a second failed connection is
 * left pending (libuv then stops polling the listener, so no third one
 * arrives) and is taken once the spare's close completes. Invariant: while
 * the listener is open, a pending connection is always either being taken
 * now or remembered in accept_pending, so accepting never stops for good.
 *
 * libuv keeps a table indexed by descriptor number and grows it when a
 * larger descriptor is first watched; it aborts when that growth cannot
 * allocate. server_grow_fd_table grows it once at start, before anything
 * else (a journal, a source) exists, to cover every descriptor the
 * connections can use (max_connections plus the rejecting ones plus some
 * headroom, at most the descriptor limit), so that taking a connection under
 * memory pressure never needs that allocation.
 *
 * Memory: every connection counts its request bodies in the server's one
 * conn_budget, so that together they stay under max_total_body_bytes; the
 * count is published as the gauge kvidx_http_body_bytes_held.
 *
 * Shutdown: server_drain() closes the listener, asks every connection to
 * finish what it has received, and forces the rest closed after the
 * timeout. The server frees itself when its last handle is closed.
 */
#include "net/server.h"

#include "util/context.h"
#include "kvidx/err.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/sd_notify.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
    READ_CHUNK = 64 * 1024,
    MAX_REJECTING = 64,
    BACKLOG = 511,
    FD_HEADROOM = 256, /* descriptors beyond the connections: journal, sources, logs */
};

struct server {
    struct app *app;
    uv_tcp_t listener;
    uv_timer_t drain_timer;
    uv_tcp_t spare;
    int spare_busy;     /* the spare is open or closing */
    int accept_pending; /* a connection waits for the spare to be free */
    int listener_open, handles_open;
    struct conn_node conns;    /* circular list sentinel */
    struct conn_budget budget; /* request bodies held by all connections */
    size_t nconns, nrejecting;
    int draining, closing;
    void (*on_drained)(struct server *s);
    uint64_t last_accept_warn_ms;
    char rbuf[READ_CHUNK];
};

size_t server_connections(const struct server *s)
{
    return s->nconns;
}

static void link_conn(struct server *s, struct conn_node *n)
{
    n->next = s->conns.next;
    n->prev = &s->conns;
    s->conns.next->prev = n;
    s->conns.next = n;
}

static void check_drained(struct server *s)
{
    if (s->draining && s->on_drained && s->conns.next == &s->conns) {
        void (*done)(struct server *) = s->on_drained;
        s->on_drained = NULL;
        uv_timer_stop(&s->drain_timer);
        done(s);
    }
}

static void conn_gone(void *ctx, struct conn_node *n)
{
    struct server *s = ctx;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = n;
    if (n->rejected) {
        s->nrejecting--;
    } else {
        s->nconns--;
        if (s->app->metrics)
            metrics_conn_closed(s->app->metrics);
    }
    check_drained(s);
}

static void on_server_handle_closed(uv_handle_t *h);
static void on_connection(uv_stream_t *l, int status);

static void on_spare_closed(uv_handle_t *h)
{
    struct server *s = h->data;
    s->spare_busy = 0;
    /* The pending connection is offered again (memory may be back); the
     * spare counts as open until here, so the server cannot be freed in
     * between. If the listener closed meanwhile, libuv closed the pending
     * descriptor with it. */
    if (s->accept_pending) {
        s->accept_pending = 0;
        if (s->listener_open)
            on_connection((uv_stream_t *)&s->listener, 0);
    }
    on_server_handle_closed(h);
}

static void warn_accept(struct server *s, const char *what, int err)
{
    uint64_t now = app_now_ms(s->app);
    if (now - s->last_accept_warn_ms >= 1000 || s->last_accept_warn_ms == 0) {
        s->last_accept_warn_ms = now;
        log_warn("accept: %s: %s", what, uv_strerror(err));
    }
}

/* Takes the pending connection without a struct conn and closes it, or,
 * when the spare is still closing from the last time, remembers it. */
static void shed_connection(struct server *s, uv_stream_t *l)
{
    warn_accept(s, "out of memory", UV_ENOMEM);
    if (s->spare_busy) {
        s->accept_pending = 1;
        return;
    }
    s->spare_busy = 1;
    s->handles_open++;
    uv_tcp_init(s->app->loop, &s->spare);
    s->spare.data = s;
    /* libuv polls the listener again only when the accept succeeds; a
     * fresh TCP handle cannot fail to take the descriptor, but if it ever
     * did the listener would stop, so it is said loudly. */
    int rc = uv_accept(l, (uv_stream_t *)&s->spare);
    if (rc != 0)
        log_error("accept: cannot take a pending connection into the spare handle (%s); "
                  "the listener may have stopped",
                  uv_strerror(rc));
    uv_close((uv_handle_t *)&s->spare, on_spare_closed);
}

static void on_connection(uv_stream_t *l, int status)
{
    struct server *s = l->data;
    if (status < 0) {
        /* EMFILE/ENFILE: libuv already dropped the connection with its
         * reserve fd, and nothing is pending. */
        warn_accept(s, "cannot take a connection", status);
        return;
    }
    struct conn_host host = {s->rbuf, sizeof(s->rbuf), &s->budget, conn_gone, s};
    struct conn *c = conn_new(s->app, &host);
    if (!c) {
        shed_connection(s, l);
        return;
    }
    struct conn_node *n = conn_node(c);
    int rc = uv_accept(l, conn_stream(c));
    int reject = s->nconns >= s->app->cfg.max_connections;
    n->rejected = reject;
    if (reject)
        s->nrejecting++;
    else
        s->nconns++;
    link_conn(s, n);
    if (!reject && s->app->metrics)
        metrics_conn_opened(s->app->metrics);
    if (rc < 0) {
        warn_accept(s, "accept failed", rc);
        conn_close(c);
        return;
    }
    if (reject) {
        if (s->app->metrics)
            metrics_conn_rejected(s->app->metrics);
        if (s->nrejecting > MAX_REJECTING)
            conn_close(c);
        else
            conn_reject(c, KVIDX_ECONNLIMIT);
        return;
    }
    conn_start(c);
}

static void server_gauges(void *ctx, struct buf *out)
{
    const struct server *s = ctx;
    metrics_single(out, "kvidx_http_body_bytes_held", "gauge",
                   "Request-body bytes all connections hold now (max_total_body_bytes bounds it).",
                   s->budget.body_bytes);
}

static void on_server_handle_closed(uv_handle_t *h)
{
    struct server *s = h->data;
    if (--s->handles_open == 0) {
        metrics_unregister(s->app->metrics, server_gauges, s);
        if (s->app->server == s)
            s->app->server = NULL;
        free(s);
    }
}

/* Parses "host:port" or "[v6]:port". */
static int parse_listen(const char *text, struct sockaddr_storage *ss)
{
    char host[256];
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text)
        return KVIDX_EINVAL;
    size_t hl = (size_t)(colon - text);
    const char *h = text;
    if (text[0] == '[' && colon[-1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= sizeof(host))
        return KVIDX_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port > 65535)
        return KVIDX_EINVAL;
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    return KVIDX_EINVAL;
}

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char ip[64] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(a, ip, sizeof(ip));
        port = ntohs(a->sin6_port);
        snprintf(out, cap, "[%s]:%d", ip, port);
        return;
    }
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    uv_ip4_name(a, ip, sizeof(ip));
    port = ntohs(a->sin_port);
    snprintf(out, cap, "%s:%d", ip, port);
}

static void on_reserve(uv_poll_t *p, int status, int events)
{
    (void)p;
    (void)status;
    (void)events;
}

/* Grows libuv's descriptor table now (see the top of the file): watching a
 * descriptor numbered n-1 sizes it for n; the handle is closed at once and
 * the table keeps its size. Best effort: on any failure the table grows
 * on demand as before. */
void server_grow_fd_table(uv_loop_t *loop, uint64_t max_connections, uv_poll_t *h)
{
    uint64_t want = max_connections + MAX_REJECTING + FD_HEADROOM;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        want = rl.rlim_cur;
    if (want > 1u << 20)
        want = 1u << 20;
    int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return;
    int high = fcntl(sock, F_DUPFD_CLOEXEC, (int)want - 1);
    close(sock);
    if (high < 0)
        return;
    if (uv_poll_init_socket(loop, h, high) == 0) {
        uv_poll_start(h, UV_READABLE, on_reserve);
        uv_close((uv_handle_t *)h, NULL);
    }
    close(high);
}

int server_start(struct app *app, struct server **out, char *bound, size_t cap)
{
    struct server *s = calloc(1, sizeof(*s));
    if (!s)
        return KVIDX_ENOMEM;
    s->app = app;
    s->conns.next = s->conns.prev = &s->conns;
    uv_tcp_init(app->loop, &s->listener);
    uv_timer_init(app->loop, &s->drain_timer);
    s->listener.data = s;
    s->drain_timer.data = s;
    s->listener_open = 1;
    s->handles_open = 2;

    int rc;
    int activated = sd_listen_fds() > 0;
    if (activated) {
        rc = uv_tcp_open(&s->listener, 3);
        if (rc < 0)
            log_error("socket activation: cannot use fd 3: %s", uv_strerror(rc));
    } else {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        rc = parse_listen(app->cfg.listen, &ss);
        if (rc < 0) {
            log_error("listen: cannot parse address '%s'", app->cfg.listen);
            rc = UV_EINVAL;
        } else {
            rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
            if (rc < 0)
                log_error("listen: cannot bind %s: %s", app->cfg.listen, uv_strerror(rc));
        }
    }
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&s->listener, BACKLOG, on_connection);
        if (rc < 0)
            log_error("listen on %s: %s", app->cfg.listen, uv_strerror(rc));
    }
    if (rc < 0) {
        server_close(s);
        return KVIDX_EINVAL;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    memset(&ss, 0, sizeof(ss));
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len);
    format_addr(&ss, bound, cap);
    if (metrics_register(app->metrics, server_gauges, s) != 0)
        log_warn("metrics: cannot publish kvidx_http_body_bytes_held");
    app->server = s;
    *out = s;
    return 0;
}

static void close_listener(struct server *s)
{
    if (s->listener_open) {
        s->listener_open = 0;
        uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
    }
}

static void close_all_conns(struct server *s)
{
    while (s->conns.next != &s->conns)
        conn_close(s->conns.next->conn); /* unlinks itself */
}

static void on_drain_timeout(uv_timer_t *t)
{
    struct server *s = t->data;
    if (s->conns.next != &s->conns)
        log_warn("shutdown: closing %zu connection(s) still busy after the timeout",
                 s->nconns + s->nrejecting);
    close_all_conns(s);
}

void server_drain(struct server *s, uint64_t timeout_ms, void (*done)(struct server *s))
{
    if (s->draining)
        return;
    s->draining = 1;
    s->on_drained = done;
    close_listener(s);
    uv_timer_start(&s->drain_timer, on_drain_timeout, timeout_ms, 0);
    /* conn_drain may close (and unlink) the connection: walk a snapshot. */
    struct conn_node *n = s->conns.next;
    while (n != &s->conns) {
        struct conn_node *next = n->next;
        conn_drain(n->conn);
        n = next;
    }
    check_drained(s);
}

void server_close(struct server *s)
{
    if (s->closing)
        return;
    s->closing = 1;
    s->on_drained = NULL;
    close_listener(s);
    close_all_conns(s);
    uv_close((uv_handle_t *)&s->drain_timer, on_server_handle_closed);
}
