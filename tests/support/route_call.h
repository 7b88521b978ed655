/* One request through the daemon's router without a socket, for the tests
 * of handlers: the request is built from a method, a target (path and
 * query) and an optional body and Authorization value. Header-only: each
 * test file that includes it gets its own copy. */
#ifndef KVIDX_TEST_ROUTE_CALL_H
#define KVIDX_TEST_ROUTE_CALL_H

#include "net/router.h"
#include "util/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct call {
    struct request req;
    struct response res;
    char scratch[1024];
    char path[512];
    int rc; /* what the router returned (HANDLER_ASYNC for a deferred answer) */
};

static inline enum http_method route_call_method(const char *method)
{
    return strcmp(method, "GET") == 0      ? M_GET
           : strcmp(method, "HEAD") == 0   ? M_HEAD
           : strcmp(method, "PUT") == 0    ? M_PUT
           : strcmp(method, "POST") == 0   ? M_POST
           : strcmp(method, "DELETE") == 0 ? M_DELETE
                                           : M_OTHER;
}

/* Builds the request and runs it through the router; free with call_free. */
static inline struct call *route_call(struct app *app, const char *method, const char *target,
                                      const char *auth, const char *body)
{
    struct call *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    snprintf(c->path, sizeof(c->path), "%s", target);
    char *q = strchr(c->path, '?');
    c->req.query = "";
    if (q) {
        *q = '\0';
        c->req.query = q + 1;
        c->req.query_len = strlen(q + 1);
        c->req.has_query = 1;
    }
    c->req.method = route_call_method(method);
    c->req.method_name = method;
    c->req.path = c->path;
    c->req.path_len = strlen(c->path);
    c->req.body = body ? body : "";
    c->req.body_len = body ? strlen(body) : 0;
    c->req.content_type = "application/json";
    c->req.authorization = auth;
    c->req.app = app;
    c->req.scratch = c->scratch;
    c->req.scratch_cap = sizeof(c->scratch);
    c->req.http_major = c->req.http_minor = 1;
    buf_init(&c->res.body);
    c->res.status = 200;
    c->rc = router_dispatch(&c->req, &c->res, NULL);
    return c;
}

static inline void call_free(struct call *c)
{
    buf_free(&c->res.body);
    free(c);
}

#endif
