/*
 * Bearer tokens: the tokens file, the router's access check and the salt
 * rules that handlers apply through state/auth.h.
 *
 * The file (auth_tokens_file) is parsed by lib (kvidx/tokens.h), which
 * keeps only keyed digests of the tokens and finds a presented one by its
 * digest, in a time that tells nothing of the stored tokens. It is read at start (a
 * file that cannot be read or parsed stops the start) and on SIGHUP (then
 * a bad file keeps the tokens in force). A successful read replaces the
 * tokens at once, so a token added before the SIGHUP is valid for the next
 * request, and sets the index's quotas (for each salt the smallest
 * quota_bytes any of its tokens gives).
 *
 * The check runs once per request in the router (net/router.h): the
 * `Authorization: Bearer <token>` header (scheme in any case; trailers
 * never count, the connection keeps no header from them) → 401 with
 * `WWW-Authenticate: Bearer` when missing or unknown; a role below the
 * route's access → 403. On success req->principal points at what the
 * token grants, copied into the request, so a reload never changes what a
 * request in flight (a long poll) was granted.
 *
 * Invariants: no token, and no part of one, is ever logged, put in a
 * metric or in an answer; log lines about the file name the line number
 * only. Salts appear in metrics only as keyed hashes (auth_salt_label).
 */
#include "state/auth.h"

#include "net/router.h"
#include "state/keystore.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/err.h"
#include "kvidx/cidr.h"
#include "kvidx/index_quota.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOKENS_FILE_MAX (64u << 20) /* bytes: a bigger file is refused */

struct auth {
    struct app *app;
    kvidx_tokens_t *tokens; /* NULL: auth off */
    uint8_t label_key[crypto_generichash_KEYBYTES];
    uint64_t reloads, reload_failures;
    uint64_t denied_401, denied_403;
    uint64_t ingest_admitted; /* requests let in by ingest_allow_from */
    int gauges;
};

/* A salt no stored key can have ('@' is not allowed in a salt): a hidden
 * key's salt. */
static const char unstorable_salt[] = "@";

/* ---- the file ---- */

/* Reads the whole file into *out (free it): 0, or KVIDX_EINVAL after
 * logging why. Warns when others than the owner may read it. */
static int read_file(const char *path, char **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        log_error("auth_tokens_file %s: %s", path, strerror(errno));
        return KVIDX_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        log_error("auth_tokens_file %s: not a regular file", path);
        close(fd);
        return KVIDX_EINVAL;
    }
    if (st.st_mode & 077)
        log_warn("auth_tokens_file %s can be read or written by others than its owner "
                 "(mode %04o): chmod 600 it",
                 path, (unsigned)(st.st_mode & 07777));
    if ((uint64_t)st.st_size > TOKENS_FILE_MAX) {
        log_error("auth_tokens_file %s: larger than %u bytes", path, TOKENS_FILE_MAX);
        close(fd);
        return KVIDX_EINVAL;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        log_error("auth_tokens_file %s: out of memory", path);
        return KVIDX_ENOMEM;
    }
    for (;;) {
        if (n == cap) {
            /* The file grew since fstat: read what fits the cap. */
            if (cap > TOKENS_FILE_MAX) {
                free(buf);
                close(fd);
                log_error("auth_tokens_file %s: larger than %u bytes", path, TOKENS_FILE_MAX);
                return KVIDX_EINVAL;
            }
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                close(fd);
                return KVIDX_ENOMEM;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            sodium_memzero(buf, n);
            free(buf);
            close(fd);
            log_error("auth_tokens_file %s: %s", path, strerror(e));
            return KVIDX_EINVAL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

static int principal_salt_cmp(const void *a, const void *b)
{
    const kvidx_principal_t *x = a, *y = b;
    size_t n = x->salt_len < y->salt_len ? x->salt_len : y->salt_len;
    int c = memcmp(x->salt, y->salt, n);
    return c ? c : (x->salt_len > y->salt_len) - (x->salt_len < y->salt_len);
}

/* Sets the index's quotas from t: one per salt, the smallest any of its
 * tokens gives. 0 or KVIDX_ENOMEM. */
static int apply_quotas(struct app *app, const kvidx_tokens_t *t)
{
    size_t n = kvidx_tokens_count(t), k = 0;
    kvidx_principal_t *p = malloc((n ? n : 1) * sizeof(*p));
    kvidx_salt_quota_t *q = malloc((n ? n : 1) * sizeof(*q));
    int rc = p && q ? 0 : KVIDX_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        kvidx_principal_t x;
        if (kvidx_tokens_at(t, i, &x) == 0 && x.salt_bound && x.quota_bytes)
            p[k++] = x;
    }
    size_t nq = 0;
    if (rc == 0) {
        qsort(p, k, sizeof(*p), principal_salt_cmp);
        for (size_t i = 0; i < k; i++) {
            if (nq && principal_salt_cmp(&p[i - 1], &p[i]) == 0)
                continue; /* the same salt: its quota is already the smallest */
            q[nq].salt = p[i].salt;
            q[nq].salt_len = p[i].salt_len;
            q[nq].quota_bytes = kvidx_tokens_salt_quota(t, p[i].salt, p[i].salt_len);
            nq++;
        }
        rc = kvidx_index_set_quotas(app->keystore->idx, q, nq);
    }
    free(p);
    free(q);
    return rc;
}

/* Reads and parses the file: 0 with *out, or the error (logged). */
static int load_tokens(const char *path, kvidx_tokens_t **out)
{
    char *text;
    size_t len;
    int rc = read_file(path, &text, &len);
    if (rc != 0)
        return rc;
    unsigned line = 0;
    const char *why = NULL;
    rc = kvidx_tokens_parse(text, len, out, &line, &why);
    sodium_memzero(text, len);
    free(text);
    if (rc != 0)
        log_error("auth_tokens_file %s: line %u: %s", path, line, why ? why : "invalid");
    return rc == KVIDX_ENOMEM ? rc : rc ? KVIDX_EINVAL : 0;
}

int auth_check_file(const char *path)
{
    kvidx_tokens_t *t = NULL;
    int rc = load_tokens(path, &t);
    kvidx_tokens_free(t);
    return rc;
}

/* ---- the access check ---- */

/* The credential of an Authorization value: "Bearer" in any case, one or
 * more blanks, then the token, which holds no blank and no ','. 0 with
 * *tok and *n, or KVIDX_EUNAUTHORIZED. */
static int bearer(const char *v, const char **tok, size_t *n)
{
    if (!v)
        return KVIDX_EUNAUTHORIZED;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strncasecmp(v, "bearer", 6) != 0 || (v[6] != ' ' && v[6] != '\t'))
        return KVIDX_EUNAUTHORIZED;
    v += 6;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t len = strcspn(v, " \t,");
    const char *rest = v + len;
    while (*rest == ' ' || *rest == '\t')
        rest++;
    /* A ',' would be two Authorization lines joined (net/conn_parse.c). */
    if (len == 0 || len > KVIDX_TOKEN_MAX || *rest != '\0')
        return KVIDX_EUNAUTHORIZED;
    *tok = v;
    *n = len;
    return 0;
}

static const char *role_name(kvidx_role_t r)
{
    return r == KVIDX_ROLE_ADMIN ? "admin" : r == KVIDX_ROLE_WRITE ? "write" : "read";
}

static kvidx_role_t role_needed(enum route_access a)
{
    switch (a) {
    case ROUTE_OPEN:
        return KVIDX_ROLE_NONE;
    case ROUTE_READ:
        return KVIDX_ROLE_READ;
    case ROUTE_WRITE:
    case ROUTE_INGEST:
        return KVIDX_ROLE_WRITE;
    case ROUTE_INGEST_READ:
        return KVIDX_ROLE_READ;
    case ROUTE_ADMIN:
    default:
        return KVIDX_ROLE_ADMIN;
    }
}

/* LMCache's emitter sends no Authorization: a request without one, to an
 * ingest route, from a network of ingest_allow_from, is admitted as an
 * unbound writer (its keys' salts are what the batches say). The list is
 * read from the settings at each use, so SIGHUP changes it. */
static int ingest_admitted(const struct auth *a, struct request *req, const struct route *route)
{
    if (req->authorization || !route || !req->peer_family ||
        (route->access != ROUTE_INGEST && route->access != ROUTE_INGEST_READ) ||
        !a->app->cfg.ingest_allow_from[0])
        return 0;
    kvidx_cidr_list_t nets;
    size_t bad;
    const char *s = a->app->cfg.ingest_allow_from;
    if (kvidx_cidr_parse(s, strlen(s), &nets, &bad) != 0 ||
        !kvidx_cidr_match(&nets, req->peer_family, req->peer_addr))
        return 0;
    memset(&req->principal_buf, 0, sizeof(req->principal_buf));
    req->principal_buf.role = KVIDX_ROLE_WRITE;
    req->principal = &req->principal_buf;
    return 1;
}

static int guard(void *ctx, struct request *req, struct response *res, const struct route *route)
{
    struct auth *a = ctx;
    const char *tok = NULL;
    size_t n = 0;
    if (ingest_admitted(a, req, route)) {
        a->ingest_admitted++;
        return 0;
    }
    if (bearer(req->authorization, &tok, &n) != 0 ||
        kvidx_tokens_find(a->tokens, tok, n, &req->principal_buf) != 0) {
        a->denied_401++;
        res_problem(res, KVIDX_EUNAUTHORIZED,
                    req->authorization ? "The bearer token is not valid."
                                       : "A bearer token is required (Authorization: Bearer).",
                    NULL, 0);
        res_header(res, "WWW-Authenticate", "Bearer");
        return KVIDX_EUNAUTHORIZED;
    }
    req->principal = &req->principal_buf;
    if (route && req->principal_buf.role < role_needed(route->access)) {
        a->denied_403++;
        res_problemf(res, KVIDX_EFORBIDDEN, "This needs a token with the %s role; this one has %s.",
                     role_name(role_needed(route->access)), role_name(req->principal_buf.role));
        return KVIDX_EFORBIDDEN;
    }
    return 0;
}

/* ---- gauges ---- */

void auth_salt_label(const struct app *app, const char *salt, size_t salt_len, char out[17])
{
    static const char hex[] = "0123456789abcdef";
    /* The first 8 bytes of a 16-byte digest (libsodium's shortest). */
    uint8_t d[crypto_generichash_BYTES_MIN];
    if (crypto_generichash(d, sizeof(d), (const unsigned char *)salt, salt_len,
                           app->auth->label_key, sizeof(app->auth->label_key)) != 0)
        memset(d, 0, sizeof(d));
    for (size_t i = 0; i < 8; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[16] = '\0';
}

/* One salt's gauges, under its label. */
struct salt_row {
    char label[17];
    uint64_t keys, l1_bytes, quota_bytes;
};

struct salt_rows {
    const struct app *app;
    struct salt_row *v;
    size_t n, cap;
    int failed;
};

static void salt_row(void *ctx, const kvidx_salt_usage_t *u)
{
    struct salt_rows *r = ctx;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        struct salt_row *v = r->failed ? NULL : realloc(r->v, cap * sizeof(*v));
        if (!v) {
            r->failed = 1;
            return;
        }
        r->v = v;
        r->cap = cap;
    }
    struct salt_row *row = &r->v[r->n++];
    auth_salt_label(r->app, u->salt, u->salt_len, row->label);
    row->keys = u->keys;
    row->l1_bytes = u->l1_bytes;
    row->quota_bytes = u->quota_bytes;
}

static int row_cmp(const void *a, const void *b)
{
    return strcmp(((const struct salt_row *)a)->label, ((const struct salt_row *)b)->label);
}

static void auth_gauges(void *ctx, struct buf *out)
{
    struct auth *a = ctx;
    metrics_single(out, "kvidx_auth_tokens", "gauge", "Bearer tokens in force.",
                   kvidx_tokens_count(a->tokens));
    metrics_single(out, "kvidx_auth_reloads_total", "counter",
                   "Reads of auth_tokens_file on SIGHUP that replaced the tokens.", a->reloads);
    metrics_single(out, "kvidx_auth_reload_failures_total", "counter",
                   "Reads of auth_tokens_file on SIGHUP that failed (the tokens were kept).",
                   a->reload_failures);
    buf_puts(out, "# HELP kvidx_auth_denied_total Requests refused by the access check.\n"
                  "# TYPE kvidx_auth_denied_total counter\n");
    buf_printf(out, "kvidx_auth_denied_total{status=\"401\"} %llu\n",
               (unsigned long long)a->denied_401);
    buf_printf(out, "kvidx_auth_denied_total{status=\"403\"} %llu\n",
               (unsigned long long)a->denied_403);
    metrics_single(out, "kvidx_auth_ingest_admitted_total", "counter",
                   "Fleet ingest requests without a token admitted from ingest_allow_from.",
                   a->ingest_admitted);
    const kvidx_index_t *idx = a->app->keystore->idx;
    metrics_single(out, "kvidx_quota_evictions_total", "counter",
                   "L1 copies evicted to keep a salt within its quota.",
                   kvidx_index_quota_evictions(idx));
    /* Rows in the order of their labels, not of the salts, which would
     * tell how salts sort. */
    struct salt_rows r = {a->app, NULL, 0, 0, 0};
    kvidx_index_each_salt(idx, salt_row, &r);
    if (r.n)
        qsort(r.v, r.n, sizeof(*r.v), row_cmp);
    static const char *const fam[][2] = {
        {"kvidx_salt_keys", "Keys of each salt (label: keyed hash of the salt)."},
        {"kvidx_salt_l1_bytes", "L1 bytes of each salt (label: keyed hash of the salt)."},
        {"kvidx_salt_quota_bytes", "L1 quota of each salt, 0 for none (label: keyed hash)."},
    };
    for (int i = 0; i < 3; i++) {
        buf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", fam[i][0], fam[i][1], fam[i][0]);
        for (size_t j = 0; j < r.n; j++) {
            const struct salt_row *row = &r.v[j];
            uint64_t v = i == 0 ? row->keys : i == 1 ? row->l1_bytes : row->quota_bytes;
            buf_printf(out, "%s{salt=\"%s\"} %llu\n", fam[i][0], row->label, (unsigned long long)v);
        }
    }
    free(r.v);
}

/* ---- /v1/stats ---- */

static void write_usage(void *ctx, const kvidx_salt_usage_t *u)
{
    struct jw *w = ctx;
    jw_obj_begin(w);
    jw_key(w, "cache_salt");
    jw_strn(w, u->salt, u->salt_len);
    jw_key(w, "keys");
    jw_u64(w, u->keys);
    jw_key(w, "l1_keys");
    jw_u64(w, u->l1_keys);
    jw_key(w, "l1_bytes");
    jw_u64(w, u->l1_bytes);
    jw_key(w, "l1_evictable_bytes");
    jw_u64(w, u->l1_evictable_bytes);
    jw_key(w, "quota_bytes");
    jw_u64(w, u->quota_bytes);
    jw_key(w, "quota_evictions");
    jw_u64(w, u->quota_evictions);
    jw_obj_end(w);
}

void auth_write_salt_stats(const struct request *req, struct jw *w)
{
    const struct app *app = req->app;
    if (!auth_enabled(app) || !app->keystore)
        return;
    const kvidx_index_t *idx = app->keystore->idx;
    const char *salt;
    size_t len;
    if (auth_bound_salt(req, &salt, &len)) {
        kvidx_salt_usage_t u;
        kvidx_index_salt_usage(idx, salt, len, &u);
        jw_key(w, "salt");
        write_usage(w, &u);
    } else if (auth_sees_all_salts(req)) {
        jw_key(w, "salts");
        jw_arr_begin(w);
        kvidx_index_each_salt(idx, write_usage, w);
        jw_arr_end(w);
    }
}

/* ---- lifetime ---- */

int auth_init(struct app *app)
{
    struct auth *a = calloc(1, sizeof(*a));
    if (!a)
        return KVIDX_ENOMEM;
    a->app = app;
    if (sodium_init() < 0) {
        free(a);
        return KVIDX_EINTERNAL;
    }
    randombytes_buf(a->label_key, sizeof(a->label_key));
    app->auth = a;
    const char *path = app->cfg.auth_tokens_file;
    if (!path[0])
        return 0;
    int rc = load_tokens(path, &a->tokens);
    if (rc == 0 && (rc = apply_quotas(app, a->tokens)) != 0)
        log_error("auth_tokens_file %s: cannot set the quotas (out of memory)", path);
    if (rc != 0) {
        auth_free(app);
        return rc;
    }
    if (metrics_register(app->metrics, auth_gauges, a) == 0)
        a->gauges = 1;
    else
        log_warn("metrics: cannot publish the auth and per-salt figures");
    router_use_guard(guard, a);
    log_info("auth: %zu bearer token(s) from %s", kvidx_tokens_count(a->tokens), path);
    return 0;
}

void auth_reload(struct app *app)
{
    struct auth *a = app->auth;
    if (!a || !a->tokens)
        return;
    const char *path = app->cfg.auth_tokens_file;
    kvidx_tokens_t *t = NULL;
    int rc = load_tokens(path, &t);
    if (rc == 0 && (rc = apply_quotas(app, t)) != 0) {
        log_error("auth_tokens_file %s: cannot set the quotas (out of memory)", path);
        apply_quotas(app, a->tokens);
    }
    if (rc != 0) {
        kvidx_tokens_free(t);
        a->reload_failures++;
        log_error("auth: keeping the %zu bearer token(s) in force", kvidx_tokens_count(a->tokens));
        return;
    }
    kvidx_tokens_free(a->tokens);
    a->tokens = t;
    a->reloads++;
    log_info("auth: %zu bearer token(s) from %s", kvidx_tokens_count(t), path);
}

void auth_free(struct app *app)
{
    struct auth *a = app->auth;
    if (!a)
        return;
    if (a->gauges)
        metrics_unregister(app->metrics, auth_gauges, a);
    router_use_guard(NULL, NULL);
    kvidx_tokens_free(a->tokens);
    sodium_memzero(a, sizeof(*a));
    free(a);
    app->auth = NULL;
}

int auth_enabled(const struct app *app)
{
    return app->auth && app->auth->tokens;
}

/* ---- the salt rules ---- */

int auth_sees_salt(const struct request *req, const char *salt, size_t salt_len)
{
    return !req->principal || kvidx_principal_sees_salt(req->principal, salt, salt_len);
}

int auth_sees_all_salts(const struct request *req)
{
    return !req->principal || req->principal->role == KVIDX_ROLE_ADMIN;
}

int auth_bound_salt(const struct request *req, const char **salt, size_t *len)
{
    if (!req->principal || !req->principal->salt_bound)
        return 0;
    *salt = req->principal->salt;
    *len = req->principal->salt_len;
    return 1;
}

int auth_forbid_keys(const struct request *req, struct response *res, const void *base,
                     size_t stride, size_t n)
{
    if (!req->principal || !req->principal->salt_bound)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_key_t *k = (const kvidx_key_t *)((const char *)base + i * stride);
        if (!kvidx_principal_sees_salt(req->principal, k->salt, k->salt_len)) {
            res_problem(res, KVIDX_EFORBIDDEN,
                        "This token may only write keys of its own cache_salt; nothing was "
                        "changed.",
                        NULL, 0);
            return KVIDX_EFORBIDDEN;
        }
    }
    return 0;
}

void auth_hide_keys(const struct request *req, kvidx_key_t *keys, size_t n)
{
    if (!req->principal || !req->principal->salt_bound)
        return;
    for (size_t i = 0; i < n; i++) {
        if (!kvidx_principal_sees_salt(req->principal, keys[i].salt, keys[i].salt_len)) {
            keys[i].salt = unstorable_salt;
            keys[i].salt_len = (uint8_t)(sizeof(unstorable_salt) - 1);
        }
    }
}

int auth_list_scope(const struct request *req, kvidx_list_query_t *q)
{
    if (!req->principal || !req->principal->salt_bound)
        return 0;
    const kvidx_principal_t *p = req->principal;
    if (!q->has_salt) {
        q->has_salt = 1;
        q->salt_len = p->salt_len;
        memcpy(q->salt, p->salt, p->salt_len);
        q->salt[p->salt_len] = '\0';
        return 0;
    }
    return !kvidx_principal_sees_salt(p, q->salt, q->salt_len);
}
