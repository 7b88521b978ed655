/*
 * Prefetch handles, lookups and loads (SPEC §3.3, §3.4, §4): the daemon
 * side of LOOKUP and WARM.
 *
 * The prefetch manager owns every prefetch handle, every L2→L1 load in
 * flight (single-flight: one load per L1 copy, shared by every handle that
 * wants it), the external loader's tasks and the long polls on them. Every
 * uv handle it creates lives on app->loop and is closed by prefetches_stop.
 * See docs/lookup_and_prefetch.md for the wire formats and the choices.
 */
#ifndef KVIDXD_PREFETCHES_H
#define KVIDXD_PREFETCHES_H


#include <stddef.h>
#include <stdint.h>

struct app;

/* Creates app->prefetches (needs app->loop, app->cfg and app->keystore).
 * Returns 0 or KVIDX_ENOMEM. */
int prefetches_init(struct app *app); /* sets app->prefetches; uv timers on app->loop */
/* SIGHUP: leases, grace and load timeouts are read from app->cfg when they
 * are next used, so there is nothing to redo; kept for symmetry. */
void prefetches_reload(struct app *app);
/* Shutdown: answers every long poll, releases every pin any handle holds,
 * fails every load in flight and uv_closes every timer. Idempotent. */
void prefetches_stop(struct app *app); /* uv_close every handle it owns; release all pins */
/* After the loop has ended (the close callbacks ran): frees everything. */
void prefetches_free(struct app *app); /* after the loop ended */

/* Figures for /metrics and /v1/stats (gauges). Zeroes when app has no
 * prefetch manager. */
struct prefetches_stats {
    uint64_t handles;         /* handles that exist (any status) */
    uint64_t handles_pending; /* waiting for loads */
    uint64_t pins;            /* pins held by handles, summed */
    uint64_t loads;           /* loads in flight */
    uint64_t tasks;           /* external-loader tasks unfinished */
};
void prefetches_stats(const struct app *app, struct prefetches_stats *out);

#endif
