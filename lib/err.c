/*
 * The error table: name, HTTP status, problem code and title of every
 * KVIDX_E* code, all from KVIDX_ERRNO_MAP so they cannot drift apart.
 */
#include "kvidx/err.h"

#include <stddef.h>

struct err_row {
    int value;
    int status;
    const char *name;
    const char *code;
    const char *title;
};

static const struct err_row err_rows[] = {
#define KVIDX_ERR_ROW(name, value, status, code, title)                                            \
    {value, status, "KVIDX_" #name, code, title},
    KVIDX_ERRNO_MAP(KVIDX_ERR_ROW)
#undef KVIDX_ERR_ROW
};

static const struct err_row *err_find(int err)
{
    for (size_t i = 0; i < sizeof(err_rows) / sizeof(err_rows[0]); i++)
        if (err_rows[i].value == err)
            return &err_rows[i];
    return NULL;
}

const char *kvidx_err_name(int err)
{
    const struct err_row *r = err_find(err);
    return r ? r->name : "KVIDX_EUNKNOWN";
}

int kvidx_err_status(int err)
{
    const struct err_row *r = err_find(err);
    return r ? r->status : 500;
}

const char *kvidx_err_code(int err)
{
    const struct err_row *r = err_find(err);
    return r ? r->code : "internal";
}

const char *kvidx_err_title(int err)
{
    const struct err_row *r = err_find(err);
    return r ? r->title : "Internal error";
}
