/*
 * JSON glue between cJSON (parsing request bodies) and libkvidx's
 * JSON-independent validators, plus writers for keys.
 */
#ifndef KVIDXD_JSON_H
#define KVIDXD_JSON_H

#include "util/json_write.h"
#include "net/http.h"

#include "kvidx/key.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Nesting depth of a JSON text (arrays and objects), computed without
 * parsing; strings are skipped correctly. Stops counting past limit+1. */
size_t json_depth(const char *s, size_t n, size_t limit);

/* Values one key may take in a request body: the key object's five members
 * and their names' worth of slack, a KeyEntry wrapper, a size. */
#define JSON_VALUES_PER_KEY 16

/* Parses req's body as one JSON value, enforcing max_depth and a bound of
 * JSON_VALUES_PER_KEY × max_keys_per_request values (413 payload_too_large). On failure
 * fills res with 400 invalid_json and returns KVIDX_EJSON; on success *out
 * is the tree (cJSON_Delete it). An empty body is invalid. */
int json_parse_body(const struct request *req, struct response *res, cJSON **out);
/* json_parse_body on any text, with app's limits (defaults when NULL).
 * extra_values is added to the text's value count (the values of a part
 * cut out of it, see keyscan.h). res may be NULL: nothing is answered and
 * only the return value tells what failed. */
int json_parse_text(const char *body, size_t body_len, const struct app *app, size_t extra_values,
                    struct response *res, cJSON **out);

/* The bytes of v when it is a string, else NULL; *len gets their count.
 * In a tree from json_parse_text no string holds a NUL byte (see there), so
 * the count is the string's decoded length. */
const char *json_str(const cJSON *v, size_t *len);
/* Converts a JSON value into the validator's raw fields. */
void json_field(const cJSON *v, kvidx_field_t *f);
/* Validates a JSON key object (EncodedObjectKey) into *k; model and salt
 * point into the cJSON strings. Returns 0 or KVIDX_EKEY with *why. */
int json_to_key(const cJSON *obj, kvidx_key_t *k, kvidx_reason_t *why);

/* Integral JSON number in [lo, hi] → *out; 0 or KVIDX_EINVAL. Absent
 * (v == NULL) returns 1 and leaves *out. */
int json_uint(const cJSON *v, double lo, double hi, uint64_t *out);

/* Writes an EncodedObjectKey object with all five fields. */
void jw_key_object(struct jw *w, const kvidx_key_t *k);

/* Collects invalid_params for a 400 answer: every error is kept (SPEC: an
 * all-or-nothing batch lists every bad index); names are formatted copies,
 * reasons are static strings. */
struct param_errors {
    struct invalid_param *items;
    struct buf names; /* NUL-separated names; items[i].name points here after finish */
    size_t *name_off;
    size_t n, cap;
    int oom;
};
void param_errors_init(struct param_errors *pe);
void param_errors_free(struct param_errors *pe);
void param_errors_add(struct param_errors *pe, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Adds a key error at `where` ("keys[3]"): the name is where itself when the
 * whole key is wrong, else where.<field> ("keys[3].kv_rank"). */
void param_errors_key(struct param_errors *pe, const kvidx_reason_t *why, const char *where);
/* Answers 400 (err) with every collected param; returns err. */
int param_errors_respond(struct param_errors *pe, struct response *res, int err,
                         const char *detail);

#endif
