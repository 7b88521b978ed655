/*
 * The Redis/Valkey source against a fake server in the same process: the
 * real source (redis:// or, with bit 0 of the first byte, redis+cluster://;
 * bit 1 adds ?prefix=lmc) connects over loopback to a libuv listener that
 * reads its commands with hiredis's reader and answers them, so every
 * reply goes through hiredis's async reader into the source's own
 * callbacks: CLIENT ID, SUBSCRIBE confirmations, CONFIG GET, CLUSTER SLOTS,
 * SCAN pages, STRLEN answers and the keyevent notifications pushed on the
 * subscriber connection.
 *
 * The rest of the input is a script of [kind][2-byte little-endian
 * length][bytes] entries: the bytes are sent, unchecked, as the answer to
 * the next command of that kind (0 SCAN, 1 STRLEN, 2 CONFIG GET, 3 CLUSTER
 * SLOTS, 5 CLIENT ID, 6 SUBSCRIBE, 7 DBSIZE) or, for kind 4, pushed to the
 * subscriber connection once it has subscribed. A command without a
 * scripted answer gets a well-formed default (an empty last SCAN page,
 * STRLEN 4, notifications "AE", one slot range on this server), so a
 * script only has to say what differs. The loop runs until the fake server
 * has heard nothing for a few turns (bounded); then the key index must
 * pass its consistency check, and the source must stop, close every
 * handle (the loop then ends) and free cleanly (leaks are LeakSanitizer's).
 * KVIDX_FUZZ_TRACE prints the conversation and the keys the source holds.
 */
#include "app.h"
#include "state/keystore.h"
#include "state/sources.h"
#include "util/config.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/index.h"

#include <hiredis/hiredis.h>
#include <uv.h>

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KINDS     8
#define K_PUSH    4
#define MAX_CONNS 8
#define MAX_TURNS 400

static void check(int ok)
{
    if (!ok)
        abort();
}

struct entry {
    const uint8_t *p;
    size_t n;
};

/* The script, per kind, in input order. */
static struct entry script[KINDS][16];
static size_t nscript[KINDS], used[KINDS];

struct fconn {
    uv_tcp_t tcp;
    redisReader *rd;
    int open;
};

static struct app app;
static uv_loop_t loop;
static uv_tcp_t server;
static int port;
static struct fconn conns[MAX_CONNS];
static int activity;
static int trace; /* KVIDX_FUZZ_TRACE: print the conversation */

static void on_written(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

static void send_bytes(struct fconn *c, const void *p, size_t n)
{
    if (!c->open || n == 0)
        return;
    if (trace)
        fprintf(stderr, "conn %d <- %.*s\n", (int)(c - conns), (int)(n < 60 ? n : 60),
                (const char *)p);
    uv_write_t *w = malloc(sizeof(*w) + n);
    if (!w)
        return;
    memcpy(w + 1, p, n);
    uv_buf_t b = uv_buf_init((char *)(w + 1), (unsigned)n);
    if (uv_write(w, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0)
        free(w);
}

static void sendf(struct fconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sendf(struct fconn *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        send_bytes(c, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/* Sends the next scripted answer of kind k, unchecked (several values, a
 * value cut short, values no command asked for and shapes hiredis itself
 * asserts on: the source must turn all of them into a protocol error of
 * the node, never a crash); 0 when there is none. */
static int scripted(struct fconn *c, int k)
{
    if (used[k] == nscript[k])
        return 0;
    struct entry *e = &script[k][used[k]++];
    send_bytes(c, e->p, e->n);
    return 1;
}

static int is(const redisReply *r, size_t i, const char *s)
{
    return r->elements > i && r->element[i]->type == REDIS_REPLY_STRING &&
           strlen(s) == r->element[i]->len &&
           strncasecmp(r->element[i]->str, s, r->element[i]->len) == 0;
}

static void answer(struct fconn *c, const redisReply *r)
{
    if (trace && r->type == REDIS_REPLY_ARRAY && r->elements)
        fprintf(stderr, "conn %d: %.*s %.*s\n", (int)(c - conns), (int)r->element[0]->len,
                r->element[0]->str, r->elements > 1 ? (int)r->element[1]->len : 0,
                r->elements > 1 ? r->element[1]->str : "");
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        sendf(c, "-ERR protocol\r\n");
        return;
    }
    if (is(r, 0, "SCAN")) {
        if (!scripted(c, 0))
            sendf(c, "*2\r\n$1\r\n0\r\n*0\r\n");
    } else if (is(r, 0, "STRLEN")) {
        if (!scripted(c, 1))
            sendf(c, ":4\r\n");
    } else if (is(r, 0, "CONFIG") && is(r, 1, "GET")) {
        if (!scripted(c, 2))
            sendf(c, "*2\r\n$22\r\nnotify-keyspace-events\r\n$2\r\nAE\r\n");
    } else if (is(r, 0, "CLUSTER")) {
        if (!scripted(c, 3))
            sendf(c, "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$2\r\nid\r\n",
                  port);
    } else if (is(r, 0, "CLIENT") && is(r, 1, "ID")) {
        if (!scripted(c, 5))
            sendf(c, ":%d\r\n", (int)(c - conns) + 1);
    } else if (is(r, 0, "SUBSCRIBE")) {
        if (!scripted(c, 6))
            for (size_t i = 1; i < r->elements; i++)
                sendf(c, "*3\r\n$9\r\nsubscribe\r\n$%zu\r\n%.*s\r\n:%zu\r\n", r->element[i]->len,
                      (int)r->element[i]->len, r->element[i]->str, i);
        while (scripted(c, K_PUSH))
            ;
    } else if (is(r, 0, "DBSIZE")) {
        if (!scripted(c, 7))
            sendf(c, ":0\r\n");
    } else if (is(r, 0, "PUBLISH")) {
        sendf(c, ":1\r\n");
    } else if (is(r, 0, "CLIENT") || is(r, 0, "SELECT") || is(r, 0, "AUTH") || is(r, 0, "ASKING")) {
        sendf(c, "+OK\r\n");
    } else {
        sendf(c, "-ERR unknown command\r\n");
    }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    (void)h;
    (void)hint;
    static char buf[65536];
    *b = uv_buf_init(buf, sizeof(buf));
}

static void on_conn_closed(uv_handle_t *h)
{
    struct fconn *c = h->data;
    redisReaderFree(c->rd);
    c->rd = NULL;
}

static void close_conn(struct fconn *c)
{
    if (c->open) {
        c->open = 0;
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct fconn *c = s->data;
    activity = 1;
    if (n < 0) {
        close_conn(c);
        return;
    }
    if (n == 0)
        return;
    if (redisReaderFeed(c->rd, b->base, (size_t)n) != REDIS_OK) {
        close_conn(c);
        return;
    }
    void *r;
    while (c->open && redisReaderGetReply(c->rd, &r) == REDIS_OK && r) {
        answer(c, r);
        freeReplyObject(r);
    }
}

static void on_spare_closed(uv_handle_t *h)
{
    free(h);
}

static void on_connection(uv_stream_t *srv, int status)
{
    if (status != 0)
        return;
    activity = 1;
    struct fconn *c = NULL;
    for (int i = 0; i < MAX_CONNS && !c; i++)
        if (!conns[i].open && !conns[i].rd)
            c = &conns[i];
    if (!c) {
        /* No room: accept and close at once (the source sees a reset). */
        uv_tcp_t *t = malloc(sizeof(*t));
        check(t != NULL);
        uv_tcp_init(&loop, t);
        uv_accept(srv, (uv_stream_t *)t);
        uv_close((uv_handle_t *)t, on_spare_closed);
        return;
    }
    memset(c, 0, sizeof(*c));
    c->rd = redisReaderCreate();
    check(c->rd != NULL);
    uv_tcp_init(&loop, &c->tcp);
    c->tcp.data = c;
    c->open = 1;
    /* Without TCP_NODELAY each small answer waits for a delayed ACK. */
    if (uv_accept(srv, (uv_stream_t *)&c->tcp) != 0 || uv_tcp_nodelay(&c->tcp, 1) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        close_conn(c);
}

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

/* A listener per input, closed with everything else at its end, so that
 * the loop can run until every handle is closed, as the daemon's does
 * before it frees the subsystems. */
static void listen_fresh(void)
{
    struct sockaddr_in a;
    check(uv_ip4_addr("127.0.0.1", 0, &a) == 0);
    check(uv_tcp_init(&loop, &server) == 0);
    check(uv_tcp_bind(&server, (const struct sockaddr *)&a, 0) == 0);
    check(uv_listen((uv_stream_t *)&server, 16, on_connection) == 0);
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    check(uv_tcp_getsockname(&server, (struct sockaddr *)&ss, &len) == 0);
    port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!app.metrics) {
        trace = getenv("KVIDX_FUZZ_TRACE") != NULL;
        config_defaults(&app.cfg);
        log_setup(trace ? LOG_DEBUG : LOG_ERROR, LOG_TEXT);
        app.metrics = metrics_new();
        app.ready = 1;
        check(uv_loop_init(&loop) == 0);
        app.loop = &loop;
    }
    if (size == 0)
        return 0;
    unsigned plan = data[0];
    memset(nscript, 0, sizeof(nscript));
    memset(used, 0, sizeof(used));
    for (size_t off = 1; size - off >= 3;) {
        int k = data[off] % KINDS;
        size_t n = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
        off += 3;
        if (n > size - off)
            n = size - off;
        if (nscript[k] < sizeof(script[k]) / sizeof(script[k][0]))
            script[k][nscript[k]++] = (struct entry){data + off, n};
        off += n;
    }
    listen_fresh();
    snprintf(app.cfg.l2_source, sizeof(app.cfg.l2_source), "%s://127.0.0.1:%d%s",
             plan & 1 ? "redis+cluster" : "redis", port, plan & 2 ? "?prefix=lmc" : "");
    if (subsystems_init(&app) != 0) {
        /* A source that cannot start stops the start; nothing to fuzz. */
        uv_close((uv_handle_t *)&server, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
        return 0;
    }
    /* Until the fake server has heard nothing for a few turns: a turn
     * waits at most a millisecond (the tick) for the getaddrinfo thread
     * and the sockets. */
    uv_timer_t tick;
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick, 1, 1);
    int quiet = 0;
    for (int i = 0; i < MAX_TURNS && quiet < 8; i++) {
        activity = 0;
        uv_run(&loop, UV_RUN_ONCE);
        quiet = activity ? 0 : quiet + 1;
    }
    check(kvidx_index_check(app.keystore->idx) == 0);
    if (trace) {
        kvidx_index_stats_t st;
        kvidx_index_stats(app.keystore->idx, &st);
        fprintf(stderr, "source keys: %llu, ready: %d\n", (unsigned long long)st.l2_source_keys,
                sources_ready(&app));
    }
    uv_close((uv_handle_t *)&tick, NULL);
    subsystems_stop(&app);
    for (int i = 0; i < MAX_CONNS; i++)
        close_conn(&conns[i]);
    uv_close((uv_handle_t *)&server, NULL);
    /* Until every handle is closed (a getaddrinfo in flight included); a
     * handle the source forgot to close hangs here, a finding. */
    uv_run(&loop, UV_RUN_DEFAULT);
    subsystems_free(&app);
    return 0;
}
