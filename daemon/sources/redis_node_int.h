/*
 * What redis_node.c (sessions, connections, configuration checks, the
 * probe) and redis_sync.c (scans, STRLEN batches, notifications) share.
 * Private to the two files, which include redis_node.h first.
 */
#ifndef KVIDXD_REDIS_NODE_INT_H
#define KVIDXD_REDIS_NODE_INT_H

#include "kvidx/key.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

enum { SZ_PENDING = -1, SZ_WRONGTYPE = -2, SZ_MOVED = -3, SZ_LOST = -4 };

struct redis_item {
    struct redis_batch *b;
    uint64_t token;
    uint32_t off, len;
    int64_t size;
};

struct redis_batch {
    struct redis_node *n;
    int scan;
    uint32_t count, remaining;
    struct redis_item *items;
    kvidx_key_t *keys;
    char *buf;
};

struct redis_node;

/* The loop's clock. */
uint64_t rn_now(const struct redis_node *n);

/* Records the error, logs it and tears the session down from a 0 ms timer
 * (never inside a hiredis callback); later replies are dropped. */
void rn_fail(struct redis_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* st is an enum redis_node_state; tells the owner when it changes. */
void rn_set_state(struct redis_node *n, int st);
/* Bookkeeping every command-connection callback does first; 1 when the
 * reply is to be used (not NULL, session not failing). */
int rn_cmd_reply(struct redis_node *n, const redisReply *r);
int rn_send_argv(struct redis_node *n, redisAsyncContext *ac, redisCallbackFn *fn, void *priv,
                 int argc, const char **argv, const size_t *lens);
int rn_send_strs(struct redis_node *n, redisAsyncContext *ac, redisCallbackFn *fn, void *priv,
                 int argc, const char **argv);
int rn_is_error(const redisReply *r, const char *prefix);
/* Starts the scan once subscribed and configured (redis_node.c). */
void rn_advance(struct redis_node *n);
/* Starts a full scan, or asks for another one after the current (redis_sync.c). */
void rn_start_scan(struct redis_node *n);
/* Compares the probe's DBSIZE with the keys held once both its DBSIZE
 * reply and its heartbeat are in; rescans when keys went without events
 * (redis_sync.c). */
void rn_probe_check(struct redis_node *n);
/* Every reply and message of the subscriber connection (redis_sync.c). */
void rn_on_sub_msg(redisAsyncContext *ac, void *reply, void *priv);

#endif
