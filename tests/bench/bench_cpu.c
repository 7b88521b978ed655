/*
 * Server CPU per operation, kvidxd and Redis side by side (tests/bench/run.sh).
 *
 * The figure is the server process's own CPU time (utime + stime from
 * /proc/PID/stat) spent over a round of one operation repeated on one
 * keep-alive connection, divided by the operations of the round: what an
 * operation costs the server, whatever the client or the loopback costs.
 * Bodies are encoded before a round starts. Rounds alternate kvidx and
 * Redis; each side's median round counts. Wall-clock time per operation is
 * printed beside it (labelled wall_), as the client saw it.
 *
 *   bench_cpu cmp KPORT KPID RPORT RPID SECS ROUNDS OP...
 *       OP: store1000   PUT /v1/keys, 1000 entries (key form, re-put)  vs MSET 1000
 *           storeipc    PUT /v1/keys, ipc form 128 chunks x 8 ranks     vs MSET 1024
 *           lookup1000  POST /v1/lookup, 1000 keys (key form)          vs MGET 1000
 *           lookupipc   POST /v1/lookup, ipc form 128 chunks x 8 ranks vs MGET 1024
 *           listfirst   GET /v1/keys?page_size=1000                   vs ZRANGEBYLEX - + LIMIT 0
 * 1000 listdeep    the same with the token of the page at 9/10 of the keys vs ZRANGEBYLEX (cursor +
 * LIMIT 0 1000 (the listing ops need the keys of `bench_http put` in kvidxd and the same canonical
 * strings, `bench_http zgen`, in the Redis sorted set "kvidx") bench_cpu trace kvidx|redis PORT PID
 * FILE WORLD replays a Mooncake trace (one {"hash_ids": [...]} a line): per request a lookup of its
 * chunks x WORLD ranks (ipc form / MGET), then a store of the chunks after the hit prefix (ipc form
 * / MSET); prints server CPU and wall time per request, the hit chunks, the keys stored and the
 * server's resident bytes per key (VmRSS growth over the replay)
 *
 * Prints "name value unit" lines.
 */
#include "bench_util.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench_cpu"
#include "bench_client.h"

#define SIZE "2097152"

/* ---- keys ---- */

static uint32_t ipc_rank(uint32_t ws, uint32_t r)
{
    return ws << 24 | r << 16 | ws << 8 | r;
}

static size_t canonical(uint32_t rank, const char *hex, char *out, size_t cap)
{
    return (size_t)snprintf(out, cap, "%s@%08x@0@%s", MODEL, rank, hex);
}

/* ---- HTTP ---- */

static int http(int fd, const char *method, const char *path, const struct str *body,
                const char **rbody, size_t *rblen)
{
    static struct str req;
    req.n = 0;
    if (body)
        sput(&req,
             "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             method, path, body->n);
    else
        sput(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", method, path);
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

static void expect_status(int st, int want, const char *what, const char *b, size_t bl)
{
    if (st != want) {
        fprintf(stderr, "bench_cpu: %s: status %d: %.*s\n", what, st, (int)(bl > 400 ? 400 : bl),
                b);
        exit(1);
    }
}

/* The integer after "name": in an answer, or -1. */
static long json_num(const char *b, size_t n, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = memmem(b, n, pat, strlen(pat));
    if (!p)
        return -1;
    p += strlen(pat);
    return isdigit((unsigned char)*p) ? atol(p) : -1;
}

/* ---- RESP ---- */

/* Reads one reply: an array of bulk strings (nil allowed) into hit[] (1 for
 * non-nil, when hit is not NULL), or a simple string. Returns the element
 * count (0 for a simple string); copies the last element into last. */
static long resp_read(int fd, uint8_t *hit, char *last, size_t lastcap)
{
    rlen = 0;
    while (!rlen || !strstr(rb, "\r\n"))
        fill(fd);
    if (rb[0] == '+')
        return 0;
    if (rb[0] != '*') {
        fprintf(stderr, "bench_cpu: redis: %.200s\n", rb);
        exit(1);
    }
    long count = strtol(rb + 1, NULL, 10);
    size_t pos = (size_t)(strstr(rb, "\r\n") - rb) + 2;
    for (long i = 0; i < count; i++) {
        char *nl;
        while (pos >= rlen || !(nl = strstr(rb + pos, "\r\n")))
            fill(fd);
        long len = strtol(rb + pos + 1, NULL, 10);
        size_t start = (size_t)(nl - rb) + 2;
        if (hit)
            hit[i] = len >= 0;
        if (len < 0) {
            pos = start;
            continue;
        }
        while (rlen < start + (size_t)len + 2)
            fill(fd);
        if (last && i == count - 1 && (size_t)len < lastcap) {
            memcpy(last, rb + start, (size_t)len);
            last[len] = 0;
        }
        pos = start + (size_t)len + 2;
    }
    return count;
}

static void resp_arg(struct str *s, const char *a, size_t n)
{
    sput(s, "$%zu\r\n%.*s\r\n", n, (int)n, a);
}

/* ---- the operations ---- */

struct op {
    const char *name;
    /* kvidx request */
    const char *method;
    struct str path, body;
    int want;
    /* Redis command */
    struct str cmd;
};

static void key_hex_ipc(long c, char hex[65])
{
    key_hex(1000000000ULL + (uint64_t)c, hex);
}

static void build_store1000(struct op *o)
{
    char hex[65], c[256];
    o->method = "PUT";
    sput(&o->path, "/v1/keys");
    sput(&o->body, "{\"tier\":\"l2\",\"entries\":[");
    sput(&o->cmd, "*%d\r\n$4\r\nMSET\r\n", 1 + 2 * 1000);
    for (long i = 0; i < 1000; i++) {
        key_hex((uint64_t)i, hex);
        sput(&o->body,
             "%s{\"key\":{\"model_name\":\"" MODEL "\",\"kv_rank\":%u,\"object_group_id\":0,"
             "\"chunk_hash_hex\":\"%s\"},\"size_bytes\":" SIZE "}",
             i ? "," : "", RANK, hex);
        resp_arg(&o->cmd, c, canonical(RANK, hex, c, sizeof(c)));
        resp_arg(&o->cmd, SIZE, strlen(SIZE));
    }
    sput(&o->body, "]}");
    o->want = 200;
}

static void ipc_body(struct str *b, const char *head, long C, long R)
{
    char hex[65];
    sput(b,
         "{%s\"model_name\":\"" MODEL "\",\"world_size\":%ld,\"worker_id\":null,"
         "\"cache_salt\":\"\",\"chunk_hashes\":[",
         head, R);
    for (long c = 0; c < C; c++) {
        key_hex_ipc(c, hex);
        sput(b, "%s\"%s\"", c ? "," : "", hex);
    }
    sput(b, "],\"object_group_ids\":[0]");
}

/* The C x R keys of the ipc form, chunk-major, as one Redis command. */
static void ipc_cmd(struct str *s, const char *verb, long C, long R, int values)
{
    char hex[65], c[256];
    sput(s, "*%ld\r\n$%zu\r\n%s\r\n", 1 + C * R * (values ? 2 : 1), strlen(verb), verb);
    for (long ch = 0; ch < C; ch++) {
        key_hex_ipc(ch, hex);
        for (long r = 0; r < R; r++) {
            resp_arg(s, c, canonical(ipc_rank((uint32_t)R, (uint32_t)r), hex, c, sizeof(c)));
            if (values)
                resp_arg(s, SIZE, strlen(SIZE));
        }
    }
}

static void build_storeipc(struct op *o)
{
    o->method = "PUT";
    sput(&o->path, "/v1/keys");
    ipc_body(&o->body, "\"tier\":\"l2\",", 128, 8);
    sput(&o->body, ",\"size_bytes\":" SIZE "}");
    ipc_cmd(&o->cmd, "MSET", 128, 8, 1);
    o->want = 200;
}

static void build_lookup1000(struct op *o)
{
    char hex[65], c[256];
    o->method = "POST";
    sput(&o->path, "/v1/lookup");
    sput(&o->body, "{\"keys\":[");
    sput(&o->cmd, "*%d\r\n$4\r\nMGET\r\n", 1 + 1000);
    for (long i = 0; i < 1000; i++) {
        key_hex((uint64_t)i, hex);
        sput(&o->body, "%s{\"model_name\":\"" MODEL "\",\"kv_rank\":%u,\"chunk_hash_hex\":\"%s\"}",
             i ? "," : "", RANK, hex);
        resp_arg(&o->cmd, c, canonical(RANK, hex, c, sizeof(c)));
    }
    sput(&o->body, "]}");
    o->want = 200;
}

static void build_lookupipc(struct op *o)
{
    o->method = "POST";
    sput(&o->path, "/v1/lookup");
    ipc_body(&o->body, "", 128, 8);
    sput(&o->body, "}");
    ipc_cmd(&o->cmd, "MGET", 128, 8, 0);
    o->want = 200;
}

static void zrange_cmd(struct str *s, const char *lo)
{
    sput(s, "*7\r\n$11\r\nZRANGEBYLEX\r\n$5\r\nkvidx\r\n");
    resp_arg(s, lo, strlen(lo));
    sput(s, "$1\r\n+\r\n$5\r\nLIMIT\r\n$1\r\n0\r\n$4\r\n1000\r\n");
}

/* The token of the page at 9/10 of the listing, found by walking it. */
static void deep_token(int fd, char *tok, size_t cap, long *page_at)
{
    const char *b;
    size_t bl;
    char path[1024];
    long pages = 0;
    char **toks = NULL;
    long ntok = 0, tcap = 0;
    snprintf(path, sizeof(path), "/v1/keys?page_size=1000");
    for (;;) {
        int st = http(fd, "GET", path, NULL, &b, &bl);
        expect_status(st, 200, "listing walk", b, bl);
        pages++;
        const char *t = memmem(b, bl, "\"next_page_token\":\"", 19);
        if (!t)
            break;
        t += 19;
        const char *e = memchr(t, '"', bl - (size_t)(t - b));
        if (!e || (size_t)(e - t) >= 900)
            die("bad next_page_token");
        if (ntok == tcap) {
            tcap = tcap ? 2 * tcap : 1024;
            toks = realloc(toks, (size_t)tcap * sizeof(*toks));
            if (!toks)
                die("oom");
        }
        toks[ntok] = strndup(t, (size_t)(e - t));
        snprintf(path, sizeof(path), "/v1/keys?page_size=1000&page_token=%s", toks[ntok]);
        ntok++;
    }
    /* toks[i] opens page i + 1. */
    long want = pages * 9 / 10;
    if (want < 1 || want > ntok)
        die("listing too short for a deep page");
    snprintf(tok, cap, "%s", toks[want - 1]);
    *page_at = want;
    for (long i = 0; i < ntok; i++)
        free(toks[i]);
    free(toks);
}

static void build_list(struct op *o, int deep, int kfd, int rfd)
{
    o->method = "GET";
    o->want = 200;
    if (!deep) {
        sput(&o->path, "/v1/keys?page_size=1000");
        zrange_cmd(&o->cmd, "-");
        return;
    }
    char tok[1024];
    long page = 0;
    deep_token(kfd, tok, sizeof(tok), &page);
    sput(&o->path, "/v1/keys?page_size=1000&page_token=%s", tok);
    /* The member before the page's first key: ZRANGE kvidx k k. */
    struct str q = {0};
    char kbuf[32], member[512];
    member[0] = 0;
    int kn = snprintf(kbuf, sizeof(kbuf), "%ld", page * 1000 - 1);
    sput(&q, "*4\r\n$6\r\nZRANGE\r\n$5\r\nkvidx\r\n");
    resp_arg(&q, kbuf, (size_t)kn);
    resp_arg(&q, kbuf, (size_t)kn);
    send_all(rfd, q.p, q.n);
    if (resp_read(rfd, NULL, member, sizeof(member)) != 1)
        die("ZRANGE: no member at the deep page");
    free(q.p);
    char lo[520];
    snprintf(lo, sizeof(lo), "(%s", member);
    zrange_cmd(&o->cmd, lo);
    printf("listdeep_page %ld page\n", page);
}

/* One round of o on one side for secs seconds: server CPU and wall time per
 * operation, in microseconds. */
static void round_kvidx(int fd, int pid, const struct op *o, double secs, double *cpu_us,
                        double *wall_us)
{
    const char *b;
    size_t bl;
    long n = 0;
    double c0 = server_cpu_s(pid), t0 = now(), t;
    do {
        int st = http(fd, o->method, o->path.p, o->body.n ? &o->body : NULL, &b, &bl);
        if (st != o->want)
            expect_status(st, o->want, o->name, b, bl);
        n++;
        t = now();
    } while (t - t0 < secs);
    double c1 = server_cpu_s(pid);
    *cpu_us = (c1 - c0) * 1e6 / (double)n;
    *wall_us = (t - t0) * 1e6 / (double)n;
}

static void round_redis(int fd, int pid, const struct op *o, double secs, double *cpu_us,
                        double *wall_us)
{
    long n = 0;
    double c0 = server_cpu_s(pid), t0 = now(), t;
    do {
        send_all(fd, o->cmd.p, o->cmd.n);
        resp_read(fd, NULL, NULL, 0);
        n++;
        t = now();
    } while (t - t0 < secs);
    double c1 = server_cpu_s(pid);
    *cpu_us = (c1 - c0) * 1e6 / (double)n;
    *wall_us = (t - t0) * 1e6 / (double)n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void cmp(int kport, int kpid, int rport, int rpid, double secs, int rounds, int nops,
                char **ops)
{
    int kfd = dial(kport), rfd = dial(rport);
    for (int i = 0; i < nops; i++) {
        struct op o;
        memset(&o, 0, sizeof(o));
        o.name = ops[i];
        if (!strcmp(ops[i], "store1000"))
            build_store1000(&o);
        else if (!strcmp(ops[i], "storeipc"))
            build_storeipc(&o);
        else if (!strcmp(ops[i], "lookup1000"))
            build_lookup1000(&o);
        else if (!strcmp(ops[i], "lookupipc"))
            build_lookupipc(&o);
        else if (!strcmp(ops[i], "listfirst"))
            build_list(&o, 0, kfd, rfd);
        else if (!strcmp(ops[i], "listdeep"))
            build_list(&o, 1, kfd, rfd);
        else
            die("unknown OP");
        double kc[32], kw[32], rc[32], rw[32];
        if (rounds > 32)
            rounds = 32;
        for (int r = 0; r < rounds; r++) {
            round_kvidx(kfd, kpid, &o, secs, &kc[r], &kw[r]);
            round_redis(rfd, rpid, &o, secs, &rc[r], &rw[r]);
        }
        double k = median(kc, rounds), rr = median(rc, rounds);
        printf("cpu_%s_kvidx %.1f us/op (server CPU, median of %d)\n", o.name, k, rounds);
        printf("cpu_%s_redis %.1f us/op (server CPU, median of %d)\n", o.name, rr, rounds);
        printf("cpu_%s_ratio %.2f x (redis CPU / kvidx CPU)\n", o.name, rr / k);
        printf("wall_%s_kvidx %.1f us/op (wall clock at the client)\n", o.name, median(kw, rounds));
        printf("wall_%s_redis %.1f us/op (wall clock at the client)\n", o.name, median(rw, rounds));
        printf("bytes_%s %zu %zu (kvidx request body, redis command)\n", o.name, o.body.n, o.cmd.n);
        fflush(stdout);
        free(o.path.p);
        free(o.body.p);
        free(o.cmd.p);
    }
    close(kfd);
    close(rfd);
}

/* ---- trace replay ---- */

struct req {
    long n;
    uint64_t *ids;
};

static struct req *read_trace(const char *file, long *nreq)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        fprintf(stderr, "bench_cpu: cannot open the trace %s\n", file);
        exit(1);
    }
    struct req *v = NULL;
    long n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0) {
        const char *p = strstr(line, "\"hash_ids\"");
        if (!p || !(p = strchr(p, '[')))
            die("trace line without hash_ids");
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            v = realloc(v, (size_t)cap * sizeof(*v));
            if (!v)
                die("oom");
        }
        struct req *r = &v[n++];
        r->n = 0;
        r->ids = NULL;
        long icap = 0;
        p++;
        for (;;) {
            while (*p == ' ' || *p == ',')
                p++;
            if (*p == ']' || !*p)
                break;
            char *e;
            unsigned long long x = strtoull(p, &e, 10);
            if (e == p)
                die("bad hash id");
            if (r->n == icap) {
                icap = icap ? 2 * icap : 64;
                r->ids = realloc(r->ids, (size_t)icap * sizeof(*r->ids));
                if (!r->ids)
                    die("oom");
            }
            r->ids[r->n++] = x;
            p = e;
        }
    }
    free(line);
    fclose(f);
    *nreq = n;
    return v;
}

static void id_hex(uint64_t id, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)id);
}

static void trace(const char *side, int port, int pid, const char *file, long world)
{
    long nreq = 0;
    struct req *reqs = read_trace(file, &nreq);
    int redis = !strcmp(side, "redis");
    int fd = dial(port);
    struct str lb = {0}, sb = {0};
    uint8_t *hit = malloc(64 * 1024);
    long hit_chunks = 0, chunks = 0, stored = 0;
    long rss0 = server_rss(pid);
    double c0 = server_cpu_s(pid), t0 = now();
    for (long q = 0; q < nreq; q++) {
        const struct req *r = &reqs[q];
        long C = r->n, h = 0;
        char hex[17], c[256];
        chunks += C;
        lb.n = 0;
        sb.n = 0;
        if (!redis) {
            sput(&lb,
                 "{\"model_name\":\"" MODEL "\",\"world_size\":%ld,\"worker_id\":null,"
                 "\"cache_salt\":\"\",\"chunk_hashes\":[",
                 world);
            for (long i = 0; i < C; i++) {
                id_hex(r->ids[i], hex);
                sput(&lb, "%s\"%s\"", i ? "," : "", hex);
            }
            sput(&lb, "]}");
            const char *b;
            size_t bl;
            int st = http(fd, "POST", "/v1/lookup", &lb, &b, &bl);
            expect_status(st, 200, "trace lookup", b, bl);
            h = json_num(b, bl, "hit_chunks");
            if (h < 0 || h > C)
                die("trace lookup: no hit_chunks");
            if (h < C) {
                sput(&sb,
                     "{\"tier\":\"l2\",\"model_name\":\"" MODEL "\",\"world_size\":%ld,"
                     "\"worker_id\":null,\"cache_salt\":\"\",\"chunk_hashes\":[",
                     world);
                for (long i = h; i < C; i++) {
                    id_hex(r->ids[i], hex);
                    sput(&sb, "%s\"%s\"", i > h ? "," : "", hex);
                }
                sput(&sb, "],\"size_bytes\":" SIZE "}");
                st = http(fd, "PUT", "/v1/keys", &sb, &b, &bl);
                expect_status(st, 200, "trace store", b, bl);
                long s = json_num(b, bl, "stored");
                if (s < 0)
                    die("trace store: no stored count");
                stored += s;
            }
        } else {
            sput(&lb, "*%ld\r\n$4\r\nMGET\r\n", 1 + C * world);
            for (long i = 0; i < C; i++) {
                id_hex(r->ids[i], hex);
                for (long k = 0; k < world; k++)
                    resp_arg(&lb, c,
                             canonical(ipc_rank((uint32_t)world, (uint32_t)k), hex, c, sizeof(c)));
            }
            send_all(fd, lb.p, lb.n);
            if (resp_read(fd, hit, NULL, 0) != C * world)
                die("MGET: short answer");
            /* A chunk is a hit when every rank's key is there. */
            for (h = 0; h < C; h++) {
                long k = 0;
                while (k < world && hit[h * world + k])
                    k++;
                if (k < world)
                    break;
            }
            if (h < C) {
                sput(&sb, "*%ld\r\n$4\r\nMSET\r\n", 1 + 2 * (C - h) * world);
                for (long i = h; i < C; i++) {
                    id_hex(r->ids[i], hex);
                    for (long k = 0; k < world; k++) {
                        resp_arg(
                            &sb, c,
                            canonical(ipc_rank((uint32_t)world, (uint32_t)k), hex, c, sizeof(c)));
                        resp_arg(&sb, SIZE, strlen(SIZE));
                    }
                }
                send_all(fd, sb.p, sb.n);
                resp_read(fd, NULL, NULL, 0);
            }
        }
        hit_chunks += h;
    }
    double c1 = server_cpu_s(pid), t1 = now();
    long rss1 = server_rss(pid);
    if (redis) {
        /* DBSIZE: the keys stored. */
        send_all(fd, "*1\r\n$6\r\nDBSIZE\r\n", 16);
        rlen = 0;
        while (!rlen || !strstr(rb, "\r\n"))
            fill(fd);
        if (rb[0] != ':')
            die("DBSIZE");
        stored = atol(rb + 1);
    }
    printf("trace_%s_requests %ld requests (%ld chunks, world size %ld)\n", side, nreq, chunks,
           world);
    printf("trace_%s_cpu_us %.1f us/request (server CPU: lookup + store of the misses)\n", side,
           (c1 - c0) * 1e6 / (double)nreq);
    printf("trace_%s_wall_us %.1f us/request (wall clock at the client)\n", side,
           (t1 - t0) * 1e6 / (double)nreq);
    printf("trace_%s_hit_chunks %ld chunks\n", side, hit_chunks);
    printf("trace_%s_keys %ld keys\n", side, stored);
    printf("trace_%s_rss_per_key %.1f bytes/key (VmRSS growth over the replay)\n", side,
           stored ? (double)(rss1 - rss0) / (double)stored : 0.0);
    close(fd);
    free(hit);
    free(lb.p);
    free(sb.p);
    for (long q = 0; q < nreq; q++)
        free(reqs[q].ids);
    free(reqs);
}

int main(int argc, char **argv)
{
    if (argc >= 9 && !strcmp(argv[1], "cmp")) {
        cmp(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atof(argv[6]),
            atoi(argv[7]), argc - 8, argv + 8);
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "trace")) {
        trace(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5], atol(argv[6]));
        return 0;
    }
    fprintf(stderr, "usage: bench_cpu cmp KPORT KPID RPORT RPID SECS ROUNDS OP... | "
                    "trace kvidx|redis PORT PID FILE WORLD\n");
    return 2;
}
