/*
 * JSON helpers. cJSON parses bodies (with our own depth limit checked first,
 * since cJSON's nesting limit is fixed at build time); libkvidx validates
 * keys from raw fields so its rules are testable without JSON. Nothing
 * here copies request bytes into an answer. A parse that failed because an
 * allocation failed is KVIDX_ENOMEM, never invalid_json: cJSON allocates
 * through a hook of ours that notes the failure (cJSON itself cannot tell).
 */
#include "util/json_read.h"

#include "util/context.h"
#include "kvidx/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_json_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* 1 for a byte that would continue a number token: what follows a JSON
 * number must be white space, a separator, a closer or the end. */
static int continues_number(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
           c == '+' || c == '-';
}

/* Length of the number at s[0..n) by RFC 8259's grammar,
 * -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?, or 0 when the bytes
 * there are no such number or run on into more number bytes (01, 1., 1.e5:
 * cJSON's strtod would take them). */
size_t json_number_len(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i == n || s[i] < '0' || s[i] > '9')
        return 0;
    if (s[i++] != '0')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    return i < n && continues_number(s[i]) ? 0 : i;
}

/* What one pass over a JSON text finds before cJSON sees it. */
struct scan {
    size_t depth;       /* nesting depth, counted up to limit + 1 */
    size_t values;      /* upper bound of the number of values */
    size_t nul_escapes; /* \u0000 escapes inside strings */
    const char *bad;    /* NULL, or the first rule cJSON is too lenient to enforce */
    size_t bad_at;      /* its byte offset */
};

/* The nesting depth (the scan stops once it passes limit), an upper bound
 * of the number of values (separators and openers outside strings, plus
 * one), and what RFC 8259 forbids but cJSON accepts: raw bytes below 0x20
 * inside strings (cJSON copies them, and a NUL then ends the C string
 * early), bytes below 0x20 other than the four white-space ones between
 * tokens (cJSON skips them all), and numbers outside the JSON grammar.
 * Everything else malformed is left to cJSON. */
static void json_scan(const char *s, size_t n, size_t limit, struct scan *sc)
{
    size_t depth = 0, max = 0, count = 1;
    memset(sc, 0, sizeof(*sc));
    for (size_t i = 0; i < n && !sc->bad; i++) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n; i++) {
                c = s[i];
                if (c == '"')
                    break;
                if ((unsigned char)c < 0x20) {
                    sc->bad = "a string holds a raw control character (escape it)";
                    sc->bad_at = i;
                    break;
                }
                if (c == '\\') {
                    if (i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                        sc->nul_escapes++;
                    i++;
                }
            }
        } else if (c == ',') {
            count++;
        } else if (c == '[' || c == '{') {
            count++;
            if (++depth > max) {
                max = depth;
                if (max > limit)
                    break;
            }
        } else if (c == ']' || c == '}') {
            if (depth > 0)
                depth--;
        } else if (c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9')) {
            size_t len = json_number_len(s + i, n - i);
            if (len == 0) {
                sc->bad = "a number outside the JSON grammar (no leading zero, no '+', "
                          "digits on both sides of '.')";
                sc->bad_at = i;
            } else {
                i += len - 1;
            }
        } else if ((unsigned char)c < 0x20 && !is_json_ws(c)) {
            sc->bad = "a control character outside a string";
            sc->bad_at = i;
        }
    }
    sc->depth = max;
    sc->values = count;
}

size_t json_depth(const char *s, size_t n, size_t limit)
{
    struct scan sc;
    json_scan(s, n, limit, &sc);
    return sc.depth;
}

/* Set when an allocation of cJSON's failed on this thread. */
static _Thread_local int cjson_alloc_failed;

static void *cjson_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        cjson_alloc_failed = 1;
    return p;
}

/* Installed at the first parse, from the loop thread, the only one that
 * parses JSON. */
static void cjson_hooks_once(void)
{
    static int installed;
    if (!installed) {
        cJSON_Hooks hooks = {cjson_malloc, free};
        cJSON_InitHooks(&hooks);
        installed = 1;
    }
}

/* Records why a text was refused, when the caller asked. */
#define PROBLEM(err, c, ...)                                                                       \
    do {                                                                                           \
        if (err) {                                                                                 \
            (err)->code = (c);                                                                     \
            snprintf((err)->detail, sizeof((err)->detail), __VA_ARGS__);                           \
        }                                                                                          \
    } while (0)

int json_parse_text(const char *body, size_t body_len, const struct app *app, size_t extra_values,
                    struct json_error *err, cJSON **out)
{
    size_t limit = app ? (size_t)app->cfg.max_json_depth : 32;
    *out = NULL;
    if (body_len == 0) {
        PROBLEM(err, KVIDX_EJSON, "the request needs a JSON body");
        return KVIDX_EJSON;
    }
    struct scan sc;
    json_scan(body, body_len, limit, &sc);
    if (sc.depth > limit) {
        PROBLEM(err, KVIDX_EJSON, "JSON nesting deeper than max_json_depth (%zu)", limit);
        return KVIDX_EJSON;
    }
    if (sc.bad) {
        PROBLEM(err, KVIDX_EJSON, "the body is not valid JSON: %s at byte %zu", sc.bad, sc.bad_at);
        return KVIDX_EJSON;
    }
    /* cJSON spends about 64 bytes per value: a body of tiny values (60 MB
     * of "0,") would cost gigabytes. No request needs more than a few
     * dozen values per key, so refuse before building the tree. */
    uint64_t max_keys = app ? app->cfg.max_keys_per_request : 262144;
    if ((uint64_t)sc.values + extra_values > JSON_VALUES_PER_KEY * max_keys + 4096) {
        PROBLEM(err, KVIDX_EBODYSIZE,
                "the body holds more JSON values than any request of at most %llu keys "
                "needs",
                (unsigned long long)max_keys);
        return KVIDX_EBODYSIZE;
    }
    /* cJSON ends a string at a decoded NUL, so "a\u0000b" would arrive as
     * "a", "l1\u0000x" as "l1", and pass as another value. The escape is
     * rewritten to \u0040 (same length): the string keeps its decoded
     * length with '@' for the NUL, so it equals no name or value it would
     * have been cut to, and every key field, which forbids '@', rejects it
     * (invalid_key, as for any other forbidden byte). With raw control bytes
     * refused above, no string of the tree holds a NUL. */
    char *patched = NULL;
    const char *text = body;
    for (size_t i = 0, in_str = 0; sc.nul_escapes && i < body_len; i++) {
        char c = body[i];
        if (!in_str) {
            in_str = c == '"';
            continue;
        }
        if (c == '"') {
            in_str = 0;
        } else if (c == '\\' && i + 1 < body_len) {
            if (body[i + 1] == 'u' && i + 5 < body_len && memcmp(body + i + 2, "0000", 4) == 0) {
                if (!patched) {
                    patched = malloc(body_len);
                    if (!patched) {
                        PROBLEM(err, KVIDX_ENOMEM, "out of memory");
                        return KVIDX_ENOMEM;
                    }
                    memcpy(patched, body, body_len);
                    text = patched;
                }
                memcpy(patched + i + 2, "0040", 4);
            }
            i++;
        }
    }
    const char *end = NULL;
    cjson_hooks_once();
    cjson_alloc_failed = 0;
    cJSON *j = cJSON_ParseWithLengthOpts(text, body_len, &end, 0);
    if (patched && end)
        end = body + (end - patched);
    free(patched);
    if (!j && cjson_alloc_failed) {
        PROBLEM(err, KVIDX_ENOMEM, "out of memory while parsing the body");
        return KVIDX_ENOMEM;
    }
    if (!j) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        PROBLEM(err, KVIDX_EJSON, "the body is not valid JSON (error near byte %zu)", off);
        return KVIDX_EJSON;
    }
    /* Only white space may follow the value. */
    const char *p = end ? end : body + body_len;
    const char *stop = body + body_len;
    while (p < stop && is_json_ws(*p))
        p++;
    if (p < stop) {
        cJSON_Delete(j);
        PROBLEM(err, KVIDX_EJSON, "unexpected data after the JSON value at byte %zu",
                (size_t)(p - body));
        return KVIDX_EJSON;
    }
    *out = j;
    return 0;
}

const char *json_str(const cJSON *v, size_t *len)
{
    if (!cJSON_IsString(v) || !v->valuestring)
        return NULL;
    *len = strlen(v->valuestring);
    return v->valuestring;
}

void json_field(const cJSON *v, kvidx_field_t *f)
{
    memset(f, 0, sizeof(*f));
    if (!v) {
        f->kind = KVIDX_FIELD_ABSENT;
    } else if ((f->str = json_str(v, &f->len)) != NULL) {
        f->kind = KVIDX_FIELD_STRING;
    } else if (cJSON_IsNumber(v)) {
        f->kind = KVIDX_FIELD_NUMBER;
        f->num = v->valuedouble;
    } else {
        f->kind = KVIDX_FIELD_OTHER;
    }
}

int json_to_key(const cJSON *obj, kvidx_key_t *k, kvidx_reason_t *why)
{
    kvidx_key_input_t in;
    memset(&in, 0, sizeof(in));
    if (!cJSON_IsObject(obj)) {
        if (why) {
            why->field = "key";
            why->rule = "must be an object with chunk_hash_hex, model_name and kv_rank";
        }
        return KVIDX_EKEY;
    }
    int repeated = 0;
    for (const cJSON *m = obj->child; m; m = m->next) {
        kvidx_field_t *f = NULL;
        const char *name = m->string ? m->string : "";
        if (strcmp(name, "chunk_hash_hex") == 0)
            f = &in.chunk_hash_hex;
        else if (strcmp(name, "model_name") == 0)
            f = &in.model_name;
        else if (strcmp(name, "kv_rank") == 0)
            f = &in.kv_rank;
        else if (strcmp(name, "object_group_id") == 0)
            f = &in.object_group_id;
        else if (strcmp(name, "cache_salt") == 0)
            f = &in.cache_salt;
        /* Unknown or repeated member: both would silently name another key. */
        if (!f)
            in.has_unknown_member = 1;
        else if (f->kind != KVIDX_FIELD_ABSENT)
            repeated = 1;
        else
            json_field(m, f);
    }
    if (repeated && !in.has_unknown_member) {
        if (why) {
            why->field = "key";
            why->rule = "has a repeated member (each of chunk_hash_hex, model_name, kv_rank, "
                        "object_group_id, cache_salt at most once)";
        }
        return KVIDX_EKEY;
    }
    return kvidx_key_from_input(&in, k, why);
}

int json_uint(const cJSON *v, double lo, double hi, uint64_t *out)
{
    if (!v)
        return 1;
    if (!cJSON_IsNumber(v))
        return KVIDX_EINVAL;
    return kvidx_key_integral(v->valuedouble, lo, hi, out) == 0 ? 0 : KVIDX_EINVAL;
}

void jw_key_object(struct jw *w, const kvidx_key_t *k)
{
    char hex[2 * KVIDX_HASH_MAX + 1];
    size_t hn = sizeof(hex);
    kvidx_key_hash_to_hex(k, hex, &hn);
    jw_obj_begin(w);
    jw_key(w, "model_name");
    jw_strn(w, k->model, k->model_len);
    jw_key(w, "kv_rank");
    jw_u64(w, k->kv_rank);
    jw_key(w, "object_group_id");
    jw_u64(w, k->group);
    jw_key(w, "chunk_hash_hex");
    jw_strn(w, hex, hn);
    jw_key(w, "cache_salt");
    jw_strn(w, k->salt ? k->salt : "", k->salt_len);
    jw_obj_end(w);
}
