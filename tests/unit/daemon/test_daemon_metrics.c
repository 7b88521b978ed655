/*
 * Prometheus exposition of daemon/metrics.c, read back by a small parser of
 * text format 0.0.4: every family has one HELP and one TYPE line before its
 * samples, samples of a family are contiguous, counters end in _total,
 * histogram buckets rise with le, are cumulative, and +Inf equals _count.
 */
#include "util/metrics.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAM 128

struct fam {
    char name[96];
    char type[16];
    int help, samples;
};

struct parsed {
    struct fam fams[MAX_FAM];
    int n;
};

static struct fam *fam_find(struct parsed *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->fams[i].name, name) == 0)
            return &p->fams[i];
    return NULL;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* The family a sample belongs to: a histogram's _bucket/_sum/_count go to
 * the histogram's name. */
static struct fam *sample_family(struct parsed *p, const char *sample)
{
    struct fam *f = fam_find(p, sample);
    if (f)
        return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        if (!ends_with(sample, suffixes[i]))
            continue;
        char base[96];
        snprintf(base, sizeof(base), "%.*s", (int)(strlen(sample) - strlen(suffixes[i])), sample);
        f = fam_find(p, base);
        if (f && strcmp(f->type, "histogram") == 0)
            return f;
    }
    return NULL;
}

/* Parses text; asserts the structural rules; returns the families. */
static void parse(const char *text, struct parsed *p)
{
    memset(p, 0, sizeof(*p));
    struct fam *current = NULL;
    const char *line = text;
    cr_assert(strlen(text) > 0 && text[strlen(text) - 1] == '\n', "ends with a newline");
    while (*line) {
        const char *nl = strchr(line, '\n');
        cr_assert_not_null(nl);
        char l[512];
        snprintf(l, sizeof(l), "%.*s", (int)(nl - line), line);
        line = nl + 1;
        cr_assert(l[0] != '\0', "no empty lines");
        char name[96], rest[400];
        if (strncmp(l, "# HELP ", 7) == 0) {
            cr_assert_eq(sscanf(l + 7, "%95s %399[^\n]", name, rest), 2, "HELP text: %s", l);
            struct fam *f = fam_find(p, name);
            cr_assert_null(f, "second HELP for %s", name);
            cr_assert_lt(p->n, MAX_FAM);
            f = &p->fams[p->n++];
            snprintf(f->name, sizeof(f->name), "%s", name);
            f->help = 1;
            current = f;
        } else if (strncmp(l, "# TYPE ", 7) == 0) {
            char type[16];
            cr_assert_eq(sscanf(l + 7, "%95s %15s", name, type), 2);
            cr_assert(current && strcmp(current->name, name) == 0, "TYPE %s right after its HELP",
                      name);
            cr_assert_eq(current->type[0], '\0', "second TYPE for %s", name);
            cr_assert(current->samples == 0);
            cr_assert(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                          strcmp(type, "histogram") == 0,
                      "type %s", type);
            snprintf(current->type, sizeof(current->type), "%s", type);
        } else {
            cr_assert_neq(l[0], '#', "unknown comment line %s", l);
            size_t n = strcspn(l, "{ ");
            snprintf(name, sizeof(name), "%.*s", (int)n, l);
            struct fam *f = sample_family(p, name);
            cr_assert_not_null(f, "sample %s before its HELP/TYPE", name);
            cr_assert_eq(f, current, "samples of %s are not contiguous", f->name);
            cr_assert(f->type[0], "sample %s before TYPE", name);
            const char *v = l + n;
            if (*v == '{') {
                v = strchr(v, '}');
                cr_assert_not_null(v, "unclosed labels: %s", l);
                v++;
            }
            cr_assert_eq(*v, ' ', "%s", l);
            char *end;
            strtod(v + 1, &end);
            cr_assert(end != v + 1 && *end == '\0', "value of %s", l);
            f->samples++;
        }
    }
    for (int i = 0; i < p->n; i++) {
        struct fam *f = &p->fams[i];
        cr_assert(f->type[0], "%s has no TYPE", f->name);
        if (strcmp(f->type, "counter") == 0)
            cr_assert(ends_with(f->name, "_total"), "counter %s must end in _total", f->name);
        else
            cr_assert(!ends_with(f->name, "_total"), "%s %s ends in _total", f->type, f->name);
    }
}

/* Value of the one sample whose line starts with `prefix` + ' '. */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *l = text; *l; l = strchr(l, '\n') + 1) {
        if (strncmp(l, prefix, n) == 0 && l[n] == ' ')
            return strtod(l + n + 1, NULL);
    }
    cr_assert_fail("no sample %s", prefix);
    return NAN;
}

static int has_line_prefix(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *l = text; *l; l = strchr(l, '\n') + 1)
        if (strncmp(l, prefix, n) == 0)
            return 1;
    return 0;
}

/* Checks every histogram series: le ascending, cumulative, +Inf == count. */
static void check_histogram(const char *text, const char *fam, const char *labels)
{
    char pre[256];
    snprintf(pre, sizeof(pre), "%s_bucket{%s,le=\"", fam, labels);
    size_t n = strlen(pre);
    double last_le = -1, last = -1, inf = -1;
    int buckets = 0;
    for (const char *l = text; *l; l = strchr(l, '\n') + 1) {
        if (strncmp(l, pre, n) != 0)
            continue;
        double le = strncmp(l + n, "+Inf\"", 5) == 0 ? INFINITY : strtod(l + n, NULL);
        const char *v = strchr(l, '}') + 2;
        double c = strtod(v, NULL);
        cr_assert_gt(le, last_le, "le rises");
        cr_assert_geq(c, last, "buckets are cumulative");
        last_le = le;
        last = c;
        if (isinf(le))
            inf = c;
        buckets++;
    }
    cr_assert_eq(buckets, 16, "%s{%s}: 15 bounds and +Inf", fam, labels);
    char cnt[256];
    snprintf(cnt, sizeof(cnt), "%s_count{%s}", fam, labels);
    cr_assert_eq(inf, sample(text, cnt), "+Inf equals _count");
}

static char *render(struct metrics *m)
{
    struct buf b;
    buf_init(&b);
    metrics_render(m, &b);
    cr_assert(!b.failed);
    return b.data;
}

Test(metrics, empty_is_valid)
{
    struct metrics *m = metrics_new();
    cr_assert_not_null(m);
    char *t = render(m);
    struct parsed p;
    parse(t, &p);
    cr_assert_not_null(fam_find(&p, "kvidx_http_requests_total"));
    cr_assert_not_null(fam_find(&p, "kvidx_http_request_duration_seconds"));
    cr_assert_not_null(fam_find(&p, "kvidx_connections_open"));
    cr_assert_not_null(fam_find(&p, "kvidx_connections_accepted_total"));
    cr_assert_not_null(fam_find(&p, "kvidx_connections_rejected_total"));
    cr_assert_not_null(fam_find(&p, "kvidx_up"));
    cr_assert_not_null(fam_find(&p, "process_start_time_seconds"));
    cr_assert_eq(sample(t, "kvidx_up"), 1);
    free(t);
    metrics_free(m);
}

Test(metrics, requests_and_histograms)
{
    struct metrics *m = metrics_new();
    metrics_observe_request(m, "keys_get", 200, 0.00005); /* first bucket */
    metrics_observe_request(m, "keys_get", 204, 0.0001);  /* le is inclusive */
    metrics_observe_request(m, "keys_get", 200, 0.003);   /* 0.005 */
    metrics_observe_request(m, "keys_get", 404, 0.2);     /* 0.25 */
    metrics_observe_request(m, "lookup", 500, 99.0);      /* +Inf only */
    metrics_observe_request(m, NULL, 404, 0.001);         /* "unknown" */
    metrics_observe_request(m, "lookup", 200, -1.0);      /* clock step: 0 */
    metrics_observe_request(m, "lookup", 200, NAN);
    char *t = render(m);
    struct parsed p;
    parse(t, &p);
    cr_assert_eq(sample(t, "kvidx_http_requests_total{route=\"keys_get\",code_class=\"2xx\"}"), 3);
    cr_assert_eq(sample(t, "kvidx_http_requests_total{route=\"keys_get\",code_class=\"4xx\"}"), 1);
    cr_assert_eq(sample(t, "kvidx_http_requests_total{route=\"lookup\",code_class=\"5xx\"}"), 1);
    cr_assert_eq(sample(t, "kvidx_http_requests_total{route=\"unknown\",code_class=\"4xx\"}"), 1);
    cr_assert(
        !has_line_prefix(t, "kvidx_http_requests_total{route=\"keys_get\",code_class=\"3xx\"}"),
        "empty series are not rendered");
    const char *h = "kvidx_http_request_duration_seconds";
    check_histogram(t, h, "route=\"keys_get\",code_class=\"2xx\"");
    check_histogram(t, h, "route=\"keys_get\",code_class=\"4xx\"");
    check_histogram(t, h, "route=\"lookup\",code_class=\"5xx\"");
    check_histogram(t, h, "route=\"lookup\",code_class=\"2xx\"");
    check_histogram(t, h, "route=\"unknown\",code_class=\"4xx\"");
    const char *b =
        "kvidx_http_request_duration_seconds_bucket{route=\"keys_get\",code_class=\"2xx\",le=";
    char k[256];
    snprintf(k, sizeof(k), "%s\"0.0001\"}", b);
    cr_assert_eq(sample(t, k), 2);
    snprintf(k, sizeof(k), "%s\"0.0025\"}", b);
    cr_assert_eq(sample(t, k), 2);
    snprintf(k, sizeof(k), "%s\"0.005\"}", b);
    cr_assert_eq(sample(t, k), 3);
    cr_assert_float_eq(
        sample(t, "kvidx_http_request_duration_seconds_sum{route=\"keys_get\",code_class=\"2xx\"}"),
        0.00315, 1e-12);
    snprintf(
        k, sizeof(k),
        "kvidx_http_request_duration_seconds_bucket{route=\"lookup\",code_class=\"5xx\",le=\"5\"}");
    cr_assert_eq(sample(t, k), 0);
    cr_assert_eq(
        sample(t, "kvidx_http_request_duration_seconds_sum{route=\"lookup\",code_class=\"2xx\"}"),
        0);
    struct metrics_totals tot;
    metrics_totals(m, &tot);
    cr_assert_eq(tot.requests, 8);
    free(t);
    metrics_free(m);
}

Test(metrics, connections)
{
    struct metrics *m = metrics_new();
    metrics_conn_opened(m);
    metrics_conn_opened(m);
    metrics_conn_opened(m);
    metrics_conn_closed(m);
    metrics_conn_rejected(m);
    char *t = render(m);
    struct parsed p;
    parse(t, &p);
    cr_assert_eq(sample(t, "kvidx_connections_open"), 2);
    cr_assert_eq(sample(t, "kvidx_connections_accepted_total"), 3);
    cr_assert_eq(sample(t, "kvidx_connections_rejected_total"), 1);
    struct metrics_totals tot;
    metrics_totals(m, &tot);
    cr_assert_eq(tot.conn_open, 2);
    cr_assert_eq(tot.conn_accepted, 3);
    cr_assert_eq(tot.conn_rejected, 1);
    free(t);
    metrics_free(m);
}

Test(metrics, named_counters)
{
    struct metrics *m = metrics_new();
    metrics_add(m, "kvidx_evictions_total", 2);
    metrics_add(m, "kvidx_evictions_total", 3);
    metrics_add(m, "kvidx_things_total", 1);
    metrics_add(m, "kvidx_pins", 7);
    metrics_add(m, "bad name{", 1); /* would break the exposition: dropped */
    metrics_add(m, "9starts_with_digit", 1);
    metrics_add(m, "", 1);
    char *t = render(m);
    struct parsed p;
    parse(t, &p);
    cr_assert_eq(sample(t, "kvidx_evictions_total"), 5);
    cr_assert_eq(metrics_get(m, "kvidx_evictions_total"), 5);
    cr_assert_eq(metrics_get(m, "nosuch"), 0);
    cr_assert_str_eq(fam_find(&p, "kvidx_things_total")->type, "counter");
    cr_assert_str_eq(fam_find(&p, "kvidx_pins")->type, "gauge");
    cr_assert(strstr(t, "# HELP kvidx_things_total Counter kvidx_things_total.\n"));
    cr_assert(strstr(t, "# HELP kvidx_evictions_total Unpinned"));
    cr_assert_null(strstr(t, "bad name"));
    cr_assert_null(strstr(t, "9starts"));
    free(t);
    metrics_free(m);
}

/* Many distinct routes never grow the table past its cap, and the output
 * stays valid. */
Test(metrics, route_cap)
{
    struct metrics *m = metrics_new();
    char name[32];
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof(name), "r%d", i);
        metrics_observe_request(m, name, 200, 0.001);
    }
    char longname[100];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    metrics_observe_request(m, longname, 200, 0.001);
    metrics_observe_request(m, "quote\"back\\slash", 200, 0.001);
    char *t = render(m);
    struct parsed p;
    parse(t, &p);
    cr_assert(has_line_prefix(t, "kvidx_http_requests_total{route=\"other\",code_class=\"2xx\"} "));
    cr_assert_null(strstr(t, longname));
    struct metrics_totals tot;
    metrics_totals(m, &tot);
    cr_assert_eq(tot.requests, 202);
    free(t);
    metrics_free(m);
}

Test(metrics, null_safe)
{
    metrics_observe_request(NULL, "x", 200, 0.1);
    metrics_conn_opened(NULL);
    metrics_conn_closed(NULL);
    metrics_conn_rejected(NULL);
    metrics_add(NULL, "x_total", 1);
    struct metrics *m = metrics_new();
    metrics_conn_closed(m); /* never below zero */
    char *t = render(m);
    cr_assert_eq(sample(t, "kvidx_connections_open"), 0);
    free(t);
    metrics_free(m);
}

/* kvidx_lookup_hit_keys: one observation per answered lookup, buckets by
 * key count (le inclusive), cumulative, +Inf == _count, integral _sum. */
Test(metrics, lookup_hit_keys_histogram)
{
    struct metrics *m = metrics_new();
    char *t = render(m);
    struct parsed p;
    parse(t, &p);
    cr_assert_str_eq(fam_find(&p, "kvidx_lookup_hit_keys")->type, "histogram");
    cr_assert_eq(sample(t, "kvidx_lookup_hit_keys_count"), 0);
    cr_assert_eq(sample(t, "kvidx_lookup_hit_keys_bucket{le=\"+Inf\"}"), 0);
    free(t);

    metrics_observe_lookup(m, 0);       /* le="0" */
    metrics_observe_lookup(m, 1);       /* le="1" */
    metrics_observe_lookup(m, 3);       /* le="4" */
    metrics_observe_lookup(m, 1024);    /* le="1024" (inclusive) */
    metrics_observe_lookup(m, 1025);    /* le="4096" */
    metrics_observe_lookup(m, 262144);  /* le="262144" */
    metrics_observe_lookup(m, 1000000); /* +Inf only */
    metrics_observe_lookup(NULL, 5);    /* ignored */
    t = render(m);
    parse(t, &p);
    static const struct {
        const char *le;
        double cum;
    } want[] = {{"0", 1},    {"1", 2},     {"2", 2},     {"4", 3},      {"8", 3},   {"16", 3},
                {"32", 3},   {"64", 3},    {"128", 3},   {"256", 3},    {"512", 3}, {"1024", 4},
                {"4096", 5}, {"16384", 5}, {"65536", 5}, {"262144", 6}, {"+Inf", 7}};
    char k[128];
    double last = -1;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        snprintf(k, sizeof(k), "kvidx_lookup_hit_keys_bucket{le=\"%s\"}", want[i].le);
        double v = sample(t, k);
        cr_assert_eq(v, want[i].cum, "%s: %g, want %g", k, v, want[i].cum);
        cr_assert_geq(v, last, "cumulative");
        last = v;
    }
    cr_assert_eq(sample(t, "kvidx_lookup_hit_keys_count"), 7);
    cr_assert_eq(sample(t, "kvidx_lookup_hit_keys_bucket{le=\"+Inf\"}"),
                 sample(t, "kvidx_lookup_hit_keys_count"));
    cr_assert_eq(sample(t, "kvidx_lookup_hit_keys_sum"),
                 0 + 1 + 3 + 1024 + 1025 + 262144 + 1000000);
    /* Exactly 17 bucket lines (16 bounds and +Inf), each once. */
    int n = 0;
    for (const char *l = t; *l; l = strchr(l, '\n') + 1)
        if (strncmp(l, "kvidx_lookup_hit_keys_bucket{", 29) == 0)
            n++;
    cr_assert_eq(n, 17);
    cr_assert(strstr(t, "# HELP kvidx_lookup_hit_keys "));
    cr_assert(strstr(t, "# TYPE kvidx_lookup_hit_keys histogram\n"));
    free(t);
    metrics_free(m);
}
