/* A small seeded index and a universe of n one-byte-hash keys of model "m"
 * (key i has hash byte i), as the prefetch tests use. Header-only. */
#ifndef KVIDX_TEST_SMALL_INDEX_H
#define KVIDX_TEST_SMALL_INDEX_H

#include "kvidx/index.h"
#include "kvidx/key.h"

#include <string.h>

/* 0 and *idx, or the error of kvidx_index_new; uni[0..n) filled. */
static inline int small_index_new(uint64_t l1_cap, kvidx_index_t **idx, kvidx_key_t *uni, int n)
{
    kvidx_index_opts_t o;
    memset(&o, 0, sizeof(o));
    o.l1_capacity_bytes = l1_cap;
    o.has_seed = 1;
    for (int i = 0; i < n; i++) {
        memset(&uni[i], 0, sizeof(uni[i]));
        uni[i].model = "m";
        uni[i].model_len = 1;
        uni[i].salt = "";
        uni[i].hash_len = 1;
        uni[i].hash[0] = (uint8_t)i;
    }
    return kvidx_index_new(&o, idx);
}

#endif
