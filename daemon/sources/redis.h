/*
 * The Redis/Valkey sources: "redis://..." (one server, redis.c) and
 * "redis+cluster://..." (every primary of a cluster, redis_cluster.c).
 * The composition root creates them from the l2_source setting and adds
 * them to the registry.
 */
#ifndef KVIDXD_REDIS_H
#define KVIDXD_REDIS_H

#include <stddef.h>

struct app;
struct source;

/* Parses spec (the URL) and creates the source, not started. 0 and *out,
 * or KVIDX_EINVAL (err says why, never with the password) or
 * KVIDX_ENOMEM. */
int redis_source_create(struct app *app, const char *spec, struct source **out, char *err,
                        size_t errlen);
int redis_cluster_source_create(struct app *app, const char *spec, struct source **out, char *err,
                                size_t errlen);

#endif
