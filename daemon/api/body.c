/*
 * Request bodies for the handlers (api/body.h): the strict parse of
 * util/json_read.c turned into a problem answer. The detail it gives quotes
 * no request byte, only offsets and limits.
 */
#include "api/body.h"

int json_parse_body(const struct request *req, struct response *res, cJSON **out)
{
    struct json_error err;
    int rc = json_parse_text(req->body, req->body_len, req->app, 0, &err, out);
    if (rc != 0)
        res_problem(res, err.code, err.detail, NULL, 0);
    return rc;
}
