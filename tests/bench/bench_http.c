/*
 * Loopback HTTP/RESP client for tests/bench/run.sh. One keep-alive
 * connection, one request at a time, every answer read in full.
 *
 *   bench_http put   PORT BATCHES [FIRST]   PUT /v1/keys, 1000 keys per batch;
 *                                           keys FIRST*1000 .. (FIRST+BATCHES)*1000-1
 *   bench_http list  PORT MAXPAGES          GET /v1/keys?page_size=1000 through
 *                                           the whole index (at most MAXPAGES pages)
 *   bench_http get   PORT SECS [NKEYS]      GET /v1/keys/{canonical} of keys
 *                                           0..NKEYS-1 (default 1000) in turn, SECS s
 *   bench_http zgen  NKEYS                  print RESP "ZADD kvidx 0 <canonical>"
 *                                           commands for the same keys (redis-cli --pipe)
 *   bench_http rlist PORT MAXPAGES          ZRANGEBYLEX kvidx (cursor + LIMIT 0 1000
 *                                           through the whole sorted set
 *
 * Prints "name value unit" lines. Key i: model meta-llama/Llama-3.1-8B,
 * kv_rank 0x01000100, group 0, chunk hash = 32 bytes derived from i. With
 * KVIDX_BENCH_TOKEN set, every request carries that bearer token.
 */
#include "bench_util.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench_http"
#include "bench_client.h"

enum { BATCH = 1000 };

static void put(int port, long batches, long first)
{
    int fd = dial(port);
    size_t cap = BATCH * 200 + 256;
    char *body = malloc(cap), *req = malloc(cap + 256);
    char hex[65];
    double busy = 0;
    long keys = 0;
    double t0 = now();
    for (long bi = 0; bi < batches; bi++) {
        size_t n = (size_t)snprintf(body, cap, "{\"tier\":\"l2\",\"entries\":[");
        for (long i = 0; i < BATCH; i++) {
            key_hex((uint64_t)((first + bi) * BATCH + i), hex);
            n += (size_t)snprintf(body + n, cap - n,
                                  "%s{\"key\":{\"model_name\":\"" MODEL "\",\"kv_rank\":%u,"
                                  "\"chunk_hash_hex\":\"%s\"},\"size_bytes\":2097152}",
                                  i ? "," : "", RANK, hex);
        }
        n += (size_t)snprintf(body + n, cap - n, "]}");
        size_t rn =
            (size_t)snprintf(req, cap + 256,
                             "PUT /v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\n%s"
                             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                             auth_header(), n);
        memcpy(req + rn, body, n);
        double s = now();
        send_all(fd, req, rn + n);
        const char *b;
        size_t bl;
        int st = http_read(fd, &b, &bl);
        busy += now() - s;
        if (st != 200) {
            fprintf(stderr, "bench_http: PUT status %d: %.*s\n", st, (int)(bl > 300 ? 300 : bl), b);
            exit(1);
        }
        keys += BATCH;
    }
    double wall = now() - t0;
    printf("put_batches %ld batches\n", batches);
    printf("put_keys_per_s %.0f keys/s\n", (double)keys / busy);
    printf("put_keys_per_s_incl_client_encode %.0f keys/s\n", (double)keys / wall);
    close(fd);
}

static void list(int port, long maxpages)
{
    int fd = dial(port);
    char req[1024], tok[512];
    tok[0] = 0;
    long pages = 0, entries = 0;
    size_t bytes = 0;
    double t0 = now();
    while (pages < maxpages) {
        int n = snprintf(req, sizeof(req),
                         "GET /v1/keys?page_size=1000%s%s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n",
                         tok[0] ? "&page_token=" : "", tok, auth_header());
        send_all(fd, req, (size_t)n);
        const char *b;
        size_t bl;
        int st = http_read(fd, &b, &bl);
        if (st != 200)
            die("list status");
        pages++;
        bytes += bl;
        /* Count entries by their "size_bytes" (cheap scan) and take the token. */
        for (const char *p = b; (p = strstr(p, "\"size_bytes\":")); p += 13)
            entries++;
        /* The token is the last member: look for it in the tail only. */
        size_t tail = bl < 2048 ? bl : 2048;
        const char *t = memmem(b + bl - tail, tail, "\"next_page_token\":", 18);
        if (!t)
            die("no next_page_token");
        t += 18;
        while (*t == ' ')
            t++;
        if (*t != '"')
            break; /* null: end */
        const char *e = strchr(t + 1, '"');
        size_t tl = (size_t)(e - t - 1);
        if (tl >= sizeof(tok))
            die("token too long");
        memcpy(tok, t + 1, tl);
        tok[tl] = 0;
    }
    double dt = now() - t0;
    printf("list_pages %ld pages\n", pages);
    printf("list_entries %ld keys\n", entries);
    printf("list_bytes_per_page %.0f bytes\n", (double)bytes / (double)pages);
    printf("list_pages_per_s %.1f pages/s\n", (double)pages / dt);
    close(fd);
}

static void canonical(uint64_t i, char *out, size_t cap, size_t *n)
{
    char hex[65];
    key_hex(i, hex);
    *n = (size_t)snprintf(out, cap, "%s@%08x@0@%s", MODEL, RANK, hex);
}

/* GET of one key at a time, keys 0..nkeys-1 in turn, for secs seconds. */
static void get(int port, double secs, long nkeys)
{
    int fd = dial(port);
    char req[1024], c[256];
    size_t cn;
    long n = 0;
    double t0 = now(), t;
    do {
        canonical((uint64_t)(n % nkeys), c, sizeof(c), &cn);
        int rn = snprintf(req, sizeof(req), "GET /v1/keys/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n",
                          c, auth_header());
        send_all(fd, req, (size_t)rn);
        const char *b;
        size_t bl;
        int st = http_read(fd, &b, &bl);
        if (st != 200) {
            fprintf(stderr, "bench_http: GET status %d: %.*s\n", st, (int)(bl > 300 ? 300 : bl), b);
            exit(1);
        }
        n++;
        t = now();
    } while (t - t0 < secs);
    printf("get_requests %ld req\n", n);
    printf("get_req_per_s %.0f req/s\n", (double)n / (t - t0));
    printf("get_us_per_req %.2f us\n", (t - t0) * 1e6 / (double)n);
    close(fd);
}

static void zgen(long nkeys)
{
    char c[256];
    size_t n;
    for (long i = 0; i < nkeys; i++) {
        canonical((uint64_t)i, c, sizeof(c), &n);
        printf("*4\r\n$4\r\nZADD\r\n$5\r\nkvidx\r\n$1\r\n0\r\n$%zu\r\n%s\r\n", n, c);
    }
}

/* Reads a RESP array of bulk strings; copies the last element to last. */
static long resp_array(int fd, char *last, size_t lastcap, size_t *bytes)
{
    rlen = 0;
    size_t pos = 0;
    while (!rlen || !strstr(rb, "\r\n"))
        fill(fd);
    if (rb[0] != '*') {
        fprintf(stderr, "bench_http: redis: %.200s\n", rb);
        exit(1);
    }
    long count = strtol(rb + 1, NULL, 10);
    pos = (size_t)(strstr(rb, "\r\n") - rb) + 2;
    for (long i = 0; i < count; i++) {
        char *nl;
        while (pos >= rlen || !(nl = strstr(rb + pos, "\r\n")))
            fill(fd);
        size_t len = strtoull(rb + pos + 1, NULL, 10);
        size_t start = (size_t)(nl - rb) + 2;
        while (rlen < start + len + 2)
            fill(fd);
        if (i == count - 1 && len < lastcap) {
            memcpy(last, rb + start, len);
            last[len] = 0;
        }
        pos = start + len + 2;
    }
    *bytes += rlen;
    return count;
}

static void rlist(int port, long maxpages)
{
    int fd = dial(port);
    char cursor[256], req[512];
    cursor[0] = 0;
    long pages = 0, entries = 0;
    size_t bytes = 0;
    double t0 = now();
    while (pages < maxpages) {
        char lo[260];
        if (cursor[0])
            snprintf(lo, sizeof(lo), "(%s", cursor);
        else
            snprintf(lo, sizeof(lo), "-");
        int n = snprintf(req, sizeof(req),
                         "*7\r\n$11\r\nZRANGEBYLEX\r\n$5\r\nkvidx\r\n$%zu\r\n%s\r\n$1\r\n+\r\n"
                         "$5\r\nLIMIT\r\n$1\r\n0\r\n$4\r\n1000\r\n",
                         strlen(lo), lo);
        send_all(fd, req, (size_t)n);
        long c = resp_array(fd, cursor, sizeof(cursor), &bytes);
        pages++;
        entries += c;
        if (c < 1000)
            break;
    }
    double dt = now() - t0;
    printf("rlist_pages %ld pages\n", pages);
    printf("rlist_entries %ld keys\n", entries);
    printf("rlist_bytes_per_page %.0f bytes\n", (double)bytes / (double)pages);
    printf("rlist_pages_per_s %.1f pages/s\n", (double)pages / dt);
    close(fd);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "zgen")) {
        zgen(atol(argv[2]));
        return 0;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: bench_http put|list|rlist PORT N [FIRST] | get PORT SECS [NKEYS] "
                        "| zgen NKEYS\n");
        return 2;
    }
    int port = atoi(argv[2]);
    long n = atol(argv[3]);
    if (!strcmp(argv[1], "put"))
        put(port, n, argc > 4 ? atol(argv[4]) : 0);
    else if (!strcmp(argv[1], "list"))
        list(port, n);
    else if (!strcmp(argv[1], "rlist"))
        rlist(port, n);
    else if (!strcmp(argv[1], "get"))
        get(port, atof(argv[3]), argc > 4 ? atol(argv[4]) : 1000);
    else
        return 2;
    return 0;
}
