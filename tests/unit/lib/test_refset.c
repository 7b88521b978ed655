/*
 * kvidx_refset against a reference model (a byte per possible ref): random
 * adds, removes, marks and walks, with kvidx_refset_check after every
 * step; removal during a walk; the reserved values; out of memory in
 * reserve leaves the set unchanged; and each kind of broken invariant is
 * seen by the check.
 */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/refset.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

enum { UNIVERSE = 4096 };

/* The model: 0 absent, 1 member, 2 marked member. Refs are spread over
 * the whole 32-bit range (class bits included), as the index's are. */
static uint32_t ref_of(uint32_t i)
{
    return (i % 8) << 29 | (i / 8) * 3;
}

static void agree(const kvidx_refset_t *s, const uint8_t *model)
{
    cr_assert_eq(kvidx_refset_check(s), 0);
    size_t members = 0, marked = 0;
    for (uint32_t i = 0; i < UNIVERSE; i++) {
        cr_assert_eq(kvidx_refset_has(s, ref_of(i)), model[i] != 0, "ref %u", i);
        cr_assert_eq(kvidx_refset_marked(s, ref_of(i)), model[i] == 2, "ref %u", i);
        members += model[i] != 0;
        marked += model[i] == 2;
    }
    cr_assert_eq(s->count, members);
    cr_assert_eq(s->marked, marked);
    size_t pos = 0, walked = 0;
    uint32_t ref;
    int mark;
    while (kvidx_refset_next(s, &pos, &ref, &mark))
        walked++;
    cr_assert_eq(walked, members);
}

Test(refset, random_operations_match_the_model)
{
    kvidx_refset_t s;
    kvidx_refset_init(&s);
    static uint8_t model[UNIVERSE];
    memset(model, 0, sizeof(model));
    for (int step = 0; step < 40000; step++) {
        uint32_t i = rnd(step < 20000 ? UNIVERSE : UNIVERSE / 4);
        uint32_t r = ref_of(i);
        switch (rnd(6)) {
        case 0:
        case 1: {
            cr_assert_eq(kvidx_refset_reserve(&s, 1), 0);
            int mark = (int)rnd(2);
            int rc = kvidx_refset_add(&s, r, mark);
            cr_assert_eq(rc, model[i] ? 0 : 1);
            if (!model[i])
                model[i] = 1;
            if (mark)
                model[i] = 2;
            break;
        }
        case 2:
            cr_assert_eq(kvidx_refset_remove(&s, r), model[i] != 0);
            model[i] = 0;
            break;
        case 3:
            cr_assert_eq(kvidx_refset_mark(&s, r), model[i] != 0);
            if (model[i])
                model[i] = 2;
            break;
        case 4:
            if (rnd(3) == 0) {
                cr_assert_eq(kvidx_refset_unmark(&s, r), model[i] != 0);
                if (model[i])
                    model[i] = 1;
            } else if (rnd(50) == 0) {
                kvidx_refset_unmark_all(&s);
                for (uint32_t j = 0; j < UNIVERSE; j++)
                    if (model[j])
                        model[j] = 1;
            }
            break;
        default:
            /* A sweep of the unmarked, as a resynchronisation ends. */
            if (rnd(200) == 0) {
                size_t pos = 0;
                uint32_t ref;
                int mark;
                while (kvidx_refset_next(&s, &pos, &ref, &mark))
                    if (!mark)
                        cr_assert_eq(kvidx_refset_remove(&s, ref), 1);
                for (uint32_t j = 0; j < UNIVERSE; j++)
                    if (model[j] == 1)
                        model[j] = 0;
            }
            break;
        }
        if (step % 97 == 0)
            agree(&s, model);
    }
    agree(&s, model);
    kvidx_refset_free(&s);
    cr_assert_eq(kvidx_refset_check(&s), 0);
    cr_assert_eq(s.count, 0);
}

Test(refset, a_walk_that_removes_everything_sees_each_member_once)
{
    kvidx_refset_t s;
    kvidx_refset_init(&s);
    cr_assert_eq(kvidx_refset_reserve(&s, 3000), 0);
    for (uint32_t i = 0; i < 3000; i++)
        cr_assert_eq(kvidx_refset_add(&s, ref_of(i), 0), 1);
    static uint8_t seen[UNIVERSE];
    memset(seen, 0, sizeof(seen));
    size_t pos = 0, n = 0;
    uint32_t ref;
    while (kvidx_refset_next(&s, &pos, &ref, NULL)) {
        uint32_t i = (ref >> 29) + 8 * ((ref & ((1u << 29) - 1)) / 3);
        cr_assert_lt(i, 3000u);
        cr_assert_eq(seen[i], 0, "ref %u twice", i);
        seen[i] = 1;
        n++;
        cr_assert_eq(kvidx_refset_remove(&s, ref), 1);
        /* Removing another member ahead of the walk: it is not seen. */
        if (n % 10 == 0) {
            for (uint32_t j = 0; j < 3000; j++) {
                if (!seen[j] && kvidx_refset_has(&s, ref_of(j))) {
                    cr_assert_eq(kvidx_refset_remove(&s, ref_of(j)), 1);
                    seen[j] = 2;
                    break;
                }
            }
        }
    }
    for (uint32_t i = 0; i < 3000; i++)
        cr_assert_neq(seen[i], 0, "ref %u never seen nor removed", i);
    cr_assert_eq(s.count, 0);
    cr_assert_eq(kvidx_refset_check(&s), 0);
    kvidx_refset_free(&s);
}

Test(refset, reserved_values_and_room)
{
    kvidx_refset_t s;
    kvidx_refset_init(&s);
    cr_assert_eq(kvidx_refset_add(&s, 5, 0), KVIDX_ENOMEM, "no room without reserve");
    cr_assert_eq(kvidx_refset_reserve(&s, 1), 0);
    cr_assert_eq(kvidx_refset_add(&s, KVIDX_REFSET_EMPTY, 0), KVIDX_EINVAL);
    cr_assert_eq(kvidx_refset_add(&s, KVIDX_REFSET_TOMB, 0), KVIDX_EINVAL);
    cr_assert_eq(kvidx_refset_has(&s, KVIDX_REFSET_EMPTY), 0);
    cr_assert_eq(kvidx_refset_remove(&s, KVIDX_REFSET_TOMB), 0);
    cr_assert_eq(kvidx_refset_add(&s, 5, 1), 1);
    cr_assert_eq(kvidx_refset_marked(&s, 5), 1);
    cr_assert_eq(kvidx_refset_reserve(&s, (size_t)1 << 31), KVIDX_EINVAL);
    /* Reserved room is honoured without allocating. */
    cr_assert_eq(kvidx_refset_reserve(&s, 100), 0);
    uint32_t *before = s.slots;
    for (uint32_t i = 0; i < 100; i++)
        cr_assert_geq(kvidx_refset_add(&s, 1000 + i, 0), 0);
    cr_assert_eq(s.slots, before);
    cr_assert_eq(kvidx_refset_check(&s), 0);
    kvidx_refset_free(&s);
}

static int fail_next;

static void *f_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (fail_next && --fail_next == 0)
        return NULL;
    return malloc(n);
}

static void *f_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (fail_next && --fail_next == 0)
        return NULL;
    return realloc(p, n);
}

static void f_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(refset, out_of_memory_in_reserve_changes_nothing)
{
    kvidx_allocator_t a = {f_malloc, f_realloc, f_free, NULL};
    kvidx_set_allocator(&a);
    kvidx_refset_t s;
    kvidx_refset_init(&s);
    cr_assert_eq(kvidx_refset_reserve(&s, 10), 0);
    for (uint32_t i = 0; i < 10; i++)
        kvidx_refset_add(&s, i * 7, (int)(i % 2));
    for (int n = 1; n <= 2; n++) {
        kvidx_refset_t copy = s;
        fail_next = n;
        cr_assert_eq(kvidx_refset_reserve(&s, 1000), KVIDX_ENOMEM);
        fail_next = 0;
        cr_assert_eq(memcmp(&copy, &s, sizeof(s)), 0);
        cr_assert_eq(kvidx_refset_check(&s), 0);
    }
    cr_assert_eq(kvidx_refset_reserve(&s, 1000), 0);
    for (uint32_t i = 0; i < 10; i++)
        cr_assert_eq(kvidx_refset_marked(&s, i * 7), (int)(i % 2), "mark kept across a rebuild");
    kvidx_refset_free(&s);
    kvidx_set_allocator(NULL);
}

Test(refset, the_check_sees_broken_invariants)
{
    kvidx_refset_t s;
    kvidx_refset_init(&s);
    cr_assert_eq(kvidx_refset_reserve(&s, 8), 0);
    for (uint32_t i = 0; i < 8; i++)
        kvidx_refset_add(&s, 100 + i, 0);
    cr_assert_eq(kvidx_refset_check(&s), 0);
    s.count++;
    cr_assert_eq(kvidx_refset_check(&s), KVIDX_EINTERNAL, "count");
    s.count--;
    /* A mark on an empty slot. */
    size_t empty = 0;
    while (s.slots[empty] != KVIDX_REFSET_EMPTY)
        empty++;
    s.marks[empty / 64] |= UINT64_C(1) << (empty % 64);
    cr_assert_eq(kvidx_refset_check(&s), KVIDX_EINTERNAL, "mark on an empty slot");
    s.marks[empty / 64] &= ~(UINT64_C(1) << (empty % 64));
    /* A member that its probe cannot reach (moved to an empty slot). */
    size_t member = 0;
    while (s.slots[member] == KVIDX_REFSET_EMPTY)
        member++;
    uint32_t v = s.slots[member];
    size_t far = (member + s.cap / 2) % s.cap;
    while (s.slots[far] != KVIDX_REFSET_EMPTY)
        far = (far + 1) % s.cap;
    s.slots[member] = KVIDX_REFSET_EMPTY;
    s.slots[far] = v;
    cr_assert_eq(kvidx_refset_check(&s), KVIDX_EINTERNAL, "unreachable member");
    s.slots[far] = KVIDX_REFSET_EMPTY;
    s.slots[member] = v;
    cr_assert_eq(kvidx_refset_check(&s), 0);
    kvidx_refset_free(&s);
}
