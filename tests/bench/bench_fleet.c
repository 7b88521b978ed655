/*
 * The fleet directory's figures (tests/bench/run.sh): POST /events and the
 * tokens form of /directory/lookup beside the cJSON parse of the same
 * bodies and Redis MSET of the same keys, fencing an instance with 1M L1
 * placements, and resident bytes per key, per extra placement and per
 * bound token id.
 *
 *   bench_fleet KPORT KPID RPORT RPID SECS
 *       RPORT 0: no Redis reference.
 *
 * Server CPU is the server's utime + stime (/proc/PID/stat) over a round
 * divided by its requests; the parse floor is this process's CPU time for
 * cJSON_ParseWithLength (and cJSON_Delete) of the same body, in the same
 * run. Prints "name value unit" lines.
 */
#include "bench_util.h"

#include "kvidx/token_hash.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench_fleet"
#include "bench_client.h"

static double self_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int post(int fd, const char *path, const struct str *body, const char **rb_, size_t *rbl)
{
    static struct str req;
    req.n = 0;
    sput(&req,
         "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
         "Content-Length: %zu\r\n\r\n",
         path, auth_header(), body->n);
    send_all(fd, req.p, req.n);
    send_all(fd, body->p, body->n);
    return http_read(fd, rb_, rbl);
}

static void must(int st, int want, const char *what, const char *b, size_t bl)
{
    if (st != want) {
        fprintf(stderr, "bench_fleet: %s: status %d: %.*s\n", what, st, (int)(bl > 300 ? 300 : bl),
                b);
        exit(1);
    }
}

/* POSTs body and dies unless the status is 200: the answer's body. */
static const char *post_ok(int fd, const char *path, const struct str *body, const char *what,
                           size_t *bl)
{
    const char *b = NULL;
    size_t n = 0;
    int st = post(fd, path, body, &b, &n);
    must(st, 200, what, b, n);
    if (bl)
        *bl = n;
    return b;
}

/* A store batch of n entries, keys first..first+n-1 of instance inst,
 * with ntok token ids each. */
static void store_body(struct str *s, const char *inst, uint64_t inc, uint64_t seq,
                       const char *tier, uint64_t first, size_t n, size_t ntok)
{
    s->n = 0;
    sput(s,
         "{\"batches\":[{\"instance_id\":\"%s\",\"incarnation\":%llu,\"seq\":%llu,"
         "\"event_type\":\"store\",\"tier\":\"%s\",\"backend\":\"%s\",\"shared\":false,"
         "\"ts\":1716800000.5,\"entries\":[",
         inst, (unsigned long long)inc, (unsigned long long)seq, tier,
         tier[1] == '1' ? "dram" : "fs");
    for (size_t i = 0; i < n; i++) {
        char hex[65];
        key_hex(first + i, hex);
        sput(s,
             "%s{\"key\":{\"model_name\":\"" MODEL "\",\"kv_rank\":%u,\"object_group_id\":0,"
             "\"chunk_hash_hex\":\"%s\",\"cache_salt\":\"\"},\"size_bytes\":2097152",
             i ? "," : "", RANK, hex);
        if (ntok) {
            sput(s, ",\"token_offset\":%zu,\"token_ids\":[", i * ntok);
            for (size_t t = 0; t < ntok; t++)
                sput(s, "%s%u", t ? "," : "", (unsigned)((first + i) * 7919u + t * 104729u));
            sput(s, "]");
        }
        sput(s, "}");
    }
    sput(s, "]}]}");
}

/* CPU seconds of cJSON parsing body, per parse. */
static double parse_floor(const struct str *body)
{
    int reps = 0;
    double c0 = self_cpu(), c;
    do {
        cJSON *j = cJSON_ParseWithLength(body->p, body->n);
        if (!j)
            die("cJSON could not parse a body");
        cJSON_Delete(j);
        reps++;
        c = self_cpu();
    } while (c - c0 < 0.5 || reps < 5);
    return (c - c0) / reps;
}

static void mset_cmd(struct str *s, uint64_t first, size_t n)
{
    s->n = 0;
    sput(s, "*%zu\r\n$4\r\nMSET\r\n", 1 + 2 * n);
    for (size_t i = 0; i < n; i++) {
        char hex[65], k[160];
        key_hex(first + i, hex);
        int kl = snprintf(k, sizeof(k), "%s@%08x@0@%s", MODEL, RANK, hex);
        sput(s, "$%d\r\n%s\r\n$8\r\n00000000\r\n", kl, k);
    }
}

static void resp_ok(int fd)
{
    rlen = 0;
    while (!rlen || !strstr(rb, "\r\n"))
        fill(fd);
    if (rb[0] != '+')
        die("redis answered an error");
}

/* POST /events of store batches of 1000 entries (entries/s, server CPU
 * per entry), the parse floor of the same bodies, and Redis MSET of the
 * same 1000 keys. fresh: every request names new keys (insertion);
 * otherwise every request re-stores the same 1000 keys, as MSET overwrites
 * them (each batch has a new seq, so every one is admitted and applied). */
static void events(int kport, int kpid, int rport, int rpid, double secs, size_t ntok, int fresh,
                   const char *label, uint64_t *next_key)
{
    int fd = dial(kport);
    size_t nb = ntok ? 12 : 60;
    struct str *bodies = calloc(nb, sizeof(*bodies));
    uint64_t seq = 1;
    static int instance;
    char inst[32];
    snprintf(inst, sizeof(inst), "mp-ev%d", instance++);
    uint64_t base = *next_key;
    if (!fresh) {
        /* The keys exist before the rounds. */
        store_body(&bodies[0], inst, 1, seq++, "l1", base, 1000, ntok);
        post_ok(fd, "/events", &bodies[0], "POST /events", NULL);
        *next_key += 1000;
    }
    double cpu = 0, wall = 0;
    long reqs = 0;
    double t_end = now() + secs;
    double parse = 0;
    while (now() < t_end || reqs < (long)nb) {
        /* Bodies are built before the round is timed. */
        for (size_t i = 0; i < nb; i++) {
            store_body(&bodies[i], inst, 1, seq++, "l1", fresh ? *next_key : base, 1000, ntok);
            if (fresh)
                *next_key += 1000;
        }
        if (parse == 0)
            parse = parse_floor(&bodies[0]);
        double c0 = server_cpu_s(kpid), t0 = now();
        for (size_t i = 0; i < nb; i++) {
            const char *b = post_ok(fd, "/events", &bodies[i], "POST /events", NULL);
            if (!strstr(b, "\"applied\":1"))
                die("a batch was not applied");
        }
        cpu += server_cpu_s(kpid) - c0;
        wall += now() - t0;
        reqs += (long)nb;
    }
    double per_req = cpu / (double)reqs;
    printf("%s_body_bytes %zu B\n", label, bodies[0].n);
    printf("%s_entries_per_s %.0f entries/s\n", label, 1000.0 * (double)reqs / wall);
    printf("%s_server_cpu_per_entry %.3f us\n", label, per_req * 1e6 / 1000.0);
    printf("%s_parse_floor_per_entry %.3f us\n", label, parse * 1e6 / 1000.0);
    printf("%s_vs_parse %.2f x\n", label, per_req / parse);
    if (rport) {
        int rfd = dial(rport);
        struct str cmd = {0};
        mset_cmd(&cmd, base, 1000);
        long n = 0;
        double c0 = server_cpu_s(rpid), t0 = now();
        do {
            send_all(rfd, cmd.p, cmd.n);
            resp_ok(rfd);
            n++;
        } while (now() - t0 < secs);
        double rcpu = (server_cpu_s(rpid) - c0) / (double)n;
        printf("%s_redis_mset_cpu_per_key %.3f us\n", label, rcpu * 1e6 / 1000.0);
        printf("%s_vs_redis_mset %.2f x\n", label, rcpu / per_req);
        free(cmd.p);
        close(rfd);
    }
    for (size_t i = 0; i < nb; i++)
        free(bodies[i].p);
    free(bodies);
    close(fd);
}

/* The tokens form of /directory/lookup for a 32,768-token prompt at world
 * size 8 (128 chunks, 1024 keys), half of whose chunks are stored. */
static void lookup_tokens(int kport, int kpid, double secs)
{
    int fd = dial(kport);
    enum { NT = 32768, WS = 8, CH = 256 };
    static uint32_t toks[NT];
    for (int i = 0; i < NT; i++)
        toks[i] = (uint32_t)(i * 2654435761u % 151936u);
    static uint8_t hashes[NT / CH][KVIDX_TOKEN_HASH_LEN];
    size_t nc = kvidx_token_hash_chain(toks, NT, CH, hashes, NT / CH);
    struct str s = {0};
    sput(&s, "{\"batches\":[{\"instance_id\":\"mp-l\",\"incarnation\":1,\"seq\":1,"
             "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\",\"entries\":[");
    for (size_t c = 0; c < nc / 2; c++)
        for (unsigned r = 0; r < WS; r++) {
            char hex[65];
            for (int j = 0; j < 32; j++)
                snprintf(hex + 2 * j, 3, "%02x", hashes[c][j]);
            sput(&s,
                 "%s{\"key\":{\"model_name\":\"" MODEL
                 "\",\"kv_rank\":%u,\"chunk_hash_hex\":\"%s\"},"
                 "\"size_bytes\":1}",
                 c || r ? "," : "", WS << 24 | r << 16 | WS << 8 | r, hex);
        }
    sput(&s, "]}]}");
    size_t bl;
    post_ok(fd, "/events", &s, "POST /events (lookup keys)", NULL);
    s.n = 0;
    sput(&s, "{\"model_name\":\"" MODEL "\",\"world_size\":%d,\"cache_salt\":\"\",\"token_ids\":[",
         WS);
    for (int i = 0; i < NT; i++)
        sput(&s, "%s%u", i ? "," : "", toks[i]);
    sput(&s, "]}");
    double parse = parse_floor(&s);
    long n = 0;
    double c0 = server_cpu_s(kpid), t0 = now();
    do {
        post_ok(fd, "/directory/lookup", &s, "POST /directory/lookup", &bl);
        n++;
    } while (now() - t0 < secs);
    double cpu = (server_cpu_s(kpid) - c0) / (double)n;
    printf("lookup_tokens_body_bytes %zu B\n", s.n);
    printf("lookup_tokens_answer_bytes %zu B\n", bl);
    printf("lookup_tokens_server_cpu %.1f us\n", cpu * 1e6);
    printf("lookup_tokens_wall %.1f us\n", (now() - t0) * 1e6 / (double)n);
    printf("lookup_tokens_parse_floor %.1f us\n", parse * 1e6);
    printf("lookup_tokens_vs_parse %.2f x\n", cpu / parse);
    free(s.p);
    close(fd);
}

static long dir_memory(int fd)
{
    char req[512];
    int rl = snprintf(req, sizeof(req),
                      "GET /directory/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", auth_header());
    send_all(fd, req, (size_t)rl);
    const char *b;
    size_t bl;
    int st = http_read(fd, &b, &bl);
    must(st, 200, "GET /directory/stats", b, bl);
    const char *m = strstr(b, "\"memory_bytes\":");
    return m ? atol(m + 15) : -1;
}

/* 1M keys with one L1 placement of instance mp-big, then an L2 placement
 * of mp-two on each: resident bytes per key and per extra placement; then
 * 256 token ids on 100,000 of them; then mp-big restarts (a higher
 * incarnation): the fence's time, as the request that carries it sees it
 * and as another connection's probe waits for the loop. */
static void fence_and_memory(int kport, int kpid)
{
    int fd = dial(kport);
    enum { KEYS = 1000000, PER = 1000 };
    uint64_t first = 500000000;
    struct str s = {0};
    const char *b;
    size_t bl;
    long rss0 = server_rss(kpid), mem0 = dir_memory(fd);
    for (uint64_t i = 0; i < KEYS / PER; i++) {
        store_body(&s, "mp-big", 1, i + 1, "l1", first + i * PER, PER, 0);
        post_ok(fd, "/events", &s, "POST /events (1M)", &bl);
    }
    long rss1 = server_rss(kpid), mem1 = dir_memory(fd);
    for (uint64_t i = 0; i < KEYS / PER; i++) {
        store_body(&s, "mp-two", 1, i + 1, "l2", first + i * PER, PER, 0);
        post_ok(fd, "/events", &s, "POST /events (2nd placement)", &bl);
    }
    long rss2 = server_rss(kpid), mem2 = dir_memory(fd);
    enum { TKEYS = 100000, NTOK = 256 };
    for (uint64_t i = 0; i < TKEYS / PER; i++) {
        store_body(&s, "mp-two", 1, KEYS / PER + i + 1, "l2", first + i * PER, PER, NTOK);
        post_ok(fd, "/events", &s, "POST /events (tokens)", &bl);
    }
    long rss3 = server_rss(kpid), mem3 = dir_memory(fd);
    printf("resident_per_key_one_placement %.1f B\n", (double)(rss1 - rss0) / KEYS);
    printf("directory_bytes_per_key_one_placement %.1f B\n", (double)(mem1 - mem0) / KEYS);
    printf("resident_per_extra_placement %.1f B\n", (double)(rss2 - rss1) / KEYS);
    printf("directory_bytes_per_extra_placement %.1f B\n", (double)(mem2 - mem1) / KEYS);
    printf("resident_per_token_id %.2f B\n", (double)(rss3 - rss2) / ((double)TKEYS * NTOK));
    printf("directory_bytes_per_token_id %.2f B\n", (double)(mem3 - mem2) / ((double)TKEYS * NTOK));

    /* The fence: one empty batch at incarnation 2. */
    s.n = 0;
    sput(&s, "{\"batches\":[{\"instance_id\":\"mp-big\",\"incarnation\":2,\"seq\":1,"
             "\"event_type\":\"store\",\"tier\":\"l1\",\"backend\":\"dram\",\"entries\":[]}]}");
    static const char livez[] = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    int probe = dial(kport);
    double c0 = server_cpu_s(kpid), t0 = now();
    static struct str req;
    req.n = 0;
    sput(&req,
         "POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
         "Content-Length: %zu\r\n\r\n%s",
         auth_header(), s.n, s.p);
    send_all(fd, req.p, req.n);
    /* The probe is sent right after: it waits while the loop fences. */
    usleep(200);
    double p0 = now();
    send_all(probe, livez, sizeof(livez) - 1);
    int pst = http_read(probe, &b, &bl);
    must(pst, 200, "GET /livez", b, bl);
    double pause = now() - p0;
    int fst = http_read(fd, &b, &bl);
    must(fst, 200, "POST /events (fence)", b, bl);
    double fence = now() - t0, cpu = server_cpu_s(kpid) - c0;
    printf("fence_1M_l1_request %.1f ms\n", fence * 1e3);
    printf("fence_1M_l1_server_cpu %.1f ms\n", cpu * 1e3);
    printf("fence_1M_l1_probe_wait %.1f ms\n", pause * 1e3);
    long l1 = -1;
    {
        char st[512];
        int sl =
            snprintf(st, sizeof(st), "GET /directory/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n",
                     auth_header());
        send_all(fd, st, (size_t)sl);
        int sst = http_read(fd, &b, &bl);
        must(sst, 200, "GET /directory/stats", b, bl);
        const char *m = strstr(b, "\"placements_by_tier\":{\"l1\":");
        if (m)
            l1 = atol(m + 27);
    }
    printf("l1_placements_after_fence %ld placements\n", l1);
    free(s.p);
    close(fd);
    close(probe);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: bench_fleet KPORT KPID RPORT RPID SECS\n");
        return 2;
    }
    int kport = atoi(argv[1]), kpid = atoi(argv[2]), rport = atoi(argv[3]), rpid = atoi(argv[4]);
    double secs = atof(argv[5]);
    uint64_t next_key = 0;
    events(kport, kpid, rport, rpid, secs, 0, 0, "events_store1000", &next_key);
    events(kport, kpid, rport, rpid, secs, 256, 0, "events_store1000_tokens256", &next_key);
    events(kport, kpid, 0, 0, secs, 0, 1, "events_store1000_new_keys", &next_key);
    lookup_tokens(kport, kpid, secs);
    fence_and_memory(kport, kpid);
    return 0;
}
