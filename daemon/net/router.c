/*
 * Method + path routing. The route tables are handed over once by the
 * composition root (app.c lists one table per api/ file); a request is
 * matched against every table in order, first match wins. The router
 * knows no handler by name.
 *
 * Rules kept here, centrally, so that no handler has to repeat them:
 *   - the access check (router_use_guard) runs once per request, before
 *     anything else is answered, unless the path is an open route's: a
 *     request without a valid token gets 401 whether its path exists or
 *     not, one whose token's role is below the route's access 403; no
 *     handler checks roles. req->principal is reset for every request
 *     and set only by the check;
 *   - unknown path → 404 not_found; known path, other method → 405
 *     method_not_allowed with an Allow header (GET implies HEAD);
 *   - HEAD runs the GET handler (the server drops the body);
 *   - a PUT/POST with a non-empty body must say Content-Type
 *     application/json (parameters allowed) → else 415;
 *   - the '*' part of a pattern is percent-decoded into req->scratch and
 *     exposed as route_param; a bad escape or an encoded NUL → 400. A '#'
 *     matches like '*' but hands an encoded NUL to the handler, which
 *     judges the parameter by its length (and answers in its own terms).
 */
#include "net/router.h"

#include "kvidx/err.h"

#include <strings.h>
#include <string.h>

static const struct route *const no_tables[] = {NULL};
static const struct route *const *tables = no_tables;
static route_guard_fn guard;
static void *guard_ctx;

void router_use_tables(const struct route *const *t)
{
    tables = t ? t : no_tables;
}

void router_use_guard(route_guard_fn fn, void *ctx)
{
    guard = fn;
    guard_ctx = ctx;
}

static const char *const method_names[M_COUNT] = {"GET", "HEAD", "PUT", "POST", "DELETE", "OTHER"};

/* Matches path against pattern; on a '*' match stores the raw wildcard
 * span in *wild / *wild_len. */
static int match(const char *pattern, const char *path, size_t path_len, const char **wild,
                 size_t *wild_len)
{
    const char *star = strpbrk(pattern, "*#");
    *wild = NULL;
    *wild_len = 0;
    if (!star)
        return strlen(pattern) == path_len && memcmp(pattern, path, path_len) == 0;
    size_t pre = (size_t)(star - pattern);
    size_t post = strlen(star + 1);
    if (path_len < pre + post + 1)
        return 0;
    if (memcmp(pattern, path, pre) != 0 || memcmp(star + 1, path + path_len - post, post) != 0)
        return 0;
    *wild = path + pre;
    *wild_len = path_len - pre - post;
    return 1;
}

static int is_json_type(const char *ct)
{
    static const char want[] = "application/json";
    if (!ct)
        return 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, want, sizeof(want) - 1) != 0)
        return 0;
    ct += sizeof(want) - 1;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

int router_dispatch(struct request *req, struct response *res, const char **route_name)
{
    const struct route *found = NULL;
    const char *wild = NULL;
    size_t wild_len = 0;
    unsigned allowed = 0; /* bit per enum http_method */
    int open_path = 0;    /* an open route has this path */
    enum http_method want = req->method;

    if (route_name)
        *route_name = "unknown";
    req->principal = NULL;
    res->principal = NULL;
    for (size_t t = 0; tables[t] && !found; t++) {
        for (const struct route *r = tables[t]; r->pattern; r++) {
            const char *w;
            size_t wl;
            if (!match(r->pattern, req->path, req->path_len, &w, &wl))
                continue;
            allowed |= 1u << r->method;
            open_path |= r->access == ROUTE_OPEN;
            if (r->method == M_GET)
                allowed |= 1u << M_HEAD;
            if (r->method == want) {
                found = r;
                wild = w;
                wild_len = wl;
                break;
            }
        }
    }
    /* HEAD falls back on the GET route of the same path. */
    if (!found && want == M_HEAD && (allowed & (1u << M_GET))) {
        for (size_t t = 0; tables[t] && !found; t++) {
            for (const struct route *r = tables[t]; r->pattern; r++) {
                if (r->method == M_GET &&
                    match(r->pattern, req->path, req->path_len, &wild, &wild_len)) {
                    found = r;
                    break;
                }
            }
        }
    }
    if (route_name && found)
        *route_name = found->name ? found->name : "unknown";
    if (guard && !open_path) {
        if (guard(guard_ctx, req, res, found) != 0)
            return 0;
        res->principal = req->principal;
    }
    if (!found) {
        if (!allowed)
            return res_problem(res, KVIDX_ENOTFOUND, "No such resource.", NULL, 0);
        char allow[64] = "";
        for (int m = 0; m < M_OTHER; m++) {
            if (!(allowed & (1u << m)))
                continue;
            if (allow[0])
                strcat(allow, ", ");
            strcat(allow, method_names[m]);
        }
        res_problemf(res, KVIDX_EMETHOD, "Allowed methods: %s.", allow);
        res_header(res, "Allow", allow);
        return 0;
    }
    if ((req->method == M_PUT || req->method == M_POST) && req->body_len > 0 &&
        !is_json_type(req->content_type))
        return res_problem(res, KVIDX_EMEDIATYPE, "Request bodies must be application/json.", NULL,
                           0);
    req->route_param = NULL;
    req->route_param_len = 0;
    if (wild) {
        size_t n = 0;
        if (!req->scratch || req->scratch_cap < wild_len + 1)
            return res_problem(res, KVIDX_EINTERNAL, "No room to decode the path.", NULL, 0);
        int nul_ok = strchr(found->pattern, '#') != NULL;
        if (pct_decode(wild, wild_len, req->scratch, req->scratch_cap, &n, 0) < 0 ||
            (!nul_ok && memchr(req->scratch, '\0', n)))
            return res_problem(res, KVIDX_EINVAL, "Bad percent-encoding in the path.", NULL, 0);
        req->route_param = req->scratch;
        req->route_param_len = n;
    }
    return found->fn(req, res);
}
