/*
 * A hash table from byte strings to two 64-bit values, for the Redis
 * source: the STRLEN a key waits for (per node) and, for a cluster, which
 * nodes hold a key. Open addressing with linear probing; deletion leaves a
 * tombstone, so a walk over the slots may delete as it goes.
 */
#ifndef KVIDXD_REDIS_MAP_H
#define KVIDXD_REDIS_MAP_H

#include <stddef.h>
#include <stdint.h>

struct rmap_entry {
    uint64_t hash; /* 0: empty slot, 1: tombstone; live hashes are >= 2 */
    char *key;     /* owned when the map owns its keys, else borrowed */
    uint32_t len;
    uint32_t aux; /* free for the user */
    uint64_t a, b;
};

struct rmap {
    struct rmap_entry *e;
    size_t cap; /* a power of two, or 0 */
    size_t used, tombs;
    int owns_keys;
    uint8_t seed[16];
};

/* An empty map; owns_keys: keys are copied in and freed with their entry. */
void rmap_init(struct rmap *m, int owns_keys);
void rmap_free(struct rmap *m);
/* The entry of key, or NULL. */
struct rmap_entry *rmap_get(const struct rmap *m, const char *key, size_t n);
/* The entry of key, created (a = b = aux = 0, *created = 1) when absent.
 * A borrowed key must outlive its entry (or be replaced through e->key).
 * NULL when out of memory. Entry pointers are valid until the next
 * rmap_put. */
struct rmap_entry *rmap_put(struct rmap *m, const char *key, size_t n, int *created);
/* Removes a live entry (frees the key if owned). */
void rmap_del(struct rmap *m, struct rmap_entry *e);
static inline int rmap_live(const struct rmap_entry *e)
{
    return e->hash >= 2;
}

#endif
