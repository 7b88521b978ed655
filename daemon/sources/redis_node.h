/*
 * One Redis/Valkey server followed by the Redis source: a subscriber
 * connection (keyevent notifications, flush invalidations, a heartbeat
 * channel) and a command connection (SCAN, pipelined STRLEN, DBSIZE,
 * CONFIG), both asynchronous on the loop through hiredis' libuv adapter.
 *
 * A node reports what the server holds to its owner (the standalone source
 * or the cluster source) through struct redis_node_owner: a full scan is
 * scan_begin, put/del calls, then scan_end; between scans every change is a
 * put or a del. A node never blocks; it reconnects by itself with an
 * exponential backoff (capped, with jitter) and resynchronises after every
 * reconnect, flush or lost notification.
 */
#ifndef KVIDXD_REDIS_NODE_H
#define KVIDXD_REDIS_NODE_H

#include "sources/redis_map.h"
#include "sources/redis_url.h"

#include "kvidx/key.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct redis_node;
struct redisAsyncContext;
struct jw;
struct buf;

enum redis_node_state {
    RN_CONNECTING = 0, /* first connection, nothing reported yet */
    RN_SCANNING,       /* first full scan in progress */
    RN_LIVE,           /* following changes */
    RN_RESCANNING,     /* a later full scan in progress */
    RN_RECONNECTING,   /* the server cannot be reached; what it held is kept */
    RN_STOPPED,
};

struct redis_node_owner {
    void *ctx;
    /* A full scan starts; every key the node holds will be put before scan_end. */
    void (*scan_begin)(void *ctx, struct redis_node *n);
    /* The scan is complete: keys of this node neither put since scan_begin
     * nor put by a change meanwhile are gone. skipped: keys the scan passed
     * over (not the source's, not strings). */
    void (*scan_end)(void *ctx, struct redis_node *n, uint64_t skipped);
    /* k keys held with their sizes (>= 1); names[i]/lens[i] are the Redis
     * key names. 0 or KVIDX_ENOMEM (then the node resynchronises). */
    int (*put)(void *ctx, struct redis_node *n, const kvidx_key_t *keys, const uint64_t *sizes,
               const char *const *names, const uint32_t *lens, size_t k);
    /* One key is no longer held by this node. */
    int (*del)(void *ctx, struct redis_node *n, const kvidx_key_t *key, const char *name,
               size_t len);
    /* The node's state changed (n->state). */
    void (*state)(void *ctx, struct redis_node *n);
    /* The server answered MOVED or ASK, or is not a cluster primary: the
     * owner should look at the cluster's topology again. May be NULL. */
    void (*moved)(void *ctx, struct redis_node *n);
    /* How many keys the owner holds for this node (checked against DBSIZE). */
    uint64_t (*held)(void *ctx, const struct redis_node *n);
};

struct redis_node_cfg {
    uv_loop_t *loop;
    const struct redis_url *url; /* credentials, db, prefix; outlives the node */
    struct redis_addr addr;
    int cluster;               /* no SELECT; the node is a cluster primary */
    uint64_t rescan_ms;        /* full rescans without notifications */
    uint64_t reconnect_max_ms; /* backoff cap */
    uint64_t probe_ms;         /* DBSIZE + heartbeat period (default 1000) */
    uint64_t stall_ms;         /* no reply / no heartbeat for this long: reconnect */
    int configure;             /* CONFIG SET notify-keyspace-events when lacking */
    const char *log_name;      /* the source's shown name, for log lines */
};

struct redis_batch;

struct redis_node {
    struct redis_node_cfg cfg;
    struct redis_node_owner owner;
    char label[REDIS_HOST_MAX + 8]; /* "host:port" */
    int index;                      /* the owner's number for this node */
    enum redis_node_state state;
    int failing;       /* torn down or about to be: replies are dropped */
    int ever_scanned;  /* one scan completed */
    int scanning;      /* a scan is in progress */
    int resync_again;  /* a flush or a gap was seen during the scan */
    int notify_ok;     /* the server sends every event the source needs */
    int notify_known;  /* CONFIG GET answered */
    int tracking_ok;   /* CLIENT TRACKING (flush invalidations) is on */
    int warned_notify; /* the missing-events warning was logged */
    char notify_flags[32];

    struct redisAsyncContext *sub, *cmd;
    uv_getaddrinfo_t gai;
    int gai_busy;
    uv_timer_t tick, retry;
    int closing_handles; /* uv handles still to close */
    void (*on_closed)(struct redis_node *n);

    /* session */
    uint64_t session_start_ms;
    int session_up; /* subscribed and configured: scanning or live */
    int sub_confirms, sub_channels;
    long long sub_id;
    int have_sub_id, have_config, tracking_asked;
    unsigned attempt; /* reconnect attempts since the last good session */
    char hb_channel[64];
    uint64_t hb_seq, hb_sent_ms, hb_recv_seq;
    int hb_outstanding;
    uint64_t dbsize, dbsize_at_hb;
    int dbsize_short; /* consecutive probes with fewer keys than held */
    /* The current probe's DBSIZE reply and heartbeat have come in: the
     * check runs when the later of the two does. */
    int probe_dbsize_in, probe_hb_in;
    uint64_t probe_resyncs; /* scans completed when the probe was sent */
    uint64_t cmd_inflight, last_reply_ms;
    uint64_t ticks;

    /* scan */
    char cursor[32];
    int scan_done; /* the last SCAN reply had cursor 0 */
    uint64_t scan_skipped;
    size_t batches_inflight;
    uint64_t last_scan_end_ms;

    /* STRLENs waited for: key name -> token (a); the newest request wins */
    struct rmap pending;
    uint64_t next_token;

    /* figures */
    uint64_t resyncs, reconnects, events, flushes, lag_ms, lag_max_ms;
    uint64_t skipped;
    char last_error[256];
};

/* Sets n up (no I/O yet). 0 or KVIDX_ENOMEM. */
int redis_node_init(struct redis_node *n, const struct redis_node_cfg *cfg,
                    const struct redis_node_owner *owner, int index);
/* Connects and starts the first scan. */
void redis_node_start(struct redis_node *n);
/* Closes both connections (pending replies are dropped) and the timers;
 * on_closed (may be NULL) runs once every uv handle is closed. */
void redis_node_stop(struct redis_node *n, void (*on_closed)(struct redis_node *n));
/* Frees what init allocated (after on_closed). */
void redis_node_free(struct redis_node *n);
/* Asks for a full rescan as soon as possible (after the current one). */
void redis_node_resync(struct redis_node *n);
/* The node's figures, as members of the JSON object being written. */
void redis_node_stats(const struct redis_node *n, struct jw *w);
/* One sample of each of the node's metric families, labelled
 * source="<source>" (and node="host:port" when with_node). */
void redis_node_metrics(const char *source, const struct redis_node *n, struct buf *out,
                        int with_node);
/* "connecting", "scanning", "live", "rescanning", "reconnecting", "stopped". */
const char *redis_node_state_name(enum redis_node_state st);

#endif
