/*
 * The glue between the prefetch table (lib/prefetch_table.c) and the loop
 * (state/prefetches.h).
 *
 * Owns: the table, one uv timer armed at the table's next deadline, the
 * catalog loader's timer, and every long poll. Invariants:
 *   - after every call that may change the table's deadlines the timer is
 *     re-armed, so leases, grace periods and task deadlines are acted on
 *     within the loop's clock granularity;
 *   - the table's events never answer anything in place: answering may run
 *     another connection's pipelined requests at once, which must not happen
 *     in the middle of a table operation. A handle that changed has its
 *     polls answered on the next loop turn; one that is forgotten has their
 *     answers written now (while it exists) and sent on the next turn;
 *   - every poll is on exactly one list (its handle's, the /v1/loads one, or
 *     the written-answers one) until it is answered or cancelled, and its
 *     memory is freed only from its timer's close callback.
 */
#include "state/prefetches.h"

#include "state/keystore.h"
#include "util/context.h"
#include "util/metrics.h"

#include "kvidx/err.h"

#include <stdlib.h>
#include <string.h>

enum poll_list { ON_HANDLE = 0, ON_LOADS = 1, ON_WRITTEN = 2 };

struct poll {
    struct prefetches *pf;
    kvidx_pft_handle_t *h; /* ON_HANDLE only */
    struct response *res;
    prefetches_answer_fn answer;
    enum poll_list list;
    struct poll *next, *prev;
    uv_timer_t timer;
    int closing;
};

struct prefetches {
    struct app *app;
    kvidx_pft_t *table;
    uv_timer_t tick;
    uv_timer_t catalog;
    struct poll *load_polls; /* waiting for a task */
    struct poll *written;    /* answered, sent on the next turn */
    int stopped;
};

static const char *const counter_names[KVIDX_PFT_COUNTERS] = {
    "kvidx_prefetches_total", "kvidx_loads_total", "kvidx_loads_completed_total",
    "kvidx_load_failures_total", "kvidx_expirations_total"};

/* ---- polls ---- */

/* The first poll of p's list. A handle keeps its list in udata. */
static struct poll *list_first(const struct poll *p)
{
    switch (p->list) {
    case ON_HANDLE:
        return p->h->udata;
    case ON_LOADS:
        return p->pf->load_polls;
    default:
        return p->pf->written;
    }
}

static void list_set_first(struct poll *p, struct poll *first)
{
    switch (p->list) {
    case ON_HANDLE:
        p->h->udata = first;
        break;
    case ON_LOADS:
        p->pf->load_polls = first;
        break;
    default:
        p->pf->written = first;
    }
}

static void poll_link(struct poll *p, enum poll_list list)
{
    p->list = list;
    struct poll *first = list_first(p);
    p->prev = NULL;
    p->next = first;
    if (first)
        first->prev = p;
    list_set_first(p, p);
}

static void poll_unlink(struct poll *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        list_set_first(p, p->next);
    if (p->next)
        p->next->prev = p->prev;
    p->next = p->prev = NULL;
}

static void poll_closed(uv_handle_t *hd)
{
    free(hd->data);
}

static void poll_close(struct poll *p)
{
    poll_unlink(p);
    p->closing = 1;
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, poll_closed);
}

/* Answers p (unless its answer is written already) and hands it back to
 * the server. */
static void poll_done(struct poll *p)
{
    if (p->closing)
        return;
    struct response *res = p->res;
    enum poll_list list = p->list;
    kvidx_pft_handle_t *h = p->h;
    poll_close(p);
    if (list != ON_WRITTEN)
        p->answer(p->pf, list == ON_HANDLE ? h : NULL, res);
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
        poll_close(p);
}

static void wake_list(struct poll *p)
{
    for (; p; p = p->next)
        uv_timer_start(&p->timer, poll_timeout, 0, 0);
}

int prefetches_poll(struct prefetches *pf, kvidx_pft_handle_t *h, struct response *res,
                    uint64_t wait_ms, prefetches_answer_fn answer)
{
    struct poll *p = calloc(1, sizeof(*p));
    if (!p)
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    p->pf = pf;
    p->h = h;
    p->res = res;
    p->answer = answer;
    uv_timer_init(pf->app->loop, &p->timer);
    p->timer.data = p;
    poll_link(p, h ? ON_HANDLE : ON_LOADS);
    uv_timer_start(&p->timer, poll_timeout, wait_ms, 0);
    res_defer(res, p, poll_cancel);
    return HANDLER_ASYNC;
}

/* ---- the table's events ---- */

static void on_changed(void *ctx, kvidx_pft_handle_t *h)
{
    (void)ctx;
    wake_list(h->udata);
}

static void on_gone(void *ctx, kvidx_pft_handle_t *h)
{
    (void)ctx;
    while (h->udata) {
        struct poll *p = h->udata;
        poll_unlink(p);
        p->answer(p->pf, h, p->res);
        p->h = NULL;
        poll_link(p, ON_WRITTEN);
        uv_timer_start(&p->timer, poll_timeout, 0, 0);
    }
}

static void on_count(void *ctx, kvidx_pft_counter_t c, uint64_t d)
{
    struct prefetches *pf = ctx;
    metrics_add(pf->app->metrics, counter_names[c], d);
}

/* ---- the clock ---- */

static void on_tick(uv_timer_t *t);

static void rearm(struct prefetches *pf)
{
    uint64_t at, now = uv_now(pf->app->loop);
    if (pf->stopped || kvidx_pft_next_deadline(pf->table, &at) != 0) {
        uv_timer_stop(&pf->tick);
        return;
    }
    uv_timer_start(&pf->tick, on_tick, at > now ? at - now : 0, 0);
}

static void on_tick(uv_timer_t *t)
{
    struct prefetches *pf = t->data;
    kvidx_pft_advance(prefetches_table(pf), uv_now(pf->app->loop));
    rearm(pf);
}

/* The catalog loader: every task made during a turn finishes on the next
 * one. The L2 catalogue is authoritative, so a load succeeds when its key
 * still has an L2 copy. Nothing makes tasks while this runs (the table's
 * events only schedule), so the loop ends. */
static void catalog_run(uv_timer_t *t)
{
    struct prefetches *pf = t->data;
    kvidx_pft_t *table = prefetches_table(pf);
    const kvidx_index_t *idx = pf->app->keystore->idx;
    const kvidx_pft_task_t *task;
    while ((task = kvidx_pft_task_first(table)) != NULL) {
        uint64_t id = task->id;
        size_t n = task->n;
        for (size_t pos = 0; pos < n && (task = kvidx_pft_task_find(table, id)); pos++) {
            kvidx_ref_t ref;
            kvidx_entry_info_t info;
            if (kvidx_pft_task_ref(task, pos, &ref) != 0)
                continue;
            int ok = kvidx_index_info(idx, ref, &info) == 0 && info.l2;
            kvidx_pft_task_finish(table, id, pos, ok);
        }
    }
    rearm(pf);
}

/* ---- calls ---- */

kvidx_pft_t *prefetches_table(struct prefetches *pf)
{
    const struct config *cfg = &pf->app->cfg;
    kvidx_pft_set_times(pf->table, cfg->handle_grace_ms, cfg->load_timeout_ms);
    return pf->table;
}

int prefetches_ready(const struct prefetches *pf)
{
    return pf->stopped ? KVIDX_ENOTREADY : 0;
}

static int is_external(const struct prefetches *pf)
{
    return pf->app->cfg.loader == LOADER_EXTERNAL;
}

const kvidx_pft_task_t *prefetches_tasks(struct prefetches *pf)
{
    return is_external(pf) ? kvidx_pft_task_first(prefetches_table(pf)) : NULL;
}

const kvidx_pft_task_t *prefetches_task(struct prefetches *pf, uint64_t id)
{
    return is_external(pf) ? kvidx_pft_task_find(prefetches_table(pf), id) : NULL;
}

const kvidx_index_t *prefetches_index(const struct prefetches *pf)
{
    return pf->app->keystore->idx;
}

int prefetches_poll_query(const struct request *req, struct response *res, int *given, uint64_t *ms)
{
    kvidx_reason_t why;
    if (kvidx_pft_parse_wait(req->query, req->query_len, given, ms, &why) == 0)
        return 0;
    struct invalid_param p = {why.field, why.rule};
    res_problem(res, KVIDX_EINVAL, "bad query parameter", &p, 1);
    return KVIDX_EINVAL;
}

uint64_t prefetches_wall_at(const struct prefetches *pf, uint64_t at)
{
    uint64_t now = uv_now(pf->app->loop);
    return app_wall_ms() + (at > now ? at - now : 0);
}

int prefetches_submit(struct prefetches *pf, kvidx_pft_submit_t *s, kvidx_pft_handle_t **out)
{
    uint64_t task = 0;
    s->submit_wall_ms = app_wall_ms();
    int rc = kvidx_pft_submit(prefetches_table(pf), s, uv_now(pf->app->loop), out, &task);
    if (rc == 0 && task && is_external(pf))
        wake_list(pf->load_polls);
    else if (rc == 0 && task)
        uv_timer_start(&pf->catalog, catalog_run, 0, 0);
    rearm(pf);
    return rc;
}

int prefetches_delete(struct prefetches *pf, uint64_t id)
{
    int rc = kvidx_pft_delete(prefetches_table(pf), id, uv_now(pf->app->loop));
    rearm(pf);
    return rc;
}

int prefetches_release(struct prefetches *pf, kvidx_pft_handle_t *h, const uint32_t *indices,
                       size_t n)
{
    int rc = kvidx_pft_release(prefetches_table(pf), h, uv_now(pf->app->loop), indices, n, NULL);
    rearm(pf);
    return rc;
}

int prefetches_extend(struct prefetches *pf, kvidx_pft_handle_t *h, uint64_t lease_ms)
{
    int rc = kvidx_pft_extend(prefetches_table(pf), h, uv_now(pf->app->loop), lease_ms);
    rearm(pf);
    return rc;
}

int prefetches_task_finish(struct prefetches *pf, uint64_t task_id, size_t pos, int ok)
{
    int rc = kvidx_pft_task_finish(prefetches_table(pf), task_id, pos, ok);
    rearm(pf);
    return rc;
}

/* ---- lifetime ---- */

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
    pf->app = app;
    /* With data_dir the catalogue outlives the process, and so may a
     * client's memory of a handle id: ids then start from the wall clock
     * (ms x 1000, below 2^53), so that an id from before a restart never
     * names a new handle. */
    uint64_t first_id = app->persist ? app_wall_ms() * 1000 : 0;
    kvidx_pft_events_t ev = {pf, on_changed, on_gone, on_count};
    if (kvidx_pft_new(&pf->table, app->keystore->idx, &ev, first_id) != 0) {
        free(pf);
        return KVIDX_ENOMEM;
    }
    if (metrics_register(app->metrics, prefetches_gauges, pf) != 0) {
        kvidx_pft_free(pf->table);
        free(pf);
        return KVIDX_ENOMEM;
    }
    uv_timer_init(app->loop, &pf->tick);
    pf->tick.data = pf;
    uv_timer_init(app->loop, &pf->catalog);
    pf->catalog.data = pf;
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
    /* The catalog loader's turn first (its loads succeed as they would
     * have), then every other load fails and every handle is released:
     * every pin goes back before the index is freed. */
    if (!is_external(pf))
        catalog_run(&pf->catalog);
    pf->stopped = 1;
    kvidx_pft_shutdown(prefetches_table(pf));
    while (pf->load_polls)
        poll_done(pf->load_polls);
    while (pf->written)
        poll_done(pf->written);
    uv_timer_stop(&pf->tick);
    uv_close((uv_handle_t *)&pf->tick, noop_closed);
    uv_timer_stop(&pf->catalog);
    uv_close((uv_handle_t *)&pf->catalog, noop_closed);
}

void prefetches_free(struct app *app)
{
    struct prefetches *pf = app ? app->prefetches : NULL;
    if (!pf)
        return;
    metrics_unregister(app->metrics, prefetches_gauges, pf);
    kvidx_pft_free(pf->table);
    free(pf);
    app->prefetches = NULL;
}

void prefetches_stats(const struct app *app, struct prefetches_stats *out)
{
    memset(out, 0, sizeof(*out));
    const struct prefetches *pf = app ? app->prefetches : NULL;
    if (!pf)
        return;
    kvidx_pft_stats_t st;
    kvidx_pft_stats(pf->table, &st);
    out->handles = st.handles;
    out->handles_pending = st.handles_pending;
    out->pins = st.pins;
    out->loads = st.loads;
    /* The catalog loader's tasks last one loop turn: not worth a gauge. */
    out->tasks = is_external(pf) ? st.tasks : 0;
}
