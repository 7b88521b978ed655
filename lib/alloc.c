/*
 * The allocation hook: libc by default, replaceable by tests to inject
 * failures. This is the only mutable file-scope state in lib/, and it is
 * configuration, not data: it is set once before use.
 */
#include "alloc_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

static kvidx_allocator_t alloc_hook;

void kvidx_set_allocator(const kvidx_allocator_t *a)
{
    if (a)
        alloc_hook = *a;
    else
        memset(&alloc_hook, 0, sizeof(alloc_hook));
}

void *kvidx_malloc(size_t size)
{
    if (alloc_hook.malloc)
        return alloc_hook.malloc(alloc_hook.ctx, size);
    return malloc(size);
}

void *kvidx_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (!alloc_hook.malloc)
        return calloc(n, size);
    void *p = kvidx_malloc(n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void *kvidx_realloc(void *ptr, size_t size)
{
    if (alloc_hook.realloc)
        return alloc_hook.realloc(alloc_hook.ctx, ptr, size);
    return realloc(ptr, size);
}

void kvidx_free(void *ptr)
{
    if (alloc_hook.free)
        alloc_hook.free(alloc_hook.ctx, ptr);
    else
        free(ptr);
}

#define HUGE_PAGE ((size_t)2 << 20)

void *kvidx_malloc_large(size_t size)
{
    if (alloc_hook.malloc || size < HUGE_PAGE || size > SIZE_MAX - HUGE_PAGE)
        return kvidx_malloc(size);
    /* Not rounded up to whole huge pages: the kernel maps huge pages only
     * over 2 MiB ranges inside the mapping and small pages at its tail, so
     * a partial last page costs no more than it holds. */
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, size) != 0)
        return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* A memory hint, not I/O; refused (EINVAL) where THP is off. The range
     * is whole 2 MiB pages from the aligned start. */
    size_t whole = size & ~(HUGE_PAGE - 1);
    if (whole)
        (void)madvise(p, whole, MADV_HUGEPAGE);
#endif
    return p;
}
