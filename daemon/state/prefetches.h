/*
 * The daemon side of the prefetch table (kvidx/prefetch_table.h): LOOKUP
 * and WARM handles, their leases, single-flight loads and the loaders.
 *
 * The table itself is pure state in lib; this glue gives it the loop's
 * clock (one uv timer armed at the table's next deadline), runs the
 * catalog loader (the loads of a turn complete on the next turn, from the
 * L2 catalogue), keeps the long polls on handles and on the external
 * loader's tasks, and counts into metrics. Every uv handle it creates
 * lives on app->loop and is closed by prefetches_stop. See
 * docs/lookup_and_prefetch.md for the wire formats.
 */
#ifndef KVIDXD_PREFETCHES_H
#define KVIDXD_PREFETCHES_H

#include "net/http.h"

#include "kvidx/prefetch_table.h"

#include <stddef.h>
#include <stdint.h>

struct app;
struct prefetches;

/* Creates app->prefetches (needs app->loop, app->cfg and app->keystore).
 * Returns 0 or KVIDX_ENOMEM. */
int prefetches_init(struct app *app);
/* SIGHUP: leases, grace and load timeouts are read from app->cfg when they
 * are next used, so there is nothing to redo; kept for symmetry. */
void prefetches_reload(struct app *app);
/* Shutdown: finishes what the catalog loader has, fails every other load in
 * flight, releases every handle (every pin goes back), answers every long
 * poll and uv_closes every timer. Idempotent. */
void prefetches_stop(struct app *app);
/* After the loop has ended (the close callbacks ran): frees everything. */
void prefetches_free(struct app *app);

/* The table, with the grace period and load timeout of app->cfg, for
 * reading and for the calls below. */
kvidx_pft_t *prefetches_table(struct prefetches *pf);
/* 0, or KVIDX_ENOTREADY once prefetches_stop ran: nothing new may start. */
int prefetches_ready(const struct prefetches *pf);
/* The external loader's unfinished tasks, oldest first (kvidx_pft_task_next),
 * and the one named id; NULL when none, and always with the catalog loader
 * (its tasks finish on their own). */
const kvidx_pft_task_t *prefetches_tasks(struct prefetches *pf);
const kvidx_pft_task_t *prefetches_task(struct prefetches *pf, uint64_t id);
/* The index the table is on. */
const kvidx_index_t *prefetches_index(const struct prefetches *pf);
/* The wall clock (ms) at table time at (the loop's clock); now when past. */
uint64_t prefetches_wall_at(const struct prefetches *pf, uint64_t at);

/* The table's calls at the loop's current time, with what follows them:
 * the timer re-armed, the catalog loader or the polls on /v1/loads told
 * of a new task. Same returns as the kvidx_pft_* function of that name. */
int prefetches_submit(struct prefetches *pf, kvidx_pft_submit_t *s, kvidx_pft_handle_t **out);
int prefetches_delete(struct prefetches *pf, uint64_t id);
int prefetches_release(struct prefetches *pf, kvidx_pft_handle_t *h, const uint32_t *indices,
                       size_t n);
int prefetches_extend(struct prefetches *pf, kvidx_pft_handle_t *h, uint64_t lease_ms);
int prefetches_task_finish(struct prefetches *pf, uint64_t task_id, size_t pos, int ok);

/* Writes the answer of a long poll into res: for handle h, or for the
 * tasks when h is NULL. */
typedef void (*prefetches_answer_fn)(struct prefetches *pf, kvidx_pft_handle_t *h,
                                     struct response *res);

/* Reads the query string of a long poll (kvidx_pft_parse_wait): 0 with
 * *given and *ms, or KVIDX_EINVAL after answering 400 invalid_argument
 * naming the parameter. */
int prefetches_poll_query(const struct request *req, struct response *res, int *given,
                          uint64_t *ms);

/* A long poll: res is answered by answer after wait_ms, or on the loop turn
 * after h leaves pending or ends (h NULL: after a task is made). Returns
 * HANDLER_ASYNC, or 0 after answering 503 (out of memory). */
int prefetches_poll(struct prefetches *pf, kvidx_pft_handle_t *h, struct response *res,
                    uint64_t wait_ms, prefetches_answer_fn answer);

/* Figures for /metrics and /v1/stats (gauges). Zeroes when app has no
 * prefetch manager. */
struct prefetches_stats {
    uint64_t handles;         /* handles that exist (any status) */
    uint64_t handles_pending; /* waiting for loads */
    uint64_t pins;            /* pins held by handles, summed */
    uint64_t loads;           /* loads in flight */
    uint64_t tasks;           /* load tasks unfinished */
};
void prefetches_stats(const struct app *app, struct prefetches_stats *out);

#endif
