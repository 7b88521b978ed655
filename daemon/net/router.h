/*
 * Method + path table → handler. A pattern is a literal path, optionally
 * with one '*' that matches one or more bytes (percent-decoded into
 * req->route_param; for "/v1/keys/{canonical}" the rest of the path, '/' included).
 * An encoded NUL there is refused with 400 invalid_argument, unless the
 * wildcard is written '#': then route_param may hold NUL bytes and the
 * handler judges it by route_param_len.
 * Unknown path → 404 not_found; known path, other method → 405 with Allow.
 */
#ifndef KVIDXD_ROUTER_H
#define KVIDXD_ROUTER_H

#include "net/http.h"

typedef int (*handler_fn)(const struct request *req, struct response *res);

struct route {
    enum http_method method;
    const char *pattern; /* "/v1/layouts", "/v1/prefetches/ *" without the space */
    handler_fn fn;
    const char *name; /* metrics label, e.g. "keys_get" */
};

/* Finds the handler for req and runs it. Fills res for 404/405 itself.
 * route_name (may be NULL) receives the matched route's metrics label
 * ("unknown" when nothing matched). Returns what the handler returned. */
int router_dispatch(struct request *req, struct response *res, const char **route_name);

/* Sets the NULL-terminated list of route tables the router matches
 * against (the composition root hands over the API's; tests register their
 * own). NULL leaves no route: every path answers 404. */
void router_use_tables(const struct route *const *tables);

#endif
