/*
 * A hiredis asynchronous context on a libuv loop: one uv_poll_t per
 * context, watching for what hiredis asks (addRead/addWrite/del...).
 *
 * Why our own: the adapter hiredis 0.14 ships returns at once when the
 * poll reports an error, and libuv has stopped the poll by then, so a
 * connect refused by a server that is not listening yet (a restart) is
 * never reported: the context waits forever. Here an error is passed on as
 * "readable and writable", so hiredis finds it (SO_ERROR while connecting,
 * a failed read after), runs its callbacks and frees the context.
 *
 * The adapter also reads the socket itself, in place of
 * redisAsyncHandleRead, because hiredis (0.14) aborts the process with an
 * assert() on some server input before any of our callbacks sees it: a
 * reply that no command is waiting for on a connection that is not
 * subscribed, and, once subscribed, a reply array of fewer than two
 * elements, whose kind or channel is not a bulk string, or an unsubscribe
 * message without an integer count. So every read is fed first to a
 * shadow reader owned by the adapter, and each complete reply in it is
 * checked against what the context can take at that point; only when all
 * of them pass are the same bytes fed to hiredis' reader and its callbacks
 * run. Any other input is a protocol error: it goes the way a failed read
 * goes (hiredis disconnects, runs every callback with a NULL reply, calls
 * the disconnect callback with the reason in errstr, frees the context).
 * The price is that replies on these connections are parsed twice.
 *
 * Invariants: p->ac is NULL from the moment hiredis cleans up, and p is
 * freed only in the handle's close callback, so a poll callback never
 * touches a freed context; both readers see the same bytes in the same
 * order, so a reply cut across reads is completed alike in both.
 */
#include "sources/redis_uv.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* hiredis 0.14 exports this (redisAsyncHandleRead's second half) without
 * declaring it; later versions declare it in async.h alike. */
void redisProcessCallbacks(redisAsyncContext *ac);

/* What hiredis reads at once (redisBufferRead's buffer). */
#define READ_SIZE 16384

struct redis_uv {
    redisAsyncContext *ac;
    redisReader *shadow;
    uv_poll_t poll;
    int events;
};

/* Hands the context an error and lets hiredis act on it: its read then
 * fails at once (a context with an error reads nothing), and it
 * disconnects as it does after any failed read. */
static void fail(redisAsyncContext *ac, int type, const char *why)
{
    ac->c.err = type;
    snprintf(ac->c.errstr, sizeof(ac->c.errstr), "%s", why);
    redisAsyncHandleRead(ac);
}

static size_t count_pending(const redisAsyncContext *ac)
{
    size_t k = 0;
    for (const redisCallback *cb = ac->replies.head; cb; cb = cb->next)
        k++;
    return k;
}

struct view {
    size_t pending; /* replies that commands already sent are waiting for */
    int subscribed; /* hiredis' REDIS_SUBSCRIBED, as it will be */
    int done;       /* hiredis stops at this reply (an error it disconnects on) */
};

/* NULL when hiredis takes reply r without aborting, given what v says the
 * context is waiting for; else why not. v is updated as hiredis updates
 * its own state for r. Stricter than hiredis where real servers never
 * differ: every message pushed to a subscribed context has at least three
 * elements. */
static const char *judge(struct view *v, const redisReply *r)
{
    if (v->done)
        return NULL;
    if (v->pending) {
        v->pending--;
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        /* Without a command waiting, hiredis disconnects on an error. */
        v->done = 1;
        return NULL;
    }
    if (!v->subscribed)
        return "protocol error: a reply that no command asked for";
    if (r->type != REDIS_REPLY_ARRAY)
        return NULL;
    if (r->elements < 3)
        return "protocol error: a pushed message of fewer than three elements";
    if (r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return "protocol error: a pushed message whose kind or channel is not a string";
    /* hiredis' own test: "p" first names the pattern variant. */
    const char *kind = r->element[0]->str;
    kind += tolower((unsigned char)kind[0]) == 'p';
    if (strcasecmp(kind, "unsubscribe") == 0) {
        if (r->element[2]->type != REDIS_REPLY_INTEGER)
            return "protocol error: an unsubscribe message without a count";
        /* A count of 0 may end the subscribed state: replies after it then
         * need a command waiting. */
        if (r->element[2]->integer == 0)
            v->subscribed = 0;
    }
    return NULL;
}

/* Feeds buf to the shadow reader and checks every reply it completes;
 * NULL when hiredis may be given buf. */
static const char *check(struct redis_uv *p, const char *buf, size_t n)
{
    const redisAsyncContext *ac = p->ac;
    if (ac->c.flags & REDIS_MONITORING)
        return NULL;
    struct view v = {count_pending(ac), (ac->c.flags & REDIS_SUBSCRIBED) != 0, 0};
    if (redisReaderFeed(p->shadow, buf, n) != REDIS_OK)
        return p->shadow->errstr;
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(p->shadow, &r) != REDIS_OK)
            return p->shadow->errstr;
        if (!r)
            return NULL;
        const char *why = judge(&v, r);
        freeReplyObject(r);
        if (why)
            return why;
    }
}

/* redisAsyncHandleRead, with the check between the read and the reader. */
static void handle_read(struct redis_uv *p)
{
    redisAsyncContext *ac = p->ac;
    if (!(ac->c.flags & REDIS_CONNECTED)) {
        /* hiredis completes a connect in either handler; the write one
         * reads nothing, and sends what is queued once connected. */
        redisAsyncHandleWrite(ac);
        if (!p->ac || !(ac->c.flags & REDIS_CONNECTED))
            return;
    }
    if (ac->c.err) {
        redisAsyncHandleRead(ac);
        return;
    }
    char buf[READ_SIZE];
    ssize_t n = read(ac->c.fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n < 0) {
        fail(ac, REDIS_ERR_IO, strerror(errno));
        return;
    }
    if (n == 0) {
        fail(ac, REDIS_ERR_EOF, "Server closed the connection");
        return;
    }
    const char *why = check(p, buf, (size_t)n);
    if (why) {
        fail(ac, REDIS_ERR_PROTOCOL, why);
        return;
    }
    if (redisReaderFeed(ac->c.reader, buf, (size_t)n) != REDIS_OK) {
        fail(ac, ac->c.reader->err, ac->c.reader->errstr);
        return;
    }
    redisProcessCallbacks(ac);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct redis_uv *p = h->data;
    if (status < 0)
        events = UV_READABLE | UV_WRITABLE;
    if (p->ac && (events & UV_READABLE))
        handle_read(p);
    if (p->ac && (events & UV_WRITABLE))
        redisAsyncHandleWrite(p->ac);
    /* libuv stops a poll that reported an error; one that hiredis kept
     * watches again. */
    if (status < 0 && p->ac && p->events)
        uv_poll_start(&p->poll, p->events, on_poll);
}

static void set_events(struct redis_uv *p, int events)
{
    p->events = events;
    if (events)
        uv_poll_start(&p->poll, events, on_poll);
    else
        uv_poll_stop(&p->poll);
}

static void add_read(void *priv)
{
    struct redis_uv *p = priv;
    set_events(p, p->events | UV_READABLE);
}

static void del_read(void *priv)
{
    struct redis_uv *p = priv;
    set_events(p, p->events & ~UV_READABLE);
}

static void add_write(void *priv)
{
    struct redis_uv *p = priv;
    set_events(p, p->events | UV_WRITABLE);
}

static void del_write(void *priv)
{
    struct redis_uv *p = priv;
    set_events(p, p->events & ~UV_WRITABLE);
}

static void on_closed(uv_handle_t *h)
{
    struct redis_uv *p = h->data;
    redisReaderFree(p->shadow);
    free(p);
}

static void cleanup(void *priv)
{
    struct redis_uv *p = priv;
    if (!p->ac)
        return;
    p->ac = NULL;
    uv_close((uv_handle_t *)&p->poll, on_closed);
}

int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data)
        return -1;
    struct redis_uv *p = calloc(1, sizeof(*p));
    if (!p)
        return -1;
    p->shadow = redisReaderCreate();
    if (!p->shadow || uv_poll_init(loop, &p->poll, ac->c.fd) != 0) {
        if (p->shadow)
            redisReaderFree(p->shadow);
        free(p);
        return -1;
    }
    p->poll.data = p;
    p->ac = ac;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    ac->ev.data = p;
    return 0;
}
