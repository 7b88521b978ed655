/*
 * POST /events: LMCache's cache-event ingest ({"batches": [...]} →
 * {"applied", "duplicates", "stale"}).
 *
 * The whole request is validated before anything is offered to the gate:
 * one invalid batch answers 422 with every error found and applies
 * nothing. Valid batches are then offered in list order, each applied
 * whole or not at all by the directory. Unknown members of a batch or an
 * entry are ignored, as LMCache's models ignore them (newer emitters add
 * fields); a key object follows kvidx's key rules, unknown members
 * included. Under fsync = always the answer waits for the journal.
 *
 * Two decoders: events_scan (api/events_scan.c) reads the usual body
 * straight from its bytes; anything else goes through the cJSON tree and
 * events_decode here, which is the reference: it gives every error
 * answer, and the scanner takes only bodies it decodes the same way.
 */
#include "api/api.h"
#include "api/body.h"
#include "api/events_scan.h"
#include "api/fleet_json.h"

#include "state/auth.h"
#include "state/fleet.h"
#include "state/persist/persist.h"
#include "util/context.h"
#include "util/metrics.h"

#include "kvidx/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define U63 9223372036854775807.0

static int parse_event_type(const char *s, size_t n, kvidx_dir_event_t *out)
{
    static const char *const names[] = {"store", "delete", "access", "config"};
    for (int i = 0; i < 4; i++)
        if (n == strlen(names[i]) && memcmp(s, names[i], n) == 0) {
            *out = (kvidx_dir_event_t)i;
            return 0;
        }
    return -1;
}

static int parse_entry(struct param_errors *pe, const cJSON *e, size_t bi, size_t ei,
                       kvidx_dir_entry_t *out, uint32_t **tok_cursor, int *key_fault)
{
    memset(out, 0, sizeof(*out));
    out->token_offset = KVIDX_DIR_UNKNOWN_OFFSET;
    char where[64];
    snprintf(where, sizeof(where), "batches[%zu].entries[%zu].", bi, ei);
    if (!cJSON_IsObject(e)) {
        param_errors_add(pe, "must be an object", "batches[%zu].entries[%zu]", bi, ei);
        return -1;
    }
    int bad = 0;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(e, "key");
    kvidx_reason_t why;
    if (!key) {
        param_errors_add(pe, "is required", "%skey", where);
        bad = 1;
    } else if (json_to_key(key, &out->key, &why) != 0) {
        char kw[72];
        snprintf(kw, sizeof(kw), "%skey", where);
        param_errors_key(pe, &why, kw);
        *key_fault = 1;
        bad = 1;
    }
    bad |= fj_uint(pe, e, "size_bytes", 0, 0, 0, U63, where, &out->size_bytes);
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "token_offset");
    if (off) {
        uint64_t v;
        if (cJSON_IsNumber(off) && off->valuedouble == -1.0) {
            out->token_offset = KVIDX_DIR_UNKNOWN_OFFSET;
        } else if (json_uint(off, 0, U63, &v) == 0) {
            out->token_offset = (int64_t)v;
        } else {
            param_errors_add(pe, "must be an integer >= 0, or -1 (unknown)", "%stoken_offset",
                             where);
            bad = 1;
        }
    }
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(e, "token_ids");
    if (toks && !cJSON_IsArray(toks)) {
        param_errors_add(pe, "must be an array", "%stoken_ids", where);
        return -1;
    }
    if (toks && cJSON_GetArraySize(toks) > EVENTS_MAX_ENTRY_TOKENS) {
        param_errors_add(pe, "must hold at most 65536 token ids (one chunk's)", "%stoken_ids",
                         where);
        return -1;
    }
    if (toks && toks->child) {
        uint32_t *t = *tok_cursor;
        size_t k = 0;
        int fits = 1;
        for (const cJSON *v = toks->child; v; v = v->next, k++) {
            if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
                v->valuedouble != floor(v->valuedouble)) {
                param_errors_add(pe, "must be an integer", "%stoken_ids[%zu]", where, k);
                return -1;
            }
            if (v->valuedouble < 0 || v->valuedouble > 4294967295.0)
                fits = 0;
            else
                t[k] = (uint32_t)v->valuedouble;
        }
        /* Ids that do not fit a uint32 leave the chunk's binding as it was
         * (LMCache cannot store them either); the entry still applies. */
        if (fits) {
            out->token_ids = t;
            out->num_tokens = k;
            *tok_cursor = t + k;
        }
    }
    return bad ? -1 : 0;
}

static int parse_batch(struct param_errors *pe, const cJSON *b, size_t bi, kvidx_dir_batch_t *out,
                       kvidx_dir_entry_t *entries, uint32_t **tok_cursor, int *key_fault)
{
    memset(out, 0, sizeof(*out));
    if (!cJSON_IsObject(b)) {
        param_errors_add(pe, "must be an object", "batches[%zu]", bi);
        return -1;
    }
    char where[40];
    snprintf(where, sizeof(where), "batches[%zu].", bi);
    int bad = 0;
    const char *s;
    size_t n;
    if (fj_string(pe, b, "instance_id", NULL, where, &out->instance_id, &out->instance_len) != 0)
        bad = 1;
    else if (out->instance_len == 0) {
        param_errors_add(pe, "must be non-empty", "%sinstance_id", where);
        bad = 1;
    }
    bad |= fj_uint(pe, b, "incarnation", 0, 1, 0, 18446744073709549568.0, where, &out->incarnation);
    bad |= fj_uint(pe, b, "seq", 0, 1, 1, 18446744073709549568.0, where, &out->seq);
    if (fj_string(pe, b, "event_type", NULL, where, &s, &n) == 0 &&
        parse_event_type(s, n, &out->event_type) != 0) {
        param_errors_add(pe, "must be store, delete, access or config", "%sevent_type", where);
        bad = 1;
    }
    if (fj_string(pe, b, "tier", NULL, where, &s, &n) == 0) {
        if (n == 2 && memcmp(s, "l1", 2) == 0)
            out->tier = KVIDX_DIR_L1;
        else if (n == 2 && memcmp(s, "l2", 2) == 0)
            out->tier = KVIDX_DIR_L2;
        else {
            param_errors_add(pe, "cache events must target a concrete tier (l1 or l2)", "%stier",
                             where);
            bad = 1;
        }
    } else {
        bad = 1;
    }
    bad |= fj_string(pe, b, "backend", NULL, where, &out->backend, &out->backend_len);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(b, "shared");
    if (sh && !cJSON_IsBool(sh)) {
        param_errors_add(pe, "must be a boolean", "%sshared", where);
        bad = 1;
    }
    out->shared = sh && cJSON_IsTrue(sh);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(b, "ts");
    if (ts && (!cJSON_IsNumber(ts) || !(ts->valuedouble >= 0.0))) {
        param_errors_add(pe, "must be a number >= 0", "%sts", where);
        bad = 1;
    }
    out->ts = ts && cJSON_IsNumber(ts) ? ts->valuedouble : 0.0;
    bad |= fj_uint(pe, b, "capacity_bytes", 0, 0, 0, U63, where, &out->capacity_bytes);
    bad |= fj_uint(pe, b, "capacity_revision", 0, 0, 0, U63, where, &out->capacity_revision);
    const cJSON *ents = cJSON_GetObjectItemCaseSensitive(b, "entries");
    if (ents && !cJSON_IsArray(ents)) {
        param_errors_add(pe, "must be an array", "%sentries", where);
        return -1;
    }
    size_t ei = 0;
    if (ents)
        for (const cJSON *e = ents->child; e; e = e->next, ei++)
            bad |= parse_entry(pe, e, bi, ei, &entries[ei], tok_cursor, key_fault);
    out->entries = entries;
    out->num_entries = ei;
    if (bad)
        return -1;
    size_t bad_entry;
    kvidx_reason_t why = {NULL, NULL};
    if (kvidx_directory_batch_check(out, &bad_entry, &why) != 0) {
        const char *reason = why.rule ? why.rule : "is not valid";
        if (bad_entry == SIZE_MAX)
            param_errors_add(pe, reason, "%s%s", where, why.field ? why.field : "batch");
        else
            param_errors_add(pe, reason, "%sentries[%zu].%s", where, bad_entry,
                             why.field ? why.field : "key");
        return -1;
    }
    return 0;
}

/* Counts entries and token ids so that one allocation each holds them. */
static int count_body(const cJSON *batches, size_t *nb, size_t *ne, size_t *nt)
{
    *nb = *ne = *nt = 0;
    for (const cJSON *b = batches->child; b; b = b->next) {
        (*nb)++;
        const cJSON *ents =
            cJSON_IsObject(b) ? cJSON_GetObjectItemCaseSensitive(b, "entries") : NULL;
        if (!cJSON_IsArray(ents))
            continue;
        for (const cJSON *e = ents->child; e; e = e->next) {
            (*ne)++;
            const cJSON *t =
                cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "token_ids") : NULL;
            if (cJSON_IsArray(t))
                *nt += (size_t)cJSON_GetArraySize(t);
        }
    }
    return 0;
}

int events_decode(const cJSON *root, struct param_errors *pe, struct ev_body *out, int *key_fault)
{
    memset(out, 0, sizeof(*out));
    const cJSON *batches =
        cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "batches") : NULL;
    if (!cJSON_IsObject(root)) {
        param_errors_add(pe, "must be a JSON object", "body");
        return -1;
    }
    if (batches && !cJSON_IsArray(batches)) {
        param_errors_add(pe, "must be an array", "batches");
        return -1;
    }
    size_t nb = 0, ne = 0, nt = 0;
    if (batches)
        count_body(batches, &nb, &ne, &nt);
    out->batches = malloc((nb ? nb : 1) * sizeof(*out->batches));
    out->entries = malloc((ne ? ne : 1) * sizeof(*out->entries));
    out->tokens = malloc((nt ? nt : 1) * sizeof(*out->tokens));
    if (!out->batches || !out->entries || !out->tokens)
        return KVIDX_ENOMEM;
    size_t eoff = 0, bi = 0;
    uint32_t *tok_cursor = out->tokens;
    if (batches)
        for (const cJSON *b = batches->child; b; b = b->next, bi++) {
            parse_batch(pe, b, bi, &out->batches[bi], out->entries + eoff, &tok_cursor, key_fault);
            eoff += out->batches[bi].num_entries;
        }
    out->nb = nb;
    out->ne = eoff;
    out->nt = (size_t)(tok_cursor - out->tokens);
    return pe->n ? -1 : 0;
}

static int api_events(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    cJSON *root = NULL;
    struct param_errors pe;
    param_errors_init(&pe);
    struct ev_body r;
    int key_fault = 0;
    if (events_scan(req->body, req->body_len, req->app, &r) != 0) {
        if (json_parse_body(req, res, &root) != 0) {
            param_errors_free(&pe);
            return 0;
        }
        int drc = events_decode(root, &pe, &r, &key_fault);
        if (drc == KVIDX_ENOMEM)
            goto oom;
        if (drc != 0)
            goto invalid;
    }
    param_errors_free(&pe);
    size_t ne = r.ne;

    /* A token bound to a cache_salt may report only that salt's keys
     * (403 for the whole request, nothing applied). */
    for (size_t i = 0; i < r.nb; i++)
        if (r.batches[i].num_entries &&
            auth_forbid_keys(req, res, &r.batches[i].entries[0].key, sizeof(kvidx_dir_entry_t),
                             r.batches[i].num_entries) != 0)
            goto out;
    struct fleet *f = req->app->fleet;
    uint64_t counts[3] = {0, 0, 0};
    int rc = 0;
    for (size_t i = 0; i < r.nb && rc == 0; i++) {
        kvidx_dir_verdict_t v;
        rc = kvidx_directory_ingest(f->dir, &r.batches[i], &v);
        if (rc == 0)
            counts[v]++;
    }
    metrics_add(req->app->metrics, "kvidx_fleet_batches_applied_total", counts[0]);
    metrics_add(req->app->metrics, "kvidx_fleet_batches_duplicate_total", counts[1]);
    metrics_add(req->app->metrics, "kvidx_fleet_batches_stale_total", counts[2]);
    metrics_add(req->app->metrics, "kvidx_fleet_entries_total", ne);
    if (rc != 0) {
        /* The batches before the failing one stay applied: a retry of the
         * whole request sees them as duplicates. */
        res_problem(res, rc, "out of memory while applying the batches", NULL, 0);
        goto out;
    }
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "applied");
    jw_u64(&w, counts[0]);
    jw_key(&w, "duplicates");
    jw_u64(&w, counts[1]);
    jw_key(&w, "stale");
    jw_u64(&w, counts[2]);
    jw_obj_end(&w);
    /* The batches are applied: even when the answer could not be built,
     * it is a 200 (the connection then closes, never a 503 that would say
     * nothing changed). */
    res_json(res, 200);
    ev_body_free(&r);
    cJSON_Delete(root);
    return persist_ack(req, res);

invalid:
    fj_unprocessable(&pe, res, "the event batches are not valid; none was applied", key_fault);
    goto out;
oom:
    param_errors_free(&pe);
    buf_reset(&res->body);
    res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
out:
    ev_body_free(&r);
    cJSON_Delete(root);
    return 0;
}

const struct route events_routes[] = {
    {M_POST, "/events", api_events, "fleet_events", ROUTE_INGEST},
    {0, NULL, NULL, NULL, 0},
};
