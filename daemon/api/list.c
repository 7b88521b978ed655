/*
 * GET /v1/keys: the paginated listing, in the index's order (cache_salt,
 * model_name, kv_rank, object_group_id, hash bytes), with filters and
 * signed page tokens.
 *
 * A page never scans more than 10 x page_size + 1000 keys. The next page
 * resumes strictly after the key the token names, which is what makes a
 * full listing return every key that stayed present exactly once however
 * the catalogue changes between pages. A token is bound to the filters
 * that produced it (a digest of the query) and to the secret that signed it.
 */
#include "api/api.h"
#include "state/auth.h"
#include "state/keystore.h"

#include "util/context.h"
#include "util/json_read.h"

#include "kvidx/err.h"
#include "kvidx/list_query.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct keystore *ks_of(const struct request *req)
{
    return req->app->keystore;
}

/* GET /v1/keys?model_name&cache_salt&kv_rank&object_group_id&tier&page_size&page_token */
static int keys_list(const struct request *req, struct response *res)
{
    struct keystore *ks = ks_of(req);
    kvidx_list_query_t *q = malloc(sizeof(*q));
    kvidx_page_cursor_t *cur = malloc(sizeof(*cur));
    kvidx_key_buf_t *resume = malloc(sizeof(*resume));
    kvidx_ref_t *refs = NULL;
    if (!q || !cur || !resume)
        goto oom;
    kvidx_reason_t why;
    kvidx_query_span_t where;
    int rc = kvidx_list_query_parse(req->query, req->query_len, q, &why, &where);
    if (rc != 0) {
        struct invalid_param p = {why.field, why.rule};
        res_problem(res, rc, "invalid listing query", &p, 1);
        goto out;
    }
    /* A salt-bound token lists its salt only, and its page tokens carry
     * that salt in their digest; another salt's listing is empty. */
    int hidden = auth_list_scope(req, q);
    uint8_t digest[KVIDX_LIST_DIGEST_LEN];
    kvidx_list_query_digest(q, digest);
    uint64_t now_s = (uint64_t)time(NULL);
    const kvidx_key_t *after = NULL;
    if (q->token_len) {
        rc = kvidx_page_token_decode(&ks->keyring, q->token, q->token_len, now_s,
                                     req->app->cfg.page_token_ttl_s, digest, cur);
        if (rc != 0) {
            res_problem(res, rc,
                        rc == KVIDX_ETOKENMISMATCH
                            ? "the page token was issued for other filters"
                            : (rc == KVIDX_ETOKENEXPIRED ? "the page token has expired; list again"
                                                         : "the page token is not valid"),
                        NULL, 0);
            goto out;
        }
        after = &cur->key;
    }
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    f.has_salt = q->has_salt;
    f.salt = q->salt;
    f.salt_len = q->salt_len;
    f.has_model = q->has_model;
    f.model = q->model;
    f.model_len = q->model_len;
    f.has_rank = q->has_rank;
    f.kv_rank = q->kv_rank;
    f.has_group = q->has_group;
    f.group = q->group;
    f.tier = q->tier == KVIDX_LIST_TIER_L1   ? KVIDX_TIER_L1
             : q->tier == KVIDX_LIST_TIER_L2 ? KVIDX_TIER_L2
                                             : KVIDX_TIER_ALL;
    size_t page = q->page_size;
    refs = malloc(page * sizeof(*refs));
    if (!refs)
        goto oom;
    size_t count = 0;
    int more = 0;
    rc = hidden ? 0
                : kvidx_index_list(ks->idx, &f, after, page, 10 * page + 1000, refs, &count, resume,
                                   &more, NULL);
    if (rc != 0) {
        res_problem(res, rc, "listing failed", NULL, 0);
        goto out;
    }
    struct jw w;
    jw_init(&w, &res->body);
    buf_reserve(&res->body, count * 200 + 64);
    jw_obj_begin(&w);
    jw_key(&w, "entries");
    jw_arr_begin(&w);
    for (size_t i = 0; i < count; i++) {
        kvidx_key_t k;
        kvidx_entry_info_t info;
        if (kvidx_index_key(ks->idx, refs[i], &k) != 0 ||
            kvidx_index_info(ks->idx, refs[i], &info) != 0)
            continue;
        jw_obj_begin(&w);
        jw_key(&w, "key");
        jw_key_object(&w, &k);
        jw_key(&w, "size_bytes");
        jw_u64(&w, info.size_bytes);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_key(&w, "next_page_token");
    if (more) {
        char tok[KVIDX_PAGE_TOKEN_STR_MAX + 1];
        size_t tn = sizeof(tok);
        rc = kvidx_page_token_encode(kvidx_token_keyring_current(&ks->keyring), now_s, digest,
                                     &resume->key, 0, tok, &tn);
        if (rc != 0) {
            buf_reset(&res->body);
            res_problem(res, KVIDX_EINTERNAL, "could not sign the page token", NULL, 0);
            goto out;
        }
        jw_strn(&w, tok, tn);
    } else {
        jw_null(&w);
    }
    jw_obj_end(&w);
    res_json(res, 200);
    goto out;
oom:
    res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
out:
    free(refs);
    free(resume);
    free(cur);
    free(q);
    return 0;
}

const struct route list_routes[] = {
    {M_GET, "/v1/keys", keys_list, "keys_list", ROUTE_READ},
    {0, NULL, NULL, NULL, 0},
};
