/*
 * The page-token secret in data_dir/page_token.secret: "KVIDXSEC", the
 * secret's id (u32 LE) and its 32 bytes, mode 0600. Created once, read at
 * every start, so that page tokens stay valid across a restart.
 *
 * Invariants: the file is written atomically (temp file with O_EXCL,
 * fsync, rename, fsync of the directory) and never rewritten; a file that
 * is not exactly a secret stops the start rather than being replaced (a
 * new secret would silently invalidate every token handed out). Copies of
 * the secret in memory are wiped once the keyring holds it.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "util/log.h"

#include "kvidx/err.h"
#include "kvidx/page_token.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define SECRET_MAGIC "KVIDXSEC"
#define SECRET_LEN   (8 + 4 + KVIDX_TOKEN_SECRET_LEN)

/* Parses the file's bytes: 0 and *s, or KVIDX_EINVAL. */
static int secret_parse(const uint8_t *data, size_t n, kvidx_token_secret_t *s)
{
    if (n != SECRET_LEN || memcmp(data, SECRET_MAGIC, 8) != 0)
        return KVIDX_EINVAL;
    s->id = (uint32_t)data[8] | (uint32_t)data[9] << 8 | (uint32_t)data[10] << 16 |
            (uint32_t)data[11] << 24;
    memcpy(s->secret, data + 12, KVIDX_TOKEN_SECRET_LEN);
    return 0;
}

static int secret_create(struct persist *p, const char *path, kvidx_token_secret_t *s)
{
    uint8_t buf[SECRET_LEN];
    if (kvidx_token_secret_generate(s) != 0)
        return KVIDX_EINTERNAL;
    memcpy(buf, SECRET_MAGIC, 8);
    for (int i = 0; i < 4; i++)
        buf[8 + i] = (uint8_t)(s->id >> (8 * i));
    memcpy(buf + 12, s->secret, KVIDX_TOKEN_SECRET_LEN);
    struct why w;
    int rc = write_atomic(p->dir, SECRET_FILE, buf, sizeof(buf), 0600, &w);
    sodium_memzero(buf, sizeof(buf));
    if (rc != 0) {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    log_info("page tokens: created a new secret in %s", path);
    return 0;
}

int secret_load(struct persist *p)
{
    char path[PATHN];
    path_of(p->dir, SECRET_FILE, path, sizeof(path));
    kvidx_token_secret_t s;
    uint8_t *data = NULL;
    size_t n = 0;
    struct why w;
    int rc = file_read(path, &data, &n, &w);
    if (rc == 0) {
        rc = secret_parse(data, n, &s);
        sodium_memzero(data, n);
        free(data);
        if (rc != 0) {
            log_error("refusing to start: %s is not a kvidx page-token secret (%zu bytes)", path,
                      n);
            return KVIDX_EINTERNAL;
        }
        log_info("page tokens: using the secret in %s", path);
    } else if (rc == KVIDX_ENOTFOUND) {
        if (secret_create(p, path, &s) != 0)
            return KVIDX_EINTERNAL;
    } else {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    kvidx_token_keyring_clear(p->keyring);
    rc = kvidx_token_keyring_rotate(p->keyring, &s);
    sodium_memzero(&s, sizeof(s));
    return rc;
}
