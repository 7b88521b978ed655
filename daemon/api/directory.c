/*
 * The fleet directory's reads: LMCache's GET /directory/keys (offset
 * paging, and kvidx's exactly-once page_token paging), POST
 * /directory/lookup and GET /directory/stats, and kvidx's own GET
 * /directory/streams (the gate's cursors) and POST /directory/score (each
 * instance's servable prefix for a request).
 *
 * Reads change nothing. A token bound to a cache_salt sees only that
 * salt's keys: listings skip the others (total counts only its own),
 * lookups answer them as unknown, scores count them as held by no one. Query and body errors answer
 * 422 as LMCache's FastAPI validation does (problem+json here, the fields named in invalid_params);
 * a tokens-form request over 1,000,000 token ids answers 400, as LMCache does.
 */
#include "api/api.h"
#include "api/body.h"
#include "api/fleet_json.h"

#include "state/auth.h"
#include "state/fleet.h"
#include "state/keystore.h"
#include "util/context.h"

#include "kvidx/blake3.h"
#include "kvidx/err.h"
#include "kvidx/list_query.h"
#include "kvidx/page_token.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int answer_oom(struct response *res)
{
    buf_reset(&res->body);
    return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
}

/* Ends a handler that has written its JSON body: 200, or the out-of-memory
 * problem (the partial body dropped) when failed. */
static int answer_json(struct response *res, int failed)
{
    if (failed)
        return answer_oom(res);
    res_json(res, 200);
    return 0;
}

/* The keys of a lookup or score body (keys or tokens form): 0 with *root
 * and *fk to release with keys_body_free, or -1 when the request has been
 * answered with its error and nothing is held. */
static int keys_body_read(const struct request *req, struct response *res, cJSON **root,
                          struct fleet_keys *fk)
{
    *root = NULL;
    if (json_parse_body(req, res, root) != 0)
        return -1;
    if (fleet_keys_parse(req, res, *root, fk) != 0) {
        cJSON_Delete(*root);
        return -1;
    }
    return 0;
}

static void keys_body_free(cJSON *root, struct fleet_keys *fk)
{
    fleet_keys_free(fk);
    cJSON_Delete(root);
}

/* A decimal query integer in [lo, hi]: 1 found, 0 absent, -1 bad. */
static int query_uint(const struct request *req, const char *name, uint64_t lo, uint64_t hi,
                      uint64_t *out)
{
    char v[32];
    size_t n;
    int rc = query_get(req->query, name, v, sizeof(v), &n);
    if (rc == 0)
        return 0;
    if (rc < 0 || n == 0)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9' || x > (UINT64_MAX - 9) / 10)
            return -1;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (x < lo || x > hi)
        return -1;
    *out = x;
    return 1;
}

struct list_ctx {
    struct jw *w;
    /* Set for a salt-bound request: rows of other salts are skipped and
     * the visible ones counted. */
    const struct request *req;
    uint64_t offset, limit, seen;
};

static void write_row_placements(struct jw *w, kvidx_dir_row_t *row)
{
    jw_key(w, "placements");
    jw_arr_begin(w);
    kvidx_dir_placement_t p;
    while (kvidx_directory_row_next(row, &p))
        fj_placement(w, &p);
    jw_arr_end(w);
}

static int salt_bound(const struct request *req)
{
    const char *salt;
    size_t len;
    return auth_bound_salt(req, &salt, &len);
}

static int list_row(void *ctx, kvidx_dir_row_t *row)
{
    struct list_ctx *lc = ctx;
    struct jw *w = lc->w;
    if (lc->req && !auth_sees_salt(lc->req, row->key.salt, row->key.salt_len))
        return 0;
    if (lc->req) {
        /* A salt-bound walk over every key: the rows of the page are the
         * visible ones at [offset, offset + limit). */
        uint64_t at = lc->seen++;
        if (at < lc->offset || at - lc->offset >= lc->limit)
            return 0;
    }
    jw_obj_begin(w);
    jw_key(w, "key");
    jw_key_object(w, &row->key);
    write_row_placements(w, row);
    jw_key(w, "num_tokens");
    jw_u64(w, row->token_ids ? row->num_tokens : 0);
    jw_obj_end(w);
    return w->b->failed ? KVIDX_ENOMEM : 0;
}

/* The digest a listing's page token is bound to: the filters, so that a
 * token used with other filters is refused. */
static void keys_digest(const kvidx_dir_filter_t *f, uint8_t out[KVIDX_LIST_DIGEST_LEN])
{
    kvidx_blake3_t h;
    uint8_t full[KVIDX_BLAKE3_OUT_LEN];
    uint8_t tier = (uint8_t)f->tier;
    uint32_t il = (uint32_t)f->instance_len, bl = (uint32_t)f->backend_len;
    kvidx_blake3_init(&h);
    kvidx_blake3_update(&h, "kvidx fleet keys", 16);
    kvidx_blake3_update(&h, &tier, 1);
    kvidx_blake3_update(&h, &il, sizeof(il));
    kvidx_blake3_update(&h, f->instance_id, f->instance_len);
    kvidx_blake3_update(&h, &bl, sizeof(bl));
    kvidx_blake3_update(&h, f->backend, f->backend_len);
    kvidx_blake3_final(&h, full, sizeof(full));
    memcpy(out, full, KVIDX_LIST_DIGEST_LEN);
}

/* kvidx's resumable listing (page_token present, empty for the first
 * page): the keys after the token's, at most limit of them and at most
 * 10 x limit + 1000 examined, and the token of the next page or null. A
 * key present from the first page to the last is listed exactly once. */
static int keys_by_token(const struct request *req, struct response *res,
                         const kvidx_dir_filter_t *f, const char *tok, size_t tok_len,
                         uint64_t limit)
{
    const struct keystore *ks = req->app->keystore;
    uint8_t digest[KVIDX_LIST_DIGEST_LEN];
    keys_digest(f, digest);
    uint64_t now_s = (uint64_t)time(NULL);
    kvidx_page_cursor_t *cur = malloc(sizeof(*cur));
    if (!cur)
        return answer_oom(res);
    const kvidx_key_t *after = NULL;
    if (tok_len) {
        int rc = kvidx_page_token_decode(&ks->keyring, tok, tok_len, now_s,
                                         req->app->cfg.page_token_ttl_s, digest, cur);
        if (rc != 0) {
            free(cur);
            return res_problem(res, rc,
                               rc == KVIDX_ETOKENMISMATCH
                                   ? "the page token was issued for other filters"
                                   : (rc == KVIDX_ETOKENEXPIRED
                                          ? "the page token has expired; list again"
                                          : "the page token is not valid"),
                               NULL, 0);
        }
        after = &cur->key;
    }
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "keys");
    jw_arr_begin(&w);
    /* A salt-bound request's page may come out short (rows of other salts
     * are skipped): next_page_token goes on. */
    struct list_ctx lc = {&w, salt_bound(req) ? req : NULL, 0, UINT64_MAX, 0};
    kvidx_key_t resume;
    int more = 0;
    int rc = kvidx_directory_scan(req->app->fleet->dir, f, after, (size_t)limit,
                                  (size_t)(10 * limit + 1000), list_row, &lc, &resume, &more);
    free(cur);
    jw_arr_end(&w);
    jw_key(&w, "next_page_token");
    if (rc == 0 && more) {
        char t[KVIDX_PAGE_TOKEN_STR_MAX + 1];
        size_t tn = sizeof(t);
        if (kvidx_page_token_encode(kvidx_token_keyring_current(&ks->keyring), now_s, digest,
                                    &resume, 0, t, &tn) != 0) {
            buf_reset(&res->body);
            return res_problem(res, KVIDX_EINTERNAL, "could not sign the page token", NULL, 0);
        }
        jw_strn(&w, t, tn);
    } else {
        jw_null(&w);
    }
    jw_obj_end(&w);
    return answer_json(res, rc != 0 || res->body.failed);
}

static int api_dir_keys(const struct request *req, struct response *res)
{
    struct param_errors pe;
    param_errors_init(&pe);
    char inst[KVIDX_DIR_ID_MAX + 1], backend[KVIDX_DIR_ID_MAX + 1];
    char tier[8];
    size_t inst_len = 0, backend_len = 0, tier_len = 0;
    kvidx_dir_filter_t f;
    memset(&f, 0, sizeof(f));
    int rc = query_get(req->query, "tier", tier, sizeof(tier), &tier_len);
    if (rc < 0)
        param_errors_add(&pe, "must be l1, l2 or all", "tier");
    else if (rc == 1) {
        if (strcmp(tier, "l1") == 0)
            f.tier = KVIDX_DIR_L1;
        else if (strcmp(tier, "l2") == 0)
            f.tier = KVIDX_DIR_L2;
        else if (strcmp(tier, "all") != 0)
            param_errors_add(&pe, "must be l1, l2 or all", "tier");
    }
    if (query_get(req->query, "instance_id", inst, sizeof(inst), &inst_len) < 0)
        param_errors_add(&pe, "must be at most 1024 bytes, percent-encoded", "instance_id");
    if (query_get(req->query, "backend", backend, sizeof(backend), &backend_len) < 0)
        param_errors_add(&pe, "must be at most 1024 bytes, percent-encoded", "backend");
    uint64_t offset = 0, limit = 1000;
    if (query_uint(req, "offset", 0, UINT64_MAX, &offset) < 0)
        param_errors_add(&pe, "must be an integer >= 0", "offset");
    if (query_uint(req, "limit", 1, 10000, &limit) < 0)
        param_errors_add(&pe, "must be an integer 1..10000", "limit");
    char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
    size_t tok_len = 0;
    int has_token = query_get(req->query, "page_token", tok, sizeof(tok), &tok_len);
    if (has_token < 0)
        param_errors_add(&pe, "is not a page token", "page_token");
    if (has_token > 0 && query_uint(req, "offset", 0, UINT64_MAX, &offset) > 0)
        param_errors_add(&pe, "cannot be used with page_token", "offset");
    if (pe.n) {
        fj_unprocessable(&pe, res, "the query is not valid", 0);
        return 0;
    }
    param_errors_free(&pe);
    f.instance_id = inst;
    f.instance_len = inst_len;
    f.backend = backend;
    f.backend_len = backend_len;
    if (has_token > 0)
        return keys_by_token(req, res, &f, tok, tok_len, limit);

    /* LMCache writes total before keys; the rows go to a side buffer
     * until the walk has counted them. */
    struct buf rows;
    buf_init(&rows);
    struct jw rw;
    jw_init(&rw, &rows);
    jw_arr_begin(&rw);
    struct list_ctx lc = {&rw, NULL, 0, 0, 0};
    uint64_t total = 0;
    if (salt_bound(req)) {
        /* Only the token's salt: its keys are counted and paged while
         * every key is walked. */
        lc.req = req;
        lc.offset = offset;
        lc.limit = limit;
        rc = kvidx_directory_list(req->app->fleet->dir, &f, 0, UINT64_MAX, list_row, &lc, NULL);
        total = lc.seen;
    } else {
        rc = kvidx_directory_list(req->app->fleet->dir, &f, offset, limit, list_row, &lc, &total);
    }
    jw_arr_end(&rw);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "total");
    jw_u64(&w, total);
    jw_key(&w, "keys");
    jw_raw(&w, rows.data ? rows.data : "[]", rows.data ? rows.len : 2);
    jw_obj_end(&w);
    int failed = rc != 0 || rows.failed || res->body.failed;
    buf_free(&rows);
    return answer_json(res, failed);
}

static int api_dir_lookup(const struct request *req, struct response *res)
{
    cJSON *root;
    struct fleet_keys fk;
    if (keys_body_read(req, res, &root, &fk) != 0)
        return 0;
    const kvidx_directory_t *d = req->app->fleet->dir;
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "chunks");
    jw_u64(&w, fk.chunks);
    jw_key(&w, "results");
    jw_arr_begin(&w);
    for (size_t i = 0; i < fk.n && !res->body.failed; i++) {
        kvidx_dir_row_t row;
        int visible = auth_sees_salt(req, fk.keys[i].salt, fk.keys[i].salt_len);
        int found = visible && kvidx_directory_lookup(d, &fk.keys[i], &row) == 0;
        if (!visible)
            row.token_ids = NULL;
        jw_obj_begin(&w);
        jw_key(&w, "key");
        jw_key_object(&w, &fk.keys[i]);
        if (found) {
            write_row_placements(&w, &row);
        } else {
            jw_key(&w, "placements");
            jw_arr_begin(&w);
            jw_arr_end(&w);
        }
        jw_key(&w, "token_ids");
        jw_u32s(&w, row.token_ids, row.token_ids ? row.num_tokens : 0);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    keys_body_free(root, &fk);
    return answer_json(res, res->body.failed);
}

static int l1_by_instance(void *ctx, const kvidx_dir_inst_stats_t *s)
{
    struct jw *w = ctx;
    if (!s->l1_keys && !s->has_cursor)
        return 0;
    /* jw_key takes trusted text: the member name is written as an escaped
     * string value, then the colon. */
    jw_strn(w, s->instance_id, s->instance_len);
    buf_putc(w->b, ':');
    w->after_key = 1;
    jw_u64(w, s->l1_keys);
    return 0;
}

static int api_dir_stats(const struct request *req, struct response *res)
{
    const kvidx_directory_t *d = req->app->fleet->dir;
    kvidx_dir_stats_t st;
    kvidx_directory_stats(d, &st);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "num_keys");
    jw_u64(&w, st.num_keys);
    jw_key(&w, "num_placements");
    jw_u64(&w, st.num_placements);
    jw_key(&w, "l1_keys_by_instance");
    jw_obj_begin(&w);
    kvidx_directory_inst_stats(d, l1_by_instance, &w);
    jw_obj_end(&w);
    jw_key(&w, "blend");
    jw_obj_begin(&w);
    /* No blend index: LMCache's figures with blend lookup off. */
    static const char *const blend[] = {"num_contents", "num_chunks", "num_claims",
                                        "num_namespaces"};
    for (size_t i = 0; i < sizeof(blend) / sizeof(blend[0]); i++) {
        jw_key(&w, blend[i]);
        jw_u64(&w, 0);
    }
    jw_key(&w, "table_size");
    jw_u64(&w, 1024);
    jw_obj_end(&w);
    jw_key(&w, "placements_by_tier");
    jw_obj_begin(&w);
    jw_key(&w, "l1");
    jw_u64(&w, st.placements[0]);
    jw_key(&w, "l2");
    jw_u64(&w, st.placements[1]);
    jw_obj_end(&w);
    jw_key(&w, "bytes_by_tier");
    jw_obj_begin(&w);
    jw_key(&w, "l1");
    jw_u64(&w, st.bytes[0]);
    jw_key(&w, "l2");
    jw_u64(&w, st.bytes[1]);
    jw_obj_end(&w);
    jw_key(&w, "token_bindings");
    jw_obj_begin(&w);
    jw_key(&w, "bindings");
    jw_u64(&w, st.bindings);
    jw_key(&w, "tokens");
    jw_u64(&w, st.binding_tokens);
    jw_key(&w, "bytes");
    jw_u64(&w, st.token_bytes);
    jw_key(&w, "cap");
    jw_u64(&w, st.token_bytes_cap);
    jw_key(&w, "dropped");
    jw_u64(&w, st.bindings_dropped);
    jw_key(&w, "tokens_dropped");
    jw_u64(&w, st.tokens_dropped);
    jw_obj_end(&w);
    jw_key(&w, "num_instances");
    jw_u64(&w, st.num_instances);
    jw_key(&w, "num_registered");
    jw_u64(&w, st.num_registered);
    jw_key(&w, "num_streams");
    jw_u64(&w, st.num_streams);
    jw_key(&w, "memory_bytes");
    jw_u64(&w, st.memory_bytes);
    jw_key(&w, "chunk_size");
    jw_u64(&w, req->app->cfg.chunk_size);
    jw_obj_end(&w);
    return answer_json(res, res->body.failed);
}

static int stream_row(void *ctx, const kvidx_dir_stream_t *s)
{
    struct jw *w = ctx;
    jw_obj_begin(w);
    jw_key(w, "instance_id");
    jw_strn(w, s->instance_id, s->instance_len);
    jw_key(w, "incarnation");
    jw_u64(w, s->incarnation);
    jw_key(w, "last_seq");
    jw_u64(w, s->last_seq);
    jw_key(w, "gap_detected");
    jw_bool(w, s->gap);
    jw_key(w, "applied");
    jw_u64(w, s->applied);
    jw_key(w, "duplicates");
    jw_u64(w, s->duplicates);
    jw_key(w, "stale");
    jw_u64(w, s->stale);
    jw_key(w, "last_ts");
    fj_double(w, s->last_ts);
    jw_obj_end(w);
    return 0;
}

static int api_dir_streams(const struct request *req, struct response *res)
{
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "streams");
    jw_arr_begin(&w);
    kvidx_directory_streams(req->app->fleet->dir, stream_row, &w);
    jw_arr_end(&w);
    jw_obj_end(&w);
    return answer_json(res, res->body.failed);
}

static int api_dir_score(const struct request *req, struct response *res)
{
    cJSON *root;
    struct fleet_keys fk;
    if (keys_body_read(req, res, &root, &fk) != 0)
        return 0;
    /* The tokens form is chunk-major with world_size ranks a chunk; the
     * keys form names one key per chunk. One full-attention group. */
    int64_t window = -1;
    kvidx_fold_shape_t shape = {&window, 1, fk.chunks, fk.tokens_form ? fk.world_size : 1};
    kvidx_dir_score_t *scores = NULL;
    size_t count = 0;
    /* Keys of salts the request may not see count as held by no one. */
    auth_hide_keys(req, fk.keys, fk.n);
    int rc = kvidx_directory_score(req->app->fleet->dir, fk.keys, fk.n, &shape, &scores, &count);
    if (rc != 0) {
        keys_body_free(root, &fk);
        return res_problem(res, rc, rc == KVIDX_ENOMEM ? "out of memory" : "bad request shape",
                           NULL, 0);
    }
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "chunks");
    jw_u64(&w, fk.chunks);
    jw_key(&w, "scores");
    jw_arr_begin(&w);
    for (size_t i = 0; i < count; i++) {
        const kvidx_dir_score_t *s = &scores[i];
        jw_obj_begin(&w);
        jw_key(&w, "instance_id");
        if (s->shared)
            jw_null(&w);
        else
            jw_strn(&w, s->instance_id, s->instance_len);
        jw_key(&w, "shared");
        jw_bool(&w, s->shared);
        jw_key(&w, "l1_chunks");
        jw_u64(&w, s->l1_chunks);
        jw_key(&w, "l2_chunks");
        jw_u64(&w, s->l2_chunks);
        jw_key(&w, "any_chunks");
        jw_u64(&w, s->any_chunks);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    kvidx_directory_score_free(scores);
    keys_body_free(root, &fk);
    return answer_json(res, res->body.failed);
}

const struct route directory_routes[] = {
    {M_GET, "/directory/keys", api_dir_keys, "fleet_directory_keys", ROUTE_READ},
    {M_POST, "/directory/lookup", api_dir_lookup, "fleet_directory_lookup", ROUTE_READ},
    {M_GET, "/directory/stats", api_dir_stats, "fleet_directory_stats", ROUTE_READ},
    {M_GET, "/directory/streams", api_dir_streams, "fleet_directory_streams", ROUTE_READ},
    {M_POST, "/directory/score", api_dir_score, "fleet_directory_score", ROUTE_READ},
    {0, NULL, NULL, NULL, 0},
};
