/*
 * One followed Redis/Valkey server (see redis_node.h).
 *
 * A session is: resolve the host (uv_getaddrinfo, never a blocking
 * lookup), connect both connections, AUTH, subscribe (heartbeat channel,
 * __redis__:invalidate, every keyevent the source needs), CONFIG GET
 * notify-keyspace-events, CLIENT TRACKING ... OPTIN on the command
 * connection (it tracks no key, but the server tells every tracking client
 * about FLUSHDB/FLUSHALL), and only then the full scan. Any failure tears
 * both connections down and starts a new session after a backoff.
 *
 * Invariants:
 *   - the subscription is confirmed before the scan starts, so no change
 *     made after a key was scanned can be missed;
 *   - hiredis contexts are freed only outside their own callbacks (a 0 ms
 *     timer does it after a failure), and every callback of a freed
 *     context runs with a NULL reply and only frees what it carries;
 *   - a session that fails leaves what the node reported as it was: the
 *     owner keeps the keys (stale) until the next scan replaces them.
 */
#include "sources/redis_node.h"
#include "sources/redis_node_int.h"

#include "sources/redis_proto.h"
#include "sources/redis_uv.h"
#include "util/json_write.h"
#include "util/log.h"

#include "kvidx/err.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_EVERY     5 /* probes between two CONFIG GET checks */
#define BACKOFF_FIRST_MS 100

static void session_begin(struct redis_node *n);

const char *redis_node_state_name(enum redis_node_state st)
{
    switch (st) {
    case RN_CONNECTING:
        return "connecting";
    case RN_SCANNING:
        return "scanning";
    case RN_LIVE:
        return "live";
    case RN_RESCANNING:
        return "rescanning";
    case RN_RECONNECTING:
        return "reconnecting";
    case RN_STOPPED:
        break;
    }
    return "stopped";
}

uint64_t rn_now(const struct redis_node *n)
{
    return uv_now(n->cfg.loop);
}

void rn_set_state(struct redis_node *n, int st)
{
    if ((int)n->state == st)
        return;
    n->state = (enum redis_node_state)st;
    if (n->owner.state)
        n->owner.state(n->owner.ctx, n);
}

/* ---- failure and reconnect ---- */

static void on_teardown(uv_timer_t *t);

__attribute__((format(printf, 2, 3))) void rn_fail(struct redis_node *n, const char *fmt, ...)
{
    if (n->failing || n->state == RN_STOPPED)
        return;
    n->failing = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n->last_error, sizeof(n->last_error), fmt, ap);
    va_end(ap);
    log_warn("%s: %s; reconnecting", n->cfg.log_name, n->last_error);
    uv_timer_start(&n->retry, on_teardown, 0, 0);
}

static void close_contexts(struct redis_node *n)
{
    /* Registrations point into batches that the NULL-reply callbacks free. */
    rmap_free(&n->pending);
    rmap_init(&n->pending, 0);
    struct redisAsyncContext *sub = n->sub, *cmd = n->cmd;
    n->sub = n->cmd = NULL;
    if (sub)
        redisAsyncFree(sub);
    if (cmd)
        redisAsyncFree(cmd);
    n->batches_inflight = 0;
    n->cmd_inflight = 0;
    n->scanning = 0;
    n->session_up = 0;
    n->hb_outstanding = 0;
}

static uint64_t backoff_ms(struct redis_node *n)
{
    uint64_t d = BACKOFF_FIRST_MS;
    for (unsigned i = 0; i < n->attempt && d < n->cfg.reconnect_max_ms; i++)
        d *= 2;
    if (d > n->cfg.reconnect_max_ms)
        d = n->cfg.reconnect_max_ms;
    if (n->attempt < 64)
        n->attempt++;
    /* Jitter: somewhere in [d/2, d], so that many clients do not return together. */
    return d / 2 + randombytes_uniform((uint32_t)(d / 2 + 1));
}

static void on_retry(uv_timer_t *t)
{
    struct redis_node *n = t->data;
    n->reconnects++;
    session_begin(n);
}

static void on_teardown(uv_timer_t *t)
{
    struct redis_node *n = t->data;
    close_contexts(n);
    rn_set_state(n, RN_RECONNECTING);
    uv_timer_start(&n->retry, on_retry, backoff_ms(n), 0);
}

/* ---- connections ---- */

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct redis_node *n = ac->data;
    if (status == REDIS_OK)
        return;
    /* hiredis frees the context after this callback. */
    if (ac == n->sub)
        n->sub = NULL;
    else if (ac == n->cmd)
        n->cmd = NULL;
    rn_fail(n, "cannot connect to %s: %s", n->label, ac->errstr ? ac->errstr : "error");
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct redis_node *n = ac->data;
    (void)status;
    int known = ac == n->sub || ac == n->cmd;
    if (ac == n->sub)
        n->sub = NULL;
    else if (ac == n->cmd)
        n->cmd = NULL;
    if (known)
        rn_fail(n, "connection to %s lost: %s", n->label,
                ac->errstr && ac->errstr[0] ? ac->errstr : "closed by the server");
}

static redisAsyncContext *open_ctx(struct redis_node *n, const char *ip)
{
    redisAsyncContext *ac = redisAsyncConnect(ip, n->cfg.addr.port);
    if (!ac)
        return NULL;
    if (ac->err) {
        redisAsyncFree(ac);
        return NULL;
    }
    ac->data = n;
    if (redis_uv_attach(ac, n->cfg.loop) != 0) {
        redisAsyncFree(ac);
        return NULL;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    /* Dead peers (a host gone without a FIN) are found by TCP keepalive
     * as well as by the heartbeat. */
    redisEnableKeepAlive(&ac->c);
    return ac;
}

int rn_send_argv(struct redis_node *n, redisAsyncContext *ac, redisCallbackFn *fn, void *priv,
                 int argc, const char **argv, const size_t *lens)
{
    if (!ac || redisAsyncCommandArgv(ac, fn, priv, argc, argv, lens) != REDIS_OK)
        return -1;
    if (ac == n->cmd) {
        if (n->cmd_inflight == 0)
            n->last_reply_ms = rn_now(n);
        n->cmd_inflight++;
    }
    return 0;
}

int rn_send_strs(struct redis_node *n, redisAsyncContext *ac, redisCallbackFn *fn, void *priv,
                 int argc, const char **argv)
{
    size_t lens[24];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    return rn_send_argv(n, ac, fn, priv, argc, argv, lens);
}

/* Bookkeeping every command-connection callback does first. 1 when the
 * reply is to be used. */
int rn_cmd_reply(struct redis_node *n, const redisReply *r)
{
    if (n->cmd_inflight)
        n->cmd_inflight--;
    n->last_reply_ms = rn_now(n);
    return r != NULL && !n->failing;
}

int rn_is_error(const redisReply *r, const char *prefix)
{
    size_t pl = strlen(prefix);
    return r->type == REDIS_REPLY_ERROR && r->len >= pl && memcmp(r->str, prefix, pl) == 0;
}

static void on_auth(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    if (ac == n->cmd && !rn_cmd_reply(n, r))
        return;
    if (!r || n->failing)
        return;
    if (r->type == REDIS_REPLY_ERROR)
        rn_fail(n, "AUTH refused by %s: %.*s", n->label, (int)(r->len > 120 ? 120 : r->len),
                r->str);
}

static void on_select(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r))
        return;
    if (r->type == REDIS_REPLY_ERROR)
        rn_fail(n, "SELECT %u refused by %s: %.*s", n->cfg.url->db, n->label,
                (int)(r->len > 120 ? 120 : r->len), r->str);
}

static void on_sub_id(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!r || n->failing)
        return;
    if (r->type == REDIS_REPLY_INTEGER) {
        n->sub_id = r->integer;
        n->have_sub_id = 1;
    } else {
        /* Before Redis 5 there is no CLIENT ID: no flush invalidations then. */
        n->sub_id = -1;
        n->have_sub_id = 1;
    }
    rn_advance(n);
}

/* ---- notify-keyspace-events ---- */

static void on_config_set(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r))
        return;
    if (r->type == REDIS_REPLY_STATUS) {
        log_info("%s: set notify-keyspace-events on %s (l2_source_configure = yes)",
                 n->cfg.log_name, n->label);
        n->notify_ok = 1;
        n->warned_notify = 0;
    } else {
        log_warn("%s: CONFIG SET notify-keyspace-events refused by %s (%.*s): changes are found "
                 "by a full rescan every %" PRIu64 " s",
                 n->cfg.log_name, n->label, (int)(r->len < 120 ? r->len : 0), r->str,
                 n->cfg.rescan_ms / 1000);
        n->notify_ok = 0;
        n->warned_notify = 1;
    }
    if (!n->have_config) {
        n->have_config = 1;
        rn_advance(n);
    } else {
        /* Events were missed while they were off. */
        rn_start_scan(n);
    }
}

/* The answer to CONFIG GET notify-keyspace-events, at the start of a
 * session (setup) or from the periodic check. */
static void config_result(struct redis_node *n, const char *flags, int setup)
{
    char missing[8] = "";
    int was_ok = n->notify_ok && n->notify_known;
    if (flags) {
        snprintf(n->notify_flags, sizeof(n->notify_flags), "%s", flags);
        n->notify_known = 1;
        n->notify_ok = redis_notify_missing(flags, missing, sizeof(missing)) == 0;
    } else {
        n->notify_known = 0;
        n->notify_ok = 0;
    }
    if (!n->notify_ok && flags && n->cfg.configure) {
        char merged[sizeof(n->notify_flags) + 8];
        if (redis_notify_merge(flags, merged, sizeof(merged)) == 0) {
            const char *argv[4] = {"CONFIG", "SET", "notify-keyspace-events", merged};
            if (rn_send_strs(n, n->cmd, on_config_set, n, 4, argv) == 0)
                return; /* on_config_set goes on */
        }
    }
    if (!n->notify_ok && !n->warned_notify) {
        n->warned_notify = 1;
        if (flags)
            log_warn("%s: notify-keyspace-events on %s is \"%s\", which lacks \"%s\" (kvidx needs "
                     "at least \"Eg$xe\", or \"AE\"): changes are found by a full rescan every "
                     "%" PRIu64 " s; set it, or let kvidx set it with l2_source_configure = yes",
                     n->cfg.log_name, n->label, flags, missing, n->cfg.rescan_ms / 1000);
        else
            log_warn("%s: CONFIG GET is refused by %s, so kvidx cannot tell whether keyspace "
                     "events are on: changes are found by a full rescan every %" PRIu64 " s",
                     n->cfg.log_name, n->label, n->cfg.rescan_ms / 1000);
    }
    if (n->notify_ok && n->warned_notify) {
        n->warned_notify = 0;
        log_info("%s: notify-keyspace-events on %s is complete now; following changes",
                 n->cfg.log_name, n->label);
    }
    if (setup) {
        n->have_config = 1;
        rn_advance(n);
    } else if (was_ok != (n->notify_ok && n->notify_known)) {
        /* Events were lost, or now come again: make the index exact once. */
        rn_start_scan(n);
    }
}

static void on_config(redisAsyncContext *ac, void *reply, void *priv, int setup)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r))
        return;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING && r->element[1]->len < 24) {
        config_result(n, r->element[1]->str, setup);
    } else {
        config_result(n, NULL, setup);
    }
}

static void on_config_setup(redisAsyncContext *ac, void *reply, void *priv)
{
    on_config(ac, reply, priv, 1);
}

static void on_config_check(redisAsyncContext *ac, void *reply, void *priv)
{
    on_config(ac, reply, priv, 0);
}

static void on_tracking(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r))
        return;
    n->tracking_ok = r->type == REDIS_REPLY_STATUS;
    if (!n->tracking_ok)
        log_debug("%s: CLIENT TRACKING refused by %s: flushes are found by DBSIZE only",
                  n->cfg.log_name, n->label);
}

/* Starts the scan once the subscription is confirmed and the
 * notification flags are known. */
void rn_advance(struct redis_node *n)
{
    if (n->failing || n->session_up)
        return;
    if (!n->have_sub_id || n->sub_confirms < n->sub_channels || !n->have_config)
        return;
    if (!n->tracking_asked && n->sub_id >= 0) {
        char id[24];
        snprintf(id, sizeof(id), "%lld", n->sub_id);
        const char *argv[6] = {"CLIENT", "TRACKING", "on", "REDIRECT", id, "OPTIN"};
        rn_send_strs(n, n->cmd, on_tracking, n, 6, argv);
    }
    n->tracking_asked = 1;
    n->session_up = 1;
    n->attempt = 0;
    rn_start_scan(n);
}

/* ---- the probe: DBSIZE, heartbeat, stalls, periodic checks ---- */

static void on_dbsize(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r))
        return;
    if (r->type == REDIS_REPLY_INTEGER && r->integer >= 0) {
        n->dbsize = n->dbsize_at_hb = (uint64_t)r->integer;
        n->probe_dbsize_in = 1;
        rn_probe_check(n);
    }
}

static void on_publish(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r))
        return;
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 0)
        rn_fail(n, "%s no longer delivers to the subscriber connection", n->label);
}

static void on_tick(uv_timer_t *t)
{
    struct redis_node *n = t->data;
    uint64_t now = rn_now(n);
    /* A session being set up after a reconnect (state still reconnecting)
     * is timed like the first one: a server that accepts and never answers
     * must not hold the source for good. */
    if (n->failing || n->state == RN_STOPPED)
        return;
    if (!n->session_up) {
        if (now - n->session_start_ms > n->cfg.stall_ms)
            rn_fail(n, "%s did not answer within %" PRIu64 " ms", n->label, n->cfg.stall_ms);
        return;
    }
    if (n->cmd_inflight && now - n->last_reply_ms > n->cfg.stall_ms) {
        rn_fail(n, "%s sent no reply for %" PRIu64 " ms", n->label, n->cfg.stall_ms);
        return;
    }
    if (n->hb_outstanding && now - n->hb_sent_ms > n->cfg.stall_ms) {
        rn_fail(n, "no notification from %s for %" PRIu64 " ms", n->label, n->cfg.stall_ms);
        return;
    }
    n->ticks++;
    if (!n->hb_outstanding) {
        char seq[24];
        snprintf(seq, sizeof(seq), "%" PRIu64, ++n->hb_seq);
        const char *dbsize[1] = {"DBSIZE"};
        const char *publish[3] = {"PUBLISH", n->hb_channel, seq};
        n->hb_outstanding = 1;
        n->hb_sent_ms = now;
        n->probe_dbsize_in = n->probe_hb_in = 0;
        n->probe_resyncs = n->resyncs;
        if (rn_send_strs(n, n->cmd, on_dbsize, n, 1, dbsize) != 0 ||
            rn_send_strs(n, n->cmd, on_publish, n, 3, publish) != 0) {
            rn_fail(n, "cannot send to %s", n->label);
            return;
        }
    }
    if (n->ticks % CONFIG_EVERY == 0) {
        const char *argv[3] = {"CONFIG", "GET", "notify-keyspace-events"};
        rn_send_strs(n, n->cmd, on_config_check, n, 3, argv);
    }
    if (!n->notify_ok && !n->scanning && now - n->last_scan_end_ms >= n->cfg.rescan_ms)
        rn_start_scan(n);
}

/* ---- sessions ---- */

static void connect_pair(struct redis_node *n, const char *ip)
{
    n->sub = open_ctx(n, ip);
    n->cmd = n->sub ? open_ctx(n, ip) : NULL;
    if (!n->sub || !n->cmd) {
        rn_fail(n, "cannot connect to %s", n->label);
        return;
    }
    const struct redis_url *u = n->cfg.url;
    if (u->has_password) {
        const char *argv[3] = {"AUTH", u->user, u->password};
        int argc = u->user[0] ? 3 : 2;
        if (!u->user[0])
            argv[1] = u->password;
        rn_send_strs(n, n->sub, on_auth, n, argc, argv);
        rn_send_strs(n, n->cmd, on_auth, n, argc, argv);
    }
    const char *id[2] = {"CLIENT", "ID"};
    rn_send_strs(n, n->sub, on_sub_id, n, 2, id);

    char chans[20][64];
    const char *argv[21];
    int argc = 0;
    argv[argc++] = "SUBSCRIBE";
    argv[argc++] = n->hb_channel;
    argv[argc++] = "__redis__:invalidate";
    for (size_t i = 0; redis_event_names[i] && argc < 21; i++) {
        snprintf(chans[i], sizeof(chans[i]), "__keyevent@%u__:%s", n->cfg.cluster ? 0 : u->db,
                 redis_event_names[i]);
        argv[argc++] = chans[i];
    }
    n->sub_channels = argc - 1;
    rn_send_strs(n, n->sub, rn_on_sub_msg, n, argc, argv);

    if (!n->cfg.cluster && u->db) {
        char db[16];
        snprintf(db, sizeof(db), "%u", u->db);
        const char *sel[2] = {"SELECT", db};
        rn_send_strs(n, n->cmd, on_select, n, 2, sel);
    }
    const char *cfg[3] = {"CONFIG", "GET", "notify-keyspace-events"};
    rn_send_strs(n, n->cmd, on_config_setup, n, 3, cfg);
}

static void maybe_closed(struct redis_node *n)
{
    if (n->state == RN_STOPPED && n->closing_handles == 0 && !n->gai_busy && n->on_closed) {
        void (*cb)(struct redis_node *) = n->on_closed;
        n->on_closed = NULL;
        cb(n);
    }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct redis_node *n = req->data;
    n->gai_busy = 0;
    if (n->state == RN_STOPPED) {
        if (res)
            uv_freeaddrinfo(res);
        maybe_closed(n);
        return;
    }
    if (status != 0 || !res) {
        rn_fail(n, "cannot resolve %s: %s", n->cfg.addr.host, uv_strerror(status));
        return;
    }
    char ip[64] = "";
    if (res->ai_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)res->ai_addr, ip, sizeof(ip));
    else
        uv_ip4_name((const struct sockaddr_in *)res->ai_addr, ip, sizeof(ip));
    uv_freeaddrinfo(res);
    connect_pair(n, ip);
}

static void session_begin(struct redis_node *n)
{
    n->failing = 0;
    n->session_up = 0;
    n->sub_confirms = 0;
    n->have_sub_id = n->have_config = n->tracking_asked = 0;
    n->tracking_ok = 0;
    n->hb_outstanding = 0;
    n->dbsize_short = 0;
    n->session_start_ms = rn_now(n);
    if (n->state != RN_CONNECTING)
        rn_set_state(n, RN_RECONNECTING);
    unsigned char rnd[8];
    randombytes_buf(rnd, sizeof(rnd));
    snprintf(n->hb_channel, sizeof(n->hb_channel),
             "__kvidx__:heartbeat:%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3],
             rnd[4], rnd[5], rnd[6], rnd[7]);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    n->gai.data = n;
    int rc = uv_getaddrinfo(n->cfg.loop, &n->gai, on_resolved, n->cfg.addr.host, NULL, &hints);
    if (rc != 0) {
        rn_fail(n, "cannot resolve %s: %s", n->cfg.addr.host, uv_strerror(rc));
        return;
    }
    n->gai_busy = 1;
}

int redis_node_init(struct redis_node *n, const struct redis_node_cfg *cfg,
                    const struct redis_node_owner *owner, int index)
{
    memset(n, 0, sizeof(*n));
    n->cfg = *cfg;
    if (!n->cfg.probe_ms)
        n->cfg.probe_ms = 1000;
    if (!n->cfg.stall_ms)
        n->cfg.stall_ms = 15000;
    if (!n->cfg.reconnect_max_ms)
        n->cfg.reconnect_max_ms = 5000;
    if (!n->cfg.rescan_ms)
        n->cfg.rescan_ms = 30000;
    n->owner = *owner;
    n->index = index;
    n->state = RN_CONNECTING;
    if (strchr(cfg->addr.host, ':'))
        snprintf(n->label, sizeof(n->label), "[%s]:%d", cfg->addr.host, cfg->addr.port);
    else
        snprintf(n->label, sizeof(n->label), "%s:%d", cfg->addr.host, cfg->addr.port);
    rmap_init(&n->pending, 0);
    uv_timer_init(cfg->loop, &n->tick);
    uv_timer_init(cfg->loop, &n->retry);
    n->tick.data = n->retry.data = n;
    return 0;
}

void redis_node_start(struct redis_node *n)
{
    uv_timer_start(&n->tick, on_tick, n->cfg.probe_ms, n->cfg.probe_ms);
    session_begin(n);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct redis_node *n = h->data;
    n->closing_handles--;
    maybe_closed(n);
}

void redis_node_stop(struct redis_node *n, void (*on_closed)(struct redis_node *n))
{
    if (n->state == RN_STOPPED)
        return;
    n->failing = 1;
    n->state = RN_STOPPED;
    n->on_closed = on_closed;
    close_contexts(n);
    uv_timer_stop(&n->tick);
    uv_timer_stop(&n->retry);
    n->closing_handles = 2;
    uv_close((uv_handle_t *)&n->tick, on_handle_closed);
    uv_close((uv_handle_t *)&n->retry, on_handle_closed);
}

void redis_node_free(struct redis_node *n)
{
    rmap_free(&n->pending);
}

/* ---- figures ---- */

void redis_node_stats(const struct redis_node *n, struct jw *w)
{
    jw_key(w, "server");
    jw_str(w, n->label);
    jw_key(w, "server_state");
    jw_str(w, redis_node_state_name(n->state));
    jw_key(w, "notifications");
    jw_str(w, !n->notify_known ? "unknown" : n->notify_ok ? "complete" : "incomplete");
    jw_key(w, "notify_keyspace_events");
    jw_str(w, n->notify_flags);
    jw_key(w, "flush_tracking");
    jw_bool(w, n->tracking_ok);
    jw_key(w, "scans");
    jw_u64(w, n->resyncs);
    jw_key(w, "reconnects");
    jw_u64(w, n->reconnects);
    jw_key(w, "events");
    jw_u64(w, n->events);
    jw_key(w, "flushes_detected");
    jw_u64(w, n->flushes);
    jw_key(w, "notification_lag_ms");
    jw_u64(w, n->lag_ms);
    jw_key(w, "notification_lag_max_ms");
    jw_u64(w, n->lag_max_ms);
    jw_key(w, "dbsize");
    jw_u64(w, n->dbsize);
    jw_key(w, "skipped_last_scan");
    jw_u64(w, n->skipped);
    jw_key(w, "server_error");
    jw_str(w, n->last_error);
}

/* A Prometheus label value: \\, " and newline escaped. */
static void redis_label(struct buf *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            buf_putc(out, '\\');
        if (*s == '\n') {
            buf_puts(out, "\\n");
            continue;
        }
        buf_putc(out, *s);
    }
}

void redis_node_metrics(const char *source, const struct redis_node *n, struct buf *out,
                        int with_node)
{
    static const struct {
        const char *name, *type, *help;
        int field;
    } fams[] = {
        {"kvidx_redis_reconnects_total", "counter", "Reconnects to the Redis/Valkey server.", 0},
        {"kvidx_redis_events_total", "counter", "Keyspace event notifications received.", 1},
        {"kvidx_redis_flushes_detected_total", "counter",
         "Flushes (or keys gone without events) that triggered a rescan.", 2},
        {"kvidx_redis_notification_lag_seconds", "gauge",
         "Last heartbeat's time from PUBLISH to its delivery on the subscriber connection.", 3},
        {"kvidx_redis_notifications_complete", "gauge",
         "1 when notify-keyspace-events has every event the source needs.", 4},
        {"kvidx_redis_dbsize", "gauge", "Keys in the server's database (last DBSIZE).", 5},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        /* Every family has its HELP and TYPE; the registry keeps one of
         * each when several sources or nodes write the same family. */
        buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", fams[i].name, fams[i].help, fams[i].name,
                   fams[i].type);
        buf_puts(out, fams[i].name);
        buf_puts(out, "{source=\"");
        redis_label(out, source);
        if (with_node) {
            buf_puts(out, "\",node=\"");
            redis_label(out, n->label);
        }
        buf_puts(out, "\"} ");
        switch (fams[i].field) {
        case 0:
            buf_put_u64(out, n->reconnects);
            break;
        case 1:
            buf_put_u64(out, n->events);
            break;
        case 2:
            buf_put_u64(out, n->flushes);
            break;
        case 3:
            buf_printf(out, "%.3f", (double)n->lag_ms / 1000.0);
            break;
        case 4:
            buf_put_u64(out, (uint64_t)(n->notify_ok && n->notify_known));
            break;
        default:
            buf_put_u64(out, n->dbsize);
            break;
        }
        buf_putc(out, '\n');
    }
}
