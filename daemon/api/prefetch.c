/*
 * POST /v1/lookup, the prefetch handles of /v1/prefetches and the loads of
 * /v1/loads (SPEC §3.3, §3.4, §4).
 *
 * A lookup probes the index with kvidx_index_find_batch/info only: it never
 * changes recency, pins or state. A prefetch probes the same way, asks
 * kvidx_prefetch_plan what to pin, load and join, does it, and when its
 * last load has finished asks kvidx_prefetch_trim what to keep.
 *
 * Invariants:
 *   - every pin a handle holds is recorded in its ledger (kvidx_pfh_t of
 *     kvidx/prefetch_handle.h, on the copy of one generation) and given
 *     back exactly once: by a release, a DELETE, the trim, the lease end or
 *     shutdown. A pin whose copy has disappeared (forced delete) is
 *     recognised through the generation and counted as lost, never unpinned;
 *   - every loading L1 copy the daemon creates has one struct load, found
 *     by (ref, generation); handles join it instead of loading twice
 *     (single-flight) and pin the copy when it turns ready, before it can
 *     be evicted. A load whose waiters all went away drops its copy;
 *   - handles, loads, tasks and polls are freed only from uv close
 *     callbacks or after the loop ended, so a pointer taken inside one
 *     callback stays valid until that callback returns, even when an answer
 *     completed in between re-enters a handler;
 *   - a handle leaves pending exactly once; every long poll on it is then
 *     answered. Bad input answers problem+json and changes nothing.
 */
#include "api/api.h"
#include "state/prefetches.h"

#include "util/context.h"
#include "util/json_read.h"
#include "util/keyscan.h"
#include "state/keystore.h"
#include "util/metrics.h"

#include "kvidx/err.h"
#include "kvidx/fold.h"
#include "kvidx/index.h"
#include "kvidx/key.h"
#include "kvidx/prefetch_handle.h"
#include "kvidx/prefetch_plan.h"
#include "kvidx/prefetch_table.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXTRA_COUNT_MAX 127u
#define EXT_ID_MAX      256u

/* ---------------------------------------------------------------------- */
/* A tiny intrusive hash map of uint64 keys (chained; duplicates allowed). */

struct imap_node {
    uint64_t key;
    struct imap_node *next;
};

struct imap {
    struct imap_node **b;
    size_t cap, n; /* cap is 0 or a power of two */
};

static size_t imap_slot(const struct imap *m, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)(key & (m->cap - 1));
}

static int imap_put(struct imap *m, struct imap_node *x)
{
    if (m->n + 1 > m->cap / 2 * 3 || m->cap == 0) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        struct imap_node **b = calloc(cap, sizeof(*b));
        if (!b)
            return KVIDX_ENOMEM;
        struct imap old = *m;
        m->b = b;
        m->cap = cap;
        for (size_t i = 0; i < old.cap; i++) {
            for (struct imap_node *e = old.b[i], *next; e; e = next) {
                next = e->next;
                size_t s = imap_slot(m, e->key);
                e->next = m->b[s];
                m->b[s] = e;
            }
        }
        free(old.b);
    }
    size_t s = imap_slot(m, x->key);
    x->next = m->b[s];
    m->b[s] = x;
    m->n++;
    return 0;
}

static struct imap_node *imap_first(const struct imap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    for (struct imap_node *e = m->b[imap_slot(m, key)]; e; e = e->next)
        if (e->key == key)
            return e;
    return NULL;
}

static void imap_del(struct imap *m, struct imap_node *x)
{
    if (!m->cap)
        return;
    for (struct imap_node **pp = &m->b[imap_slot(m, x->key)]; *pp; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            m->n--;
            return;
        }
    }
}

/* ---------------------------------------------------------------------- */
/* State */

static const char *const status_names[] = {"pending", "completed", "released", "expired"};
static const char *const mode_names[] = {"LOOKUP", "WARM"};
static const char *const policy_names[] = {"PREFIX", "SEGMENTED_PREFIX", "SPARSE"};

struct load;
struct poll;

struct handle {
    struct imap_node node; /* key = id */
    struct prefetches *pf;
    uint64_t id;
    kvidx_pfh_t pfh;    /* pins, plan, result and status (lib/prefetch_handle.c) */
    struct load **wait; /* per key: the load it waits for, or NULL */
    char *ext_id;       /* NULL: null on the wire */
    int is_ipc;
    int64_t *windows;
    double submit_time;    /* wall clock, seconds */
    uint64_t expires_mono; /* lease end (loop clock, ms) */
    uint64_t gone_mono;    /* end of the grace period once released/expired */
    uv_timer_t timer;
    int closing;
    struct poll *polls;
};

struct waiter {
    struct handle *h;
    uint32_t idx;
};

struct task;

struct load {
    struct imap_node node; /* key = ref */
    kvidx_ref_t ref;
    uint64_t gen;
    struct waiter *w;
    size_t nw, capw;
    struct task *task; /* external loader; NULL for the catalog loader */
    uint32_t task_pos;
};

struct task {
    struct imap_node node; /* key = id */
    struct prefetches *pf;
    uint64_t id;
    struct load **loads; /* NULL once finished */
    size_t n, open;
    uint64_t created_wall;
    uv_timer_t timer;
    int closing;
    struct task *next, *prev; /* list of unfinished tasks, oldest first */
};

struct poll {
    struct prefetches *pf;
    struct handle *h; /* NULL: a GET /v1/loads poll */
    struct response *res;
    uv_timer_t timer;
    int closing;
    struct poll *next;
};

struct prefetches {
    struct app *app;
    struct imap handles;
    struct imap loads;
    struct imap tasks;
    struct task *task_head, *task_tail;
    uint64_t next_id;   /* last handle id issued */
    uint64_t next_task; /* last task id issued */
    struct load **catalog_q;
    size_t catalog_n, catalog_cap;
    uv_timer_t catalog_timer;
    struct poll *load_polls;
    int stopped;
};

static kvidx_index_t *pf_idx(const struct prefetches *pf)
{
    return pf->app->keystore->idx;
}

static void count(struct prefetches *pf, const char *name, uint64_t d)
{
    metrics_add(pf->app->metrics, name, d);
}

/* ---------------------------------------------------------------------- */
/* Request bodies: the key form and the ipc form (SPEC §1.3, §3.3) */

enum { BODY_LOOKUP = 1, BODY_PREFETCH = 2 };

struct kreq {
    cJSON *body;
    kvidx_key_t *keys;
    size_t n;
    int is_ipc;
    kvidx_ipc_t ipc;
    int64_t *windows;
    kvidx_fold_shape_t shape;
    const cJSON *tier, *mode, *trim, *extra, *ext_id, *lease;
};

static void kreq_free(struct kreq *kr)
{
    cJSON_Delete(kr->body);
    free(kr->keys);
    free(kr->windows);
    memset(kr, 0, sizeof(*kr));
}

static const char *const ipc_members[] = {"model_name", "world_size",   "worker_id",
                                          "cache_salt", "chunk_hashes", "object_group_ids",
                                          "attn_window"};

/* Parses and validates the keys of a lookup or prefetch body. Returns 0, or
 * a nonzero value after filling res with the problem. */
static int kreq_parse(const struct request *req, struct response *res, int kind, struct kreq *kr)
{
    memset(kr, 0, sizeof(*kr));
    /* Key-form bodies skip the cJSON tree of their keys, ipc-form ones
     * that of their chunk hashes (keyscan.h); any other body, or anything
     * unusual, takes the cJSON path. */
    struct keyscan ks;
    int fast = keyscan_body(req, KEYSCAN_KEYS | KEYSCAN_CHUNK_HASHES, &ks) == 0;
    int fast_keys = fast && !ks.chunk_hashes;
    struct keyscan_str *strs = fast && ks.chunk_hashes ? ks.strs : NULL; /* freed at out */
    if (fast) {
        kr->body = ks.rest;
        kr->keys = ks.keys;
    } else if (json_parse_body(req, res, &kr->body) != 0) {
        return 1;
    }
    const cJSON *body = kr->body;
    const cJSON *keys = NULL, *ipcv[7] = {NULL};
    struct param_errors pe;
    param_errors_init(&pe);
    uint64_t max = req->app->cfg.max_keys_per_request;
    int rc = 1;
    size_t key_errors = 0;

    if (!cJSON_IsObject(body)) {
        param_errors_add(&pe, "must be a JSON object", "body");
        goto bad;
    }
    for (const cJSON *m = body->child; m; m = m->next) {
        const char *name = m->string ? m->string : "";
        const cJSON **slot = NULL;
        if (strcmp(name, "keys") == 0)
            slot = &keys;
        for (size_t i = 0; !slot && i < 7; i++)
            if (strcmp(name, ipc_members[i]) == 0)
                slot = &ipcv[i];
        if (!slot && kind == BODY_LOOKUP && strcmp(name, "tier") == 0)
            slot = &kr->tier;
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
            /* The member name is request bytes: not echoed. */
            param_errors_add(&pe, "unknown or repeated member", "body");
            continue;
        }
        *slot = m;
    }
    int any_ipc = 0;
    for (size_t i = 0; i < 7; i++)
        any_ipc |= ipcv[i] != NULL;
    if (keys && any_ipc) {
        param_errors_add(&pe, "give either keys or the ipc form (model_name, chunk_hashes, ...)",
                         "keys");
        goto bad;
    }
    if (!keys && !any_ipc) {
        param_errors_add(&pe, "required (or the ipc form: model_name, world_size, chunk_hashes)",
                         "keys");
        goto bad;
    }
    if (pe.n)
        goto bad;

    if (keys) {
        if (!cJSON_IsArray(keys)) {
            param_errors_add(&pe, "must be an array of keys", "keys");
            goto bad;
        }
        size_t n = fast_keys ? ks.n : (size_t)cJSON_GetArraySize(keys);
        if (n > max) {
            res_problemf(res, KVIDX_ETOOMANYKEYS,
                         "%zu keys, more than max_keys_per_request (%" PRIu64 ")", n, max);
            goto out;
        }
        if (fast_keys) { /* already decoded and valid */
            kr->n = n;
            rc = 0;
            goto out;
        }
        kr->keys = malloc((n ? n : 1) * sizeof(*kr->keys));
        if (!kr->keys) {
            res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
            goto out;
        }
        size_t i = 0;
        for (const cJSON *k = keys->child; k; k = k->next, i++) {
            kvidx_reason_t why = {"key", "invalid"};
            if (json_to_key(k, &kr->keys[i], &why) != 0) {
                key_errors++;
                char at[32];
                snprintf(at, sizeof(at), "keys[%zu]", i);
                param_errors_key(&pe, &why, at);
            }
        }
        kr->n = n;
        if (pe.n)
            goto bad;
        rc = 0;
        goto out;
    }

    /* ipc form */
    const cJSON *model = ipcv[0], *ws = ipcv[1], *worker = ipcv[2], *salt = ipcv[3],
                *hashes = ipcv[4], *groups = ipcv[5], *win = ipcv[6];
    kvidx_reason_t why;
    kr->is_ipc = 1;
    if (!cJSON_IsString(model) ||
        kvidx_key_check_model(model->valuestring, strlen(model->valuestring), &why) != 0) {
        key_errors++;
        param_errors_add(&pe, "must be a valid model name (1..255 bytes UTF-8, no '@')",
                         "model_name");
    }
    uint64_t world = 0, wid = 0;
    if (json_uint(ws, 1, 255, &world) != 0)
        param_errors_add(&pe, "required, an integer 1..255", "world_size");
    kr->ipc.world_size = (uint32_t)world;
    kr->ipc.worker_id = -1;
    if (worker && !cJSON_IsNull(worker)) {
        if (json_uint(worker, 0, 254, &wid) != 0 || (world && wid >= world))
            param_errors_add(&pe, "must be null or an integer 0..world_size-1", "worker_id");
        kr->ipc.worker_id = (int32_t)wid;
    }
    if (salt && (!cJSON_IsString(salt) ||
                 kvidx_key_check_salt(salt->valuestring, strlen(salt->valuestring), &why))) {
        key_errors++;
        param_errors_add(&pe, "must be a string of at most 128 bytes without '@', '/', '\\'",
                         "cache_salt");
    }
    if (!cJSON_IsArray(hashes))
        param_errors_add(&pe, "required, an array of hex chunk hashes", "chunk_hashes");
    if (groups && (!cJSON_IsArray(groups) || cJSON_GetArraySize(groups) < 1))
        param_errors_add(&pe, "must be a non-empty array of group ids", "object_group_ids");
    if (pe.n)
        goto bad;
    size_t C = strs ? ks.nstrs : (size_t)cJSON_GetArraySize(hashes);
    size_t G = groups ? (size_t)cJSON_GetArraySize(groups) : 1;
    kr->ipc.num_chunks = (uint32_t)C;
    kr->ipc.num_groups = (uint32_t)G;
    size_t R = kvidx_ipc_num_ranks(&kr->ipc);
    if (win && (!cJSON_IsArray(win) || (size_t)cJSON_GetArraySize(win) != G)) {
        param_errors_add(&pe, "must be an array with one window per object group", "attn_window");
        goto bad;
    }
    if ((double)G * (double)C * (double)R > (double)max) {
        res_problemf(res, KVIDX_ETOOMANYKEYS,
                     "%zu groups x %zu chunks x %zu ranks, more than max_keys_per_request (%" PRIu64
                     ")",
                     G, C, R, max);
        goto out;
    }
    size_t n = G * C * R;
    kr->windows = malloc(G * sizeof(*kr->windows));
    kr->keys = malloc((n ? n : 1) * sizeof(*kr->keys));
    uint16_t *gids = malloc(G * sizeof(*gids));
    if (!kr->windows || !kr->keys || !gids) {
        free(gids);
        res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        goto out;
    }
    size_t i = 0;
    for (const cJSON *w = win ? win->child : NULL; i < G; i++, w = w ? w->next : NULL) {
        kr->windows[i] = KVIDX_WINDOW_FULL;
        if (!w)
            continue;
        double v = cJSON_IsNumber(w) ? w->valuedouble : 0;
        uint64_t pos = 0;
        if (cJSON_IsNumber(w) && v == -1.0)
            continue;
        if (json_uint(w, 1, 4294967295.0, &pos) != 0)
            param_errors_add(&pe, "must be -1 (full attention) or a window >= 1",
                             "attn_window[%zu]", i);
        else
            kr->windows[i] = (int64_t)pos;
    }
    i = 0;
    for (const cJSON *g = groups ? groups->child : NULL; i < G; i++, g = g ? g->next : NULL) {
        uint64_t v = 0;
        if (g && json_uint(g, 0, KVIDX_GROUP_MAX, &v) != 0)
            param_errors_add(&pe, "must be an integer 0..65535", "object_group_ids[%zu]", i);
        gids[i] = (uint16_t)v;
    }
    /* The first key of every chunk carries the hash; the rest copy it. */
    kvidx_key_t proto;
    memset(&proto, 0, sizeof(proto));
    if (cJSON_IsString(model)) {
        proto.model = model->valuestring;
        proto.model_len = (uint16_t)strlen(model->valuestring);
    }
    proto.salt = salt ? salt->valuestring : "";
    proto.salt_len = (uint8_t)(salt ? strlen(salt->valuestring) : 0);
    const cJSON *h = hashes->child;
    for (i = 0; i < C; i++) {
        kvidx_key_t *k = n ? &kr->keys[i * R] : &proto;
        *k = proto;
        /* From the scanned bytes, or from cJSON's string: the same bytes. */
        const char *hex = strs ? strs[i].s : cJSON_IsString(h) ? h->valuestring : NULL;
        size_t hex_len = strs ? strs[i].n : hex ? strlen(hex) : 0;
        if (!strs)
            h = h->next;
        if (!hex || kvidx_key_hash_from_hex(hex, hex_len, k->hash, &k->hash_len, &why) != 0) {
            key_errors++;
            param_errors_add(&pe, "must be 2..128 hex digits, an even count", "chunk_hashes[%zu]",
                             i);
        }
    }
    if (pe.n) {
        free(gids);
        goto bad;
    }
    /* Expand group-major, then chunk, then rank (kvidx_ipc_split order).
     * Chunk hashes sit at [c*R] for now; groups > 0 are written first, as
     * copies of the group-0 slots, before group 0's ranks overwrite. */
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
    free(gids);
    kr->n = n;
    kr->shape.windows = kr->windows;
    kr->shape.num_groups = G;
    kr->shape.num_chunks = C;
    kr->shape.num_ranks = R;
    rc = 0;
    goto out;
bad:
    /* SPEC §1.1: a key that breaks the key rules is invalid_key, whatever
     * else is wrong with the request. */
    param_errors_respond(&pe, res, key_errors ? KVIDX_EKEY : KVIDX_EINVAL,
                         "the request is not valid");
out:
    param_errors_free(&pe);
    free(strs);
    if (rc)
        kreq_free(kr);
    return rc;
}

/* lease_ms: a positive integer; SPEC §3.4 bounds it by max_lease_ms, so a
 * longer lease is cut to the maximum (the answer's expires_at_ms shows it),
 * the way page_size is cut to 5000. */
static int lease_parse(const cJSON *v, uint64_t max_ms, uint64_t *out)
{
    uint64_t ms = 0;
    if (json_uint(v, 1, 9007199254740992.0, &ms) != 0)
        return KVIDX_EINVAL;
    *out = ms < max_ms ? ms : max_ms;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* POST /v1/lookup */

static void jw_index_list(struct jw *w, const char *name, const uint8_t *flags, size_t n,
                          uint8_t bit)
{
    jw_key(w, name);
    jw_indices(w, flags, n, bit);
}

static void jw_u32_list(struct jw *w, const char *name, const uint32_t *v, size_t n)
{
    jw_key(w, name);
    jw_u32s(w, v, n);
}

enum { LK_L1 = 1, LK_L2 = 2, LK_FOUND = 4 };

static int api_lookup(const struct request *req, struct response *res)
{
    struct kreq kr;
    if (kreq_parse(req, res, BODY_LOOKUP, &kr) != 0)
        return 0;
    int l1_only = 0;
    if (kr.tier) {
        if (cJSON_IsString(kr.tier) && strcmp(kr.tier->valuestring, "l1") == 0) {
            l1_only = 1;
        } else if (!cJSON_IsString(kr.tier) || strcmp(kr.tier->valuestring, "any") != 0) {
            kreq_free(&kr);
            struct invalid_param p = {"tier", "must be \"l1\" or \"any\""};
            return res_problem(res, KVIDX_EINVAL, "the request is not valid", &p, 1);
        }
    }
    const kvidx_index_t *idx = req->app->keystore->idx;
    uint8_t *flags = calloc(kr.n ? kr.n : 1, 1);
    uint8_t *found = calloc(kr.n ? kr.n : 1, 1);
    kvidx_ref_t *refs = malloc((kr.n ? kr.n : 1) * sizeof(*refs));
    kvidx_entry_info_t *infos = malloc((kr.n ? kr.n : 1) * sizeof(*infos));
    if (!flags || !found || !refs || !infos) {
        free(flags);
        free(found);
        free(refs);
        free(infos);
        kreq_free(&kr);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    kvidx_index_find_batch(idx, kr.keys, kr.n, refs, infos);
    uint64_t bytes = 0;
    for (size_t i = 0; i < kr.n; i++) {
        if (refs[i] == KVIDX_REF_NONE)
            continue;
        const kvidx_entry_info_t info = infos[i];
        /* A loading copy is not readable: it is no L1 hit. */
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
    free(refs);
    free(infos);
    size_t hit_chunks = 0;
    if (kr.is_ipc && kvidx_fold(&kr.shape, found, &hit_chunks) != 0) {
        free(flags);
        free(found);
        kreq_free(&kr);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "total_keys");
    jw_u64(&w, kr.n);
    jw_index_list(&w, "l1_indices", flags, kr.n, LK_L1);
    jw_index_list(&w, "l2_indices", flags, kr.n, LK_L2);
    jw_index_list(&w, "found_indices", flags, kr.n, LK_FOUND);
    jw_key(&w, "hit_keys");
    size_t hit_keys = kvidx_prefetch_leading_run(found, kr.n);
    jw_u64(&w, hit_keys);
    metrics_observe_lookup(req->app->metrics, hit_keys);
    jw_key(&w, "found_bytes");
    jw_u64(&w, bytes);
    jw_key(&w, "hit_chunks");
    if (kr.is_ipc)
        jw_u64(&w, hit_chunks);
    else
        jw_null(&w);
    jw_obj_end(&w);
    free(flags);
    free(found);
    kreq_free(&kr);
    metrics_add(req->app->metrics, "kvidx_lookups_total", 1);
    if (res->body.failed)
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    res_json(res, 200);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Loads */

static struct load *load_find(struct prefetches *pf, kvidx_ref_t ref, uint64_t gen)
{
    for (struct imap_node *e = imap_first(&pf->loads, ref); e; e = e->next) {
        struct load *l = (struct load *)e;
        if (e->key == ref && l->gen == gen)
            return l;
    }
    return NULL;
}

static int load_add_waiter(struct load *l, struct handle *h, uint32_t idx)
{
    if (l->nw == l->capw) {
        size_t cap = l->capw ? l->capw * 2 : 2;
        struct waiter *w = realloc(l->w, cap * sizeof(*w));
        if (!w)
            return KVIDX_ENOMEM;
        l->w = w;
        l->capw = cap;
    }
    l->w[l->nw].h = h;
    l->w[l->nw].idx = idx;
    l->nw++;
    h->wait[idx] = l;
    return 0;
}

/* The handle stops waiting for its loads (they go on for the others). */
static void handle_detach_loads(struct handle *h)
{
    for (size_t i = 0; i < h->pfh.n; i++) {
        struct load *l = h->wait[i];
        if (!l)
            continue;
        for (size_t j = 0; j < l->nw; j++) {
            if (l->w[j].h == h && l->w[j].idx == i) {
                l->w[j] = l->w[--l->nw];
                break;
            }
        }
        h->wait[i] = NULL;
    }
}

static void handle_complete(struct handle *h);
static void task_finish_one(struct task *t, struct load *l);
static void wake_polls(struct handle *h);
static void wake_list(struct poll *p);
static void poll_done(struct poll *p);

/* Ends one load: ok says whether the data plane (or the catalogue) has the
 * bytes in L1 now. Every waiter pins before the copy turns ready
 * (kvidx_pfh_load_result), so nothing can evict it in between; a copy
 * nobody waits for any more is dropped. */
static void load_finish(struct prefetches *pf, struct load *l, int ok)
{
    kvidx_index_t *idx = pf_idx(pf);
    kvidx_entry_info_t info;
    int mine = kvidx_index_info(idx, l->ref, &info) == 0 && info.l1_state == KVIDX_L1_LOADING &&
               info.generation == l->gen;
    if (!mine)
        ok = 0; /* force-deleted while loading */
    int warm = 0;
    for (size_t j = 0; j < l->nw; j++)
        warm |= l->w[j].h->pfh.mode == KVIDX_PF_WARM;
    if (ok && warm)
        kvidx_index_set_temporary(idx, l->ref, 0); /* WARM copies stay */
    struct handle **done = malloc((l->nw ? l->nw : 1) * sizeof(*done));
    size_t nd = 0, nw = l->nw;
    for (size_t j = 0; j < l->nw; j++) {
        struct handle *h = l->w[j].h;
        h->wait[l->w[j].idx] = NULL;
        if (kvidx_pfh_load_result(&h->pfh, idx, l->w[j].idx, l->gen, ok)) {
            if (done)
                done[nd++] = h;
            else
                handle_complete(h); /* out of memory: complete before load_done */
        }
    }
    if (mine)
        kvidx_index_l1_load_done(idx, l->ref, l->gen, ok && nw > 0);
    count(pf, ok ? "kvidx_loads_completed_total" : "kvidx_load_failures_total", 1);
    if (l->task)
        task_finish_one(l->task, l);
    imap_del(&pf->loads, &l->node);
    free(l->w);
    free(l);
    for (size_t j = 0; j < nd; j++)
        if (done[j]->pfh.status == KVIDX_PFH_PENDING && done[j]->pfh.waiting == 0)
            handle_complete(done[j]);
    free(done);
}

static void catalog_run(uv_timer_t *t)
{
    struct prefetches *pf = t->data;
    /* Loads queued while this runs wait for the next turn. */
    struct load **q = pf->catalog_q;
    size_t n = pf->catalog_n;
    pf->catalog_q = NULL;
    pf->catalog_n = pf->catalog_cap = 0;
    for (size_t i = 0; i < n; i++) {
        kvidx_entry_info_t info;
        /* The L2 catalogue is authoritative: the load succeeds when the
         * key still has its L2 copy. */
        int ok = kvidx_index_info(pf_idx(pf), q[i]->ref, &info) == 0 && info.l2;
        load_finish(pf, q[i], ok);
    }
    free(q);
}

static int catalog_enqueue(struct prefetches *pf, struct load *l)
{
    if (pf->catalog_n == pf->catalog_cap) {
        size_t cap = pf->catalog_cap ? pf->catalog_cap * 2 : 16;
        struct load **q = realloc(pf->catalog_q, cap * sizeof(*q));
        if (!q)
            return KVIDX_ENOMEM;
        pf->catalog_q = q;
        pf->catalog_cap = cap;
    }
    pf->catalog_q[pf->catalog_n++] = l;
    if (pf->catalog_n == 1)
        uv_timer_start(&pf->catalog_timer, catalog_run, 0, 0);
    return 0;
}

/* ---- external loader tasks ---- */

static void task_closed(uv_handle_t *hd)
{
    struct task *t = hd->data;
    free(t->loads);
    free(t);
}

static void task_remove(struct task *t)
{
    struct prefetches *pf = t->pf;
    if (t->closing)
        return;
    t->closing = 1;
    imap_del(&pf->tasks, &t->node);
    if (t->prev)
        t->prev->next = t->next;
    else
        pf->task_head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        pf->task_tail = t->prev;
    uv_timer_stop(&t->timer);
    uv_close((uv_handle_t *)&t->timer, task_closed);
}

static void task_finish_one(struct task *t, struct load *l)
{
    t->loads[l->task_pos] = NULL;
    l->task = NULL;
    if (--t->open == 0)
        task_remove(t);
}

static void task_timeout(uv_timer_t *tm)
{
    struct task *t = tm->data;
    for (size_t i = 0; i < t->n && !t->closing; i++)
        if (t->loads[i])
            load_finish(t->pf, t->loads[i], 0);
}

static void answer_loads(struct prefetches *pf, struct response *res);
static void poll_done(struct poll *p);

static struct task *task_new(struct prefetches *pf, size_t n)
{
    struct task *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->loads = calloc(n ? n : 1, sizeof(*t->loads));
    if (!t->loads) {
        free(t);
        return NULL;
    }
    t->pf = pf;
    t->id = ++pf->next_task;
    t->node.key = t->id;
    if (imap_put(&pf->tasks, &t->node) != 0) {
        free(t->loads);
        free(t);
        return NULL;
    }
    t->created_wall = app_wall_ms();
    uv_timer_init(pf->app->loop, &t->timer);
    t->timer.data = t;
    t->prev = pf->task_tail;
    if (pf->task_tail)
        pf->task_tail->next = t;
    else
        pf->task_head = t;
    pf->task_tail = t;
    return t;
}

/* Starts (or joins) the load of planned L2 key i of h. A key that cannot
 * be loaded is marked failed by the ledger; nothing here completes h. */
static void start_or_join(struct handle *h, size_t i, struct task **task, size_t tcap)
{
    struct prefetches *pf = h->pf;
    kvidx_index_t *idx = pf_idx(pf);
    int temporary =
        h->pfh.mode == KVIDX_PF_LOOKUP && pf->app->cfg.prefetch_retention == RETENTION_TEMPORARY;
    uint64_t gen = 0;
    kvidx_ref_t ref = h->pfh.keys[i].ref;
    switch (kvidx_pfh_start_load(&h->pfh, idx, i, temporary, &gen)) {
    case KVIDX_PFH_LOAD_READY:
        return;
    case KVIDX_PFH_LOAD_FAILED:
        count(pf, "kvidx_load_failures_total", 1); /* no room even after eviction */
        return;
    case KVIDX_PFH_LOAD_JOIN: {
        /* In flight already (maybe started by this very request for a key
         * given twice): single-flight, wait for that load. */
        struct load *l = load_find(pf, ref, gen);
        if (!l || load_add_waiter(l, h, (uint32_t)i) != 0)
            kvidx_pfh_load_result(&h->pfh, idx, i, gen, 0);
        return;
    }
    case KVIDX_PFH_LOAD_NEW:
        break;
    }
    int ext = pf->app->cfg.loader == LOADER_EXTERNAL;
    struct load *l = calloc(1, sizeof(*l));
    if (l) {
        l->ref = ref;
        l->gen = gen;
        l->node.key = ref;
    }
    if (ext && l && !*task)
        *task = task_new(pf, tcap);
    int rc = (!l || (ext && !*task)) ? KVIDX_ENOMEM : imap_put(&pf->loads, &l->node);
    if (rc == 0) {
        rc = load_add_waiter(l, h, (uint32_t)i);
        if (rc == 0 && !ext)
            rc = catalog_enqueue(pf, l);
        if (rc != 0) {
            imap_del(&pf->loads, &l->node);
            h->wait[i] = NULL;
        }
    }
    if (rc != 0) {
        /* Out of memory: this key's load failed before it started. */
        if (l)
            free(l->w);
        free(l);
        kvidx_pfh_load_result(&h->pfh, idx, i, gen, 0);
        kvidx_index_l1_load_done(idx, ref, gen, 0);
        count(pf, "kvidx_load_failures_total", 1);
        return;
    }
    if (ext) {
        l->task = *task;
        l->task_pos = (uint32_t)(*task)->n;
        (*task)->loads[(*task)->n++] = l;
        (*task)->open++;
    }
    count(pf, "kvidx_loads_total", 1);
}

/* ---------------------------------------------------------------------- */
/* Handles */

static void handle_closed(uv_handle_t *hd)
{
    struct handle *h = hd->data;
    kvidx_pfh_close(&h->pfh, NULL); /* every pin went back in handle_end */
    free(h->wait);
    free(h->windows);
    free(h->ext_id);
    free(h);
}

static void handle_remove(struct handle *h)
{
    if (h->closing)
        return;
    /* Called from a timer or at shutdown only: answering here is safe. */
    while (h->polls)
        poll_done(h->polls);
    h->closing = 1;
    handle_detach_loads(h);
    imap_del(&h->pf->handles, &h->node);
    uv_timer_stop(&h->timer);
    uv_close((uv_handle_t *)&h->timer, handle_closed);
}

static void handle_timer(uv_timer_t *t);

static void handle_arm(struct handle *h, uint64_t at)
{
    uint64_t now = uv_now(h->pf->app->loop);
    uv_timer_start(&h->timer, handle_timer, at > now ? at - now : 0, 0);
}

/* Once released or expired: the grace period starts, long polls answer. */
static void handle_after_end(struct handle *h)
{
    h->gone_mono = uv_now(h->pf->app->loop) + h->pf->app->cfg.handle_grace_ms;
    handle_arm(h, h->gone_mono);
    wake_polls(h);
}

/* Leaves pending or completed for released or expired: gives back every
 * pin and stops waiting for loads. */
static void handle_end(struct handle *h, kvidx_pfh_status_t st)
{
    handle_detach_loads(h);
    kvidx_pfh_end(&h->pfh, pf_idx(h->pf), st);
    handle_after_end(h);
}

static int handle_live(const struct handle *h)
{
    return h->pfh.status == KVIDX_PFH_PENDING || h->pfh.status == KVIDX_PFH_COMPLETED;
}

static void handle_timer(uv_timer_t *t)
{
    struct handle *h = t->data;
    if (handle_live(h)) {
        count(h->pf, "kvidx_expirations_total", 1);
        handle_end(h, KVIDX_PFH_EXPIRED);
    } else {
        handle_remove(h);
    }
}

/* Pending → completed (trim, give back what is not retained). */
static void handle_complete(struct handle *h)
{
    kvidx_pfh_complete(&h->pfh, pf_idx(h->pf));
    wake_polls(h);
}

/* ---- answers ---- */

static void jw_handle(struct jw *w, struct handle *h)
{
    struct prefetches *pf = h->pf;
    kvidx_pfh_t *p = &h->pfh;
    jw_obj_begin(w);
    jw_key(w, "id");
    jw_u64(w, h->id);
    jw_key(w, "prefetch_request_id");
    jw_i64(w, p->plan.n_l2_orig ? (int64_t)h->id : -1);
    jw_key(w, "external_request_id");
    if (h->ext_id)
        jw_str(w, h->ext_id);
    else
        jw_null(w);
    jw_u32_list(w, "l1_found_indices", p->plan.l1_found, p->plan.n_l1_found);
    jw_key(w, "total_requested_keys");
    jw_u64(w, p->n);
    jw_key(w, "submit_time");
    char num[48];
    int len = snprintf(num, sizeof(num), "%.3f", h->submit_time);
    jw_raw(w, num, (size_t)len);
    jw_u32_list(w, "l2_orig_indices", p->plan.l2_orig, p->plan.n_l2_orig);
    jw_key(w, "status");
    jw_str(w, status_names[p->status]);
    jw_key(w, "mode");
    jw_str(w, mode_names[p->mode]);
    jw_key(w, "trim_policy");
    jw_str(w, policy_names[p->policy]);
    jw_key(w, "extra_count");
    jw_u64(w, p->extra);
    if (p->status != KVIDX_PFH_PENDING && p->has_result) {
        kvidx_pfh_refresh(p, pf_idx(pf));
        jw_u32_list(w, "found_indices", p->result.found, p->result.n_found);
        jw_u32_list(w, "retained_indices", p->result.retained, p->result.n_retained);
        jw_key(w, "hit_keys");
        jw_u64(w, p->result.hit_keys);
        jw_key(w, "hit_chunks");
        if (h->is_ipc)
            jw_u64(w, p->result.hit_chunks);
        else
            jw_null(w);
        size_t pinned = 0;
        for (size_t i = 0; i < p->n; i++)
            pinned += p->keys[i].pins > 0;
        jw_key(w, "pinned_keys");
        jw_u64(w, pinned);
        jw_key(w, "lost_indices");
        jw_arr_begin(w);
        for (size_t i = 0; i < p->n; i++)
            if (p->keys[i].lost)
                jw_u64(w, i);
        jw_arr_end(w);
    }
    jw_key(w, "expires_at_ms");
    uint64_t now = uv_now(pf->app->loop);
    uint64_t end = handle_live(h) ? h->expires_mono : h->gone_mono;
    jw_u64(w, app_wall_ms() + (end > now ? end - now : 0));
    jw_obj_end(w);
}

/* The answer of GET for h's current state, status code included. */
static void answer_handle(struct handle *h, struct response *res, int status)
{
    buf_reset(&res->body);
    if (h->pfh.status == KVIDX_PFH_EXPIRED) {
        res_problemf(res, KVIDX_EHANDLEEXPIRED, "prefetch handle %" PRIu64 " expired", h->id);
        return;
    }
    struct jw w;
    jw_init(&w, &res->body);
    jw_handle(&w, h);
    if (res->body.failed) {
        buf_reset(&res->body);
        res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        return;
    }
    res_json(res, status);
}

/* ---- long polls ---- */

static void poll_closed(uv_handle_t *hd)
{
    free(hd->data);
}

static void poll_unlink(struct poll *p)
{
    struct poll **pp = p->h ? &p->h->polls : &p->pf->load_polls;
    for (; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    p->closing = 1;
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, poll_closed);
}

/* Answers a poll with the current state and hands it back to the server. */
static void poll_done(struct poll *p)
{
    if (p->closing)
        return;
    struct response *res = p->res;
    poll_unlink(p);
    if (p->h)
        answer_handle(p->h, res, 200);
    else
        answer_loads(p->pf, res);
    res_complete(res);
}

static void poll_timeout(uv_timer_t *t)
{
    poll_done(t->data);
}

static void poll_cancel(void *waiter)
{
    struct poll *p = waiter;
    if (!p->closing)
        poll_unlink(p);
}

/* Answers every poll of list on the next loop turn: completing an answer
 * may run another connection's pipelined requests at once, which must not
 * happen in the middle of a load or a handle transition. */
static void wake_list(struct poll *p)
{
    for (; p; p = p->next)
        uv_timer_start(&p->timer, poll_timeout, 0, 0);
}

static void wake_polls(struct handle *h)
{
    wake_list(h->polls);
}

static int poll_start(struct prefetches *pf, struct handle *h, struct response *res,
                      uint64_t wait_ms)
{
    struct poll *p = calloc(1, sizeof(*p));
    if (!p)
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    p->pf = pf;
    p->h = h;
    p->res = res;
    uv_timer_init(pf->app->loop, &p->timer);
    p->timer.data = p;
    struct poll **head = h ? &h->polls : &pf->load_polls;
    p->next = *head;
    *head = p;
    uv_timer_start(&p->timer, poll_timeout, wait_ms, 0);
    res_defer(res, p, poll_cancel);
    return HANDLER_ASYNC;
}

/* Reads the query of a long poll (only wait_ms, at most once): 0 with
 * *given and *ms, or KVIDX_EINVAL after answering 400 naming the
 * parameter. */
static int parse_wait(const struct request *req, struct response *res, int *given, uint64_t *ms)
{
    kvidx_reason_t why;
    if (kvidx_pft_parse_wait(req->query, req->query_len, given, ms, &why) == 0)
        return 0;
    struct invalid_param p = {why.field, why.rule};
    res_problem(res, KVIDX_EINVAL, "bad query parameter", &p, 1);
    return KVIDX_EINVAL;
}

/* ---------------------------------------------------------------------- */
/* POST /v1/prefetches */

static int parse_enum(const cJSON *v, const char *const *names, size_t n, int *out)
{
    if (!v)
        return 0;
    if (!cJSON_IsString(v))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v->valuestring, names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    return -1;
}

static int api_prefetch_create(const struct request *req, struct response *res)
{
    struct app *app = req->app;
    struct prefetches *pf = app->prefetches;
    struct kreq kr;
    if (pf->stopped)
        return res_problem(res, KVIDX_ENOTREADY, "the daemon is shutting down", NULL, 0);
    if (kreq_parse(req, res, BODY_PREFETCH, &kr) != 0)
        return 0;
    struct param_errors pe;
    param_errors_init(&pe);
    int mode = KVIDX_PF_LOOKUP, policy = -1;
    uint64_t extra = 0, lease = app->cfg.default_lease_ms;
    if (parse_enum(kr.mode, mode_names, 2, &mode) != 0)
        param_errors_add(&pe, "must be \"LOOKUP\" or \"WARM\"", "mode");
    if (parse_enum(kr.trim, policy_names, 3, &policy) != 0)
        param_errors_add(&pe, "must be \"PREFIX\", \"SEGMENTED_PREFIX\" or \"SPARSE\"",
                         "trim_policy");
    if (kr.extra && json_uint(kr.extra, 0, EXTRA_COUNT_MAX, &extra) != 0)
        param_errors_add(&pe, "must be an integer 0..127", "extra_count");
    if (kr.ext_id && !cJSON_IsNull(kr.ext_id) &&
        (!cJSON_IsString(kr.ext_id) || strlen(kr.ext_id->valuestring) > EXT_ID_MAX))
        param_errors_add(&pe, "must be a string of at most 256 bytes", "external_request_id");
    if (kr.lease && lease_parse(kr.lease, app->cfg.max_lease_ms, &lease) != 0)
        param_errors_add(&pe, "must be a positive integer (capped at max_lease_ms)", "lease_ms");
    if (pe.n) {
        param_errors_respond(&pe, res, KVIDX_EINVAL, "the request is not valid");
        param_errors_free(&pe);
        kreq_free(&kr);
        return 0;
    }
    param_errors_free(&pe);
    if (policy < 0)
        policy = mode == KVIDX_PF_WARM ? KVIDX_TRIM_SPARSE : KVIDX_TRIM_PREFIX;
    if (mode == KVIDX_PF_WARM)
        extra = 0; /* SPEC §4.2: ignored */

    struct handle *h = calloc(1, sizeof(*h));
    if (h)
        h->wait = calloc(kr.n ? kr.n : 1, sizeof(*h->wait));
    if (h && kr.ext_id && cJSON_IsString(kr.ext_id))
        h->ext_id = strdup(kr.ext_id->valuestring);
    kvidx_index_t *idx = app->keystore->idx;
    /* Probe, plan, and (LOOKUP) pin the planned L1 hits at once. */
    int rc = (!h || !h->wait || (kr.ext_id && cJSON_IsString(kr.ext_id) && !h->ext_id))
                 ? KVIDX_ENOMEM
                 : kvidx_pfh_open(&h->pfh, idx, kr.keys, kr.n, (kvidx_prefetch_mode_t)mode,
                                  (kvidx_trim_policy_t)policy, (uint32_t)extra,
                                  kr.is_ipc ? &kr.shape : NULL);
    if (h) {
        h->is_ipc = kr.is_ipc;
        h->windows = kr.windows;
        kr.windows = NULL;
        h->id = pf->next_id + 1;
        h->node.key = h->id;
    }
    kreq_free(&kr);
    if (rc == 0 && imap_put(&pf->handles, &h->node) != 0) {
        kvidx_pfh_close(&h->pfh, idx);
        rc = KVIDX_ENOMEM;
    }
    if (rc != 0) {
        if (h) {
            free(h->wait);
            free(h->windows);
            free(h->ext_id);
        }
        free(h);
        return res_problem(res, rc == KVIDX_EINVAL ? KVIDX_EINTERNAL : KVIDX_ENOMEM,
                           "cannot plan the prefetch", NULL, 0);
    }
    h->pf = pf;
    pf->next_id++;
    uv_timer_init(app->loop, &h->timer);
    h->timer.data = h;
    h->submit_time = (double)app_wall_ms() / 1000.0;
    h->expires_mono = uv_now(app->loop) + lease;
    count(pf, "kvidx_prefetches_total", 1);

    const kvidx_prefetch_plan_t *plan = &h->pfh.plan;
    /* WARM's hits hold a pin of their own while its reservations evict,
     * so that what it reports resident stays resident (a temporary
     * unpinned copy is left alone: its last unpin would drop it). */
    uint8_t *guard = NULL;
    /* WARM promotes: a hit that is a temporary copy (loaded for some
     * LOOKUP reader) becomes permanent, or the reader's last unpin would
     * drop what WARM reported resident. */
    for (size_t j = 0; h->pfh.mode == KVIDX_PF_WARM && j < plan->n_l1_hits; j++)
        kvidx_index_set_temporary(idx, h->pfh.keys[plan->l1_hits[j]].ref, 0);
    if (h->pfh.mode == KVIDX_PF_WARM && plan->n_l1_hits && plan->n_l2_orig)
        guard = calloc(plan->n_l1_hits, 1);
    for (size_t j = 0; guard && j < plan->n_l1_hits; j++) {
        const kvidx_pfh_key_t *k = &h->pfh.keys[plan->l1_hits[j]];
        kvidx_entry_info_t info;
        if (kvidx_index_info(idx, k->ref, &info) == 0 && !(info.temporary && info.pins == 0))
            guard[j] = kvidx_index_pin(idx, k->ref, k->gen, 1) == 0;
    }
    /* Then reserve and load (or join) the planned L2 keys. No load can
     * finish before this returns, so h cannot complete in between. */
    struct task *task = NULL;
    for (size_t j = 0; j < plan->n_l2_orig; j++)
        start_or_join(h, plan->l2_orig[j], &task, plan->n_l2_orig);
    for (size_t j = 0; guard && j < plan->n_l1_hits; j++) {
        const kvidx_pfh_key_t *k = &h->pfh.keys[plan->l1_hits[j]];
        if (guard[j])
            kvidx_index_unpin(idx, k->ref, k->gen, 1);
    }
    free(guard);
    if (task && task->open == 0)
        task_remove(task);
    else if (task)
        uv_timer_start(&task->timer, task_timeout, app->cfg.load_timeout_ms, 0);
    if (task)
        wake_list(pf->load_polls);
    handle_arm(h, h->expires_mono);
    if (h->pfh.status == KVIDX_PFH_PENDING && h->pfh.waiting == 0)
        handle_complete(h);
    answer_handle(h, res, 201);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* /v1/prefetches/{id}[/release|/extend] */

/* Reads the id at the start of the route parameter (canonical decimal,
 * kvidx_pft_parse_id); *suffix gets the rest ("" or "/release"...). 0, or
 * KVIDX_EINVAL when it is no id. */
static int parse_id(const struct request *req, uint64_t *id, const char **suffix)
{
    size_t used = 0;
    if (!req->route_param ||
        kvidx_pft_parse_id(req->route_param, req->route_param_len, id, &used) != 0)
        return KVIDX_EINVAL;
    if (used < req->route_param_len && req->route_param[used] != '/')
        return KVIDX_EINVAL;
    *suffix = req->route_param + used;
    return 0;
}

/* The handle of the request, or NULL after answering 404/410. With
 * any_state, expired handles are returned too. */
static struct handle *lookup_handle(const struct request *req, struct response *res,
                                    const char *want_suffix, int any_state)
{
    struct prefetches *pf = req->app->prefetches;
    uint64_t id;
    const char *suffix;
    if (parse_id(req, &id, &suffix) != 0 || strcmp(suffix, want_suffix) != 0) {
        res_problem(res, KVIDX_ENOTFOUND, "no such prefetch handle", NULL, 0);
        return NULL;
    }
    struct handle *h = (struct handle *)imap_first(&pf->handles, id);
    if (!h || h->closing) {
        res_problemf(res, KVIDX_ENOTFOUND, "no prefetch handle %" PRIu64, id);
        return NULL;
    }
    if (h->pfh.status == KVIDX_PFH_EXPIRED && !any_state) {
        res_problemf(res, KVIDX_EHANDLEEXPIRED, "prefetch handle %" PRIu64 " expired", id);
        return NULL;
    }
    return h;
}

static int api_prefetch_get(const struct request *req, struct response *res)
{
    uint64_t wait = 0;
    int w = 0;
    if (parse_wait(req, res, &w, &wait) != 0)
        return 0;
    struct handle *h = lookup_handle(req, res, "", 0);
    if (!h)
        return 0;
    if (h->pfh.status == KVIDX_PFH_PENDING && w && wait > 0 && !h->pf->stopped)
        return poll_start(h->pf, h, res, wait);
    answer_handle(h, res, 200);
    return 0;
}

static int api_prefetch_delete(const struct request *req, struct response *res)
{
    struct prefetches *pf = req->app->prefetches;
    uint64_t id;
    const char *suffix;
    if (parse_id(req, &id, &suffix) != 0 || suffix[0] || id == 0 || id > pf->next_id)
        return res_problem(res, KVIDX_ENOTFOUND, "no such prefetch handle", NULL, 0);
    struct handle *h = (struct handle *)imap_first(&pf->handles, id);
    /* Idempotent: a released, expired or forgotten handle holds no pin. */
    if (h && !h->closing && handle_live(h))
        handle_end(h, KVIDX_PFH_RELEASED);
    res->status = 204;
    return 0;
}

static int api_prefetch_release(const struct request *req, struct response *res)
{
    struct handle *h = lookup_handle(req, res, "/release", 0);
    if (!h)
        return 0;
    cJSON *body = NULL;
    const cJSON *ind = NULL;
    if (req->body_len > 0) {
        if (json_parse_body(req, res, &body) != 0)
            return 0;
        int bad = !cJSON_IsObject(body);
        for (const cJSON *m = bad ? NULL : body->child; m; m = m->next) {
            if (strcmp(m->string ? m->string : "", "indices") == 0 && !ind)
                ind = m;
            else
                bad = 1;
        }
        if (bad || (ind && !cJSON_IsArray(ind) && !cJSON_IsNull(ind))) {
            cJSON_Delete(body);
            struct invalid_param p = {"indices", "the body is {\"indices\": [index, ...]}"};
            return res_problem(res, KVIDX_EINVAL, "the request is not valid", &p, 1);
        }
        if (cJSON_IsNull(ind))
            ind = NULL;
    }
    kvidx_pfh_t *p = &h->pfh;
    kvidx_index_t *idx = pf_idx(h->pf);
    if (p->status == KVIDX_PFH_RELEASED) {
        cJSON_Delete(body);
        return res_problem(res, KVIDX_ECONFLICT, "the handle holds no pins any more", NULL, 0);
    }
    if (p->status == KVIDX_PFH_PENDING) {
        cJSON_Delete(body);
        return res_problem(res, KVIDX_ECONFLICT, "the handle is pending; DELETE it to cancel", NULL,
                           0);
    }
    kvidx_pfh_refresh(p, idx);
    uint32_t *list = NULL;
    size_t n = 0;
    int rc = 0;
    if (ind) {
        /* Validate everything first, listing every bad item; the ledger
         * then releases all or nothing. */
        struct param_errors pe;
        param_errors_init(&pe);
        size_t cnt = (size_t)cJSON_GetArraySize(ind);
        list = malloc((cnt ? cnt : 1) * sizeof(*list));
        uint32_t *want = calloc(p->n ? p->n : 1, sizeof(*want));
        if (!list || !want) {
            free(list);
            free(want);
            cJSON_Delete(body);
            param_errors_free(&pe);
            return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        }
        int out_of_range = 0;
        for (const cJSON *x = ind->child; x; x = x->next, n++) {
            uint64_t v;
            if (json_uint(x, 0, (double)UINT32_MAX, &v) != 0 || v >= p->n) {
                param_errors_add(&pe, "must be an index of the request", "indices[%zu]", n);
                out_of_range = 1;
                continue;
            }
            list[n] = (uint32_t)v;
            if (!p->has_result || !p->result.retained_map[v] || ++want[v] > p->keys[v].pins) {
                param_errors_add(&pe, "that key holds no (more) pins of this handle",
                                 "indices[%zu]", n);
            }
        }
        free(want);
        if (pe.n) {
            /* Out-of-range items make it a 400; only conflicts, a 409. */
            param_errors_respond(&pe, res, out_of_range ? KVIDX_EINVAL : KVIDX_ECONFLICT,
                                 "nothing was released");
            param_errors_free(&pe);
            free(list);
            cJSON_Delete(body);
            return 0;
        }
        param_errors_free(&pe);
    }
    cJSON_Delete(body);
    rc = kvidx_pfh_release(p, idx, ind ? list : NULL, n, NULL);
    free(list);
    if (rc != 0)
        return res_problem(res, rc, "nothing was released", NULL, 0);
    if (p->status == KVIDX_PFH_RELEASED) {
        handle_detach_loads(h);
        handle_after_end(h);
    }
    answer_handle(h, res, 200);
    return 0;
}

static int api_prefetch_extend(const struct request *req, struct response *res)
{
    struct handle *h = lookup_handle(req, res, "/extend", 0);
    if (!h)
        return 0;
    cJSON *body = NULL;
    if (json_parse_body(req, res, &body) != 0)
        return 0;
    const cJSON *lease = NULL;
    int bad = !cJSON_IsObject(body);
    for (const cJSON *m = bad ? NULL : body->child; m; m = m->next) {
        if (strcmp(m->string ? m->string : "", "lease_ms") == 0 && !lease)
            lease = m;
        else
            bad = 1;
    }
    uint64_t ms = 0;
    if (bad || !lease || lease_parse(lease, req->app->cfg.max_lease_ms, &ms) != 0) {
        cJSON_Delete(body);
        struct invalid_param p = {"lease_ms",
                                  "required, a positive integer (capped at max_lease_ms)"};
        return res_problem(res, KVIDX_EINVAL, "the request is not valid", &p, 1);
    }
    cJSON_Delete(body);
    if (h->pfh.status == KVIDX_PFH_RELEASED)
        return res_problem(res, KVIDX_ECONFLICT, "the handle was released", NULL, 0);
    h->expires_mono = uv_now(req->app->loop) + ms;
    handle_arm(h, h->expires_mono);
    answer_handle(h, res, 200);
    return 0;
}

/* POST /v1/prefetches/{id}/release and /extend share one route. */
static int api_prefetch_post(const struct request *req, struct response *res)
{
    uint64_t id;
    const char *suffix;
    if (parse_id(req, &id, &suffix) == 0 && strcmp(suffix, "/release") == 0)
        return api_prefetch_release(req, res);
    if (parse_id(req, &id, &suffix) == 0 && strcmp(suffix, "/extend") == 0)
        return api_prefetch_extend(req, res);
    return res_problem(res, KVIDX_ENOTFOUND, "no such resource", NULL, 0);
}

/* ---------------------------------------------------------------------- */
/* /v1/loads (loader = external) */

static void answer_loads(struct prefetches *pf, struct response *res)
{
    kvidx_index_t *idx = pf_idx(pf);
    struct jw w;
    buf_reset(&res->body);
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "tasks");
    jw_arr_begin(&w);
    uint64_t now = uv_now(pf->app->loop);
    for (struct task *t = pf->task_head; t; t = t->next) {
        if (t->closing)
            continue;
        jw_obj_begin(&w);
        jw_key(&w, "task");
        jw_u64(&w, t->id);
        jw_key(&w, "created_at_ms");
        jw_u64(&w, t->created_wall);
        jw_key(&w, "deadline_ms");
        uint64_t due = uv_timer_get_due_in(&t->timer);
        (void)now;
        jw_u64(&w, app_wall_ms() + due);
        jw_key(&w, "keys");
        jw_arr_begin(&w);
        for (size_t i = 0; i < t->n; i++) {
            struct load *l = t->loads[i];
            kvidx_key_t k;
            kvidx_entry_info_t info;
            if (!l || kvidx_index_key(idx, l->ref, &k) != 0 ||
                kvidx_index_info(idx, l->ref, &info) != 0)
                continue;
            jw_obj_begin(&w);
            jw_key(&w, "index");
            jw_u64(&w, i);
            jw_key(&w, "key");
            jw_key_object(&w, &k);
            jw_key(&w, "size_bytes");
            jw_u64(&w, info.size_bytes);
            jw_obj_end(&w);
        }
        jw_arr_end(&w);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    if (res->body.failed) {
        buf_reset(&res->body);
        res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
        return;
    }
    res_json(res, 200);
}

static int api_loads_get(const struct request *req, struct response *res)
{
    struct prefetches *pf = req->app->prefetches;
    uint64_t wait = 0;
    int w = 0;
    if (parse_wait(req, res, &w, &wait) != 0)
        return 0;
    if (!pf->task_head && w && wait > 0 && !pf->stopped)
        return poll_start(pf, NULL, res, wait);
    answer_loads(pf, res);
    return 0;
}

/* Resolves one item of loaded/failed: a task index or a key object. */
static struct load *task_item(struct task *t, const cJSON *x, kvidx_index_t *idx)
{
    uint64_t v;
    if (cJSON_IsNumber(x)) {
        if (json_uint(x, 0, (double)UINT32_MAX, &v) != 0 || v >= t->n)
            return NULL;
        return t->loads[v];
    }
    kvidx_key_t k;
    kvidx_reason_t why;
    if (json_to_key(x, &k, &why) != 0)
        return NULL;
    for (size_t i = 0; i < t->n; i++) {
        kvidx_key_t lk;
        if (t->loads[i] && kvidx_index_key(idx, t->loads[i]->ref, &lk) == 0 &&
            kvidx_key_equal(&lk, &k))
            return t->loads[i];
    }
    return NULL;
}

static int api_loads_post(const struct request *req, struct response *res)
{
    struct prefetches *pf = req->app->prefetches;
    uint64_t id = 0;
    const char *suffix = "";
    struct task *t = parse_id(req, &id, &suffix) == 0 && !suffix[0]
                         ? (struct task *)imap_first(&pf->tasks, id)
                         : NULL;
    if (!t || t->closing)
        return res_problem(res, KVIDX_ENOTFOUND, "no such load task (finished or timed out?)", NULL,
                           0);
    cJSON *body = NULL;
    if (json_parse_body(req, res, &body) != 0)
        return 0;
    const cJSON *lists[2] = {NULL, NULL};
    static const char *const names[2] = {"loaded", "failed"};
    struct param_errors pe;
    param_errors_init(&pe);
    if (!cJSON_IsObject(body))
        param_errors_add(&pe, "must be a JSON object", "body");
    for (const cJSON *m = cJSON_IsObject(body) ? body->child : NULL; m; m = m->next) {
        const char *name = m->string ? m->string : "";
        int which = strcmp(name, "loaded") == 0 ? 0 : strcmp(name, "failed") == 0 ? 1 : -1;
        if (which < 0 || lists[which])
            param_errors_add(&pe, "unknown or repeated member", "body");
        else if (!cJSON_IsArray(m))
            param_errors_add(&pe, "must be an array of task indices or keys", "%s", names[which]);
        else
            lists[which] = m;
    }
    kvidx_index_t *idx = pf_idx(pf);
    size_t nl = 0;
    for (int which = 0; which < 2 && !pe.n; which++) {
        size_t j = 0;
        for (const cJSON *x = lists[which] ? lists[which]->child : NULL; x; x = x->next, j++) {
            if (!task_item(t, x, idx))
                param_errors_add(&pe, "not a pending key of this task", "%s[%zu]", names[which], j);
            nl++;
        }
    }
    if (pe.n) {
        param_errors_respond(&pe, res, KVIDX_EINVAL, "nothing was completed");
        param_errors_free(&pe);
        cJSON_Delete(body);
        return 0;
    }
    param_errors_free(&pe);
    /* Collect first: finishing loads may finish (and close) the task. */
    struct load **ls = malloc((nl ? nl : 1) * sizeof(*ls));
    uint8_t *oks = malloc(nl ? nl : 1);
    if (!ls || !oks) {
        free(ls);
        free(oks);
        cJSON_Delete(body);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    size_t k = 0;
    for (int which = 0; which < 2; which++) {
        for (const cJSON *x = lists[which] ? lists[which]->child : NULL; x; x = x->next) {
            struct load *l = task_item(t, x, idx);
            size_t d = 0;
            while (d < k && ls[d] != l)
                d++;
            if (d < k)
                continue; /* named twice: the first mention wins */
            ls[k] = l;
            oks[k++] = which == 0;
        }
    }
    cJSON_Delete(body);
    uint64_t tid = t->id;
    size_t loaded = 0, failed = 0;
    for (size_t d = 0; d < k; d++) {
        load_finish(pf, ls[d], oks[d]);
        loaded += oks[d];
        failed += !oks[d];
    }
    free(ls);
    free(oks);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "task");
    jw_u64(&w, tid);
    jw_key(&w, "loaded");
    jw_u64(&w, loaded);
    jw_key(&w, "failed");
    jw_u64(&w, failed);
    jw_key(&w, "open");
    jw_u64(&w, t->closing ? 0 : t->open);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Lifetime */

/* The prefetch manager's gauges for /metrics. */
static void prefetches_gauges(void *ctx, struct buf *out)
{
    const struct prefetches *pf = ctx;
    struct prefetches_stats ps;
    prefetches_stats(pf->app, &ps);
    metrics_single(out, "kvidx_prefetch_handles", "gauge",
                   "Prefetch handles that exist (any status).", ps.handles);
    metrics_single(out, "kvidx_prefetch_handles_pending", "gauge",
                   "Prefetch handles waiting for loads.", ps.handles_pending);
    metrics_single(out, "kvidx_prefetch_pins", "gauge", "Pins held by prefetch handles.", ps.pins);
    metrics_single(out, "kvidx_loads_in_flight", "gauge", "L2 to L1 loads in flight.", ps.loads);
    metrics_single(out, "kvidx_load_tasks", "gauge", "External-loader tasks not finished.",
                   ps.tasks);
}

int prefetches_init(struct app *app)
{
    struct prefetches *pf = calloc(1, sizeof(*pf));
    if (!pf)
        return KVIDX_ENOMEM;
    if (metrics_register(app->metrics, prefetches_gauges, pf) != 0) {
        free(pf);
        return KVIDX_ENOMEM;
    }
    pf->app = app;
    /* With data_dir the catalogue outlives the process, and so may a
     * client's memory of a handle id: start ids from the wall clock (ms x
     * 1000, below 2^53) so that an id from before a restart never names a
     * new handle (persistence, issue #6). */
    if (app->persist)
        pf->next_id = app_wall_ms() * 1000;
    uv_timer_init(app->loop, &pf->catalog_timer);
    pf->catalog_timer.data = pf;
    app->prefetches = pf;
    return 0;
}

void prefetches_reload(struct app *app)
{
    (void)app;
}

static void noop_closed(uv_handle_t *hd)
{
    (void)hd;
}

void prefetches_stop(struct app *app)
{
    struct prefetches *pf = app ? app->prefetches : NULL;
    if (!pf || pf->stopped)
        return;
    pf->stopped = 1;
    /* Fail what is in flight (handles complete, polls are answered), then
     * end every handle: every pin goes back before the index is freed. */
    while (pf->catalog_n)
        catalog_run(&pf->catalog_timer);
    while (pf->task_head && !pf->task_head->closing)
        task_timeout(&pf->task_head->timer);
    while (pf->load_polls)
        poll_done(pf->load_polls);
    for (size_t b = 0; b < pf->handles.cap; b++) {
        struct imap_node *e = pf->handles.b[b];
        while (e) {
            struct handle *h = (struct handle *)e;
            e = e->next;
            if (handle_live(h))
                handle_end(h, KVIDX_PFH_RELEASED);
            handle_remove(h);
        }
    }
    uv_timer_stop(&pf->catalog_timer);
    uv_close((uv_handle_t *)&pf->catalog_timer, noop_closed);
}

void prefetches_free(struct app *app)
{
    struct prefetches *pf = app ? app->prefetches : NULL;
    if (!pf)
        return;
    metrics_unregister(app->metrics, prefetches_gauges, pf);
    free(pf->handles.b);
    free(pf->loads.b);
    free(pf->tasks.b);
    free(pf->catalog_q);
    free(pf);
    app->prefetches = NULL;
}

void prefetches_stats(const struct app *app, struct prefetches_stats *out)
{
    memset(out, 0, sizeof(*out));
    const struct prefetches *pf = app ? app->prefetches : NULL;
    if (!pf)
        return;
    out->handles = pf->handles.n;
    /* Gauges are read rarely (/metrics): summing beats keeping totals in
     * step with every ledger change. */
    for (size_t b = 0; b < pf->handles.cap; b++) {
        for (const struct imap_node *e = pf->handles.b[b]; e; e = e->next) {
            const struct handle *h = (const struct handle *)e;
            out->handles_pending += h->pfh.status == KVIDX_PFH_PENDING;
            out->pins += h->pfh.pins;
        }
    }
    out->loads = pf->loads.n;
    out->tasks = pf->tasks.n;
}

const struct route prefetch_routes[] = {
    {M_POST, "/v1/lookup", api_lookup, "lookup"},
    {M_POST, "/v1/prefetches", api_prefetch_create, "prefetches_create"},
    {M_GET, "/v1/prefetches/*", api_prefetch_get, "prefetches_get"},
    {M_DELETE, "/v1/prefetches/*", api_prefetch_delete, "prefetches_delete"},
    {M_POST, "/v1/prefetches/*", api_prefetch_post, "prefetches_post"},
    {M_GET, "/v1/loads", api_loads_get, "loads_get"},
    {M_POST, "/v1/loads/*", api_loads_post, "loads_post"},
    {0, NULL, NULL, NULL},
};
