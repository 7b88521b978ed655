/*
 * The layout registry as the daemon holds it: libkvidx's registry of
 * (model_name, world_size) → object size, each with its normalized JSON
 * description (what GET echoes and the journal records), and the parser
 * that turns a MemoryLayoutDesc body into that normal form.
 *
 * The normal form is {"model_name","world_size","shapes","dtypes",
 * "size_bytes"} with every dimension as a plain integer, so the same layout
 * always has the same bytes; restoring a journal record parses it again, so
 * a record that is not a valid layout is refused rather than served.
 */
#include "state/layouts.h"

#include "util/json_write.h"

#include "kvidx/err.h"
#include "kvidx/key.h"

#include <stdlib.h>
#include <string.h>

struct layouts {
    kvidx_layouts_t *reg;
};

struct layouts *layouts_new(void)
{
    struct layouts *l = calloc(1, sizeof(*l));
    if (l && kvidx_layouts_new(&l->reg) != 0) {
        free(l);
        l = NULL;
    }
    return l;
}

void layouts_free(struct layouts *l)
{
    if (!l)
        return;
    kvidx_layouts_free(l->reg);
    free(l);
}

int layouts_size(const struct layouts *l, const char *model, size_t model_len, uint8_t world_size,
                 uint64_t *size)
{
    kvidx_layout_entry_t e;
    int rc = l ? kvidx_layouts_find(l->reg, model, model_len, world_size, &e) : KVIDX_ENOTFOUND;
    if (rc == 0)
        *size = e.size;
    return rc;
}

const char *layouts_json(const struct layouts *l, const char *model, size_t model_len,
                         uint8_t world_size)
{
    kvidx_layout_entry_t e;
    return kvidx_layouts_find(l->reg, model, model_len, world_size, &e) == 0 ? e.desc : NULL;
}

size_t layouts_count(const struct layouts *l)
{
    return l ? kvidx_layouts_count(l->reg) : 0;
}

int layouts_at(const struct layouts *l, size_t i, const char **model, size_t *model_len,
               uint8_t *world_size, const char **json)
{
    kvidx_layout_entry_t e;
    int rc = l ? kvidx_layouts_at(l->reg, i, &e) : KVIDX_ENOTFOUND;
    if (rc == 0) {
        *model = e.model;
        *model_len = e.model_len;
        *world_size = e.world_size;
        *json = e.desc;
    }
    return rc;
}

int layouts_insert(struct layouts *l, const struct layout *x, const char *json, size_t json_len)
{
    return kvidx_layouts_put(l->reg, x->model, x->model_len, x->world_size, x->size, json,
                             json_len);
}

int layouts_forget(struct layouts *l, const char *model, size_t model_len, uint8_t world_size)
{
    return kvidx_layouts_remove(l->reg, model, model_len, world_size);
}

int layouts_parse(const cJSON *body, struct param_errors *pe, struct layout *out, struct jw *w)
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
    int rc = layouts_parse(body, &pe, &x, &w);
    cJSON_Delete(body);
    param_errors_free(&pe);
    if (rc == 0 && out.failed)
        rc = KVIDX_ENOMEM;
    if (rc == 0)
        rc = layouts_insert(l, &x, out.data, out.len);
    buf_free(&out);
    return rc ? (rc == KVIDX_ENOMEM ? rc : KVIDX_EINVAL) : 0;
}
