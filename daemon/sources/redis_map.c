/*
 * The Redis source's string map. Invariants: cap is 0 or a power of two;
 * live + tombstones stay below 3/4 of cap (the table grows or is rebuilt
 * before an insert would pass it); a live entry's hash is the keyed
 * SipHash of its key with the low bit pattern moved off 0 and 1. The hash
 * is keyed with a random seed, so key names chosen by another application
 * cannot make the table degrade.
 */
#include "sources/redis_map.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

void rmap_init(struct rmap *m, int owns_keys)
{
    memset(m, 0, sizeof(*m));
    m->owns_keys = owns_keys;
    randombytes_buf(m->seed, sizeof(m->seed));
}

void rmap_free(struct rmap *m)
{
    if (m->owns_keys)
        for (size_t i = 0; i < m->cap; i++)
            if (rmap_live(&m->e[i]))
                free(m->e[i].key);
    free(m->e);
    m->e = NULL;
    m->cap = m->used = m->tombs = 0;
}

static uint64_t hash_of(const struct rmap *m, const char *key, size_t n)
{
    unsigned char out[crypto_shorthash_BYTES];
    crypto_shorthash(out, (const unsigned char *)key, n, m->seed);
    uint64_t h;
    memcpy(&h, out, sizeof(h));
    return h < 2 ? h + 2 : h;
}

struct rmap_entry *rmap_get(const struct rmap *m, const char *key, size_t n)
{
    if (!m->cap)
        return NULL;
    uint64_t h = hash_of(m, key, n);
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        struct rmap_entry *e = &m->e[i];
        if (e->hash == 0)
            return NULL;
        if (e->hash == h && e->len == n && memcmp(e->key, key, n) == 0)
            return e;
    }
}

static int resize(struct rmap *m, size_t cap)
{
    struct rmap_entry *ne = calloc(cap, sizeof(*ne));
    if (!ne)
        return -1;
    size_t mask = cap - 1;
    for (size_t i = 0; i < m->cap; i++) {
        struct rmap_entry *e = &m->e[i];
        if (!rmap_live(e))
            continue;
        size_t j = (size_t)e->hash & mask;
        while (ne[j].hash)
            j = (j + 1) & mask;
        ne[j] = *e;
    }
    free(m->e);
    m->e = ne;
    m->cap = cap;
    m->tombs = 0;
    return 0;
}

struct rmap_entry *rmap_put(struct rmap *m, const char *key, size_t n, int *created)
{
    *created = 0;
    struct rmap_entry *e = rmap_get(m, key, n);
    if (e)
        return e;
    if ((m->used + m->tombs + 1) * 4 >= m->cap * 3) {
        size_t cap = m->cap ? m->cap : 64;
        while ((m->used + 1) * 2 >= cap)
            cap *= 2;
        if (resize(m, cap) != 0)
            return NULL;
    }
    char *k = (char *)key;
    if (m->owns_keys) {
        k = malloc(n ? n : 1);
        if (!k)
            return NULL;
        memcpy(k, key, n);
    }
    uint64_t h = hash_of(m, key, n);
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (rmap_live(&m->e[i]))
        i = (i + 1) & mask;
    e = &m->e[i];
    if (e->hash == 1)
        m->tombs--;
    e->hash = h;
    e->key = k;
    e->len = (uint32_t)n;
    e->aux = 0;
    e->a = e->b = 0;
    m->used++;
    *created = 1;
    return e;
}

void rmap_del(struct rmap *m, struct rmap_entry *e)
{
    if (m->owns_keys)
        free(e->key);
    e->key = NULL;
    e->hash = 1;
    m->used--;
    m->tombs++;
    /* A table with no live entries needs no tombstones. */
    if (m->used == 0 && m->tombs) {
        memset(m->e, 0, m->cap * sizeof(*m->e));
        m->tombs = 0;
    }
}
