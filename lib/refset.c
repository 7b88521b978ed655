/*
 * Sets of refs with a mark bit per member (kvidx/refset.h): the membership
 * of one source in the index.
 *
 * The table is open addressing with linear probing over a power-of-two
 * array of slots; a removed member leaves a tombstone (so that probe runs
 * stay intact and a walk in progress is not disturbed), except when the
 * next slot is empty, in which case it and the tombstones before it become
 * empty again. Invariants: count, tombs and marked are what the slots and
 * mark bits hold; a mark bit is set only on a member's slot; every member
 * is reached from its home slot without crossing an empty slot, and
 * appears once; count + tombs stays at most three quarters of cap (reserve
 * rebuilds before that), so every probe ends. Refs are handed out by the
 * index, not by clients, so a plain multiplicative hash is enough.
 */
#include "kvidx/refset.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <string.h>

#define MIN_CAP ((size_t)16)

static inline size_t home(const kvidx_refset_t *s, uint32_t ref)
{
    return (size_t)((ref * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (s->cap - 1);
}

static inline int mark_get(const kvidx_refset_t *s, size_t i)
{
    return (int)((s->marks[i >> 6] >> (i & 63)) & 1);
}

static inline void mark_set(kvidx_refset_t *s, size_t i)
{
    s->marks[i >> 6] |= UINT64_C(1) << (i & 63);
}

static inline void mark_clear(kvidx_refset_t *s, size_t i)
{
    s->marks[i >> 6] &= ~(UINT64_C(1) << (i & 63));
}

static inline int reserved(uint32_t ref)
{
    return ref == KVIDX_REFSET_EMPTY || ref == KVIDX_REFSET_TOMB;
}

/* The slot of ref, or SIZE_MAX. */
static size_t find(const kvidx_refset_t *s, uint32_t ref)
{
    if (!s->cap || reserved(ref))
        return SIZE_MAX;
    size_t mask = s->cap - 1;
    for (size_t i = home(s, ref);; i = (i + 1) & mask) {
        uint32_t v = s->slots[i];
        if (v == ref)
            return i;
        if (v == KVIDX_REFSET_EMPTY)
            return SIZE_MAX;
    }
}

void kvidx_refset_init(kvidx_refset_t *s)
{
    memset(s, 0, sizeof(*s));
}

void kvidx_refset_free(kvidx_refset_t *s)
{
    kvidx_free(s->slots);
    kvidx_free(s->marks);
    kvidx_refset_init(s);
}

static int rebuild(kvidx_refset_t *s, size_t cap)
{
    uint32_t *slots = kvidx_malloc(cap * sizeof(*slots));
    uint64_t *marks = kvidx_calloc((cap + 63) / 64, sizeof(*marks));
    if (!slots || !marks) {
        kvidx_free(slots);
        kvidx_free(marks);
        return KVIDX_ENOMEM;
    }
    memset(slots, 0xff, cap * sizeof(*slots)); /* KVIDX_REFSET_EMPTY */
    kvidx_refset_t n = {slots, marks, cap, 0, 0, 0};
    for (size_t i = 0; i < s->cap; i++) {
        uint32_t v = s->slots[i];
        if (reserved(v))
            continue;
        size_t j = home(&n, v);
        while (n.slots[j] != KVIDX_REFSET_EMPTY)
            j = (j + 1) & (cap - 1);
        n.slots[j] = v;
        n.count++;
        if (mark_get(s, i)) {
            mark_set(&n, j);
            n.marked++;
        }
    }
    kvidx_free(s->slots);
    kvidx_free(s->marks);
    *s = n;
    return 0;
}

int kvidx_refset_reserve(kvidx_refset_t *s, size_t extra)
{
    const size_t limit = (size_t)1 << 30;
    if (extra > limit || s->count + extra > limit)
        return KVIDX_EINVAL;
    if (s->cap && (s->count + s->tombs + extra) * 4 <= s->cap * 3)
        return 0;
    size_t want = s->count + extra;
    size_t cap = MIN_CAP;
    while (cap < 2 * want)
        cap *= 2;
    return rebuild(s, cap);
}

int kvidx_refset_add(kvidx_refset_t *s, uint32_t ref, int mark)
{
    if (reserved(ref))
        return KVIDX_EINVAL;
    size_t at = find(s, ref);
    if (at != SIZE_MAX) {
        if (mark && !mark_get(s, at)) {
            mark_set(s, at);
            s->marked++;
        }
        return 0;
    }
    /* A new member may take a tombstone of its run; the count of used
     * slots then does not grow. */
    if (!s->cap || (s->count + s->tombs + 1) * 4 > s->cap * 3)
        return KVIDX_ENOMEM;
    size_t mask = s->cap - 1, i = home(s, ref);
    while (s->slots[i] != KVIDX_REFSET_EMPTY && s->slots[i] != KVIDX_REFSET_TOMB)
        i = (i + 1) & mask;
    if (s->slots[i] == KVIDX_REFSET_TOMB)
        s->tombs--;
    s->slots[i] = ref;
    s->count++;
    if (mark) {
        mark_set(s, i);
        s->marked++;
    }
    return 1;
}

int kvidx_refset_has(const kvidx_refset_t *s, uint32_t ref)
{
    return find(s, ref) != SIZE_MAX;
}

int kvidx_refset_remove(kvidx_refset_t *s, uint32_t ref)
{
    size_t at = find(s, ref);
    if (at == SIZE_MAX)
        return 0;
    size_t mask = s->cap - 1;
    if (mark_get(s, at)) {
        mark_clear(s, at);
        s->marked--;
    }
    s->count--;
    if (s->slots[(at + 1) & mask] != KVIDX_REFSET_EMPTY) {
        s->slots[at] = KVIDX_REFSET_TOMB;
        s->tombs++;
        return 1;
    }
    /* The run ends here: this slot and the tombstones just before it lead
     * nowhere any more. */
    s->slots[at] = KVIDX_REFSET_EMPTY;
    for (size_t i = (at - 1) & mask; s->slots[i] == KVIDX_REFSET_TOMB; i = (i - 1) & mask) {
        s->slots[i] = KVIDX_REFSET_EMPTY;
        s->tombs--;
    }
    return 1;
}

void kvidx_refset_unmark_all(kvidx_refset_t *s)
{
    if (s->cap)
        memset(s->marks, 0, (s->cap + 63) / 64 * sizeof(*s->marks));
    s->marked = 0;
}

int kvidx_refset_mark(kvidx_refset_t *s, uint32_t ref)
{
    size_t at = find(s, ref);
    if (at == SIZE_MAX)
        return 0;
    if (!mark_get(s, at)) {
        mark_set(s, at);
        s->marked++;
    }
    return 1;
}

int kvidx_refset_unmark(kvidx_refset_t *s, uint32_t ref)
{
    size_t at = find(s, ref);
    if (at == SIZE_MAX)
        return 0;
    if (mark_get(s, at)) {
        mark_clear(s, at);
        s->marked--;
    }
    return 1;
}

int kvidx_refset_marked(const kvidx_refset_t *s, uint32_t ref)
{
    size_t at = find(s, ref);
    return at != SIZE_MAX && mark_get(s, at);
}

int kvidx_refset_next(const kvidx_refset_t *s, size_t *pos, uint32_t *ref, int *mark)
{
    for (size_t i = *pos; i < s->cap; i++) {
        uint32_t v = s->slots[i];
        if (reserved(v))
            continue;
        *pos = i + 1;
        *ref = v;
        if (mark)
            *mark = mark_get(s, i);
        return 1;
    }
    *pos = s->cap;
    return 0;
}

int kvidx_refset_check(const kvidx_refset_t *s)
{
    if (!s->cap)
        return s->count == 0 && s->tombs == 0 && s->marked == 0 && !s->slots ? 0 : KVIDX_EINTERNAL;
    if ((s->cap & (s->cap - 1)) != 0 || (s->count + s->tombs) * 4 > s->cap * 3)
        return KVIDX_EINTERNAL;
    size_t count = 0, tombs = 0, marked = 0;
    for (size_t i = 0; i < s->cap; i++) {
        uint32_t v = s->slots[i];
        if (v == KVIDX_REFSET_TOMB)
            tombs++;
        if (reserved(v)) {
            if (mark_get(s, i))
                return KVIDX_EINTERNAL;
            continue;
        }
        count++;
        marked += (size_t)mark_get(s, i);
        /* The probe reaches this slot first: nothing empty before it on
         * its run, and no earlier copy of the same ref. */
        if (find(s, v) != i)
            return KVIDX_EINTERNAL;
    }
    /* Mark bits past cap in the last word stay clear. */
    for (size_t i = s->cap; i % 64; i++)
        if (mark_get(s, i))
            return KVIDX_EINTERNAL;
    return count == s->count && tombs == s->tombs && marked == s->marked ? 0 : KVIDX_EINTERNAL;
}
