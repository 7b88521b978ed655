/*
 * Fast path for POST /events bodies (api/events_scan.h). A store batch of
 * 1000 entries is about 6,000 JSON values without token ids and 260,000
 * with 256 an entry; building, walking and freeing their cJSON tree cost
 * more than everything else the request does. Here one pass over the body
 * bytes decodes it into the ev_body arrays directly: three growable
 * arrays a request (batches, entries, token ids), no allocation an entry,
 * strings left in the body.
 *
 * Invariants: the scanner accepts a strict subset of what json_parse_body
 * accepts and events_decode decodes without error, and returns 1 with
 * nothing allocated on anything outside it (escapes, raw control bytes,
 * white space other than JSON's four, repeated members, nested values in
 * members no field names, numbers other than plain digits where an
 * integer is read, token ids that do not fit 32 bits, any batch the
 * reference would refuse, the depth and value limits). Inside the subset
 * every token ends at a JSON white space byte or one of ",:]}", so each
 * span it reads is the span cJSON reads: a string's bytes are cJSON's
 * string, an integer of at most 19 digits converted to double rounds as
 * cJSON's strtod rounds it (both round the exact value to nearest), and
 * ts goes through strtod itself. The decoded batches therefore equal the
 * reference's, and every error answer stays the reference's, which runs
 * on each fallback. tests/unit/daemon/test_daemon_eventscan.c and
 * tests/fuzz/fuzz_daemon_eventscan.c check this differentially.
 */
#include "api/events_scan.h"

#include "util/json_lex.h"
#include "util/json_read.h"

#include "kvidx/key.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define U63    9223372036854775807.0
#define U64_HI 18446744073709549568.0

struct cur {
    const char *p, *e;
    size_t values; /* what json_parse_text would count: 1 + separators + openers */
};

struct sc {
    struct cur c;
    struct ev_body *out;
    size_t cap_b, cap_e, cap_t;
};

static inline int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static inline void skip_ws(struct cur *c)
{
    while (c->p < c->e && is_ws(*c->p))
        c->p++;
}

/* After white space: consumes ch, or -1. */
static inline int expect(struct cur *c, char ch)
{
    skip_ws(c);
    if (c->p == c->e || *c->p != ch)
        return -1;
    c->p++;
    return 0;
}

/* 1 when a number or literal may end at c->p (where cJSON's would). */
static inline int at_delim(const struct cur *c)
{
    if (c->p == c->e)
        return 1;
    char ch = *c->p;
    return is_ws(ch) || ch == ',' || ch == ']' || ch == '}';
}

/* A string without escapes or control bytes (jl_plain_string): its
 * bytes, or -1. */
static inline int plain_string(struct cur *c, const char **s, size_t *n)
{
    const char *q = jl_plain_string(c->p, c->e, s, n);
    if (!q)
        return -1;
    c->p = q;
    return 0;
}

/* The string at c->p when it is exactly "known" (jl_same_string):
 * consumed, 1. */
static inline int same_string(struct cur *c, const char *known, size_t n)
{
    const char *q = jl_same_string(c->p, c->e, known, n);
    if (!q)
        return 0;
    c->p = q;
    return 1;
}

/* 1..maxd decimal digits, no leading zero (but "0"), ending at a
 * delimiter: the exact value, or -1. maxd is at most 19, so it fits. */
static int plain_uint(struct cur *c, size_t maxd, uint64_t *out)
{
    const char *p = c->p, *e = c->e;
    uint64_t x = 0;
    size_t nd = 0;
    while (p < e && (unsigned)(*p - '0') < 10) {
        if (++nd > maxd)
            return -1;
        x = x * 10 + (uint64_t)(*p - '0');
        p++;
    }
    if (nd == 0 || (nd > 1 && c->p[0] == '0'))
        return -1;
    c->p = p;
    if (!at_delim(c))
        return -1;
    *out = x;
    return 0;
}

/* An integer member read as json_uint reads cJSON's double: in [lo, hi]. */
static int uint_value(struct cur *c, double lo, double hi, uint64_t *out)
{
    uint64_t x;
    if (plain_uint(c, 19, &x) != 0)
        return -1;
    /* Below 2^53 the double is exact and every hi here is larger. */
    if (x < (UINT64_C(1) << 53)) {
        if ((double)x < lo)
            return -1;
        *out = x;
        return 0;
    }
    return kvidx_key_integral((double)x, lo, hi, out) == 0 ? 0 : -1;
}

/* Length of a number by JSON's grammar at c->p, or 0 (json_number_len:
 * also 0 when more number bytes follow, where at_delim would refuse). */
static size_t number_span(const struct cur *c)
{
    return json_number_len(c->p, (size_t)(c->e - c->p));
}

/* Any JSON number of at most 40 bytes, through strtod as cJSON reads it
 * (cJSON hands strtod the locale's decimal point; the daemon never leaves
 * the C locale, whose point is '.'). */
static int double_value(struct cur *c, double *out)
{
    size_t n = number_span(c);
    char tmp[41];
    if (n == 0 || n > 40)
        return -1;
    memcpy(tmp, c->p, n);
    tmp[n] = '\0';
    c->p += n;
    if (!at_delim(c))
        return -1;
    *out = strtod(tmp, NULL);
    return 0;
}

/* true, false or null at c->p: 1, 0 or 2, or -1. */
static int literal(struct cur *c)
{
    size_t left = (size_t)(c->e - c->p);
    int v = -1;
    size_t n = 0;
    if (left >= 4 && memcmp(c->p, "true", 4) == 0)
        v = 1, n = 4;
    else if (left >= 5 && memcmp(c->p, "false", 5) == 0)
        v = 0, n = 5;
    else if (left >= 4 && memcmp(c->p, "null", 4) == 0)
        v = 2, n = 4;
    if (v < 0)
        return -1;
    c->p += n;
    return at_delim(c) ? v : -1;
}

/* The value of a member no field names: a plain string, a number, or a
 * literal (the reference ignores it; json_parse_text only lexes it). */
static int skip_scalar(struct cur *c)
{
    if (c->p == c->e)
        return -1;
    if (*c->p == '"') {
        const char *s;
        size_t n;
        return plain_string(c, &s, &n);
    }
    size_t n = number_span(c);
    if (n) {
        c->p += n;
        return at_delim(c) ? 0 : -1;
    }
    return literal(c) >= 0 ? 0 : -1;
}

/* After a member or an element: 1 past a ',' (one more value follows),
 * 0 past the closing byte, -1 for anything else. */
static inline int next_item(struct cur *c, char close)
{
    skip_ws(c);
    if (c->p == c->e)
        return -1;
    if (*c->p == ',') {
        c->p++;
        c->values++;
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        return 0;
    }
    return -1;
}

/* An object's opening '{' at c->p: 1 with c->p at the first member's
 * name, 0 past an empty object, -1 otherwise. */
static int open_object(struct cur *c)
{
    if (c->p == c->e || *c->p != '{')
        return -1;
    c->p++;
    c->values++;
    skip_ws(c);
    if (c->p < c->e && *c->p == '}') {
        c->p++;
        return 0;
    }
    return 1;
}

/* After a member's value: 1 with c->p at the next name, 0 past the '}',
 * -1 otherwise. */
static int next_member(struct cur *c)
{
    int rc = next_item(c, '}');
    if (rc == 1)
        skip_ws(c);
    return rc;
}

struct lit {
    const char *s;
    size_t n;
};
#define LIT(name)                                                                                  \
    {                                                                                              \
        "\"" name "\"", sizeof(name) + 1                                                           \
    }

/* The member name at c->p and its ':', consumed, with the white space
 * after: the index of the name in names (each written with its quotes,
 * "\"key\""), n for a plain name not there, or -1. A known name matches
 * as a literal first; only other names are scanned. */

static int member_name(struct cur *c, const struct lit *names, int n)
{
    size_t left = (size_t)(c->e - c->p);
    int id = -1;
    /* The byte after the quote picks the candidates; names here differ
     * there mostly. */
    char first = left >= 2 ? c->p[1] : 0;
    for (int i = 0; i < n && id < 0; i++) {
        if (names[i].s[1] == first && left >= names[i].n &&
            memcmp(c->p, names[i].s, names[i].n) == 0) {
            c->p += names[i].n;
            id = i;
        }
    }
    if (id < 0) {
        const char *s;
        size_t sl;
        if (plain_string(c, &s, &sl) != 0)
            return -1;
        id = n;
    }
    if (expect(c, ':') != 0)
        return -1;
    skip_ws(c);
    return id;
}

/* The hot objects' names, as literals of constant length (compared
 * inline): the index, or n when the name at c->p is none of them. */
#define TRY(lit, id)                                                                               \
    if (left >= sizeof(lit) - 1 && memcmp(c->p, lit, sizeof(lit) - 1) == 0) {                      \
        c->p += sizeof(lit) - 1;                                                                   \
        return id;                                                                                 \
    }

static inline int key_name(struct cur *c)
{
    size_t left = (size_t)(c->e - c->p);
    switch (left >= 2 ? c->p[1] : 0) {
    case 'm':
        TRY("\"model_name\"", 0)
        break;
    case 'k':
        TRY("\"kv_rank\"", 1)
        break;
    case 'c':
        TRY("\"chunk_hash_hex\"", 2)
        TRY("\"cache_salt\"", 3)
        break;
    case 'o':
        TRY("\"object_group_id\"", 4)
        break;
    default:
        break;
    }
    return 5;
}

static inline int entry_name(struct cur *c)
{
    size_t left = (size_t)(c->e - c->p);
    switch (left >= 2 ? c->p[1] : 0) {
    case 'k':
        TRY("\"key\"", 0)
        break;
    case 's':
        TRY("\"size_bytes\"", 1)
        break;
    case 't':
        TRY("\"token_ids\"", 2)
        TRY("\"token_offset\"", 3)
        break;
    default:
        break;
    }
    return 4;
}
#undef TRY

/* After a quick matcher: a name it did not know is scanned (id n); then
 * the ':' and the white space after it. The id, or -1. */
static inline int name_tail(struct cur *c, int id, int n)
{
    if (id == n) {
        const char *s;
        size_t sl;
        if (plain_string(c, &s, &sl) != 0)
            return -1;
    }
    if (c->p < c->e && *c->p == ':')
        c->p++;
    else if (expect(c, ':') != 0)
        return -1;
    skip_ws(c);
    return id;
}

/* Member flags of one object: each member at most once. */
static inline int once(unsigned *seen, unsigned bit)
{
    if (*seen & bit)
        return -1;
    *seen |= bit;
    return 0;
}

static int grow(void **arr, size_t *cap, size_t need, size_t esize)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *a = realloc(*arr, nc * esize);
    if (!a)
        return -1;
    *arr = a;
    *cap = nc;
    return 0;
}

/* A key object at c->p: the five key members only, strings and plain
 * integers, validated as json_to_key validates them. prev (or NULL) is
 * the key before it in this request, whose model name and salt passed. */
static int key_object(struct cur *c, kvidx_key_t *k, const kvidx_key_t *prev)
{
    kvidx_key_input_t in;
    memset(&in, 0, sizeof(in));
    if (prev) {
        in.valid_model = prev->model;
        in.valid_model_len = prev->model_len;
        in.valid_salt = prev->salt;
        in.valid_salt_len = prev->salt_len;
    }
    kvidx_field_t *const slots[] = {&in.model_name, &in.kv_rank, &in.chunk_hash_hex, &in.cache_salt,
                                    &in.object_group_id};
    int rc = open_object(c);
    for (; rc == 1; rc = next_member(c)) {
        int id = name_tail(c, key_name(c), 5);
        if (id < 0 || id == 5)
            return -1;
        kvidx_field_t *f = slots[id];
        if (f->kind != KVIDX_FIELD_ABSENT || c->p == c->e)
            return -1;
        if (f == &in.model_name && same_string(c, in.valid_model, in.valid_model_len)) {
            f->str = c->p - 1 - in.valid_model_len;
            f->len = in.valid_model_len;
            f->kind = KVIDX_FIELD_STRING;
        } else if (*c->p == '"') {
            if (plain_string(c, &f->str, &f->len) != 0)
                return -1;
            f->kind = KVIDX_FIELD_STRING;
        } else {
            uint64_t x;
            if (plain_uint(c, 19, &x) != 0)
                return -1;
            f->num = (double)x;
            f->kind = KVIDX_FIELD_NUMBER;
        }
    }
    if (rc != 0)
        return -1;
    return kvidx_key_from_input(&in, k, NULL) == 0 ? 0 : -1;
}

/* An entry's token_ids array at c->p: plain ids of 32 bits, at most
 * EVENTS_MAX_ENTRY_TOKENS, appended to the token array. */
static int token_array(struct sc *s, kvidx_dir_entry_t *en)
{
    struct cur *c = &s->c;
    struct ev_body *o = s->out;
    if (c->p == c->e || *c->p != '[')
        return -1;
    c->p++;
    c->values++;
    skip_ws(c);
    if (c->p < c->e && *c->p == ']') {
        c->p++;
        return 0;
    }
    size_t first = o->nt;
    for (;;) {
        skip_ws(c);
        if (o->nt == s->cap_t &&
            grow((void **)&o->tokens, &s->cap_t, o->nt + 1, sizeof(*o->tokens)) != 0)
            return -1;
        uint64_t v;
        if (plain_uint(c, 10, &v) != 0 || v > UINT32_MAX)
            return -1;
        o->tokens[o->nt++] = (uint32_t)v;
        int rc = next_item(c, ']');
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
    }
    if (o->nt - first > EVENTS_MAX_ENTRY_TOKENS)
        return -1;
    en->num_tokens = o->nt - first;
    return 0;
}

enum { E_KEY = 1, E_SIZE = 2, E_OFF = 4, E_TOKS = 8 };

/* One entry object at c->p, appended to the entry array. */
static int entry_object(struct sc *s)
{
    struct cur *c = &s->c;
    struct ev_body *o = s->out;
    if (grow((void **)&o->entries, &s->cap_e, o->ne + 1, sizeof(*o->entries)) != 0)
        return -1;
    kvidx_dir_entry_t *en = &o->entries[o->ne];
    memset(en, 0, sizeof(*en));
    en->token_offset = KVIDX_DIR_UNKNOWN_OFFSET;
    const kvidx_key_t *prev = o->ne ? &o->entries[o->ne - 1].key : NULL;
    unsigned seen = 0;
    int rc = open_object(c);
    for (; rc == 1; rc = next_member(c)) {
        int bad, id = name_tail(c, entry_name(c), 4);
        if (id < 0) {
            return -1;
        } else if (id == 0) {
            bad = once(&seen, E_KEY) || key_object(c, &en->key, prev);
        } else if (id == 1) {
            bad = once(&seen, E_SIZE) || uint_value(c, 0, U63, &en->size_bytes);
        } else if (id == 2) {
            bad = once(&seen, E_TOKS) || token_array(s, en);
        } else if (id == 3) {
            bad = once(&seen, E_OFF);
            if (!bad && c->e - c->p >= 2 && c->p[0] == '-' && c->p[1] == '1') {
                /* LMCache's unknown offset. */
                c->p += 2;
                bad = !at_delim(c);
            } else if (!bad) {
                uint64_t v;
                bad = uint_value(c, 0, U63, &v);
                en->token_offset = (int64_t)v;
            }
        } else {
            bad = skip_scalar(c);
        }
        if (bad)
            return -1;
    }
    if (rc != 0 || !(seen & E_KEY))
        return -1;
    o->ne++;
    return 0;
}

static int entry_array(struct sc *s, kvidx_dir_batch_t *b)
{
    struct cur *c = &s->c;
    if (c->p == c->e || *c->p != '[')
        return -1;
    c->p++;
    c->values++;
    skip_ws(c);
    if (c->p < c->e && *c->p == ']') {
        c->p++;
        return 0;
    }
    size_t first = s->out->ne;
    for (;;) {
        skip_ws(c);
        if (entry_object(s) != 0)
            return -1;
        int rc = next_item(c, ']');
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
    }
    b->num_entries = s->out->ne - first;
    return 0;
}

static inline int name_is(const char *s, size_t n, const char *lit, size_t litn)
{
    return n == litn && memcmp(s, lit, n) == 0;
}
#define NAME_IS(s, n, lit) name_is(s, n, lit, sizeof(lit) - 1)

static int event_type(const char *s, size_t n, kvidx_dir_event_t *out)
{
    if (NAME_IS(s, n, "store"))
        *out = KVIDX_DIR_STORE;
    else if (NAME_IS(s, n, "delete"))
        *out = KVIDX_DIR_DELETE;
    else if (NAME_IS(s, n, "access"))
        *out = KVIDX_DIR_ACCESS;
    else if (NAME_IS(s, n, "config"))
        *out = KVIDX_DIR_CONFIG;
    else
        return -1;
    return 0;
}

enum {
    B_ID = 1,
    B_INC = 2,
    B_SEQ = 4,
    B_TYPE = 8,
    B_TIER = 16,
    B_BACKEND = 32,
    B_ENTRIES = 64,
    B_SHARED = 128,
    B_TS = 256,
    B_CAP = 512,
    B_REV = 1024,
};
#define B_REQUIRED (B_ID | B_INC | B_SEQ | B_TYPE | B_TIER | B_BACKEND)

/* One batch object at c->p, appended to the batch array (its entries
 * and token ids to theirs; their pointers are set at the end). */
static int batch_object(struct sc *s)
{
    struct cur *c = &s->c;
    struct ev_body *o = s->out;
    if (grow((void **)&o->batches, &s->cap_b, o->nb + 1, sizeof(*o->batches)) != 0)
        return -1;
    kvidx_dir_batch_t *b = &o->batches[o->nb];
    memset(b, 0, sizeof(*b));
    static const struct lit names[] = {LIT("instance_id"),
                                       LIT("incarnation"),
                                       LIT("seq"),
                                       LIT("event_type"),
                                       LIT("tier"),
                                       LIT("backend"),
                                       LIT("entries"),
                                       LIT("shared"),
                                       LIT("ts"),
                                       LIT("capacity_bytes"),
                                       LIT("capacity_revision")};
    unsigned seen = 0;
    const char *str;
    size_t slen;
    int rc = open_object(c);
    for (; rc == 1; rc = next_member(c)) {
        int bad, id = member_name(c, names, 11);
        if (id < 0) {
            return -1;
        } else if (id == 0) {
            bad = once(&seen, B_ID) || plain_string(c, &b->instance_id, &b->instance_len);
        } else if (id == 1) {
            bad = once(&seen, B_INC) || uint_value(c, 0, U64_HI, &b->incarnation);
        } else if (id == 2) {
            bad = once(&seen, B_SEQ) || uint_value(c, 1, U64_HI, &b->seq);
        } else if (id == 3) {
            bad = once(&seen, B_TYPE) || plain_string(c, &str, &slen) ||
                  event_type(str, slen, &b->event_type);
        } else if (id == 4) {
            bad = once(&seen, B_TIER) || plain_string(c, &str, &slen) || slen != 2 ||
                  str[0] != 'l' || (str[1] != '1' && str[1] != '2');
            if (!bad)
                b->tier = str[1] == '1' ? KVIDX_DIR_L1 : KVIDX_DIR_L2;
        } else if (id == 5) {
            bad = once(&seen, B_BACKEND) || plain_string(c, &b->backend, &b->backend_len);
        } else if (id == 6) {
            bad = once(&seen, B_ENTRIES) || entry_array(s, b);
        } else if (id == 7) {
            int v = -1;
            bad = once(&seen, B_SHARED) || (v = literal(c)) < 0 || v > 1;
            b->shared = v == 1;
        } else if (id == 8) {
            bad = once(&seen, B_TS) || double_value(c, &b->ts) || !(b->ts >= 0.0);
        } else if (id == 9) {
            bad = once(&seen, B_CAP) || uint_value(c, 0, U63, &b->capacity_bytes);
        } else if (id == 10) {
            bad = once(&seen, B_REV) || uint_value(c, 0, U63, &b->capacity_revision);
        } else {
            bad = skip_scalar(c);
        }
        if (bad)
            return -1;
    }
    if (rc != 0 || (seen & B_REQUIRED) != B_REQUIRED || b->instance_len == 0)
        return -1;
    o->nb++;
    return 0;
}

static int batch_array(struct sc *s)
{
    struct cur *c = &s->c;
    if (c->p == c->e || *c->p != '[')
        return -1;
    c->p++;
    c->values++;
    skip_ws(c);
    if (c->p < c->e && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (batch_object(s) != 0)
            return -1;
        int rc = next_item(c, ']');
        if (rc <= 0)
            return rc;
    }
}

/* The root object: "batches" once, any other member a scalar. */
static int root_object(struct sc *s)
{
    struct cur *c = &s->c;
    static const struct lit names[] = {LIT("batches")};
    unsigned seen = 0;
    skip_ws(c);
    int rc = open_object(c);
    for (; rc == 1; rc = next_member(c)) {
        int id = member_name(c, names, 1);
        int bad = id < 0 ? -1 : id == 0 ? once(&seen, 1) || batch_array(s) : skip_scalar(c);
        if (bad)
            return -1;
    }
    if (rc != 0)
        return -1;
    skip_ws(c);
    return c->p == c->e ? 0 : -1;
}

/* The runs become pointers once the arrays stop moving; then each batch
 * gets the reference's final check. */
static int link_and_check(struct ev_body *o)
{
    size_t ei = 0, ti = 0;
    for (size_t i = 0; i < o->nb; i++) {
        kvidx_dir_batch_t *b = &o->batches[i];
        b->entries = o->entries + ei;
        for (size_t j = 0; j < b->num_entries; j++) {
            kvidx_dir_entry_t *en = &o->entries[ei + j];
            if (en->num_tokens) {
                en->token_ids = o->tokens + ti;
                ti += en->num_tokens;
            }
        }
        ei += b->num_entries;
        if (kvidx_directory_batch_check(b, NULL, NULL) != 0)
            return -1;
    }
    return 0;
}

void ev_body_free(struct ev_body *b)
{
    free(b->batches);
    free(b->entries);
    free(b->tokens);
    memset(b, 0, sizeof(*b));
}

int events_scan(const char *body, size_t n, const struct app *app, struct ev_body *out)
{
    memset(out, 0, sizeof(*out));
    /* The deepest values (a key object, a token id array) sit at depth 6. */
    if (app && app->cfg.max_json_depth < 6)
        return 1;
    struct sc s;
    memset(&s, 0, sizeof(s));
    s.c.p = body;
    s.c.e = body + n;
    s.c.values = 1;
    s.out = out;
    /* Sized from the body so that a usual one needs no growth (an entry
     * of LMCache's takes about 200 bytes, a token id about 7), rounded up
     * to powers of two, and doubled past that; entries are capped, so that
     * a token-heavy body does not allocate slots it never fills. Sizes
     * that follow each body exactly cost about a third more CPU: the
     * allocator then hands out fresh, faulting pages instead of reusing
     * the previous request's blocks. */
    size_t ecap = n / 160 + 16, tcap = n / 8 + 16;
    if (grow((void **)&out->entries, &s.cap_e, ecap > 2048 ? 2048 : ecap, sizeof(*out->entries)) !=
            0 ||
        grow((void **)&out->tokens, &s.cap_t, tcap > 262144 ? 262144 : tcap,
             sizeof(*out->tokens)) != 0 ||
        grow((void **)&out->batches, &s.cap_b, 4, sizeof(*out->batches)) != 0)
        goto fallback;
    if (root_object(&s) != 0)
        goto fallback;
    uint64_t max_keys = app ? app->cfg.max_keys_per_request : 262144;
    if ((uint64_t)s.c.values > JSON_VALUES_PER_KEY * max_keys + 4096)
        goto fallback;
    if (link_and_check(out) != 0)
        goto fallback;
    return 0;
fallback:
    ev_body_free(out);
    return 1;
}
