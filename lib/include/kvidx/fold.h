/*
 * The attention-window fold of docs/prefetch.md: given which keys of an ipc-form
 * request are available, how long a prefix (in chunks) can be served, and
 * which keys serve it.
 *
 * Keys are addressed by their flat index in the ipc expansion of docs/keys.md,
 * group-major, then chunk, then rank: index = gi*(C*R) + c*R + r. Bitmaps
 * are arrays of one byte per key (any nonzero byte means "set"); index lists
 * are ascending arrays of uint32_t. A request therefore has at most
 * UINT32_MAX keys.
 */
#ifndef KVIDX_FOLD_H
#define KVIDX_FOLD_H

#include <stddef.h>
#include <stdint.h>

/* The window of a full-attention group (LMCache's num_chunks_in_sw = -1). */
#define KVIDX_WINDOW_FULL (-1)

/* The shape of an ipc-form request. The windows array is borrowed. */
typedef struct kvidx_fold_shape {
    const int64_t *windows; /* num_groups entries: KVIDX_WINDOW_FULL, or w >= 1 */
    size_t num_groups;      /* G: object groups */
    size_t num_chunks;      /* C: chunks per group */
    size_t num_ranks;       /* R: ranks per chunk */
} kvidx_fold_shape_t;

/* Checks the shape: every window is -1 or >= 1, windows is non-NULL when
 * num_groups > 0, and G*C*R fits in a uint32_t. Returns 0 or KVIDX_EINVAL. */
int kvidx_fold_shape_check(const kvidx_fold_shape_t *shape);

/* G*C*R, the number of keys of a shape that passed kvidx_fold_shape_check. */
size_t kvidx_fold_num_keys(const kvidx_fold_shape_t *shape);

/* The fold: *hit_chunks = the largest servable prefix length L (0..C).
 *
 * A chunk counts for a group when every rank's key is available. L is
 * servable when every full-attention group counts chunks [0, L) and every
 * window group g counts the last min(w_g, L) chunks before L,
 * [max(0, L - w_g), L). L = 0 is always servable; the servable set need not
 * be downward closed, so this is the largest one, not the first gap. With no
 * groups, or no ranks, every chunk counts vacuously and L = C.
 *
 * available: G*C*R bytes in flat order, borrowed. Cost O(G*C*R) time and
 * C + 1 bytes of scratch from kvidx_malloc. Returns 0, KVIDX_EINVAL (bad
 * shape, NULL pointer) or KVIDX_ENOMEM; *hit_chunks is set only on success. */
int kvidx_fold(const kvidx_fold_shape_t *shape, const uint8_t *available, size_t *hit_chunks);

/* The keys that serve prefix length hit_chunks (what LOOKUP + PREFIX
 * retains): full groups chunks [0, L), window groups [max(0, L - w), L),
 * all ranks. It depends only on the shape and L, not on availability.
 *
 * kvidx_fold_retained_count: how many keys that is (0 for a bad shape or
 * L > C). kvidx_fold_retained_mark: writes all G*C*R bytes of `retained`
 * (1 = retained, 0 = not). kvidx_fold_retained_list: writes the ascending
 * flat indices to out[0..cap); *count is always set to the number needed,
 * and KVIDX_ENOBUFS is returned when cap is smaller. Both return
 * KVIDX_EINVAL for a bad shape, NULL pointer or hit_chunks > C. */
size_t kvidx_fold_retained_count(const kvidx_fold_shape_t *shape, size_t hit_chunks);
int kvidx_fold_retained_mark(const kvidx_fold_shape_t *shape, size_t hit_chunks, uint8_t *retained);
int kvidx_fold_retained_list(const kvidx_fold_shape_t *shape, size_t hit_chunks, uint32_t *out,
                             size_t cap, size_t *count);

#endif
