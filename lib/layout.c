/*
 * Layout size arithmetic. Sizes are checked against KVIDX_SIZE_MAX at every
 * multiplication so a hostile shape cannot overflow 64 bits.
 */
#include "kvidx/layout.h"

#include "kvidx/err.h"

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
