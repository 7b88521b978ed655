/*
 * The layout registry of SPEC §3.5: (model_name, world_size) → object size,
 * with the shapes and dtypes kept as registered so GET can echo them.
 */
#ifndef KVIDXD_LAYOUTS_H
#define KVIDXD_LAYOUTS_H

#include <stddef.h>
#include <stdint.h>

struct layouts;

struct layouts *layouts_new(void);
void layouts_free(struct layouts *l);
/* Size of the layout of (model, world_size): 0 and *size, or KVIDX_ENOTFOUND. */
int layouts_size(const struct layouts *l, const char *model, size_t model_len, uint8_t world_size,
                 uint64_t *size);
size_t layouts_count(const struct layouts *l);

/* For persistence: the i-th layout (0 or KVIDX_ENOTFOUND past the end);
 * registers a layout from its normalized JSON (0 or KVIDX_EINVAL/ENOMEM);
 * removes one (0 or KVIDX_ENOTFOUND). */
int layouts_at(const struct layouts *l, size_t i, const char **model, size_t *model_len,
               uint8_t *world_size, const char **json);
int layouts_restore(struct layouts *l, const char *json, size_t len);
int layouts_forget(struct layouts *l, const char *model, size_t model_len, uint8_t world_size);

#endif
