/*
 * Runs a hiredis asynchronous context on a libuv loop (the Redis sources'
 * own adapter, in place of hiredis' adapters/libuv.h).
 */
#ifndef KVIDXD_REDIS_UV_H
#define KVIDXD_REDIS_UV_H

#include <uv.h>

struct redisAsyncContext;

/* Attaches ac to loop: hiredis then reads and writes when the socket is
 * ready, and learns of a socket error (a refused connect, a reset) as soon
 * as the loop reports it. The uv handle is closed, and its memory freed in
 * the close callback, when hiredis frees ac. 0, or -1 (ac already attached,
 * out of memory, or the loop refuses the socket; ac is then the caller's
 * to free). */
int redis_uv_attach(struct redisAsyncContext *ac, uv_loop_t *loop);

#endif
