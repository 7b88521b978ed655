/*
 * Private to the connection: the state that conn_parse.c (llhttp callbacks,
 * request limits, dispatch), conn.c (the answer queue, serialization,
 * writes, timeouts, close) and conn_test.c (the test transport) share.
 * Nothing outside daemon/net/conn*.c includes this header; those files
 * include net/conn.h (the connection's public types) before it.
 */
#ifndef KVIDXD_CONN_INT_H
#define KVIDXD_CONN_INT_H

#include "net/http.h"

#include <llhttp.h>
#include <stdint.h>

enum {
    MAX_PIPELINE = 64,  /* queued answers before parsing pauses */
    LINGER_MS = 2000,   /* after the last answer: wait this long for EOF */
    BIG_BUF = 1u << 20, /* output buffers above this are freed, not kept */
    /* A body at least this large is handed to the socket in its own
     * buffer (an output segment) instead of being copied after its headers. */
    OWN_BODY_MIN = 16u << 10,
    OUT_SEGS = 16,  /* output segments a connection holds at most */
    HNAME_MAX = 32, /* longest header name we care about, plus room */
    EXPECT_MAX = 32,
    TE_MAX = 64, /* Transfer-Encoding kept to check its codings; longer is refused */
};

enum timer_action { T_NONE = 0, T_408, T_CLOSE };

/* The header fields the connection looks at; the others are only counted. */
enum header_kind {
    H_OTHER = 0,
    H_CONTENT_TYPE,
    H_AUTHORIZATION,
    H_EXPECT,
    H_HOST,
    H_TRANSFER_ENCODING,
};

/* One request from its first byte to its answer: owns every string the
 * handler sees (the request) and the answer being built (the response). */
struct pending {
    struct pending *next;
    struct conn *conn; /* NULL once the connection is gone */
    struct request req;
    struct response res;
    struct buf url, ct, auth, body;
    uint64_t body_charged; /* bytes this body counts in the connection's budget */
    int has_ct, has_auth;
    int head_only;
    int keep_alive;
    int http10;
    const char *route_name;
};

/* Output bytes in write order that no longer grow: a former `out` (status
 * lines, headers, small bodies) or a large body taken from its response. */
struct out_seg {
    struct buf b;
    size_t off; /* bytes of b already handed to the kernel */
};

struct conn {
    struct conn_node node;
    struct app *app;
    struct conn_host host; /* socket mode: read buffer and owner */
    int peer_family;       /* 0 unknown, 4, 6: the client's address */
    uint8_t peer_addr[16];
    struct conn_budget *budget; /* host.budget, or own_budget */
    struct conn_budget own_budget;
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

    /* Output, in write order: the segments (a ring), then `out`. The first
     * seg_writing segments are the uv_write in flight. seg_bytes counts the
     * segments' bytes not yet written (in flight included). */
    struct out_seg seg[OUT_SEGS];
    unsigned seg_first, seg_count, seg_writing;
    size_t seg_bytes;
    struct buf out;   /* serialized, not yet written; appended to */
    struct buf spare; /* an empty buffer kept for the next `out` */
    struct buf in;    /* input kept while parsing is paused */
    struct buf test_out;
    /* Test transport with deterministic writes (conn_test_set_writes):
     * output goes through start_write as on a socket; each write attempt
     * takes at most test_budget bytes, and with test_hold the rest is a
     * write in flight, its iovecs kept here until conn_test_write(). */
    int test_writes, test_hold;
    size_t test_budget;
    uv_buf_t test_wbuf[OUT_SEGS];
    unsigned test_wn;

    int writing, reading, paused, in_parse, in_pump;
    int stop_parsing; /* no further request will be parsed */
    int close_after;  /* close once `out` is written */
    int closing;
    int lingering;
    int peer_eof;
    int draining;
    int err;                /* KVIDX_E* recorded by a callback that stopped the parser */
    const char *err_detail; /* its static detail text, or NULL for the default */

    int in_message, headers_done;
    char version[4]; /* the request line's version digits, e.g. "1.1" */
    size_t version_len;
    size_t header_bytes;
    char hname[HNAME_MAX];
    size_t hname_len;
    int hname_over;
    int hname_ws; /* the name being received has a space or tab */
    int hwhich;   /* enum header_kind of the field being received */
    int nhost;    /* Host lines among the request's header fields */
    char expect[EXPECT_MAX];
    size_t expect_len;
    char te[TE_MAX]; /* Transfer-Encoding lines, joined with ',' */
    size_t te_len;
    int te_over; /* they did not fit in te */

    uint64_t nreq;      /* requests begun on this connection */
    uint64_t anchor_ms; /* accept or end of the previous answer */
    uint64_t header_deadline;
    uint64_t last_progress_ms; /* last read or completed write */
    uint64_t deadline;
    enum timer_action timer_action;
};

/* conn.c: requests and the answer queue. */
struct pending *conn_pending_new(struct conn *c); /* NULL on out of memory */
void conn_pending_free(struct pending *p);
/* Frees the request body and takes it out of the connection's budget; the
 * request then has an empty body. */
void conn_pending_drop_body(struct pending *p);
void conn_enqueue(struct conn *c, struct pending *p);
/* Queues an error answer that ends the connection: it replaces the request
 * being parsed (if any) and nothing after it is parsed. */
void conn_queue_error(struct conn *c, int err, const char *detail);
/* Bytes serialized but not yet handed to the kernel. */
size_t conn_unsent(const struct conn *c);
uint64_t conn_now_ms(const struct conn *c);
/* What the test transport (conn_test.c) drives. */
struct conn *conn_alloc(struct app *app, struct conn_budget *budget); /* NULL: out of memory */
/* Serializes what is ready, resumes parsing, writes, arms the timer; never
 * re-entered. */
void conn_pump(struct conn *c);
void conn_fire(struct conn *c, enum timer_action a);
void conn_stop_receiving(struct conn *c);
/* Frees every output buffer, a write's in flight included. */
void conn_free_output(struct conn *c);
/* The uv_write callback. */
void conn_on_write(uv_write_t *r, int status);

/* conn_parse.c: bytes in, requests dispatched. */
/* Initializes c->parser with the shared callback table. */
void conn_parser_init(struct conn *c);
/* Runs the parser over data; on pause keeps the rest in c->in. */
void conn_parse(struct conn *c, const char *data, size_t n);
/* 1 when parsing was paused and may go on now. */
int conn_can_resume(const struct conn *c);
/* Parses what was kept in c->in while paused. */
void conn_resume_parse(struct conn *c);

#endif
