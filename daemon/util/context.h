/*
 * The daemon's state, one instance, reachable from every request as
 * req->app. Each subsystem owns its struct; app only ties them together.
 */
#ifndef KVIDXD_APP_H
#define KVIDXD_APP_H

#include "util/config.h"

#include <stdint.h>
#include <uv.h>

struct server;
struct metrics;
struct keystore;   /* api_keys.c / api_list.c: the index, layouts, page-token secret */
struct prefetches; /* api_prefetch.c: handles, leases, loads */
struct layouts;    /* api_layouts.c: MemoryLayoutDesc registry */

struct app {
    struct config cfg;
    char config_path[1024]; /* "" when none */
    uv_loop_t *loop;
    struct server *server;
    struct metrics *metrics;
    struct keystore *keystore;
    struct prefetches *prefetches;
    struct layouts *layouts;
    struct persist *persist; /* persist.c: journal and snapshot; NULL without data_dir */
    int ready;               /* restored and listening: /readyz 200 */
    int draining;            /* shutting down: /readyz 503 */
    uint64_t started_ms;
};

/* Monotonic and wall clocks in ms (tests use the loop's clock). */
uint64_t app_now_ms(const struct app *app);
uint64_t app_wall_ms(void);

#endif
