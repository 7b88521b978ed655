/*
 * PUT/GET/DELETE /v1/layouts: LMCache's MemoryLayoutDesc per (model_name,
 * world_size). A registered layout gives the size of keys stored without
 * size_bytes. The registry and the body's normal form are state/layouts.c's;
 * these handlers validate, journal and answer. A change is journaled before
 * it is answered, and undone if the journal refuses it.
 */
#include "api/api.h"
#include "state/layouts.h"

#include "util/context.h"
#include "api/body.h"
#include "util/json_read.h"
#include "kvidx/err.h"
#include "kvidx/key.h"
#include "kvidx/layout.h"
#include "state/persist/persist.h"

#include <stdlib.h>
#include <string.h>

static struct layouts *app_layouts(const struct request *req)
{
    return req->app->layouts;
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
    int rc = layouts_parse(body, &pe, &x, &w);
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
    persist_layout_before(req->app, x.model, x.model_len, x.world_size,
                          layouts_json(l, x.model, x.model_len, x.world_size));
    if (layouts_insert(l, &x, json.data, json.len) != 0) {
        buf_free(&json);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    persist_layout_put(req->app, x.model, x.model_len, x.world_size, json.data, json.len);
    buf_append(&res->body, json.data, json.len);
    buf_free(&json);
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
    const char *model, *json;
    size_t model_len;
    uint8_t ws;
    for (size_t i = 0; layouts_at(l, i, &model, &model_len, &ws, &json) == 0; i++)
        jw_raw(&w, json, strlen(json));
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
    const char *old = layouts_json(l, model, model_len, (uint8_t)ws);
    if (!old)
        return res_problem(res, KVIDX_ENOTFOUND, "no layout for that model and world size", NULL,
                           0);
    persist_layout_before(req->app, model, model_len, (uint8_t)ws, old);
    persist_layout_del(req->app, model, model_len, (uint8_t)ws);
    layouts_forget(l, model, model_len, (uint8_t)ws);
    res->status = 204;
    return persist_ack(req, res);
}

const struct route layout_routes[] = {
    {M_PUT, "/v1/layouts", layouts_put, "layouts_put", ROUTE_ADMIN},
    {M_GET, "/v1/layouts", layouts_get, "layouts_get", ROUTE_READ},
    {M_DELETE, "/v1/layouts", layouts_delete, "layouts_delete", ROUTE_ADMIN},
    {0, NULL, NULL, NULL, 0},
};
