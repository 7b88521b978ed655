/*
 * The keys of a lookup or prefetch body, or of an ipc-form store
 * (api/key_request.h).
 *
 * Owns the decoding of both body forms into one array of keys. Key-form
 * bodies skip the cJSON tree of their keys, ipc-form ones that of their
 * chunk hashes (util/keyscan.h); any other body, or anything unusual, takes
 * the cJSON path, and both paths accept and reject the same bodies.
 * Invariants: every problem with the body is listed (invalid_params) before
 * anything is answered; a key that breaks the key rules makes the answer
 * invalid_key, whatever else is wrong; member names, being request bytes,
 * are never echoed; for a lookup or a prefetch, the keys of a salt the
 * request's token may not see are made absent (state/auth.h), after every
 * check, so that they are answered as keys never stored.
 */
#include "api/key_request.h"

#include "util/context.h"
#include "api/body.h"
#include "state/auth.h"
#include "util/json_read.h"
#include "util/keyscan.h"

#include "kvidx/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_IPC 7

static const char *const ipc_members[N_IPC] = {"model_name", "world_size",   "worker_id",
                                               "cache_salt", "chunk_hashes", "object_group_ids",
                                               "attn_window"};

/* One parse in progress. */
struct parse {
    const struct request *req;
    struct response *res;
    struct key_request *kr;
    struct keyscan ks;
    int fast_keys;            /* ks holds the keys, decoded and valid */
    struct keyscan_str *strs; /* ks holds the chunk hashes (freed at the end) */
    const cJSON *keys, *ipcv[N_IPC];
    struct param_errors pe;
    size_t key_errors;
    uint64_t max;
};

void key_request_free(struct key_request *kr)
{
    cJSON_Delete(kr->body);
    free(kr->keys);
    free(kr->windows);
    memset(kr, 0, sizeof(*kr));
}

/* Sorts the members of the body into their slots. */
static void take_members(struct parse *p, enum key_request_kind kind)
{
    struct key_request *kr = p->kr;
    for (const cJSON *m = kr->body->child; m; m = m->next) {
        const char *name = m->string ? m->string : "";
        const cJSON **slot = NULL;
        if (kind != BODY_STORE && strcmp(name, "keys") == 0)
            slot = &p->keys;
        /* A store has no attention windows (the last ipc member). */
        for (size_t i = 0; !slot && i < (kind == BODY_STORE ? N_IPC - 1 : N_IPC); i++)
            if (strcmp(name, ipc_members[i]) == 0)
                slot = &p->ipcv[i];
        if (!slot && (kind == BODY_LOOKUP || kind == BODY_STORE) && strcmp(name, "tier") == 0)
            slot = &kr->tier;
        if (!slot && kind == BODY_STORE) {
            if (strcmp(name, "size_bytes") == 0)
                slot = &kr->size;
            else if (strcmp(name, "sizes") == 0)
                slot = &kr->sizes;
        }
        if (!slot && kind == BODY_PREFETCH) {
            if (strcmp(name, "mode") == 0)
                slot = &kr->mode;
            else if (strcmp(name, "trim_policy") == 0)
                slot = &kr->trim;
            else if (strcmp(name, "extra_count") == 0)
                slot = &kr->extra;
            else if (strcmp(name, "external_request_id") == 0)
                slot = &kr->ext_id;
            else if (strcmp(name, "lease_ms") == 0)
                slot = &kr->lease;
        }
        if (!slot || *slot) {
            param_errors_add(&p->pe, "unknown or repeated member", "body");
            continue;
        }
        *slot = m;
    }
}

/* The key form: "keys": [key, ...]. */
static int parse_keys(struct parse *p)
{
    struct key_request *kr = p->kr;
    if (!cJSON_IsArray(p->keys)) {
        param_errors_add(&p->pe, "must be an array of keys", "keys");
        return KVIDX_EINVAL;
    }
    size_t n = p->fast_keys ? p->ks.n : (size_t)cJSON_GetArraySize(p->keys);
    if (n > p->max) {
        res_problemf(p->res, KVIDX_ETOOMANYKEYS,
                     "%zu keys, more than max_keys_per_request (%" PRIu64 ")", n, p->max);
        return KVIDX_ETOOMANYKEYS;
    }
    kr->n = n;
    if (p->fast_keys)
        return 0; /* already decoded and valid */
    kr->keys = malloc((n ? n : 1) * sizeof(*kr->keys));
    if (!kr->keys) {
        res_problem(p->res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        return KVIDX_ENOMEM;
    }
    size_t i = 0;
    for (const cJSON *k = p->keys->child; k; k = k->next, i++) {
        kvidx_reason_t why = {"key", "invalid"};
        if (json_to_key(k, &kr->keys[i], &why) != 0) {
            p->key_errors++;
            char at[32];
            snprintf(at, sizeof(at), "keys[%zu]", i);
            param_errors_key(&p->pe, &why, at);
        }
    }
    return p->pe.n ? KVIDX_EINVAL : 0;
}

/* The ipc form's scalar members and its sizes G x C x R. */
static int parse_ipc_head(struct parse *p)
{
    struct key_request *kr = p->kr;
    const cJSON *model = p->ipcv[0], *ws = p->ipcv[1], *worker = p->ipcv[2], *salt = p->ipcv[3],
                *hashes = p->ipcv[4], *groups = p->ipcv[5], *win = p->ipcv[6];
    kvidx_reason_t why;
    if (!cJSON_IsString(model) ||
        kvidx_key_check_model(model->valuestring, strlen(model->valuestring), &why) != 0) {
        p->key_errors++;
        param_errors_add(&p->pe, "must be a valid model name (1..255 bytes UTF-8, no '@')",
                         "model_name");
    }
    uint64_t world = 0, wid = 0;
    if (json_uint(ws, 1, 255, &world) != 0)
        param_errors_add(&p->pe, "required, an integer 1..255", "world_size");
    kr->ipc.world_size = (uint32_t)world;
    kr->ipc.worker_id = -1;
    if (worker && !cJSON_IsNull(worker)) {
        if (json_uint(worker, 0, 254, &wid) != 0 || (world && wid >= world))
            param_errors_add(&p->pe, "must be null or an integer 0..world_size-1", "worker_id");
        kr->ipc.worker_id = (int32_t)wid;
    }
    if (salt && (!cJSON_IsString(salt) ||
                 kvidx_key_check_salt(salt->valuestring, strlen(salt->valuestring), &why))) {
        p->key_errors++;
        param_errors_add(&p->pe, "must be a string of at most 128 bytes without '@', '/', '\\'",
                         "cache_salt");
    }
    if (!cJSON_IsArray(hashes))
        param_errors_add(&p->pe, "required, an array of hex chunk hashes", "chunk_hashes");
    if (groups && (!cJSON_IsArray(groups) || cJSON_GetArraySize(groups) < 1))
        param_errors_add(&p->pe, "must be a non-empty array of group ids", "object_group_ids");
    if (p->pe.n)
        return KVIDX_EINVAL;
    size_t C = p->strs ? p->ks.nstrs : (size_t)cJSON_GetArraySize(hashes);
    size_t G = groups ? (size_t)cJSON_GetArraySize(groups) : 1;
    kr->ipc.num_chunks = (uint32_t)C;
    kr->ipc.num_groups = (uint32_t)G;
    size_t R = kvidx_ipc_num_ranks(&kr->ipc);
    if (win && (!cJSON_IsArray(win) || (size_t)cJSON_GetArraySize(win) != G)) {
        param_errors_add(&p->pe, "must be an array with one window per object group",
                         "attn_window");
        return KVIDX_EINVAL;
    }
    if ((double)G * (double)C * (double)R > (double)p->max) {
        res_problemf(p->res, KVIDX_ETOOMANYKEYS,
                     "%zu groups x %zu chunks x %zu ranks, more than max_keys_per_request "
                     "(%" PRIu64 ")",
                     G, C, R, p->max);
        return KVIDX_ETOOMANYKEYS;
    }
    kr->shape.num_groups = G;
    kr->shape.num_chunks = C;
    kr->shape.num_ranks = R;
    return 0;
}

/* The ipc form's windows and group ids. */
static void parse_ipc_groups(struct parse *p, uint16_t *gids)
{
    struct key_request *kr = p->kr;
    const cJSON *groups = p->ipcv[5], *win = p->ipcv[6];
    size_t G = kr->shape.num_groups, i = 0;
    for (const cJSON *w = win ? win->child : NULL; i < G; i++, w = w ? w->next : NULL) {
        kr->windows[i] = KVIDX_WINDOW_FULL;
        if (!w)
            continue;
        double v = cJSON_IsNumber(w) ? w->valuedouble : 0;
        uint64_t pos = 0;
        if (cJSON_IsNumber(w) && v == -1.0)
            continue;
        if (json_uint(w, 1, 4294967295.0, &pos) != 0)
            param_errors_add(&p->pe, "must be -1 (full attention) or a window >= 1",
                             "attn_window[%zu]", i);
        else
            kr->windows[i] = (int64_t)pos;
    }
    i = 0;
    for (const cJSON *g = groups ? groups->child : NULL; i < G; i++, g = g ? g->next : NULL) {
        uint64_t v = 0;
        if (g && json_uint(g, 0, KVIDX_GROUP_MAX, &v) != 0)
            param_errors_add(&p->pe, "must be an integer 0..65535", "object_group_ids[%zu]", i);
        gids[i] = (uint16_t)v;
    }
}

/* The first key of every chunk carries its hash, at keys[c * R]. */
static void parse_ipc_hashes(struct parse *p)
{
    struct key_request *kr = p->kr;
    const cJSON *model = p->ipcv[0], *salt = p->ipcv[3], *h = p->ipcv[4]->child;
    size_t C = kr->shape.num_chunks, R = kr->shape.num_ranks, n = kr->n;
    kvidx_key_t proto;
    memset(&proto, 0, sizeof(proto));
    proto.model = model->valuestring;
    proto.model_len = (uint16_t)strlen(model->valuestring);
    proto.salt = salt ? salt->valuestring : "";
    proto.salt_len = (uint8_t)(salt ? strlen(salt->valuestring) : 0);
    for (size_t i = 0; i < C; i++) {
        kvidx_key_t *k = n ? &kr->keys[i * R] : &proto;
        kvidx_reason_t why;
        *k = proto;
        /* From the scanned bytes, or from cJSON's string: the same bytes. */
        const char *hex = p->strs ? p->strs[i].s : cJSON_IsString(h) ? h->valuestring : NULL;
        size_t hex_len = p->strs ? p->strs[i].n : hex ? strlen(hex) : 0;
        if (!p->strs)
            h = h->next;
        if (!hex || kvidx_key_hash_from_hex(hex, hex_len, k->hash, &k->hash_len, &why) != 0) {
            p->key_errors++;
            param_errors_add(&p->pe, "must be 2..128 hex digits, an even count",
                             "chunk_hashes[%zu]", i);
        }
    }
}

/* Expands group-major, then chunk, then rank (kvidx_ipc_split order). The
 * chunk hashes sit at [c * R]; groups > 0 are written first, as copies of
 * the group-0 slots, before group 0's ranks overwrite them. */
static void ipc_expand(struct key_request *kr, const uint16_t *gids)
{
    size_t G = kr->shape.num_groups, C = kr->shape.num_chunks, R = kr->shape.num_ranks;
    for (size_t gi = G; gi-- > 0;) {
        for (size_t c = C; c-- > 0;) {
            kvidx_key_t base = kr->keys[c * R];
            for (size_t r = R; r-- > 0;) {
                kvidx_key_t *k = &kr->keys[gi * C * R + c * R + r];
                *k = base;
                k->group = gids[gi];
                k->kv_rank = kvidx_ipc_rank(&kr->ipc, (uint32_t)r);
            }
        }
    }
}

/* The ipc form. */
static int parse_ipc(struct parse *p)
{
    struct key_request *kr = p->kr;
    kr->is_ipc = 1;
    int rc = parse_ipc_head(p);
    if (rc != 0)
        return rc;
    size_t G = kr->shape.num_groups;
    size_t n = G * kr->shape.num_chunks * kr->shape.num_ranks;
    kr->n = n;
    kr->windows = malloc(G * sizeof(*kr->windows));
    kr->keys = malloc((n ? n : 1) * sizeof(*kr->keys));
    uint16_t *gids = malloc(G * sizeof(*gids));
    if (!kr->windows || !kr->keys || !gids) {
        res_problem(p->res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        rc = KVIDX_ENOMEM;
        goto out;
    }
    kr->shape.windows = kr->windows;
    parse_ipc_groups(p, gids);
    parse_ipc_hashes(p);
    if (p->pe.n) {
        rc = KVIDX_EINVAL;
        goto out;
    }
    ipc_expand(kr, gids);
out:
    free(gids);
    return rc;
}

/* Which form, and that form's keys. */
static int parse_forms(struct parse *p)
{
    int any_ipc = 0;
    for (size_t i = 0; i < N_IPC; i++)
        any_ipc |= p->ipcv[i] != NULL;
    if (p->keys && any_ipc) {
        param_errors_add(&p->pe, "give either keys or the ipc form (model_name, chunk_hashes, ...)",
                         "keys");
        return KVIDX_EINVAL;
    }
    if (!p->keys && !any_ipc) {
        param_errors_add(&p->pe, "required (or the ipc form: model_name, world_size, chunk_hashes)",
                         "keys");
        return KVIDX_EINVAL;
    }
    if (p->pe.n)
        return KVIDX_EINVAL;
    return p->keys ? parse_keys(p) : parse_ipc(p);
}

int key_request_parse(const struct request *req, struct response *res, enum key_request_kind kind,
                      struct key_request *kr)
{
    struct parse p;
    memset(&p, 0, sizeof(p));
    memset(kr, 0, sizeof(*kr));
    p.req = req;
    p.res = res;
    p.kr = kr;
    p.max = req->app->cfg.max_keys_per_request;
    param_errors_init(&p.pe);
    int rc = 0;
    int what = kind == BODY_STORE ? KEYSCAN_CHUNK_HASHES : KEYSCAN_KEYS | KEYSCAN_CHUNK_HASHES;
    if (keyscan_text(req->body, req->body_len, req->app, what, &p.ks) == 0) {
        p.fast_keys = !p.ks.chunk_hashes;
        p.strs = p.ks.chunk_hashes ? p.ks.strs : NULL;
        kr->body = p.ks.rest;
        kr->keys = p.ks.keys;
    } else {
        rc = json_parse_body(req, res, &kr->body);
        if (rc != 0)
            goto out;
    }
    if (!cJSON_IsObject(kr->body)) {
        param_errors_add(&p.pe, "must be a JSON object", "body");
        rc = KVIDX_EINVAL;
    } else {
        take_members(&p, kind);
        rc = parse_forms(&p);
    }
    if (rc != 0 && p.pe.n)
        param_errors_respond(&p.pe, res, p.key_errors ? KVIDX_EKEY : KVIDX_EINVAL,
                             "the request is not valid");
    /* A lookup or a prefetch by a salt-bound token: another salt's keys
     * are absent (a store is refused instead, by its handler). */
    if (rc == 0 && kind != BODY_STORE)
        auth_hide_keys(req, kr->keys, kr->n);
out:
    param_errors_free(&p.pe);
    free(p.strs);
    if (rc != 0)
        key_request_free(kr);
    return rc;
}
