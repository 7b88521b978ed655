/*
 * Bearer tokens and what they grant (state/auth.c): the tokens file
 * (auth_tokens_file, re-read on SIGHUP), the router's access check, the
 * salt quotas the file sets on the key index, and the helpers handlers use
 * to keep a salt-bound token to its salt.
 *
 * With no auth_tokens_file, auth is off: no check is installed, every
 * request's principal is NULL and every helper below lets everything
 * through.
 */
#ifndef KVIDXD_AUTH_H
#define KVIDXD_AUTH_H

#include "net/http.h"

#include "kvidx/key.h"
#include "kvidx/list_query.h"
#include "kvidx/tokens.h"

#include <stddef.h>
#include <stdint.h>

struct app;

/* Reads app->cfg.auth_tokens_file (when set) and installs the router's
 * access check, the file's quotas and the per-salt gauges; needs
 * app->keystore. 0; KVIDX_EINVAL when the file cannot be read or parsed
 * (the reason, with the line number and never a token, is logged);
 * KVIDX_ENOMEM. */
int auth_init(struct app *app);
/* SIGHUP: re-reads the file. A file that cannot be read or parsed keeps
 * the tokens and quotas in force (and logs why); otherwise the new tokens
 * are in force for the next request. Nothing when auth is off. */
void auth_reload(struct app *app);
/* Reads and parses a tokens file without using it (--check-config): 0, or
 * KVIDX_EINVAL / KVIDX_ENOMEM after logging why. */
int auth_check_file(const char *path);
void auth_free(struct app *app);
/* 1 when tokens are required. */
int auth_enabled(const struct app *app);

/* 1 when the request may act on keys of this salt: no principal (auth
 * off, open route), a token without a salt, or a token bound to it. */
int auth_sees_salt(const struct request *req, const char *salt, size_t salt_len);
/* 1 when the request may see per-salt figures of every salt (no principal,
 * or admin). */
int auth_sees_all_salts(const struct request *req);
/* The salt a request is bound to: 1 with *salt and *len, or 0 when it
 * reaches every salt. */
int auth_bound_salt(const struct request *req, const char **salt, size_t *len);

/* For writes: when any of the n keys (at base + i * stride) has a salt the
 * request may not use, answers 403 forbidden (naming no key) and returns
 * KVIDX_EFORBIDDEN; else 0. The answer is the same whether those keys
 * exist or not. */
int auth_forbid_keys(const struct request *req, struct response *res, const void *base,
                     size_t stride, size_t n);
/* For lookups and prefetches: every key of keys[0..n) whose salt the
 * request may not see is made a key the index cannot hold (its salt is set
 * to one no stored key can have), so that it is absent, as a key that was
 * never stored. */
void auth_hide_keys(const struct request *req, kvidx_key_t *keys, size_t n);
/* For a listing: a salt-bound request gets its salt as the salt filter
 * (before the query's digest is taken, so that page tokens are bound to
 * it). Returns 1 when the query names another salt: the listing is then
 * empty, else 0. */
int auth_list_scope(const struct request *req, kvidx_list_query_t *q);

/* The per-salt members of /v1/stats, when tokens are on: "salts", every
 * salt's usage (admin), or "salt", the request's own (a salt-bound token);
 * nothing for other tokens. */
void auth_write_salt_stats(const struct request *req, struct jw *w);

/* A salt as it appears in metrics labels: 16 hex digits of a keyed
 * BLAKE2b of it, with a key drawn at random when the process starts (so
 * that the label tells nothing of the salt, and cannot be matched across
 * restarts). out gets 17 bytes. */
void auth_salt_label(const struct app *app, const char *salt, size_t salt_len, char out[17]);

#endif
