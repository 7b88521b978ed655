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
 * Invariants: p->ac is NULL from the moment hiredis cleans up, and p is
 * freed only in the handle's close callback, so a poll callback never
 * touches a freed context.
 */
#include "sources/redis_uv.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>

struct redis_uv {
    redisAsyncContext *ac;
    uv_poll_t poll;
    int events;
};

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct redis_uv *p = h->data;
    if (status < 0)
        events = UV_READABLE | UV_WRITABLE;
    if (p->ac && (events & UV_READABLE))
        redisAsyncHandleRead(p->ac);
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
    free(h->data);
}

static void cleanup(void *priv)
{
    struct redis_uv *p = priv;
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
    if (uv_poll_init(loop, &p->poll, ac->c.fd) != 0) {
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
