/*
 * Prometheus metrics, rendered as text format 0.0.4 on GET /metrics.
 *
 * Request counts and latency histograms are kept per (route, code class):
 * routes are the router's fixed labels ("keys_get", "unknown", ...), so
 * there are at most a few dozen rows, found by a linear scan. Generic
 * counters from metrics_add() live in a second small table. Everything is
 * updated on the loop thread only; no locks.
 *
 * Invariants: every family is preceded by exactly one `# HELP` and one
 * `# TYPE` line; histogram buckets are stored per bucket and rendered
 * cumulatively, so `le="+Inf"` always equals `_count`; counters (and only
 * counters) end in `_total`. Label values and names are bounded copies, so
 * a caller's string may go away after the call. Tables are fixed-size: a
 * route or counter past the cap is folded into "other" / dropped rather
 * than growing without bound.
 */
#include "util/metrics.h"

#include "kvidx/err.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_ROUTES   64
#define MAX_COUNTERS 64
#define MAX_SOURCES  16
#define NAME_CAP     64
#define N_CLASSES    5 /* 1xx .. 5xx */

/* Upper bounds in seconds; +Inf is implied after the last one. */
static const double bucket_le[] = {.0001, .00025, .0005, .001, .0025, .005, .01, .025,
                                   .05,   .1,     .25,   .5,   1,     2.5,  5};
static const char *const bucket_text[] = {"0.0001", "0.00025", "0.0005", "0.001", "0.0025",
                                          "0.005",  "0.01",    "0.025",  "0.05",  "0.1",
                                          "0.25",   "0.5",     "1",      "2.5",   "5"};
#define N_BUCKETS (sizeof(bucket_le) / sizeof(bucket_le[0]))

/* kvidx_lookup_hit_keys: upper bounds in keys; +Inf after the last. 262144
 * is 4096 chunks x 8 groups x 8 ranks, the largest ipc lookup we plan for. */
static const uint64_t hit_le[] = {0,   1,   2,   4,    8,    16,    32,    64,
                                  128, 256, 512, 1024, 4096, 16384, 65536, 262144};
#define N_HIT_BUCKETS (sizeof(hit_le) / sizeof(hit_le[0]))

struct series {
    uint64_t count;
    double sum;
    uint64_t buckets[N_BUCKETS + 1]; /* per bucket, not cumulative; last is +Inf */
};

struct route_row {
    char name[NAME_CAP];
    struct series cls[N_CLASSES];
};

struct counter_row {
    char name[NAME_CAP];
    uint64_t value;
};

struct metrics {
    struct route_row routes[MAX_ROUTES];
    size_t n_routes;
    struct counter_row counters[MAX_COUNTERS];
    size_t n_counters;
    uint64_t requests_total;
    uint64_t hit_buckets[N_HIT_BUCKETS + 1]; /* per bucket; last is +Inf */
    uint64_t hit_count, hit_sum;
    uint64_t conn_open, conn_accepted, conn_rejected;
    double start_time; /* wall clock, seconds since the epoch */
    struct {
        metrics_gauges_fn fn;
        void *ctx;
    } sources[MAX_SOURCES]; /* registration order is rendering order */
    size_t n_sources;
};

struct metrics *metrics_new(void)
{
    struct metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->start_time = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    return m;
}

void metrics_free(struct metrics *m)
{
    free(m);
}

/* Prometheus names: [a-zA-Z_:][a-zA-Z0-9_:]*, and short enough to keep. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= NAME_CAP)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static struct route_row *route_row(struct metrics *m, const char *route)
{
    if (!route || !*route)
        route = "unknown";
    for (size_t i = 0; i < m->n_routes; i++)
        if (strcmp(m->routes[i].name, route) == 0)
            return &m->routes[i];
    if (strlen(route) >= NAME_CAP || m->n_routes >= MAX_ROUTES - 1) {
        /* The last row is kept for everything that does not fit. */
        route = "other";
        for (size_t i = 0; i < m->n_routes; i++)
            if (strcmp(m->routes[i].name, route) == 0)
                return &m->routes[i];
        if (m->n_routes == MAX_ROUTES)
            return &m->routes[MAX_ROUTES - 1];
    }
    struct route_row *r = &m->routes[m->n_routes++];
    snprintf(r->name, sizeof(r->name), "%s", route);
    return r;
}

void metrics_observe_request(struct metrics *m, const char *route, int status, double seconds)
{
    if (!m)
        return;
    int cls = status / 100 - 1;
    if (cls < 0 || cls >= N_CLASSES)
        cls = 4; /* a status we never send; count it as a server error */
    if (!(seconds >= 0) || isinf(seconds))
        seconds = 0; /* NaN or negative from a clock step */
    struct series *s = &route_row(m, route)->cls[cls];
    size_t b = 0;
    while (b < N_BUCKETS && seconds > bucket_le[b])
        b++;
    s->buckets[b]++;
    s->count++;
    s->sum += seconds;
    m->requests_total++;
}

void metrics_observe_lookup(struct metrics *m, uint64_t hit_keys)
{
    if (!m)
        return;
    size_t b = 0;
    while (b < N_HIT_BUCKETS && hit_keys > hit_le[b])
        b++;
    m->hit_buckets[b]++;
    m->hit_count++;
    m->hit_sum += hit_keys;
}

void metrics_conn_opened(struct metrics *m)
{
    if (!m)
        return;
    m->conn_open++;
    m->conn_accepted++;
}

void metrics_conn_closed(struct metrics *m)
{
    if (m && m->conn_open > 0)
        m->conn_open--;
}

void metrics_conn_rejected(struct metrics *m)
{
    if (m)
        m->conn_rejected++;
}

void metrics_add(struct metrics *m, const char *name, uint64_t delta)
{
    if (!m || !name)
        return;
    for (size_t i = 0; i < m->n_counters; i++) {
        if (strcmp(m->counters[i].name, name) == 0) {
            m->counters[i].value += delta;
            return;
        }
    }
    /* A bad name would break the whole exposition; a full table would
     * grow without bound. Both are programming errors: drop the sample. */
    if (!valid_name(name) || m->n_counters == MAX_COUNTERS)
        return;
    struct counter_row *c = &m->counters[m->n_counters++];
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->value = delta;
}

uint64_t metrics_get(const struct metrics *m, const char *name)
{
    if (!m || !name)
        return 0;
    for (size_t i = 0; i < m->n_counters; i++)
        if (strcmp(m->counters[i].name, name) == 0)
            return m->counters[i].value;
    return 0;
}

void metrics_totals(const struct metrics *m, struct metrics_totals *out)
{
    memset(out, 0, sizeof(*out));
    if (!m)
        return;
    out->requests = m->requests_total;
    out->conn_open = m->conn_open;
    out->conn_accepted = m->conn_accepted;
    out->conn_rejected = m->conn_rejected;
}

/* ---- rendering ---- */

int metrics_register(struct metrics *m, metrics_gauges_fn fn, void *ctx)
{
    if (!m)
        return 0;
    if (m->n_sources == MAX_SOURCES)
        return KVIDX_ENOMEM;
    m->sources[m->n_sources].fn = fn;
    m->sources[m->n_sources].ctx = ctx;
    m->n_sources++;
    return 0;
}

void metrics_unregister(struct metrics *m, metrics_gauges_fn fn, void *ctx)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_sources; i++) {
        if (m->sources[i].fn == fn && m->sources[i].ctx == ctx) {
            memmove(&m->sources[i], &m->sources[i + 1],
                    (m->n_sources - i - 1) * sizeof(m->sources[0]));
            m->n_sources--;
            return;
        }
    }
}

static void family(struct buf *out, const char *name, const char *type, const char *help)
{
    buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_double(struct buf *out, double v)
{
    /* %.17g round-trips; integral values print without a fraction. */
    buf_printf(out, "%.17g", v);
}

static void sample_u64(struct buf *out, const char *name, uint64_t v)
{
    buf_puts(out, name);
    buf_putc(out, ' ');
    buf_put_u64(out, v);
    buf_putc(out, '\n');
}

/* A label value, escaped as the text format asks (\\, \", \n). */
static void label_value(struct buf *out, const char *s)
{
    buf_putc(out, '"');
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            buf_putc(out, '\\');
            buf_putc(out, *s);
        } else if (*s == '\n') {
            buf_puts(out, "\\n");
        } else {
            buf_putc(out, *s);
        }
    }
    buf_putc(out, '"');
}

static void route_labels(struct buf *out, const char *route, int cls)
{
    buf_puts(out, "route=");
    label_value(out, route);
    buf_printf(out, ",code_class=\"%dxx\"", cls + 1);
}

static void render_http(const struct metrics *m, struct buf *out)
{
    family(out, "kvidx_http_requests_total", "counter",
           "HTTP requests answered, by route and status class.");
    for (size_t i = 0; i < m->n_routes; i++) {
        for (int c = 0; c < N_CLASSES; c++) {
            const struct series *s = &m->routes[i].cls[c];
            if (s->count == 0)
                continue;
            buf_puts(out, "kvidx_http_requests_total{");
            route_labels(out, m->routes[i].name, c);
            buf_puts(out, "} ");
            buf_put_u64(out, s->count);
            buf_putc(out, '\n');
        }
    }

    family(out, "kvidx_http_request_duration_seconds", "histogram",
           "Time from a complete request to its answer, by route and status class.");
    for (size_t i = 0; i < m->n_routes; i++) {
        for (int c = 0; c < N_CLASSES; c++) {
            const struct series *s = &m->routes[i].cls[c];
            if (s->count == 0)
                continue;
            uint64_t cum = 0;
            for (size_t b = 0; b <= N_BUCKETS; b++) {
                cum += s->buckets[b];
                buf_puts(out, "kvidx_http_request_duration_seconds_bucket{");
                route_labels(out, m->routes[i].name, c);
                buf_printf(out, ",le=\"%s\"} ", b < N_BUCKETS ? bucket_text[b] : "+Inf");
                buf_put_u64(out, cum);
                buf_putc(out, '\n');
            }
            buf_puts(out, "kvidx_http_request_duration_seconds_sum{");
            route_labels(out, m->routes[i].name, c);
            buf_puts(out, "} ");
            put_double(out, s->sum);
            buf_puts(out, "\nkvidx_http_request_duration_seconds_count{");
            route_labels(out, m->routes[i].name, c);
            buf_puts(out, "} ");
            buf_put_u64(out, s->count);
            buf_putc(out, '\n');
        }
    }
}

static void render_lookup(const struct metrics *m, struct buf *out)
{
    family(out, "kvidx_lookup_hit_keys", "histogram",
           "hit_keys (leading run of found keys) of each answered POST /v1/lookup.");
    uint64_t cum = 0;
    for (size_t b = 0; b <= N_HIT_BUCKETS; b++) {
        cum += m->hit_buckets[b];
        buf_puts(out, "kvidx_lookup_hit_keys_bucket{le=\"");
        if (b < N_HIT_BUCKETS)
            buf_put_u64(out, hit_le[b]);
        else
            buf_puts(out, "+Inf");
        buf_puts(out, "\"} ");
        buf_put_u64(out, cum);
        buf_putc(out, '\n');
    }
    sample_u64(out, "kvidx_lookup_hit_keys_sum", m->hit_sum);
    sample_u64(out, "kvidx_lookup_hit_keys_count", m->hit_count);
}

static void render_connections(const struct metrics *m, struct buf *out)
{
    family(out, "kvidx_connections_open", "gauge", "Client connections open now.");
    sample_u64(out, "kvidx_connections_open", m->conn_open);
    family(out, "kvidx_connections_accepted_total", "counter", "Client connections accepted.");
    sample_u64(out, "kvidx_connections_accepted_total", m->conn_accepted);
    family(out, "kvidx_connections_rejected_total", "counter",
           "Connections refused with 503 because max_connections were open.");
    sample_u64(out, "kvidx_connections_rejected_total", m->conn_rejected);
}

/* Help texts for the counters the documentation names; others get a generic line. */
static const char *counter_help(const char *name)
{
    static const struct {
        const char *name, *help;
    } known[] = {
        {"kvidx_evictions_total", "Unpinned L1 copies evicted to make room."},
        {"kvidx_expirations_total", "Prefetch handles that expired at their lease end."},
        {"kvidx_loads_total", "L2 to L1 loads started."},
        {"kvidx_load_failures_total", "L2 to L1 loads that failed or timed out."},
        {"kvidx_prefetches_total", "Prefetch handles created."},
        {"kvidx_loads_completed_total", "L2 to L1 loads that completed."},
        {"kvidx_lookups_total", "POST /v1/lookup requests answered."},
        {"kvidx_keys_forgotten_total", "Keys forgotten because eviction left them in no tier."},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(known[i].name, name) == 0)
            return known[i].help;
    return NULL;
}

static void render_counters(const struct metrics *m, struct buf *out)
{
    for (size_t i = 0; i < m->n_counters; i++) {
        const char *name = m->counters[i].name;
        size_t n = strlen(name);
        int is_counter = n > 6 && strcmp(name + n - 6, "_total") == 0;
        const char *help = counter_help(name);
        char generic[NAME_CAP + 32];
        if (!help) {
            snprintf(generic, sizeof(generic), "%s %s.", is_counter ? "Counter" : "Gauge", name);
            help = generic;
        }
        family(out, name, is_counter ? "counter" : "gauge", help);
        sample_u64(out, name, m->counters[i].value);
    }
}

/* Process facts, in the names Prometheus client libraries use. */
static void render_process(const struct metrics *m, struct buf *out)
{
    family(out, "kvidx_up", "gauge", "1 while the daemon is serving.");
    sample_u64(out, "kvidx_up", 1);
    family(out, "kvidx_build_info", "gauge", "Version of the running kvidxd.");
    buf_puts(out, "kvidx_build_info{version=");
    label_value(out, KVIDX_VERSION);
    buf_puts(out, "} 1\n");

    family(out, "process_start_time_seconds", "gauge",
           "Start time of the process since the Unix epoch in seconds.");
    buf_puts(out, "process_start_time_seconds ");
    put_double(out, floor(m->start_time * 1000) / 1000);
    buf_putc(out, '\n');

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                     (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        family(out, "process_cpu_seconds_total", "counter",
               "Total user and system CPU time spent in seconds.");
        buf_puts(out, "process_cpu_seconds_total ");
        put_double(out, cpu);
        buf_putc(out, '\n');
    }

    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long size, resident;
        if (fscanf(f, "%lu %lu", &size, &resident) == 2) {
            long page = sysconf(_SC_PAGESIZE);
            uint64_t p = page > 0 ? (uint64_t)page : 4096;
            family(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
            sample_u64(out, "process_virtual_memory_bytes", (uint64_t)size * p);
            family(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
            sample_u64(out, "process_resident_memory_bytes", (uint64_t)resident * p);
        }
        fclose(f);
    }

    DIR *d = opendir("/proc/self/fd");
    if (d) {
        uint64_t n = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
        family(out, "process_open_fds", "gauge", "Number of open file descriptors.");
        sample_u64(out, "process_open_fds", n > 0 ? n - 1 : 0); /* not the one opendir used */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        family(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        sample_u64(out, "process_max_fds", (uint64_t)rl.rlim_cur);
    }
}

void metrics_single(struct buf *out, const char *name, const char *type, const char *help,
                    uint64_t v)
{
    family(out, name, type, help);
    sample_u64(out, name, v);
}

void metrics_per_tier(struct buf *out, const char *name, const char *help, uint64_t l1, uint64_t l2)
{
    family(out, name, "gauge", help);
    buf_printf(out, "%s{tier=\"l1\"} %llu\n%s{tier=\"l2\"} %llu\n", name, (unsigned long long)l1,
               name, (unsigned long long)l2);
}

void metrics_render(struct metrics *m, struct buf *out)
{
    if (!m)
        return;
    render_process(m, out);
    render_connections(m, out);
    render_http(m, out);
    render_lookup(m, out);
    render_counters(m, out);
    for (size_t i = 0; i < m->n_sources; i++)
        m->sources[i].fn(m->sources[i].ctx, out);
}
