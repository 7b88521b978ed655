/*
 * Start-up and shut-down of the data subsystems, and the list of every
 * route table. Order matters: layouts and the key store exist before the
 * prefetch manager, which pins keys in the store; persistence restores the
 * store and layouts before the prefetch manager starts; shutdown runs
 * backwards (the journal is flushed and fsynced before the store is freed).
 */
#include "app.h"

#include "util/context.h"
#include "state/auth.h"
#include "state/fleet.h"
#include "state/keystore.h"
#include "state/layouts.h"
#include "state/persist/persist.h"
#include "state/prefetches.h"
#include "state/sources.h"
#include "sources/fs.h"
#include "sources/redis.h"
#include "api/api.h"
#include "util/metrics.h"

#include "util/log.h"

#include "kvidx/err.h"

#include <string.h>

const struct route *const app_route_tables[] = {
    ops_routes,  layout_routes, key_routes,       list_routes,      lookup_routes, prefetch_routes,
    load_routes, events_routes, directory_routes, instances_routes, NULL,
};

/* The daemon's own gauge: readiness, as /readyz answers it. */
static void app_gauges(void *ctx, struct buf *out)
{
    const struct app *app = ctx;
    metrics_single(out, "kvidx_ready", "gauge",
                   "1 when /readyz answers 200 (restored, not draining).",
                   app->ready && !app->draining && sources_ready(app) ? 1 : 0);
}

/* The kinds of l2_source, by the prefix of a source's text: the one place
 * that knows them. A kind without a create function is not built yet. */
typedef int (*source_create_fn)(struct app *app, const char *spec, size_t len, struct source **out);
typedef int (*url_source_create_fn)(struct app *app, const char *spec, struct source **out,
                                    char *err, size_t errlen);

/* The Redis kinds parse a NUL-terminated URL and say why one is refused:
 * the text is copied out of the setting, the reason logged (it never holds
 * the password), and the copy, which may hold it, wiped. */
static int url_source_create(url_source_create_fn create, struct app *app, const char *spec,
                             size_t len, struct source **out)
{
    char url[SOURCE_NAME_MAX], err[256] = "";
    *out = NULL;
    if (len >= sizeof(url)) {
        log_error("l2_source: a source is longer than %zu bytes", sizeof(url) - 1);
        return KVIDX_EINVAL;
    }
    memcpy(url, spec, len);
    url[len] = '\0';
    int rc = create(app, url, out, err, sizeof(err));
    volatile char *v = url;
    for (size_t i = 0; i < sizeof(url); i++)
        v[i] = 0;
    if (rc != 0) {
        *out = NULL;
        if (err[0])
            log_error("%s", err);
        else
            log_error("l2_source: a Redis source cannot be created: %s", kvidx_err_name(rc));
    }
    return rc;
}

static int redis_create(struct app *app, const char *spec, size_t len, struct source **out)
{
    return url_source_create(redis_source_create, app, spec, len, out);
}

static int redis_cluster_create(struct app *app, const char *spec, size_t len, struct source **out)
{
    return url_source_create(redis_cluster_source_create, app, spec, len, out);
}

static const struct {
    const char *prefix;
    source_create_fn create;
} source_kinds[] = {
    {"fs:", fs_source_create},
    {"redis://", redis_create},                 /* sources/redis.c: one database */
    {"redis+cluster://", redis_cluster_create}, /* sources/redis_cluster.c: a cluster */
};

/* Creates and starts the sources l2_source names, after the restore (a
 * source's keys are never restored: they come from its first scan). A
 * setting naming something unusable sets the exit status 2. */
static int sources_open(struct app *app)
{
    const char *p = app->cfg.l2_source;
    p += strspn(p, " \t");
    if (!*p)
        return 0;
    int rc = sources_init(app);
    while (rc == 0 && *p) {
        size_t len = strcspn(p, " \t");
        size_t k = 0, nk = sizeof(source_kinds) / sizeof(source_kinds[0]);
        while (k < nk && strncmp(p, source_kinds[k].prefix, strlen(source_kinds[k].prefix)) != 0)
            k++;
        struct source *s = NULL;
        if (k == nk || !source_kinds[k].create) {
            log_error("l2_source: %s sources are not available in this build",
                      k == nk ? "this kind of" : source_kinds[k].prefix);
            rc = KVIDX_EINVAL;
        } else if ((rc = source_kinds[k].create(app, p, len, &s)) == 0 &&
                   (rc = sources_add(app, s)) != 0) {
            s->ops->free(s);
        }
        p += len;
        p += strspn(p, " \t");
    }
    if (rc == 0)
        rc = sources_start(app);
    if (rc == KVIDX_EINVAL)
        app->exit_status = 2;
    return rc;
}

int subsystems_init(struct app *app)
{
    app->layouts = layouts_new();
    if (!app->layouts)
        return KVIDX_ENOMEM;
    int rc = metrics_register(app->metrics, app_gauges, app);
    if (rc == 0)
        rc = keystore_init(app);
    if (rc == 0)
        rc = fleet_init(app);
    /* Restore before the prefetch manager and before the server exists:
     * /readyz cannot answer 200 and READY=1 is not sent until it is done. */
    if (rc == 0)
        rc = persist_open(app);
    /* The tokens file's quotas apply to what was restored (replaying the
     * journal is never refused for a quota). A file that cannot be used
     * is a configuration error: exit status 2. */
    if (rc == 0 && (rc = auth_init(app)) == KVIDX_EINVAL)
        app->exit_status = 2;
    if (rc == 0)
        rc = sources_open(app);
    if (rc == 0)
        rc = prefetches_init(app);
    if (rc == 0)
        rc = fleet_start(app);
    if (rc == 0)
        router_use_tables(app_route_tables);
    if (rc != 0) {
        /* Closes the journal's uv handles; the writer thread stays until
         * the process exits, which it does at once. */
        sources_stop(app);
        sources_free(app);
        persist_stop(app);
        fleet_stop(app);
        fleet_free(app);
        auth_free(app);
        keystore_free(app);
        metrics_unregister(app->metrics, app_gauges, app);
        layouts_free(app->layouts);
        app->layouts = NULL;
    }
    return rc;
}

void subsystems_reload(struct app *app)
{
    auth_reload(app);
    prefetches_reload(app);
    fleet_reload(app);
}

void subsystems_stop(struct app *app)
{
    prefetches_stop(app);
    sources_stop(app);
    fleet_stop(app);
    persist_stop(app);
}

void subsystems_free(struct app *app)
{
    prefetches_free(app);
    sources_free(app);
    persist_free(app);
    fleet_free(app);
    auth_free(app);
    keystore_free(app);
    metrics_unregister(app->metrics, app_gauges, app);
    layouts_free(app->layouts);
    app->layouts = NULL;
}
