/*
 * The key catalogue over HTTP: batch and single-key stores and deletes,
 * and GET of one key (the listing is api/list.c).
 *
 * Every write validates the whole request before touching the index, so a
 * bad request changes nothing; batch stores are all-or-nothing in the index
 * itself (kvidx_index_put_batch). A write is journaled before it is
 * answered (persist_refuse first, persist_ack last).
 */
#include "api/api.h"
#include "api/key_request.h"
#include "state/auth.h"
#include "state/keystore.h"

#include "util/context.h"
#include "api/body.h"
#include "util/json_read.h"
#include "util/keyscan.h"
#include "state/layouts.h"
#include "util/log.h"
#include "util/metrics.h"
#include "state/persist/persist.h"
#include "state/sources.h"

#include "kvidx/err.h"
#include "kvidx/list_query.h"

#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct keystore *ks_of(const struct request *req)
{
    return req->app->keystore;
}

/* 1 when the n bytes at v are the text lit. Strings are compared with
 * their lengths, never up to a NUL (a query value may hold one). */
static int is_text(const char *v, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(v, lit, n) == 0;
}

/* "l1" / "l2" / "all" member → tier; absent gives def. 0 or KVIDX_EINVAL. */
static int parse_tier(const cJSON *v, kvidx_tier_t def, int allow_all, kvidx_tier_t *out)
{
    if (!v) {
        *out = def;
        return 0;
    }
    size_t n = 0;
    const char *s = json_str(v, &n);
    if (!s)
        return KVIDX_EINVAL;
    if (is_text(s, n, "l1"))
        *out = KVIDX_TIER_L1;
    else if (is_text(s, n, "l2"))
        *out = KVIDX_TIER_L2;
    else if (allow_all && is_text(s, n, "all"))
        *out = KVIDX_TIER_ALL;
    else
        return KVIDX_EINVAL;
    return 0;
}

/* Checks that obj has only the named members (each at most once). Adds an
 * invalid param per offender, prefixed by where. Returns the count. */
static size_t check_members(const cJSON *obj, const char *const *names, struct param_errors *pe,
                            const char *where)
{
    size_t bad = 0;
    unsigned seen = 0;
    for (const cJSON *m = obj->child; m; m = m->next) {
        size_t i = 0;
        for (; names[i]; i++)
            if (strcmp(m->string, names[i]) == 0)
                break;
        if (!names[i] || (seen & (1u << i))) {
            param_errors_add(pe, names[i] ? "repeated member" : "unknown member", "%s%s", where,
                             names[i] ? names[i] : "(unknown)");
            bad++;
        } else {
            seen |= 1u << i;
        }
    }
    return bad;
}

/* Size of a key stored without size_bytes: its model's layout for the key's
 * world size. */
static int layout_size_for(const struct request *req, const kvidx_key_t *k, uint64_t *size)
{
    return layouts_size(req->app->layouts, k->model, k->model_len,
                        kvidx_rank_world_size(k->kv_rank), size);
}

/* Counts the distinct keys of a batch (n keys at base + i * stride) and,
 * when dup is not NULL, sets dup[i] to 1 for each key equal to an earlier
 * one, else 0. The table is keyed by the index's SipHash, so a batch
 * crafted to collide costs no more than any other. Returns the count, or
 * SIZE_MAX when out of memory. */
static size_t count_distinct(const kvidx_index_t *idx, const void *base, size_t stride, size_t n,
                             uint8_t *dup)
{
    if (dup)
        memset(dup, 0, n);
    if (n < 2)
        return n;
    if (n > UINT32_MAX / 4)
        return SIZE_MAX;
    size_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    uint32_t *slot = calloc(cap, sizeof(*slot)); /* 1 + index of a key, 0 when empty */
    if (!slot)
        return SIZE_MAX;
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {
        const kvidx_key_t *k = (const kvidx_key_t *)((const char *)base + i * stride);
        for (size_t h = (size_t)kvidx_index_key_hash64(idx, k) & (cap - 1);;
             h = (h + 1) & (cap - 1)) {
            if (!slot[h]) {
                slot[h] = (uint32_t)(i + 1);
                distinct++;
                break;
            }
            const kvidx_key_t *o =
                (const kvidx_key_t *)((const char *)base + (slot[h] - 1) * stride);
            if (kvidx_key_equal(o, k)) {
                if (dup)
                    dup[i] = 1;
                break;
            }
        }
    }
    free(slot);
    return distinct;
}

static int answer_put_error(struct response *res, int rc, size_t conflict, size_t n)
{
    switch (rc) {
    case KVIDX_ECONFLICT: {
        char name[48];
        struct invalid_param p = {name, "size differs while the key's L1 copy is pinned or an "
                                        "L2 source holds it"};
        snprintf(name, sizeof(name), "entries[%zu].size_bytes", conflict < n ? conflict : 0);
        return res_problem(res, KVIDX_ECONFLICT,
                           "cannot resize a pinned key or one an L2 source holds", &p, 1);
    }
    case KVIDX_ECAPACITY:
        return res_problem(res, KVIDX_ECAPACITY,
                           "no room in the tier even after evicting every unpinned L1 copy", NULL,
                           0);
    case KVIDX_ENOMEM:
        return res_problem(res, KVIDX_ENOMEM, "out of memory; nothing was stored", NULL, 0);
    default:
        return res_problem(res, rc, "nothing was stored", NULL, 0);
    }
}

/* Stores n items into tier and answers {"stored": distinct keys}, or the
 * problem. */
static void store_items(const struct request *req, struct response *res, kvidx_tier_t tier,
                        const kvidx_put_t *items, size_t n)
{
    size_t conflict = 0, stored = 0;
    if (auth_forbid_keys(req, res, items, sizeof(*items), n) != 0)
        return; /* a key of a salt the token may not write: nothing stored */
    int rc = kvidx_index_put_batch_count(ks_of(req)->idx, tier, items, n, &conflict, &stored);
    if (rc != 0) {
        answer_put_error(res, rc, conflict, n);
        return;
    }
    buf_printf(&res->body, "{\"stored\":%zu}", stored);
    res_json(res, 200);
}

/* A member that only the ipc form of a store has. */
static int has_ipc_member(const cJSON *body)
{
    static const char *const names[] = {
        "model_name",   "world_size",       "worker_id", "cache_salt",
        "chunk_hashes", "object_group_ids", "sizes",     NULL};
    if (!cJSON_IsObject(body) || cJSON_GetObjectItemCaseSensitive(body, "entries"))
        return 0;
    for (size_t i = 0; names[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(body, names[i]))
            return 1;
    return 0;
}

/* The size of every key of an ipc-form store: size_bytes (one for all),
 * sizes (one per chunk), or the layout of the model for its world size.
 * 0, or the problem is answered and its code returned. */
static int ipc_sizes(const struct request *req, struct response *res, const struct key_request *kr,
                     kvidx_put_t *items)
{
    struct param_errors pe;
    param_errors_init(&pe);
    size_t C = kr->shape.num_chunks, R = kr->shape.num_ranks, n = kr->n;
    uint64_t one = 0;
    uint64_t *per = NULL;
    int rc = 0;
    if (kr->size && kr->sizes) {
        param_errors_add(&pe, "give size_bytes or sizes, not both", "sizes");
    } else if (kr->size) {
        if (json_uint(kr->size, 1, (double)KVIDX_SIZE_MAX, &one) != 0)
            param_errors_add(&pe, "must be an integer 1..2^40", "size_bytes");
    } else if (kr->sizes) {
        if (!cJSON_IsArray(kr->sizes) || (size_t)cJSON_GetArraySize(kr->sizes) != C) {
            param_errors_add(&pe, "must be an array with one size per chunk hash", "sizes");
        } else if (!(per = malloc((C ? C : 1) * sizeof(*per)))) {
            param_errors_free(&pe);
            return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        } else {
            size_t c = 0;
            for (const cJSON *v = kr->sizes->child; v; v = v->next, c++)
                if (json_uint(v, 1, (double)KVIDX_SIZE_MAX, &per[c]) != 0)
                    param_errors_add(&pe, "must be an integer 1..2^40", "sizes[%zu]", c);
        }
    } else if (n && layout_size_for(req, &kr->keys[0], &one) != 0) {
        param_errors_add(&pe, "no size_bytes and no layout registered for its model", "size_bytes");
        rc = param_errors_respond(&pe, res, KVIDX_ECONFLICT,
                                  "register a layout (PUT /v1/layouts) or give size_bytes");
        goto out;
    }
    if (pe.n) {
        rc = param_errors_respond(&pe, res, KVIDX_EINVAL, "invalid request; nothing was stored");
        goto out;
    }
    /* Group-major, then chunk, then rank: key i is chunk (i / R) % C. */
    for (size_t i = 0; i < n; i++) {
        items[i].key = kr->keys[i];
        items[i].size_bytes = per ? per[i / R % C] : one;
    }
out:
    free(per);
    param_errors_free(&pe);
    return rc;
}

/* PUT /v1/keys in the ipc form: {"tier", "model_name", "world_size",
 * "worker_id", "cache_salt", "chunk_hashes", "object_group_ids",
 * "size_bytes" | "sizes"}, expanded as a lookup's ipc form is. */
static int keys_put_ipc(const struct request *req, struct response *res)
{
    struct key_request kr;
    if (key_request_parse(req, res, BODY_STORE, &kr) != 0)
        return persist_ack(req, res);
    kvidx_tier_t tier = KVIDX_TIER_L2;
    kvidx_put_t *items = NULL;
    if (parse_tier(kr.tier, KVIDX_TIER_L2, 0, &tier) != 0) {
        struct invalid_param p = {"tier", "must be \"l1\" or \"l2\""};
        res_problem(res, KVIDX_EINVAL, "invalid request; nothing was stored", &p, 1);
        goto out;
    }
    items = malloc((kr.n ? kr.n : 1) * sizeof(*items));
    if (!items) {
        res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        goto out;
    }
    if (ipc_sizes(req, res, &kr, items) == 0)
        store_items(req, res, tier, items, kr.n);
out:
    free(items);
    key_request_free(&kr);
    return persist_ack(req, res);
}

/* The entries of a PUT /v1/keys body read from its cJSON tree into items
 * (as many as the array holds): every problem goes into pe, bad keys are
 * counted in *key_errors, and an entry without size_bytes gets size 0 and
 * sets *need_layout. */
static void entries_from_json(const cJSON *entries, kvidx_put_t *items, struct param_errors *pe,
                              int *key_errors, int *need_layout)
{
    static const char *const entry_names[] = {"key", "size_bytes", NULL};
    size_t i = 0;
    for (const cJSON *e = entries->child; e; e = e->next, i++) {
        if (!cJSON_IsObject(e)) {
            param_errors_add(pe, "must be an object {\"key\", \"size_bytes\"}", "entries[%zu]", i);
            continue;
        }
        char where[40];
        snprintf(where, sizeof(where), "entries[%zu].", i);
        check_members(e, entry_names, pe, where);
        kvidx_reason_t why;
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(e, "key");
        if (json_to_key(k, &items[i].key, &why) != 0) {
            char at[48];
            snprintf(at, sizeof(at), "entries[%zu].key", i);
            param_errors_key(pe, &why, at);
            (*key_errors)++;
        }
        const cJSON *sz = cJSON_GetObjectItemCaseSensitive(e, "size_bytes");
        int rc = json_uint(sz, 1, (double)KVIDX_SIZE_MAX, &items[i].size_bytes);
        if (rc == 1) {
            items[i].size_bytes = 0;
            *need_layout = 1;
        } else if (rc != 0) {
            param_errors_add(pe, "must be an integer 1..2^40", "entries[%zu].size_bytes", i);
        }
    }
}

/* Gives every item of size 0 its layout's size. 0, or KVIDX_ECONFLICT with
 * each entry that has no layout in pe. */
static int layout_sizes(const struct request *req, kvidx_put_t *items, size_t n,
                        struct param_errors *pe)
{
    for (size_t i = 0; i < n; i++) {
        if (items[i].size_bytes == 0 &&
            layout_size_for(req, &items[i].key, &items[i].size_bytes) != 0)
            param_errors_add(pe, "no size_bytes and no layout registered for its model",
                             "entries[%zu].size_bytes", i);
    }
    return pe->n ? KVIDX_ECONFLICT : 0;
}

/* PUT /v1/keys {"tier", "entries": [KeyEntry...]}, or the ipc form. Plain
 * bodies are read by the scanner (util/keyscan.h) without a cJSON tree of
 * their entries; anything else by cJSON, which gives every answer. */
static int keys_put(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    static const char *const top_names[] = {"tier", "entries", NULL};
    struct keyscan ks;
    cJSON *body = NULL;
    kvidx_put_t *items = NULL;
    size_t n = 0;
    if (keyscan_text(req->body, req->body_len, req->app, KEYSCAN_ENTRIES | KEYSCAN_CHUNK_HASHES,
                     &ks) == 0) {
        if (ks.chunk_hashes) {
            keyscan_free(&ks);
            return keys_put_ipc(req, res);
        }
        body = ks.rest;
        items = ks.items;
        n = ks.n;
        ks.rest = NULL;
        ks.items = NULL;
        keyscan_free(&ks);
    } else {
        if (json_parse_body(req, res, &body) != 0)
            return 0;
        if (has_ipc_member(body)) {
            cJSON_Delete(body);
            return keys_put_ipc(req, res);
        }
    }
    int fast = items != NULL;
    struct param_errors pe;
    param_errors_init(&pe);
    int key_errors = 0, need_layout = 0;
    kvidx_tier_t tier = KVIDX_TIER_L2;
    const cJSON *entries = NULL;

    if (!cJSON_IsObject(body)) {
        param_errors_add(&pe, "must be a JSON object", "body");
        goto invalid;
    }
    check_members(body, top_names, &pe, "");
    if (parse_tier(cJSON_GetObjectItemCaseSensitive(body, "tier"), KVIDX_TIER_L2, 0, &tier) != 0)
        param_errors_add(&pe, "must be \"l1\" or \"l2\"", "tier");
    entries = cJSON_GetObjectItemCaseSensitive(body, "entries");
    if (!cJSON_IsArray(entries)) {
        param_errors_add(&pe, "must be an array of KeyEntry objects", "entries");
        goto invalid;
    }
    size_t i = 0;
    if (fast) {
        /* Every scanned entry is valid; a size of 0 means none was given. */
        for (i = 0; i < n; i++)
            need_layout |= items[i].size_bytes == 0;
        goto checked;
    }
    n = (size_t)cJSON_GetArraySize(entries);
    if (n > req->app->cfg.max_keys_per_request) {
        cJSON_Delete(body);
        param_errors_free(&pe);
        return res_problemf(res, KVIDX_ETOOMANYKEYS, "%zu entries; at most %llu per request", n,
                            (unsigned long long)req->app->cfg.max_keys_per_request);
    }
    items = calloc(n ? n : 1, sizeof(*items));
    if (!items) {
        cJSON_Delete(body);
        param_errors_free(&pe);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    entries_from_json(entries, items, &pe, &key_errors, &need_layout);
checked:
    if (pe.n)
        goto invalid;
    if (need_layout && layout_sizes(req, items, n, &pe) != 0) {
        param_errors_respond(&pe, res, KVIDX_ECONFLICT,
                             "register a layout (PUT /v1/layouts) or give size_bytes");
        goto out;
    }
    /* A key named twice is stored once (its last position and size win):
     * "stored" counts keys, not entries. */
    store_items(req, res, tier, items, n);
    goto out;

invalid:
    param_errors_respond(&pe, res, key_errors ? KVIDX_EKEY : KVIDX_EINVAL,
                         key_errors ? "invalid keys; nothing was stored"
                                    : "invalid request; nothing was stored");
out:
    free(items);
    param_errors_free(&pe);
    cJSON_Delete(body);
    return persist_ack(req, res);
}

/* DELETE /v1/keys {"tier", "force", "keys": [EncodedObjectKey...]} */
static int keys_delete(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    static const char *const top_names[] = {"tier", "force", "keys", NULL};
    cJSON *body;
    if (json_parse_body(req, res, &body) != 0)
        return 0;
    struct param_errors pe;
    param_errors_init(&pe);
    kvidx_key_t *keys = NULL;
    uint8_t *dup = NULL;
    int key_errors = 0;
    kvidx_tier_t tier = KVIDX_TIER_ALL;
    int force = 0;
    const cJSON *list;
    size_t n = 0;

    if (!cJSON_IsObject(body)) {
        param_errors_add(&pe, "must be a JSON object", "body");
        goto invalid;
    }
    check_members(body, top_names, &pe, "");
    if (parse_tier(cJSON_GetObjectItemCaseSensitive(body, "tier"), KVIDX_TIER_ALL, 1, &tier) != 0)
        param_errors_add(&pe, "must be \"l1\", \"l2\" or \"all\"", "tier");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(body, "force");
    if (f && !cJSON_IsBool(f))
        param_errors_add(&pe, "must be a boolean", "force");
    force = cJSON_IsTrue(f);
    list = cJSON_GetObjectItemCaseSensitive(body, "keys");
    if (!cJSON_IsArray(list)) {
        param_errors_add(&pe, "must be an array of keys", "keys");
        goto invalid;
    }
    n = (size_t)cJSON_GetArraySize(list);
    if (n > req->app->cfg.max_keys_per_request) {
        cJSON_Delete(body);
        param_errors_free(&pe);
        return res_problemf(res, KVIDX_ETOOMANYKEYS, "%zu keys; at most %llu per request", n,
                            (unsigned long long)req->app->cfg.max_keys_per_request);
    }
    keys = calloc(n ? n : 1, sizeof(*keys));
    if (!keys) {
        cJSON_Delete(body);
        param_errors_free(&pe);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    size_t i = 0;
    for (const cJSON *k = list->child; k; k = k->next, i++) {
        kvidx_reason_t why;
        if (json_to_key(k, &keys[i], &why) != 0) {
            char at[32];
            snprintf(at, sizeof(at), "keys[%zu]", i);
            param_errors_key(&pe, &why, at);
            key_errors++;
        }
    }
    if (pe.n)
        goto invalid;
    if (auth_forbid_keys(req, res, keys, sizeof(*keys), n) != 0)
        goto out; /* a key of a salt the token may not write: nothing deleted */
    /* A key named twice is deleted and counted once, by what happened to
     * it: the counts add up to the number of distinct keys. */
    dup = malloc(n ? n : 1);
    if (!dup || count_distinct(ks_of(req)->idx, keys, sizeof(*keys), n, dup) == SIZE_MAX) {
        res_problem(res, KVIDX_ENOMEM, "out of memory; nothing was deleted", NULL, 0);
        goto out;
    }
    /* skipped_source: keys whose only copy in the tiers named is held by
     * an L2 source, which the API cannot delete (nothing was deleted). */
    uint64_t counts[4] = {0, 0, 0, 0};
    for (i = 0; i < n; i++) {
        if (dup[i])
            continue;
        kvidx_del_outcome_t o = KVIDX_DEL_NOT_FOUND;
        kvidx_index_delete(ks_of(req)->idx, &keys[i], tier, force, &o);
        counts[o]++;
    }
    buf_printf(&res->body,
               "{\"deleted\":%llu,\"not_found\":%llu,\"skipped_pinned\":%llu,"
               "\"skipped_source\":%llu}",
               (unsigned long long)counts[KVIDX_DEL_DELETED],
               (unsigned long long)counts[KVIDX_DEL_NOT_FOUND],
               (unsigned long long)counts[KVIDX_DEL_SKIPPED_PINNED],
               (unsigned long long)counts[KVIDX_DEL_SKIPPED_SOURCE]);
    res_json(res, 200);
    goto out;

invalid:
    param_errors_respond(&pe, res, key_errors ? KVIDX_EKEY : KVIDX_EINVAL,
                         "invalid request; nothing was deleted");
out:
    free(dup);
    free(keys);
    param_errors_free(&pe);
    cJSON_Delete(body);
    return persist_ack(req, res);
}

/* Checks the query of a single-key route: only the names in known (a
 * NULL-terminated list, fewer than 32), each at most once; names are
 * compared raw, as query_get finds them. Empty pairs are skipped, as in the
 * listing. 0, or answers 400 invalid_argument naming the parameter (an
 * unknown name is quoted when it is short and plain, else called "query")
 * and returns KVIDX_EINVAL. */
static int check_query(const struct request *req, struct response *res, const char *const *known,
                       const char *unknown_reason)
{
    const char *q = req->query ? req->query : "";
    size_t n = req->query ? req->query_len : 0;
    unsigned seen = 0;
    size_t pos = 0;
    kvidx_query_pair_t qp;
    while (kvidx_query_next(q, n, &pos, &qp)) {
        size_t k = 0;
        while (known[k] && !is_text(qp.name, qp.name_len, known[k]))
            k++;
        if (known[k] && !(seen & (1u << k))) {
            seen |= 1u << k;
            continue;
        }
        char name[33] = "query";
        struct invalid_param p = {name, "must not be given more than once"};
        if (known[k]) {
            snprintf(name, sizeof(name), "%s", known[k]);
        } else {
            /* The name is request bytes: echoed only when short and made of
             * characters that need no escaping anywhere. */
            size_t len = qp.name_len, j = 0;
            for (; j < len && len < sizeof(name); j++) {
                char c = qp.name[j];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-' || c == '.' || c == '~'))
                    break;
            }
            if (len > 0 && j == len && len < sizeof(name)) {
                memcpy(name, qp.name, len);
                name[len] = '\0';
            }
            p.reason = unknown_reason;
        }
        res_problem(res, KVIDX_EINVAL, "invalid query parameter", &p, 1);
        return KVIDX_EINVAL;
    }
    return 0;
}

static const char *const no_params[] = {NULL};

/* Parses the {canonical} path parameter. 0, or answers 400 and returns
 * KVIDX_EKEY. The parameter may hold NUL bytes (the route's '#'): the
 * parser takes its length and rejects them like any forbidden byte. */
static int path_key(const struct request *req, struct response *res, kvidx_key_t *k)
{
    kvidx_reason_t why;
    if (!req->route_param ||
        kvidx_key_parse_canonical(req->route_param, req->route_param_len, k, &why) != 0) {
        struct invalid_param p = {"key", req->route_param ? why.rule : "missing"};
        if (req->route_param)
            p.name = why.field;
        res_problem(res, KVIDX_EKEY, "the path does not name a canonical key", &p, 1);
        return KVIDX_EKEY;
    }
    return 0;
}

static void write_entry_state(struct jw *w, const kvidx_entry_info_t *info)
{
    jw_key(w, "size_bytes");
    jw_u64(w, info->size_bytes);
    jw_key(w, "l1");
    if (info->l1_state == KVIDX_L1_NONE) {
        jw_null(w);
    } else {
        jw_obj_begin(w);
        jw_key(w, "state");
        jw_str(w, info->l1_state == KVIDX_L1_READY ? "ready" : "loading");
        jw_key(w, "pins");
        jw_u64(w, info->pins);
        jw_key(w, "temporary");
        jw_bool(w, info->temporary);
        jw_obj_end(w);
    }
    jw_key(w, "l2");
    jw_bool(w, info->l2);
}

/* GET /v1/keys/{canonical} (no query parameters) */
static int key_get(const struct request *req, struct response *res)
{
    kvidx_key_t k;
    if (path_key(req, res, &k) != 0 ||
        check_query(req, res, no_params, "this route takes no query parameters") != 0)
        return 0;
    kvidx_ref_t ref;
    kvidx_entry_info_t info;
    kvidx_key_t stored;
    kvidx_index_t *idx = ks_of(req)->idx;
    /* Another salt's key answers as a key never stored, byte for byte. */
    if (!auth_sees_salt(req, k.salt, k.salt_len) || kvidx_index_find(idx, &k, &ref) != 0 ||
        kvidx_index_info(idx, ref, &info) != 0 || kvidx_index_key(idx, ref, &stored) != 0)
        return res_problem(res, KVIDX_ENOTFOUND, "no such key", NULL, 0);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "key");
    jw_key_object(&w, &stored);
    write_entry_state(&w, &info);
    /* The L2 sources holding the key ([] when none). */
    const struct source *held[SOURCES_MAX];
    size_t nheld = sources_holding(req->app, &stored, held, SOURCES_MAX);
    jw_key(&w, "l2_sources");
    jw_arr_begin(&w);
    for (size_t i = 0; i < nheld; i++)
        jw_str(&w, held[i]->name);
    jw_arr_end(&w);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

/* PUT /v1/keys/{canonical} {"size_bytes", "tier"} (no query parameters) */
static int key_put(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    static const char *const names[] = {"size_bytes", "tier", NULL};
    kvidx_key_t k;
    if (path_key(req, res, &k) != 0 ||
        check_query(req, res, no_params,
                    "this route takes no query parameters (size_bytes and tier go in the body)") !=
            0)
        return 0;
    kvidx_put_t item;
    kvidx_tier_t tier = KVIDX_TIER_L2;
    memset(&item, 0, sizeof(item));
    item.key = k;
    int fast_tier = 0;
    if (keyscan_put_one(req->body, req->body_len, &item.size_bytes, &fast_tier) == 0) {
        /* A plain body: no tree. */
        tier = fast_tier == 1 ? KVIDX_TIER_L1 : KVIDX_TIER_L2;
        if (item.size_bytes == 0 && layout_size_for(req, &k, &item.size_bytes) != 0) {
            struct invalid_param p = {"size_bytes",
                                      "no size_bytes and no layout registered for its model"};
            res_problem(res, KVIDX_ECONFLICT,
                        "register a layout (PUT /v1/layouts) or give size_bytes", &p, 1);
        } else {
            store_items(req, res, tier, &item, 1);
        }
        return persist_ack(req, res);
    }
    cJSON *body;
    if (json_parse_body(req, res, &body) != 0)
        return 0;
    struct param_errors pe;
    param_errors_init(&pe);
    if (!cJSON_IsObject(body)) {
        param_errors_add(&pe, "must be a JSON object", "body");
    } else {
        check_members(body, names, &pe, "");
        if (parse_tier(cJSON_GetObjectItemCaseSensitive(body, "tier"), KVIDX_TIER_L2, 0, &tier) !=
            0)
            param_errors_add(&pe, "must be \"l1\" or \"l2\"", "tier");
        int rc = json_uint(cJSON_GetObjectItemCaseSensitive(body, "size_bytes"), 1,
                           (double)KVIDX_SIZE_MAX, &item.size_bytes);
        if (rc < 0)
            param_errors_add(&pe, "must be an integer 1..2^40", "size_bytes");
        else if (rc == 1 && layout_size_for(req, &k, &item.size_bytes) != 0) {
            param_errors_add(&pe, "no size_bytes and no layout registered for its model",
                             "size_bytes");
            param_errors_respond(&pe, res, KVIDX_ECONFLICT,
                                 "register a layout (PUT /v1/layouts) or give size_bytes");
            goto out;
        }
    }
    if (pe.n) {
        param_errors_respond(&pe, res, KVIDX_EINVAL, "invalid request; nothing was stored");
        goto out;
    }
    store_items(req, res, tier, &item, 1);
out:
    param_errors_free(&pe);
    cJSON_Delete(body);
    return persist_ack(req, res);
}

/* DELETE /v1/keys/{canonical}[?tier=l1|l2|all&force=true] */
static int key_delete(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    static const char *const params[] = {"tier", "force", NULL};
    kvidx_key_t k;
    if (path_key(req, res, &k) != 0 ||
        check_query(req, res, params, "unknown parameter (known: tier, force)") != 0)
        return 0;
    char v[8];
    size_t vn = 0;
    kvidx_tier_t tier = KVIDX_TIER_ALL;
    int force = 0;
    /* Values are compared with their length: "l1%00x" is no "l1". */
    int rc = query_get(req->query, "tier", v, sizeof(v), &vn);
    if (rc == 1 && is_text(v, vn, "l1"))
        tier = KVIDX_TIER_L1;
    else if (rc == 1 && is_text(v, vn, "l2"))
        tier = KVIDX_TIER_L2;
    else if (rc != 0 && !(rc == 1 && is_text(v, vn, "all")))
        return res_problem(res, KVIDX_EINVAL, "tier must be l1, l2 or all", NULL, 0);
    rc = query_get(req->query, "force", v, sizeof(v), &vn);
    if (rc == 1 && (is_text(v, vn, "true") || is_text(v, vn, "1")))
        force = 1;
    else if (rc != 0 && !(rc == 1 && (is_text(v, vn, "false") || is_text(v, vn, "0"))))
        return res_problem(res, KVIDX_EINVAL, "force must be true or false", NULL, 0);
    /* Before looking: the same 403 whether the key exists or not. */
    if (auth_forbid_keys(req, res, &k, sizeof(k), 1) != 0)
        return 0;

    kvidx_index_t *idx = ks_of(req)->idx;
    kvidx_ref_t ref;
    kvidx_entry_info_t info;
    if (kvidx_index_find(idx, &k, &ref) != 0 || kvidx_index_info(idx, ref, &info) != 0)
        return res_problem(res, KVIDX_ENOTFOUND, "no such key", NULL, 0);
    /* A single-key delete is all or nothing: a pinned L1 copy refuses the
     * whole request (409) instead of deleting only the L2 copy. */
    if (!force && tier != KVIDX_TIER_L2 && info.l1_state != KVIDX_L1_NONE &&
        (info.pins > 0 || info.l1_state == KVIDX_L1_LOADING))
        return res_problem(res, KVIDX_ECONFLICT,
                           "the key's L1 copy is pinned or loading; use force=true", NULL, 0);
    kvidx_del_outcome_t o = KVIDX_DEL_NOT_FOUND;
    kvidx_index_delete(idx, &k, tier, force, &o);
    if (o == KVIDX_DEL_SKIPPED_SOURCE)
        return res_problem(res, KVIDX_ECONFLICT,
                           "the key's only copy is held by an L2 source (l2_source), which "
                           "follows its store: delete it there",
                           NULL, 0);
    if (o != KVIDX_DEL_DELETED)
        return res_problem(res, KVIDX_ENOTFOUND, "the key has no copy in that tier", NULL, 0);
    res->status = 204;
    return persist_ack(req, res);
}

const struct route key_routes[] = {
    {M_PUT, "/v1/keys", keys_put, "keys_put", ROUTE_WRITE},
    {M_DELETE, "/v1/keys", keys_delete, "keys_delete", ROUTE_WRITE},
    /* '#': an encoded NUL reaches path_key, which answers invalid_key. */
    {M_GET, "/v1/keys/#", key_get, "key_get", ROUTE_READ},
    {M_PUT, "/v1/keys/#", key_put, "key_put", ROUTE_WRITE},
    {M_DELETE, "/v1/keys/#", key_delete, "key_delete", ROUTE_WRITE},
    {0, NULL, NULL, NULL, 0},
};
