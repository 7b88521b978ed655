/*
 * Instances of the fleet directory: the registry (registration data and
 * liveness), dropping an instance's stream (deregistration, expiry), the
 * capacity declarations, and the per-instance reads (streams, statistics,
 * compartments).
 *
 * A registration holds copies of its strings; registered instances form a
 * list in registration order (a re-registration keeps its place). Dropping
 * a stream fences the instance, forgets its cursor (a later batch opens a
 * fresh one at any incarnation) and its declaration; its L2 placements
 * stay. A declaration is the set of compartments (tier, backend) of one
 * stamp (incarnation, capacity_revision): a newer stamp starts a new set,
 * the same stamp extends it (the last batch for a compartment wins), an
 * older one is ignored.
 */
#include "directory_int.h"

#include <math.h>

/* ---- declarations ---- */

int dr_caps_reserve(kvidx_directory_t *d, inst_t *in, size_t k)
{
    void *arr = in->caps;
    int rc = dr_grow(d, &arr, &in->caps_cap, in->ncaps + k, sizeof(dcap_t));
    in->caps = arr;
    return rc;
}

void dr_caps_clear(kvidx_directory_t *d, inst_t *in)
{
    for (size_t i = 0; i < in->ncaps; i++)
        dr_str_unref(d, in->caps[i].backend);
    in->ncaps = 0;
}

static int stamp_cmp(uint64_t ai, uint64_t ar, uint64_t bi, uint64_t br)
{
    if (ai != bi)
        return ai < bi ? -1 : 1;
    return ar < br ? -1 : ar > br;
}

void dr_caps_apply(kvidx_directory_t *d, inst_t *in, uint64_t inc, uint64_t rev, unsigned tier,
                   uint32_t backend, int shared, uint64_t capacity)
{
    if (in->has_decl) {
        int c = stamp_cmp(inc, rev, in->decl_inc, in->decl_rev);
        if (c < 0)
            return;
        if (c > 0)
            dr_caps_clear(d, in);
    }
    in->has_decl = 1;
    in->decl_inc = inc;
    in->decl_rev = rev;
    for (size_t i = 0; i < in->ncaps; i++) {
        dcap_t *c = &in->caps[i];
        if (c->tier == tier && c->backend == backend) {
            c->capacity = capacity;
            c->shared = (uint8_t)(shared != 0);
            return;
        }
    }
    dr_str_ref(d, backend);
    in->caps[in->ncaps++] = (dcap_t){backend, (uint8_t)tier, (uint8_t)(shared != 0), capacity};
}

/* ---- streams ---- */

void dr_drop_stream(kvidx_directory_t *d, inst_t *in)
{
    dr_fence(d, in);
    in->has_cursor = 0;
    in->gap = 0;
    in->incarnation = in->last_seq = 0;
    in->applied = in->duplicates = in->stale = 0;
    in->last_ts = 0.0;
    dr_caps_clear(d, in);
    in->has_decl = 0;
    in->decl_inc = in->decl_rev = 0;
}

/* ---- registrations ---- */

void dr_registration_clear(kvidx_directory_t *d, inst_t *in)
{
    if (!in->registered)
        return;
    dr_free(d, in->ip, in->ip_len + 1);
    dr_free(d, in->p2p, in->p2p_len + 1);
    dr_free(d, in->meta, in->meta_len + 1);
    in->ip = in->p2p = in->meta = NULL;
    in->ip_len = in->p2p_len = in->meta_len = 0;
    if (in->reg_prev)
        in->reg_prev->reg_next = in->reg_next;
    else
        d->reg_head = in->reg_next;
    if (in->reg_next)
        in->reg_next->reg_prev = in->reg_prev;
    else
        d->reg_tail = in->reg_prev;
    in->reg_prev = in->reg_next = NULL;
    in->registered = 0;
    d->nregistered--;
}

static char *copy_str(kvidx_directory_t *d, const char *s, size_t n)
{
    char *c = dr_alloc(d, n + 1);
    if (c) {
        if (n)
            memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

static int instance_check(const kvidx_dir_instance_t *x)
{
    if (!x->instance_id || x->instance_len == 0 || x->instance_len > KVIDX_DIR_ID_MAX)
        return KVIDX_EINVAL;
    if (!x->ip || x->ip_len == 0 || x->ip_len > KVIDX_DIR_ID_MAX)
        return KVIDX_EINVAL;
    if (x->http_port < 1 || x->http_port > 65535 || x->mq_port > 65535)
        return KVIDX_EINVAL;
    if (x->p2p_len > KVIDX_DIR_ID_MAX || (x->p2p_len && !x->p2p_advertised_url))
        return KVIDX_EINVAL;
    if (x->metadata_len > 65536 || (x->metadata_len && !x->metadata))
        return KVIDX_EINVAL;
    if (!isfinite(x->registration_time))
        return KVIDX_EINVAL;
    return 0;
}

int kvidx_directory_register(kvidx_directory_t *d, const kvidx_dir_instance_t *x,
                             int *re_registered)
{
    return dr_register(d, x, re_registered, 1);
}

int dr_register(kvidx_directory_t *d, const kvidx_dir_instance_t *x, int *re_registered, int notify)
{
    if (instance_check(x))
        return KVIDX_EINVAL;
    inst_t *in;
    if (dr_inst_get(d, x->instance_id, x->instance_len, &in))
        return KVIDX_ENOMEM;
    char *ip = copy_str(d, x->ip, x->ip_len);
    char *p2p = copy_str(d, x->p2p_advertised_url, x->p2p_len);
    char *meta = copy_str(d, x->metadata, x->metadata_len);
    if (!ip || !p2p || !meta) {
        dr_free(d, ip, x->ip_len + 1);
        dr_free(d, p2p, x->p2p_len + 1);
        dr_free(d, meta, x->metadata_len + 1);
        dr_inst_unpin(d, in);
        return KVIDX_ENOMEM;
    }
    int was = in->registered;
    if (was) {
        dr_free(d, in->ip, in->ip_len + 1);
        dr_free(d, in->p2p, in->p2p_len + 1);
        dr_free(d, in->meta, in->meta_len + 1);
    } else {
        in->registered = 1;
        in->reg_prev = d->reg_tail;
        in->reg_next = NULL;
        if (d->reg_tail)
            d->reg_tail->reg_next = in;
        else
            d->reg_head = in;
        d->reg_tail = in;
        d->nregistered++;
    }
    in->ip = ip;
    in->ip_len = x->ip_len;
    in->p2p = p2p;
    in->p2p_len = x->p2p_len;
    in->meta = meta;
    in->meta_len = x->metadata_len;
    in->http_port = x->http_port;
    in->mq_port = x->mq_port;
    in->reg_time = x->registration_time;
    in->last_seen_ms = x->last_seen_ms;
    if (re_registered)
        *re_registered = was;
    if (notify) {
        kvidx_dir_change_t c = {.type = KVIDX_DIR_CHG_REGISTER, .instance = x};
        dr_notify(d, &c);
    }
    dr_inst_unpin(d, in);
    return 0;
}

int kvidx_directory_heartbeat(kvidx_directory_t *d, const char *id, size_t len, uint64_t now_ms)
{
    inst_t *in = dr_inst_find(d, id, len);
    if (!in || !in->registered)
        return KVIDX_ENOTFOUND;
    in->last_seen_ms = now_ms;
    kvidx_dir_change_t c = {
        .type = KVIDX_DIR_CHG_HEARTBEAT, .instance_id = id, .instance_len = len, .now_ms = now_ms};
    dr_notify(d, &c);
    return 0;
}

/* Deregistration and expiry: the registration goes, then the stream. */
static void drop_instance(kvidx_directory_t *d, inst_t *in, kvidx_dir_change_type_t type,
                          uint64_t now_ms)
{
    in->pins++;
    dr_registration_clear(d, in);
    dr_drop_stream(d, in);
    const dstr_t *s = &d->strs[in->sid];
    kvidx_dir_change_t c = {
        .type = type, .instance_id = s->s, .instance_len = s->len, .now_ms = now_ms};
    dr_notify(d, &c);
    dr_inst_unpin(d, in);
}

int kvidx_directory_deregister(kvidx_directory_t *d, const char *id, size_t len)
{
    inst_t *in = dr_inst_find(d, id, len);
    if (!in || !in->registered)
        return KVIDX_ENOTFOUND;
    drop_instance(d, in, KVIDX_DIR_CHG_DEREGISTER, 0);
    return 0;
}

void kvidx_directory_expire(kvidx_directory_t *d, uint64_t now_ms, uint64_t timeout_ms,
                            size_t *expired)
{
    size_t n = 0;
    for (inst_t *in = d->reg_head; in;) {
        inst_t *next = in->reg_next;
        if (now_ms > in->last_seen_ms && now_ms - in->last_seen_ms > timeout_ms) {
            drop_instance(d, in, KVIDX_DIR_CHG_EXPIRE, now_ms);
            n++;
        }
        in = next;
    }
    if (expired)
        *expired = n;
}

static void instance_view(const kvidx_directory_t *d, const inst_t *in, kvidx_dir_instance_t *out)
{
    const dstr_t *s = &d->strs[in->sid];
    *out = (kvidx_dir_instance_t){.instance_id = s->s,
                                  .instance_len = s->len,
                                  .ip = in->ip,
                                  .ip_len = in->ip_len,
                                  .http_port = in->http_port,
                                  .mq_port = in->mq_port,
                                  .p2p_advertised_url = in->p2p,
                                  .p2p_len = in->p2p_len,
                                  .metadata = in->meta,
                                  .metadata_len = in->meta_len,
                                  .registration_time = in->reg_time,
                                  .last_seen_ms = in->last_seen_ms};
}

int kvidx_directory_instance(const kvidx_directory_t *d, const char *id, size_t len,
                             kvidx_dir_instance_t *out)
{
    const inst_t *in = dr_inst_find(d, id, len);
    if (!in || !in->registered)
        return KVIDX_ENOTFOUND;
    instance_view(d, in, out);
    return 0;
}

int kvidx_directory_instances(const kvidx_directory_t *d,
                              int (*cb)(void *ctx, const kvidx_dir_instance_t *in), void *ctx)
{
    for (const inst_t *in = d->reg_head; in; in = in->reg_next) {
        kvidx_dir_instance_t v;
        instance_view(d, in, &v);
        int rc = cb(ctx, &v);
        if (rc)
            return rc;
    }
    return 0;
}

size_t kvidx_directory_instance_count(const kvidx_directory_t *d)
{
    return d->nregistered;
}

/* ---- per-instance reads ---- */

int kvidx_directory_streams(const kvidx_directory_t *d,
                            int (*cb)(void *ctx, const kvidx_dir_stream_t *s), void *ctx)
{
    for (size_t i = 0; i < d->ninsts; i++) {
        const inst_t *in = d->insts[i];
        if (!in->has_cursor)
            continue;
        const dstr_t *s = &d->strs[in->sid];
        kvidx_dir_stream_t v = {s->s,        s->len,         in->incarnation, in->last_seq, in->gap,
                                in->applied, in->duplicates, in->stale,       in->last_ts};
        int rc = cb(ctx, &v);
        if (rc)
            return rc;
    }
    return 0;
}

/* Keys with an L1 placement the instance last reported: in a key's sorted
 * list those placements are adjacent, so each run is counted at its end. */
static uint64_t l1_keys(const kvidx_directory_t *d, const inst_t *in)
{
    uint64_t n = 0;
    for (uint32_t s = in->src_head; s != NONE; s = S(d, s)->next) {
        if (S(d, s)->tier != KVIDX_DIR_L1)
            continue;
        for (uint32_t p = S(d, s)->head; p != NONE; p = P(d, p)->snext) {
            uint32_t next = P(d, p)->next;
            if (next & KEY_TAG) {
                n++;
                continue;
            }
            const dsrc_t *x = S(d, P(d, next)->src);
            if (x->inst != in->sid || x->tier != KVIDX_DIR_L1)
                n++;
        }
    }
    return n;
}

int kvidx_directory_inst_stats(const kvidx_directory_t *d,
                               int (*cb)(void *ctx, const kvidx_dir_inst_stats_t *s), void *ctx)
{
    for (size_t i = 0; i < d->ninsts; i++) {
        const inst_t *in = d->insts[i];
        const dstr_t *s = &d->strs[in->sid];
        kvidx_dir_inst_stats_t v = {.instance_id = s->s,
                                    .instance_len = s->len,
                                    .has_cursor = in->has_cursor,
                                    .registered = in->registered,
                                    .l1_keys = l1_keys(d, in)};
        for (uint32_t x = in->src_head; x != NONE; x = S(d, x)->next) {
            v.placements[S(d, x)->tier - 1] += S(d, x)->nplace;
            v.bytes[S(d, x)->tier - 1] += S(d, x)->bytes;
        }
        int rc = cb(ctx, &v);
        if (rc)
            return rc;
    }
    return 0;
}

int kvidx_directory_capacities(const kvidx_directory_t *d,
                               int (*cb)(void *ctx, const kvidx_dir_capacity_t *c), void *ctx)
{
    for (size_t i = 0; i < d->ninsts; i++) {
        const inst_t *in = d->insts[i];
        if (!in->has_decl)
            continue;
        const dstr_t *s = &d->strs[in->sid];
        for (size_t j = 0; j < in->ncaps; j++) {
            const dcap_t *c = &in->caps[j];
            kvidx_dir_capacity_t v = {.instance_id = s->s,
                                      .instance_len = s->len,
                                      .incarnation = in->decl_inc,
                                      .capacity_revision = in->decl_rev,
                                      .tier = c->tier,
                                      .backend = d->strs[c->backend].s,
                                      .backend_len = d->strs[c->backend].len,
                                      .capacity_bytes = c->capacity,
                                      .shared = c->shared};
            int rc = cb(ctx, &v);
            if (rc)
                return rc;
        }
    }
    return 0;
}
