/*
 * Fast path for key-form bodies ({"keys": [EncodedObjectKey...], ...}):
 * reads the keys array straight from the body bytes, without a cJSON tree.
 */
#ifndef KVIDXD_KEYSCAN_H
#define KVIDXD_KEYSCAN_H

#include "util/context.h"

#include "kvidx/index.h"
#include "kvidx/key.h"

#include <cjson/cJSON.h>
#include <stddef.h>

struct keyscan_str {
    const char *s; /* into the request body */
    size_t n;
};

struct keyscan {
    /* The body with its keys (or chunk_hashes) array replaced by [],
     * parsed by json_parse_text: every other member keeps its cJSON
     * handling. */
    cJSON *rest;
    /* The n keys of the array, all valid; model and salt point into the
     * request body, so they live as long as the request. */
    kvidx_key_t *keys;
    size_t n;
    /* chunk_hashes taken instead: its nstrs strings, as cJSON would read
     * them (plain strings: the bytes between the quotes), not judged. */
    int chunk_hashes;
    struct keyscan_str *strs;
    size_t nstrs;
    /* entries taken instead (a store's KeyEntry array): its n items, every
     * key valid, size_bytes 1..2^40, or 0 where the entry has none. */
    int entries;
    kvidx_put_t *items;
};

enum { KEYSCAN_KEYS = 1, KEYSCAN_CHUNK_HASHES = 2, KEYSCAN_ENTRIES = 4 };

/* Takes a request body (n bytes at body; app gives the limits, defaults
 * when NULL) on the fast path when it is a JSON object whose "keys"
 * member (what has KEYSCAN_KEYS) comes before any member with an object or
 * array value, and whose keys array holds only flat key objects: the five
 * known member names, at most once each, string values without escapes or
 * control bytes (below 0x20), numbers as plain digits (no sign, fraction, exponent or
 * leading zero), and every key valid. With KEYSCAN_CHUNK_HASHES, a
 * "chunk_hashes" member in that place whose array holds only strings
 * without escapes or control bytes is taken the same way (ks->chunk_hashes).
 * With KEYSCAN_ENTRIES, an "entries" member in that place whose array holds
 * only KeyEntry objects {"key": flat key object, "size_bytes": plain
 * number 1..2^40 (optional)}, each member at most once, is taken into
 * ks->items (ks->entries).
 * Returns 0 and fills *ks (free with keyscan_free), or 1 when anything is
 * unusual or wrong: then nothing is allocated and the caller runs
 * json_parse_body, whose answer is the reference. A body taken here is one
 * json_parse_body accepts, with the same tree apart from the array, whose
 * elements json_to_key turns into the same keys (or whose strings cJSON
 * reads as the same bytes, or whose entries' "key" members json_to_key
 * turns into the same keys and whose "size_bytes" json_uint reads as the
 * same sizes). */
int keyscan_text(const char *body, size_t n, const struct app *app, int what, struct keyscan *ks);
void keyscan_free(struct keyscan *ks);

/* Takes the body of a single-key store (n bytes at body) on the fast path
 * when it is a flat JSON object with at most the members "size_bytes" (a
 * plain number 1..2^40) and "tier" ("l1" or "l2", no escapes), each at
 * most once, in either order: 0, with *size (0 when absent) and *tier (0
 * when absent, 1 for "l1", 2 for "l2"). Returns 1 for anything else: the
 * caller then runs json_parse_body, whose answer is the reference. */
int keyscan_put_one(const char *body, size_t n, uint64_t *size, int *tier);

#endif
