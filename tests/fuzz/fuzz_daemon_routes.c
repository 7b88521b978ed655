/*
 * Request bodies, route parameters and query strings through the router
 * and the real handlers of every route, the fleet's included, with the
 * data subsystems created fresh for every input. The input is a program
 * of requests after one byte of settings (bit 0: loader = external, bit 1:
 * prefetch_retention = retain, bit 2: bearer tokens on, from a fixed
 * tokens file), each [route byte][2-byte little-endian length][payload]:
 * the route byte's low five bits pick a row of the table below and its
 * top three the Authorization value (none, a token of each role, two
 * bound to the salt "alice", a quota among them, an unknown one); for a
 * route with a '*' the payload's first line is the path parameter (a
 * leading "$" stands for the "id" or "task" of the last successful answer,
 * so that a handle or task made by one request can be named by the next:
 * "$/extend"), for one that reads a query string the next line is
 * the query, and the rest is the body. Bytes a real request line could not
 * carry are percent-encoded first, as a client would send them.
 *
 * After every request: the router's answer is a status in 100..599, a
 * JSON answer parses, and the key index and the fleet directory pass their
 * own consistency checks; then the loop turns once (a catalog load
 * completes there). A long poll is given one loop turn and then
 * cancelled, as a closed connection would. Leaks are LeakSanitizer's.
 * With KVIDX_FUZZ_TRACE set, every request and answer is printed (to see
 * what a seed reaches).
 */
#include "app.h"
#include "net/router.h"
#include "state/fleet.h"
#include "state/keystore.h"
#include "util/config.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/directory.h"
#include "kvidx/index.h"

#include <cjson/cJSON.h>
#include <uv.h>

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define P 1 /* the pattern's '*' comes from the payload's first line */
#define Q 2 /* a query line follows */

static const struct {
    enum http_method method;
    const char *pre, *post; /* the path around the parameter */
    int flags;
} routes[] = {
    {M_POST, "/events", NULL, 0},
    {M_POST, "/instances", NULL, 0},
    {M_PUT, "/instances/", "/heartbeat", P},
    {M_DELETE, "/instances/", "", P},
    {M_GET, "/instances", NULL, Q},
    {M_POST, "/directory/lookup", NULL, 0},
    {M_POST, "/directory/score", NULL, 0},
    {M_GET, "/directory/keys", NULL, Q},
    {M_GET, "/directory/streams", NULL, Q},
    {M_GET, "/directory/stats", NULL, Q},
    {M_PUT, "/v1/keys", NULL, Q},
    {M_DELETE, "/v1/keys", NULL, Q},
    {M_GET, "/v1/keys", NULL, Q},
    {M_GET, "/v1/keys/", "", P | Q},
    {M_PUT, "/v1/keys/", "", P | Q},
    {M_DELETE, "/v1/keys/", "", P | Q},
    {M_POST, "/v1/lookup", NULL, Q},
    {M_POST, "/v1/prefetches", NULL, Q},
    {M_GET, "/v1/prefetches/", "", P | Q},
    {M_POST, "/v1/prefetches/", "", P | Q},
    {M_DELETE, "/v1/prefetches/", "", P | Q},
    {M_PUT, "/v1/layouts", NULL, Q},
    {M_GET, "/v1/layouts", NULL, Q},
    {M_DELETE, "/v1/layouts", NULL, Q},
    {M_GET, "/v1/loads", NULL, Q},
    {M_POST, "/v1/loads/", "", P | Q},
    {M_GET, "/v1/stats", NULL, 0},
    {M_GET, "/v1/limits", NULL, 0},
    {M_GET, "/metrics", NULL, 0},
    {M_GET, "/healthz", NULL, 0},
    {M_GET, "/readyz", NULL, 0},
};
#define NROUTES        (sizeof(routes) / sizeof(routes[0]))
#define PATH_MAX_BYTES 1024
#define MAX_REQUESTS   32

static struct app app;
static uv_loop_t loop;
static char last_id[128];

static void check(int ok)
{
    if (!ok)
        abort();
}

/* Appends n bytes to out (at *len, cap bytes), percent-encoding what a
 * request line cannot carry; keep: bytes that may stay as they are. */
static int encode(char *out, size_t *len, size_t cap, const uint8_t *s, size_t n, const char *keep)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        int plain = c > 0x20 && c < 0x7f && c != '%' && c != '?' && c != '#' && c != '"' &&
                    (c != '/' || strchr(keep, '/')) && (c != '&' || strchr(keep, '&'));
        /* A '%' followed by two hex digits is an escape the client wrote. */
        if (c == '%' && i + 2 < n && isxdigit(s[i + 1]) && isxdigit(s[i + 2]))
            plain = 1;
        if (*len + 4 > cap)
            return -1;
        if (plain) {
            out[(*len)++] = (char)c;
        } else {
            out[(*len)++] = '%';
            out[(*len)++] = hex[c >> 4];
            out[(*len)++] = hex[c & 15];
        }
    }
    out[*len] = '\0';
    return 0;
}

/* Remembers the first "id" (string or number) of an answer, searched
 * depth first. */
static int find_id(const cJSON *j)
{
    for (const cJSON *e = j ? j->child : NULL; e; e = e->next) {
        if (e->string && (strcmp(e->string, "id") == 0 || strcmp(e->string, "task") == 0)) {
            if (cJSON_IsString(e) && strlen(e->valuestring) < sizeof(last_id)) {
                snprintf(last_id, sizeof(last_id), "%s", e->valuestring);
                return 1;
            }
            if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < 1e18) {
                snprintf(last_id, sizeof(last_id), "%.0f", e->valuedouble);
                return 1;
            }
        }
        if (find_id(e))
            return 1;
    }
    return 0;
}

static void invariants(void)
{
    check(kvidx_index_check(app.keystore->idx) == 0);
    check(kvidx_directory_check(app.fleet->dir) == 0);
}

static const char *const auths[8] = {
    NULL,
    "Bearer tok-admin",
    "Bearer tok-write",
    "Bearer tok-read",
    "Bearer tok-alice-read",
    "Bearer tok-alice-write",
    "Bearer tok-unknown",
    "Basic dG9rLWFkbWlu",
};
static const char tokens_file[] = "tok-admin admin\n"
                                  "tok-write write\n"
                                  "tok-read read\n"
                                  "tok-alice-read read salt=alice\n"
                                  "tok-alice-write write salt=alice quota_bytes=8KiB\n";

static void one_request(unsigned sel, const uint8_t *p, size_t n)
{
    unsigned r = (sel & 0x1f) % NROUTES;
    static char path[PATH_MAX_BYTES + 64], query[PATH_MAX_BYTES], scratch[PATH_MAX_BYTES + 64];
    size_t plen = 0, qlen = 0;
    plen = strlen(routes[r].pre);
    memcpy(path, routes[r].pre, plen + 1);
    if (routes[r].flags & P) {
        const uint8_t *nl = memchr(p, '\n', n);
        size_t m = nl ? (size_t)(nl - p) : n;
        size_t skip = m && p[0] == '$';
        if (skip)
            encode(path, &plen, PATH_MAX_BYTES, (const uint8_t *)last_id, strlen(last_id), "");
        if (encode(path, &plen, PATH_MAX_BYTES, p + skip, m - skip, "/") != 0)
            return;
        p += m + (nl != NULL);
        n -= m + (nl != NULL);
        size_t post = strlen(routes[r].post);
        memcpy(path + plen, routes[r].post, post + 1);
        plen += post;
    }
    query[0] = '\0';
    int has_query = 0;
    if (routes[r].flags & Q) {
        const uint8_t *nl = memchr(p, '\n', n);
        size_t m = nl ? (size_t)(nl - p) : n;
        if (encode(query, &qlen, sizeof(query), p, m, "/&") != 0)
            return;
        has_query = m > 0;
        p += m + (nl != NULL);
        n -= m + (nl != NULL);
    }
    /* An exact-size, NUL-terminated copy, as the connection hands over. */
    char *body = malloc(n + 1);
    if (!body)
        return;
    memcpy(body, p, n);
    body[n] = '\0';

    struct request req;
    struct response res;
    memset(&req, 0, sizeof(req));
    memset(&res, 0, sizeof(res));
    req.method = routes[r].method;
    req.method_name = "X";
    req.path = path;
    req.path_len = plen;
    req.query = query;
    req.query_len = qlen;
    req.has_query = has_query;
    req.body = n ? body : "";
    req.body_len = n;
    req.content_type = "application/json";
    req.authorization = auths[sel >> 5];
    req.app = &app;
    req.scratch = scratch;
    req.scratch_cap = sizeof(scratch);
    req.http_major = req.http_minor = 1;
    buf_init(&res.body);
    res.status = 200;
    int rc = router_dispatch(&req, &res, NULL);
    if (rc == HANDLER_ASYNC) {
        check(res.deferred);
        uv_run(&loop, UV_RUN_NOWAIT);
        if (!res.done && res.cancel)
            res.cancel(res.waiter);
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    if (getenv("KVIDX_FUZZ_TRACE"))
        fprintf(stderr, "%s %s?%s [%s] -> %d %.*s\n", routes[r].pre, path, query,
                req.authorization ? req.authorization : "-", res.status,
                (int)(res.body.len < 300 ? res.body.len : 300), res.body.data ? res.body.data : "");
    check(res.status >= 100 && res.status <= 599);
    check(!res.body.failed || res.status == 503);
    int answered = !res.deferred || res.done;
    if (res.body.len && answered && (!res.content_type || strstr(res.content_type, "json"))) {
        cJSON *j = cJSON_ParseWithLength(res.body.data, res.body.len);
        check(j != NULL);
        if (res.status < 300)
            find_id(j);
        cJSON_Delete(j);
    }
    buf_free(&res.body);
    free(body);
    uv_run(&loop, UV_RUN_NOWAIT); /* a catalog load completes on the next turn */
    invariants();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char tokens_path[64];
    if (!app.metrics) {
        int fd = memfd_create("kvidx-fuzz-tokens", 0);
        check(fd >= 0 && write(fd, tokens_file, sizeof(tokens_file) - 1) ==
                             (ssize_t)(sizeof(tokens_file) - 1));
        snprintf(tokens_path, sizeof(tokens_path), "/proc/self/fd/%d", fd);
        config_defaults(&app.cfg);
        log_setup(getenv("KVIDX_FUZZ_TRACE") ? LOG_DEBUG : LOG_ERROR, LOG_TEXT);
        app.cfg.max_keys_per_request = 64;
        app.metrics = metrics_new();
        app.ready = 1;
        uv_loop_init(&loop);
        app.loop = &loop;
    }
    if (size == 0)
        return 0;
    app.cfg.loader = data[0] & 1 ? LOADER_EXTERNAL : LOADER_CATALOG;
    app.cfg.prefetch_retention = data[0] & 2 ? RETENTION_RETAIN : RETENTION_TEMPORARY;
    snprintf(app.cfg.auth_tokens_file, sizeof(app.cfg.auth_tokens_file), "%s",
             data[0] & 4 ? tokens_path : "");
    if (subsystems_init(&app) != 0)
        return 0;
    last_id[0] = '\0';
    size_t off = 1;
    for (int i = 0; i < MAX_REQUESTS && size - off >= 3; i++) {
        unsigned sel = data[off];
        size_t n = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
        off += 3;
        if (n > size - off)
            n = size - off;
        one_request(sel, data + off, n);
        off += n;
    }
    subsystems_stop(&app);
    uv_run(&loop, UV_RUN_NOWAIT); /* runs the close callbacks */
    subsystems_free(&app);
    return 0;
}
