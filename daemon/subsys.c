/*
 * Start-up and shut-down of the data subsystems, and the list of every
 * route table. Order matters: layouts and the key store exist before the
 * prefetch manager, which pins keys in the store; shutdown runs backwards.
 */
#include "subsys.h"

#include "app.h"
#include "keystore.h"
#include "layouts.h"
#include "prefetches.h"

#include "kvidx/err.h"

const struct route *const api_tables[] = {
    ops_routes, layout_routes, key_routes, prefetch_routes, NULL,
};

int subsystems_init(struct app *app)
{
    app->layouts = layouts_new();
    if (!app->layouts)
        return KVIDX_ENOMEM;
    int rc = keystore_init(app);
    if (rc == 0)
        rc = prefetches_init(app);
    if (rc != 0) {
        keystore_free(app);
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
}

void subsystems_free(struct app *app)
{
    prefetches_free(app);
    keystore_free(app);
    layouts_free(app->layouts);
    app->layouts = NULL;
}
