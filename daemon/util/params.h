/*
 * The invalid_params of a problem answer ({"name", "reason"} pairs) and the
 * collector that gathers them while a request is validated (params.c).
 */
#ifndef KVIDXD_PARAMS_H
#define KVIDXD_PARAMS_H

#include "util/json_write.h"

#include "kvidx/key.h"

#include <stddef.h>

struct invalid_param {
    const char *name;   /* e.g. "entries[3].key.kv_rank" (copied) */
    const char *reason; /* static text, never request bytes */
};

/* Collects invalid_params for a 400 answer: every error is kept (an
 * all-or-nothing batch lists every bad index); names are formatted copies,
 * reasons are static strings. */
struct param_errors {
    struct invalid_param *items;
    struct buf names; /* NUL-separated names; items[i].name points here after finish */
    size_t *name_off;
    size_t n, cap;
    int oom;
};
void param_errors_init(struct param_errors *pe);
void param_errors_free(struct param_errors *pe);
void param_errors_add(struct param_errors *pe, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Adds a key error at `where` ("keys[3]"): the name is where itself when the
 * whole key is wrong, else where.<field> ("keys[3].kv_rank"). */
void param_errors_key(struct param_errors *pe, const kvidx_reason_t *why, const char *where);
/* Resolves every item's name; 0, or KVIDX_ENOMEM when an add failed (the
 * list is then incomplete). */
int param_errors_finish(struct param_errors *pe);

#endif
