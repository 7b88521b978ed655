/*
 * /v1/prefetches: LOOKUP and WARM prefetch handles (POST creates; GET, with
 * an optional long poll, DELETE, POST .../release and .../extend).
 *
 * Owns only the wire side: the options of a prefetch body, the handle's
 * JSON answer and the checks of a release. The handles, their pins, leases
 * and loads are the prefetch table's (kvidx/prefetch_table.h, through
 * state/prefetches.h). Invariants: bad input answers problem+json and
 * changes nothing; a release is all or nothing, with every bad index
 * listed; an expired handle answers 410 until its grace period ends, then
 * 404 like an id that never was. A handle belongs to the salt of the
 * token that made it: to a token bound to another salt it is 404, like an
 * id that never was, whatever its state.
 */
#include "api/api.h"
#include "api/key_request.h"

#include "state/auth.h"
#include "state/prefetches.h"
#include "util/context.h"
#include "api/body.h"
#include "util/json_read.h"

#include "kvidx/err.h"
#include "kvidx/prefetch_table.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXTRA_COUNT_MAX 127u
#define EXT_ID_MAX      256u

static const char *const status_names[] = {"pending", "completed", "released", "expired"};
static const char *const mode_names[] = {"LOOKUP", "WARM"};
static const char *const policy_names[] = {"PREFIX", "SEGMENTED_PREFIX", "SPARSE"};

static struct prefetches *pf_of(const struct request *req)
{
    return req->app->prefetches;
}

/* ---- answers ---- */

static void jw_u32_list(struct jw *w, const char *name, const uint32_t *v, size_t n)
{
    jw_key(w, name);
    jw_u32s(w, v, n);
}

/* The members a handle has once it left pending. */
static void jw_result(struct jw *w, const kvidx_pft_handle_t *h)
{
    const kvidx_pfh_t *p = &h->pfh;
    jw_u32_list(w, "found_indices", p->result.found, p->result.n_found);
    jw_u32_list(w, "retained_indices", p->result.retained, p->result.n_retained);
    jw_key(w, "hit_keys");
    jw_u64(w, p->result.hit_keys);
    jw_key(w, "hit_chunks");
    if (h->is_ipc)
        jw_u64(w, p->result.hit_chunks);
    else
        jw_null(w);
    size_t pinned = 0;
    for (size_t i = 0; i < p->n; i++)
        pinned += p->keys[i].pins > 0;
    jw_key(w, "pinned_keys");
    jw_u64(w, pinned);
    jw_key(w, "lost_indices");
    jw_arr_begin(w);
    for (size_t i = 0; i < p->n; i++)
        if (p->keys[i].lost)
            jw_u64(w, i);
    jw_arr_end(w);
}

static void jw_handle(struct jw *w, struct prefetches *pf, kvidx_pft_handle_t *h)
{
    kvidx_pfh_t *p = &h->pfh;
    jw_obj_begin(w);
    jw_key(w, "id");
    jw_u64(w, h->id);
    jw_key(w, "prefetch_request_id");
    jw_i64(w, p->plan.n_l2_orig ? (int64_t)h->id : -1);
    jw_key(w, "external_request_id");
    if (h->ext_id)
        jw_str(w, h->ext_id);
    else
        jw_null(w);
    jw_u32_list(w, "l1_found_indices", p->plan.l1_found, p->plan.n_l1_found);
    jw_key(w, "total_requested_keys");
    jw_u64(w, p->n);
    jw_key(w, "submit_time");
    char num[48];
    int len = snprintf(num, sizeof(num), "%.3f", (double)h->submit_wall_ms / 1000.0);
    jw_raw(w, num, (size_t)len);
    jw_u32_list(w, "l2_orig_indices", p->plan.l2_orig, p->plan.n_l2_orig);
    jw_key(w, "status");
    jw_str(w, status_names[p->status]);
    jw_key(w, "mode");
    jw_str(w, mode_names[p->mode]);
    jw_key(w, "trim_policy");
    jw_str(w, policy_names[p->policy]);
    jw_key(w, "extra_count");
    jw_u64(w, p->extra);
    if (p->status != KVIDX_PFH_PENDING) {
        /* Without a result (memory ran out at completion, so the handle
         * kept nothing) the members are there, empty. */
        if (p->has_result)
            kvidx_pft_refresh(prefetches_table(pf), h);
        jw_result(w, h);
    }
    jw_key(w, "expires_at_ms");
    int live = p->status == KVIDX_PFH_PENDING || p->status == KVIDX_PFH_COMPLETED;
    jw_u64(w, prefetches_wall_at(pf, live ? h->expires_at : h->gone_at));
    jw_obj_end(w);
}

/* The answer of GET for h's current state, status code included. */
static void answer_handle(struct prefetches *pf, kvidx_pft_handle_t *h, struct response *res,
                          int status)
{
    buf_reset(&res->body);
    if (h->pfh.status == KVIDX_PFH_EXPIRED) {
        res_problemf(res, KVIDX_EHANDLEEXPIRED, "prefetch handle %" PRIu64 " expired", h->id);
        return;
    }
    struct jw w;
    jw_init(&w, &res->body);
    jw_handle(&w, pf, h);
    /* A body that could not be built is left to the connection: a read
     * answers 503, a create or release (already done) closes instead. */
    res_json(res, status);
}

/* A long poll's answer (prefetches_answer_fn). */
static void answer_poll(struct prefetches *pf, kvidx_pft_handle_t *h, struct response *res)
{
    answer_handle(pf, h, res, 200);
}

/* ---- POST /v1/prefetches ---- */

static int parse_enum(const cJSON *v, const char *const *names, size_t n, int *out)
{
    if (!v)
        return 0;
    for (size_t i = 0; cJSON_IsString(v) && i < n; i++) {
        if (strcmp(v->valuestring, names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    return KVIDX_EINVAL;
}

/* lease_ms: a positive integer. Leases are bounded by max_lease_ms: a
 * longer one is cut to the maximum (the answer's expires_at_ms shows it),
 * the way page_size is cut to its maximum. */
static int lease_parse(const cJSON *v, uint64_t max_ms, uint64_t *out)
{
    uint64_t ms = 0;
    if (json_uint(v, 1, 9007199254740992.0, &ms) != 0)
        return KVIDX_EINVAL;
    *out = ms < max_ms ? ms : max_ms;
    return 0;
}

/* The options of a prefetch body into s (keys aside): 0, or KVIDX_EINVAL
 * after answering 400 with every bad option listed. */
static int parse_options(const struct request *req, struct response *res,
                         const struct key_request *kr, kvidx_pft_submit_t *s)
{
    const struct config *cfg = &req->app->cfg;
    struct param_errors pe;
    param_errors_init(&pe);
    int mode = KVIDX_PF_LOOKUP, policy = -1;
    uint64_t extra = 0;
    s->lease_ms = cfg->default_lease_ms;
    if (parse_enum(kr->mode, mode_names, 2, &mode) != 0)
        param_errors_add(&pe, "must be \"LOOKUP\" or \"WARM\"", "mode");
    if (parse_enum(kr->trim, policy_names, 3, &policy) != 0)
        param_errors_add(&pe, "must be \"PREFIX\", \"SEGMENTED_PREFIX\" or \"SPARSE\"",
                         "trim_policy");
    if (kr->extra && json_uint(kr->extra, 0, EXTRA_COUNT_MAX, &extra) != 0)
        param_errors_add(&pe, "must be an integer 0..127", "extra_count");
    if (kr->ext_id && !cJSON_IsNull(kr->ext_id) &&
        (!cJSON_IsString(kr->ext_id) || strlen(kr->ext_id->valuestring) > EXT_ID_MAX))
        param_errors_add(&pe, "must be a string of at most 256 bytes", "external_request_id");
    if (kr->lease && lease_parse(kr->lease, cfg->max_lease_ms, &s->lease_ms) != 0)
        param_errors_add(&pe, "must be a positive integer (capped at max_lease_ms)", "lease_ms");
    int rc = pe.n ? KVIDX_EINVAL : 0;
    if (rc != 0)
        param_errors_respond(&pe, res, KVIDX_EINVAL, "the request is not valid");
    param_errors_free(&pe);
    if (policy < 0)
        policy = mode == KVIDX_PF_WARM ? KVIDX_TRIM_SPARSE : KVIDX_TRIM_PREFIX;
    s->mode = (kvidx_prefetch_mode_t)mode;
    s->policy = (kvidx_trim_policy_t)policy;
    s->extra = mode == KVIDX_PF_WARM ? 0 : (uint32_t)extra; /* WARM has no readers */
    s->ext_id = kr->ext_id && cJSON_IsString(kr->ext_id) ? kr->ext_id->valuestring : NULL;
    s->temporary = cfg->prefetch_retention == RETENTION_TEMPORARY;
    s->keys = kr->keys;
    s->n = kr->n;
    s->ipc = kr->is_ipc ? &kr->shape : NULL;
    /* Made by a salt-bound token: the handle is that salt's (a salt holds
     * no NUL, so the owner is the salt's text). */
    const char *salt;
    size_t salt_len;
    s->owner = auth_bound_salt(req, &salt, &salt_len) ? salt : NULL;
    return rc;
}

/* 1 when the request may see handle h: any handle without a salt-bound
 * token, else only the handles of its salt. */
static int may_see(const struct request *req, const kvidx_pft_handle_t *h)
{
    const char *salt;
    size_t salt_len;
    if (!auth_bound_salt(req, &salt, &salt_len))
        return 1;
    return h->owner && strlen(h->owner) == salt_len && memcmp(h->owner, salt, salt_len) == 0;
}

static int api_prefetch_create(const struct request *req, struct response *res)
{
    struct prefetches *pf = pf_of(req);
    struct key_request kr;
    if (prefetches_ready(pf) != 0)
        return res_problem(res, KVIDX_ENOTREADY, "the daemon is shutting down", NULL, 0);
    if (key_request_parse(req, res, BODY_PREFETCH, &kr) != 0)
        return 0;
    kvidx_pft_submit_t s;
    memset(&s, 0, sizeof(s));
    kvidx_pft_handle_t *h = NULL;
    if (parse_options(req, res, &kr, &s) != 0)
        goto out;
    int rc = prefetches_submit(pf, &s, &h);
    if (rc != 0) {
        res_problem(res, rc == KVIDX_EINVAL ? KVIDX_EINTERNAL : KVIDX_ENOMEM,
                    "cannot plan the prefetch", NULL, 0);
        goto out;
    }
    answer_handle(pf, h, res, 201);
out:
    key_request_free(&kr);
    return 0;
}

/* ---- /v1/prefetches/{id}[/release|/extend] ---- */

/* The id at the start of the route parameter; *suffix gets the rest (""
 * or "/release"...). 0, or KVIDX_ENOTFOUND when it is no id. */
static int parse_id(const struct request *req, uint64_t *id, const char **suffix)
{
    size_t used = 0;
    if (!req->route_param ||
        kvidx_pft_parse_id(req->route_param, req->route_param_len, id, &used) != 0)
        return KVIDX_ENOTFOUND;
    if (used < req->route_param_len && req->route_param[used] != '/')
        return KVIDX_ENOTFOUND;
    *suffix = req->route_param + used;
    return 0;
}

/* The live or released handle of the request with the given suffix: 0, or
 * the code of the 404/410 answered. */
static int find_handle(const struct request *req, struct response *res, const char *want_suffix,
                       kvidx_pft_handle_t **out)
{
    uint64_t id;
    const char *suffix;
    if (parse_id(req, &id, &suffix) != 0 || strcmp(suffix, want_suffix) != 0) {
        res_problem(res, KVIDX_ENOTFOUND, "no such prefetch handle", NULL, 0);
        return KVIDX_ENOTFOUND;
    }
    int rc = kvidx_pft_find(prefetches_table(pf_of(req)), id, out);
    if (*out && !may_see(req, *out)) {
        *out = NULL;
        rc = KVIDX_ENOTFOUND;
    }
    if (rc == KVIDX_ENOTFOUND)
        res_problemf(res, rc, "no prefetch handle %" PRIu64, id);
    else if (rc == KVIDX_EHANDLEEXPIRED)
        res_problemf(res, rc, "prefetch handle %" PRIu64 " expired", id);
    return rc;
}

static int api_prefetch_get(const struct request *req, struct response *res)
{
    struct prefetches *pf = pf_of(req);
    uint64_t wait = 0;
    int given = 0;
    kvidx_pft_handle_t *h;
    if (prefetches_poll_query(req, res, &given, &wait) != 0 || find_handle(req, res, "", &h) != 0)
        return 0;
    if (h->pfh.status == KVIDX_PFH_PENDING && given && wait > 0 && prefetches_ready(pf) == 0)
        return prefetches_poll(pf, h, res, wait, answer_poll);
    answer_handle(pf, h, res, 200);
    return 0;
}

static int api_prefetch_delete(const struct request *req, struct response *res)
{
    uint64_t id;
    const char *suffix;
    /* Idempotent: a released, expired or forgotten handle holds no pin.
     * Another salt's handle is not there for this request. */
    kvidx_pft_handle_t *h = NULL;
    int ok = parse_id(req, &id, &suffix) == 0 && !suffix[0];
    if (ok) {
        kvidx_pft_find(prefetches_table(pf_of(req)), id, &h);
        ok = (!h || may_see(req, h)) && prefetches_delete(pf_of(req), id) == 0;
    }
    if (!ok)
        return res_problem(res, KVIDX_ENOTFOUND, "no such prefetch handle", NULL, 0);
    res->status = 204;
    return 0;
}

/* The body of a release: empty, {}, {"indices": null} (every retained key)
 * or {"indices": [index, ...]}. 0 with *body (to cJSON_Delete) and *ind
 * (NULL: every retained key), or the code of the 400 answered. */
static int parse_release_body(const struct request *req, struct response *res, cJSON **body,
                              const cJSON **ind)
{
    *body = NULL;
    *ind = NULL;
    if (req->body_len == 0)
        return 0;
    int rc = json_parse_body(req, res, body);
    if (rc != 0)
        return rc;
    int bad = !cJSON_IsObject(*body);
    for (const cJSON *m = bad ? NULL : (*body)->child; m; m = m->next) {
        if (strcmp(m->string ? m->string : "", "indices") == 0 && !*ind)
            *ind = m;
        else
            bad = 1;
    }
    if (bad || (*ind && !cJSON_IsArray(*ind) && !cJSON_IsNull(*ind))) {
        struct invalid_param p = {"indices", "the body is {\"indices\": [index, ...]}"};
        res_problem(res, KVIDX_EINVAL, "the request is not valid", &p, 1);
        return KVIDX_EINVAL;
    }
    if (cJSON_IsNull(*ind))
        *ind = NULL;
    return 0;
}

/* Checks every item of ind against h's ledger, listing every bad one, into
 * list (room for every item): 0 with *n, or the code answered (400 when an
 * index is out of range, else 409: nothing to release there). */
static int check_indices(const kvidx_pft_handle_t *h, const cJSON *ind, uint32_t *list, size_t *n,
                         struct response *res)
{
    const kvidx_pfh_t *p = &h->pfh;
    struct param_errors pe;
    param_errors_init(&pe);
    uint32_t *want = calloc(p->n ? p->n : 1, sizeof(*want));
    int out_of_range = 0, rc = 0;
    if (!want) {
        res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        rc = KVIDX_ENOMEM;
        goto out;
    }
    *n = 0;
    for (const cJSON *x = ind->child; x; x = x->next, (*n)++) {
        uint64_t v;
        if (json_uint(x, 0, (double)UINT32_MAX, &v) != 0 || v >= p->n) {
            param_errors_add(&pe, "must be an index of the request", "indices[%zu]", *n);
            out_of_range = 1;
            continue;
        }
        list[*n] = (uint32_t)v;
        if (!p->has_result || !p->result.retained_map[v] || ++want[v] > p->keys[v].pins)
            param_errors_add(&pe, "that key holds no (more) pins of this handle", "indices[%zu]",
                             *n);
    }
    if (pe.n) {
        rc = out_of_range ? KVIDX_EINVAL : KVIDX_ECONFLICT;
        param_errors_respond(&pe, res, rc, "nothing was released");
    }
out:
    free(want);
    param_errors_free(&pe);
    return rc;
}

static int api_prefetch_release(const struct request *req, struct response *res)
{
    struct prefetches *pf = pf_of(req);
    kvidx_pft_handle_t *h;
    cJSON *body = NULL;
    const cJSON *ind = NULL;
    uint32_t *list = NULL;
    size_t n = 0;
    if (find_handle(req, res, "/release", &h) != 0 ||
        parse_release_body(req, res, &body, &ind) != 0)
        goto out;
    if (h->pfh.status == KVIDX_PFH_RELEASED) {
        res_problem(res, KVIDX_ECONFLICT, "the handle holds no pins any more", NULL, 0);
        goto out;
    }
    if (h->pfh.status == KVIDX_PFH_PENDING) {
        res_problem(res, KVIDX_ECONFLICT, "the handle is pending; DELETE it to cancel", NULL, 0);
        goto out;
    }
    kvidx_pft_refresh(prefetches_table(pf), h);
    if (ind) {
        size_t cnt = (size_t)cJSON_GetArraySize(ind);
        list = malloc((cnt ? cnt : 1) * sizeof(*list));
        if (!list) {
            res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
            goto out;
        }
        if (check_indices(h, ind, list, &n, res) != 0)
            goto out;
    }
    int rc = prefetches_release(pf, h, ind ? list : NULL, n);
    if (rc != 0) {
        res_problem(res, rc, "nothing was released", NULL, 0);
        goto out;
    }
    answer_handle(pf, h, res, 200);
out:
    free(list);
    cJSON_Delete(body);
    return 0;
}

static int api_prefetch_extend(const struct request *req, struct response *res)
{
    struct prefetches *pf = pf_of(req);
    kvidx_pft_handle_t *h;
    cJSON *body = NULL;
    if (find_handle(req, res, "/extend", &h) != 0 || json_parse_body(req, res, &body) != 0)
        goto out;
    const cJSON *lease = NULL;
    int bad = !cJSON_IsObject(body);
    for (const cJSON *m = bad ? NULL : body->child; m; m = m->next) {
        if (strcmp(m->string ? m->string : "", "lease_ms") == 0 && !lease)
            lease = m;
        else
            bad = 1;
    }
    uint64_t ms = 0;
    if (bad || !lease || lease_parse(lease, req->app->cfg.max_lease_ms, &ms) != 0) {
        struct invalid_param p = {"lease_ms",
                                  "required, a positive integer (capped at max_lease_ms)"};
        res_problem(res, KVIDX_EINVAL, "the request is not valid", &p, 1);
        goto out;
    }
    if (prefetches_extend(pf, h, ms) != 0) {
        res_problem(res, KVIDX_ECONFLICT, "the handle was released", NULL, 0);
        goto out;
    }
    answer_handle(pf, h, res, 200);
out:
    cJSON_Delete(body);
    return 0;
}

/* POST /v1/prefetches/{id}/release and /extend share one route. */
static int api_prefetch_post(const struct request *req, struct response *res)
{
    uint64_t id;
    const char *suffix = "";
    if (parse_id(req, &id, &suffix) == 0 && strcmp(suffix, "/release") == 0)
        return api_prefetch_release(req, res);
    if (parse_id(req, &id, &suffix) == 0 && strcmp(suffix, "/extend") == 0)
        return api_prefetch_extend(req, res);
    return res_problem(res, KVIDX_ENOTFOUND, "no such resource", NULL, 0);
}

const struct route prefetch_routes[] = {
    {M_POST, "/v1/prefetches", api_prefetch_create, "prefetches_create", ROUTE_WRITE},
    {M_GET, "/v1/prefetches/*", api_prefetch_get, "prefetches_get", ROUTE_READ},
    {M_DELETE, "/v1/prefetches/*", api_prefetch_delete, "prefetches_delete", ROUTE_WRITE},
    {M_POST, "/v1/prefetches/*", api_prefetch_post, "prefetches_post", ROUTE_WRITE},
    {0, NULL, NULL, NULL, 0},
};
