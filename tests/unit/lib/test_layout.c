/* MemoryLayoutDesc arithmetic: dtype sizes and overflow-checked products. */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/layout.h"

#include <string.h>

static unsigned dsize(const char *name)
{
    unsigned s = 0;
    cr_assert_eq(kvidx_dtype_size(name, strlen(name), &s), 0, "%s", name);
    return s;
}

Test(layout, every_spec_dtype)
{
    cr_assert_eq(dsize("float64"), 8);
    cr_assert_eq(dsize("float32"), 4);
    cr_assert_eq(dsize("float16"), 2);
    cr_assert_eq(dsize("bfloat16"), 2);
    cr_assert_eq(dsize("float8_e4m3fn"), 1);
    cr_assert_eq(dsize("float8_e5m2"), 1);
    cr_assert_eq(dsize("int64"), 8);
    cr_assert_eq(dsize("int32"), 4);
    cr_assert_eq(dsize("int16"), 2);
    cr_assert_eq(dsize("int8"), 1);
    cr_assert_eq(dsize("uint8"), 1);
    cr_assert_eq(dsize("bool"), 1);
}

Test(layout, unknown_dtypes)
{
    unsigned s = 77;
    cr_assert_eq(kvidx_dtype_size("float", 5, &s), KVIDX_EINVAL);
    cr_assert_eq(kvidx_dtype_size("torch.float16", 13, &s), KVIDX_EINVAL);
    cr_assert_eq(kvidx_dtype_size("bfloat1", 7, &s), KVIDX_EINVAL);
    cr_assert_eq(kvidx_dtype_size("bfloat16x", 9, &s), KVIDX_EINVAL);
    cr_assert_eq(s, 77);
}

Test(layout, sum_of_products)
{
    /* Two KV tensors [2, 32, 256, 8, 128] bf16 and one [4] float32. */
    uint64_t a[] = {2, 32, 256, 8, 128}, b[] = {4};
    uint64_t total = 0;
    cr_assert_eq(kvidx_layout_add(&total, a, 5, 2), 0);
    cr_assert_eq(kvidx_layout_add(&total, b, 1, 4), 0);
    cr_assert_eq(total, 2ull * 32 * 256 * 8 * 128 * 2 + 16);
}

Test(layout, rejects_zero_dims_and_overflow)
{
    uint64_t zero[] = {3, 0}, huge[] = {1ull << 30, 1ull << 30}, edge[] = {1ull << 39};
    uint64_t total = 5;
    cr_assert_eq(kvidx_layout_add(&total, zero, 2, 2), KVIDX_EINVAL);
    cr_assert_eq(kvidx_layout_add(&total, huge, 2, 1), KVIDX_EINVAL);
    cr_assert_eq(kvidx_layout_add(&total, edge, 0, 1), KVIDX_EINVAL);
    cr_assert_eq(total, 5, "a rejected shape leaves the total alone");
    total = 0;
    cr_assert_eq(kvidx_layout_add(&total, edge, 1, 2), 0, "exactly 2^40 is allowed");
    cr_assert_eq(total, KVIDX_SIZE_MAX);
    cr_assert_eq(kvidx_layout_add(&total, (uint64_t[]){1}, 1, 1), KVIDX_EINVAL, "2^40 + 1");
}
