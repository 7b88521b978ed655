/*
 * The layout registry (MemoryLayoutDesc): (model_name, world_size) → object
 * size, with the shapes and dtypes kept in a normal JSON form so GET can
 * echo them and the journal can record them. Backed by libkvidx's registry.
 */
#ifndef KVIDXD_LAYOUTS_H
#define KVIDXD_LAYOUTS_H

#include "util/json_read.h"
#include "util/json_write.h"

#include "kvidx/key.h"
#include "kvidx/layout.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds of one layout. A real model registers a handful of shapes; the
 * bounds keep the normalized JSON well inside one journal record. */
#define LAYOUT_SHAPES_MAX 1024
#define LAYOUT_JSON_MAX   (64 * 1024)

struct layouts;

/* One layout as parsed from a body. */
struct layout {
    char model[KVIDX_MODEL_MAX + 1];
    size_t model_len;
    uint8_t world_size;
    uint64_t size;
};

struct layouts *layouts_new(void);
void layouts_free(struct layouts *l);
/* Size of the layout of (model, world_size): 0 and *size, or KVIDX_ENOTFOUND. */
int layouts_size(const struct layouts *l, const char *model, size_t model_len, uint8_t world_size,
                 uint64_t *size);
size_t layouts_count(const struct layouts *l);
/* The normalized JSON of (model, world_size), NUL-terminated and valid until
 * the registry changes; NULL when there is none. */
const char *layouts_json(const struct layouts *l, const char *model, size_t model_len,
                         uint8_t world_size);
/* Validates a MemoryLayoutDesc body (model_name, world_size default 1,
 * shapes and dtypes of one length) into *out, and writes its normal form
 * into w. 0, or KVIDX_EINVAL with every problem in pe. */
int layouts_parse(const cJSON *body, struct param_errors *pe, struct layout *out, struct jw *w);
/* Registers x with its normal form (copied), replacing the layout of the
 * same model and world size. 0 or KVIDX_ENOMEM (nothing changed). */
int layouts_insert(struct layouts *l, const struct layout *x, const char *json, size_t json_len);

/* For persistence: the i-th layout (0 or KVIDX_ENOTFOUND past the end);
 * registers a layout from its normalized JSON (0 or KVIDX_EINVAL/ENOMEM);
 * removes one (0 or KVIDX_ENOTFOUND). */
int layouts_at(const struct layouts *l, size_t i, const char **model, size_t *model_len,
               uint8_t *world_size, const char **json);
int layouts_restore(struct layouts *l, const char *json, size_t len);
int layouts_forget(struct layouts *l, const char *model, size_t model_len, uint8_t world_size);

#endif
