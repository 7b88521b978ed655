/*
 * The route tables of the HTTP API, one per resource file in api/. Each
 * table ends with a route whose pattern is NULL. The composition root
 * (app.c) lists them for the router; nothing below api/ knows them.
 */
#ifndef KVIDXD_API_H
#define KVIDXD_API_H

#include "net/router.h"

extern const struct route ops_routes[];    /* ops.c: /livez /readyz /metrics /v1/stats /v1/limits */
extern const struct route layout_routes[]; /* layouts.c: /v1/layouts */
extern const struct route key_routes[];    /* keys.c: PUT/DELETE /v1/keys, /v1/keys/{canonical} */
extern const struct route list_routes[];   /* list.c: GET /v1/keys */
extern const struct route lookup_routes[]; /* lookup.c: /v1/lookup */
extern const struct route prefetch_routes[];  /* prefetch.c: /v1/prefetches */
extern const struct route load_routes[];      /* loads.c: /v1/loads */
extern const struct route events_routes[];    /* events.c: POST /events */
extern const struct route directory_routes[]; /* directory.c: the /directory routes */
extern const struct route instances_routes[]; /* instances.c: /instances, /healthz */

#endif
