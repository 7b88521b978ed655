/*
 * The JSON body of a request, as every handler that takes one reads it:
 * parsed strictly with the limits in force, and answered 400 invalid_json
 * (or 413 payload_too_large) when it cannot be taken.
 */
#ifndef KVIDXD_BODY_H
#define KVIDXD_BODY_H

#include "net/http.h"
#include "util/json_read.h"

#include <cjson/cJSON.h>

/* Parses req's body (json_parse_text with req->app's limits). On failure
 * fills res with the problem and returns its code; on success *out is the
 * tree (cJSON_Delete it). An empty body is invalid. */
int json_parse_body(const struct request *req, struct response *res, cJSON **out);

#endif
