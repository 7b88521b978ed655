/*
 * The keys of a POST /v1/lookup or POST /v1/prefetches body, in either
 * form: the key form ("keys": [key, ...]) or the ipc form (model_name,
 * world_size, worker_id, cache_salt, chunk_hashes, object_group_ids,
 * attn_window), expanded group-major, then chunk, then rank.
 */
#ifndef KVIDXD_KEY_REQUEST_H
#define KVIDXD_KEY_REQUEST_H

#include "net/http.h"

#include "kvidx/fold.h"
#include "kvidx/key.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* BODY_STORE: the ipc form of PUT /v1/keys (no "keys", no attn_window;
 * tier, size_bytes or sizes instead). */
enum key_request_kind { BODY_LOOKUP = 1, BODY_PREFETCH = 2, BODY_STORE = 3 };

struct key_request {
    cJSON *body;
    kvidx_key_t *keys; /* n keys; model and salt point into body or the request */
    size_t n;
    int is_ipc;
    kvidx_ipc_t ipc;
    int64_t *windows;
    kvidx_fold_shape_t shape; /* the ipc form's shape (windows above) */
    /* The other members of the body, NULL when absent: tier (lookup);
     * mode, trim_policy, extra_count, external_request_id, lease_ms (prefetch). */
    const cJSON *tier, *mode, *trim, *extra, *ext_id, *lease;
    /* tier, size_bytes and sizes (store). */
    const cJSON *size, *sizes;
};

/* Parses and validates the keys of req's body. Returns 0 with *kr filled
 * (free it with key_request_free), or the KVIDX_E* code res was answered
 * with (400 invalid_key when a key breaks the key rules, else
 * invalid_argument; 413 too_many_keys; 503 out of memory); *kr then needs
 * no free. */
int key_request_parse(const struct request *req, struct response *res, enum key_request_kind kind,
                      struct key_request *kr);
void key_request_free(struct key_request *kr);

#endif
