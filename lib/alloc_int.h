/*
 * Allocation inside libkvidx beyond the public hook (kvidx/alloc.h): the
 * large-block allocator the index uses for its big arrays. Private to lib/.
 */
#ifndef KVIDX_ALLOC_INT_H
#define KVIDX_ALLOC_INT_H

#include "kvidx/alloc.h"

#include <stddef.h>

/* For the index's big arrays (record blocks, the hash table): like
 * kvidx_malloc, but a block of 2 MiB or more is 2 MiB-aligned and marked
 * for transparent huge pages where the system has them, which cuts the
 * page faults of a large restore and the page tables fork() copies by up
 * to 512x. Freed with kvidx_free. A hint only: nothing depends on it. */
void *kvidx_malloc_large(size_t size);

#endif
