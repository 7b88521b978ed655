/*
 * The l2_source URLs of a Redis/Valkey store:
 *
 *   redis://[user:password@]host:port[/db][?prefix=P]
 *   redis+cluster://[user:password@]host:port[,host:port...][?prefix=P]
 *
 * Parsing only: no I/O, no allocation. The password is kept for AUTH and
 * never copied into the shown name.
 */
#ifndef KVIDXD_REDIS_URL_H
#define KVIDXD_REDIS_URL_H

#include <stddef.h>

#define REDIS_HOST_MAX   256 /* bytes of a host name or address, NUL included */
#define REDIS_SEEDS_MAX  16  /* host:port pairs in a cluster URL */
#define REDIS_CRED_MAX   256 /* bytes of a user name or password, NUL included */
#define REDIS_PREFIX_MAX 256 /* bytes of a key prefix, NUL included */
#define REDIS_NAME_MAX   512 /* the shown name, as struct source's name */

struct redis_addr {
    char host[REDIS_HOST_MAX]; /* "127.0.0.1", "localhost", "::1" (no brackets) */
    int port;                  /* 1..65535 */
};

struct redis_url {
    int cluster; /* redis+cluster:// */
    struct redis_addr seeds[REDIS_SEEDS_MAX];
    size_t nseeds; /* 1 for redis:// */
    char user[REDIS_CRED_MAX];
    char password[REDIS_CRED_MAX];
    int has_password;
    unsigned db; /* 0 unless /db was given (redis:// only) */
    char prefix[REDIS_PREFIX_MAX];
    size_t prefix_len;         /* 0 without ?prefix= */
    char name[REDIS_NAME_MAX]; /* the URL as shown: the password replaced by "***" */
};

/* Parses s into *u. Percent-escapes (%XX) are decoded in the user, the
 * password and the prefix. A prefix must be 1..255 bytes without '@' (it is
 * joined to the key with '@', as LMCache does). Returns 0, or KVIDX_EINVAL
 * with a message in err that never contains the password. */
int redis_url_parse(const char *s, struct redis_url *u, char *err, size_t errlen);

/* Overwrites the password in *u with zeros. */
void redis_url_wipe(struct redis_url *u);

#endif
