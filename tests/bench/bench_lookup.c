/*
 * Lookup and LOOKUP-prefetch benchmarks for tests/bench/run.sh (issue 5):
 * one keep-alive connection, one request at a time, every answer read in
 * full; the Redis reference uses the same I/O loop.
 *
 * FORM names a request body:
 *   keyN         key form, N keys: bench_http's keys 0..N-1 (model
 *                meta-llama/Llama-3.1-8B, kv_rank 0x01000100, group 0)
 *   ipcC.G.R     ipc form: C chunks x G object groups x R ranks (world_size R,
 *                worker_id null, cache_salt ""), chunk c's hash = key_hex(1e9+c)
 *
 *   bench_lookup load     PORT FORM TIER     PUT the FORM's keys into TIER (l1|l2)
 *   bench_lookup floor    FORM REPS [MODE]   cJSON_ParseWithLength + cJSON_Delete of the
 *                                            exact body (MODE lookup|prefetch), median
 *   bench_lookup prefetch PORT FORM REPS     POST /v1/prefetches (mode LOOKUP) ->
 *                                            GET /v1/prefetches/{id}?wait_ms=1000 ->
 *                                            DELETE /v1/prefetches/{id}, REPS cycles,
 *                                            and the parse floor of the same body,
 *                                            one parse after each cycle (interleaved)
 *   bench_lookup lookup   PORT FORM SECS     POST /v1/lookup for SECS seconds
 *   bench_lookup sgen     N                  RESP "SET <canonical> 2097152" for keys 0..N-1
 *   bench_lookup mget     PORT N SECS        MGET of keys 0..N-1 for SECS seconds
 *   bench_lookup zbatch   N [sorted]         RESP "ZADD kvidx 0 m 0 m ..." (1000 members a
 *                                            command) of bench_http's N canonical keys: the
 *                                            same set as `bench_http zgen N`, in the same
 *                                            (insertion) order, or sorted by member (loads
 *                                            faster, but leaves a skiplist laid out in
 *                                            member order that lists ~4x faster: not the
 *                                            layout kvidx gets from the same keys)
 *
 * Prints "name value unit" lines.
 */
#include "bench_util.h"
#include <cjson/cJSON.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench_lookup"
#include "bench_client.h"

/* ---- forms ---- */
struct form {
    int ipc;
    long n;       /* keys */
    long c, g, r; /* ipc shape */
};

static struct form parse_form(const char *f)
{
    struct form x = {0, 0, 0, 0, 0};
    if (!strncmp(f, "key", 3)) {
        x.n = atol(f + 3);
    } else if (!strncmp(f, "ipc", 3) && sscanf(f + 3, "%ld.%ld.%ld", &x.c, &x.g, &x.r) == 3) {
        x.ipc = 1;
        x.n = x.c * x.g * x.r;
    }
    if (x.n <= 0 || (x.ipc && x.r > 255))
        die("bad FORM (keyN or ipcC.G.R)");
    return x;
}

static uint32_t ipc_rank(long r, long w)
{
    return (uint32_t)r << 24 | (uint32_t)w << 16 | (uint32_t)r << 8 | (uint32_t)w;
}

/* Body of a lookup (mode NULL) or prefetch (mode "LOOKUP"). */
static void build_body(const struct form *f, const char *mode, struct str *b)
{
    char hex[65];
    b->n = 0;
    sput(b, "{");
    if (mode)
        sput(b, "\"mode\":\"%s\",", mode);
    if (!f->ipc) {
        sput(b, "\"keys\":[");
        for (long i = 0; i < f->n; i++) {
            key_hex((uint64_t)i, hex);
            sput(b, "%s{\"model_name\":\"" MODEL "\",\"kv_rank\":%u,\"chunk_hash_hex\":\"%s\"}",
                 i ? "," : "", RANK, hex);
        }
        sput(b, "]}");
        return;
    }
    sput(b,
         "\"model_name\":\"" MODEL "\",\"world_size\":%ld,\"worker_id\":null,\"cache_salt\":\"\","
         "\"chunk_hashes\":[",
         f->r);
    for (long c = 0; c < f->c; c++) {
        key_hex(1000000000ULL + (uint64_t)c, hex);
        sput(b, "%s\"%s\"", c ? "," : "", hex);
    }
    sput(b, "],\"object_group_ids\":[");
    for (long g = 0; g < f->g; g++)
        sput(b, "%s%ld", g ? "," : "", g);
    sput(b, "]}");
}

static int http(int fd, const char *method, const char *path, const struct str *body,
                const char **rbody, size_t *rblen)
{
    static struct str req;
    req.n = 0;
    if (body)
        sput(&req,
             "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             method, path, auth_header(), body->n);
    else
        sput(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", method, path, auth_header());
    if (body) {
        while (req.n + body->n + 1 > req.cap) {
            req.cap *= 2;
            req.p = realloc(req.p, req.cap);
            if (!req.p)
                die("oom");
        }
        memcpy(req.p + req.n, body->p, body->n);
        req.n += body->n;
    }
    send_all(fd, req.p, req.n);
    return http_read(fd, rbody, rblen);
}

static void expect(int st, int want, const char *what, const char *b, size_t bl)
{
    if (st != want) {
        fprintf(stderr, "bench_lookup: %s: status %d: %.*s\n", what, st, (int)(bl > 400 ? 400 : bl),
                b);
        exit(1);
    }
}

/* ---- load ---- */
static void load(int port, const struct form *f, const char *tier)
{
    int fd = dial(port);
    struct str b = {0};
    char hex[65];
    long per = 8192, done = 0;
    const char *rbody;
    size_t rbl;
    double t0 = now();
    while (done < f->n) {
        b.n = 0;
        sput(&b, "{\"tier\":\"%s\",\"entries\":[", tier);
        long end = done + per < f->n ? done + per : f->n;
        for (long i = done; i < end; i++) {
            uint32_t rank = RANK;
            long grp = 0;
            if (f->ipc) { /* flat index i = g*(C*R) + c*R + r */
                grp = i / (f->c * f->r);
                long c = i / f->r % f->c, r = i % f->r;
                rank = ipc_rank(f->r, r);
                key_hex(1000000000ULL + (uint64_t)c, hex);
            } else {
                key_hex((uint64_t)i, hex);
            }
            sput(&b,
                 "%s{\"key\":{\"model_name\":\"" MODEL "\",\"kv_rank\":%u,\"object_group_id\":%ld,"
                 "\"chunk_hash_hex\":\"%s\"},\"size_bytes\":2097152}",
                 i > done ? "," : "", rank, grp, hex);
        }
        sput(&b, "]}");
        int st = http(fd, "PUT", "/v1/keys", &b, &rbody, &rbl);
        expect(st, 200, "PUT /v1/keys", rbody, rbl);
        done = end;
    }
    printf("load_keys %ld keys (%s, %.2f s)\n", f->n, tier, now() - t0);
    close(fd);
    free(b.p);
}

/* ---- parse floor ---- */
static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, long n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Median seconds of cJSON_ParseWithLength + cJSON_Delete of body. */
static double parse_floor(const struct str *body, long reps)
{
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t)
        die("oom");
    for (long i = 0; i < reps; i++) {
        double s = now();
        cJSON *j = cJSON_ParseWithLength(body->p, body->n);
        if (!j)
            die("cJSON parse failed");
        cJSON_Delete(j);
        t[i] = now() - s;
    }
    double m = median(t, reps);
    free(t);
    return m;
}

static void floor_cmd(const struct form *f, long reps, const char *mode)
{
    struct str b = {0};
    build_body(f, mode, &b);
    double fl = parse_floor(&b, reps);
    printf("floor_body_bytes %zu bytes\n", b.n);
    printf("floor_parse_us %.1f us\n", fl * 1e6);
    printf("floor_parse_ns_per_key %.1f ns/key\n", fl * 1e9 / (double)f->n);
    free(b.p);
}

/* ---- prefetch cycle ---- */
static void prefetch(int port, const struct form *f, long reps)
{
    struct str b = {0};
    build_body(f, "LOOKUP", &b);
    int fd = dial(port);
    double *tc = malloc(sizeof(double) * (size_t)reps * 5);
    if (!tc)
        die("oom");
    double *ts = tc + reps, *tp = tc + 2 * reps, *tr = tc + 3 * reps, *tf = tc + 4 * reps;
    const char *rbody;
    size_t rbl, bytes_sub = 0, bytes_poll = 0;
    char path[128];
    double wall_floor = 0;
    double t0 = now();
    for (long i = 0; i < reps; i++) {
        double s0 = now();
        int st = http(fd, "POST", "/v1/prefetches", &b, &rbody, &rbl);
        expect(st, 201, "POST /v1/prefetches", rbody, rbl);
        bytes_sub = rbl;
        const char *id = strstr(rbody, "\"id\":");
        if (!id)
            die("no id in the handle");
        unsigned long long hid = strtoull(id + 5, NULL, 10);
        double s1 = now();
        snprintf(path, sizeof(path), "/v1/prefetches/%llu?wait_ms=1000", hid);
        st = http(fd, "GET", path, NULL, &rbody, &rbl);
        expect(st, 200, "GET /v1/prefetches/{id}", rbody, rbl);
        bytes_poll = rbl;
        if (!memmem(rbody, rbl, "\"status\":\"completed\"", 20))
            die("poll: handle not completed after wait_ms=1000");
        if (i == 0) {
            const char *hk = memmem(rbody, rbl, "\"hit_keys\":", 11);
            printf("prefetch_hit_keys %lld keys (of %ld)\n", hk ? strtoll(hk + 11, NULL, 10) : -1,
                   f->n);
        }
        double s2 = now();
        snprintf(path, sizeof(path), "/v1/prefetches/%llu", hid);
        st = http(fd, "DELETE", path, NULL, &rbody, &rbl);
        expect(st, 204, "DELETE /v1/prefetches/{id}", rbody, rbl);
        double s3 = now();
        ts[i] = s1 - s0;
        tp[i] = s2 - s1;
        tr[i] = s3 - s2;
        tc[i] = s3 - s0;
        /* The floor, interleaved with the cycles so both see the same
         * machine load: one cJSON parse + delete of the same body. */
        double f0 = now();
        cJSON *j = cJSON_ParseWithLength(b.p, b.n);
        if (!j)
            die("cJSON parse failed");
        cJSON_Delete(j);
        tf[i] = now() - f0;
        wall_floor += tf[i];
    }
    double wall = now() - t0 - wall_floor;
    close(fd);
    double fl = median(tf, reps);
    double mc = median(tc, reps), msu = median(ts, reps), mp = median(tp, reps),
           mr = median(tr, reps);
    printf("prefetch_keys %ld keys\n", f->n);
    printf("prefetch_body_bytes %zu bytes\n", b.n);
    printf("prefetch_answer_bytes %zu/%zu bytes (201/GET)\n", bytes_sub, bytes_poll);
    printf("prefetch_cycles_per_s %.1f cycles/s\n", (double)reps / wall);
    printf("prefetch_cycle_us %.1f us (median)\n", mc * 1e6);
    printf("prefetch_submit_us %.1f us\n", msu * 1e6);
    printf("prefetch_poll_us %.1f us\n", mp * 1e6);
    printf("prefetch_release_us %.1f us\n", mr * 1e6);
    printf("prefetch_ns_per_key %.1f ns/key\n", mc * 1e9 / (double)f->n);
    printf("floor_parse_us %.1f us\n", fl * 1e6);
    printf("floor_parse_ns_per_key %.1f ns/key\n", fl * 1e9 / (double)f->n);
    printf("prefetch_cycle_over_floor %.2f x\n", mc / fl);
    printf("prefetch_submit_over_floor %.2f x\n", msu / fl);
    free(tc);
    free(b.p);
}

/* ---- lookup ---- */
static void lookup(int port, const struct form *f, double secs)
{
    struct str b = {0};
    build_body(f, NULL, &b);
    int fd = dial(port);
    const char *rbody;
    size_t rbl;
    long n = 0;
    double t0 = now(), t;
    do {
        int st = http(fd, "POST", "/v1/lookup", &b, &rbody, &rbl);
        expect(st, 200, "POST /v1/lookup", rbody, rbl);
        if (n == 0) {
            const char *hk = memmem(rbody, rbl, "\"hit_keys\":", 11);
            printf("lookup_hit_keys %lld keys (of %ld)\n", hk ? strtoll(hk + 11, NULL, 10) : -1,
                   f->n);
            printf("lookup_answer_bytes %zu bytes\n", rbl);
        }
        n++;
        t = now();
    } while (t - t0 < secs);
    printf("lookup_body_bytes %zu bytes\n", b.n);
    printf("lookup_req_per_s %.1f req/s\n", (double)n / (t - t0));
    printf("lookup_keys_per_s %.0f keys/s\n", (double)n * (double)f->n / (t - t0));
    close(fd);
    free(b.p);
}

/* ---- Redis ---- */
static size_t canonical(uint64_t i, char *out, size_t cap)
{
    char hex[65];
    key_hex(i, hex);
    return (size_t)snprintf(out, cap, "%s@%08x@0@%s", MODEL, RANK, hex);
}

static void sgen(long n)
{
    char c[256];
    for (long i = 0; i < n; i++) {
        size_t k = canonical((uint64_t)i, c, sizeof(c));
        printf("*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$7\r\n2097152\r\n", k, c);
    }
}

/* Reads one RESP array of bulk strings (nil allowed); returns non-nil count. */
static long resp_array(int fd)
{
    rlen = 0;
    while (!rlen || !strstr(rb, "\r\n"))
        fill(fd);
    if (rb[0] != '*') {
        fprintf(stderr, "bench_lookup: redis: %.200s\n", rb);
        exit(1);
    }
    long count = strtol(rb + 1, NULL, 10), hits = 0;
    size_t pos = (size_t)(strstr(rb, "\r\n") - rb) + 2;
    for (long i = 0; i < count; i++) {
        char *nl;
        while (pos >= rlen || !(nl = strstr(rb + pos, "\r\n")))
            fill(fd);
        long len = strtol(rb + pos + 1, NULL, 10);
        size_t start = (size_t)(nl - rb) + 2;
        if (len < 0) {
            pos = start;
            continue;
        }
        hits++;
        while (rlen < start + (size_t)len + 2)
            fill(fd);
        pos = start + (size_t)len + 2;
    }
    return hits;
}

static void mget(int port, long nkeys, double secs)
{
    struct str req = {0};
    char c[256];
    sput(&req, "*%ld\r\n$4\r\nMGET\r\n", nkeys + 1);
    for (long i = 0; i < nkeys; i++) {
        size_t k = canonical((uint64_t)i, c, sizeof(c));
        sput(&req, "$%zu\r\n%s\r\n", k, c);
    }
    int fd = dial(port);
    long n = 0;
    double t0 = now(), t;
    do {
        send_all(fd, req.p, req.n);
        long hits = resp_array(fd);
        if (n == 0)
            printf("mget_hits %ld keys (of %ld)\n", hits, nkeys);
        n++;
        t = now();
    } while (t - t0 < secs);
    printf("mget_body_bytes %zu bytes\n", req.n);
    printf("mget_req_per_s %.1f req/s\n", (double)n / (t - t0));
    printf("mget_keys_per_s %.0f keys/s\n", (double)n * (double)nkeys / (t - t0));
    close(fd);
    free(req.p);
}

static int cmp_hash(const void *a, const void *b)
{
    return memcmp(a, b, 64);
}

/* The canonical keys share everything but the hash, so member order is
 * hash order: sort the hex hashes (if asked), emit batched ZADDs. */
static void zbatch(long n, int sorted)
{
    char *h = malloc((size_t)n * 64);
    if (!h)
        die("oom");
    char hex[65];
    for (long i = 0; i < n; i++) {
        key_hex((uint64_t)i, hex);
        memcpy(h + (size_t)i * 64, hex, 64);
    }
    if (sorted)
        qsort(h, (size_t)n, 64, cmp_hash);
    char c[256];
    size_t prefix = (size_t)snprintf(c, sizeof(c), "%s@%08x@0@", MODEL, RANK);
    for (long i = 0; i < n; i += 1000) {
        long m = n - i < 1000 ? n - i : 1000;
        printf("*%ld\r\n$4\r\nZADD\r\n$5\r\nkvidx\r\n", 2 + 2 * m);
        for (long j = i; j < i + m; j++) {
            memcpy(c + prefix, h + (size_t)j * 64, 64);
            printf("$1\r\n0\r\n$%zu\r\n%.*s\r\n", prefix + 64, (int)(prefix + 64), c);
        }
    }
    free(h);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "zbatch")) {
        zbatch(atol(argv[2]), argc > 3 && !strcmp(argv[3], "sorted"));
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "sgen")) {
        sgen(atol(argv[2]));
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "floor")) {
        struct form f = parse_form(argv[2]);
        floor_cmd(&f, atol(argv[3]), argc > 4 && !strcmp(argv[4], "prefetch") ? "LOOKUP" : NULL);
        return 0;
    }
    if (argc != 5) {
        fprintf(stderr, "usage: bench_lookup load|prefetch|lookup PORT FORM ARG | mget PORT N "
                        "SECS | floor FORM REPS [lookup|prefetch] | sgen N\n");
        return 2;
    }
    int port = atoi(argv[2]);
    if (!strcmp(argv[1], "mget")) {
        mget(port, atol(argv[3]), atof(argv[4]));
        return 0;
    }
    struct form f = parse_form(argv[3]);
    if (!strcmp(argv[1], "load"))
        load(port, &f, argv[4]);
    else if (!strcmp(argv[1], "prefetch"))
        prefetch(port, &f, atol(argv[4]));
    else if (!strcmp(argv[1], "lookup"))
        lookup(port, &f, atof(argv[4]));
    else
        return 2;
    return 0;
}
