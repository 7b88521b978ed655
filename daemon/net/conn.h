/*
 * One HTTP/1.1 client connection: llhttp parsing, request limits, the
 * ordered queue of answers (pipelining), batched writes, timeouts and the
 * close sequence.
 *
 * A connection runs either on a libuv TCP handle (conn_new, created by
 * server.c) or on the "test transport" (conn_new_test): bytes are fed with
 * conn_feed() and the serialized answers collect in a buffer, so the whole
 * parse → route → handler → serialize path runs without a socket (unit
 * tests, fuzzing).
 */
#ifndef KVIDXD_CONN_H
#define KVIDXD_CONN_H

#include "util/json_write.h"

#include <stddef.h>
#include <uv.h>

struct app;
struct conn;

/* Intrusive list node the server uses to find its connections. */
struct conn_node {
    struct conn_node *prev, *next;
    struct conn *conn;
    int rejected; /* accepted past max_connections: answered 503, closing */
};

/* The request-body bytes held in memory by a set of connections, bounded
 * by max_total_body_bytes. A body announced with Content-Length counts in
 * full once its headers are in; a chunked one counts as it arrives. A body
 * stops counting when it is freed: when its handler has answered (or, for
 * a deferred answer, when the answer is sent), or when its connection
 * closes. */
struct conn_budget {
    uint64_t body_bytes;
};

/* What a socket connection needs from whoever accepted it: the read
 * buffer it may use (the loop is single-threaded and connections consume
 * reads synchronously, so one buffer serves them all), the body budget it
 * shares with the other connections (NULL: one of its own), and the call
 * that tells the owner the connection is gone (once, when closing starts).
 * The budget must outlive the connection's pending requests, which are
 * freed when conn_close() is called. */
struct conn_host {
    char *read_buf;
    size_t read_cap;
    struct conn_budget *budget;
    void (*gone)(void *ctx, struct conn_node *n);
    void *ctx;
};

/* Socket mode. Allocates a connection and initializes its TCP handle on the
 * app's loop (the caller uv_accept()s into conn_stream()). host is copied.
 * NULL on out of memory. The connection frees itself once closed. */
struct conn *conn_new(struct app *app, const struct conn_host *host);
uv_stream_t *conn_stream(struct conn *c);
struct conn_node *conn_node(struct conn *c);
/* Starts reading and the header timer (after uv_accept succeeded). */
void conn_start(struct conn *c);
/* Answers err (e.g. KVIDX_ECONNLIMIT) as problem+json and closes. */
void conn_reject(struct conn *c, int err);
/* Graceful: answers what was already received, then closes. */
void conn_drain(struct conn *c);
/* Immediate: cancels deferred answers, closes the handles; memory is freed
 * in the close callbacks. Idempotent. */
void conn_close(struct conn *c);

/* Test transport. The connection never touches a loop (app->loop may be
 * NULL) and timeouts only happen through conn_test_fire_timer(). */
struct conn *conn_new_test(struct app *app);
/* The same, counting its request bodies in budget, which the caller owns
 * and may share between test connections. */
struct conn *conn_new_test_shared(struct app *app, struct conn_budget *budget);
/* Feeds bytes; answers ready so far are appended to conn_test_output().
 * Returns 1 once the connection has closed (later bytes are ignored), else 0. */
int conn_feed(struct conn *c, const char *data, size_t n);
/* The peer closed its side. Returns 1 once closed. */
int conn_feed_eof(struct conn *c);
/* Acts as if the connection's timer had expired (header timeout → 408). */
int conn_test_fire_timer(struct conn *c);
struct buf *conn_test_output(struct conn *c);
int conn_test_closed(const struct conn *c);
/* Number of answers waiting (deferred or queued behind one). */
size_t conn_test_queued(const struct conn *c);
void conn_free_test(struct conn *c);

/* Test transport, deterministic writes. By default every answer is
 * "written" whole as soon as it is serialized. From this call on, output
 * takes the socket's write path instead: each write attempt (the socket's
 * uv_try_write) takes at most budget bytes (at most INT_MAX; 0: none),
 * in order, into conn_test_output(). Without hold, what it leaves stays
 * unsent until the next conn_test_write(); with hold, it becomes a write
 * in flight (the socket's uv_write) whose buffers the connection must keep
 * until conn_test_write() completes it, as its callback would. Call before
 * the first bytes are fed. */
void conn_test_set_writes(struct conn *c, size_t budget, int hold);
/* Completes the write in flight, if any, else makes one more write
 * attempt; then goes on as the connection would (serializes, parses what
 * waited, writes again). Returns 1 once the connection has closed. */
int conn_test_write(struct conn *c);
/* What the output holds right now. */
struct conn_test_out {
    size_t unsent;     /* serialized, not yet written (in flight included) */
    unsigned segs;     /* output segments held */
    unsigned segs_max; /* most the connection holds */
    unsigned writing;  /* of them, the write in flight's */
    size_t out_len;    /* bytes serialized behind the segments */
    size_t mem;        /* capacity of every output buffer, the spare included */
};
void conn_test_out_state(const struct conn *c, struct conn_test_out *st);

#endif
