/*
 * A set of 32-bit refs with one mark bit per member: the membership of one
 * outside store (a source) in the index, which a full resynchronisation
 * diffs by marking every member it sees again and sweeping the unmarked.
 *
 * Open addressing with linear probing and tombstones, so that members can
 * be removed while the set is being walked. Two values are reserved and
 * may not be added: KVIDX_REFSET_EMPTY (UINT32_MAX, which is also
 * KVIDX_REF_NONE) and KVIDX_REFSET_TOMB (UINT32_MAX - 1); the index never
 * hands out either as a ref (its slabs stop 4096 records short of them).
 * Single-threaded like the index; allocates only in kvidx_refset_reserve,
 * through kvidx/alloc.h.
 */
#ifndef KVIDX_REFSET_H
#define KVIDX_REFSET_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_REFSET_EMPTY UINT32_MAX
#define KVIDX_REFSET_TOMB  (UINT32_MAX - 1)

typedef struct kvidx_refset {
    uint32_t *slots; /* cap of them: a member, EMPTY or TOMB */
    uint64_t *marks; /* one bit per slot; only members' bits may be set */
    size_t cap;      /* power of two, or 0 */
    size_t count;    /* members */
    size_t tombs;    /* TOMB slots */
    size_t marked;   /* members whose mark is set */
} kvidx_refset_t;

/* An empty set that owns no memory. */
void kvidx_refset_init(kvidx_refset_t *s);
/* Frees the set's memory; it is empty (and usable) afterwards. */
void kvidx_refset_free(kvidx_refset_t *s);
/* Makes sure `extra` more members can be added without allocating (it may
 * rebuild the table, dropping tombstones; marks are kept). 0, KVIDX_ENOMEM
 * (the set unchanged) or KVIDX_EINVAL past 2^30 members. */
int kvidx_refset_reserve(kvidx_refset_t *s, size_t extra);
/* Adds ref (a member already: nothing changes) and, when mark is not 0,
 * sets its mark. Needs room from kvidx_refset_reserve: returns 1 when
 * added, 0 when it was a member, KVIDX_ENOMEM when there is no room
 * (nothing changed), KVIDX_EINVAL for a reserved value. */
int kvidx_refset_add(kvidx_refset_t *s, uint32_t ref, int mark);
/* 1 when ref is a member. */
int kvidx_refset_has(const kvidx_refset_t *s, uint32_t ref);
/* Removes ref: 1 when it was a member, else 0. Never allocates. */
int kvidx_refset_remove(kvidx_refset_t *s, uint32_t ref);
/* Clears every mark (the start of a resynchronisation). */
void kvidx_refset_unmark_all(kvidx_refset_t *s);
/* Sets ref's mark: 1 when ref is a member, else 0. */
int kvidx_refset_mark(kvidx_refset_t *s, uint32_t ref);
/* Clears ref's mark: 1 when ref is a member, else 0. */
int kvidx_refset_unmark(kvidx_refset_t *s, uint32_t ref);
/* 1 when ref is a member with its mark set. */
int kvidx_refset_marked(const kvidx_refset_t *s, uint32_t ref);
/* Walks the members: start with *pos = 0; each call gives the next member
 * in *ref (and its mark in *mark when not NULL) and returns 1, or returns 0
 * at the end. Removing the member just returned, or any other, during the
 * walk is allowed (the walk neither repeats nor skips a remaining member);
 * adding is not. */
int kvidx_refset_next(const kvidx_refset_t *s, size_t *pos, uint32_t *ref, int *mark);
/* Verifies the set's invariants (count, tombs and marked equal what the
 * slots hold, marks only on members, every member reachable by its probe,
 * no member twice). 0 or KVIDX_EINTERNAL; allocates nothing. */
int kvidx_refset_check(const kvidx_refset_t *s);

#endif
