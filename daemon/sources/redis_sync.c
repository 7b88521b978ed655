/*
 * A node's view of the store (see redis_node.h): full scans (SCAN with
 * COUNT 1000, the next SCAN sent before the batch's STRLENs are answered,
 * so one round trip per batch), the STRLEN batches, and the subscriber's
 * messages (keyevents, flush invalidations, heartbeats).
 *
 * Invariants: every STRLEN carries a token registered under its key in
 * n->pending; a newer request for the key, or a del event, replaces or
 * drops the registration, and a reply whose token is no longer registered
 * is dropped, so a stale size or a stale "present" never overwrites a newer
 * change whatever order the two connections' bytes arrive in. A scan batch
 * is reported whole when its last STRLEN has answered, and the scan ends
 * when the last SCAN (cursor 0) and every batch are in. On a cluster node
 * every STRLEN is sent after ASKING, so that a key already in a slot the
 * node is importing counts as the node's. The flush check
 * compares DBSIZE with the keys held only when the heartbeat published
 * after it has come back on the subscriber, i.e. once every event the
 * server sent before the DBSIZE has been applied, and the DBSIZE reply
 * itself has come in (the two connections are read independently: under
 * load the heartbeat often arrives first, and the DBSIZE known then is the
 * previous probe's, from before the keys added since).
 */
#include "sources/redis_node.h"
#include "sources/redis_node_int.h"

#include "sources/redis_proto.h"
#include "util/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCAN_COUNT "1000"

/* ---- STRLEN batches ---- */

static struct redis_batch *batch_new(struct redis_node *n, int scan, uint32_t count, size_t bytes)
{
    size_t sz =
        sizeof(struct redis_batch) + count * (sizeof(struct redis_item) + sizeof(kvidx_key_t));
    struct redis_batch *b = malloc(sz + bytes + 1);
    if (!b)
        return NULL;
    b->n = n;
    b->scan = scan;
    b->count = 0;
    b->remaining = 0;
    b->keys = (kvidx_key_t *)(b + 1);
    b->items = (struct redis_item *)(b->keys + count);
    b->buf = (char *)(b->items + count);
    return b;
}

/* The registration of item i is current. */
static struct rmap_entry *current(struct redis_node *n, const struct redis_item *it)
{
    struct rmap_entry *e = rmap_get(&n->pending, it->b->buf + it->off, it->len);
    return e && e->a == it->token ? e : NULL;
}

static void deliver(struct redis_batch *b)
{
    struct redis_node *n = b->n;
    if (n->failing) {
        free(b);
        return;
    }
    int moved = 0;
    if (b->scan) {
        uint64_t *sizes = malloc(b->count * (sizeof(uint64_t) + sizeof(char *) + sizeof(uint32_t)));
        if (!sizes) {
            free(b);
            rn_fail(n, "out of memory");
            return;
        }
        const char **names = (const char **)(sizes + b->count);
        uint32_t *lens = (uint32_t *)(names + b->count);
        size_t k = 0;
        for (uint32_t i = 0; i < b->count; i++) {
            struct redis_item *it = &b->items[i];
            struct rmap_entry *e = current(n, it);
            if (!e)
                continue; /* a newer change of the key decides */
            rmap_del(&n->pending, e);
            if (it->size > 0) {
                b->keys[k] = b->keys[i];
                sizes[k] = (uint64_t)it->size;
                names[k] = b->buf + it->off;
                lens[k] = it->len;
                k++;
            } else if (it->size == SZ_WRONGTYPE) {
                n->scan_skipped++;
            } else if (it->size == SZ_MOVED) {
                moved = 1;
            }
        }
        int rc = k ? n->owner.put(n->owner.ctx, n, b->keys, sizes, names, lens, k) : 0;
        free(sizes);
        if (n->batches_inflight)
            n->batches_inflight--;
        free(b);
        if (rc != 0) {
            rn_fail(n, "out of memory while reporting keys");
            return;
        }
        if (n->scanning && n->scan_done && n->batches_inflight == 0) {
            n->scanning = 0;
            n->ever_scanned = 1;
            n->resyncs++;
            n->last_scan_end_ms = rn_now(n);
            n->skipped = n->scan_skipped;
            n->owner.scan_end(n->owner.ctx, n, n->scan_skipped);
            rn_set_state(n, RN_LIVE);
            if (n->resync_again)
                rn_start_scan(n);
        }
    } else {
        struct redis_item *it = &b->items[0];
        struct rmap_entry *e = current(n, it);
        if (e) {
            rmap_del(&n->pending, e);
            const char *name = b->buf + it->off;
            if (it->size > 0) {
                uint64_t size = (uint64_t)it->size;
                if (n->owner.put(n->owner.ctx, n, &b->keys[0], &size, &name, &it->len, 1) != 0) {
                    free(b);
                    rn_fail(n, "out of memory while reporting a key");
                    return;
                }
            } else if (it->size != SZ_LOST) {
                /* Absent, empty, not a string, or not on this node. */
                n->owner.del(n->owner.ctx, n, &b->keys[0], name, it->len);
                moved = it->size == SZ_MOVED;
            }
        }
        free(b);
    }
    if (moved && n->owner.moved)
        n->owner.moved(n->owner.ctx, n);
}

static void on_strlen(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_item *it = priv;
    struct redis_batch *b = it->b;
    struct redis_node *n = b->n;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r)) {
        it->size = SZ_LOST;
    } else if (r->type == REDIS_REPLY_INTEGER) {
        it->size = r->integer;
    } else if (rn_is_error(r, "WRONGTYPE")) {
        it->size = SZ_WRONGTYPE;
    } else if (rn_is_error(r, "MOVED") || rn_is_error(r, "ASK")) {
        it->size = SZ_MOVED;
    } else {
        it->size = SZ_LOST;
        rn_fail(n, "STRLEN failed on %s: %.*s", n->label,
                (int)(r->type == REDIS_REPLY_ERROR && r->len < 120 ? r->len : 0), r->str);
    }
    if (--b->remaining == 0)
        deliver(b);
}

static void on_asking(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    (void)ac;
    rn_cmd_reply(n, reply);
}

/* Registers and sends the STRLEN of every item of b. On a cluster node
 * each STRLEN follows an ASKING: a node importing a slot holds the keys
 * already moved to it (and those written to it meanwhile), yet answers
 * MOVED for them without ASKING, which would report them gone until the
 * migration ends, and no event comes for them then. ASKING changes
 * nothing for a slot the node neither serves nor imports (still MOVED). */
static void send_batch(struct redis_node *n, struct redis_batch *b)
{
    b->remaining = b->count;
    if (b->scan)
        n->batches_inflight++;
    for (uint32_t i = 0; i < b->count; i++) {
        struct redis_item *it = &b->items[i];
        int created;
        struct rmap_entry *e = rmap_put(&n->pending, b->buf + it->off, it->len, &created);
        if (!e) {
            rn_fail(n, "out of memory");
        } else {
            e->key = b->buf + it->off;
            e->a = it->token = ++n->next_token;
        }
        const char *asking[1] = {"ASKING"};
        const char *argv[2] = {"STRLEN", b->buf + it->off};
        size_t lens[2] = {6, it->len};
        if ((n->cfg.cluster && rn_send_strs(n, n->cmd, on_asking, n, 1, asking) != 0) ||
            rn_send_argv(n, n->cmd, on_strlen, it, 2, argv, lens) != 0) {
            it->size = SZ_LOST;
            if (--b->remaining == 0) {
                deliver(b);
                return;
            }
        }
    }
}

/* ---- events ---- */

static void on_event(struct redis_node *n, const char *ev, size_t evlen, const char *key,
                     size_t klen)
{
    n->events++;
    enum redis_event kind = redis_event_kind(ev, evlen);
    if (kind == REDIS_EV_IGNORE)
        return;
    const struct redis_url *u = n->cfg.url;
    kvidx_key_t k;
    if (redis_key_parse(u->prefix, u->prefix_len, key, klen, &k) != 0)
        return;
    if (kind == REDIS_EV_GONE) {
        struct rmap_entry *e = rmap_get(&n->pending, key, klen);
        if (e)
            rmap_del(&n->pending, e);
        n->owner.del(n->owner.ctx, n, &k, key, klen);
        return;
    }
    struct redis_batch *b = batch_new(n, 0, 1, klen);
    if (!b) {
        rn_fail(n, "out of memory");
        return;
    }
    memcpy(b->buf, key, klen);
    b->items[0] = (struct redis_item){.b = b, .off = 0, .len = (uint32_t)klen, .size = SZ_PENDING};
    /* The view must point into the batch, which outlives the reply. */
    redis_key_parse(u->prefix, u->prefix_len, b->buf, klen, &b->keys[0]);
    b->count = 1;
    send_batch(n, b);
}

static int str_is(const redisReply *r, const char *s)
{
    size_t l = strlen(s);
    return r->type == REDIS_REPLY_STRING && r->len == l && memcmp(r->str, s, l) == 0;
}

static void on_heartbeat(struct redis_node *n, const redisReply *payload)
{
    if (payload->type != REDIS_REPLY_STRING)
        return;
    char buf[32];
    size_t l = payload->len < sizeof(buf) - 1 ? payload->len : sizeof(buf) - 1;
    memcpy(buf, payload->str, l);
    buf[l] = '\0';
    uint64_t seq = strtoull(buf, NULL, 10);
    if (!n->hb_outstanding || seq != n->hb_seq)
        return;
    n->hb_outstanding = 0;
    n->lag_ms = rn_now(n) - n->hb_sent_ms;
    if (n->lag_ms > n->lag_max_ms)
        n->lag_max_ms = n->lag_ms;
    if (n->scanning || !n->ever_scanned)
        return;
    n->probe_hb_in = 1;
    rn_probe_check(n);
}

void rn_probe_check(struct redis_node *n)
{
    /* A scan that ended since the DBSIZE may hold keys added after it. */
    if (!n->probe_hb_in || !n->probe_dbsize_in || n->scanning || !n->ever_scanned ||
        n->resyncs != n->probe_resyncs)
        return;
    n->probe_hb_in = n->probe_dbsize_in = 0;
    uint64_t held = n->owner.held(n->owner.ctx, n);
    if (n->dbsize_at_hb < held) {
        /* Two probes in a row, so that a burst of deletions racing the
         * probe cannot trigger a rescan by itself. */
        if (++n->dbsize_short >= 2) {
            n->dbsize_short = 0;
            n->flushes++;
            log_info("%s: %s holds %" PRIu64 " keys, fewer than the %" PRIu64
                     " known: keys went without events (FLUSHDB, FLUSHALL, SWAPDB, a restart); "
                     "rescanning",
                     n->cfg.log_name, n->label, n->dbsize_at_hb, held);
            rn_start_scan(n);
        }
    } else {
        n->dbsize_short = 0;
    }
}

void rn_on_sub_msg(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!r || n->failing)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        /* SUBSCRIBE refused (ACL, LOADING): without the subscription the
         * session would wait for confirmations that never come. */
        rn_fail(n, "SUBSCRIBE refused by %s: %.*s", n->label, (int)(r->len > 120 ? 120 : r->len),
                r->str);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *kind = r->element[0], *ch = r->element[1], *payload = r->element[2];
    if (str_is(kind, "subscribe")) {
        n->sub_confirms++;
        rn_advance(n);
        return;
    }
    if (!str_is(kind, "message") || ch->type != REDIS_REPLY_STRING)
        return;
    if (str_is(ch, n->hb_channel)) {
        on_heartbeat(n, payload);
    } else if (str_is(ch, "__redis__:invalidate")) {
        /* A nil payload is FLUSHDB or FLUSHALL (of any database). */
        if (payload->type == REDIS_REPLY_NIL) {
            n->flushes++;
            log_info("%s: %s was flushed; rescanning", n->cfg.log_name, n->label);
            rn_start_scan(n);
        }
    } else if (payload->type == REDIS_REPLY_STRING) {
        const char *sep = memchr(ch->str, ':', ch->len);
        if (sep && ch->len >= 11 && memcmp(ch->str, "__keyevent@", 11) == 0)
            on_event(n, sep + 1, (size_t)(ch->str + ch->len - (sep + 1)), payload->str,
                     payload->len);
    }
}

/* ---- the full scan ---- */

static void on_scan(redisAsyncContext *ac, void *reply, void *priv);

static void send_scan(struct redis_node *n)
{
    const char *argv[4] = {"SCAN", n->cursor, "COUNT", SCAN_COUNT};
    if (rn_send_strs(n, n->cmd, on_scan, n, 4, argv) != 0)
        rn_fail(n, "cannot send SCAN to %s", n->label);
}

static void on_scan(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_node *n = priv;
    redisReply *r = reply;
    (void)ac;
    if (!rn_cmd_reply(n, r) || !n->scanning)
        return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->len >= sizeof(n->cursor)) {
        rn_fail(n, "SCAN failed on %s: %.*s", n->label,
                (int)(r->type == REDIS_REPLY_ERROR && r->len < 120 ? r->len : 0), r->str);
        return;
    }
    const redisReply *keys = r->element[1];
    memcpy(n->cursor, r->element[0]->str, r->element[0]->len);
    n->cursor[r->element[0]->len] = '\0';
    n->scan_done = strcmp(n->cursor, "0") == 0;
    /* The next SCAN goes out before this batch's STRLENs are answered:
     * one round trip per batch. */
    if (!n->scan_done)
        send_scan(n);
    size_t bytes = 0;
    for (size_t i = 0; i < keys->elements; i++)
        if (keys->element[i]->type == REDIS_REPLY_STRING)
            bytes += keys->element[i]->len + 1;
    struct redis_batch *b = batch_new(n, 1, (uint32_t)keys->elements, bytes);
    if (!b) {
        rn_fail(n, "out of memory");
        return;
    }
    const struct redis_url *u = n->cfg.url;
    size_t off = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING) {
            n->scan_skipped++;
            continue;
        }
        memcpy(b->buf + off, k->str, k->len);
        b->buf[off + k->len] = '\0';
        if (redis_key_parse(u->prefix, u->prefix_len, b->buf + off, k->len, &b->keys[b->count]) !=
            0) {
            n->scan_skipped++;
            continue;
        }
        b->items[b->count] = (struct redis_item){
            .b = b, .off = (uint32_t)off, .len = (uint32_t)k->len, .size = SZ_PENDING};
        b->count++;
        off += k->len + 1;
    }
    if (b->count == 0) {
        /* Nothing to ask: report the (empty) batch at once, which also
         * completes the scan when this was the last one. */
        n->batches_inflight++;
        b->remaining = 0;
        deliver(b);
        return;
    }
    send_batch(n, b);
}

void rn_start_scan(struct redis_node *n)
{
    if (!n->session_up || n->failing)
        return;
    if (n->scanning) {
        n->resync_again = 1;
        return;
    }
    n->scanning = 1;
    n->resync_again = 0;
    n->scan_done = 0;
    n->scan_skipped = 0;
    n->dbsize_short = 0;
    strcpy(n->cursor, "0");
    rn_set_state(n, n->ever_scanned ? RN_RESCANNING : RN_SCANNING);
    n->owner.scan_begin(n->owner.ctx, n);
    send_scan(n);
}

void redis_node_resync(struct redis_node *n)
{
    rn_start_scan(n);
}
