/*
 * Parsing of the redis:// and redis+cluster:// source URLs. The user
 * information follows redis-cli's reading: "user:password@" names both,
 * "password@" only the password. As in RFC 3986 the authority ends at the
 * first '/' or '?', so a password holding one of those (or '%') writes it
 * %-escaped; ':' and '@' may stay (the last '@' of the authority ends it). Invariants: a failed
 * parse says why without quoting the password (messages quote nothing the user typed but a setting
 * name); the shown name is the URL with the password replaced by "***"; the output struct is whole
 * on success and cleared on failure.
 */
#include "sources/redis_url.h"

#include "kvidx/err.h"
#include "kvidx/key.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt,
                                                      ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return KVIDX_EINVAL;
}

/* Decodes n bytes of s with %XX escapes into out (cap bytes with the NUL).
 * Returns the decoded length, or -1 on a bad escape, a NUL or no room. */
static long pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = kvidx_hex_value((unsigned char)s[i + 1]);
            int lo = kvidx_hex_value((unsigned char)s[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = hi * 16 + lo;
            i += 2;
        }
        if (c == 0 || o + 1 >= cap)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return (long)o;
}

static int host_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
}

/* One "host[:port]" or "[v6][:port]" of n bytes. */
static int parse_hostport(const char *s, size_t n, struct redis_addr *a, char *err, size_t errlen)
{
    size_t hl, i;
    const char *h = s;
    if (n && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close)
            return fail(err, errlen, "l2_source: an IPv6 address lacks its ']'");
        h = s + 1;
        hl = (size_t)(close - h);
        for (i = 0; i < hl; i++) {
            int c = (unsigned char)h[i];
            if (!(kvidx_hex_value((unsigned char)c) >= 0 || c == ':' || c == '.'))
                return fail(err, errlen, "l2_source: bad character in an IPv6 address");
        }
        i = (size_t)(close - s) + 1;
    } else {
        for (i = 0; i < n && s[i] != ':'; i++)
            if (!host_char((unsigned char)s[i]))
                return fail(err, errlen, "l2_source: bad character in a host name");
        hl = i;
    }
    if (hl == 0)
        return fail(err, errlen, "l2_source: a host is empty");
    if (hl >= sizeof(a->host))
        return fail(err, errlen, "l2_source: a host name is too long");
    memcpy(a->host, h, hl);
    a->host[hl] = '\0';
    a->port = 6379;
    if (i < n) {
        if (s[i] != ':' || i + 1 == n)
            return fail(err, errlen, "l2_source: expected ':port' after a host");
        long p = 0;
        for (i++; i < n; i++) {
            if (s[i] < '0' || s[i] > '9' || p > 65535)
                return fail(err, errlen, "l2_source: a port must be 1..65535");
            p = p * 10 + (s[i] - '0');
        }
        if (p < 1 || p > 65535)
            return fail(err, errlen, "l2_source: a port must be 1..65535");
        a->port = (int)p;
    }
    return 0;
}

static int parse_query(const char *q, size_t n, struct redis_url *u, char *err, size_t errlen)
{
    size_t i = 0;
    int seen_prefix = 0;
    while (i < n) {
        const char *amp = memchr(q + i, '&', n - i);
        size_t end = amp ? (size_t)(amp - q) : n;
        const char *eq = memchr(q + i, '=', end - i);
        size_t klen = eq ? (size_t)(eq - (q + i)) : end - i;
        if (klen == 6 && memcmp(q + i, "prefix", 6) == 0 && eq) {
            if (seen_prefix)
                return fail(err, errlen, "l2_source: prefix is given twice");
            seen_prefix = 1;
            const char *v = eq + 1;
            long len = pct_decode(v, (size_t)(q + end - v), u->prefix, sizeof(u->prefix));
            if (len < 0)
                return fail(err, errlen, "l2_source: prefix has a bad %%-escape or is too long");
            if (len == 0)
                return fail(err, errlen, "l2_source: prefix is empty");
            if (memchr(u->prefix, '@', (size_t)len))
                return fail(err, errlen, "l2_source: prefix must not contain '@'");
            u->prefix_len = (size_t)len;
        } else {
            return fail(err, errlen,
                        "l2_source: unknown URL parameter (only prefix=P is understood)");
        }
        i = end + 1;
    }
    return 0;
}

static int parse(const char *s, struct redis_url *u, char *err, size_t errlen)
{
    const char *rest;
    if (strncmp(s, "redis://", 8) == 0) {
        rest = s + 8;
    } else if (strncmp(s, "redis+cluster://", 16) == 0) {
        rest = s + 16;
        u->cluster = 1;
    } else {
        return fail(err, errlen, "l2_source: not a redis:// or redis+cluster:// URL");
    }
    size_t authlen = strcspn(rest, "/?");
    const char *at = NULL;
    for (const char *q = rest; q < rest + authlen; q++)
        if (*q == '@')
            at = q;
    const char *hosts = rest;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        const char *pw = rest;
        if (colon) {
            if (pct_decode(rest, (size_t)(colon - rest), u->user, sizeof(u->user)) < 0)
                return fail(err, errlen, "l2_source: the user name has a bad %%-escape");
            pw = colon + 1;
        }
        long pl = pct_decode(pw, (size_t)(at - pw), u->password, sizeof(u->password));
        if (pl < 0)
            return fail(err, errlen, "l2_source: the password has a bad %%-escape or is too long");
        u->has_password = pl > 0;
        hosts = at + 1;
    }
    size_t hl = strcspn(hosts, "/?");
    if (hl == 0)
        return fail(err, errlen, "l2_source: no host:port");
    size_t i = 0;
    while (i <= hl) {
        const char *comma = memchr(hosts + i, ',', hl - i);
        size_t end = comma ? (size_t)(comma - hosts) : hl;
        if (u->nseeds == REDIS_SEEDS_MAX)
            return fail(err, errlen, "l2_source: more than %d host:port pairs", REDIS_SEEDS_MAX);
        int rc = parse_hostport(hosts + i, end - i, &u->seeds[u->nseeds], err, errlen);
        if (rc)
            return rc;
        u->nseeds++;
        i = end + 1;
    }
    if (!u->cluster && u->nseeds > 1)
        return fail(err, errlen, "l2_source: redis:// takes one host:port (use redis+cluster://)");
    const char *p = hosts + hl;
    if (*p == '/') {
        p++;
        size_t dl = strcspn(p, "?");
        unsigned long db = 0;
        for (size_t k = 0; k < dl; k++) {
            if (p[k] < '0' || p[k] > '9' || db > 1000000)
                return fail(err, errlen, "l2_source: the database must be a number");
            db = db * 10 + (unsigned long)(p[k] - '0');
        }
        if (db > 1000000)
            return fail(err, errlen, "l2_source: the database must be a number");
        if (u->cluster && db != 0)
            return fail(err, errlen, "l2_source: a cluster has only database 0");
        u->db = (unsigned)db;
        p += dl;
    }
    if (*p == '?') {
        int rc = parse_query(p + 1, strlen(p + 1), u, err, errlen);
        if (rc)
            return rc;
    }
    /* The shown name: scheme, user and "***" for the password, then the
     * rest exactly as written. */
    size_t schemelen = (size_t)(rest - s);
    int n;
    if (u->has_password && u->user[0])
        n = snprintf(u->name, sizeof(u->name), "%.*s%s:***@%s", (int)schemelen, s, u->user, hosts);
    else if (u->has_password)
        n = snprintf(u->name, sizeof(u->name), "%.*s***@%s", (int)schemelen, s, hosts);
    else if (u->user[0])
        n = snprintf(u->name, sizeof(u->name), "%.*s%s@%s", (int)schemelen, s, u->user, hosts);
    else
        n = snprintf(u->name, sizeof(u->name), "%.*s%s", (int)schemelen, s, hosts);
    if (n < 0 || (size_t)n >= sizeof(u->name))
        return fail(err, errlen, "l2_source: the URL is too long");
    return 0;
}

int redis_url_parse(const char *s, struct redis_url *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof(*u));
    int rc = parse(s, u, err, errlen);
    if (rc) {
        redis_url_wipe(u);
        memset(u, 0, sizeof(*u));
    }
    return rc;
}

void redis_url_wipe(struct redis_url *u)
{
    volatile char *p = u->password;
    for (size_t i = 0; i < sizeof(u->password); i++)
        p[i] = 0;
    u->has_password = 0;
}
