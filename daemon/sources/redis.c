/*
 * The "redis://" source: one Redis/Valkey server (one database) followed by
 * one redis_node, whose scans are the sink's resynchronisations
 * (source_resync_begin ... source_resync_end) and whose changes are
 * source_put/source_del. Invariants: the password lives only in the parsed
 * URL (wiped at free), never in the name, stats, metrics or logs; a store
 * that cannot be reached leaves the keys as last reported (the source is
 * stale) until a scan replaces them.
 */
#include "sources/redis.h"

#include "sources/redis_node.h"
#include "sources/redis_url.h"
#include "state/sources.h"
#include "util/context.h"
#include "util/json_write.h"

#include "kvidx/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct redis_source {
    struct source base; /* first: the registry sees a struct source */
    struct redis_url url;
    struct redis_node node;
};

static struct redis_source *of(struct source *s)
{
    return (struct redis_source *)s;
}

/* ---- the node's owner: the sink ---- */

static void own_scan_begin(void *ctx, struct redis_node *n)
{
    struct redis_source *rs = ctx;
    (void)n;
    source_resync_begin(&rs->base);
}

static void own_scan_end(void *ctx, struct redis_node *n, uint64_t skipped)
{
    struct redis_source *rs = ctx;
    (void)n;
    rs->base.skipped = skipped;
    source_resync_end(&rs->base);
}

static int own_put(void *ctx, struct redis_node *n, const kvidx_key_t *keys, const uint64_t *sizes,
                   const char *const *names, const uint32_t *lens, size_t k)
{
    struct redis_source *rs = ctx;
    (void)n;
    (void)names;
    (void)lens;
    return source_put(&rs->base, keys, sizes, k);
}

static int own_del(void *ctx, struct redis_node *n, const kvidx_key_t *key, const char *name,
                   size_t len)
{
    struct redis_source *rs = ctx;
    (void)n;
    (void)name;
    (void)len;
    return source_del(&rs->base, key, 1);
}

static void own_state(void *ctx, struct redis_node *n)
{
    struct redis_source *rs = ctx;
    switch (n->state) {
    case RN_CONNECTING:
    case RN_SCANNING:
        source_set_state(&rs->base, SOURCE_SCANNING, NULL);
        break;
    case RN_LIVE:
        source_set_state(&rs->base, SOURCE_LIVE, "");
        break;
    case RN_RESCANNING:
        source_set_state(&rs->base, SOURCE_RESCANNING, NULL);
        break;
    case RN_RECONNECTING:
        source_set_state(&rs->base, SOURCE_RECONNECTING, n->last_error);
        break;
    case RN_STOPPED:
        break;
    }
}

static uint64_t own_held(void *ctx, const struct redis_node *n)
{
    const struct redis_source *rs = ctx;
    (void)n;
    return rs->base.keys;
}

/* ---- source_ops ---- */

static int op_start(struct source *s)
{
    redis_node_start(&of(s)->node);
    return 0;
}

static void op_stop(struct source *s)
{
    redis_node_stop(&of(s)->node, NULL);
}

static void op_free(struct source *s)
{
    struct redis_source *rs = of(s);
    redis_node_free(&rs->node);
    redis_url_wipe(&rs->url);
    free(rs);
}

static void op_stats(const struct source *s, struct jw *w)
{
    const struct redis_source *rs = (const struct redis_source *)s;
    jw_key(w, "db");
    jw_u64(w, rs->url.db);
    jw_key(w, "prefix");
    jw_strn(w, rs->url.prefix, rs->url.prefix_len);
    redis_node_stats(&rs->node, w);
}

static void op_metrics(const struct source *s, struct buf *out)
{
    redis_node_metrics(s->name, &((const struct redis_source *)s)->node, out, 0);
}

static const struct source_ops redis_ops = {
    .kind = "redis",
    .start = op_start,
    .stop = op_stop,
    .free = op_free,
    .stats = op_stats,
    .metrics = op_metrics,
};

int redis_source_create(struct app *app, const char *spec, struct source **out, char *err,
                        size_t errlen)
{
    struct redis_source *rs = calloc(1, sizeof(*rs));
    if (!rs)
        return KVIDX_ENOMEM;
    int rc = redis_url_parse(spec, &rs->url, err, errlen);
    if (rc == 0 && rs->url.cluster) {
        snprintf(err, errlen, "l2_source: a redis+cluster:// URL is not a redis:// one");
        rc = KVIDX_EINVAL;
    }
    if (rc != 0) {
        redis_url_wipe(&rs->url);
        free(rs);
        return rc;
    }
    rs->base.ops = &redis_ops;
    rs->base.app = app;
    snprintf(rs->base.name, sizeof(rs->base.name), "%s", rs->url.name);
    struct redis_node_cfg cfg = {
        .loop = app->loop,
        .url = &rs->url,
        .addr = rs->url.seeds[0],
        .cluster = 0,
        .rescan_ms = app->cfg.l2_source_rescan_s * 1000,
        .reconnect_max_ms = app->cfg.l2_source_reconnect_max_ms,
        .configure = app->cfg.l2_source_configure,
        .log_name = rs->base.name,
    };
    struct redis_node_owner owner = {
        .ctx = rs,
        .scan_begin = own_scan_begin,
        .scan_end = own_scan_end,
        .put = own_put,
        .del = own_del,
        .state = own_state,
        .moved = NULL,
        .held = own_held,
    };
    rc = redis_node_init(&rs->node, &cfg, &owner, 0);
    if (rc != 0) {
        redis_url_wipe(&rs->url);
        free(rs);
        return rc;
    }
    *out = &rs->base;
    return 0;
}
