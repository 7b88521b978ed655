/*
 * Differential fuzz target for the key-form fast path (daemon/keyscan.c):
 * on any bytes, keyscan_text either falls back, or json_parse_body accepts
 * the same body, each element of its "keys" array goes through json_to_key
 * to the very key the fast path made, and the fast path's rest tree equals
 * the whole tree with the keys array emptied; for a "chunk_hashes" array
 * taken instead, its strings are cJSON's strings byte for byte. A store's
 * entries (KEYSCAN_ENTRIES) and a single-key store body (keyscan_put_one)
 * are checked against cJSON the same way. The first input byte picks
 * the limits (default app, max_json_depth 2..4, few keys) so that the
 * fall-backs on limits are exercised too. Any disagreement aborts.
 */
#include "util/context.h"
#include "util/json_write.h"
#include "api/body.h"
#include "util/json_read.h"
#include "util/keyscan.h"
#include "../support/keyscan_compare.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* A store's entries, with the flags keys_put uses: each scanned entry is
 * what cJSON reads, its key json_to_key's, its size json_uint's (0 for
 * none), its members only "key" and "size_bytes" once each. */
static void check_entries(const struct request *req)
{
    struct keyscan ks;
    if (keyscan_text(req->body, req->body_len, req->app, KEYSCAN_ENTRIES | KEYSCAN_CHUNK_HASHES,
                     &ks) != 0) {
        if (ks.rest || ks.items || ks.strs)
            abort();
        return;
    }
    struct response res;
    memset(&res, 0, sizeof(res));
    cJSON *full = NULL;
    if (json_parse_body(req, &res, &full) != 0)
        abort();
    buf_free(&res.body);
    const char *member = ks.entries ? "entries" : "chunk_hashes";
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(full, member);
    if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != (ks.entries ? ks.n : ks.nstrs))
        abort();
    size_t i = 0;
    for (const cJSON *e = ks.entries ? arr->child : NULL; e; e = e->next, i++) {
        int nk = 0, nsz = 0;
        for (const cJSON *m = cJSON_IsObject(e) ? e->child : NULL; m; m = m->next) {
            if (strcmp(m->string, "key") == 0)
                nk++;
            else if (strcmp(m->string, "size_bytes") == 0)
                nsz++;
            else
                abort();
        }
        kvidx_key_t k;
        uint64_t sz = 0;
        int src = json_uint(cJSON_GetObjectItemCaseSensitive(e, "size_bytes"), 1,
                            (double)KVIDX_SIZE_MAX, &sz);
        if (nk != 1 || nsz > 1 || (src != 0 && src != 1) ||
            (src == 1 ? 0 : sz) != ks.items[i].size_bytes ||
            json_to_key(cJSON_GetObjectItemCaseSensitive(e, "key"), &k, NULL) != 0 ||
            !same_key(&k, &ks.items[i].key))
            abort();
    }
    if (!cJSON_ReplaceItemInObjectCaseSensitive(full, member, cJSON_CreateArray()) ||
        !same_tree(full, ks.rest))
        abort();
    cJSON_Delete(full);
    keyscan_free(&ks);
}

/* A single-key store body: what keyscan_put_one takes, cJSON reads the
 * same way. */
static void check_put_one(const struct request *req)
{
    uint64_t size;
    int tier;
    if (keyscan_put_one(req->body, req->body_len, &size, &tier) != 0)
        return;
    struct response res;
    memset(&res, 0, sizeof(res));
    cJSON *full = NULL;
    if (json_parse_body(req, &res, &full) != 0 || !cJSON_IsObject(full))
        abort();
    buf_free(&res.body);
    int nsz = 0, nt = 0;
    for (const cJSON *m = full->child; m; m = m->next) {
        if (strcmp(m->string, "size_bytes") == 0)
            nsz++;
        else if (strcmp(m->string, "tier") == 0)
            nt++;
        else
            abort();
    }
    uint64_t want = 0;
    int src = json_uint(cJSON_GetObjectItemCaseSensitive(full, "size_bytes"), 1,
                        (double)KVIDX_SIZE_MAX, &want);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(full, "tier");
    size_t tn = 0;
    const char *ts = t ? json_str(t, &tn) : NULL;
    int want_tier = !t                                      ? 0
                    : ts && tn == 2 && !memcmp(ts, "l1", 2) ? 1
                    : ts && tn == 2 && !memcmp(ts, "l2", 2) ? 2
                                                            : -1;
    if (nsz > 1 || nt > 1 || (src != 0 && src != 1) || (src == 1 ? 0 : want) != size ||
        want_tier != tier)
        abort();
    cJSON_Delete(full);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static struct app app;
    struct app *a = NULL;
    if (size > 0) {
        unsigned sel = data[0];
        data++;
        size--;
        if (sel & 1) {
            a = &app;
            app.cfg.max_json_depth = 2 + (sel >> 1) % 3;
            app.cfg.max_keys_per_request = 1 + (sel >> 3) % 8;
        }
    }
    /* An exact-size copy, so that ASan sees any read past the body. */
    char *body = malloc(size ? size : 1);
    if (!body)
        return 0;
    memcpy(body, data, size);
    struct request req;
    memset(&req, 0, sizeof(req));
    req.body = body;
    req.body_len = size;
    req.app = a;
    check_entries(&req);
    check_put_one(&req);
    struct keyscan ks;
    if (keyscan_text(req.body, req.body_len, req.app, KEYSCAN_KEYS | KEYSCAN_CHUNK_HASHES, &ks) !=
        0) {
        if (ks.rest || ks.keys || ks.strs)
            abort();
        free(body);
        return 0;
    }
    struct response res;
    memset(&res, 0, sizeof(res));
    cJSON *full = NULL;
    if (json_parse_body(&req, &res, &full) != 0)
        abort(); /* the fast path took a body the cJSON path refuses */
    buf_free(&res.body);
    const char *member = ks.chunk_hashes ? "chunk_hashes" : "keys";
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(full, member);
    if (ks.chunk_hashes) {
        /* The scanned strings are cJSON's strings, byte for byte. */
        if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != ks.nstrs || ks.keys)
            abort();
        size_t i = 0;
        for (const cJSON *e = arr->child; e; e = e->next, i++)
            if (!cJSON_IsString(e) || strlen(e->valuestring) != ks.strs[i].n ||
                memcmp(e->valuestring, ks.strs[i].s, ks.strs[i].n) != 0)
                abort();
    }
    if (!ks.chunk_hashes && (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != ks.n))
        abort();
    size_t i = 0;
    for (const cJSON *e = ks.chunk_hashes ? NULL : arr->child; e; e = e->next, i++) {
        kvidx_key_t k;
        if (json_to_key(e, &k, NULL) != 0 || !same_key(&k, &ks.keys[i]))
            abort();
    }
    if (!cJSON_ReplaceItemInObjectCaseSensitive(full, member, cJSON_CreateArray()) ||
        !same_tree(full, ks.rest))
        abort();
    cJSON_Delete(full);
    keyscan_free(&ks);
    free(body);
    return 0;
}
