/*
 * The differential check of the /events scanner (daemon/api/events_scan.c)
 * against the cJSON path it stands in for, shared by
 * tests/unit/daemon/test_daemon_eventscan.c and
 * tests/fuzz/fuzz_daemon_eventscan.c. Header-only (static): each is its
 * own program.
 */
#ifndef KVIDX_TEST_EVENTSCAN_COMPARE_H
#define KVIDX_TEST_EVENTSCAN_COMPARE_H

#include "api/body.h"
#include "api/events_scan.h"
#include "util/json_read.h"
#include "util/json_write.h"
#include "util/params.h"

#include "kvidx/key.h"

#include <cjson/cJSON.h>
#include <string.h>

/* Equal keys, every field. */
static int ev_same_key(const kvidx_key_t *a, const kvidx_key_t *b)
{
    return kvidx_key_equal(a, b) && a->model_len == b->model_len && a->salt_len == b->salt_len &&
           a->hash_len == b->hash_len && a->kv_rank == b->kv_rank && a->group == b->group;
}

static int ev_same_bytes(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* Equal batches, entries and token ids, field by field (ts bit for bit),
 * with the same runs of the three arrays. */
static int ev_same_body(const struct ev_body *a, const struct ev_body *b)
{
    if (a->nb != b->nb || a->ne != b->ne || a->nt != b->nt)
        return 0;
    for (size_t i = 0; i < a->nb; i++) {
        const kvidx_dir_batch_t *x = &a->batches[i], *y = &b->batches[i];
        if (!ev_same_bytes(x->instance_id, x->instance_len, y->instance_id, y->instance_len) ||
            !ev_same_bytes(x->backend, x->backend_len, y->backend, y->backend_len) ||
            x->incarnation != y->incarnation || x->seq != y->seq ||
            x->event_type != y->event_type || x->tier != y->tier || x->shared != y->shared ||
            memcmp(&x->ts, &y->ts, sizeof(double)) != 0 || x->capacity_bytes != y->capacity_bytes ||
            x->capacity_revision != y->capacity_revision || x->num_entries != y->num_entries)
            return 0;
        if (x->num_entries && (x->entries - a->entries) != (y->entries - b->entries))
            return 0;
        for (size_t j = 0; j < x->num_entries; j++) {
            const kvidx_dir_entry_t *e = &x->entries[j], *f = &y->entries[j];
            if (!ev_same_key(&e->key, &f->key) || e->size_bytes != f->size_bytes ||
                e->token_offset != f->token_offset || e->num_tokens != f->num_tokens ||
                !e->token_ids != !f->token_ids)
                return 0;
            if (e->num_tokens &&
                ((e->token_ids - a->tokens) != (f->token_ids - b->tokens) ||
                 memcmp(e->token_ids, f->token_ids, e->num_tokens * sizeof(uint32_t)) != 0))
                return 0;
        }
    }
    return 1;
}

/* What the handler's reference path makes of a body: 0 and *out (with
 * *root to free), or nonzero when it answers an error. */
static int ev_reference(const char *body, size_t len, struct app *app, cJSON **root,
                        struct ev_body *out)
{
    struct request req;
    memset(&req, 0, sizeof(req));
    req.body = len ? body : "";
    req.body_len = len;
    req.app = app;
    struct response res;
    memset(&res, 0, sizeof(res));
    memset(out, 0, sizeof(*out));
    *root = NULL;
    int rc = json_parse_body(&req, &res, root);
    buf_free(&res.body);
    if (rc != 0)
        return rc;
    struct param_errors pe;
    param_errors_init(&pe);
    int key_fault = 0;
    rc = events_decode(*root, &pe, out, &key_fault);
    param_errors_free(&pe);
    return rc;
}

/* 1 when the scanner took the body and agrees with the reference, 0 when
 * it fell back with nothing allocated, -1 on any disagreement. */
static int ev_diff(const char *body, size_t len, struct app *app)
{
    struct ev_body fast;
    if (events_scan(len ? body : "", len, app, &fast) != 0)
        return fast.batches || fast.entries || fast.tokens || fast.nb || fast.ne || fast.nt ? -1
                                                                                            : 0;
    cJSON *root;
    struct ev_body ref;
    int rc = ev_reference(body, len, app, &root, &ref);
    int same = rc == 0 && ev_same_body(&fast, &ref);
    ev_body_free(&ref);
    ev_body_free(&fast);
    cJSON_Delete(root);
    return same ? 1 : -1;
}

#endif
