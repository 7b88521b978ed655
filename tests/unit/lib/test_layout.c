/* MemoryLayoutDesc arithmetic: dtype sizes and overflow-checked products. */
#include <criterion/criterion.h>

#include "kvidx/err.h"
#include "kvidx/key.h"
#include "kvidx/layout.h"

#include <stdio.h>
#include <stdlib.h>
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

/* ---- the registry ---- */

#include "kvidx/alloc.h"

static kvidx_layout_entry_t must_find(const kvidx_layouts_t *l, const char *model, uint8_t ws)
{
    kvidx_layout_entry_t e;
    cr_assert_eq(kvidx_layouts_find(l, model, strlen(model), ws, &e), 0, "%s/%u", model, ws);
    return e;
}

Test(layouts, put_find_replace_remove)
{
    kvidx_layouts_t *l;
    cr_assert_eq(kvidx_layouts_new(&l), 0);
    cr_assert_eq(kvidx_layouts_put(l, "m", 1, 1, 100, "{\"a\":1}", 7), 0);
    cr_assert_eq(kvidx_layouts_put(l, "m", 1, 2, 200, "{}", 2), 0);
    cr_assert_eq(kvidx_layouts_put(l, "other", 5, 1, 300, "{}", 2), 0);
    cr_assert_eq(kvidx_layouts_count(l), 3);
    kvidx_layout_entry_t e = must_find(l, "m", 1);
    cr_assert_eq(e.size, 100);
    cr_assert_str_eq(e.desc, "{\"a\":1}");
    cr_assert_eq(e.desc_len, 7);
    cr_assert_eq(must_find(l, "m", 2).size, 200);
    /* A prefix of a model name is another model. */
    cr_assert_eq(kvidx_layouts_find(l, "othe", 4, 1, &e), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_layouts_find(l, "m", 1, 3, &e), KVIDX_ENOTFOUND);

    /* Replacing keeps one entry per (model, world size). */
    cr_assert_eq(kvidx_layouts_put(l, "m", 1, 1, 111, "{\"b\":2}", 7), 0);
    cr_assert_eq(kvidx_layouts_count(l), 3);
    cr_assert_eq(must_find(l, "m", 1).size, 111);
    cr_assert_str_eq(must_find(l, "m", 1).desc, "{\"b\":2}");

    cr_assert_eq(kvidx_layouts_remove(l, "m", 1, 1), 0);
    cr_assert_eq(kvidx_layouts_remove(l, "m", 1, 1), KVIDX_ENOTFOUND);
    cr_assert_eq(kvidx_layouts_count(l), 2);
    cr_assert_eq(kvidx_layouts_find(l, "m", 1, 1, &e), KVIDX_ENOTFOUND);
    size_t seen = 0;
    for (size_t i = 0; kvidx_layouts_at(l, i, &e) == 0; i++)
        seen += e.size;
    cr_assert_eq(seen, 500);
    cr_assert_eq(kvidx_layouts_at(l, 2, &e), KVIDX_ENOTFOUND);
    kvidx_layouts_free(l);
}

Test(layouts, model_length_bounds)
{
    kvidx_layouts_t *l;
    char big[KVIDX_MODEL_MAX + 1];
    memset(big, 'x', sizeof(big));
    cr_assert_eq(kvidx_layouts_new(&l), 0);
    cr_assert_eq(kvidx_layouts_put(l, big, 0, 1, 1, "", 0), KVIDX_EINVAL);
    cr_assert_eq(kvidx_layouts_put(l, big, KVIDX_MODEL_MAX + 1, 1, 1, "", 0), KVIDX_EINVAL);
    cr_assert_eq(kvidx_layouts_put(l, big, KVIDX_MODEL_MAX, 1, 1, "", 0), 0);
    cr_assert_eq(kvidx_layouts_count(l), 1);
    kvidx_layouts_free(l);
}

/* The Nth allocation fails, for every N until a workload completes: each
 * failure is KVIDX_ENOMEM and leaves the registry as it was. */
static long alloc_budget;
static void *fail_malloc(void *ctx, size_t n)
{
    (void)ctx;
    return alloc_budget-- > 0 ? malloc(n) : NULL;
}
static void *fail_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    return alloc_budget-- > 0 ? realloc(p, n) : NULL;
}
static void plain_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(layouts, out_of_memory_changes_nothing)
{
    const kvidx_allocator_t a = {fail_malloc, fail_realloc, plain_free, NULL};
    int completed = 0;
    for (long n = 0; !completed && n < 100; n++) {
        kvidx_set_allocator(&a);
        alloc_budget = n;
        kvidx_layouts_t *l = NULL;
        int rc = kvidx_layouts_new(&l);
        if (rc != 0) {
            cr_assert_eq(rc, KVIDX_ENOMEM);
            continue;
        }
        size_t i = 0;
        char model[16];
        for (; i < 20; i++) {
            snprintf(model, sizeof(model), "model-%zu", i);
            rc = kvidx_layouts_put(l, model, strlen(model), 1, i + 1, "{}", 2);
            if (rc != 0)
                break;
        }
        if (rc != 0) {
            cr_assert_eq(rc, KVIDX_ENOMEM);
            cr_assert_eq(kvidx_layouts_count(l), i, "a failed put changed the registry");
            snprintf(model, sizeof(model), "model-%zu", i);
            kvidx_layout_entry_t e;
            cr_assert_eq(kvidx_layouts_find(l, model, strlen(model), 1, &e), KVIDX_ENOTFOUND);
        } else {
            completed = 1;
        }
        for (size_t j = 0; j < kvidx_layouts_count(l); j++) {
            kvidx_layout_entry_t e;
            cr_assert_eq(kvidx_layouts_at(l, j, &e), 0);
            cr_assert_eq(e.size, j + 1);
        }
        kvidx_layouts_free(l);
    }
    kvidx_set_allocator(NULL);
    cr_assert(completed, "the workload never completed");
}
