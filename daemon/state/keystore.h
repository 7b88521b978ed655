/*
 * The key catalogue as the daemon holds it: the libkvidx index and the
 * page-token keyring (state/keystore.c); served by api/keys.c.
 */
#ifndef KVIDXD_KEYSTORE_H
#define KVIDXD_KEYSTORE_H

#include "kvidx/index.h"
#include "kvidx/page_token.h"

struct app;

struct keystore {
    kvidx_index_t *idx;
    kvidx_token_keyring_t keyring;
    struct app *app;
};

/* Creates app->keystore with the capacities of app->cfg and registers its
 * gauges with app->metrics (when set). 0 or KVIDX_E*. */
int keystore_init(struct app *app);
void keystore_free(struct app *app);

#endif
