/*
 * POST /v1/lookup: which of the given keys the index has, in which tier.
 *
 * A lookup probes the index with kvidx_index_find_batch only: it never
 * changes recency, pins or any other state, and a loading L1 copy is no L1
 * hit (it cannot be read yet). This is the hot path measured against Redis
 * MGET: one batch probe, one pass over the keys, one streaming answer.
 */
#include "api/api.h"
#include "api/key_request.h"

#include "state/keystore.h"
#include "util/context.h"
#include "util/metrics.h"

#include "kvidx/err.h"
#include "kvidx/fold.h"
#include "kvidx/index.h"
#include "kvidx/prefetch_plan.h"

#include <stdlib.h>
#include <string.h>

enum { LK_L1 = 1, LK_L2 = 2, LK_FOUND = 4 };

static void jw_index_list(struct jw *w, const char *name, const uint8_t *flags, size_t n,
                          uint8_t bit)
{
    jw_key(w, name);
    jw_indices(w, flags, n, bit);
}

/* "tier": "l1" or "any" (the default): 0 with *l1_only, or KVIDX_EINVAL. */
static int parse_tier(const cJSON *tier, int *l1_only)
{
    *l1_only = 0;
    if (!tier)
        return 0;
    if (cJSON_IsString(tier) && strcmp(tier->valuestring, "l1") == 0) {
        *l1_only = 1;
        return 0;
    }
    return cJSON_IsString(tier) && strcmp(tier->valuestring, "any") == 0 ? 0 : KVIDX_EINVAL;
}

/* Classifies every key (flags) and marks what counts as found; returns the
 * bytes of the found keys. */
static uint64_t classify(const kvidx_index_t *idx, const struct key_request *kr, int l1_only,
                         uint8_t *flags, uint8_t *found, kvidx_ref_t *refs,
                         kvidx_entry_info_t *infos)
{
    uint64_t bytes = 0;
    kvidx_index_find_batch(idx, kr->keys, kr->n, refs, infos);
    for (size_t i = 0; i < kr->n; i++) {
        if (refs[i] == KVIDX_REF_NONE)
            continue;
        const kvidx_entry_info_t info = infos[i];
        if (info.l1_state == KVIDX_L1_READY)
            flags[i] |= LK_L1;
        if (info.l2)
            flags[i] |= LK_L2;
        if ((flags[i] & LK_L1) || (!l1_only && (flags[i] & LK_L2))) {
            flags[i] |= LK_FOUND;
            found[i] = 1;
            bytes += info.size_bytes;
        }
    }
    return bytes;
}

static void write_answer(const struct request *req, struct response *res,
                         const struct key_request *kr, const uint8_t *flags, const uint8_t *found,
                         uint64_t bytes, size_t hit_chunks)
{
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "total_keys");
    jw_u64(&w, kr->n);
    jw_index_list(&w, "l1_indices", flags, kr->n, LK_L1);
    jw_index_list(&w, "l2_indices", flags, kr->n, LK_L2);
    jw_index_list(&w, "found_indices", flags, kr->n, LK_FOUND);
    jw_key(&w, "hit_keys");
    size_t hit_keys = kvidx_prefetch_leading_run(found, kr->n);
    jw_u64(&w, hit_keys);
    metrics_observe_lookup(req->app->metrics, hit_keys);
    jw_key(&w, "found_bytes");
    jw_u64(&w, bytes);
    jw_key(&w, "hit_chunks");
    if (kr->is_ipc)
        jw_u64(&w, hit_chunks);
    else
        jw_null(&w);
    jw_obj_end(&w);
}

static int api_lookup(const struct request *req, struct response *res)
{
    struct key_request kr;
    uint8_t *flags = NULL, *found = NULL;
    kvidx_ref_t *refs = NULL;
    kvidx_entry_info_t *infos = NULL;
    if (key_request_parse(req, res, BODY_LOOKUP, &kr) != 0)
        return 0;
    int l1_only = 0;
    if (parse_tier(kr.tier, &l1_only) != 0) {
        struct invalid_param p = {"tier", "must be \"l1\" or \"any\""};
        res_problem(res, KVIDX_EINVAL, "the request is not valid", &p, 1);
        goto out;
    }
    size_t n = kr.n ? kr.n : 1;
    flags = calloc(n, 1);
    found = calloc(n, 1);
    refs = malloc(n * sizeof(*refs));
    infos = malloc(n * sizeof(*infos));
    if (!flags || !found || !refs || !infos)
        goto oom;
    uint64_t bytes = classify(req->app->keystore->idx, &kr, l1_only, flags, found, refs, infos);
    size_t hit_chunks = 0;
    if (kr.is_ipc && kvidx_fold(&kr.shape, found, &hit_chunks) != 0)
        goto oom;
    write_answer(req, res, &kr, flags, found, bytes, hit_chunks);
    metrics_add(req->app->metrics, "kvidx_lookups_total", 1);
    if (res->body.failed)
        goto oom;
    res_json(res, 200);
    goto out;
oom:
    buf_reset(&res->body);
    res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
out:
    free(flags);
    free(found);
    free(refs);
    free(infos);
    key_request_free(&kr);
    return 0;
}

const struct route lookup_routes[] = {
    {M_POST, "/v1/lookup", api_lookup, "lookup", ROUTE_READ},
    {0, NULL, NULL, NULL, 0},
};
