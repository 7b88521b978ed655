/*
 * The request and response that handlers see. Handlers are plain functions
 *
 *     int api_x(const struct request *req, struct response *res);
 *
 * picked by router.c from a method+path table, so they can be driven by a
 * test with a fake request and no socket. A handler fills res (status,
 * body) and returns 0; it may instead return HANDLER_ASYNC after calling
 * res_defer(), and complete later with res_complete() (long polls).
 *
 * All request strings are NUL-terminated copies owned by the connection
 * and valid until the response has been completed.
 */
#ifndef KVIDXD_HTTP_H
#define KVIDXD_HTTP_H

#include "util/json_write.h"
#include "util/params.h"

#include "kvidx/tokens.h"

#include <stddef.h>
#include <stdint.h>

struct app;

enum http_method { M_GET = 0, M_HEAD, M_PUT, M_POST, M_DELETE, M_OTHER, M_COUNT };

struct request {
    enum http_method method;
    const char *method_name; /* "GET", ... (for logs) */
    const char *path;        /* raw path, no query; e.g. "/v1/keys/m%2Fx@..." */
    size_t path_len;
    const char *query; /* after '?', "" when none */
    size_t query_len;
    int has_query;
    const char *body; /* "" when none */
    size_t body_len;
    const char *content_type;  /* header value or NULL */
    const char *authorization; /* header value or NULL */
    /* The client's address as the socket reports it; peer_family 0 when
     * unknown (the test transport). 4 bytes for family 4, 16 for 6. */
    int peer_family;
    uint8_t peer_addr[16];
    int http_major, http_minor;
    const char *route_param; /* the '*' part of the matched route, percent-decoded, or NULL */
    size_t route_param_len;
    struct app *app;
    uint64_t start_ns; /* when the request was complete (for metrics) */
    /* Room the router decodes route_param into (>= path_len + 1 bytes),
     * owned by the connection; NULL in a hand-made request (the router then
     * answers 500 for a '*' route). */
    char *scratch;
    size_t scratch_cap;
    /* What the request's bearer token grants: set by the router's access
     * check (net/router.h) to principal_buf, NULL when tokens are off or
     * the route is open; then nothing is restricted. Handlers that filter
     * by salt ask state/auth.h. */
    const kvidx_principal_t *principal;
    kvidx_principal_t principal_buf;
};

#define HANDLER_ASYNC     1
#define RES_EXTRA_HEADERS 256

typedef void (*res_cancel_cb)(void *waiter);

struct response {
    int status;
    const char *content_type; /* static string; default application/json */
    struct buf body;
    char extra_headers[RES_EXTRA_HEADERS]; /* "Name: value\r\n" lines */
    size_t extra_len;
    int close; /* close the connection after this answer */
    /* The change was made but its answer cannot be given (out of memory):
     * the connection is closed without one, so the client learns that the
     * outcome is unknown rather than a 503 saying nothing changed. */
    int lost;
    /* The request's principal (the router copies req->principal), for an
     * answer written after the handler returned (a long poll). */
    const kvidx_principal_t *principal;
    /* private to the server */
    int deferred;
    int done;
    void *waiter;
    res_cancel_cb cancel;
    void *owner;                            /* who sends the answer */
    void (*on_complete)(struct response *); /* the owner's; NULL: nothing to do */
};

/* Adds a header line to the answer ("Allow", "GET, PUT"). */
void res_header(struct response *res, const char *name, const char *value);
/* Sets status and a JSON body already in res->body. */
void res_json(struct response *res, int status);
/* An RFC 9457 problem+json answer for a KVIDX_E* code: type, title, status,
 * detail, code and, when n > 0, invalid_params. detail must not contain raw
 * request bytes (use an escaped, bounded excerpt at most). Returns 0. */
int res_problem(struct response *res, int err, const char *detail,
                const struct invalid_param *params, size_t n);
/* Answers err with every param collected in pe (or 503 when collecting
 * ran out of memory); returns err. */
int param_errors_respond(struct param_errors *pe, struct response *res, int err,
                         const char *detail);
/* printf-style detail. */
int res_problemf(struct response *res, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Async answers: the handler registers its waiter and the cancel callback
 * the server calls if the connection goes away first (after cancel the
 * handler must not touch res again). res_complete() hands the filled
 * response back to the server, which sends it in pipeline order. */
void res_defer(struct response *res, void *waiter, res_cancel_cb cancel);
void res_complete(struct response *res);

/* Query-string helpers: finds name in a&b=c form, percent-decodes the value
 * into out (cap bytes incl. NUL). Returns 1 found, 0 absent, KVIDX_EINVAL
 * for a bad escape or a value that does not fit. */
int query_get(const char *query, const char *name, char *out, size_t cap, size_t *out_len);
/* Percent-decodes s into out (cap incl. NUL); '+' stays '+' in paths. */
int pct_decode(const char *s, size_t n, char *out, size_t cap, size_t *out_len, int plus_is_space);

#endif
