/*
 * The fleet directory as the daemon holds it (state/fleet.c): libkvidx's
 * kvidx_directory_t (LMCache's coordinator key directory, event gate and
 * instance registry), the timer that drops silent instances, its gauges on
 * /metrics, and the hook persistence uses to journal its changes. Served by
 * api/events.c, api/directory.c and api/instances.c.
 */
#ifndef KVIDXD_FLEET_H
#define KVIDXD_FLEET_H

#include "kvidx/directory.h"

#include <stdint.h>
#include <uv.h>

struct app;

struct fleet {
    kvidx_directory_t *dir;
    struct app *app;
    uv_timer_t expiry;
    int timer_open;
    uint64_t expired_total; /* instances dropped by the timeout */
    /* Persistence's journal hook (state/persist/), NULL without data_dir:
     * called for every change the directory reports. */
    void (*journal)(void *ctx, const kvidx_dir_change_t *c);
    void *journal_ctx;
};

/* Creates app->fleet with app->cfg's token cap and registers its gauges.
 * 0 or KVIDX_E*. */
int fleet_init(struct app *app);
/* Starts the expiry timer (every health_check_interval_s, instances
 * silent for more than instance_timeout_s are dropped). After restore. */
int fleet_start(struct app *app);
/* SIGHUP: applies instance_timeout_s and directory_token_bytes. */
void fleet_reload(struct app *app);
/* Shutdown: closes the timer (before the last uv_run). */
void fleet_stop(struct app *app);
void fleet_free(struct app *app);

/* Drops every instance silent for longer than the timeout, now. */
void fleet_expire_now(struct app *app);

#endif
