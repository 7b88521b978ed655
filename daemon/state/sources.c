/*
 * The sources registry and the sink (state/sources.h): the outside stores
 * that report L2 copies, and what they report, applied to the key store.
 *
 * Each source added here gets a membership in the index of the same number
 * (kvidx/index_source.h), which holds the keys it reported; the sink calls
 * are thin wrappers that apply a report there and refresh the source's
 * counts from it. The index keeps a source's copies out of the change
 * callback, so nothing here reaches the journal. The registry answers
 * readiness (every source has completed a full scan), names the sources of
 * a key for GET, and writes the per-source figures for /v1/stats and
 * /metrics. Everything runs on the loop thread.
 *
 * Invariants: list[i]->id == i and the index membership i is list[i]'s;
 * a source's keys and bytes are the index's figures for its membership
 * after every sink call; stale is set from the moment a source reports it
 * cannot follow its store until a full resynchronisation completes.
 */
#include "state/sources.h"

#include "state/keystore.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/err.h"
#include "kvidx/index_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(SOURCES_MAX <= KVIDX_INDEX_SOURCES_MAX, "the index has a membership per source");

struct sources {
    struct app *app;
    struct source *list[SOURCES_MAX];
    size_t n;
};

static const char *const state_names[] = {"scanning", "live", "rescanning", "reconnecting",
                                          "failed"};
#define N_STATES (sizeof(state_names) / sizeof(state_names[0]))

static uint64_t mono_ms(void)
{
    return uv_hrtime() / 1000000u;
}

static kvidx_index_t *idx_of(const struct source *s)
{
    return s->app->keystore->idx;
}

/* Refreshes the source's counts from its membership in the index. */
static void refresh(struct source *s)
{
    kvidx_source_stats_t st;
    if (kvidx_index_source_stats(idx_of(s), (unsigned)s->id, &st) == 0) {
        s->keys = st.keys;
        s->bytes = st.bytes;
    }
}

/* ---- /metrics ---- */

void source_metric_labels(struct buf *out, const struct source *s)
{
    buf_puts(out, "source=\"");
    for (const char *p = s->name; *p; p++) {
        if (*p == '\\' || *p == '"')
            buf_putc(out, '\\');
        if (*p == '\n') {
            buf_puts(out, "\\n");
            continue;
        }
        buf_putc(out, *p);
    }
    buf_putc(out, '"');
}

/* A gauge or counter family with one sample per source. */
static void family_per_source(const struct sources *ss, struct buf *out, const char *name,
                              const char *type, const char *help,
                              uint64_t (*value)(const struct source *))
{
    buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (size_t i = 0; i < ss->n; i++) {
        buf_printf(out, "%s{", name);
        source_metric_labels(out, ss->list[i]);
        buf_printf(out, "} %llu\n", (unsigned long long)value(ss->list[i]));
    }
}

static uint64_t v_stale(const struct source *s)
{
    return (uint64_t)(s->stale != 0);
}
static uint64_t v_keys(const struct source *s)
{
    return s->keys;
}
static uint64_t v_bytes(const struct source *s)
{
    return s->bytes;
}
static uint64_t v_skipped(const struct source *s)
{
    return s->skipped;
}
static uint64_t v_scans(const struct source *s)
{
    return s->resyncs;
}
static uint64_t v_rescans(const struct source *s)
{
    return s->resyncs ? s->resyncs - 1 : 0;
}

/* The kind-specific families of every source, merged so that a family two
 * sources of one kind both write appears once: each source's text is
 * split into families at its # HELP / # TYPE lines and the samples are
 * gathered under the first source's header. */
struct family {
    char name[128];
    struct buf head, samples;
};

static struct family *family_find(struct family **fams, size_t *n, size_t *cap, const char *name,
                                  size_t len)
{
    for (size_t i = 0; i < *n; i++)
        if (strlen((*fams)[i].name) == len && memcmp((*fams)[i].name, name, len) == 0)
            return &(*fams)[i];
    if (len >= sizeof((*fams)[0].name))
        return NULL;
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        struct family *a = realloc(*fams, nc * sizeof(*a));
        if (!a)
            return NULL;
        *fams = a;
        *cap = nc;
    }
    struct family *f = &(*fams)[(*n)++];
    memcpy(f->name, name, len);
    f->name[len] = '\0';
    buf_init(&f->head);
    buf_init(&f->samples);
    return f;
}

static void merge_kind_metrics(const struct sources *ss, struct buf *out)
{
    struct family *fams = NULL;
    size_t n = 0, cap = 0;
    struct buf one;
    buf_init(&one);
    for (size_t i = 0; i < ss->n; i++) {
        const struct source *s = ss->list[i];
        if (!s->ops->metrics)
            continue;
        buf_reset(&one);
        s->ops->metrics(s, &one);
        struct family *cur = NULL;
        size_t seen_from = n; /* families this source created */
        for (size_t at = 0; at < one.len;) {
            const char *line = one.data + at;
            const char *nl = memchr(line, '\n', one.len - at);
            size_t len = nl ? (size_t)(nl - line) + 1 : one.len - at;
            at += len;
            if (len > 7 && (memcmp(line, "# HELP ", 7) == 0 || memcmp(line, "# TYPE ", 7) == 0)) {
                const char *nm = line + 7;
                size_t nlen = 0;
                while (7 + nlen < len && nm[nlen] != ' ' && nm[nlen] != '\n')
                    nlen++;
                cur = family_find(&fams, &n, &cap, nm, nlen);
                /* Only the source that created the family writes its header. */
                if (cur && (size_t)(cur - fams) >= seen_from)
                    buf_append(&cur->head, line, len);
                continue;
            }
            if (cur)
                buf_append(&cur->samples, line, len);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (fams[i].head.len)
            buf_append(out, fams[i].head.data, fams[i].head.len);
        if (fams[i].samples.len)
            buf_append(out, fams[i].samples.data, fams[i].samples.len);
        buf_free(&fams[i].head);
        buf_free(&fams[i].samples);
    }
    free(fams);
    buf_free(&one);
}

static void sources_gauges(void *ctx, struct buf *out)
{
    const struct sources *ss = ctx;
    if (!ss->n)
        return;
    buf_puts(out, "# HELP kvidx_source_state State of each L2 source: 1 for the one it is in.\n"
                  "# TYPE kvidx_source_state gauge\n");
    for (size_t i = 0; i < ss->n; i++) {
        for (size_t st = 0; st < N_STATES; st++) {
            buf_puts(out, "kvidx_source_state{");
            source_metric_labels(out, ss->list[i]);
            buf_printf(out, ",state=\"%s\"} %d\n", state_names[st],
                       (size_t)ss->list[i]->state == st);
        }
    }
    family_per_source(ss, out, "kvidx_source_stale", "gauge",
                      "1 while the source's keys are as last known, its store not followed.",
                      v_stale);
    family_per_source(ss, out, "kvidx_source_keys", "gauge", "Keys the source holds now.", v_keys);
    family_per_source(ss, out, "kvidx_source_bytes", "gauge",
                      "Bytes of the objects the source holds now.", v_bytes);
    family_per_source(ss, out, "kvidx_source_skipped", "gauge",
                      "Entries skipped (names that do not parse, empty objects, ...) by the "
                      "last full scan and the changes since.",
                      v_skipped);
    family_per_source(ss, out, "kvidx_source_scans_total", "counter",
                      "Full scans completed, the first one included.", v_scans);
    family_per_source(ss, out, "kvidx_source_rescans_total", "counter",
                      "Full scans completed after the first one.", v_rescans);
    buf_puts(out, "# HELP kvidx_source_scan_duration_seconds Duration of the last completed "
                  "full scan.\n# TYPE kvidx_source_scan_duration_seconds gauge\n");
    for (size_t i = 0; i < ss->n; i++) {
        buf_puts(out, "kvidx_source_scan_duration_seconds{");
        source_metric_labels(out, ss->list[i]);
        buf_printf(out, "} %.3f\n", (double)ss->list[i]->last_scan_ms / 1000.0);
    }
    buf_puts(out, "# HELP kvidx_source_last_error_info The source's last error, as a label "
                  "(\"\" when none).\n# TYPE kvidx_source_last_error_info gauge\n");
    for (size_t i = 0; i < ss->n; i++) {
        const struct source *s = ss->list[i];
        buf_puts(out, "kvidx_source_last_error_info{");
        source_metric_labels(out, s);
        buf_puts(out, ",error=\"");
        for (const char *p = s->last_error; *p; p++) {
            if (*p == '\\' || *p == '"')
                buf_putc(out, '\\');
            buf_putc(out, *p == '\n' ? ' ' : *p);
        }
        buf_puts(out, "\"} 1\n");
    }
    merge_kind_metrics(ss, out);
}

/* ---- the registry ---- */

int sources_init(struct app *app)
{
    struct sources *ss = calloc(1, sizeof(*ss));
    if (!ss)
        return KVIDX_ENOMEM;
    ss->app = app;
    int rc = metrics_register(app->metrics, sources_gauges, ss);
    if (rc != 0) {
        free(ss);
        return rc;
    }
    app->sources = ss;
    return 0;
}

int sources_add(struct app *app, struct source *s)
{
    struct sources *ss = app->sources;
    if (!ss || ss->n == SOURCES_MAX)
        return KVIDX_EINVAL;
    unsigned id;
    int rc = kvidx_index_source_add(app->keystore->idx, &id);
    if (rc != 0)
        return rc == KVIDX_ECAPACITY ? KVIDX_EINVAL : rc;
    if (id != ss->n)
        return KVIDX_EINTERNAL; /* the index has memberships the registry does not know */
    s->id = (int)id;
    s->app = app;
    s->state = SOURCE_SCANNING;
    ss->list[ss->n++] = s;
    return 0;
}

int sources_start(struct app *app)
{
    struct sources *ss = app->sources;
    for (size_t i = 0; ss && i < ss->n; i++) {
        int rc = ss->list[i]->ops->start(ss->list[i]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int sources_ready(const struct app *app)
{
    const struct sources *ss = app->sources;
    for (size_t i = 0; ss && i < ss->n; i++)
        if (ss->list[i]->resyncs == 0)
            return 0;
    return 1;
}

void sources_stop(struct app *app)
{
    struct sources *ss = app->sources;
    for (size_t i = 0; ss && i < ss->n; i++)
        ss->list[i]->ops->stop(ss->list[i]);
}

void sources_free(struct app *app)
{
    struct sources *ss = app->sources;
    if (!ss)
        return;
    metrics_unregister(app->metrics, sources_gauges, ss);
    for (size_t i = 0; i < ss->n; i++)
        ss->list[i]->ops->free(ss->list[i]);
    free(ss);
    app->sources = NULL;
}

size_t sources_holding(const struct app *app, const kvidx_key_t *key, const struct source **out,
                       size_t max)
{
    const struct sources *ss = app->sources;
    if (!ss || !ss->n || !app->keystore)
        return 0;
    kvidx_ref_t ref;
    if (kvidx_index_find(app->keystore->idx, key, &ref) != 0)
        return 0;
    uint32_t mask = kvidx_index_source_mask(app->keystore->idx, ref);
    size_t n = 0;
    for (size_t i = 0; i < ss->n && n < max; i++)
        if (mask & (UINT32_C(1) << i))
            out[n++] = ss->list[i];
    return n;
}

void sources_stats(const struct app *app, struct jw *w)
{
    const struct sources *ss = app->sources;
    jw_arr_begin(w);
    for (size_t i = 0; ss && i < ss->n; i++) {
        const struct source *s = ss->list[i];
        jw_obj_begin(w);
        jw_key(w, "name");
        jw_str(w, s->name);
        jw_key(w, "kind");
        jw_str(w, s->ops->kind);
        jw_key(w, "state");
        jw_str(w, (size_t)s->state < N_STATES ? state_names[s->state] : "unknown");
        jw_key(w, "ready");
        jw_bool(w, s->resyncs > 0);
        jw_key(w, "stale");
        jw_bool(w, s->stale);
        jw_key(w, "keys");
        jw_u64(w, s->keys);
        jw_key(w, "bytes");
        jw_u64(w, s->bytes);
        jw_key(w, "skipped");
        jw_u64(w, s->skipped);
        jw_key(w, "scans");
        jw_u64(w, s->resyncs);
        jw_key(w, "rescans");
        jw_u64(w, s->resyncs ? s->resyncs - 1 : 0);
        jw_key(w, "scan_duration_ms");
        jw_u64(w, s->last_scan_ms);
        jw_key(w, "last_error");
        jw_str(w, s->last_error);
        if (s->ops->stats)
            s->ops->stats(s, w);
        jw_obj_end(w);
    }
    jw_arr_end(w);
}

/* ---- the sink ---- */

int source_put(struct source *s, const kvidx_key_t *keys, const uint64_t *sizes, size_t n)
{
    int rc = kvidx_index_source_put(idx_of(s), (unsigned)s->id, keys, sizes, n, NULL);
    refresh(s);
    return rc;
}

int source_del(struct source *s, const kvidx_key_t *keys, size_t n)
{
    int rc = kvidx_index_source_del(idx_of(s), (unsigned)s->id, keys, n, NULL);
    refresh(s);
    return rc;
}

int source_resync_begin(struct source *s)
{
    s->scan_started_ms = mono_ms();
    return kvidx_index_source_resync_begin(idx_of(s), (unsigned)s->id);
}

int source_resync_end(struct source *s)
{
    uint64_t removed = 0;
    int rc = kvidx_index_source_resync_end(idx_of(s), (unsigned)s->id, &removed);
    if (rc != 0)
        return rc;
    refresh(s);
    uint64_t now = mono_ms();
    s->last_scan_ms = now >= s->scan_started_ms ? now - s->scan_started_ms : 0;
    s->resyncs++;
    s->stale = 0;
    log_info("l2_source %s: full scan %llu done in %llu ms: %llu keys, %llu bytes, %llu skipped, "
             "%llu gone since the last one",
             s->name, (unsigned long long)s->resyncs, (unsigned long long)s->last_scan_ms,
             (unsigned long long)s->keys, (unsigned long long)s->bytes,
             (unsigned long long)s->skipped, (unsigned long long)removed);
    return 0;
}

void source_resync_abort(struct source *s)
{
    kvidx_index_source_resync_abort(idx_of(s), (unsigned)s->id);
}

void source_set_state(struct source *s, enum source_state st, const char *error)
{
    if (error)
        snprintf(s->last_error, sizeof(s->last_error), "%s", error);
    if (st == SOURCE_RECONNECTING || st == SOURCE_FAILED)
        s->stale = 1;
    if (s->state == st)
        return;
    const char *from = (size_t)s->state < N_STATES ? state_names[s->state] : "?";
    const char *to = (size_t)st < N_STATES ? state_names[st] : "?";
    s->state = st;
    if (st == SOURCE_FAILED || st == SOURCE_RECONNECTING)
        log_warn("l2_source %s: %s -> %s%s%s", s->name, from, to, s->last_error[0] ? ": " : "",
                 s->last_error);
    else
        log_info("l2_source %s: %s -> %s", s->name, from, to);
}
