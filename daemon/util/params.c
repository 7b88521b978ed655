/*
 * invalid_params of a problem answer, collected while a request is
 * validated: every error is kept (an all-or-nothing batch lists every bad
 * index), names are formatted copies, reasons are static strings.
 *
 * Invariants: items[i].name is resolved into names only by
 * param_errors_finish (the buffer may move while it grows); a failed
 * allocation sets oom once and later adds are dropped; the same (name,
 * reason) among the last few entries is kept once, so a body with a
 * million unknown members makes one entry, not a million.
 */
#include "util/params.h"

#include "kvidx/err.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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

int param_errors_finish(struct param_errors *pe)
{
    if (pe->oom || pe->names.failed)
        return KVIDX_ENOMEM;
    for (size_t i = 0; i < pe->n; i++)
        pe->items[i].name = pe->names.data + pe->name_off[i];
    return 0;
}
