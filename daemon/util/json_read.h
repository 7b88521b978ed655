/*
 * JSON glue between cJSON (parsing request bodies) and libkvidx's
 * JSON-independent validators, plus writers for keys.
 */
#ifndef KVIDXD_JSON_H
#define KVIDXD_JSON_H

#include "util/json_write.h"
#include "util/context.h"
#include "util/params.h"

#include "kvidx/key.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Nesting depth of a JSON text (arrays and objects), computed without
 * parsing; strings are skipped correctly. Stops counting past limit+1. */
size_t json_depth(const char *s, size_t n, size_t limit);
/* Length of the number at s[0..n) by RFC 8259's grammar, or 0 when the
 * bytes there are no such number or run on into more number bytes (01,
 * 1., 1.e5: cJSON's strtod would take them). */
size_t json_number_len(const char *s, size_t n);

/* Values one key may take in a request body: the key object's five members
 * and their names' worth of slack, a KeyEntry wrapper, a size. */
#define JSON_VALUES_PER_KEY 16

/* Why a text was refused: the KVIDX_E* code and a detail that quotes no
 * byte of the text. */
struct json_error {
    int code;
    char detail[200];
};

/* Parses a request body as one strict JSON value with app's limits
 * (defaults when NULL): max_json_depth, and a bound of JSON_VALUES_PER_KEY
 * × max_keys_per_request values (KVIDX_EBODYSIZE). An empty body, a raw
 * control byte in a string, or a number outside the JSON grammar is
 * KVIDX_EJSON. extra_values is added to the text's value count (the values
 * of a part cut out of it, see keyscan.h). 0 and *out (cJSON_Delete it), or
 * the code, with the reason in *err when err is not NULL. */
int json_parse_text(const char *body, size_t body_len, const struct app *app, size_t extra_values,
                    struct json_error *err, cJSON **out);

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

#endif
