/*
 * libFuzzer target for the `GET /v1/keys` query parser: arbitrary query
 * strings must never crash; when one parses, writing it back and parsing
 * again must give an equal struct and the same filter digest.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/list_query.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvidx_list_query_t a, b; /* large: keep them off the fuzzer's stack */
    kvidx_reason_t why = {NULL, NULL};
    kvidx_query_span_t where = {0, 0};
    int rc = kvidx_list_query_parse((const char *)data, size, &a, &why, &where);
    if (rc != 0) {
        check(rc == KVIDX_EINVAL || rc == KVIDX_ETOKEN);
        check(why.field != NULL && why.rule != NULL);
        check(where.off <= size && where.len <= size - where.off);
        return 0;
    }
    check(a.page_size >= 1 && a.page_size <= KVIDX_PAGE_SIZE_MAX);
    check(!a.has_model || a.model_len >= 1);
    char buf[8192];
    size_t n = 0;
    check(kvidx_list_query_encode(&a, buf, &n) == KVIDX_ENOBUFS);
    check(n <= sizeof buf);
    size_t need = n;
    n = sizeof buf;
    check(kvidx_list_query_encode(&a, buf, &n) == 0 && n + 1 == need);
    rc = kvidx_list_query_parse(buf, n, &b, &why, &where);
    check(rc == 0);
    check(kvidx_list_query_equal(&a, &b));
    uint8_t da[KVIDX_LIST_DIGEST_LEN], db[KVIDX_LIST_DIGEST_LEN];
    kvidx_list_query_digest(&a, da);
    kvidx_list_query_digest(&b, db);
    check(memcmp(da, db, sizeof da) == 0);
    return 0;
}
