/*
 * Layout size arithmetic and the layout registry. Sizes are checked against
 * KVIDX_SIZE_MAX at every multiplication so a hostile shape cannot overflow
 * 64 bits.
 *
 * Registry invariants: at most one entry per (model, world_size); every
 * entry owns its model and description copies; n <= cap. A failed put
 * leaves the registry as it was.
 */
#include "kvidx/layout.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/key.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned size;
} dtypes[] = {
    {"float64", 8},       {"float32", 4},     {"float16", 2}, {"bfloat16", 2},
    {"float8_e4m3fn", 1}, {"float8_e5m2", 1}, {"int64", 8},   {"int32", 4},
    {"int16", 2},         {"int8", 1},        {"uint8", 1},   {"bool", 1},
};

int kvidx_dtype_size(const char *name, size_t n, unsigned *size)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
        if (strlen(dtypes[i].name) == n && memcmp(dtypes[i].name, name, n) == 0) {
            *size = dtypes[i].size;
            return 0;
        }
    }
    return KVIDX_EINVAL;
}

int kvidx_layout_add(uint64_t *total, const uint64_t *dims, size_t ndims, unsigned itemsize)
{
    if (ndims == 0 || itemsize == 0)
        return KVIDX_EINVAL;
    uint64_t p = itemsize;
    for (size_t i = 0; i < ndims; i++) {
        if (dims[i] < 1 || dims[i] > KVIDX_SIZE_MAX)
            return KVIDX_EINVAL;
        if (p > KVIDX_SIZE_MAX / dims[i])
            return KVIDX_EINVAL;
        p *= dims[i];
    }
    if (p > KVIDX_SIZE_MAX - *total)
        return KVIDX_EINVAL;
    *total += p;
    return 0;
}

struct entry {
    char model[KVIDX_MODEL_MAX];
    size_t model_len;
    uint8_t world_size;
    uint64_t size;
    char *desc;
    size_t desc_len;
};

struct kvidx_layouts {
    struct entry *items;
    size_t n, cap;
};

int kvidx_layouts_new(kvidx_layouts_t **out)
{
    *out = kvidx_calloc(1, sizeof(**out));
    return *out ? 0 : KVIDX_ENOMEM;
}

void kvidx_layouts_free(kvidx_layouts_t *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        kvidx_free(l->items[i].desc);
    kvidx_free(l->items);
    kvidx_free(l);
}

static struct entry *find(const kvidx_layouts_t *l, const char *model, size_t model_len, uint8_t ws)
{
    for (size_t i = 0; i < l->n; i++) {
        struct entry *x = &l->items[i];
        if (x->world_size == ws && x->model_len == model_len &&
            memcmp(x->model, model, model_len) == 0)
            return x;
    }
    return NULL;
}

static void fill(const struct entry *x, kvidx_layout_entry_t *e)
{
    e->model = x->model;
    e->model_len = x->model_len;
    e->world_size = x->world_size;
    e->size = x->size;
    e->desc = x->desc;
    e->desc_len = x->desc_len;
}

int kvidx_layouts_put(kvidx_layouts_t *l, const char *model, size_t model_len, uint8_t world_size,
                      uint64_t size, const char *desc, size_t desc_len)
{
    if (model_len < 1 || model_len > KVIDX_MODEL_MAX)
        return KVIDX_EINVAL;
    char *copy = kvidx_malloc(desc_len + 1);
    if (!copy)
        return KVIDX_ENOMEM;
    memcpy(copy, desc, desc_len);
    copy[desc_len] = '\0';
    struct entry *x = find(l, model, model_len, world_size);
    if (!x) {
        if (l->n == l->cap) {
            size_t cap = l->cap ? l->cap * 2 : 8;
            struct entry *items = kvidx_realloc(l->items, cap * sizeof(*items));
            if (!items) {
                kvidx_free(copy);
                return KVIDX_ENOMEM;
            }
            l->items = items;
            l->cap = cap;
        }
        x = &l->items[l->n++];
        memcpy(x->model, model, model_len);
        x->model_len = model_len;
        x->world_size = world_size;
    } else {
        kvidx_free(x->desc);
    }
    x->size = size;
    x->desc = copy;
    x->desc_len = desc_len;
    return 0;
}

int kvidx_layouts_find(const kvidx_layouts_t *l, const char *model, size_t model_len,
                       uint8_t world_size, kvidx_layout_entry_t *e)
{
    const struct entry *x = l ? find(l, model, model_len, world_size) : NULL;
    if (!x)
        return KVIDX_ENOTFOUND;
    fill(x, e);
    return 0;
}

int kvidx_layouts_at(const kvidx_layouts_t *l, size_t i, kvidx_layout_entry_t *e)
{
    if (!l || i >= l->n)
        return KVIDX_ENOTFOUND;
    fill(&l->items[i], e);
    return 0;
}

int kvidx_layouts_remove(kvidx_layouts_t *l, const char *model, size_t model_len,
                         uint8_t world_size)
{
    struct entry *x = find(l, model, model_len, world_size);
    if (!x)
        return KVIDX_ENOTFOUND;
    kvidx_free(x->desc);
    *x = l->items[--l->n];
    return 0;
}

size_t kvidx_layouts_count(const kvidx_layouts_t *l)
{
    return l ? l->n : 0;
}
