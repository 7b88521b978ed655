/*
 * Sources: outside stores (an LMCache FS L2 directory, a Redis/Valkey
 * database or cluster) whose L2 copies kvidx indexes instead of being told
 * about each key. This header is the whole interface between a source
 * (daemon/sources/<kind>.c) and the key store:
 *
 *   - a source implements struct source_ops and reports what the store
 *     holds through the sink calls below, on the loop thread;
 *   - the key store keeps, per source, the set of keys it reported, marks
 *     their L2 copies as held by a source (not journaled, not deletable or
 *     resizable through the API), and forgets a key only when no tier and
 *     no source holds it any more;
 *   - the composition root (app.c) creates the sources named by the
 *     l2_source setting and adds them with sources_add; nothing here knows
 *     a kind by name.
 *
 * Sink rules: source_put and source_del apply at once, each call whole or
 * not at all (0 or KVIDX_ENOMEM). A resynchronisation is
 * source_resync_begin, any number of source_put calls (and source_del for
 * keys seen to go meanwhile), then source_resync_end, which removes in one
 * step every key of the source that was neither put since begin nor is
 * being added by a change that arrived meanwhile: no key that is still in
 * the store vanishes for a moment, and none is listed twice. A scan that
 * cannot finish ends with source_resync_abort instead: nothing is removed.
 */
#ifndef KVIDXD_SOURCES_H
#define KVIDXD_SOURCES_H

#include "util/json_write.h"

#include "kvidx/key.h"

#include <stddef.h>
#include <stdint.h>

struct app;
struct source;

#define SOURCES_MAX      16  /* sources in one daemon */
#define SOURCE_NAME_MAX  512 /* "fs:/srv/l2", "redis://u:***@host:6379/0?prefix=p" */
#define SOURCE_ERROR_MAX 256

enum source_state {
    SOURCE_SCANNING = 0, /* the first full scan is not in yet: /readyz 503 */
    SOURCE_LIVE,         /* following changes */
    SOURCE_RESCANNING,   /* a full rescan runs; the keys stay as last known */
    SOURCE_RECONNECTING, /* the store cannot be reached; keys stale, kept */
    SOURCE_FAILED,       /* gave up until it comes back; keys stale, kept */
};

struct source_ops {
    const char *kind; /* "fs", "redis", "redis+cluster" */
    /* Starts the first scan (off the loop or asynchronously); 0 or KVIDX_E*
     * (then the daemon does not start and the reason is logged).
     * KVIDX_EINVAL means the setting names a store that cannot be used at
     * all (a directory that does not exist, a malformed URL): the daemon
     * then exits 2, as for any invalid configuration. */
    int (*start)(struct source *s);
    /* Shutdown: closes every uv handle and thread it owns (before the last
     * uv_run). Idempotent. */
    void (*stop)(struct source *s);
    /* After the loop has ended: frees the source (and s itself). */
    void (*free)(struct source *s);
    /* Kind-specific figures for /v1/stats, written as members of the
     * source's object (the common ones are written by the key store). */
    void (*stats)(const struct source *s, struct jw *w);
    /* Kind-specific families for /metrics, each with its # HELP and # TYPE
     * lines, labelled with source_metric_labels(). Optional. When several
     * sources of one kind write the same family, the registry merges them
     * so that each family appears once. */
    void (*metrics)(const struct source *s, struct buf *out);
};

/* The part every source shares; a kind embeds it first in its own struct. */
struct source {
    const struct source_ops *ops;
    struct app *app;
    char name[SOURCE_NAME_MAX]; /* as shown: never a password */
    int id;                     /* 0..SOURCES_MAX-1, set by sources_add */
    enum source_state state;
    int stale;            /* keys are as last known, the store is not followed */
    uint64_t keys, bytes; /* what the source holds now (kept by the sink) */
    uint64_t skipped;     /* names or keys that do not parse, empty objects, ... */
    uint64_t resyncs;     /* full scans completed, the first one included */
    uint64_t scan_started_ms, last_scan_ms; /* duration of the last full scan */
    char last_error[SOURCE_ERROR_MAX];      /* "" when none; never a secret */
};

/* ---- the registry (state/sources.c) ---- */

/* Creates app->sources (empty). 0 or KVIDX_ENOMEM. */
int sources_init(struct app *app);
/* Adds s (its ops, app and name set) and gives it an id. 0, KVIDX_ENOMEM or
 * KVIDX_EINVAL (more than SOURCES_MAX). The registry owns s from then on. */
int sources_add(struct app *app, struct source *s);
/* Starts every source; 0 or the first failure. */
int sources_start(struct app *app);
/* 1 when every source has completed its first full scan (for /readyz). */
int sources_ready(const struct app *app);
void sources_stop(struct app *app);
void sources_free(struct app *app);
/* The sources that hold key (for GET /v1/keys/{canonical}: "l2_sources"):
 * up to max pointers into out; the number written. */
size_t sources_holding(const struct app *app, const kvidx_key_t *key, const struct source **out,
                       size_t max);
/* Every source's common and kind-specific figures as a JSON array ([]
 * without sources). */
void sources_stats(const struct app *app, struct jw *w);
/* Writes source="<name>" (escaped for the Prometheus text format), the
 * label every per-source sample carries. */
void source_metric_labels(struct buf *out, const struct source *s);

/* ---- the sink: what a source reports ---- */

/* Adds or resizes n keys held by s (sizes[i] >= 1). */
int source_put(struct source *s, const kvidx_key_t *keys, const uint64_t *sizes, size_t n);
/* Removes n keys from s (absent ones are ignored). */
int source_del(struct source *s, const kvidx_key_t *keys, size_t n);
/* A full resynchronisation; see the rules above. */
int source_resync_begin(struct source *s);
int source_resync_end(struct source *s);
/* Drops a resynchronisation that could not finish: every key stays as it
 * was (state and error are the source's to set). */
void source_resync_abort(struct source *s);
/* Sets the state (and the error text, NULL to keep it) as the source sees
 * itself; logs a change of state once. */
void source_set_state(struct source *s, enum source_state st, const char *error);

#endif
