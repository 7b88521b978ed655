/*
 * Answers that wait for the journal (fsync=always), and the undo of the
 * requests whose records could not be written.
 *
 * A write handler's answer is deferred (a waiter) until the writer reports
 * its records durable; on_async then sends every answer the new durable
 * position covers, oldest first. When the journal fails instead, each
 * waiting request is undone (newest first: the states it replaced are put
 * back, which journals compensating records behind the failed ones) and
 * answered 503 storage_unavailable, so that memory and, once the journal
 * recovers, the replayed journal agree.
 *
 * Invariants: a request is only undone when nothing it changed has a
 * pinned or loading L1 copy (only a forced delete may remove one) and its
 * undo log is complete; otherwise it keeps its change and is answered as
 * it was (w->keep). A waiter is on exactly one list (waiters or ready)
 * until it is freed, and the answer loop only ever takes the head of
 * p->ready, so cancelling any waiter from inside an answer is safe.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "state/layouts.h"
#include "util/log.h"

#include "kvidx/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void waiter_unlink(struct waiter *w)
{
    struct persist *p = w->p;
    if (w->prev)
        w->prev->next = w->next;
    else if (w->ready)
        p->ready = w->next;
    else
        p->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}

static void waiter_free(struct waiter *w)
{
    buf_free(&w->undo);
    free(w);
}

static void waiter_cancel(void *arg)
{
    struct waiter *w = arg;
    waiter_unlink(w);
    waiter_free(w);
}

int waiter_defer(struct persist *p, struct response *res, int capturing)
{
    struct waiter *w = calloc(1, sizeof(*w));
    if (!w)
        return KVIDX_ENOMEM;
    w->p = p;
    w->res = res;
    w->seq = p->appended_seq;
    /* The waiter takes the undo records. Without them (capture failed) the
     * request cannot be undone: on failure it keeps its change. */
    w->undo = p->capture;
    buf_init(&p->capture);
    if (capturing < 0) {
        buf_reset(&w->undo);
        w->keep = 1;
    }
    w->next = p->waiters;
    if (p->waiters)
        p->waiters->prev = w;
    p->waiters = w;
    res_defer(res, w, waiter_cancel);
    return 0;
}

/* 1 when a key the request changed now has a pinned or loading L1 copy:
 * an undo would have to delete or resize it, which only a forced delete
 * may do, so the request is not undone at all. */
static int undo_blocked(struct persist *p, const struct waiter *w)
{
    const uint8_t *b = (const uint8_t *)w->undo.data;
    size_t off = 0;
    kvidx_jrec_t rec;
    while (kvidx_journal_next(b, w->undo.len, &off, &rec) == 1)
        if (rec.type == KVIDX_JREC_KEY && store_held(p->idx, &rec.key))
            return 1;
    return 0;
}

/* Puts back the state one undo record describes, journaling it. */
static void undo_rec(struct persist *p, const kvidx_jrec_t *rec)
{
    if (rec->type == KVIDX_JREC_KEY) {
        kvidx_durable_t st = {rec->size_bytes, rec->tiers};
        if (store_apply(p->idx, &rec->key, &st, 0) != 0)
            log_warn("journal: could not restore a key after a failed write");
    } else if (rec->type == KVIDX_JREC_LAYOUT_PUT) {
        layouts_restore(p->layouts, (const char *)rec->blob, rec->blob_len);
        persist_layout_put(p->app, rec->key.model, rec->key.model_len, rec->world_size,
                           (const char *)rec->blob, rec->blob_len);
    } else if (rec->type == KVIDX_JREC_LAYOUT_DEL) {
        layouts_forget(p->layouts, rec->key.model, rec->key.model_len, rec->world_size);
        persist_layout_del(p->app, rec->key.model, rec->key.model_len, rec->world_size);
    }
}

/* Puts back the states a failed request replaced, newest first. The store
 * reports the restored states as changes, so compensating records follow
 * the failed ones in the journal once it can be written again. */
static void waiter_undo(struct persist *p, struct waiter *w)
{
    if (w->keep || undo_blocked(p, w)) {
        w->keep = 1;
        return;
    }
    const uint8_t *b = (const uint8_t *)w->undo.data;
    size_t n = 0, cap = 0, off = 0;
    size_t *at = NULL;
    kvidx_jrec_t rec;
    while (kvidx_journal_next(b, w->undo.len, &off, &rec) == 1) {
        if (n == cap) {
            size_t *na = realloc(at, (cap = cap ? 2 * cap : 64) * sizeof(*at));
            if (!na) {
                free(at);
                w->keep = 1; /* cannot walk it backwards: leave it all */
                return;
            }
            at = na;
        }
        at[n++] = off;
    }
    for (size_t i = n; i-- > 0;) {
        off = i ? at[i - 1] : 0;
        if (kvidx_journal_next(b, w->undo.len, &off, &rec) == 1)
            undo_rec(p, &rec);
    }
    free(at);
}

/* Moves the waiters to answer now onto p->ready, oldest first. */
static void collect_ready(struct persist *p, uint64_t durable, int failing)
{
    for (struct waiter *w = p->waiters, *next; w; w = next) {
        next = w->next;
        if ((w->seq <= durable && w->snap_epoch <= p->snap_epoch) || failing) {
            waiter_unlink(w);
            w->ready = 1;
            w->next = p->ready; /* the list is newest first: p->ready oldest first */
            if (p->ready)
                p->ready->prev = w;
            p->ready = w;
        }
    }
}

/* Sends the answers on p->ready: 503 for those whose records were not
 * written and that were undone. */
static void answer_ready(struct persist *p, uint64_t durable)
{
    while (p->ready) {
        struct waiter *w = p->ready;
        waiter_unlink(w);
        if (w->seq > durable && !w->keep) {
            buf_reset(&w->res->body);
            w->res->extra_len = 0;
            res_problem(w->res, KVIDX_ESTORAGE,
                        "the journal could not be written; nothing was changed", NULL, 0);
        }
        struct response *res = w->res;
        waiter_free(w);
        /* The waiter is gone: the server must not cancel it again. */
        res->cancel = NULL;
        res->waiter = NULL;
        res_complete(res);
    }
}

void on_async(uv_async_t *h)
{
    struct persist *p = h->data;
    uv_mutex_lock(&p->mu);
    uint64_t durable = p->durable_seq;
    int failing = p->failing, sync_lost = p->sync_lost;
    p->sync_lost = 0;
    char msg[WHY_LEN];
    snprintf(msg, sizeof(msg), "%s", p->fail_msg);
    uv_mutex_unlock(&p->mu);
    if (sync_lost) {
        log_error("journal: an fsync failed after its records were written; they may be "
                  "missing on disk. Refusing writes until the next snapshot holds every change");
        p->gap = 1;
        p->hole = 1;
        p->gap_epoch++;
    }
    if (failing && !p->failing_seen)
        log_error("journal: %s; writes answer 503 storage_unavailable until it recovers", msg);
    p->failing_seen = failing;
    /* Undo failed requests newest first (the list is newest first). */
    if (failing) {
        for (struct waiter *w = p->waiters; w; w = w->next)
            if (w->seq > durable)
                waiter_undo(p, w);
    }
    /* Collect first: completing an answer may run pipelined requests that
     * add waiters, and may close its connection, which cancels the answers
     * still waiting on it (waiter_cancel takes them off p->ready). */
    collect_ready(p, durable, failing);
    answer_ready(p, durable);
    maybe_snapshot(p);
}
