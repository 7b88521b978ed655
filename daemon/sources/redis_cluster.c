/*
 * The "redis+cluster://" source: every primary of a Redis/Valkey Cluster,
 * each followed by its own redis_node, their keys united into one source.
 *
 * The topology comes from CLUSTER SLOTS, asked of a known node or a seed
 * every 5 s (every second while a node is down or unknown, and at once
 * after a MOVED/ASK reply): a new primary gets a node that subscribes and
 * scans; a node that is no longer a primary (failed over, emptied by
 * resharding) is retired only once every current primary has completed a
 * scan, so that keys taken over by a promoted replica never vanish for a
 * moment.
 *
 * Invariants: `presence` maps each key name some node holds to the set of
 * nodes holding it (a: present bits, b: seen in the node's current scan);
 * a key is in the sink exactly when its present set is not empty, so a key
 * seen on two nodes during a slot migration counts once and leaves only
 * when the last node lets it go. A node's scan ends by dropping its bit
 * from every key it did not see; retiring a node drops its bit from all.
 */
#include "sources/redis.h"

#include "sources/redis_map.h"
#include "sources/redis_node.h"
#include "sources/redis_proto.h"
#include "sources/redis_url.h"
#include "sources/redis_uv.h"
#include "state/sources.h"
#include "util/context.h"
#include "util/json_write.h"
#include "util/log.h"

#include "kvidx/err.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODES_MAX    64 /* primaries followed at once: one bit each */
#define TOPO_SLOW_MS 5000
#define TOPO_FAST_MS 1000

struct redis_cluster;

struct cnode {
    struct redis_node node; /* first */
    struct redis_cluster *c;
    int retiring;
    uint64_t held;
};

struct redis_cluster {
    struct source base; /* first */
    struct redis_url url;
    struct cnode *nodes[NODES_MAX];
    struct rmap presence;
    uint64_t skipped_nodes; /* primaries past NODES_MAX, not followed */

    redisAsyncContext *topo;
    uv_timer_t topo_timer;
    uv_getaddrinfo_t gai;
    int gai_busy, topo_busy, topo_known, topo_wanted, stopping, handles;
    char topo_host[REDIS_HOST_MAX];
    struct redis_addr topo_addr;
    size_t topo_next;
    uint64_t topo_last_ms, topo_refreshes, topo_changes;
    char topo_error[512];
};

static uint64_t bit(const struct cnode *cn)
{
    return UINT64_C(1) << cn->node.index;
}

static void update_state(struct redis_cluster *c);
static void try_retire(struct redis_cluster *c);

/* ---- the presence map and the sink ---- */

static void sink_del_name(struct redis_cluster *c, const char *name, size_t len)
{
    kvidx_key_t k;
    if (redis_key_parse(c->url.prefix, c->url.prefix_len, name, len, &k) == 0)
        source_del(&c->base, &k, 1);
}

/* Drops bit from e's present set (and seen set); removes e and the key
 * when no node holds it any more. */
static void drop_bit(struct redis_cluster *c, struct cnode *cn, struct rmap_entry *e, uint64_t b)
{
    if (e->a & b) {
        e->a &= ~b;
        if (cn)
            cn->held--;
    }
    e->b &= ~b;
    if (e->a == 0) {
        sink_del_name(c, e->key, e->len);
        rmap_del(&c->presence, e);
    }
}

static void own_scan_begin(void *ctx, struct redis_node *n)
{
    struct cnode *cn = ctx;
    struct rmap *m = &cn->c->presence;
    uint64_t b = bit(cn);
    (void)n;
    cn->c->base.scan_started_ms = app_now_ms(cn->c->base.app);
    for (size_t i = 0; i < m->cap; i++)
        if (rmap_live(&m->e[i]))
            m->e[i].b &= ~b;
    update_state(cn->c);
}

static void own_scan_end(void *ctx, struct redis_node *n, uint64_t skipped)
{
    struct cnode *cn = ctx;
    struct redis_cluster *c = cn->c;
    struct rmap *m = &c->presence;
    uint64_t b = bit(cn);
    (void)n;
    (void)skipped;
    for (size_t i = 0; i < m->cap; i++) {
        struct rmap_entry *e = &m->e[i];
        if (!rmap_live(e))
            continue;
        if ((e->a & b) && !(e->b & b))
            drop_bit(c, cn, e, b);
        else
            e->b &= ~b;
    }
    uint64_t sk = 0;
    for (int i = 0; i < NODES_MAX; i++)
        if (c->nodes[i])
            sk += c->nodes[i]->node.skipped;
    c->base.skipped = sk;
    /* The source has completed a full scan when every primary has. */
    int all = 1;
    for (int i = 0; i < NODES_MAX; i++)
        if (c->nodes[i] && !c->nodes[i]->retiring && !c->nodes[i]->node.ever_scanned)
            all = 0;
    if (all) {
        c->base.resyncs++;
        c->base.last_scan_ms = app_now_ms(c->base.app) - c->base.scan_started_ms;
    }
    try_retire(c);
    update_state(c);
}

static int own_put(void *ctx, struct redis_node *n, const kvidx_key_t *keys, const uint64_t *sizes,
                   const char *const *names, const uint32_t *lens, size_t k)
{
    struct cnode *cn = ctx;
    uint64_t b = bit(cn);
    (void)n;
    for (size_t i = 0; i < k; i++) {
        int created;
        struct rmap_entry *e = rmap_put(&cn->c->presence, names[i], lens[i], &created);
        if (!e)
            return KVIDX_ENOMEM;
        if (!(e->a & b)) {
            e->a |= b;
            cn->held++;
        }
        e->b |= b;
    }
    return source_put(&cn->c->base, keys, sizes, k);
}

static int own_del(void *ctx, struct redis_node *n, const kvidx_key_t *key, const char *name,
                   size_t len)
{
    struct cnode *cn = ctx;
    (void)n;
    (void)key;
    struct rmap_entry *e = rmap_get(&cn->c->presence, name, len);
    if (e)
        drop_bit(cn->c, cn, e, bit(cn));
    return 0;
}

static void topo_soon(struct redis_cluster *c)
{
    c->topo_wanted = 1;
}

static void own_state(void *ctx, struct redis_node *n)
{
    struct cnode *cn = ctx;
    if (n->state == RN_RECONNECTING)
        topo_soon(cn->c);
    update_state(cn->c);
}

static void own_moved(void *ctx, struct redis_node *n)
{
    struct cnode *cn = ctx;
    (void)n;
    topo_soon(cn->c);
}

static uint64_t own_held(void *ctx, const struct redis_node *n)
{
    const struct cnode *cn = ctx;
    (void)n;
    return cn->held;
}

/* ---- nodes ---- */

static void update_state(struct redis_cluster *c)
{
    if (c->stopping)
        return;
    int any = 0, unscanned = 0, down = 0, busy = 0;
    const char *err = c->topo_error;
    for (int i = 0; i < NODES_MAX; i++) {
        struct cnode *cn = c->nodes[i];
        if (!cn)
            continue;
        any = 1;
        if (!cn->node.ever_scanned && !cn->retiring)
            unscanned = 1;
        if (cn->node.state == RN_RECONNECTING) {
            down = 1;
            err = cn->node.last_error;
        }
        if (cn->node.scanning)
            busy = 1;
    }
    if (!any || unscanned)
        source_set_state(&c->base, SOURCE_SCANNING, err[0] ? err : NULL);
    else if (down)
        source_set_state(&c->base, SOURCE_RECONNECTING, err);
    else if (busy)
        source_set_state(&c->base, SOURCE_RESCANNING, NULL);
    else
        source_set_state(&c->base, SOURCE_LIVE, "");
    /* Every primary is followed and scanned since it was last reached. */
    if (any && !unscanned && !down)
        c->base.stale = 0;
}

static void on_cnode_closed(struct redis_node *n)
{
    struct cnode *cn = (struct cnode *)n;
    struct redis_cluster *c = cn->c;
    redis_node_free(n);
    free(cn);
    c->handles--;
}

static void retire(struct redis_cluster *c, int idx)
{
    struct cnode *cn = c->nodes[idx];
    struct rmap *m = &c->presence;
    uint64_t b = bit(cn);
    log_info("%s: %s is no longer a primary; its keys now come from the new ones", c->base.name,
             cn->node.label);
    for (size_t i = 0; i < m->cap; i++)
        if (rmap_live(&m->e[i]) && (m->e[i].a & b))
            drop_bit(c, cn, &m->e[i], b);
    c->nodes[idx] = NULL;
    c->handles++;
    redis_node_stop(&cn->node, on_cnode_closed);
}

/* Retires the nodes that left the topology once every current primary
 * has completed a scan (the keys they took over are in by then). */
static void try_retire(struct redis_cluster *c)
{
    for (int i = 0; i < NODES_MAX; i++) {
        struct cnode *cn = c->nodes[i];
        if (cn && !cn->retiring && (!cn->node.ever_scanned || cn->node.scanning))
            return;
    }
    for (int i = 0; i < NODES_MAX; i++)
        if (c->nodes[i] && c->nodes[i]->retiring)
            retire(c, i);
}

static int add_node(struct redis_cluster *c, const struct redis_addr *a)
{
    int idx = -1;
    for (int i = 0; i < NODES_MAX && idx < 0; i++)
        if (!c->nodes[i])
            idx = i;
    if (idx < 0) {
        c->skipped_nodes++;
        return KVIDX_EINVAL;
    }
    struct cnode *cn = calloc(1, sizeof(*cn));
    if (!cn)
        return KVIDX_ENOMEM;
    cn->c = c;
    const struct config *cfg = &c->base.app->cfg;
    struct redis_node_cfg nc = {
        .loop = c->base.app->loop,
        .url = &c->url,
        .addr = *a,
        .cluster = 1,
        .rescan_ms = cfg->l2_source_rescan_s * 1000,
        .reconnect_max_ms = cfg->l2_source_reconnect_max_ms,
        .configure = cfg->l2_source_configure,
        .log_name = c->base.name,
    };
    struct redis_node_owner owner = {
        .ctx = cn,
        .scan_begin = own_scan_begin,
        .scan_end = own_scan_end,
        .put = own_put,
        .del = own_del,
        .state = own_state,
        .moved = own_moved,
        .held = own_held,
    };
    redis_node_init(&cn->node, &nc, &owner, idx);
    c->nodes[idx] = cn;
    log_info("%s: following primary %s", c->base.name, cn->node.label);
    redis_node_start(&cn->node);
    return 0;
}

/* ---- topology ---- */

static void reconcile(struct redis_cluster *c, const struct redis_addr *prim, size_t np)
{
    int changed = 0;
    for (int i = 0; i < NODES_MAX; i++) {
        struct cnode *cn = c->nodes[i];
        if (!cn)
            continue;
        int found = 0;
        for (size_t j = 0; j < np && !found; j++)
            found = cn->node.cfg.addr.port == prim[j].port &&
                    strcmp(cn->node.cfg.addr.host, prim[j].host) == 0;
        if (found != !cn->retiring) {
            cn->retiring = !found;
            changed = 1;
            if (!found)
                log_info("%s: %s is no longer a primary; its keys stay until the primaries are "
                         "scanned",
                         c->base.name, cn->node.label);
        }
    }
    for (size_t j = 0; j < np; j++) {
        int found = 0;
        for (int i = 0; i < NODES_MAX && !found; i++)
            found = c->nodes[i] && c->nodes[i]->node.cfg.addr.port == prim[j].port &&
                    strcmp(c->nodes[i]->node.cfg.addr.host, prim[j].host) == 0;
        if (!found && add_node(c, &prim[j]) == 0)
            changed = 1;
    }
    if (changed)
        c->topo_changes++;
    try_retire(c);
    update_state(c);
}

static void on_slots(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_cluster *c = priv;
    redisReply *r = reply;
    (void)ac;
    c->topo_busy = 0;
    if (!r || c->stopping)
        return;
    c->topo_last_ms = app_now_ms(c->base.app);
    if (r->type != REDIS_REPLY_ARRAY) {
        snprintf(c->topo_error, sizeof(c->topo_error), "CLUSTER SLOTS failed on %s:%d: %.*s",
                 c->topo_addr.host, c->topo_addr.port,
                 (int)(r->type == REDIS_REPLY_ERROR && r->len < 120 ? r->len : 0), r->str);
        log_warn("%s: %s", c->base.name, c->topo_error);
        c->topo_next++;
        update_state(c);
        return;
    }
    static struct redis_addr prim[NODES_MAX * 2];
    size_t np = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3)
            continue;
        const redisReply *m = range->element[2];
        if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING || m->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        struct redis_addr a;
        const char *host = m->element[0]->str;
        size_t hl = m->element[0]->len;
        if (hl == 0) { /* the node we asked */
            host = c->topo_host;
            hl = strlen(host);
        }
        if (hl >= sizeof(a.host) || (hl == 1 && host[0] == '?'))
            continue;
        memcpy(a.host, host, hl);
        a.host[hl] = '\0';
        a.port = (int)m->element[1]->integer;
        int dup = 0;
        for (size_t j = 0; j < np && !dup; j++)
            dup = prim[j].port == a.port && strcmp(prim[j].host, a.host) == 0;
        if (!dup && np < sizeof(prim) / sizeof(prim[0]))
            prim[np++] = a;
    }
    c->topo_known = 1;
    c->topo_error[0] = '\0';
    c->topo_refreshes++;
    reconcile(c, prim, np);
}

static void on_topo_connect(const redisAsyncContext *ac, int status)
{
    struct redis_cluster *c = ac->data;
    if (status == REDIS_OK)
        return;
    if (ac == c->topo)
        c->topo = NULL;
    c->topo_busy = 0;
    c->topo_next++;
    snprintf(c->topo_error, sizeof(c->topo_error), "cannot connect to %s:%d", c->topo_addr.host,
             c->topo_addr.port);
}

static void on_topo_disconnect(const redisAsyncContext *ac, int status)
{
    struct redis_cluster *c = ac->data;
    (void)status;
    if (ac == c->topo) {
        c->topo = NULL;
        c->topo_busy = 0;
        c->topo_next++;
    }
}

static void on_topo_auth(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_cluster *c = priv;
    redisReply *r = reply;
    (void)ac;
    if (r && r->type == REDIS_REPLY_ERROR)
        snprintf(c->topo_error, sizeof(c->topo_error), "AUTH refused by %s:%d", c->topo_addr.host,
                 c->topo_addr.port);
}

static void send_slots(struct redis_cluster *c)
{
    if (redisAsyncCommand(c->topo, on_slots, c, "CLUSTER SLOTS") != REDIS_OK)
        c->topo_busy = 0;
}

static void on_topo_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct redis_cluster *c = req->data;
    c->gai_busy = 0;
    if (c->stopping || status != 0 || !res) {
        if (res)
            uv_freeaddrinfo(res);
        if (c->stopping)
            c->handles--;
        c->topo_busy = 0;
        c->topo_next++;
        return;
    }
    if (res->ai_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)res->ai_addr, c->topo_host, sizeof(c->topo_host));
    else
        uv_ip4_name((const struct sockaddr_in *)res->ai_addr, c->topo_host, sizeof(c->topo_host));
    uv_freeaddrinfo(res);
    redisAsyncContext *ac = redisAsyncConnect(c->topo_host, c->topo_addr.port);
    if (!ac || ac->err || redis_uv_attach(ac, c->base.app->loop) != 0) {
        if (ac)
            redisAsyncFree(ac);
        c->topo_busy = 0;
        c->topo_next++;
        return;
    }
    ac->data = c;
    c->topo = ac;
    redisAsyncSetConnectCallback(ac, on_topo_connect);
    redisAsyncSetDisconnectCallback(ac, on_topo_disconnect);
    if (c->url.has_password) {
        if (c->url.user[0])
            redisAsyncCommand(ac, on_topo_auth, c, "AUTH %s %s", c->url.user, c->url.password);
        else
            redisAsyncCommand(ac, on_topo_auth, c, "AUTH %s", c->url.password);
    }
    send_slots(c);
}

/* Asks CLUSTER SLOTS of a live primary, else of the next candidate
 * (followed nodes, then the seeds, in turn). */
static void topo_refresh(struct redis_cluster *c)
{
    if (c->topo_busy || c->stopping)
        return;
    c->topo_busy = 1;
    c->topo_wanted = 0;
    if (c->topo) {
        send_slots(c);
        return;
    }
    struct redis_addr cand[NODES_MAX + REDIS_SEEDS_MAX];
    size_t nc = 0;
    for (int live = 1; live >= 0; live--)
        for (int i = 0; i < NODES_MAX; i++)
            if (c->nodes[i] && !c->nodes[i]->retiring &&
                (c->nodes[i]->node.state == RN_LIVE) == live)
                cand[nc++] = c->nodes[i]->node.cfg.addr;
    for (size_t i = 0; i < c->url.nseeds; i++)
        cand[nc++] = c->url.seeds[i];
    c->topo_addr = cand[c->topo_next % nc];
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    c->gai.data = c;
    if (uv_getaddrinfo(c->base.app->loop, &c->gai, on_topo_resolved, c->topo_addr.host, NULL,
                       &hints) != 0) {
        c->topo_busy = 0;
        c->topo_next++;
        return;
    }
    c->gai_busy = 1;
}

static void on_topo_timer(uv_timer_t *t)
{
    struct redis_cluster *c = t->data;
    uint64_t now = app_now_ms(c->base.app);
    int healthy = c->topo_known;
    for (int i = 0; i < NODES_MAX && healthy; i++)
        if (c->nodes[i] && (c->nodes[i]->node.state == RN_RECONNECTING || c->nodes[i]->retiring))
            healthy = 0;
    uint64_t every = healthy ? TOPO_SLOW_MS : TOPO_FAST_MS;
    if (c->topo_wanted || now - c->topo_last_ms >= every)
        topo_refresh(c);
}

/* ---- source_ops ---- */

static int op_start(struct source *s)
{
    struct redis_cluster *c = (struct redis_cluster *)s;
    uv_timer_init(s->app->loop, &c->topo_timer);
    c->topo_timer.data = c;
    c->handles++;
    uv_timer_start(&c->topo_timer, on_topo_timer, 250, 250);
    topo_refresh(c);
    return 0;
}

static void on_timer_closed(uv_handle_t *h)
{
    struct redis_cluster *c = h->data;
    c->handles--;
}

static void op_stop(struct source *s)
{
    struct redis_cluster *c = (struct redis_cluster *)s;
    if (c->stopping)
        return;
    c->stopping = 1;
    if (c->gai_busy)
        c->handles++; /* on_topo_resolved still runs */
    if (c->topo) {
        redisAsyncContext *ac = c->topo;
        c->topo = NULL;
        redisAsyncFree(ac);
    }
    if (c->handles) /* the timer exists once started */
        uv_close((uv_handle_t *)&c->topo_timer, on_timer_closed);
    for (int i = 0; i < NODES_MAX; i++) {
        struct cnode *cn = c->nodes[i];
        if (cn) {
            c->nodes[i] = NULL;
            c->handles++;
            redis_node_stop(&cn->node, on_cnode_closed);
        }
    }
}

static void op_free(struct source *s)
{
    struct redis_cluster *c = (struct redis_cluster *)s;
    for (int i = 0; i < NODES_MAX; i++)
        if (c->nodes[i]) {
            redis_node_free(&c->nodes[i]->node);
            free(c->nodes[i]);
        }
    rmap_free(&c->presence);
    redis_url_wipe(&c->url);
    free(c);
}

static void op_stats(const struct source *s, struct jw *w)
{
    const struct redis_cluster *c = (const struct redis_cluster *)s;
    jw_key(w, "prefix");
    jw_strn(w, c->url.prefix, c->url.prefix_len);
    jw_key(w, "topology_refreshes");
    jw_u64(w, c->topo_refreshes);
    jw_key(w, "topology_changes");
    jw_u64(w, c->topo_changes);
    jw_key(w, "primaries_not_followed");
    jw_u64(w, c->skipped_nodes);
    jw_key(w, "topology_error");
    jw_str(w, c->topo_error);
    jw_key(w, "nodes");
    jw_arr_begin(w);
    for (int i = 0; i < NODES_MAX; i++) {
        const struct cnode *cn = c->nodes[i];
        if (!cn)
            continue;
        jw_obj_begin(w);
        redis_node_stats(&cn->node, w);
        jw_key(w, "keys");
        jw_u64(w, cn->held);
        jw_key(w, "retiring");
        jw_bool(w, cn->retiring);
        jw_obj_end(w);
    }
    jw_arr_end(w);
}

static void op_metrics(const struct source *s, struct buf *out)
{
    const struct redis_cluster *c = (const struct redis_cluster *)s;
    for (int i = 0; i < NODES_MAX; i++) {
        const struct cnode *cn = c->nodes[i];
        if (!cn)
            continue;
        redis_node_metrics(s->name, &cn->node, out, 1);
        buf_puts(out, "# HELP kvidx_redis_node_keys Keys the source holds from this primary.\n"
                      "# TYPE kvidx_redis_node_keys gauge\n");
        buf_printf(out, "kvidx_redis_node_keys{source=\"");
        for (const char *p = s->name; *p; p++) {
            if (*p == '\\' || *p == '"')
                buf_putc(out, '\\');
            buf_putc(out, *p == '\n' ? ' ' : *p);
        }
        buf_printf(out, "\",node=\"%s\"} %" PRIu64 "\n", cn->node.label, cn->held);
    }
}

static const struct source_ops cluster_ops = {
    .kind = "redis+cluster",
    .start = op_start,
    .stop = op_stop,
    .free = op_free,
    .stats = op_stats,
    .metrics = op_metrics,
};

int redis_cluster_source_create(struct app *app, const char *spec, struct source **out, char *err,
                                size_t errlen)
{
    struct redis_cluster *c = calloc(1, sizeof(*c));
    if (!c)
        return KVIDX_ENOMEM;
    int rc = redis_url_parse(spec, &c->url, err, errlen);
    if (rc == 0 && !c->url.cluster) {
        snprintf(err, errlen, "l2_source: a redis:// URL is not a redis+cluster:// one");
        rc = KVIDX_EINVAL;
    }
    if (rc != 0) {
        redis_url_wipe(&c->url);
        free(c);
        return rc;
    }
    c->base.ops = &cluster_ops;
    c->base.app = app;
    snprintf(c->base.name, sizeof(c->base.name), "%s", c->url.name);
    rmap_init(&c->presence, 1);
    *out = &c->base;
    return 0;
}
