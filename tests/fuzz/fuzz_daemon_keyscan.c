/*
 * Differential fuzz target for the key-form fast path (daemon/keyscan.c):
 * on any bytes, keyscan_text either falls back, or json_parse_body accepts
 * the same body, each element of its "keys" array goes through json_to_key
 * to the very key the fast path made, and the fast path's rest tree equals
 * the whole tree with the keys array emptied; for a "chunk_hashes" array
 * taken instead, its strings are cJSON's strings byte for byte. The first
 * input byte picks
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
