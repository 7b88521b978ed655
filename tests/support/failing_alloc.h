/*
 * The out-of-memory harness of the lib/ index tests (test_index,
 * test_index_source): a counting allocator to install with
 * kvidx_set_allocator, and the byte fold their state fingerprints use.
 *
 * The allocator numbers every malloc and realloc from 1 after the test sets
 * failing.count to 0; the one numbered failing.fail_at returns NULL (0
 * fails none). failing.live counts the blocks not yet freed, so a test can
 * fail each allocation in turn and see that nothing leaks. Header-only
 * (static): each test is its own program.
 */
#ifndef KVIDX_TEST_FAILING_ALLOC_H
#define KVIDX_TEST_FAILING_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static struct {
    long count, fail_at, live;
} failing;

static inline void *failing_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (++failing.count == failing.fail_at)
        return NULL;
    void *p = malloc(n);
    if (p)
        failing.live++;
    return p;
}

static inline void *failing_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    if (++failing.count == failing.fail_at)
        return NULL;
    void *q = realloc(p, n);
    if (q && !p)
        failing.live++;
    return q;
}

static inline void failing_free(void *ctx, void *p)
{
    (void)ctx;
    if (p)
        failing.live--;
    free(p);
}

/* The FNV-1a offset basis: where a fingerprint starts. */
#define FINGERPRINT_SEED 1469598103934665603ULL

/* h with the n bytes at p folded in (FNV-1a). */
static inline uint64_t fingerprint_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

#endif
