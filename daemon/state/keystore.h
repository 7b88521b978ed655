/*
 * The key catalogue as the daemon holds it: the libkvidx index, the
 * page-token keyring, and the route tables of /v1/keys (api_keys.c).
 */
#ifndef KVIDXD_KEYSTORE_H
#define KVIDXD_KEYSTORE_H

#include "net/router.h"

#include "kvidx/index.h"
#include "kvidx/page_token.h"

struct app;

struct keystore {
    kvidx_index_t *idx;
    kvidx_token_keyring_t keyring;
    struct app *app;
};

/* Creates app->keystore with the capacities of app->cfg. 0 or KVIDX_E*. */
int keystore_init(struct app *app);
void keystore_free(struct app *app);

extern const struct route key_routes[];

#endif
