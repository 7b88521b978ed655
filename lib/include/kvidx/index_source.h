/*
 * L2 copies held by sources: outside stores (an LMCache FS directory, a
 * Redis database) that the index follows instead of being told about each
 * key. A source is authoritative for the copies it reports: they appear,
 * change size and disappear only through these calls, never through
 * kvidx_index_put_batch or kvidx_index_delete, and they are not durable
 * (the change callback never reports them; a restart rescans the store).
 *
 * Each source has a membership, the set of keys it holds. A key held by
 * one or more sources has an L2 copy for lookups, listing and prefetch
 * planning (kvidx_entry_info_t.l2 and .l2_source), next to whatever L1
 * copy, pins and API-stored L2 copy (.l2_api) it has; it is forgotten only
 * when no source holds it and it has no other copy. Its ref stays valid
 * while a source holds it. The size of a key is the one its source last
 * reported (a source's resize applies even to a pinned L1 copy; an API
 * store may not change it: KVIDX_ECONFLICT).
 *
 * A full resynchronisation is resync_begin, puts (and dels) of what the
 * store holds now, then resync_end, which removes in one step every member
 * not put since begin. Same rules as the rest of the index: single
 * threaded, no I/O, every failure leaves the index as it was.
 */
#ifndef KVIDX_INDEX_SOURCE_H
#define KVIDX_INDEX_SOURCE_H

#include "kvidx/index.h"

#define KVIDX_INDEX_SOURCES_MAX 16

typedef struct kvidx_source_stats {
    uint64_t keys;  /* members */
    uint64_t bytes; /* sum of their sizes */
    int resyncing;  /* between resync_begin and resync_end/abort */
} kvidx_source_stats_t;

/* Registers a new source with an empty membership; *id gets its number,
 * 0..KVIDX_INDEX_SOURCES_MAX-1, in order. 0, KVIDX_ENOMEM, or
 * KVIDX_ECAPACITY past KVIDX_INDEX_SOURCES_MAX. */
int kvidx_index_source_add(kvidx_index_t *idx, unsigned *id);

/* Source id holds keys[i] with size sizes[i], for i < n: an absent key is
 * created (no L1 copy, no API L2 copy), an existing one takes the size
 * (its L1 and API L2 copies included: the change callback reports the new
 * size of a durable copy), and each becomes a member (marked, during a
 * resynchronisation). A key given twice counts once, with its last size.
 * L1 above capacity after a resize is evicted as after a store. All or
 * nothing: 0, KVIDX_EINVAL (unknown id, or an item with a size out of
 * 1..2^40 or a bad key shape: *bad_index when not NULL), KVIDX_ENOMEM. */
int kvidx_index_source_put(kvidx_index_t *idx, unsigned id, const kvidx_key_t *keys,
                           const uint64_t *sizes, size_t n, size_t *bad_index);
/* Source id no longer holds keys[0..n) (non-members are ignored). A key no
 * other source holds loses its source copy and is forgotten when it has no
 * copy left. Never allocates; 0, or KVIDX_EINVAL for an unknown id.
 * *removed (when not NULL) gets the number of members removed. */
int kvidx_index_source_del(kvidx_index_t *idx, unsigned id, const kvidx_key_t *keys, size_t n,
                           size_t *removed);

/* Starts a resynchronisation of source id: its members become unmarked.
 * 0, KVIDX_EINVAL (unknown id). A begin during a resynchronisation starts
 * it over. */
int kvidx_index_source_resync_begin(kvidx_index_t *idx, unsigned id);
/* Ends it: every member not put since begin is removed as by
 * kvidx_index_source_del, in one call. Never allocates. 0, KVIDX_EINVAL
 * (unknown id or no resynchronisation running); *removed (when not NULL)
 * the number of members removed. */
int kvidx_index_source_resync_end(kvidx_index_t *idx, unsigned id, uint64_t *removed);
/* Drops a resynchronisation without removing anything (the store could
 * not be read to the end): the members stay as they are. 0 or
 * KVIDX_EINVAL. */
int kvidx_index_source_resync_abort(kvidx_index_t *idx, unsigned id);

/* 1 when source id holds the key of ref. */
int kvidx_index_source_holds(const kvidx_index_t *idx, unsigned id, kvidx_ref_t ref);
/* The sources holding ref, one bit per id (bit i = source i). */
uint32_t kvidx_index_source_mask(const kvidx_index_t *idx, kvidx_ref_t ref);
/* Figures of source id: 0 or KVIDX_EINVAL. */
int kvidx_index_source_stats(const kvidx_index_t *idx, unsigned id, kvidx_source_stats_t *out);

#endif
