/*
 * What the fleet handlers (events.c, directory.c, instances.c) share: the
 * JSON of placements and of LMCache's floats, the small field readers that
 * collect every error of a body for one 422 answer, and the request forms
 * that name keys (the keys form and LMCache's tokens form).
 */
#ifndef KVIDXD_FLEET_JSON_H
#define KVIDXD_FLEET_JSON_H

#include "net/http.h"
#include "util/json_read.h"
#include "util/params.h"

#include "kvidx/directory.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* LMCache's cap on the token ids of one request (its MAX_TOKEN_IDS). */
#define FLEET_MAX_TOKEN_IDS 1000000

/* A JSON number as Python prints a float (always with a '.' or an
 * exponent). */
void fj_double(struct jw *w, double v);
/* {"instance_id","incarnation","tier","backend","size_bytes","shared"}. */
void fj_placement(struct jw *w, const kvidx_dir_placement_t *p);
const char *fj_tier_name(kvidx_dir_tier_t t);

/* A string member: 0 and the bytes (absent: def, or an error "is required"
 * when def is NULL); a non-string adds an error. Returns 0 or -1. */
int fj_string(struct param_errors *pe, const cJSON *obj, const char *name, const char *def,
              const char *where, const char **s, size_t *len);
/* An integer member in [lo, hi] (absent: def, or required when
 * required). 0 or -1 after adding an error. */
int fj_uint(struct param_errors *pe, const cJSON *obj, const char *name, uint64_t def, int required,
            double lo, double hi, const char *where, uint64_t *out);

/* The keys of a lookup or score body: either "keys" (EncodedObjectKey…)
 * or the tokens form ("token_ids", "model_name", "world_size",
 * "cache_salt"), exactly one of them, as LMCache's DirectoryLookupRequest
 * takes them. The tokens are checked (integers 0..2^32-1, at most
 * FLEET_MAX_TOKEN_IDS) before they are hashed with chunk_size tokens a
 * chunk. keys (malloc'd) point into root's strings. */
struct fleet_keys {
    kvidx_key_t *keys;
    size_t n;
    int tokens_form;
    size_t chunks;       /* complete chunks (tokens form) or n (keys form) */
    uint32_t world_size; /* tokens form */
};
/* 0 and *out, or the answer already in res (422 / 400 / 413 / 503) and
 * its code. */
int fleet_keys_parse(const struct request *req, struct response *res, const cJSON *root,
                     struct fleet_keys *out);
void fleet_keys_free(struct fleet_keys *fk);

/* Answers 422 with every collected error (problem code invalid_key when
 * key_fault, else invalid_argument) and frees pe. Returns the code. */
int fj_unprocessable(struct param_errors *pe, struct response *res, const char *detail,
                     int key_fault);

#endif
