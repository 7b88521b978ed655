/*
 * The attention-window fold of docs/prefetch.md.
 *
 * kvidx_fold computes the largest servable prefix in one pass over the
 * request, O(G*C*R), in three steps:
 *
 *  1. A chunk counts for a group when all R rank bytes are nonzero; the
 *     ranks of a chunk are adjacent in flat order, so this is a scan of R
 *     contiguous bytes (eight at a time).
 *  2. Full-attention groups: L can never exceed a full group's counted
 *     prefix, so `limit` = the smallest such prefix. Each full group is only
 *     scanned up to the current limit.
 *  3. Window groups: with run = the number of consecutive counted chunks
 *     ending at chunk L-1, L >= 1 is servable for group g iff
 *     run >= min(w, L). One pass per window group over chunks [0, limit)
 *     clears ok[L] where that fails; the answer is the largest L <= limit
 *     with ok[L] still set (ok[0] is never cleared).
 *
 * Invariant: ok[] is the only scratch (limit + 1 bytes); the input bitmap is
 * only read. The retained set depends on the shape and L alone.
 */
#include "kvidx/fold.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <string.h>

int kvidx_fold_shape_check(const kvidx_fold_shape_t *shape)
{
    if (!shape || (shape->num_groups > 0 && !shape->windows))
        return KVIDX_EINVAL;
    for (size_t g = 0; g < shape->num_groups; g++) {
        int64_t w = shape->windows[g];
        if (w != KVIDX_WINDOW_FULL && w < 1)
            return KVIDX_EINVAL;
    }
    /* G*C*R must fit a uint32_t index; a zero factor makes it trivially fit. */
    uint64_t total = 1;
    size_t dims[3] = {shape->num_groups, shape->num_chunks, shape->num_ranks};
    for (int i = 0; i < 3; i++) {
        if (dims[i] == 0)
            return 0;
    }
    for (int i = 0; i < 3; i++) {
        if (dims[i] > UINT32_MAX || total * dims[i] > UINT32_MAX)
            return KVIDX_EINVAL;
        total *= dims[i];
    }
    return 0;
}

size_t kvidx_fold_num_keys(const kvidx_fold_shape_t *shape)
{
    return shape->num_groups * shape->num_chunks * shape->num_ranks;
}

/* Whether all n bytes at p are nonzero. Eight bytes at a time with the
 * exact "has a zero byte" test: (x - 0x01..) & ~x & 0x80.. is nonzero iff
 * some byte of x is zero. */
static inline int all_set(const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, sizeof(x));
        if ((x - UINT64_C(0x0101010101010101)) & ~x & UINT64_C(0x8080808080808080))
            return 0;
    }
    for (; i < n; i++) {
        if (!p[i])
            return 0;
    }
    return 1;
}

int kvidx_fold(const kvidx_fold_shape_t *shape, const uint8_t *available, size_t *hit_chunks)
{
    if (!hit_chunks || kvidx_fold_shape_check(shape) != 0)
        return KVIDX_EINVAL;
    const size_t G = shape->num_groups, C = shape->num_chunks, R = shape->num_ranks;
    if (G == 0 || C == 0 || R == 0) {
        /* No key at all: every chunk counts vacuously for every group. */
        *hit_chunks = C;
        return 0;
    }
    if (!available)
        return KVIDX_EINVAL;

    size_t limit = C;
    size_t nwindow = 0;
    for (size_t g = 0; g < G; g++) {
        if (shape->windows[g] != KVIDX_WINDOW_FULL) {
            nwindow++;
            continue;
        }
        const uint8_t *base = available + g * C * R;
        size_t p = 0;
        while (p < limit && all_set(base + p * R, R))
            p++;
        limit = p;
    }
    if (nwindow == 0 || limit == 0) {
        *hit_chunks = limit;
        return 0;
    }

    uint8_t *ok = kvidx_malloc(limit + 1);
    if (!ok)
        return KVIDX_ENOMEM;
    memset(ok, 1, limit + 1);
    for (size_t g = 0; g < G; g++) {
        int64_t w = shape->windows[g];
        if (w == KVIDX_WINDOW_FULL)
            continue;
        const uint8_t *base = available + g * C * R;
        size_t run = 0;
        for (size_t c = 0; c < limit; c++) {
            run = all_set(base + c * R, R) ? run + 1 : 0;
            size_t len = c + 1;
            size_t need = (uint64_t)w < len ? (size_t)w : len;
            if (run < need)
                ok[len] = 0;
        }
    }
    size_t L = limit;
    while (!ok[L])
        L--;
    kvidx_free(ok);
    *hit_chunks = L;
    return 0;
}

/* First retained chunk of group g for prefix length L. */
static size_t retained_lo(const kvidx_fold_shape_t *shape, size_t g, size_t L)
{
    int64_t w = shape->windows[g];
    if (w == KVIDX_WINDOW_FULL || (uint64_t)w >= L)
        return 0;
    return L - (size_t)w;
}

size_t kvidx_fold_retained_count(const kvidx_fold_shape_t *shape, size_t hit_chunks)
{
    if (kvidx_fold_shape_check(shape) != 0 || hit_chunks > shape->num_chunks)
        return 0;
    size_t n = 0;
    for (size_t g = 0; g < shape->num_groups; g++)
        n += (hit_chunks - retained_lo(shape, g, hit_chunks)) * shape->num_ranks;
    return n;
}

int kvidx_fold_retained_mark(const kvidx_fold_shape_t *shape, size_t hit_chunks, uint8_t *retained)
{
    if (kvidx_fold_shape_check(shape) != 0 || hit_chunks > shape->num_chunks)
        return KVIDX_EINVAL;
    const size_t C = shape->num_chunks, R = shape->num_ranks;
    if (kvidx_fold_num_keys(shape) == 0)
        return 0;
    if (!retained)
        return KVIDX_EINVAL;
    for (size_t g = 0; g < shape->num_groups; g++) {
        uint8_t *base = retained + g * C * R;
        size_t lo = retained_lo(shape, g, hit_chunks);
        memset(base, 0, lo * R);
        memset(base + lo * R, 1, (hit_chunks - lo) * R);
        memset(base + hit_chunks * R, 0, (C - hit_chunks) * R);
    }
    return 0;
}

int kvidx_fold_retained_list(const kvidx_fold_shape_t *shape, size_t hit_chunks, uint32_t *out,
                             size_t cap, size_t *count)
{
    if (!count || kvidx_fold_shape_check(shape) != 0 || hit_chunks > shape->num_chunks)
        return KVIDX_EINVAL;
    size_t need = kvidx_fold_retained_count(shape, hit_chunks);
    *count = need;
    if (cap < need)
        return KVIDX_ENOBUFS;
    if (need > 0 && !out)
        return KVIDX_EINVAL;
    const size_t C = shape->num_chunks, R = shape->num_ranks;
    size_t k = 0;
    for (size_t g = 0; g < shape->num_groups; g++) {
        size_t first = g * C * R + retained_lo(shape, g, hit_chunks) * R;
        size_t end = g * C * R + hit_chunks * R;
        for (size_t i = first; i < end; i++)
            out[k++] = (uint32_t)i;
    }
    return 0;
}
