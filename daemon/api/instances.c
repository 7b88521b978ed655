/*
 * Fleet membership, as LMCache's coordinator serves it: POST /instances
 * (register or re-register), PUT /instances/{id}/heartbeat (404 tells the
 * server to register again), DELETE /instances/{id} (204 whether or not
 * it was registered), GET /instances, and GET /healthz.
 *
 * A registration is validated whole (422 and nothing registered
 * otherwise): instance_id, ip and p2p_advertised_url lose their leading
 * and trailing ASCII whitespace, an empty instance_id is replaced by
 * "mp-" and 32 random hex digits, metadata is an object of strings and is
 * kept as its normalized JSON. Deregistering, like the timeout, fences the
 * instance's L1 placements and forgets its cursor.
 */
#include "api/api.h"
#include "api/body.h"
#include "api/fleet_json.h"

#include "state/fleet.h"
#include "state/persist/persist.h"
#include "util/context.h"

#include "kvidx/err.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define METADATA_MAX 65536

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void strip(const char **s, size_t *n)
{
    while (*n && is_space(**s)) {
        (*s)++;
        (*n)--;
    }
    while (*n && is_space((*s)[*n - 1]))
        (*n)--;
}

/* A registration's metadata (an object of strings) as a JSON object in
 * meta; problems into pe. */
static void metadata_json(const cJSON *md, struct buf *meta, struct param_errors *pe)
{
    struct jw w;
    jw_init(&w, meta);
    jw_obj_begin(&w);
    if (md && !cJSON_IsObject(md)) {
        param_errors_add(pe, "must be an object of strings", "metadata");
    } else if (md) {
        for (const cJSON *m = md->child; m; m = m->next) {
            size_t vn;
            const char *v = json_str(m, &vn);
            if (!v) {
                param_errors_add(pe, "must be a string", "metadata.%s", "value");
                break;
            }
            jw_strn(&w, m->string, strlen(m->string));
            buf_putc(meta, ':');
            w.after_key = 1;
            jw_strn(&w, v, vn);
        }
    }
    jw_obj_end(&w);
}

/* The id LMCache gives an instance registered without one: "mp-" and 32
 * random hex digits (a UUID4's hex). */
static void generate_id(char genid[3 + 32 + 1])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t rnd[16];
    randombytes_buf(rnd, sizeof(rnd));
    memcpy(genid, "mp-", 3);
    for (int i = 0; i < 16; i++) {
        genid[3 + 2 * i] = hex[rnd[i] >> 4];
        genid[4 + 2 * i] = hex[rnd[i] & 15];
    }
    genid[35] = '\0';
}

static int api_register(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    cJSON *root = NULL;
    if (json_parse_body(req, res, &root) != 0)
        return 0;
    struct param_errors pe;
    param_errors_init(&pe);
    struct buf meta;
    buf_init(&meta);
    kvidx_dir_instance_t in;
    memset(&in, 0, sizeof(in));
    char genid[3 + 32 + 1];
    if (!cJSON_IsObject(root)) {
        param_errors_add(&pe, "must be a JSON object", "body");
        goto invalid;
    }
    uint64_t http_port = 0, mq_port = 0;
    fj_string(&pe, root, "instance_id", "", "", &in.instance_id, &in.instance_len);
    fj_string(&pe, root, "ip", NULL, "", &in.ip, &in.ip_len);
    fj_string(&pe, root, "p2p_advertised_url", "", "", &in.p2p_advertised_url, &in.p2p_len);
    fj_uint(&pe, root, "http_port", 0, 1, 1, 65535, "", &http_port);
    fj_uint(&pe, root, "mq_port", 0, 0, 0, 65535, "", &mq_port);
    strip(&in.instance_id, &in.instance_len);
    strip(&in.ip, &in.ip_len);
    strip(&in.p2p_advertised_url, &in.p2p_len);
    if (in.ip && in.ip_len == 0 && cJSON_GetObjectItemCaseSensitive(root, "ip"))
        param_errors_add(&pe, "must not be blank", "ip");
    if (in.instance_len > KVIDX_DIR_ID_MAX)
        param_errors_add(&pe, "must be at most 1024 bytes", "instance_id");
    if (in.ip_len > KVIDX_DIR_ID_MAX)
        param_errors_add(&pe, "must be at most 1024 bytes", "ip");
    if (in.p2p_len > KVIDX_DIR_ID_MAX)
        param_errors_add(&pe, "must be at most 1024 bytes", "p2p_advertised_url");
    metadata_json(cJSON_GetObjectItemCaseSensitive(root, "metadata"), &meta, &pe);
    if (meta.len > METADATA_MAX)
        param_errors_add(&pe, "must be at most 65536 bytes of JSON", "metadata");
    if (pe.n)
        goto invalid;
    param_errors_free(&pe);
    if (meta.failed)
        goto oom;
    if (in.instance_len == 0) {
        generate_id(genid);
        in.instance_id = genid;
        in.instance_len = 35;
    }
    in.http_port = (uint32_t)http_port;
    in.mq_port = (uint32_t)mq_port;
    in.metadata = meta.data;
    in.metadata_len = meta.len;
    in.registration_time = (double)app_wall_ms() / 1000.0;
    in.last_seen_ms = app_now_ms(req->app);
    int re = 0;
    int rc = kvidx_directory_register(req->app->fleet->dir, &in, &re);
    if (rc == KVIDX_EINVAL) {
        param_errors_init(&pe);
        param_errors_add(&pe, "is out of range", "body");
        goto invalid;
    }
    if (rc != 0)
        goto oom;
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "instance_id");
    jw_strn(&w, in.instance_id, in.instance_len);
    jw_key(&w, "re_registered");
    jw_bool(&w, re);
    jw_obj_end(&w);
    buf_free(&meta);
    cJSON_Delete(root);
    /* The registration is made: a body that could not be built closes the
     * connection (net/conn.c) rather than answer 503, which would say it
     * was not. */
    res_json(res, 200);
    return persist_ack(req, res);
invalid:
    fj_unprocessable(&pe, res, "the registration is not valid", 0);
    goto out;
oom:
    res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
out:
    buf_free(&meta);
    cJSON_Delete(root);
    return 0;
}

static int api_heartbeat(const struct request *req, struct response *res)
{
    int rc = kvidx_directory_heartbeat(req->app->fleet->dir, req->route_param, req->route_param_len,
                                       app_now_ms(req->app));
    if (rc == KVIDX_ENOTFOUND)
        return res_problem(res, rc, "unknown instance; register again with POST /instances", NULL,
                           0);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "instance_id");
    jw_strn(&w, req->route_param, req->route_param_len);
    jw_obj_end(&w);
    res_json(res, 200);
    return 0;
}

static int api_deregister(const struct request *req, struct response *res)
{
    if (persist_refuse(req, res))
        return 0;
    kvidx_directory_deregister(req->app->fleet->dir, req->route_param, req->route_param_len);
    res->status = 204;
    return persist_ack(req, res);
}

static int instance_row(void *ctx, const kvidx_dir_instance_t *in)
{
    struct jw *w = ctx;
    jw_obj_begin(w);
    jw_key(w, "instance_id");
    jw_strn(w, in->instance_id, in->instance_len);
    jw_key(w, "ip");
    jw_strn(w, in->ip, in->ip_len);
    jw_key(w, "http_port");
    jw_u64(w, in->http_port);
    jw_key(w, "registration_time");
    fj_double(w, in->registration_time);
    jw_key(w, "metadata");
    if (in->metadata_len)
        jw_raw(w, in->metadata, in->metadata_len);
    else
        jw_raw(w, "{}", 2);
    jw_key(w, "p2p_advertised_url");
    jw_strn(w, in->p2p_advertised_url, in->p2p_len);
    jw_key(w, "mq_port");
    jw_u64(w, in->mq_port);
    jw_obj_end(w);
    return 0;
}

static int api_instances(const struct request *req, struct response *res)
{
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "instances");
    jw_arr_begin(&w);
    kvidx_directory_instances(req->app->fleet->dir, instance_row, &w);
    jw_arr_end(&w);
    jw_obj_end(&w);
    if (res->body.failed) {
        buf_reset(&res->body);
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    res_json(res, 200);
    return 0;
}

static int api_healthz(const struct request *req, struct response *res)
{
    (void)req;
    buf_puts(&res->body, "{\"status\":\"ok\"}");
    res_json(res, 200);
    return 0;
}

const struct route instances_routes[] = {
    {M_POST, "/instances", api_register, "fleet_instances_register", ROUTE_INGEST},
    {M_GET, "/instances", api_instances, "fleet_instances_list", ROUTE_READ},
    {M_PUT, "/instances/*/heartbeat", api_heartbeat, "fleet_instances_heartbeat", ROUTE_INGEST},
    {M_DELETE, "/instances/*", api_deregister, "fleet_instances_delete", ROUTE_INGEST},
    {M_GET, "/healthz", api_healthz, "fleet_healthz", ROUTE_INGEST_READ},
    {0, NULL, NULL, NULL, 0},
};
