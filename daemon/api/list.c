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

/* What a KeyEntry holds that depends only on its namespace, escaped once:
 * {"key":{"model_name":"<model>","kv_rank":  and
 * ","cache_salt":"<salt>"},"size_bytes":  */
struct ns_json {
    uint32_t ns_id;
    int valid;
    struct buf head, tail;
};

static int ns_json_set(struct ns_json *j, const kvidx_list_entry_t *e)
{
    struct jw w;
    buf_reset(&j->head);
    buf_reset(&j->tail);
    buf_puts(&j->head, "{\"key\":{\"model_name\":");
    jw_init(&w, &j->head);
    jw_strn(&w, e->model, e->model_len);
    buf_puts(&j->head, ",\"kv_rank\":");
    buf_puts(&j->tail, "\",\"cache_salt\":");
    jw_init(&w, &j->tail);
    jw_strn(&w, e->salt, e->salt_len);
    buf_puts(&j->tail, "},\"size_bytes\":");
    j->ns_id = e->ns_id;
    j->valid = !j->head.failed && !j->tail.failed;
    return j->valid ? 0 : KVIDX_ENOMEM;
}

/* The decimal digits of the last value a field had: a page is in key
 * order, so kv_rank and object_group_id stay the same over long runs of
 * entries, and so does size_bytes for one model. */
struct digits {
    uint64_t v;
    int valid;
    size_t n;
    char s[24];
};

/* Writes v's digits at o from the memo, copying w bytes: w is the room
 * the page keeps for the field, at least its most digits. Returns the end
 * of the digits. */
static inline char *digits_at(struct digits *m, char *o, uint64_t v, size_t w)
{
    if (!m->valid || m->v != v) {
        m->n = (size_t)(jw_u64_at(m->s, v) - m->s);
        m->v = v;
        m->valid = 1;
    }
    memcpy(o, m->s, w);
    return o + m->n;
}

#define LIT_GROUP ",\"object_group_id\":"
#define LIT_HASH  ",\"chunk_hash_hex\":\""

/* Writes the page's KeyEntry objects, comma-separated, into b straight
 * from the index's records (kvidx_index_list_entry views them in place):
 * no key is copied out and nothing is allocated per entry; the namespace's
 * model and salt are escaped once per run of entries that share them, and
 * the hash is hex-encoded eight bytes a step. The bytes are those jw's
 * KeyEntry writer gives. 0, or KVIDX_ENOMEM. */
static int write_entries(struct buf *b, const kvidx_index_t *idx, const kvidx_ref_t *refs,
                         size_t count)
{
    struct ns_json nj;
    memset(&nj, 0, sizeof(nj));
    buf_init(&nj.head);
    buf_init(&nj.tail);
    struct digits rank, group, size;
    memset(&rank, 0, sizeof(rank));
    memset(&group, 0, sizeof(group));
    memset(&size, 0, sizeof(size));
    int rc = 0, first = 1;
    for (size_t i = 0; i < count && rc == 0; i++) {
        kvidx_list_entry_t e;
        if (kvidx_index_list_entry(idx, refs[i], &e) != 0)
            continue;
        if ((!nj.valid || nj.ns_id != e.ns_id) && (rc = ns_json_set(&nj, &e)) != 0)
            break;
        size_t need = 1 + nj.head.len + 10 + sizeof(LIT_GROUP) + 5 + sizeof(LIT_HASH) +
                      2 * (size_t)e.hash_len + nj.tail.len + 20 + 1;
        /* The first entry's bound for the whole page (most pages are one
         * namespace): the buffer grows once, not by doubling. */
        if ((rc = buf_reserve(b, first ? need * (count - i) : need)) != 0)
            break;
        char *o = b->data + b->len;
        if (!first)
            *o++ = ',';
        first = 0;
        memcpy(o, nj.head.data, nj.head.len);
        o += nj.head.len;
        o = digits_at(&rank, o, e.kv_rank, 10);
        memcpy(o, LIT_GROUP, sizeof(LIT_GROUP) - 1);
        o += sizeof(LIT_GROUP) - 1;
        o = digits_at(&group, o, e.group, 5);
        memcpy(o, LIT_HASH, sizeof(LIT_HASH) - 1);
        o = jw_hex_at(o + sizeof(LIT_HASH) - 1, e.hash, e.hash_len);
        memcpy(o, nj.tail.data, nj.tail.len);
        o += nj.tail.len;
        o = digits_at(&size, o, e.size_bytes, 20);
        *o++ = '}';
        b->len = (size_t)(o - b->data);
        b->data[b->len] = '\0';
    }
    buf_free(&nj.head);
    buf_free(&nj.tail);
    return rc;
}

/* The index's filter for a parsed listing query. */
static void filter_of(const kvidx_list_query_t *q, kvidx_list_filter_t *f)
{
    memset(f, 0, sizeof(*f));
    f->has_salt = q->has_salt;
    f->salt = q->salt;
    f->salt_len = q->salt_len;
    f->has_model = q->has_model;
    f->model = q->model;
    f->model_len = q->model_len;
    f->has_rank = q->has_rank;
    f->kv_rank = q->kv_rank;
    f->has_group = q->has_group;
    f->group = q->group;
    f->tier = q->tier == KVIDX_LIST_TIER_L1   ? KVIDX_TIER_L1
              : q->tier == KVIDX_LIST_TIER_L2 ? KVIDX_TIER_L2
                                              : KVIDX_TIER_ALL;
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
    filter_of(q, &f);
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
    jw_obj_begin(&w);
    jw_key(&w, "entries");
    jw_arr_begin(&w);
    if (write_entries(&res->body, ks->idx, refs, count) != 0) {
        buf_reset(&res->body);
        goto oom;
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
