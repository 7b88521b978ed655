/*
 * The test transport (see conn.h): a connection without a socket or a
 * loop, fed with conn_feed(), whose output collects in test_out. By
 * default conn.c hands it every answer whole as it is serialized; after
 * conn_test_set_writes() conn.c writes through its socket path and this
 * file plays the kernel: it completes a write held in flight (appending
 * the iovecs conn.c handed over, which must still be valid) and reports
 * what the output holds. Only tests and fuzzers use it.
 */
#include "net/conn.h"
#include "net/conn_int.h"

#include <limits.h>
#include <stdlib.h>

struct conn *conn_new_test_shared(struct app *app, struct conn_budget *budget)
{
    struct conn *c = conn_alloc(app, budget);
    if (c)
        c->test = 1;
    return c;
}

struct conn *conn_new_test(struct app *app)
{
    return conn_new_test_shared(app, NULL);
}

int conn_feed(struct conn *c, const char *data, size_t n)
{
    if (!c->closing) {
        conn_parse(c, data, n);
        conn_pump(c);
    }
    return c->closing;
}

int conn_feed_eof(struct conn *c)
{
    if (!c->closing) {
        c->peer_eof = 1;
        conn_stop_receiving(c);
        conn_pump(c);
    }
    return c->closing;
}

int conn_test_fire_timer(struct conn *c)
{
    if (!c->closing) {
        if (c->qhead)
            return 0;
        conn_fire(c, (c->in_message || c->nreq == 0) ? T_408 : T_CLOSE);
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

void conn_test_set_writes(struct conn *c, size_t budget, int hold)
{
    c->test_writes = 1;
    c->test_budget = budget < INT_MAX ? budget : INT_MAX;
    c->test_hold = hold;
}

int conn_test_write(struct conn *c)
{
    if (c->closing || !c->test_writes)
        return c->closing;
    if (c->writing) {
        for (unsigned i = 0; i < c->test_wn; i++)
            buf_append(&c->test_out, c->test_wbuf[i].base, c->test_wbuf[i].len);
        c->test_wn = 0;
        conn_on_write(&c->wreq, 0);
    } else {
        conn_pump(c);
    }
    return c->closing;
}

void conn_test_out_state(const struct conn *c, struct conn_test_out *st)
{
    st->unsent = conn_unsent(c);
    st->segs = c->seg_count;
    st->segs_max = OUT_SEGS;
    st->writing = c->seg_writing;
    st->out_len = c->out.len;
    st->mem = c->out.cap + c->spare.cap;
    for (unsigned i = 0; i < c->seg_count; i++)
        st->mem += c->seg[(c->seg_first + i) % OUT_SEGS].b.cap;
}

void conn_free_test(struct conn *c)
{
    if (!c)
        return;
    conn_close(c);
    conn_free_output(c);
    buf_free(&c->in);
    buf_free(&c->test_out);
    free(c);
}
