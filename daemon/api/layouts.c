/*
 * PUT/GET/DELETE /v1/layouts: LMCache's MemoryLayoutDesc per (model_name,
 * world_size). A registered layout gives the size of keys stored without
 * size_bytes. The registry is a small array: models are few, lookups are
 * per stored batch, not per key (the caller caches the last hit).
 */
#include "api/api.h"
#include "state/layouts.h"

#include "util/context.h"
#include "util/json_read.h"
#include "kvidx/err.h"
#include "kvidx/key.h"
#include "kvidx/layout.h"
#include "state/persist/persist.h"

#include <stdlib.h>
#include <string.h>

/* Bounds of one layout. A real model registers a handful of shapes; the
 * bounds keep the normalized JSON well inside one journal record. */
#define LAYOUT_SHAPES_MAX 1024
#define LAYOUT_JSON_MAX   (64 * 1024)

struct layout {
    char model[KVIDX_MODEL_MAX + 1];
    size_t model_len;
    uint8_t world_size;
    uint64_t size;
    char *json; /* the normalized layout object, for GET */
};

struct layouts {
    struct layout *items;
    size_t n, cap;
};

struct layouts *layouts_new(void)
{
    return calloc(1, sizeof(struct layouts));
}

void layouts_free(struct layouts *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i].json);
    free(l->items);
    free(l);
}

static struct layout *layouts_find(const struct layouts *l, const char *model, size_t model_len,
                                   uint8_t ws)
{
    for (size_t i = 0; i < l->n; i++) {
        struct layout *x = &l->items[i];
        if (x->world_size == ws && x->model_len == model_len &&
            memcmp(x->model, model, model_len) == 0)
            return x;
    }
    return NULL;
}

int layouts_size(const struct layouts *l, const char *model, size_t model_len, uint8_t world_size,
                 uint64_t *size)
{
    const struct layout *x = l ? layouts_find(l, model, model_len, world_size) : NULL;
    if (!x)
        return KVIDX_ENOTFOUND;
    *size = x->size;
    return 0;
}

size_t layouts_count(const struct layouts *l)
{
    return l ? l->n : 0;
}

static struct layouts *app_layouts(const struct request *req)
{
    return req->app->layouts;
}

/* Validates the body and writes the normalized object into w. */
static int layout_parse(const cJSON *body, struct param_errors *pe, struct layout *out,
                        struct jw *w)
{
    const cJSON *model = NULL, *ws = NULL, *shapes = NULL, *dtypes = NULL;
    if (!cJSON_IsObject(body)) {
        param_errors_add(pe, "must be a JSON object", "body");
        return KVIDX_EINVAL;
    }
    for (const cJSON *m = body->child; m; m = m->next) {
        if (strcmp(m->string, "model_name") == 0 && !model)
            model = m;
        else if (strcmp(m->string, "world_size") == 0 && !ws)
            ws = m;
        else if (strcmp(m->string, "shapes") == 0 && !shapes)
            shapes = m;
        else if (strcmp(m->string, "dtypes") == 0 && !dtypes)
            dtypes = m;
        else
            param_errors_add(pe, "unknown or repeated member", "body");
    }
    kvidx_reason_t why;
    if (!cJSON_IsString(model) ||
        kvidx_key_check_model(model->valuestring, strlen(model->valuestring), &why) != 0)
        param_errors_add(pe, "must be a valid model name (1..255 bytes UTF-8, no '@')",
                         "model_name");
    uint64_t world = 1;
    if (ws && json_uint(ws, 1, 255, &world) != 0)
        param_errors_add(pe, "must be an integer 1..255", "world_size");
    int ns = cJSON_IsArray(shapes) ? cJSON_GetArraySize(shapes) : -1;
    int nd = cJSON_IsArray(dtypes) ? cJSON_GetArraySize(dtypes) : -1;
    if (ns < 1)
        param_errors_add(pe, "must be a non-empty array of shapes", "shapes");
    if (nd < 1)
        param_errors_add(pe, "must be a non-empty array of dtype names", "dtypes");
    if (ns >= 1 && nd >= 1 && ns != nd)
        param_errors_add(pe, "shapes and dtypes must have the same length", "dtypes");
    if (ns > LAYOUT_SHAPES_MAX)
        param_errors_add(pe, "at most 1024 shapes", "shapes");
    if (pe->n)
        return KVIDX_EINVAL;

    uint64_t total = 0;
    int i = 0;
    const cJSON *shape = shapes->child, *dt = dtypes->child;
    for (; shape && dt; shape = shape->next, dt = dt->next, i++) {
        unsigned isz = 0;
        if (!cJSON_IsString(dt) ||
            kvidx_dtype_size(dt->valuestring, strlen(dt->valuestring), &isz) != 0) {
            param_errors_add(pe, "unknown dtype (torch names such as bfloat16)", "dtypes[%d]", i);
            continue;
        }
        uint64_t dims[64];
        size_t nd2 = 0;
        int bad = !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) < 1 ||
                  cJSON_GetArraySize(shape) > 64;
        for (const cJSON *d = bad ? NULL : shape->child; d; d = d->next) {
            if (json_uint(d, 1, (double)KVIDX_SIZE_MAX, &dims[nd2]) != 0) {
                bad = 1;
                break;
            }
            nd2++;
        }
        if (bad || kvidx_layout_add(&total, dims, nd2, isz) != 0)
            param_errors_add(pe, "every shape is 1..64 dimensions, each >= 1, total <= 2^40 bytes",
                             "shapes[%d]", i);
    }
    if (pe->n)
        return KVIDX_EINVAL;

    memcpy(out->model, model->valuestring, strlen(model->valuestring) + 1);
    out->model_len = strlen(model->valuestring);
    out->world_size = (uint8_t)world;
    out->size = total;
    jw_obj_begin(w);
    jw_key(w, "model_name");
    jw_strn(w, out->model, out->model_len);
    jw_key(w, "world_size");
    jw_u64(w, world);
    jw_key(w, "shapes");
    jw_arr_begin(w);
    for (shape = shapes->child; shape; shape = shape->next) {
        jw_arr_begin(w);
        for (const cJSON *d = shape->child; d; d = d->next)
            jw_u64(w, (uint64_t)d->valuedouble);
        jw_arr_end(w);
    }
    jw_arr_end(w);
    jw_key(w, "dtypes");
    jw_arr_begin(w);
    for (dt = dtypes->child; dt; dt = dt->next)
        jw_str(w, dt->valuestring);
    jw_arr_end(w);
    jw_key(w, "size_bytes");
    jw_u64(w, total);
    jw_obj_end(w);
    return 0;
}

/* Adds x (taking json) or replaces the layout of the same model and world
 * size. 0 or KVIDX_ENOMEM (nothing changed, json not taken). */
static int layouts_insert(struct layouts *l, const struct layout *x, char *json)
{
    struct layout *old = layouts_find(l, x->model, x->model_len, x->world_size);
    if (old) {
        free(old->json);
        *old = *x;
        old->json = json;
        return 0;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct layout *items = realloc(l->items, cap * sizeof(*items));
        if (!items)
            return KVIDX_ENOMEM;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n] = *x;
    l->items[l->n++].json = json;
    return 0;
}

int layouts_at(const struct layouts *l, size_t i, const char **model, size_t *model_len,
               uint8_t *world_size, const char **json)
{
    if (!l || i >= l->n)
        return KVIDX_ENOTFOUND;
    *model = l->items[i].model;
    *model_len = l->items[i].model_len;
    *world_size = l->items[i].world_size;
    *json = l->items[i].json;
    return 0;
}

int layouts_restore(struct layouts *l, const char *json, size_t len)
{
    cJSON *body = cJSON_ParseWithLength(json, len);
    if (!body)
        return KVIDX_EINVAL;
    /* The normalized form carries the computed size, which a PUT does not. */
    cJSON_DeleteItemFromObjectCaseSensitive(body, "size_bytes");
    struct param_errors pe;
    struct layout x;
    struct buf out;
    struct jw w;
    memset(&x, 0, sizeof(x));
    param_errors_init(&pe);
    buf_init(&out);
    jw_init(&w, &out);
    int rc = layout_parse(body, &pe, &x, &w);
    cJSON_Delete(body);
    param_errors_free(&pe);
    if (rc == 0 && out.failed)
        rc = KVIDX_ENOMEM;
    if (rc == 0)
        rc = layouts_insert(l, &x, out.data);
    if (rc != 0)
        buf_free(&out);
    return rc ? (rc == KVIDX_ENOMEM ? rc : KVIDX_EINVAL) : 0;
}

int layouts_forget(struct layouts *l, const char *model, size_t model_len, uint8_t world_size)
{
    struct layout *x = layouts_find(l, model, model_len, world_size);
    if (!x)
        return KVIDX_ENOTFOUND;
    free(x->json);
    *x = l->items[--l->n];
    return 0;
}

static int layouts_put(const struct request *req, struct response *res)
{
    struct layouts *l = app_layouts(req);
    if (persist_refuse(req, res))
        return 0;
    cJSON *body;
    if (json_parse_body(req, res, &body) != 0)
        return 0;
    struct param_errors pe;
    struct layout x;
    struct buf json;
    struct jw w;
    memset(&x, 0, sizeof(x));
    param_errors_init(&pe);
    buf_init(&json);
    jw_init(&w, &json);
    int rc = layout_parse(body, &pe, &x, &w);
    cJSON_Delete(body);
    if (rc != 0) {
        param_errors_respond(&pe, res, KVIDX_EINVAL, "the layout is not valid");
        param_errors_free(&pe);
        buf_free(&json);
        return 0;
    }
    param_errors_free(&pe);
    if (json.failed) {
        buf_free(&json);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    if (json.len > LAYOUT_JSON_MAX) {
        buf_free(&json);
        struct invalid_param p = {"shapes", "the layout is larger than 64 KiB as JSON"};
        return res_problem(res, KVIDX_EINVAL, "the layout is too large", &p, 1);
    }
    const struct layout *prev = layouts_find(l, x.model, x.model_len, x.world_size);
    persist_layout_before(req->app, x.model, x.model_len, x.world_size, prev ? prev->json : NULL);
    if (layouts_insert(l, &x, json.data) != 0) {
        buf_free(&json);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    persist_layout_put(req->app, x.model, x.model_len, x.world_size, json.data, json.len);
    buf_append(&res->body, json.data, json.len);
    res_json(res, 200);
    return persist_ack(req, res);
}

static int layouts_get(const struct request *req, struct response *res)
{
    struct layouts *l = app_layouts(req);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "layouts");
    jw_arr_begin(&w);
    for (size_t i = 0; i < l->n; i++)
        jw_raw(&w, l->items[i].json, strlen(l->items[i].json));
    jw_arr_end(&w);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

static int layouts_delete(const struct request *req, struct response *res)
{
    struct layouts *l = app_layouts(req);
    if (persist_refuse(req, res))
        return 0;
    char model[KVIDX_MODEL_MAX + 1], wsbuf[16];
    size_t model_len = 0, wslen = 0;
    kvidx_reason_t why;
    int rc = query_get(req->query, "model_name", model, sizeof(model), &model_len);
    if (rc != 1 || kvidx_key_check_model(model, model_len, &why) != 0)
        return res_problem(res, KVIDX_EINVAL, "model_name must name a valid model", NULL, 0);
    uint64_t ws = 1;
    rc = query_get(req->query, "world_size", wsbuf, sizeof(wsbuf), &wslen);
    if (rc < 0)
        return res_problem(res, KVIDX_EINVAL, "world_size must be an integer 1..255", NULL, 0);
    if (rc == 1) {
        char *end = NULL;
        unsigned long v = wslen ? strtoul(wsbuf, &end, 10) : 0;
        if (!end || *end || wsbuf[0] == '-' || wsbuf[0] == '+' || v < 1 || v > 255)
            return res_problem(res, KVIDX_EINVAL, "world_size must be an integer 1..255", NULL, 0);
        ws = v;
    }
    struct layout *x = layouts_find(l, model, model_len, (uint8_t)ws);
    if (!x)
        return res_problem(res, KVIDX_ENOTFOUND, "no layout for that model and world size", NULL,
                           0);
    persist_layout_before(req->app, model, model_len, (uint8_t)ws, x->json);
    persist_layout_del(req->app, model, model_len, (uint8_t)ws);
    free(x->json);
    *x = l->items[--l->n];
    res->status = 204;
    return persist_ack(req, res);
}

const struct route layout_routes[] = {
    {M_PUT, "/v1/layouts", layouts_put, "layouts_put"},
    {M_GET, "/v1/layouts", layouts_get, "layouts_get"},
    {M_DELETE, "/v1/layouts", layouts_delete, "layouts_delete"},
    {0, NULL, NULL, NULL},
};
