/*
 * Operations endpoints (docs/operations.md): liveness, readiness, Prometheus metrics,
 * statistics and the limits in force.
 *
 *     GET /livez      200 {"status":"ok"} whenever the loop turns
 *     GET /readyz     200 {"status":"ready"}, or 503 not_ready until the
 *                     daemon is restored and listening, and while draining
 *     GET /metrics    Prometheus text 0.0.4
 *     GET /v1/stats   uptime, connections, requests, version, keys (JSON);
 *                     with tokens on, every salt's figures for admin, and
 *                     only its own salt's for a salt-bound token
 *     GET /v1/limits  every limit of §5 as configured now (JSON)
 *
 * Invariants: these handlers read state and change none; they never fail
 * except for out of memory (the body buffer's sticky error), which the
 * server turns into a 503. /v1/limits reads req->app->cfg at the time of
 * the request, so it shows what a SIGHUP reload put in force.
 */
#include "api/api.h"
#include "state/auth.h"
#include "util/context.h"
#include "state/keystore.h"
#include "util/json_write.h"
#include "net/http.h"
#include "kvidx/err.h"
#include "util/metrics.h"
#include "net/router.h"
#include "state/sources.h"

#include <stddef.h>

static int h_livez(const struct request *req, struct response *res)
{
    (void)req;
    buf_puts(&res->body, "{\"status\":\"ok\"}");
    res_json(res, 200);
    return 0;
}

static int h_readyz(const struct request *req, struct response *res)
{
    const struct app *app = req->app;
    if (!app->ready)
        return res_problem(res, KVIDX_ENOTREADY, "the daemon is starting", NULL, 0);
    if (app->draining)
        return res_problem(res, KVIDX_ENOTREADY, "the daemon is shutting down", NULL, 0);
    if (!sources_ready(app))
        return res_problem(res, KVIDX_ENOTREADY,
                           "the first full scan of an L2 source (l2_source) is not in yet", NULL,
                           0);
    buf_puts(&res->body, "{\"status\":\"ready\"}");
    res_json(res, 200);
    return 0;
}

static int h_metrics(const struct request *req, struct response *res)
{
    metrics_render(req->app->metrics, &res->body);
    res->status = 200;
    res->content_type = "text/plain; version=0.0.4; charset=utf-8";
    return 0;
}

static int h_stats(const struct request *req, struct response *res)
{
    const struct app *app = req->app;
    struct metrics_totals t;
    metrics_totals(app->metrics, &t);
    uint64_t now = app_now_ms(app);
    uint64_t up = now >= app->started_ms ? now - app->started_ms : 0;

    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "version");
    jw_str(&w, KVIDX_VERSION);
    jw_key(&w, "uptime_ms");
    jw_u64(&w, up);
    jw_key(&w, "ready");
    jw_bool(&w, app->ready && !app->draining && sources_ready(app));
    jw_key(&w, "connections");
    jw_obj_begin(&w);
    jw_key(&w, "open");
    jw_u64(&w, t.conn_open);
    jw_key(&w, "accepted");
    jw_u64(&w, t.conn_accepted);
    jw_key(&w, "rejected");
    jw_u64(&w, t.conn_rejected);
    jw_obj_end(&w);
    jw_key(&w, "requests");
    jw_obj_begin(&w);
    jw_key(&w, "total");
    jw_u64(&w, t.requests);
    jw_obj_end(&w);
    /* A salt-bound token sees its own salt's figures only. */
    const char *own;
    size_t own_len;
    if (app->keystore && !auth_bound_salt(req, &own, &own_len)) {
        kvidx_index_stats_t st;
        kvidx_index_stats(app->keystore->idx, &st);
        jw_key(&w, "keys");
        jw_obj_begin(&w);
        jw_key(&w, "total");
        jw_u64(&w, st.keys);
        jw_key(&w, "l1");
        jw_u64(&w, st.l1_keys);
        jw_key(&w, "l2");
        jw_u64(&w, st.l2_keys);
        jw_key(&w, "l2_source");
        jw_u64(&w, st.l2_source_keys);
        jw_obj_end(&w);
        jw_key(&w, "bytes");
        jw_obj_begin(&w);
        jw_key(&w, "l1");
        jw_u64(&w, st.l1_bytes);
        jw_key(&w, "l2");
        jw_u64(&w, st.l2_bytes);
        jw_key(&w, "l2_source");
        jw_u64(&w, st.l2_source_bytes);
        jw_obj_end(&w);
        jw_key(&w, "capacity_bytes");
        jw_obj_begin(&w);
        jw_key(&w, "l1");
        jw_u64(&w, st.l1_capacity_bytes);
        jw_key(&w, "l2");
        jw_u64(&w, st.l2_capacity_bytes);
        jw_obj_end(&w);
        jw_key(&w, "l1_loading");
        jw_u64(&w, st.l1_loading);
        jw_key(&w, "l1_pinned");
        jw_u64(&w, st.l1_pinned);
        jw_key(&w, "pins");
        jw_u64(&w, st.l1_pins);
        jw_key(&w, "evictions");
        jw_u64(&w, st.evictions);
        jw_key(&w, "namespaces");
        jw_u64(&w, st.namespaces);
    }
    auth_write_salt_stats(req, &w);
    jw_key(&w, "sources");
    sources_stats(app, &w);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

static int h_limits(const struct request *req, struct response *res)
{
    const struct config *c = &req->app->cfg;
    const struct {
        const char *name;
        uint64_t value;
    } rows[] = {
        {"max_body_bytes", c->max_body_bytes},
        {"max_total_body_bytes", c->max_total_body_bytes},
        {"max_keys_per_request", c->max_keys_per_request},
        {"max_header_bytes", c->max_header_bytes},
        {"max_uri_bytes", c->max_uri_bytes},
        {"max_json_depth", c->max_json_depth},
        {"header_timeout_ms", c->header_timeout_ms},
        {"idle_timeout_ms", c->idle_timeout_ms},
        {"max_connections", c->max_connections},
        {"max_conn_output_bytes", c->max_conn_output_bytes},
        {"page_token_ttl_s", c->page_token_ttl_s},
        {"default_lease_ms", c->default_lease_ms},
        {"max_lease_ms", c->max_lease_ms},
        {"handle_grace_ms", c->handle_grace_ms},
        {"load_timeout_ms", c->load_timeout_ms},
        {"l1_capacity_bytes", c->l1_capacity_bytes},
        {"l2_capacity_bytes", c->l2_capacity_bytes},
    };
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        jw_key(&w, rows[i].name);
        jw_u64(&w, rows[i].value);
    }
    /* Fixed by the protocol, not by configuration (docs/page_tokens.md,
     * docs/lookup_and_prefetch.md). */
    jw_key(&w, "max_page_size");
    jw_u64(&w, 5000);
    jw_key(&w, "max_wait_ms");
    jw_u64(&w, 30000);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

const struct route ops_routes[] = {
    {M_GET, "/livez", h_livez, "livez", ROUTE_OPEN},
    {M_GET, "/readyz", h_readyz, "readyz", ROUTE_OPEN},
    {M_GET, "/metrics", h_metrics, "metrics", ROUTE_READ},
    {M_GET, "/v1/stats", h_stats, "stats", ROUTE_READ},
    {M_GET, "/v1/limits", h_limits, "limits", ROUTE_READ},
    {0, NULL, NULL, NULL, 0},
};
