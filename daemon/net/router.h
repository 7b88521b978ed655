/*
 * Method + path table → handler. A pattern is a literal path, optionally
 * with one '*' that matches one or more bytes (percent-decoded into
 * req->route_param; for "/v1/keys/{canonical}" the rest of the path, '/' included).
 * An encoded NUL there is refused with 400 invalid_argument, unless the
 * wildcard is written '#': then route_param may hold NUL bytes and the
 * handler judges it by route_param_len.
 * Unknown path → 404 not_found; known path, other method → 405 with Allow.
 * With an access check installed, a request without a valid token gets
 * 401 before either, and one whose token's role is too low 403.
 */
#ifndef KVIDXD_ROUTER_H
#define KVIDXD_ROUTER_H

#include "net/http.h"

typedef int (*handler_fn)(const struct request *req, struct response *res);

/* Who may use a route when bearer tokens are on (auth_tokens_file): the
 * role a token needs (read < write < admin). The rule every route follows:
 * reads (GET, lookups, the directory's reads) need read; stores, deletes,
 * prefetch handles, load reports, ingest and instance changes need write;
 * configuration (layouts) needs admin. Only liveness and readiness are
 * open. The zero value is the strictest, so a route that says nothing
 * needs admin. */
enum route_access {
    ROUTE_ADMIN = 0,
    ROUTE_WRITE,
    ROUTE_READ,
    ROUTE_OPEN,        /* no token at all */
    ROUTE_INGEST,      /* write, or no token from an ingest_allow_from network */
    ROUTE_INGEST_READ, /* read, or no token from an ingest_allow_from network */
};

struct route {
    enum http_method method;
    const char *pattern; /* "/v1/layouts", "/v1/prefetches/ *" without the space */
    handler_fn fn;
    const char *name; /* metrics label, e.g. "keys_get" */
    enum route_access access;
};

/* The access check, installed by the composition root (state/auth.c) when
 * tokens are on. It runs for every request whose path no open route
 * matches, before 404 and 405 (so that an unknown path does not tell a
 * caller without a token which routes exist), with the route that would
 * run, or NULL when none would (the guard then only authenticates). It
 * returns 0 to let the request go on, after pointing req->principal at
 * what the token grants, or nonzero after answering in res (401, 403). */
typedef int (*route_guard_fn)(void *ctx, struct request *req, struct response *res,
                              const struct route *route);

/* Finds the handler for req and runs it. Fills res for 404/405 itself.
 * route_name (may be NULL) receives the matched route's metrics label
 * ("unknown" when nothing matched). Returns what the handler returned. */
int router_dispatch(struct request *req, struct response *res, const char **route_name);

/* Sets the NULL-terminated list of route tables the router matches
 * against (the composition root hands over the API's; tests register their
 * own). NULL leaves no route: every path answers 404. */
void router_use_tables(const struct route *const *tables);

/* Installs the access check (NULL: none, every request is unrestricted and
 * req->principal stays NULL). */
void router_use_guard(route_guard_fn fn, void *ctx);

#endif
