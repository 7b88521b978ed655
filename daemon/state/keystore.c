/*
 * The key catalogue as the daemon holds it: the libkvidx index and the
 * page-token keyring, created with the configured capacities. It counts
 * keys forgotten by eviction and publishes the index's gauges on /metrics.
 * The handlers that serve it over HTTP are in api/keys.c.
 */
#include "state/keystore.h"

#include "util/context.h"
#include "util/metrics.h"

#include "kvidx/err.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

/* The catalogue's gauges for /metrics. */
static void keystore_gauges(void *ctx, struct buf *out)
{
    const struct keystore *ks = ctx;
    kvidx_index_stats_t st;
    kvidx_index_stats(ks->idx, &st);
    metrics_per_tier(out, "kvidx_keys", "Keys known, by tier (a key may be in both).", st.l1_keys,
                     st.l2_keys);
    metrics_single(out, "kvidx_keys_distinct", "gauge", "Distinct keys known in any tier.",
                   st.keys);
    metrics_per_tier(out, "kvidx_bytes", "Bytes of the objects named by keys, by tier.",
                     st.l1_bytes, st.l2_bytes);
    metrics_per_tier(out, "kvidx_capacity_bytes", "Configured capacity by tier (0 = unbounded).",
                     st.l1_capacity_bytes, st.l2_capacity_bytes);
    metrics_single(out, "kvidx_l1_loading", "gauge", "L1 copies reserved by a load in progress.",
                   st.l1_loading);
    metrics_single(out, "kvidx_l1_pinned", "gauge", "L1 copies with at least one pin.",
                   st.l1_pinned);
    metrics_single(out, "kvidx_pins", "gauge", "Pins (read locks) held on L1 copies.", st.l1_pins);
    metrics_single(out, "kvidx_evictions_total", "counter", "L1 copies evicted to make room.",
                   st.evictions);
    metrics_single(out, "kvidx_namespaces", "gauge", "Distinct (cache_salt, model_name) pairs.",
                   st.namespaces);
}

static void on_evict(void *ctx, const kvidx_key_t *key, uint64_t size_bytes, int forgotten)
{
    struct app *app = ctx;
    (void)key;
    (void)size_bytes;
    /* Evictions themselves are counted by the index (kvidx_index_stats). */
    if (app->metrics && forgotten)
        metrics_add(app->metrics, "kvidx_keys_forgotten_total", 1);
}

int keystore_init(struct app *app)
{
    struct keystore *ks = calloc(1, sizeof(*ks));
    if (!ks)
        return KVIDX_ENOMEM;
    kvidx_index_opts_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.l1_capacity_bytes = app->cfg.l1_capacity_bytes;
    opts.l2_capacity_bytes = app->cfg.l2_capacity_bytes;
    opts.on_evict = on_evict;
    opts.on_evict_ctx = app;
    int rc = kvidx_index_new(&opts, &ks->idx);
    if (rc != 0) {
        free(ks);
        return rc;
    }
    kvidx_token_secret_t secret;
    kvidx_token_keyring_init(&ks->keyring);
    rc = kvidx_token_secret_generate(&secret);
    if (rc == 0)
        rc = kvidx_token_keyring_rotate(&ks->keyring, &secret);
    sodium_memzero(&secret, sizeof(secret));
    if (rc != 0) {
        kvidx_index_free(ks->idx);
        free(ks);
        return rc;
    }
    rc = metrics_register(app->metrics, keystore_gauges, ks);
    if (rc != 0) {
        kvidx_token_keyring_clear(&ks->keyring);
        kvidx_index_free(ks->idx);
        free(ks);
        return rc;
    }
    ks->app = app;
    app->keystore = ks;
    return 0;
}

void keystore_free(struct app *app)
{
    struct keystore *ks = app->keystore;
    if (!ks)
        return;
    metrics_unregister(app->metrics, keystore_gauges, ks);
    kvidx_token_keyring_clear(&ks->keyring);
    kvidx_index_free(ks->idx);
    free(ks);
    app->keystore = NULL;
}
