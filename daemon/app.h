/*
 * Start-up and shut-down of the daemon's data subsystems (layouts, key
 * store, prefetch handles), in one place so main.c calls four functions.
 */
#ifndef KVIDXD_SUBSYS_H
#define KVIDXD_SUBSYS_H

#include "net/router.h"

struct app;

/* After app->loop, app->cfg and app->metrics exist. 0 or KVIDX_E*. */
int subsystems_init(struct app *app);
/* SIGHUP: apply the reloadable settings now in app->cfg. */
void subsystems_reload(struct app *app);
/* Shutdown: close every uv handle the subsystems own (before the last uv_run). */
void subsystems_stop(struct app *app);
/* After the loop has ended: free everything. */
void subsystems_free(struct app *app);

/* Every route table of the API, NULL-terminated; subsystems_init hands
 * it to the router. */
extern const struct route *const app_route_tables[];

#endif
