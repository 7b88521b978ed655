/*
 * MemoryLayoutDesc: torch dtype sizes, the object size Σ prod(shape) ×
 * itemsize(dtype) (overflow-checked), and the registry of layouts by
 * (model_name, world_size) that gives the size of keys stored without one.
 */
#ifndef KVIDX_LAYOUT_H
#define KVIDX_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_SIZE_MAX ((uint64_t)1 << 40) /* largest size_bytes of a key */

/* Item size in bytes of a torch dtype name ("bfloat16" → 2). Returns 0 or
 * KVIDX_EINVAL for a name not among the torch dtypes of docs/api.md. */
int kvidx_dtype_size(const char *name, size_t n, unsigned *size);

/* Adds prod(dims[0..ndims)) × itemsize to *total. Every dimension must be
 * ≥ 1 and ndims ≥ 1; the total must stay ≤ KVIDX_SIZE_MAX. Returns 0 or
 * KVIDX_EINVAL (and leaves *total unchanged). */
int kvidx_layout_add(uint64_t *total, const uint64_t *dims, size_t ndims, unsigned itemsize);

/* The registry. Each layout is (model_name, world_size) → size, with its
 * description (the normalized JSON object the daemon echoes; opaque bytes
 * here) copied in. Models are few and lookups are per stored batch, so it
 * is a small array searched linearly; the order of layouts_at is the order
 * of registration, except that removing one moves the last into its place. */
typedef struct kvidx_layouts kvidx_layouts_t;

typedef struct kvidx_layout_entry {
    const char *model; /* not NUL-terminated */
    size_t model_len;
    uint8_t world_size;
    uint64_t size;
    const char *desc; /* NUL-terminated copy */
    size_t desc_len;
} kvidx_layout_entry_t;

/* 0 and *out, or KVIDX_ENOMEM. */
int kvidx_layouts_new(kvidx_layouts_t **out);
void kvidx_layouts_free(kvidx_layouts_t *l);
/* Registers, or replaces, the layout of (model, world_size). Copies model
 * (1..255 bytes) and desc. 0, KVIDX_EINVAL (model length), or KVIDX_ENOMEM
 * (nothing changed). */
int kvidx_layouts_put(kvidx_layouts_t *l, const char *model, size_t model_len, uint8_t world_size,
                      uint64_t size, const char *desc, size_t desc_len);
/* 0 and *e (valid until the registry next changes), or KVIDX_ENOTFOUND. */
int kvidx_layouts_find(const kvidx_layouts_t *l, const char *model, size_t model_len,
                       uint8_t world_size, kvidx_layout_entry_t *e);
/* The i-th layout: 0, or KVIDX_ENOTFOUND past the end. */
int kvidx_layouts_at(const kvidx_layouts_t *l, size_t i, kvidx_layout_entry_t *e);
/* 0, or KVIDX_ENOTFOUND. */
int kvidx_layouts_remove(kvidx_layouts_t *l, const char *model, size_t model_len,
                         uint8_t world_size);
size_t kvidx_layouts_count(const kvidx_layouts_t *l);

#endif
