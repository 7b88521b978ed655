/*
 * The owner of a prefetch handle (kvidx_pft_submit_t.owner): copied into
 * the handle at submit, kept until the handle is forgotten, NULL when none,
 * and a submit whose copy cannot be allocated fails with nothing changed.
 * The daemon names by it the salt a handle belongs to (state/auth.h).
 */
#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/prefetch_table.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static kvidx_key_t one_key(void)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = "m";
    k.model_len = 1;
    k.salt = "tenant";
    k.salt_len = 6;
    k.hash_len = 1;
    k.hash[0] = 7;
    return k;
}

static kvidx_pft_submit_t submit_of(const kvidx_key_t *k, const char *owner)
{
    kvidx_pft_submit_t s;
    memset(&s, 0, sizeof(s));
    s.keys = k;
    s.n = 1;
    s.mode = KVIDX_PF_LOOKUP;
    s.policy = KVIDX_TRIM_PREFIX;
    s.lease_ms = 1000;
    s.owner = owner;
    return s;
}

Test(prefetch_owner, copied_kept_and_freed)
{
    kvidx_index_t *idx = NULL;
    cr_assert_eq(kvidx_index_new(NULL, &idx), 0);
    kvidx_pft_t *t = NULL;
    cr_assert_eq(kvidx_pft_new(&t, idx, NULL, 0), 0);
    kvidx_key_t k = one_key();
    char owner[16] = "tenant";
    kvidx_pft_submit_t s = submit_of(&k, owner);
    kvidx_pft_handle_t *h = NULL, *h2 = NULL;
    uint64_t task;
    cr_assert_eq(kvidx_pft_submit(t, &s, 0, &h, &task), 0);
    strcpy(owner, "changed");
    cr_assert_str_eq(h->owner, "tenant", "the table keeps its own copy");
    cr_assert_neq((void *)h->owner, (void *)owner);
    kvidx_pft_submit_t none = submit_of(&k, NULL);
    cr_assert_eq(kvidx_pft_submit(t, &none, 0, &h2, &task), 0);
    cr_assert_null(h2->owner);
    /* The empty string is an owner too (the empty salt). */
    kvidx_pft_submit_t empty = submit_of(&k, "");
    kvidx_pft_handle_t *h3 = NULL;
    cr_assert_eq(kvidx_pft_submit(t, &empty, 0, &h3, &task), 0);
    cr_assert_not_null(h3->owner);
    cr_assert_str_eq(h3->owner, "");
    kvidx_pft_handle_t *found = NULL;
    cr_assert_eq(kvidx_pft_find(t, h->id, &found), 0);
    cr_assert_str_eq(found->owner, "tenant");
    kvidx_pft_free(t);
    kvidx_index_free(idx);
}

static long budget = -1;

static void *f_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (budget == 0)
        return NULL;
    if (budget > 0)
        budget--;
    return malloc(n);
}

static void *f_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (budget == 0)
        return NULL;
    if (budget > 0)
        budget--;
    return realloc(p, n);
}

static void f_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(prefetch_owner, out_of_memory_changes_nothing)
{
    kvidx_allocator_t a = {f_malloc, f_realloc, f_free, NULL};
    kvidx_set_allocator(&a);
    kvidx_index_t *idx = NULL;
    cr_assert_eq(kvidx_index_new(NULL, &idx), 0);
    kvidx_pft_t *t = NULL;
    cr_assert_eq(kvidx_pft_new(&t, idx, NULL, 0), 0);
    kvidx_key_t k = one_key();
    kvidx_pft_submit_t s = submit_of(&k, "tenant");
    int ok = 0, failed = 0;
    for (long n = 0; n < 40 && !ok; n++) {
        budget = n;
        kvidx_pft_handle_t *h = NULL;
        uint64_t task;
        int rc = kvidx_pft_submit(t, &s, 0, &h, &task);
        budget = -1;
        if (rc == 0) {
            cr_assert_str_eq(h->owner, "tenant");
            ok = 1;
        } else {
            cr_assert_eq(rc, KVIDX_ENOMEM);
            failed++;
            kvidx_pft_stats_t st;
            kvidx_pft_stats(t, &st);
            cr_assert_eq(st.handles, 0, "n=%ld", n);
        }
    }
    cr_assert(ok);
    cr_assert_gt(failed, 2);
    kvidx_pft_free(t);
    kvidx_index_free(idx);
    kvidx_set_allocator(NULL);
}
