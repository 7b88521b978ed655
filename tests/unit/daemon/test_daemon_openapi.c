/*
 * docs/openapi.yaml against the daemon's real route tables
 * (app_route_tables): every route the router can dispatch to is documented,
 * and every documented operation is served by a route.
 *
 * The YAML is read minimally: in the top-level `paths:` block, a line of
 * exactly two spaces of indent ending in ':' opens a path item, a line of
 * exactly four spaces that is a method name ending in ':' is one of its
 * operations. A route pattern "/pre/ * /post" (one '*', no spaces) is
 * documented by a path "/pre/{param}/post" with the same method; because the
 * router's '*' matches one or more bytes, '/' included, a path that goes on
 * after the parameter ("/v1/prefetches/{id}/release" for the route
 * "/v1/prefetches/ *") documents it too. GET implies HEAD, so HEAD is only
 * looked for when a table names it.
 */
#include "app.h"
#include "net/router.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPENAPI_PATH KVIDX_VECTORS_DIR "/../../docs/openapi.yaml"
#define MAX_OPS      256
#define PATH_MAX_LEN 256

struct op {
    enum http_method method;
    char path[PATH_MAX_LEN];
};

struct doc {
    struct op ops[MAX_OPS];
    size_t n;
    size_t paths;
};

static const char *const method_names[] = {"get", "head", "put", "post", "delete"};

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* Number of leading spaces of line [s, e). */
static size_t indent_of(const char *s, const char *e)
{
    size_t i = 0;
    while (s + i < e && s[i] == ' ')
        i++;
    return i;
}

/* The operations of the `paths:` block of text. */
static void parse_paths(const char *text, struct doc *d)
{
    memset(d, 0, sizeof(*d));
    int in_paths = 0;
    char cur[PATH_MAX_LEN] = "";
    for (const char *s = text; *s;) {
        const char *e = strchr(s, '\n');
        if (!e)
            e = s + strlen(s);
        const char *next = *e ? e + 1 : e;
        const char *end = e;
        while (end > s && (end[-1] == '\r' || end[-1] == ' '))
            end--;
        size_t ind = indent_of(s, end);
        if (s + ind == end || s[ind] == '#') { /* blank or comment */
            s = next;
            continue;
        }
        if (ind == 0) {
            in_paths = (size_t)(end - s) == 6 && memcmp(s, "paths:", 6) == 0;
            s = next;
            continue;
        }
        if (in_paths && end[-1] == ':') {
            const char *k = s + ind, *ke = end - 1;
            if (ke - k >= 2 && (*k == '\'' || *k == '"') && ke[-1] == *k) {
                k++;
                ke--;
            }
            size_t kn = (size_t)(ke - k);
            if (ind == 2) {
                cr_assert_lt(kn, sizeof(cur), "path too long");
                memcpy(cur, k, kn);
                cur[kn] = '\0';
                d->paths++;
            } else if (ind == 4 && cur[0]) {
                for (size_t m = 0; m < sizeof(method_names) / sizeof(method_names[0]); m++) {
                    if (kn == strlen(method_names[m]) && memcmp(k, method_names[m], kn) == 0) {
                        cr_assert_lt(d->n, MAX_OPS);
                        d->ops[d->n].method = (enum http_method)m;
                        strcpy(d->ops[d->n].path, cur);
                        d->n++;
                    }
                }
            }
        }
        s = next;
    }
}

/* The router's wildcard: '*', or '#' (the same match, but an encoded NUL
 * reaches the handler). */
static const char *wildcard(const char *pat)
{
    const char *w = strchr(pat, '*');
    return w ? w : strchr(pat, '#');
}

/* Does the documented path `doc` name route pattern `pat`? */
static int documents(const char *pat, const char *doc)
{
    const char *star = wildcard(pat);
    if (!star)
        return strcmp(pat, doc) == 0;
    size_t pre = (size_t)(star - pat), post = strlen(star + 1), n = strlen(doc);
    if (n < pre + post || memcmp(pat, doc, pre) != 0 || memcmp(star + 1, doc + n - post, post) != 0)
        return 0;
    /* The wildcard's span must start with one {param} segment, which may be
     * followed by more of the path ('*' matches '/' too). */
    const char *mid = doc + pre, *mid_end = doc + n - post;
    if (mid >= mid_end || *mid != '{')
        return 0;
    const char *close = memchr(mid, '}', (size_t)(mid_end - mid));
    if (!close || close == mid + 1 || memchr(mid, '/', (size_t)(close - mid)))
        return 0;
    return close + 1 == mid_end || close[1] == '/';
}

/* The router's own match: one wildcard standing for one or more bytes. */
static int route_matches(const char *pat, const char *path)
{
    const char *star = wildcard(pat);
    if (!star)
        return strcmp(pat, path) == 0;
    size_t pre = (size_t)(star - pat), post = strlen(star + 1), n = strlen(path);
    return n >= pre + post + 1 && memcmp(pat, path, pre) == 0 &&
           memcmp(star + 1, path + n - post, post) == 0;
}

static int is_documented(const struct doc *d, const struct route *r, size_t skip)
{
    for (size_t i = 0; i < d->n; i++)
        if (i != skip && d->ops[i].method == r->method && documents(r->pattern, d->ops[i].path))
            return 1;
    return 0;
}

/* Routes of the tables that no operation of d (but the one at skip, when
 * skip < d->n) documents; each is reported when report is set. */
static size_t undocumented(const struct doc *d, size_t skip, int report)
{
    size_t missing = 0;
    for (size_t t = 0; app_route_tables[t]; t++) {
        for (const struct route *r = app_route_tables[t]; r->pattern; r++) {
            cr_assert_lt((unsigned)r->method, sizeof(method_names) / sizeof(method_names[0]),
                         "route %s has a method this test does not know", r->pattern);
            if (is_documented(d, r, skip))
                continue;
            missing++;
            if (report)
                cr_log_error("route %s %s (%s) is not in docs/openapi.yaml",
                             method_names[r->method], r->pattern, r->name ? r->name : "?");
        }
    }
    return missing;
}

static size_t route_count(void)
{
    size_t n = 0;
    for (size_t t = 0; app_route_tables[t]; t++)
        for (const struct route *r = app_route_tables[t]; r->pattern; r++)
            n++;
    return n;
}

static void load(struct doc *d)
{
    char *text = read_file(OPENAPI_PATH);
    parse_paths(text, d);
    free(text);
    cr_assert_gt(d->paths, 0, "no path found under paths: in %s", OPENAPI_PATH);
    cr_assert_geq(d->n, d->paths, "fewer operations than paths in %s", OPENAPI_PATH);
}

Test(openapi, every_route_is_documented)
{
    static struct doc d;
    load(&d);
    cr_assert_gt(route_count(), 0, "app_route_tables is empty");
    size_t missing = undocumented(&d, (size_t)-1, 1);
    cr_assert_eq(missing, 0, "%zu route(s) missing from docs/openapi.yaml", missing);
}

Test(openapi, every_documented_operation_is_routed)
{
    static struct doc d;
    load(&d);
    size_t bad = 0;
    for (size_t i = 0; i < d.n; i++) {
        /* A concrete path: every {param} becomes "1". */
        char path[PATH_MAX_LEN];
        size_t o = 0;
        for (const char *p = d.ops[i].path; *p && o + 2 < sizeof(path); p++) {
            if (*p == '{') {
                const char *close = strchr(p, '}');
                cr_assert(close, "unclosed parameter in %s", d.ops[i].path);
                path[o++] = '1';
                p = close;
            } else {
                path[o++] = *p;
            }
        }
        path[o] = '\0';
        enum http_method want = d.ops[i].method == M_HEAD ? M_GET : d.ops[i].method;
        int found = 0;
        for (size_t t = 0; app_route_tables[t] && !found; t++)
            for (const struct route *r = app_route_tables[t]; r->pattern && !found; r++)
                found = r->method == want && route_matches(r->pattern, path);
        if (!found) {
            bad++;
            cr_log_error("%s %s is documented but no route serves it",
                         method_names[d.ops[i].method], d.ops[i].path);
        }
    }
    cr_assert_eq(bad, 0, "%zu documented operation(s) without a route", bad);
}

/* The check above cannot pass vacuously: leaving out any one documented
 * operation that is a route's only documentation makes a route missing. */
Test(openapi, a_missing_operation_is_noticed)
{
    static struct doc d;
    load(&d);
    size_t sole = 0;
    for (size_t i = 0; i < d.n; i++) {
        size_t needed = 0;
        for (size_t t = 0; app_route_tables[t]; t++)
            for (const struct route *r = app_route_tables[t]; r->pattern; r++)
                needed += r->method == d.ops[i].method && documents(r->pattern, d.ops[i].path) &&
                          !is_documented(&d, r, i);
        if (needed) {
            sole++;
            cr_assert_gt(undocumented(&d, i, 0), 0, "leaving out %s %s went unnoticed",
                         method_names[d.ops[i].method], d.ops[i].path);
        }
    }
    /* The mapping is not so loose that operations document each other's
     * routes: all routes but the shared POST /v1/prefetches/ * (documented
     * twice, by release and extend) have exactly one documenting operation. */
    cr_assert_geq(sole + 1, route_count(), "%zu sole operations for %zu routes", sole,
                  route_count());
}

Test(openapi, pattern_mapping)
{
    cr_assert(documents("/v1/keys", "/v1/keys"));
    cr_assert_not(documents("/v1/keys", "/v1/keys/{canonical}"));
    cr_assert(documents("/v1/keys/*", "/v1/keys/{canonical}"));
    cr_assert(documents("/v1/prefetches/*", "/v1/prefetches/{id}/release"));
    cr_assert(documents("/v1/prefetches/*/release", "/v1/prefetches/{id}/release"));
    cr_assert_not(documents("/v1/prefetches/*/release", "/v1/prefetches/{id}/extend"));
    cr_assert_not(documents("/v1/keys/*", "/v1/keys/canonical"));
    cr_assert_not(documents("/v1/keys/*", "/v1/keys/{}"));
    cr_assert_not(documents("/v1/keys/*", "/v1/keys/{a}b"));
    cr_assert_not(documents("/v1/loads/*", "/v1/keys/{canonical}"));
    cr_assert(route_matches("/v1/prefetches/*", "/v1/prefetches/1/release"));
    cr_assert_not(route_matches("/v1/prefetches/*", "/v1/prefetches/"));
}

Test(openapi, yaml_reading)
{
    static struct doc d;
    parse_paths("openapi: 3.1.0\n"
                "paths:\n"
                "  /a:\n"
                "    get:\n"
                "      description: |\n"
                "        put:\n"
                "    parameters:\n"
                "      - name: x\n"
                "  '/b/{id}':\n"
                "    # a comment\n"
                "    delete:\n"
                "    post:\n"
                "components:\n"
                "  /c:\n"
                "    get:\n",
                &d);
    cr_assert_eq(d.paths, 2);
    cr_assert_eq(d.n, 3);
    cr_assert_eq(d.ops[0].method, M_GET);
    cr_assert_str_eq(d.ops[0].path, "/a");
    cr_assert_eq(d.ops[1].method, M_DELETE);
    cr_assert_str_eq(d.ops[1].path, "/b/{id}");
    cr_assert_eq(d.ops[2].method, M_POST);
}
