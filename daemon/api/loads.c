/*
 * /v1/loads: the external loader's side of the prefetch table (loader =
 * external). GET lists the unfinished tasks, oldest first, with an
 * optional long poll for the next one; POST /v1/loads/{task} reports which
 * of a task's loads the data plane finished ("loaded") or gave up on
 * ("failed").
 *
 * Owns only the wire side: the tasks and loads are the prefetch table's
 * (kvidx/prefetch_table.h, through state/prefetches.h). Invariants: a
 * report is checked whole before any load of it finishes (nothing changes
 * on a 400); a load named twice counts once, as its first mention says;
 * with the catalog loader no task is listed (they finish on their own). A
 * salt-bound token sees only the loads of its salt's keys: a task with
 * none is not there for it, and another salt's load in a report is not a
 * pending key of the task.
 */
#include "api/api.h"

#include "state/prefetches.h"
#include "util/context.h"
#include "api/body.h"
#include "util/json_read.h"

#include "kvidx/err.h"
#include "kvidx/prefetch_table.h"
#include "kvidx/tokens.h"

#include <stdlib.h>
#include <string.h>

/* The key of the open load at position i of t, when p may see it: 0, or
 * KVIDX_ENOTFOUND. */
static int task_key(const kvidx_pft_task_t *t, size_t i, const kvidx_index_t *idx,
                    const kvidx_principal_t *p, kvidx_ref_t *ref, kvidx_key_t *k)
{
    if (kvidx_pft_task_ref(t, i, ref) != 0 || kvidx_index_key(idx, *ref, k) != 0)
        return KVIDX_ENOTFOUND;
    return !p || kvidx_principal_sees_salt(p, k->salt, k->salt_len) ? 0 : KVIDX_ENOTFOUND;
}

/* 1 when p may see a load of t. */
static int task_visible(const kvidx_pft_task_t *t, const kvidx_index_t *idx,
                        const kvidx_principal_t *p)
{
    kvidx_ref_t ref;
    kvidx_key_t k;
    for (size_t i = 0; i < t->n; i++)
        if (task_key(t, i, idx, p, &ref, &k) == 0)
            return 1;
    return 0;
}

/* 1 when a task p may see is open. */
static int any_task(struct prefetches *pf, const kvidx_principal_t *p)
{
    for (const kvidx_pft_task_t *t = prefetches_tasks(pf); t; t = kvidx_pft_task_next(t))
        if (!p || task_visible(t, prefetches_index(pf), p))
            return 1;
    return 0;
}

static void jw_task(struct jw *w, struct prefetches *pf, const kvidx_index_t *idx,
                    const kvidx_pft_task_t *t, const kvidx_principal_t *p)
{
    jw_obj_begin(w);
    jw_key(w, "task");
    jw_u64(w, t->id);
    jw_key(w, "created_at_ms");
    jw_u64(w, t->created_wall_ms);
    jw_key(w, "deadline_ms");
    jw_u64(w, prefetches_wall_at(pf, t->deadline));
    jw_key(w, "keys");
    jw_arr_begin(w);
    for (size_t i = 0; i < t->n; i++) {
        kvidx_ref_t ref;
        kvidx_key_t k;
        kvidx_entry_info_t info;
        if (task_key(t, i, idx, p, &ref, &k) != 0 || kvidx_index_info(idx, ref, &info) != 0)
            continue;
        jw_obj_begin(w);
        jw_key(w, "index");
        jw_u64(w, i);
        jw_key(w, "key");
        jw_key_object(w, &k);
        jw_key(w, "size_bytes");
        jw_u64(w, info.size_bytes);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
}

/* The answer of GET /v1/loads (also a long poll's: prefetches_answer_fn). */
static void answer_loads(struct prefetches *pf, kvidx_pft_handle_t *h, struct response *res)
{
    (void)h;
    const kvidx_index_t *idx = prefetches_index(pf);
    struct jw w;
    buf_reset(&res->body);
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "tasks");
    jw_arr_begin(&w);
    for (const kvidx_pft_task_t *t = prefetches_tasks(pf); t; t = kvidx_pft_task_next(t))
        if (!res->principal || task_visible(t, idx, res->principal))
            jw_task(&w, pf, idx, t, res->principal);
    jw_arr_end(&w);
    jw_obj_end(&w);
    if (res->body.failed) {
        buf_reset(&res->body);
        res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        return;
    }
    res_json(res, 200);
}

static int api_loads_get(const struct request *req, struct response *res)
{
    struct prefetches *pf = req->app->prefetches;
    uint64_t wait = 0;
    int given = 0;
    if (prefetches_poll_query(req, res, &given, &wait) != 0)
        return 0;
    if (!any_task(pf, req->principal) && given && wait > 0 && prefetches_ready(pf) == 0)
        return prefetches_poll(pf, NULL, res, wait, answer_loads);
    answer_loads(pf, NULL, res);
    return 0;
}

/* One item of loaded/failed: a task position or a key object. 0 with
 * *pos of an open load of t that p may see, or KVIDX_ENOTFOUND. */
static int task_item(const kvidx_pft_task_t *t, const cJSON *x, const kvidx_index_t *idx,
                     const kvidx_principal_t *p, size_t *pos)
{
    kvidx_ref_t ref;
    kvidx_key_t lk;
    if (cJSON_IsNumber(x)) {
        uint64_t v;
        if (json_uint(x, 0, (double)UINT32_MAX, &v) != 0 ||
            task_key(t, (size_t)v, idx, p, &ref, &lk) != 0)
            return KVIDX_ENOTFOUND;
        *pos = (size_t)v;
        return 0;
    }
    kvidx_key_t k;
    kvidx_reason_t why;
    if (json_to_key(x, &k, &why) != 0)
        return KVIDX_ENOTFOUND;
    for (size_t i = 0; i < t->n; i++) {
        if (task_key(t, i, idx, p, &ref, &lk) == 0 && kvidx_key_equal(&lk, &k)) {
            *pos = i;
            return 0;
        }
    }
    return KVIDX_ENOTFOUND;
}

/* A report: {"loaded": [...], "failed": [...]}, both optional. */
struct report {
    const cJSON *lists[2]; /* loaded, failed */
    size_t *pos;           /* the positions named, first mentions only */
    uint8_t *ok;
    size_t n;
};

static const char *const list_names[2] = {"loaded", "failed"};

/* Checks the whole report against t and collects its positions: 0, or the
 * code of the 400 (or 503) answered. */
static int parse_report(const cJSON *body, const kvidx_pft_task_t *t, const kvidx_index_t *idx,
                        const kvidx_principal_t *p, struct report *r, struct response *res)
{
    struct param_errors pe;
    param_errors_init(&pe);
    int rc = 0;
    size_t items = 0;
    if (!cJSON_IsObject(body))
        param_errors_add(&pe, "must be a JSON object", "body");
    for (const cJSON *m = cJSON_IsObject(body) ? body->child : NULL; m; m = m->next) {
        const char *name = m->string ? m->string : "";
        int which = strcmp(name, "loaded") == 0 ? 0 : strcmp(name, "failed") == 0 ? 1 : -1;
        if (which < 0 || r->lists[which])
            param_errors_add(&pe, "unknown or repeated member", "body");
        else if (!cJSON_IsArray(m))
            param_errors_add(&pe, "must be an array of task indices or keys", "%s",
                             list_names[which]);
        else
            r->lists[which] = m;
    }
    for (int which = 0; which < 2 && !pe.n; which++) {
        size_t j = 0, pos;
        for (const cJSON *x = r->lists[which] ? r->lists[which]->child : NULL; x;
             x = x->next, j++, items++)
            if (task_item(t, x, idx, p, &pos) != 0)
                param_errors_add(&pe, "not a pending key of this task", "%s[%zu]",
                                 list_names[which], j);
    }
    if (pe.n) {
        rc = KVIDX_EINVAL;
        param_errors_respond(&pe, res, rc, "nothing was completed");
        goto out;
    }
    r->pos = malloc((items ? items : 1) * sizeof(*r->pos));
    r->ok = malloc(items ? items : 1);
    if (!r->pos || !r->ok) {
        rc = KVIDX_ENOMEM;
        res_problem(res, rc, "out of memory", NULL, 0);
        goto out;
    }
    for (int which = 0; which < 2; which++) {
        for (const cJSON *x = r->lists[which] ? r->lists[which]->child : NULL; x; x = x->next) {
            size_t pos = 0, d = 0;
            task_item(t, x, idx, p, &pos);
            while (d < r->n && r->pos[d] != pos)
                d++;
            if (d < r->n)
                continue; /* named twice: the first mention wins */
            r->pos[r->n] = pos;
            r->ok[r->n++] = which == 0;
        }
    }
out:
    param_errors_free(&pe);
    return rc;
}

static int api_loads_post(const struct request *req, struct response *res)
{
    struct prefetches *pf = req->app->prefetches;
    struct report r;
    memset(&r, 0, sizeof(r));
    cJSON *body = NULL;
    uint64_t id = 0;
    size_t used = 0;
    const kvidx_pft_task_t *t = NULL;
    if (req->route_param &&
        kvidx_pft_parse_id(req->route_param, req->route_param_len, &id, &used) == 0 &&
        used == req->route_param_len)
        t = prefetches_task(pf, id);
    if (t && req->principal && !task_visible(t, prefetches_index(pf), req->principal))
        t = NULL; /* another salt's: not there for this token */
    if (!t) {
        res_problem(res, KVIDX_ENOTFOUND, "no such load task (finished or timed out?)", NULL, 0);
        goto out;
    }
    if (json_parse_body(req, res, &body) != 0 ||
        parse_report(body, t, prefetches_index(pf), req->principal, &r, res) != 0)
        goto out;
    size_t loaded = 0, failed = 0;
    /* By id: finishing the last load forgets the task. */
    for (size_t d = 0; d < r.n; d++) {
        prefetches_task_finish(pf, id, r.pos[d], r.ok[d]);
        loaded += r.ok[d];
        failed += !r.ok[d];
    }
    t = prefetches_task(pf, id);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "task");
    jw_u64(&w, id);
    jw_key(&w, "loaded");
    jw_u64(&w, loaded);
    jw_key(&w, "failed");
    jw_u64(&w, failed);
    jw_key(&w, "open");
    jw_u64(&w, t ? t->open : 0);
    jw_obj_end(&w);
    res_json(res, 200);
out:
    free(r.pos);
    free(r.ok);
    cJSON_Delete(body);
    return 0;
}

const struct route load_routes[] = {
    {M_GET, "/v1/loads", api_loads_get, "loads_get", ROUTE_READ},
    {M_POST, "/v1/loads/*", api_loads_post, "loads_post", ROUTE_WRITE},
    {0, NULL, NULL, NULL, 0},
};
