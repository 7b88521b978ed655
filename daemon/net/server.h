/*
 * The listening socket and the set of live connections: accept (with the
 * max_connections limit and EMFILE survival), graceful drain bounded by
 * shutdown_timeout_ms, and closing every handle it owns.
 */
#ifndef KVIDXD_SERVER_H
#define KVIDXD_SERVER_H

#include "net/conn.h"

#include <stddef.h>

struct app;
struct server;

/* Binds cfg.listen (or takes fd 3 under socket activation) and listens.
 * Writes the address actually bound ("127.0.0.1:40123") into bound.
 * Returns 0 or a negative KVIDX_E* (the reason is logged). */
int server_start(struct app *app, struct server **out, char *bound, size_t cap);
/* Sizes libuv's descriptor table for max_connections (and the descriptors
 * beside them) at once, with h as a short-lived handle: libuv aborts when
 * growing it later fails, so it is grown at start, before any file is made.
 * Best effort. */
void server_grow_fd_table(uv_loop_t *loop, uint64_t max_connections, uv_poll_t *h);
/* Stops accepting, lets each connection finish what it has received, and
 * calls done once every connection is gone or timeout_ms has passed (then
 * the remaining ones are closed). */
void server_drain(struct server *s, uint64_t timeout_ms, void (*done)(struct server *s));
/* Closes the listener and every connection now; the server frees itself
 * in its close callbacks. */
void server_close(struct server *s);
size_t server_connections(const struct server *s);

#endif
