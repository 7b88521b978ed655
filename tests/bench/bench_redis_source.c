/*
 * The Redis source against a real redis-server (tests/bench/run.sh starts
 * one on a free loopback port and fills it):
 *
 *   bench_redis_source gen N [PREFIX]
 *       writes N SETs of LMCache wire keys (100-byte values) as RESP, for
 *       redis-cli --pipe.
 *   bench_redis_source sync PORT [PREFIX]
 *       one redis_node from connect to the end of its first full scan
 *       (SCAN + pipelined STRLEN): keys/s.
 *   bench_redis_source latency PORT N [PREFIX]
 *       once live, N SETs of new keys, one at a time from a second
 *       connection; for each, the time from sending the SET to the node
 *       reporting the key (keyevent, then its STRLEN): p50/p99/max in ms.
 *
 * The owner here counts what the node reports instead of feeding the key
 * store, so the figures are the source's own; the sink's cost is the
 * index's put, measured by bench_index.
 */
#include "sources/redis_map.h"
#include "sources/redis_node.h"
#include "sources/redis_proto.h"
#include "sources/redis_url.h"

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

static uv_loop_t *loop;
static struct redis_node node;
static struct redis_url url;
static uint64_t held, scans, t_start_ns, t_scan_ns;
static int mode_latency;
static uint64_t lat_n, lat_sent, lat_got;
static uint64_t *sent_ns, *lat_ns;
static redisAsyncContext *writer;
static uv_timer_t stop_timer;
static struct rmap seen; /* the keys reported, as the key store would hold them */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void finish(void)
{
    redis_node_stop(&node, NULL);
    if (writer) {
        redisAsyncContext *w = writer;
        writer = NULL;
        redisAsyncFree(w);
    }
    uv_timer_stop(&stop_timer);
    uv_close((uv_handle_t *)&stop_timer, NULL);
}

static void send_next(void);

static void on_set(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac;
    (void)r;
    (void)priv;
}

static void send_next(void)
{
    if (lat_sent >= lat_n || !writer)
        return;
    char key[512];
    snprintf(key, sizeof(key), "%s%sm/bench@01000100@0@%016" PRIx64, url.prefix,
             url.prefix_len ? "@" : "", (uint64_t)0xfeed000000000000u + lat_sent);
    sent_ns[lat_sent] = now_ns();
    lat_sent++;
    redisAsyncCommand(writer, on_set, NULL, "SET %s %b", key, "0123456789abcdef", (size_t)16);
}

static void own_scan_begin(void *ctx, struct redis_node *n)
{
    (void)ctx;
    (void)n;
}

static void own_scan_end(void *ctx, struct redis_node *n, uint64_t skipped)
{
    (void)ctx;
    (void)n;
    scans++;
    if (scans == 1) {
        t_scan_ns = now_ns();
        double s = (double)(t_scan_ns - t_start_ns) / 1e9;
        printf("sync_keys %" PRIu64 " keys\n", held);
        printf("sync_skipped %" PRIu64 " keys\n", skipped);
        printf("sync_seconds %.3f s\n", s);
        printf("sync_keys_per_s %.0f keys/s\n", (double)held / s);
        fflush(stdout);
        if (!mode_latency) {
            finish();
            return;
        }
        writer = redisAsyncConnect("127.0.0.1", n->cfg.addr.port);
        redisLibuvAttach(writer, loop);
        send_next();
    }
}

static int own_put(void *ctx, struct redis_node *n, const kvidx_key_t *keys, const uint64_t *sizes,
                   const char *const *names, const uint32_t *lens, size_t k)
{
    (void)ctx;
    (void)n;
    (void)keys;
    (void)sizes;
    for (size_t i = 0; i < k; i++) {
        int created;
        if (rmap_put(&seen, names[i], lens[i], &created) && created)
            held++;
    }
    if (mode_latency && scans >= 1) {
        for (size_t i = 0; i < k; i++) {
            const char *p = memchr(names[i], '@', lens[i]);
            if (!p || lens[i] < 16)
                continue;
            uint64_t idx = strtoull(names[i] + lens[i] - 16, NULL, 16) - 0xfeed000000000000u;
            if (idx < lat_sent && lat_ns[idx] == 0) {
                lat_ns[idx] = now_ns() - sent_ns[idx];
                lat_got++;
            }
        }
        if (lat_got == lat_n)
            finish();
        else
            send_next();
    }
    return 0;
}

static int own_del(void *ctx, struct redis_node *n, const kvidx_key_t *key, const char *name,
                   size_t len)
{
    (void)ctx;
    (void)n;
    (void)key;
    (void)name;
    struct rmap_entry *e = rmap_get(&seen, name, len);
    if (e) {
        rmap_del(&seen, e);
        held--;
    }
    return 0;
}

static uint64_t own_held(void *ctx, const struct redis_node *n)
{
    (void)ctx;
    (void)n;
    return held;
}

static void on_deadline(uv_timer_t *t)
{
    (void)t;
    fprintf(stderr, "bench_redis_source: deadline reached (%" PRIu64 "/%" PRIu64 " seen)\n",
            lat_got, lat_n);
    finish();
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s sync PORT [PREFIX] | latency PORT N [PREFIX]\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "gen") == 0) {
        uint64_t n = strtoull(argv[2], NULL, 10);
        const char *p = argc > 3 ? argv[3] : "";
        static const char val[101] = "0123456789012345678901234567890123456789012345678901234567890"
                                     "123456789012345678901234567890123456789";
        for (uint64_t i = 0; i < n; i++) {
            char key[512];
            int kl = snprintf(key, sizeof(key), "%s%sm/llama@01000100@0@%016" PRIx64, p,
                              p[0] ? "@" : "", i * UINT64_C(2654435761));
            printf("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$100\r\n%s\r\n", kl, key, val);
        }
        return 0;
    }
    mode_latency = strcmp(argv[1], "latency") == 0;
    const char *prefix = mode_latency ? (argc > 4 ? argv[4] : NULL) : (argc > 3 ? argv[3] : NULL);
    char spec[256], err[256];
    snprintf(spec, sizeof(spec), "redis://127.0.0.1:%s/0%s%s", argv[2], prefix ? "?prefix=" : "",
             prefix ? prefix : "");
    if (redis_url_parse(spec, &url, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (mode_latency) {
        lat_n = argc > 3 ? strtoull(argv[3], NULL, 10) : 10000;
        sent_ns = calloc(lat_n, sizeof(uint64_t));
        lat_ns = calloc(lat_n, sizeof(uint64_t));
    }
    rmap_init(&seen, 1);
    loop = uv_default_loop();
    struct redis_node_cfg cfg = {.loop = loop,
                                 .url = &url,
                                 .addr = url.seeds[0],
                                 .rescan_ms = 3600000,
                                 .reconnect_max_ms = 1000,
                                 .log_name = "bench"};
    struct redis_node_owner owner = {.scan_begin = own_scan_begin,
                                     .scan_end = own_scan_end,
                                     .put = own_put,
                                     .del = own_del,
                                     .held = own_held};
    redis_node_init(&node, &cfg, &owner, 0);
    uv_timer_init(loop, &stop_timer);
    uv_timer_start(&stop_timer, on_deadline, 300000, 0);
    t_start_ns = now_ns();
    redis_node_start(&node);
    uv_run(loop, UV_RUN_DEFAULT);
    redis_node_free(&node);
    if (mode_latency && lat_got) {
        uint64_t *v = malloc(lat_got * sizeof(uint64_t));
        size_t k = 0;
        for (uint64_t i = 0; i < lat_n; i++)
            if (lat_ns[i])
                v[k++] = lat_ns[i];
        qsort(v, k, sizeof(uint64_t), cmp_u64);
        printf("notify_sets %" PRIu64 " seen of %" PRIu64 "\n", lat_got, lat_n);
        printf("notify_p50_ms %.3f ms\n", (double)v[k / 2] / 1e6);
        printf("notify_p99_ms %.3f ms\n", (double)v[k * 99 / 100] / 1e6);
        printf("notify_max_ms %.3f ms\n", (double)v[k - 1] / 1e6);
        free(v);
    }
    return mode_latency && lat_got != lat_n;
}
