/*
 * MemoryLayoutDesc arithmetic (SPEC §3.5): torch dtype sizes and the object
 * size Σ prod(shape) × itemsize(dtype), overflow-checked.
 */
#ifndef KVIDX_LAYOUT_H
#define KVIDX_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_SIZE_MAX ((uint64_t)1 << 40) /* largest size_bytes of a key */

/* Item size in bytes of a torch dtype name ("bfloat16" → 2). Returns 0 or
 * KVIDX_EINVAL for a name not in SPEC §3.5's list. */
int kvidx_dtype_size(const char *name, size_t n, unsigned *size);

/* Adds prod(dims[0..ndims)) × itemsize to *total. Every dimension must be
 * ≥ 1 and ndims ≥ 1; the total must stay ≤ KVIDX_SIZE_MAX. Returns 0 or
 * KVIDX_EINVAL (and leaves *total unchanged). */
int kvidx_layout_add(uint64_t *total, const uint64_t *dims, size_t ndims, unsigned itemsize);

#endif
