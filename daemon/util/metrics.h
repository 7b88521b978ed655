/*
 * Prometheus metrics (text format 0.0.4). Counters and histograms live in
 * plain structs updated on the loop thread; /metrics renders them.
 */
#ifndef KVIDXD_METRICS_H
#define KVIDXD_METRICS_H

#include "util/json_write.h"

#include <stdint.h>

struct metrics;

struct metrics *metrics_new(void); /* NULL on out of memory */
void metrics_free(struct metrics *m);
/* One finished request: route label (router's name, "unknown" when none),
 * HTTP status, and latency in seconds. */
void metrics_observe_request(struct metrics *m, const char *route, int status, double seconds);
/* One answered POST /v1/lookup: its hit_keys (leading run of found keys),
 * into the kvidx_lookup_hit_keys histogram. */
void metrics_observe_lookup(struct metrics *m, uint64_t hit_keys);
/* Connection gauge and counters. */
void metrics_conn_opened(struct metrics *m);
void metrics_conn_closed(struct metrics *m);
void metrics_conn_rejected(struct metrics *m);
/* Generic named counters/gauges other subsystems bump (e.g. "kvidx_evictions_total"). */
void metrics_add(struct metrics *m, const char *name, uint64_t delta);
/* Current value of a metrics_add() counter; 0 when never added. */
uint64_t metrics_get(const struct metrics *m, const char *name);
/* Totals for /v1/stats. */
struct metrics_totals {
    uint64_t requests;      /* every observed request */
    uint64_t conn_open;     /* open now */
    uint64_t conn_accepted; /* since start */
    uint64_t conn_rejected; /* refused past max_connections */
};
void metrics_totals(const struct metrics *m, struct metrics_totals *out);
/* Gauges are pulled from the subsystems that own them: each registers a
 * function that writes its families (with metrics_single/metrics_per_tier)
 * when /metrics is rendered, in registration order, and unregisters it
 * before its state goes away. metrics_register returns 0 or KVIDX_ENOMEM
 * (more than 16 sources); both do nothing when m is NULL. */
typedef void (*metrics_gauges_fn)(void *ctx, struct buf *out);
int metrics_register(struct metrics *m, metrics_gauges_fn fn, void *ctx);
void metrics_unregister(struct metrics *m, metrics_gauges_fn fn, void *ctx);
/* One unlabelled sample with its HELP and TYPE lines. */
void metrics_single(struct buf *out, const char *name, const char *type, const char *help,
                    uint64_t v);
/* A gauge with one sample per tier (tier="l1", tier="l2"). */
void metrics_per_tier(struct buf *out, const char *name, const char *help, uint64_t l1,
                      uint64_t l2);
/* Renders every metric: the ones counted here, then every registered source's. */
void metrics_render(struct metrics *m, struct buf *out);

#endif
