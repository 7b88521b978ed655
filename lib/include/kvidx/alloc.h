/*
 * The one allocation hook of libkvidx. Every allocation in lib/ goes through
 * these functions so that tests can inject failures; lib/ reports running
 * out of memory as KVIDX_ENOMEM and never aborts.
 */
#ifndef KVIDX_ALLOC_H
#define KVIDX_ALLOC_H

#include <stddef.h>

typedef struct kvidx_allocator {
    void *(*malloc)(void *ctx, size_t size);
    void *(*realloc)(void *ctx, void *ptr, size_t size);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} kvidx_allocator_t;

/* Replaces the allocator (NULL restores libc's). Not thread-safe: call it
 * before any other libkvidx function, as tests do. */
void kvidx_set_allocator(const kvidx_allocator_t *a);

void *kvidx_malloc(size_t size);
void *kvidx_calloc(size_t n, size_t size); /* zeroed; NULL on overflow */
void *kvidx_realloc(void *ptr, size_t size);
void kvidx_free(void *ptr);

#endif
