/*
 * Helpers of the fleet handlers (api/fleet_json.h): placements and floats
 * in LMCache's JSON shapes, member readers that record every error of a
 * body (the whole request is answered 422 once, nothing applied), and the
 * keys and tokens forms of /directory/lookup and /directory/score.
 *
 * The tokens form hashes only after every token id passed: integral,
 * 0..2^32-1 (LMCache stores them as uint32), at most 1,000,000 of them.
 */
#include "api/fleet_json.h"

#include "state/fleet.h"
#include "util/context.h"

#include "kvidx/err.h"
#include "kvidx/token_hash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fj_double(struct jw *w, double v)
{
    char tmp[40];
    if (!isfinite(v))
        v = 0.0;
    int n = snprintf(tmp, sizeof(tmp), "%.17g", v);
    if (n < 0 || (size_t)n >= sizeof(tmp) - 3)
        n = snprintf(tmp, sizeof(tmp), "0.0");
    /* %.17g may print 1 for 1.0; Python's json prints floats with a dot. */
    if (!strpbrk(tmp, ".eEn")) {
        tmp[n++] = '.';
        tmp[n++] = '0';
        tmp[n] = '\0';
    }
    jw_raw(w, tmp, (size_t)n);
}

const char *fj_tier_name(kvidx_dir_tier_t t)
{
    return t == KVIDX_DIR_L1 ? "l1" : t == KVIDX_DIR_L2 ? "l2" : "all";
}

void fj_placement(struct jw *w, const kvidx_dir_placement_t *p)
{
    jw_obj_begin(w);
    jw_key(w, "instance_id");
    jw_strn(w, p->instance_id, p->instance_len);
    jw_key(w, "incarnation");
    jw_u64(w, p->incarnation);
    jw_key(w, "tier");
    jw_str(w, fj_tier_name(p->tier));
    jw_key(w, "backend");
    jw_strn(w, p->backend, p->backend_len);
    jw_key(w, "size_bytes");
    jw_u64(w, p->size_bytes);
    jw_key(w, "shared");
    jw_bool(w, p->shared);
    jw_obj_end(w);
}

int fj_string(struct param_errors *pe, const cJSON *obj, const char *name, const char *def,
              const char *where, const char **s, size_t *len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v) {
        if (!def) {
            param_errors_add(pe, "is required", "%s%s", where, name);
            return -1;
        }
        *s = def;
        *len = strlen(def);
        return 0;
    }
    *s = json_str(v, len);
    if (!*s) {
        param_errors_add(pe, "must be a string", "%s%s", where, name);
        return -1;
    }
    return 0;
}

int fj_uint(struct param_errors *pe, const cJSON *obj, const char *name, uint64_t def, int required,
            double lo, double hi, const char *where, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = def;
    int rc = json_uint(v, lo, hi, out);
    if (rc == 1 && required) {
        param_errors_add(pe, "is required", "%s%s", where, name);
        return -1;
    }
    if (rc < 0) {
        param_errors_add(pe, "must be an integer in range", "%s%s", where, name);
        return -1;
    }
    return 0;
}

int fj_unprocessable(struct param_errors *pe, struct response *res, const char *detail,
                     int key_fault)
{
    int rc = param_errors_respond(
        pe, res, key_fault ? KVIDX_EUNPROCESSABLEKEY : KVIDX_EUNPROCESSABLE, detail);
    param_errors_free(pe);
    return rc;
}

void fleet_keys_free(struct fleet_keys *fk)
{
    free(fk->keys);
    fk->keys = NULL;
    fk->n = 0;
}

static int parse_keys_form(struct param_errors *pe, const cJSON *keys, struct fleet_keys *out,
                           uint64_t max_keys, int *key_fault)
{
    size_t n = (size_t)cJSON_GetArraySize(keys);
    if (n > max_keys)
        return KVIDX_ETOOMANYKEYS;
    out->keys = malloc((n ? n : 1) * sizeof(*out->keys));
    if (!out->keys)
        return KVIDX_ENOMEM;
    size_t i = 0;
    for (const cJSON *k = keys->child; k; k = k->next, i++) {
        kvidx_reason_t why;
        if (json_to_key(k, &out->keys[i], &why) != 0) {
            char where[48];
            snprintf(where, sizeof(where), "keys[%zu]", i);
            param_errors_key(pe, &why, where);
            *key_fault = 1;
        }
    }
    out->n = n;
    out->chunks = n;
    return 0;
}

static int parse_tokens_form(const struct request *req, struct param_errors *pe, const cJSON *root,
                             const cJSON *toks, struct fleet_keys *out, kvidx_reason_t *key_why)
{
    const char *model, *salt;
    size_t model_len, salt_len;
    uint64_t ws = 1;
    int bad = 0;
    bad |= fj_string(pe, root, "model_name", "", "", &model, &model_len);
    bad |= fj_string(pe, root, "cache_salt", "", "", &salt, &salt_len);
    bad |= fj_uint(pe, root, "world_size", 1, 0, 1, 18446744073709549568.0, "", &ws);
    if (!bad && ws > 255) {
        /* LMCache takes any world size and collides ranks above 255;
         * kvidx's kv_rank fields are a byte each (400, as a key rule). */
        key_why->field = "world_size";
        key_why->rule = "must be 1..255 (a kv_rank field is one byte)";
        return KVIDX_EKEY;
    }
    if (!bad && model_len == 0) {
        param_errors_add(pe, "is required with token_ids", "model_name");
        bad = 1;
    }
    size_t nt = (size_t)cJSON_GetArraySize(toks);
    if (nt > FLEET_MAX_TOKEN_IDS)
        return KVIDX_EBODYSIZE;
    uint32_t *tokens = malloc((nt ? nt : 1) * sizeof(*tokens));
    if (!tokens)
        return KVIDX_ENOMEM;
    size_t i = 0;
    for (const cJSON *t = toks->child; t; t = t->next, i++) {
        uint64_t v;
        if (json_uint(t, 0, 4294967295.0, &v) != 0) {
            param_errors_add(pe, "must be an integer 0..4294967295", "token_ids[%zu]", i);
            bad = 1;
            break;
        }
        tokens[i] = (uint32_t)v;
    }
    if (bad) {
        free(tokens);
        return 0;
    }
    uint64_t chunk = req->app->cfg.chunk_size ? req->app->cfg.chunk_size : 256;
    size_t nc = kvidx_token_hash_chain(tokens, nt, chunk, NULL, 0);
    /* Refused before anything is hashed or allocated for the keys. */
    if ((uint64_t)nc * ws > req->app->cfg.max_keys_per_request) {
        free(tokens);
        return KVIDX_ETOOMANYKEYS;
    }
    uint8_t(*hashes)[KVIDX_TOKEN_HASH_LEN] = malloc((nc ? nc : 1) * KVIDX_TOKEN_HASH_LEN);
    size_t nkeys = nc * ws;
    out->keys = malloc((nkeys ? nkeys : 1) * sizeof(*out->keys));
    if (!hashes || !out->keys) {
        free(tokens);
        free(hashes);
        return KVIDX_ENOMEM;
    }
    kvidx_token_hash_chain(tokens, nt, chunk, hashes, nc);
    free(tokens);
    size_t count = nkeys;
    kvidx_reason_t why = {NULL, NULL};
    int rc = kvidx_token_hash_keys((const uint8_t(*)[KVIDX_TOKEN_HASH_LEN])hashes, nc, (uint32_t)ws,
                                   model, model_len, salt, salt_len, out->keys, &count, &why);
    free(hashes);
    if (rc == KVIDX_EKEY) {
        *key_why = why;
        return rc;
    }
    if (rc != 0)
        return rc;
    out->n = count;
    out->chunks = nc;
    out->world_size = (uint32_t)ws;
    out->tokens_form = 1;
    return 0;
}

int fleet_keys_parse(const struct request *req, struct response *res, const cJSON *root,
                     struct fleet_keys *out)
{
    int key_fault = 0;
    memset(out, 0, sizeof(*out));
    struct param_errors pe;
    param_errors_init(&pe);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        param_errors_add(&pe, "must be a JSON object", "body");
        goto answer;
    }
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(root, "keys");
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "token_ids");
    if (keys && !cJSON_IsArray(keys))
        param_errors_add(&pe, "must be an array", "keys");
    if (toks && !cJSON_IsArray(toks))
        param_errors_add(&pe, "must be an array", "token_ids");
    if (pe.n)
        goto answer;
    int has_keys = keys && cJSON_GetArraySize(keys) > 0;
    int has_toks = toks && cJSON_GetArraySize(toks) > 0;
    if (has_keys == has_toks) {
        param_errors_add(&pe, "supply exactly one of 'keys' or 'token_ids'", "body");
        goto answer;
    }
    kvidx_reason_t key_why = {NULL, NULL};
    if (has_keys)
        rc = parse_keys_form(&pe, keys, out, req->app->cfg.max_keys_per_request, &key_fault);
    else
        rc = parse_tokens_form(req, &pe, root, toks, out, &key_why);
    if (rc == 0 && !pe.n && out->n > req->app->cfg.max_keys_per_request)
        rc = KVIDX_ETOOMANYKEYS;
answer:
    if (rc != 0) {
        param_errors_free(&pe);
        fleet_keys_free(out);
        if (rc == KVIDX_ETOOMANYKEYS) {
            res_problemf(res, rc, "At most %llu keys a request.",
                         (unsigned long long)req->app->cfg.max_keys_per_request);
        } else if (rc == KVIDX_EKEY) {
            struct invalid_param p = {key_why.field ? key_why.field : "key",
                                      key_why.rule ? key_why.rule : "is not valid"};
            res_problem(res, rc, "the tokens form names keys the key rules refuse", &p, 1);
        } else if (rc == KVIDX_EBODYSIZE) {
            rc = KVIDX_EINVAL;
            res_problem(res, rc, "too many token_ids in a single request (limit=1000000)", NULL, 0);
        } else {
            res_problem(res, rc, "out of memory", NULL, 0);
        }
        return rc;
    }
    if (pe.n) {
        fleet_keys_free(out);
        return fj_unprocessable(&pe, res, "the request is not valid", key_fault);
    }
    param_errors_free(&pe);
    return 0;
}
