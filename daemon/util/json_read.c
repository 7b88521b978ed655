/*
 * JSON helpers. cJSON parses bodies (with our own depth limit checked first,
 * since cJSON's nesting limit is fixed at build time); libkvidx validates
 * keys from raw fields so its rules are testable without JSON. Nothing
 * here copies request bytes into an answer.
 */
#include "util/json_read.h"

#include "util/context.h"
#include "kvidx/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One pass over a JSON text: its nesting depth (stops counting past limit+1)
 * and an upper bound of its number of values (separators and openers
 * outside strings, plus one). */
static void json_scan(const char *s, size_t n, size_t limit, size_t *depth_out, size_t *values)
{
    size_t depth = 0, max = 0, count = 1;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
            continue;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == ',') {
            count++;
        } else if (c == '[' || c == '{') {
            count++;
            if (++depth > max) {
                max = depth;
                if (max > limit)
                    break;
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    *depth_out = max;
    *values = count;
}

size_t json_depth(const char *s, size_t n, size_t limit)
{
    size_t depth, values;
    json_scan(s, n, limit, &depth, &values);
    return depth;
}

/* Answers the problem only when there is a response to answer in. */
#define PROBLEM(res, ...)                                                                          \
    do {                                                                                           \
        if (res)                                                                                   \
            res_problemf(res, __VA_ARGS__);                                                        \
    } while (0)

int json_parse_text(const char *body, size_t body_len, const struct app *app, size_t extra_values,
                    struct response *res, cJSON **out)
{
    size_t limit = app ? (size_t)app->cfg.max_json_depth : 32;
    *out = NULL;
    if (body_len == 0) {
        PROBLEM(res, KVIDX_EJSON, "the request needs a JSON body");
        return KVIDX_EJSON;
    }
    size_t depth, values;
    json_scan(body, body_len, limit, &depth, &values);
    if (depth > limit) {
        PROBLEM(res, KVIDX_EJSON, "JSON nesting deeper than max_json_depth (%zu)", limit);
        return KVIDX_EJSON;
    }
    /* cJSON spends about 64 bytes per value: a body of tiny values (60 MB
     * of "0,") would cost gigabytes. No request needs more than a few
     * dozen values per key, so refuse before building the tree. */
    uint64_t max_keys = app ? app->cfg.max_keys_per_request : 262144;
    if ((uint64_t)values + extra_values > JSON_VALUES_PER_KEY * max_keys + 4096) {
        PROBLEM(res, KVIDX_EBODYSIZE,
                "the body holds more JSON values than any request of at most %llu keys "
                "needs",
                (unsigned long long)max_keys);
        return KVIDX_EBODYSIZE;
    }
    /* cJSON ends a string at an escaped NUL, so "a\u0000b" would arrive as
     * "a" and pass validation as another key. Every string kvidx reads
     * forbids NUL, and every key field forbids '@', so the escape is
     * rewritten to \u0040 (same length): the value is then rejected. */
    char *patched = NULL;
    const char *text = body;
    for (size_t i = 0, in_str = 0; i < body_len; i++) {
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
                        PROBLEM(res, KVIDX_ENOMEM, "out of memory");
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
    cJSON *j = cJSON_ParseWithLengthOpts(text, body_len, &end, 0);
    if (patched && end)
        end = body + (end - patched);
    free(patched);
    if (!j) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        PROBLEM(res, KVIDX_EJSON, "the body is not valid JSON (error near byte %zu)", off);
        return KVIDX_EJSON;
    }
    /* Only white space may follow the value. */
    const char *p = end ? end : body + body_len;
    const char *stop = body + body_len;
    while (p < stop && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    if (p < stop && !(p + 1 == stop && *p == '\0')) {
        cJSON_Delete(j);
        PROBLEM(res, KVIDX_EJSON, "unexpected data after the JSON value at byte %zu",
                (size_t)(p - body));
        return KVIDX_EJSON;
    }
    *out = j;
    return 0;
}

int json_parse_body(const struct request *req, struct response *res, cJSON **out)
{
    return json_parse_text(req->body, req->body_len, req->app, 0, res, out);
}

void json_field(const cJSON *v, kvidx_field_t *f)
{
    memset(f, 0, sizeof(*f));
    if (!v) {
        f->kind = KVIDX_FIELD_ABSENT;
    } else if (cJSON_IsString(v)) {
        f->kind = KVIDX_FIELD_STRING;
        f->str = v->valuestring;
        f->len = strlen(v->valuestring);
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
        if (!f || f->kind != KVIDX_FIELD_ABSENT) {
            /* Unknown or repeated member: both would silently name another key. */
            in.has_unknown_member = 1;
            continue;
        }
        json_field(m, f);
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

void param_errors_init(struct param_errors *pe)
{
    memset(pe, 0, sizeof(*pe));
    buf_init(&pe->names);
}

void param_errors_free(struct param_errors *pe)
{
    free(pe->items);
    free(pe->name_off);
    buf_free(&pe->names);
    memset(pe, 0, sizeof(*pe));
}

void param_errors_add(struct param_errors *pe, const char *reason, const char *fmt, ...)
{
    if (pe->oom)
        return;
    if (pe->n == pe->cap) {
        size_t cap = pe->cap ? pe->cap * 2 : 16;
        struct invalid_param *items = realloc(pe->items, cap * sizeof(*items));
        if (!items) {
            pe->oom = 1;
            return;
        }
        pe->items = items;
        size_t *off = realloc(pe->name_off, cap * sizeof(*off));
        if (!off) {
            pe->oom = 1;
            return;
        }
        pe->name_off = off;
        pe->cap = cap;
    }
    size_t off = pe->names.len;
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&pe->names, fmt, ap);
    va_end(ap);
    buf_putc(&pe->names, '\0');
    if (pe->names.failed) {
        pe->oom = 1;
        return;
    }
    /* An object with a million unknown members must not make a million
     * entries: a (name, reason) pair already among the last few is
     * dropped. Per-index errors have distinct names and all stay. */
    for (size_t k = pe->n, seen = 0; k-- > 0 && seen < 16; seen++) {
        if (pe->items[k].reason == reason &&
            strcmp(pe->names.data + pe->name_off[k], pe->names.data + off) == 0) {
            pe->names.len = off;
            pe->names.data[off] = '\0';
            return;
        }
    }
    pe->name_off[pe->n] = off;
    pe->items[pe->n].name = NULL;
    pe->items[pe->n].reason = reason;
    pe->n++;
}

void param_errors_key(struct param_errors *pe, const kvidx_reason_t *why, const char *where)
{
    if (strcmp(why->field, "key") == 0)
        param_errors_add(pe, why->rule, "%s", where);
    else
        param_errors_add(pe, why->rule, "%s.%s", where, why->field);
}

int param_errors_respond(struct param_errors *pe, struct response *res, int err, const char *detail)
{
    if (pe->oom || pe->names.failed)
        return res_problem(res, KVIDX_ENOMEM, "out of memory while reporting errors", NULL, 0);
    /* The names buffer may have moved while growing: resolve pointers now. */
    for (size_t i = 0; i < pe->n; i++)
        pe->items[i].name = pe->names.data + pe->name_off[i];
    res_problem(res, err, detail, pe->items, pe->n);
    return err;
}
