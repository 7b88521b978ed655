/*
 * What "the same" means when the key scanner's results are compared with
 * the cJSON path's: by tests/unit/test_daemon_keyscan.c and
 * tests/fuzz/fuzz_daemon_keyscan.c. Header-only (static): each is its own
 * program.
 */
#ifndef KVIDX_TEST_KEYSCAN_COMPARE_H
#define KVIDX_TEST_KEYSCAN_COMPARE_H

#include "kvidx/key.h"

#include <cjson/cJSON.h>
#include <string.h>

/* Same kind, name and value everywhere, in the same member order. */
static int same_tree(const cJSON *a, const cJSON *b)
{
    for (; a && b; a = a->next, b = b->next) {
        if ((a->type & 0xff) != (b->type & 0xff))
            return 0;
        if (!a->string != !b->string || (a->string && strcmp(a->string, b->string) != 0))
            return 0;
        if (cJSON_IsString(a) && strcmp(a->valuestring, b->valuestring) != 0)
            return 0;
        if (cJSON_IsNumber(a) && memcmp(&a->valuedouble, &b->valuedouble, sizeof(double)) != 0)
            return 0;
        if (!same_tree(a->child, b->child))
            return 0;
    }
    return !a && !b;
}

/* Equal keys, every field. */
static int same_key(const kvidx_key_t *a, const kvidx_key_t *b)
{
    return kvidx_key_equal(a, b) && a->model_len == b->model_len && a->salt_len == b->salt_len &&
           a->hash_len == b->hash_len && a->kv_rank == b->kv_rank && a->group == b->group;
}

#endif
