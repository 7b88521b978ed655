/*
 * The daemon's runtime context, one instance, reachable from every request
 * as req->app. Each subsystem owns its struct, named here only by a pointer;
 * the composition root (app.c) creates them and ties them together.
 */
#ifndef KVIDXD_CONTEXT_H
#define KVIDXD_CONTEXT_H

#include "util/config.h"

#include <stdint.h>
#include <uv.h>

struct server;
struct metrics;
struct keystore;   /* state/keystore.c: the index and the page-token keyring */
struct prefetches; /* state/prefetches.c: handles, leases, loads (lib's prefetch table) */
struct layouts;    /* state/layouts.c: MemoryLayoutDesc registry */
struct persist;    /* state/persist/: journal and snapshots */
struct sources;    /* state/sources.c: the outside stores that report L2 copies */
struct auth;       /* state/auth.c: bearer tokens, the access check, salt quotas */
struct fleet;      /* state/fleet.c: the fleet directory (LMCache coordinator surface) */

struct app {
    struct config cfg;
    char config_path[1024]; /* "" when none */
    uv_loop_t *loop;
    struct server *server;
    struct metrics *metrics;
    struct keystore *keystore;
    struct prefetches *prefetches;
    struct layouts *layouts;
    struct persist *persist; /* NULL without data_dir */
    struct sources *sources; /* NULL without l2_source */
    struct auth *auth;       /* bearer tokens; its tokens are NULL when auth is off */
    struct fleet *fleet;
    int ready;    /* restored and listening: /readyz 200 */
    int draining; /* shutting down: /readyz 503 */
    uint64_t started_ms;
    /* Set by a subsystem whose start failed: 2 for a setting naming
     * something unusable (main's exit status), else 0. */
    int exit_status;
};

/* Monotonic and wall clocks in ms (tests use the loop's clock). */
uint64_t app_now_ms(const struct app *app);
uint64_t app_wall_ms(void);

#endif
