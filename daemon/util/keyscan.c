/*
 * Fast path for key-form bodies (and the chunk_hashes of ipc-form ones, and
 * the entries of a store). A lookup or prefetch of 1000 keys spent
 * most of its time building, walking and freeing a cJSON tree of 6000
 * values; here one pass over the body bytes reads the keys array into
 * kvidx_key_t directly, and only the rest of the body (the keys array cut
 * down to []) goes through json_parse_text.
 *
 * Invariants: the scanner accepts a strict subset of what json_parse_text
 * accepts, and gives up (returns 1, nothing allocated) on anything outside
 * it: escapes, raw control bytes (below 0x20) in strings, white space other
 * than the four JSON ones,
 * numbers other than 1..15 plain digits without a leading zero (a
 * size_bytes other than 1..2^40), unknown or repeated key or entry
 * members, nested values before "keys", invalid keys, a max_json_depth
 * below 3 (4 for entries), or a body whose value count json_parse_body
 * would refuse. Within the subset the spans it reads are the spans cJSON
 * reads (every token boundary is a JSON white space byte or ",:]}"), so
 * the rest tree equals cJSON's tree of the whole body with the keys array
 * emptied, and each key equals what json_to_key makes of the element; the
 * error answers therefore stay those of the cJSON path, which runs on every
 * fallback. tests/unit/test_daemon_keyscan.c and
 * tests/fuzz/fuzz_daemon_keyscan.c check this differentially. Keys point
 * into the request body, never into memory freed here.
 *
 * Speed: strings are scanned sixteen bytes a step (a word at a time
 * without SSE2), member names are matched as literals, a key is built in
 * place without an intermediate record, and a model name or salt with the
 * bytes of the previous key's (which was scanned and checked) is matched
 * by one memcmp, not checked again, and shares that key's pointer.
 */
#include "util/keyscan.h"

#include "util/context.h"
#include "util/json_lex.h"
#include "util/json_read.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct cur {
    const char *p, *e;
};

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static inline void skip_ws(struct cur *c)
{
    /* Between the tokens of a compact body there is no white space: one
     * compare says so (every JSON white space byte is at most ' '). */
    if (c->p < c->e && (unsigned char)*c->p > ' ')
        return;
    while (c->p < c->e && is_ws(*c->p))
        c->p++;
}

/* Consumes ch (after white space); 0, or -1 when the next byte is another. */
static int expect(struct cur *c, char ch)
{
    skip_ws(c);
    if (c->p == c->e || *c->p != ch)
        return -1;
    c->p++;
    return 0;
}

/* A string at c->p with no escape and no control byte (jl_plain_string):
 * its bytes, or -1, c->p then unmoved. */
static inline int plain_string(struct cur *c, const char **s, size_t *n)
{
    const char *q = jl_plain_string(c->p, c->e, s, n);
    if (!q)
        return -1;
    c->p = q;
    return 0;
}

/* 1..15 decimal digits without a leading zero: exact in a double, the value
 * cJSON's strtod gives. The caller checks that a delimiter follows. */
static int plain_number(struct cur *c, double *v)
{
    const char *p = c->p, *e = c->e;
    uint64_t x = 0;
    size_t nd = 0;
    unsigned d;
    while (p < e && (d = (unsigned)((unsigned char)*p - '0')) < 10) {
        if (++nd > 15)
            return -1;
        x = x * 10 + d;
        p++;
    }
    if (nd == 0 || (nd > 1 && c->p[0] == '0'))
        return -1;
    *v = (double)x;
    c->p = p;
    return 0;
}

/* A scalar member value before "keys": a string (escapes allowed, lexed as
 * cJSON lexes it) or a run of literal/number bytes. Only its span matters:
 * json_parse_text judges it in the rest of the body. */
static int skip_scalar(struct cur *c)
{
    const char *p = c->p, *e = c->e;
    if (p == e)
        return -1;
    if (*p == '"') {
        for (p++;; p++) {
            if (p >= e)
                return -1;
            if (*p == '\\')
                p++;
            else if (*p == '"')
                break;
        }
        c->p = p + 1;
        return 0;
    }
    const char *start = p;
    while (p < e && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || *p == '.' || *p == '+' || *p == '-'))
        p++;
    if (p == start)
        return -1;
    c->p = p;
    return 0;
}

/* 1 when c->p holds the JSON string known[0..n) (jl_same_string), which
 * is then consumed. */
static inline int same_string(struct cur *c, const char *known, size_t n)
{
    const char *q = jl_same_string(c->p, c->e, known, n);
    if (!q)
        return 0;
    c->p = q;
    return 1;
}

/* The five members of a key object. */
enum { M_HASH, M_MODEL, M_RANK, M_GROUP, M_SALT, M_NONE };

static int member_of(const char *s, size_t n)
{
    switch (n) {
    case 7:
        return memcmp(s, "kv_rank", 7) == 0 ? M_RANK : M_NONE;
    case 10:
        if (memcmp(s, "model_name", 10) == 0)
            return M_MODEL;
        return memcmp(s, "cache_salt", 10) == 0 ? M_SALT : M_NONE;
    case 14:
        return memcmp(s, "chunk_hash_hex", 14) == 0 ? M_HASH : M_NONE;
    case 15:
        return memcmp(s, "object_group_id", 15) == 0 ? M_GROUP : M_NONE;
    default:
        return M_NONE;
    }
}

/* The member name at c->p, consumed: which key member it names, or M_NONE
 * for a name that is not one (or not a plain string). The five names are
 * matched as literals, quotes included, before any scan. */
static int member_name(struct cur *c)
{
    /* Constant-length compares, which the compiler inlines. */
#define LIT(lit, m)                                                                                \
    if (left >= sizeof(lit) - 1 && memcmp(c->p, lit, sizeof(lit) - 1) == 0) {                      \
        c->p += sizeof(lit) - 1;                                                                   \
        return m;                                                                                  \
    }
    size_t left = (size_t)(c->e - c->p);
    switch (left >= 2 ? c->p[1] : 0) {
    case 'm':
        LIT("\"model_name\"", M_MODEL)
        break;
    case 'k':
        LIT("\"kv_rank\"", M_RANK)
        break;
    case 'c':
        LIT("\"chunk_hash_hex\"", M_HASH)
        LIT("\"cache_salt\"", M_SALT)
        break;
    case 'o':
        LIT("\"object_group_id\"", M_GROUP)
        break;
    default:
        break;
    }
#undef LIT
    const char *name;
    size_t nlen;
    if (plain_string(c, &name, &nlen) != 0)
        return M_NONE;
    return member_of(name, nlen);
}

/* An integer member value: plain digits (what plain_number takes) up to
 * max. Such a number is integral and exact, so kvidx_key_from_input's rule
 * for kv_rank and object_group_id (an integral JSON number in 0..max)
 * takes it with the same value, and refuses every other plain number. */
static int plain_uint(struct cur *c, uint64_t max, uint64_t *v)
{
    double d;
    if (plain_number(c, &d) != 0 || d > (double)max)
        return -1;
    *v = (uint64_t)d;
    return 0;
}

/* A model name or salt value at c->p: the previous key's bytes (which
 * passed their check) are taken by one memcmp, with the previous key's
 * pointer, so that the index's batch probes see one namespace by pointer;
 * other bytes are scanned as a plain string and checked by check. */
static int name_value(struct cur *c, const char *known, size_t known_len,
                      int (*check)(const char *, size_t, kvidx_reason_t *), const char **s,
                      size_t *n)
{
    if (same_string(c, known, known_len)) {
        *s = known;
        *n = known_len;
        return 0;
    }
    if (*c->p != '"' || plain_string(c, s, n) != 0 || check(*s, *n, NULL) != 0)
        return -1;
    return 0;
}

/* One key object at c->p ('{') into *k; *values counts what json_scan
 * would. The model name and salt of prev (the key before, or NULL) passed
 * their checks: the same bytes are not checked again.
 *
 * The key is built here rather than through kvidx_key_from_input, with its
 * rules: chunk_hash_hex, model_name and kv_rank required, the two names and
 * the hash strings, the integers numbers in range, cache_salt "" when
 * absent. A value of another kind is no key of the fast path: the caller
 * falls back to cJSON and json_to_key, which says why. */
static int key_object(struct cur *c, kvidx_key_t *k, const kvidx_key_t *prev, size_t *values)
{
    unsigned seen = 0;
    const char *model = NULL, *salt = "";
    size_t model_len = 0, salt_len = 0;
    uint64_t v;
    memset(k, 0, sizeof(*k));
    c->p++;
    (*values)++;
    for (;;) {
        skip_ws(c);
        int m = member_name(c);
        if (m == M_NONE || (seen & (1u << m)) || expect(c, ':') != 0)
            return -1;
        seen |= 1u << m;
        skip_ws(c);
        if (c->p == c->e)
            return -1;
        switch (m) {
        case M_MODEL:
            if (name_value(c, prev ? prev->model : NULL, prev ? prev->model_len : 0,
                           kvidx_key_check_model, &model, &model_len) != 0)
                return -1;
            break;
        case M_SALT:
            if (name_value(c, prev ? prev->salt : NULL, prev ? prev->salt_len : 0,
                           kvidx_key_check_salt, &salt, &salt_len) != 0)
                return -1;
            break;
        case M_HASH: {
            const char *hex;
            size_t hex_len;
            if (*c->p != '"' || plain_string(c, &hex, &hex_len) != 0 ||
                kvidx_key_hash_from_hex(hex, hex_len, k->hash, &k->hash_len, NULL) != 0)
                return -1;
            break;
        }
        case M_RANK:
            if (plain_uint(c, UINT32_MAX, &v) != 0)
                return -1;
            k->kv_rank = (uint32_t)v;
            break;
        default: /* M_GROUP */
            if (plain_uint(c, KVIDX_GROUP_MAX, &v) != 0)
                return -1;
            k->group = (uint16_t)v;
            break;
        }
        skip_ws(c);
        if (c->p == c->e)
            return -1;
        if (*c->p == '}') {
            c->p++;
            break;
        }
        if (*c->p != ',')
            return -1;
        c->p++;
        (*values)++;
    }
    unsigned required = 1u << M_HASH | 1u << M_MODEL | 1u << M_RANK;
    if ((seen & required) != required)
        return -1;
    k->model = model;
    k->model_len = (uint16_t)model_len;
    /* An empty salt is "", whatever bytes spelled it. */
    k->salt = salt_len ? salt : "";
    k->salt_len = (uint8_t)salt_len;
    return 0;
}

/* A size_bytes value: 1..2^40 as plain digits, what json_uint takes. */
static int plain_size(struct cur *c, uint64_t *v)
{
    double d;
    if (plain_number(c, &d) != 0 || d < 1 || d > (double)KVIDX_SIZE_MAX)
        return -1;
    *v = (uint64_t)d;
    return 0;
}

/* A member name given as a literal (quotes included) at c->p, consumed
 * with the colon after it: 1, or 0 when c->p holds another name. */
static int literal_name(struct cur *c, const char *lit, size_t n)
{
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, lit, n) != 0)
        return 0;
    c->p += n;
    return 1;
}

/* One KeyEntry object at c->p ('{'): "key" (required) and "size_bytes"
 * (0 when absent), each at most once, in either order. */
static int entry_object(struct cur *c, kvidx_put_t *it, const kvidx_key_t *prev, size_t *values)
{
    int have_key = 0, have_size = 0;
    it->size_bytes = 0;
    c->p++;
    (*values)++;
    for (;;) {
        skip_ws(c);
        if (literal_name(c, "\"key\"", 5)) {
            if (have_key || expect(c, ':') != 0)
                return -1;
            skip_ws(c);
            if (c->p == c->e || *c->p != '{' || key_object(c, &it->key, prev, values) != 0)
                return -1;
            have_key = 1;
        } else if (literal_name(c, "\"size_bytes\"", 12)) {
            if (have_size || expect(c, ':') != 0)
                return -1;
            skip_ws(c);
            if (plain_size(c, &it->size_bytes) != 0)
                return -1;
            have_size = 1;
        } else {
            return -1;
        }
        skip_ws(c);
        if (c->p == c->e)
            return -1;
        if (*c->p == '}') {
            c->p++;
            return have_key ? 0 : -1;
        }
        if (*c->p != ',')
            return -1;
        c->p++;
        (*values)++;
    }
}

/* The entries array at c->p ('['), into ks->items; more than max
 * elements, or any element that is not a plain KeyEntry, and the cJSON
 * path answers. */
/* After an array element: 0 past the closing ']', 1 past a ',' (another
 * element follows; it counts one more value), -1 for anything else. */
static int array_next(struct cur *c, size_t *values)
{
    skip_ws(c);
    if (c->p == c->e)
        return -1;
    if (*c->p == ']') {
        c->p++;
        return 0;
    }
    if (*c->p != ',')
        return -1;
    c->p++;
    (*values)++;
    return 1;
}

static int scan_entries(struct cur *c, struct keyscan *ks, uint64_t max, size_t *values)
{
    /* An entry takes at least 80 bytes: one allocation usually. */
    size_t cap = (size_t)(c->e - c->p) / 80 + 1;
    if (cap > 4096)
        cap = 4096;
    ks->items = malloc(cap * sizeof(*ks->items));
    if (!ks->items)
        return -1;
    c->p++;
    (*values)++;
    skip_ws(c);
    if (c->p < c->e && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (ks->n == max || c->p == c->e || *c->p != '{')
            return -1;
        if (ks->n == cap) {
            kvidx_put_t *a = realloc(ks->items, 2 * cap * sizeof(*a));
            if (!a)
                return -1;
            ks->items = a;
            cap *= 2;
        }
        const kvidx_key_t *prev = ks->n ? &ks->items[ks->n - 1].key : NULL;
        if (entry_object(c, &ks->items[ks->n], prev, values) != 0)
            return -1;
        ks->n++;
        int rc = array_next(c, values);
        if (rc <= 0)
            return rc;
    }
}

static void set_array(struct keyscan *ks, int keys, void *arr)
{
    if (keys)
        ks->keys = arr;
    else
        ks->strs = arr;
}

/* The array at c->p ('['): key objects into ks->keys (keys), or plain
 * strings into ks->strs (the chunk_hashes, whose bytes are judged later,
 * as cJSON's would be). More than max elements, or any other element, and
 * the cJSON path answers. */
static int scan_array(struct cur *c, struct keyscan *ks, int keys, uint64_t max, size_t *values)
{
    /* A key object takes at least 50 bytes, a string 2 plus a comma: one
     * allocation usually. */
    size_t esize = keys ? sizeof(*ks->keys) : sizeof(*ks->strs);
    size_t cap = (size_t)(c->e - c->p) / (keys ? 48 : 4) + 1;
    if (cap > 4096)
        cap = 4096;
    size_t *n = keys ? &ks->n : &ks->nstrs;
    void *arr = malloc(cap * esize);
    if (!arr)
        return -1;
    set_array(ks, keys, arr);
    c->p++;
    (*values)++;
    skip_ws(c);
    if (c->p < c->e && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (*n == max)
            return -1;
        if (*n == cap) {
            void *a = realloc(arr, 2 * cap * esize);
            if (!a)
                return -1;
            set_array(ks, keys, arr = a);
            cap *= 2;
        }
        int rc;
        if (keys)
            rc = c->p < c->e && *c->p == '{'
                     ? key_object(c, &ks->keys[*n], *n ? &ks->keys[*n - 1] : NULL, values)
                     : -1;
        else
            rc = plain_string(c, &ks->strs[*n].s, &ks->strs[*n].n);
        if (rc != 0)
            return -1;
        (*n)++;
        rc = array_next(c, values);
        if (rc <= 0)
            return rc;
    }
}

void keyscan_free(struct keyscan *ks)
{
    cJSON_Delete(ks->rest);
    free(ks->keys);
    free(ks->strs);
    free(ks->items);
    memset(ks, 0, sizeof(*ks));
}

int keyscan_text(const char *body, size_t n, const struct app *app, int what, struct keyscan *ks)
{
    memset(ks, 0, sizeof(*ks));
    struct cur c = {body, body + n};
    if (expect(&c, '{') != 0)
        return 1;
    int keys = 0, entries = 0;
    for (;;) {
        const char *name;
        size_t nlen;
        skip_ws(&c);
        if (plain_string(&c, &name, &nlen) != 0 || expect(&c, ':') != 0)
            return 1;
        skip_ws(&c);
        if ((what & KEYSCAN_KEYS) && nlen == 4 && memcmp(name, "keys", 4) == 0) {
            keys = 1;
            break;
        }
        if ((what & KEYSCAN_CHUNK_HASHES) && nlen == 12 && memcmp(name, "chunk_hashes", 12) == 0)
            break;
        if ((what & KEYSCAN_ENTRIES) && nlen == 7 && memcmp(name, "entries", 7) == 0) {
            entries = 1;
            break;
        }
        if (skip_scalar(&c) != 0 || expect(&c, ',') != 0)
            return 1;
    }
    /* Key objects sit at depth 3, which the rest ("[]" at depth 2) does not
     * show; chunk hashes are strings at depth 2, which it does. */
    if (keys && app && app->cfg.max_json_depth < 3)
        return 1;
    /* Entries' key objects sit at depth 4. */
    if (entries && app && app->cfg.max_json_depth < 4)
        return 1;
    if (c.p == c.e || *c.p != '[')
        return 1;
    const char *a0 = c.p;
    size_t values = 0;
    uint64_t max = app ? app->cfg.max_keys_per_request : 262144;
    if ((entries ? scan_entries(&c, ks, max, &values) : scan_array(&c, ks, keys, max, &values)) !=
        0) {
        keyscan_free(ks);
        return 1;
    }
    ks->entries = entries;
    ks->chunk_hashes = !keys && !entries;
    const char *a1 = c.p;
    /* The rest: body[..a0) "[]" body[a1..); "[]" counts one value of the
     * array's, whose others json_parse_text adds as extra values. */
    size_t head = (size_t)(a0 - body), tail = (size_t)(body + n - a1);
    char *t = malloc(head + 2 + tail);
    if (!t) {
        keyscan_free(ks);
        return 1;
    }
    memcpy(t, body, head);
    memcpy(t + head, "[]", 2);
    memcpy(t + head + 2, a1, tail);
    int rc = json_parse_text(t, head + 2 + tail, app, values - 1, NULL, &ks->rest);
    free(t);
    if (rc != 0) {
        keyscan_free(ks);
        return 1;
    }
    return 0;
}

int keyscan_put_one(const char *body, size_t n, uint64_t *size, int *tier)
{
    struct cur c = {body, body + n};
    int have_size = 0, have_tier = 0;
    *size = 0;
    *tier = 0;
    if (expect(&c, '{') != 0)
        return 1;
    skip_ws(&c);
    if (c.p < c.e && *c.p == '}') {
        c.p++;
    } else {
        for (;;) {
            skip_ws(&c);
            if (literal_name(&c, "\"size_bytes\"", 12)) {
                if (have_size || expect(&c, ':') != 0)
                    return 1;
                skip_ws(&c);
                if (plain_size(&c, size) != 0)
                    return 1;
                have_size = 1;
            } else if (literal_name(&c, "\"tier\"", 6)) {
                const char *s;
                size_t sl;
                if (have_tier || expect(&c, ':') != 0)
                    return 1;
                skip_ws(&c);
                if (plain_string(&c, &s, &sl) != 0 || sl != 2 || s[0] != 'l' ||
                    (s[1] != '1' && s[1] != '2'))
                    return 1;
                *tier = s[1] - '0';
                have_tier = 1;
            } else {
                return 1;
            }
            skip_ws(&c);
            if (c.p == c.e)
                return 1;
            if (*c.p == '}') {
                c.p++;
                break;
            }
            if (*c.p != ',')
                return 1;
            c.p++;
        }
    }
    /* One value: nothing but white space after it. */
    skip_ws(&c);
    return c.p == c.e ? 0 : 1;
}
