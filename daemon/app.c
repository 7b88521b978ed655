/*
 * Start-up and shut-down of the data subsystems, and the list of every
 * route table. Order matters: layouts and the key store exist before the
 * prefetch manager, which pins keys in the store; persistence restores the
 * store and layouts before the prefetch manager starts; shutdown runs
 * backwards (the journal is flushed and fsynced before the store is freed).
 */
#include "app.h"

#include "util/context.h"
#include "state/keystore.h"
#include "state/layouts.h"
#include "state/persist/persist.h"
#include "state/prefetches.h"
#include "api/api.h"
#include "util/metrics.h"

#include "kvidx/err.h"

const struct route *const app_route_tables[] = {
    ops_routes,    layout_routes,   key_routes,  list_routes,
    lookup_routes, prefetch_routes, load_routes, NULL,
};

/* The daemon's own gauge: readiness, as /readyz answers it. */
static void app_gauges(void *ctx, struct buf *out)
{
    const struct app *app = ctx;
    metrics_single(out, "kvidx_ready", "gauge",
                   "1 when /readyz answers 200 (restored, not draining).",
                   app->ready && !app->draining ? 1 : 0);
}

int subsystems_init(struct app *app)
{
    app->layouts = layouts_new();
    if (!app->layouts)
        return KVIDX_ENOMEM;
    int rc = metrics_register(app->metrics, app_gauges, app);
    if (rc == 0)
        rc = keystore_init(app);
    /* Restore before the prefetch manager and before the server exists:
     * /readyz cannot answer 200 and READY=1 is not sent until it is done. */
    if (rc == 0)
        rc = persist_open(app);
    if (rc == 0)
        rc = prefetches_init(app);
    if (rc == 0)
        router_use_tables(app_route_tables);
    if (rc != 0) {
        /* Closes the journal's uv handles; the writer thread stays until
         * the process exits, which it does at once. */
        persist_stop(app);
        keystore_free(app);
        metrics_unregister(app->metrics, app_gauges, app);
        layouts_free(app->layouts);
        app->layouts = NULL;
    }
    return rc;
}

void subsystems_reload(struct app *app)
{
    prefetches_reload(app);
}

void subsystems_stop(struct app *app)
{
    prefetches_stop(app);
    persist_stop(app);
}

void subsystems_free(struct app *app)
{
    prefetches_free(app);
    persist_free(app);
    keystore_free(app);
    metrics_unregister(app->metrics, app_gauges, app);
    layouts_free(app->layouts);
    app->layouts = NULL;
}
