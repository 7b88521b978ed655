/*
 * Response helpers for handlers (res_*), RFC 9457 problem+json answers and
 * the percent-decoding used for paths and query strings.
 *
 * Invariants: a problem body never contains request bytes except through
 * jw_strn, which escapes them and keeps the output valid JSON; the problem
 * `type` is always "https://kvidx.dev/problems/<code>" (see docs/http.md);
 * decoders never write past cap and always NUL-terminate on success.
 */
#include "net/http.h"

#include "kvidx/err.h"
#include "kvidx/list_query.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PROBLEM_TYPE_BASE "https://kvidx.dev/problems/"

void res_header(struct response *res, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value);
    /* Header values come from handlers, never from the client; still refuse
     * CR/LF so that no handler can split the answer. */
    if (strpbrk(value, "\r\n") || strpbrk(name, "\r\n:"))
        return;
    if (res->extra_len + nl + vl + 4 >= sizeof(res->extra_headers))
        return;
    char *p = res->extra_headers + res->extra_len;
    memcpy(p, name, nl);
    p[nl] = ':';
    p[nl + 1] = ' ';
    memcpy(p + nl + 2, value, vl);
    p[nl + 2 + vl] = '\r';
    p[nl + 3 + vl] = '\n';
    res->extra_len += nl + vl + 4;
    res->extra_headers[res->extra_len] = '\0';
}

void res_json(struct response *res, int status)
{
    res->status = status;
    res->content_type = "application/json";
}

int res_problem(struct response *res, int err, const char *detail,
                const struct invalid_param *params, size_t n)
{
    const char *code = kvidx_err_code(err);
    int status = kvidx_err_status(err);

    /* Connection-level codes have names the generic table maps to
     * "internal"; keep their own. */
    if (err == KVIDX_ECONNLIMIT)
        code = "too_many_connections";
    buf_reset(&res->body);
    struct jw w;
    jw_init(&w, &res->body);
    jw_obj_begin(&w);
    jw_key(&w, "type");
    {
        char type[128];
        snprintf(type, sizeof(type), PROBLEM_TYPE_BASE "%s", code);
        jw_str(&w, type);
    }
    jw_key(&w, "title");
    jw_str(&w, kvidx_err_title(err));
    jw_key(&w, "status");
    jw_i64(&w, status);
    jw_key(&w, "detail");
    jw_str(&w, detail ? detail : kvidx_err_title(err));
    jw_key(&w, "code");
    jw_str(&w, code);
    if (params && n > 0) {
        jw_key(&w, "invalid_params");
        jw_arr_begin(&w);
        for (size_t i = 0; i < n; i++) {
            jw_obj_begin(&w);
            jw_key(&w, "name");
            jw_str(&w, params[i].name ? params[i].name : "");
            jw_key(&w, "reason");
            jw_str(&w, params[i].reason ? params[i].reason : "");
            jw_obj_end(&w);
        }
        jw_arr_end(&w);
    }
    jw_obj_end(&w);
    res->status = status;
    res->content_type = "application/problem+json";
    return 0;
}

int res_problemf(struct response *res, int err, const char *fmt, ...)
{
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    return res_problem(res, err, detail, NULL, 0);
}

int param_errors_respond(struct param_errors *pe, struct response *res, int err, const char *detail)
{
    if (param_errors_finish(pe) != 0)
        return res_problem(res, KVIDX_ENOMEM, "out of memory while reporting errors", NULL, 0);
    res_problem(res, err, detail, pe->items, pe->n);
    return err;
}

void res_defer(struct response *res, void *waiter, res_cancel_cb cancel)
{
    res->deferred = 1;
    res->done = 0;
    res->waiter = waiter;
    res->cancel = cancel;
}

void res_complete(struct response *res)
{
    res->done = 1;
    if (res->on_complete)
        res->on_complete(res);
}

int pct_decode(const char *s, size_t n, char *out, size_t cap, size_t *out_len, int plus_is_space)
{
    return kvidx_pct_decode(s, n, out, cap, out_len, plus_is_space) == 0 ? 0 : KVIDX_EINVAL;
}

int query_get(const char *query, const char *name, char *out, size_t cap, size_t *out_len)
{
    size_t nl = strlen(name);
    const char *p = query ? query : "";
    while (*p) {
        const char *end = strchr(p, '&');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t kl = eq ? (size_t)(eq - p) : len;
        /* Names are compared raw: ours are plain ASCII and never escaped. */
        if (kl == nl && memcmp(p, name, nl) == 0) {
            const char *v = eq ? eq + 1 : p + len;
            size_t vl = eq ? len - kl - 1 : 0;
            int rc = pct_decode(v, vl, out, cap, out_len, 1);
            return rc < 0 ? rc : 1;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}
