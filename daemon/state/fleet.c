/*
 * The fleet directory's glue: one kvidx_directory_t for the process, the
 * liveness timer, the /metrics gauges and the change hook.
 *
 * Invariants: every change of the directory goes through the directory's
 * change callback, which forwards it to persistence's journal hook when one
 * is installed, so that the journal sees changes in the order they were
 * made; liveness uses the loop's monotonic clock (app_now_ms), never the
 * wall clock, so a clock step cannot expire the fleet.
 */
#include "state/fleet.h"

#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/err.h"

#include <stdlib.h>
#include <string.h>

static void fleet_gauges(void *ctx, struct buf *out)
{
    const struct fleet *f = ctx;
    kvidx_dir_stats_t st;
    kvidx_directory_stats(f->dir, &st);
    metrics_single(out, "kvidx_fleet_keys", "gauge", "Keys in the fleet directory.", st.num_keys);
    metrics_per_tier(out, "kvidx_fleet_placements", "Placements in the fleet directory, by tier.",
                     st.placements[0], st.placements[1]);
    metrics_per_tier(out, "kvidx_fleet_bytes", "Bytes the fleet's placements name, by tier.",
                     st.bytes[0], st.bytes[1]);
    metrics_single(out, "kvidx_fleet_instances_registered", "gauge",
                   "Instances registered through /instances.", st.num_registered);
    metrics_single(out, "kvidx_fleet_streams", "gauge", "Event streams (gate cursors).",
                   st.num_streams);
    metrics_single(out, "kvidx_fleet_token_bytes", "gauge",
                   "Bytes of token bindings (4 per token id plus a per-binding overhead).",
                   st.token_bytes);
    metrics_single(out, "kvidx_fleet_bindings_dropped_total", "counter",
                   "Token bindings dropped by directory_token_bytes.", st.bindings_dropped);
    metrics_single(out, "kvidx_fleet_instances_expired_total", "counter",
                   "Instances dropped after instance_timeout_s of silence.", f->expired_total);
    metrics_single(out, "kvidx_fleet_memory_bytes", "gauge",
                   "Bytes the fleet directory has allocated.", st.memory_bytes);
}

static void on_change(void *ctx, const kvidx_dir_change_t *c)
{
    struct fleet *f = ctx;
    if (f->journal)
        f->journal(f->journal_ctx, c);
}

int fleet_init(struct app *app)
{
    struct fleet *f = calloc(1, sizeof(*f));
    if (!f)
        return KVIDX_ENOMEM;
    kvidx_dir_options_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.token_bytes_cap = app->cfg.directory_token_bytes;
    int rc = kvidx_directory_new(&opts, &f->dir);
    if (rc != 0) {
        free(f);
        return rc;
    }
    rc = metrics_register(app->metrics, fleet_gauges, f);
    if (rc != 0) {
        kvidx_directory_free(f->dir);
        free(f);
        return rc;
    }
    f->app = app;
    kvidx_directory_on_change(f->dir, on_change, f);
    app->fleet = f;
    return 0;
}

void fleet_expire_now(struct app *app)
{
    struct fleet *f = app->fleet;
    size_t n = 0;
    kvidx_directory_expire(f->dir, app_now_ms(app), app->cfg.instance_timeout_s * 1000, &n);
    f->expired_total += n;
    if (n)
        log_info("fleet: %zu instance(s) dropped after %llu s of silence", n,
                 (unsigned long long)app->cfg.instance_timeout_s);
}

static void on_expiry(uv_timer_t *t)
{
    struct fleet *f = t->data;
    fleet_expire_now(f->app);
}

int fleet_start(struct app *app)
{
    struct fleet *f = app->fleet;
    int rc = uv_timer_init(app->loop, &f->expiry);
    if (rc != 0)
        return KVIDX_EINTERNAL;
    f->expiry.data = f;
    f->timer_open = 1;
    uint64_t every = app->cfg.health_check_interval_s * 1000;
    uv_timer_start(&f->expiry, on_expiry, every, every);
    uv_unref((uv_handle_t *)&f->expiry);
    return 0;
}

void fleet_reload(struct app *app)
{
    if (app->fleet)
        kvidx_directory_set_token_cap(app->fleet->dir, app->cfg.directory_token_bytes);
}

void fleet_stop(struct app *app)
{
    struct fleet *f = app->fleet;
    if (f && f->timer_open) {
        uv_close((uv_handle_t *)&f->expiry, NULL);
        f->timer_open = 0;
    }
}

void fleet_free(struct app *app)
{
    struct fleet *f = app->fleet;
    if (!f)
        return;
    metrics_unregister(app->metrics, fleet_gauges, f);
    kvidx_directory_on_change(f->dir, NULL, NULL);
    kvidx_directory_free(f->dir);
    free(f);
    app->fleet = NULL;
}
