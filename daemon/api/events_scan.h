/*
 * The decoded body of POST /events, and its two decoders: the cJSON path
 * (events.c), which is the reference and gives every error answer, and a
 * scanner that reads the common shape straight from the body bytes
 * (events_scan.c) and gives up on anything else.
 */
#ifndef KVIDXD_EVENTS_SCAN_H
#define KVIDXD_EVENTS_SCAN_H

#include "util/context.h"
#include "util/params.h"

#include "kvidx/directory.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* The batches of one request in list order. Each batch's entries are a
 * run of entries[] (in order), each entry's token ids a run of tokens[].
 * Strings point into the request body (scanner) or into the cJSON tree
 * (reference), so the body lives as long as the tree or the request. */
struct ev_body {
    kvidx_dir_batch_t *batches;
    size_t nb;
    kvidx_dir_entry_t *entries;
    size_t ne;
    uint32_t *tokens;
    size_t nt;
};

/* Token ids of one entry: a chunk's (LMCache: 256). The bound keeps an
 * entry inside one journal record. */
#define EVENTS_MAX_ENTRY_TOKENS 65536

void ev_body_free(struct ev_body *b);

/* The reference decoder: root (any cJSON value) into *out, every batch
 * checked with kvidx_directory_batch_check. Returns 0; -1 with every
 * error in pe (*key_fault set when one is a key's); KVIDX_ENOMEM. *out
 * is filled as far as it got either way (free with ev_body_free). */
int events_decode(const cJSON *root, struct param_errors *pe, struct ev_body *out, int *key_fault);

/* The fast path: takes the n bytes at body when they are one JSON object
 * (JSON white space around it) of the usual shape, with app's limits
 * (defaults when NULL), and decodes it into *out: 0. Returns 1, nothing
 * allocated, for anything else; the caller then runs json_parse_body and
 * events_decode, whose answer is the reference.
 *
 * The usual shape: strings without escapes or bytes below 0x20; numbers
 * as plain digits (19 at most, no leading zero; a token id at most
 * 4294967295; a token_offset may be -1; ts any JSON number of at most 40
 * bytes); each member at most once; a member no field names holds a plain
 * string, number, true, false or null (the reference ignores it there);
 * key objects with the five key members only; at most 65536 token ids an
 * entry; every batch valid (decoded and passing
 * kvidx_directory_batch_check); max_json_depth at least 6 and no more
 * values than json_parse_body allows. What it takes, json_parse_body
 * accepts and events_decode decodes into equal batches. */
int events_scan(const char *body, size_t n, const struct app *app, struct ev_body *out);

#endif
