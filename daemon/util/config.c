/*
 * The settings of kvidxd (docs/operations.md): one table, one row per setting, giving
 * its name, type, place in struct config, default, bounds, whether SIGHUP
 * may change it, and a line of help. Everything else — defaults, parsing of
 * `--set` and of the file, printing, diffing, the docs test — walks that
 * table, so a setting cannot exist in one place and be missing in another.
 *
 * Invariants: every field of struct config has exactly one row; defaults
 * are written as text and go through the same parser as user input (a unit
 * test checks each one parses); a failed config_set or config_load_file
 * leaves the struct as it was; error messages name the setting and never
 * echo more than a short, escaped excerpt of the value.
 */
#include "util/config.h"

#include "kvidx/cidr.h"
#include "kvidx/err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum setting_type {
    T_SIZE,     /* bytes, with an optional KiB/MiB/GiB/TiB suffix */
    T_UINT,     /* plain unsigned decimal */
    T_ENUM,     /* one of choices[], stored as int (the enum's value = index) */
    T_STRING,   /* free text up to the field's size - 1 */
    T_HOSTPORT, /* IPv4:port or [IPv6]:port */
    T_CIDRS,    /* networks in CIDR notation, separated by blanks or commas */
};

struct setting {
    const char *name;
    enum setting_type type;
    size_t offset;
    size_t size; /* of the field: capacity for strings */
    const char *def;
    uint64_t min, max;          /* T_SIZE, T_UINT */
    const char *const *choices; /* T_ENUM, NULL-terminated */
    int reloadable;             /* may change at SIGHUP */
    const char *help;
};

static const char *const fsync_choices[] = {"always", "everysec", "no", NULL};
static const char *const level_choices[] = {"error", "warn", "info", "debug", NULL};
static const char *const format_choices[] = {"text", "json", NULL};
static const char *const loader_choices[] = {"catalog", "external", NULL};
static const char *const retention_choices[] = {"temporary", "retain", NULL};
static const char *const yesno_choices[] = {"no", "yes", NULL};

/* Enums are stored through an int; the compiler must agree on the size. */
_Static_assert(sizeof(enum fsync_policy) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_level) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum loader_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(enum retention) == sizeof(int), "enum size");
_Static_assert(FSYNC_EVERYSEC == 1 && LOG_DEBUG == 3 && LOG_JSON == 1 && LOADER_EXTERNAL == 1 &&
                   RETENTION_RETAIN == 1,
               "enum values are the indices of their choices");

#define KiB     (UINT64_C(1) << 10)
#define MiB     (UINT64_C(1) << 20)
#define GiB     (UINT64_C(1) << 30)
#define TiB     (UINT64_C(1) << 40)
#define HOUR_MS UINT64_C(3600000)
#define DAY_MS  (24 * HOUR_MS)

#define F(field) offsetof(struct config, field), sizeof(((struct config *)0)->field)
#define SIZE(field, def, lo, hi, rel, help)                                                        \
    {                                                                                              \
#field, T_SIZE, F(field), def, lo, hi, NULL, rel, help                                     \
    }
#define UINT(field, def, lo, hi, rel, help)                                                        \
    {                                                                                              \
#field, T_UINT, F(field), def, lo, hi, NULL, rel, help                                     \
    }
#define ENUM(field, def, ch, rel, help)                                                            \
    {                                                                                              \
#field, T_ENUM, F(field), def, 0, 0, ch, rel, help                                         \
    }
#define STR(field, def, rel, help)                                                                 \
    {                                                                                              \
#field, T_STRING, F(field), def, 0, 0, NULL, rel, help                                     \
    }
#define CIDRS(field, def, rel, help)                                                               \
    {                                                                                              \
#field, T_CIDRS, F(field), def, 0, 0, NULL, rel, help                                      \
    }
#define HOSTPORT(field, def, rel, help)                                                            \
    {                                                                                              \
#field, T_HOSTPORT, F(field), def, 0, 0, NULL, rel, help                                   \
    }

static const struct setting settings[] = {
    HOSTPORT(listen, "127.0.0.1:8077", 0,
             "address to serve HTTP on, IPv4:port or [IPv6]:port; port 0 picks a free port"),
    STR(auth_tokens_file, "", 0,
        "file of bearer tokens (<token> <role> [salt=...] [quota_bytes=...] a line), re-read on "
        "SIGHUP; empty: no auth"),
    ENUM(allow_unauthenticated_remote, "no", yesno_choices, 0,
         "yes lets a non-loopback listen address run without auth_tokens_file"),
    CIDRS(ingest_allow_from, "", 1,
          "networks (CIDR, blank- or comma-separated) whose fleet ingest (/events, /instances, "
          "/healthz) needs no token when auth is on; empty: none"),
    STR(data_dir, "", 0,
        "directory for the snapshot and journal; empty keeps everything in memory"),
    ENUM(fsync, "everysec", fsync_choices, 0,
         "when the journal is flushed to disk: always (every write), everysec, no"),
    SIZE(snapshot_journal_bytes, "64MiB", 4096, UINT64_C(1) << 50, 1,
         "journal bytes after which a background snapshot is written and the journal rotated"),
    ENUM(log_level, "info", level_choices, 1,
         "least severe level logged: error, warn, info, debug"),
    ENUM(log_format, "text", format_choices, 1, "log lines as text, or json (one object a line)"),
    SIZE(l1_capacity_bytes, "0", 0, UINT64_C(1) << 60, 0,
         "bytes of L1 (fast tier) the index may account for; 0 = unbounded"),
    SIZE(l2_capacity_bytes, "0", 0, UINT64_C(1) << 60, 0,
         "bytes of L2 (storage tier) the index may account for; 0 = unbounded"),
    ENUM(loader, "catalog", loader_choices, 0,
         "who completes L2->L1 loads: catalog (at once) or external (GET /v1/loads)"),
    UINT(load_timeout_ms, "10000", 1, DAY_MS, 1, "a load not finished after this many ms fails"),
    ENUM(prefetch_retention, "temporary", retention_choices, 0,
         "copies loaded by a LOOKUP prefetch: temporary (dropped at last release) or retain"),
    UINT(default_lease_ms, "30000", 1, 30 * DAY_MS, 1,
         "lease of a prefetch handle that does not ask for one"),
    UINT(max_lease_ms, "600000", 1, 30 * DAY_MS, 1, "longest lease a prefetch handle may ask for"),
    UINT(handle_grace_ms, "60000", 0, DAY_MS, 1,
         "how long a released or expired handle still answers before 404"),
    UINT(page_token_ttl_s, "3600", 1, 30 * 24 * 3600, 1,
         "listing page tokens older than this answer 410 page_token_expired"),
    SIZE(max_body_bytes, "64MiB", 1 * KiB, 4 * GiB, 1, "largest request body (413 above)"),
    SIZE(max_total_body_bytes, "1GiB", 1 * KiB, 1 * TiB, 1,
         "request-body bytes all connections may hold at once; past it a new or growing body "
         "gets 503"),
    UINT(max_keys_per_request, "262144", 1, UINT64_C(1) << 24, 1,
         "most keys one request may name (413 too_many_keys above)"),
    SIZE(max_header_bytes, "16KiB", 1 * KiB, 1 * MiB, 1,
         "largest request header block (431 above)"),
    SIZE(max_uri_bytes, "8KiB", 1 * KiB, 1 * MiB, 1, "longest request URI (414 above)"),
    UINT(max_json_depth, "32", 4, 1000, 1, "deepest nesting of a JSON request body"),
    UINT(header_timeout_ms, "10000", 100, DAY_MS, 1,
         "time allowed for a request's headers, from accept or the previous answer (408)"),
    UINT(idle_timeout_ms, "60000", 100, DAY_MS, 1,
         "idle keep-alive connections, and stalled writers, are closed after this"),
    UINT(max_connections, "10000", 1, 1000000, 1,
         "open connections; past it a new one gets 503 and is closed"),
    SIZE(max_conn_output_bytes, "64MiB", 64 * KiB, 1 * TiB, 1,
         "unsent answer bytes a connection may queue before the daemon stops reading it"),
    UINT(shutdown_timeout_ms, "10000", 0, HOUR_MS, 1,
         "on SIGTERM, how long to let requests in flight finish before exiting"),
    UINT(l2_source_rescan_s, "30", 1, 86400, 0,
         "seconds between full rescans of a Redis/Valkey source whose server does not send the "
         "keyspace events kvidx needs"),
    ENUM(l2_source_configure, "no", yesno_choices, 0,
         "yes: a Redis/Valkey source may CONFIG SET notify-keyspace-events when events it needs "
         "are off"),
    UINT(l2_source_reconnect_max_ms, "5000", 100, 600000, 0,
         "longest wait between two reconnect attempts to an outside store (exponential backoff "
         "with jitter)"),
    STR(l2_source, "", 0,
        "outside L2 stores to index, space-separated: fs:/dir (an LMCache FS L2 directory), "
        "redis://..., redis+cluster://...; empty: none"),
    STR(l2_source_test_overflow_file, "", 0,
        "tests only: a file of this name appearing in an fs: source directory acts as an "
        "inotify queue overflow (a full rescan); empty: off"),
    UINT(l2_source_test_scan_delay_ms, "0", 0, 60000, 0,
         "tests only: an fs: source's scan pauses this long before each batch of names"),
    UINT(instance_timeout_s, "30", 1, 86400, 1,
         "fleet directory: an instance not heard of for this many seconds is dropped (its L1 "
         "placements fenced, its cursor forgotten)"),
    UINT(health_check_interval_s, "10", 1, 3600, 0,
         "fleet directory: seconds between two looks for instances past instance_timeout_s"),
    UINT(chunk_size, "256", 1, 1048576, 0,
         "fleet directory: tokens per chunk when the tokens form is hashed (LMCache's chunk "
         "size)"),
    SIZE(directory_token_bytes, "256MiB", 0, UINT64_C(1) << 40, 1,
         "fleet directory: bytes the token ids of chunk hashes may take (4 per token plus 24 "
         "per chunk); past it the oldest are dropped; 0 = unbounded"),
};

#define N_SETTINGS (sizeof(settings) / sizeof(settings[0]))

static const struct setting *find(const char *name)
{
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (strcmp(settings[i].name, name) == 0)
            return &settings[i];
    return NULL;
}

/* A bounded, escaped copy of untrusted text for an error message: at most
 * 40 bytes of it, control and non-ASCII bytes as \xNN, "..." when cut. */
static void excerpt(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, i = 0;
    const size_t limit = 40;
    for (; s[i] && i < limit && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        } else {
            out[o++] = (char)c;
        }
    }
    if (s[i] && o + 4 <= cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o < cap ? o : cap - 1] = '\0';
}

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

/* Unsigned decimal without sign, spaces or overflow. Returns the number of
 * digits consumed (0 = none or overflow). */
static size_t parse_digits(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return i;
}

static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1}, {"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", TiB}};
    uint64_t v;
    size_t n = parse_digits(s, &v);
    if (n == 0)
        return -1;
    const char *u = s + n;
    if (*u == ' ')
        u++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(u, units[i].suffix) != 0)
            continue;
        if (u != s + n && units[i].mult == 1)
            return -1; /* "64 " */
        if (v > UINT64_MAX / units[i].mult)
            return -1;
        *out = v * units[i].mult;
        return 0;
    }
    return -1;
}

/* Writes a byte count with the largest binary suffix that divides it. */
static void format_size(uint64_t v, char *out, size_t cap)
{
    static const char *const suffix[] = {"TiB", "GiB", "MiB", "KiB"};
    static const uint64_t mult[] = {TiB, GiB, MiB, KiB};
    for (size_t i = 0; i < 4 && v; i++) {
        if (v % mult[i] == 0) {
            snprintf(out, cap, "%llu%s", (unsigned long long)(v / mult[i]), suffix[i]);
            return;
        }
    }
    snprintf(out, cap, "%llu", (unsigned long long)v);
}

/* "IPv4:port" or "[IPv6]:port", port 0..65535. Host names are not
 * accepted: the daemon binds, it does not resolve. */
static int check_hostport(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return -1;
    uint64_t port;
    size_t n = parse_digits(colon + 1, &port);
    if (n == 0 || n > 5 || colon[1 + n] != '\0' || port > 65535)
        return -1;
    char host[64];
    size_t hl = (size_t)(colon - s);
    unsigned char addr[16];
    if (s[0] == '[') {
        if (hl < 3 || s[hl - 1] != ']' || hl - 2 >= sizeof(host))
            return -1;
        memcpy(host, s + 1, hl - 2);
        host[hl - 2] = '\0';
        return inet_pton(AF_INET6, host, addr) == 1 ? 0 : -1;
    }
    if (hl >= sizeof(host))
        return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    return inet_pton(AF_INET, host, addr) == 1 ? 0 : -1;
}

static void range_text(const struct setting *st, char *out, size_t cap)
{
    char lo[32], hi[32];
    if (st->type == T_SIZE) {
        format_size(st->min, lo, sizeof(lo));
        format_size(st->max, hi, sizeof(hi));
    } else {
        snprintf(lo, sizeof(lo), "%llu", (unsigned long long)st->min);
        snprintf(hi, sizeof(hi), "%llu", (unsigned long long)st->max);
    }
    snprintf(out, cap, "%s..%s", lo, hi);
}

static int set_string(char *field, const struct setting *st, const char *value, const char *ex,
                      char *err, size_t errlen)
{
    size_t n = strlen(value);
    if (n >= st->size)
        return fail(err, errlen, "%s: longer than %zu bytes ('%s')", st->name, st->size - 1, ex);
    memcpy(field, value, n + 1);
    return 0;
}

static int set_one(struct config *c, const struct setting *st, const char *value, char *err,
                   size_t errlen)
{
    char *field = (char *)c + st->offset;
    char ex[200];
    excerpt(value, ex, sizeof(ex));
    switch (st->type) {
    case T_SIZE:
    case T_UINT: {
        uint64_t v;
        int bad;
        if (st->type == T_SIZE) {
            bad = parse_size(value, &v) != 0;
        } else {
            size_t n = parse_digits(value, &v);
            bad = n == 0 || value[n] != '\0';
        }
        if (bad)
            return fail(err, errlen, "%s: expected %s, got '%s'", st->name,
                        st->type == T_SIZE ? "a size like 64MiB (bytes, or KiB/MiB/GiB/TiB)"
                                           : "an unsigned integer",
                        ex);
        if (v < st->min || v > st->max) {
            char range[80];
            range_text(st, range, sizeof(range));
            return fail(err, errlen, "%s: '%s' is out of range %s", st->name, ex, range);
        }
        memcpy(field, &v, sizeof(v));
        return 0;
    }
    case T_ENUM:
        for (int i = 0; st->choices[i]; i++) {
            if (strcmp(st->choices[i], value) == 0) {
                memcpy(field, &i, sizeof(i));
                return 0;
            }
        }
        {
            char list[128] = "";
            for (int i = 0; st->choices[i]; i++) {
                if (i)
                    strncat(list, "|", sizeof(list) - strlen(list) - 1);
                strncat(list, st->choices[i], sizeof(list) - strlen(list) - 1);
            }
            return fail(err, errlen, "%s: expected one of %s, got '%s'", st->name, list, ex);
        }
    case T_HOSTPORT:
        if (check_hostport(value) != 0)
            return fail(err, errlen,
                        "%s: expected an address like 127.0.0.1:8077 or [::1]:8077, got '%s'",
                        st->name, ex);
        return set_string(field, st, value, ex, err, errlen);
    case T_STRING:
        return set_string(field, st, value, ex, err, errlen);
    case T_CIDRS: {
        kvidx_cidr_list_t l;
        size_t bad = 0;
        if (kvidx_cidr_parse(value, strlen(value), &l, &bad) != 0)
            return fail(err, errlen,
                        "%s: network %zu is not CIDR notation like 10.0.0.0/8 or fd00::/8 (host "
                        "bits zero, at most %d networks), got '%s'",
                        st->name, bad, KVIDX_CIDR_MAX, ex);
        return set_string(field, st, value, ex, err, errlen);
    }
    }
    return fail(err, errlen, "%s: internal error", st->name);
}

int config_set(struct config *c, const char *name, const char *value, char *err, size_t errlen)
{
    const struct setting *st = find(name);
    if (!st) {
        char ex[200];
        excerpt(name, ex, sizeof(ex));
        return fail(err, errlen, "unknown setting '%s'", ex);
    }
    return set_one(c, st, value, err, errlen);
}

void config_defaults(struct config *c)
{
    memset(c, 0, sizeof(*c));
    /* The defaults are checked by a unit test; they cannot fail here. */
    for (size_t i = 0; i < N_SETTINGS; i++)
        set_one(c, &settings[i], settings[i].def, NULL, 0);
}

/* l2_source: at most 16 space-separated sources, each of a known kind
 * and at most 511 bytes; an fs: source names an absolute directory. The
 * kinds check the rest of their syntax when they are created. A source's
 * text may hold a password, so an error names its kind only. */
static int check_l2_source(const char *v, char *err, size_t errlen)
{
    static const char *const kinds[] = {"fs:", "redis://", "redis+cluster://", NULL};
    int n = 0;
    for (const char *p = v;;) {
        p += strspn(p, " \t");
        if (!*p)
            break;
        size_t len = strcspn(p, " \t");
        n++;
        if (len >= 512)
            return fail(err, errlen, "l2_source: source %d is longer than 511 bytes", n);
        size_t k = 0;
        while (kinds[k] && strncmp(p, kinds[k], strlen(kinds[k])) != 0)
            k++;
        if (!kinds[k])
            return fail(err, errlen,
                        "l2_source: source %d is of no known kind (fs:/dir, redis://..., "
                        "redis+cluster://...)",
                        n);
        if (k == 0 && (len < 4 || p[3] != '/'))
            return fail(err, errlen, "l2_source: source %d: fs: needs an absolute directory", n);
        if (n > 16)
            return fail(err, errlen, "l2_source: more than 16 sources");
        p += len;
    }
    return 0;
}

int config_is_loopback(const char *hostport)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    size_t hl = colon ? (size_t)(colon - hostport) : strlen(hostport);
    const char *h = hostport;
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= sizeof(host))
        return 0;
    memcpy(host, h, hl);
    host[hl] = '\0';
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) != 1)
        return 0;
    static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a, v4mapped, 12) == 0)
        return a[12] == 127;
    for (int i = 0; i < 15; i++)
        if (a[i])
            return 0;
    return a[15] == 1;
}

int config_check(const struct config *c, char *err, size_t errlen)
{
    /* Safe defaults: nobody off this machine reaches an unauthenticated
     * daemon unless the configuration says so in as many words. */
    if (!c->auth_tokens_file[0] && !c->allow_unauthenticated_remote &&
        !config_is_loopback(c->listen))
        return fail(err, errlen,
                    "listen = %s is not a loopback address and auth is off: set "
                    "auth_tokens_file to require bearer tokens, or allow_unauthenticated_remote = "
                    "yes to serve every client without them",
                    c->listen);
    if (c->default_lease_ms > c->max_lease_ms)
        return fail(err, errlen, "default_lease_ms (%llu) is larger than max_lease_ms (%llu)",
                    (unsigned long long)c->default_lease_ms, (unsigned long long)c->max_lease_ms);
    if (check_l2_source(c->l2_source, err, errlen) != 0)
        return KVIDX_EINVAL;
    if (strchr(c->l2_source_test_overflow_file, '/'))
        return fail(err, errlen,
                    "l2_source_test_overflow_file: a file name in the source directory, not a "
                    "path");
    return 0;
}

/* File parsing state. inih hands us lines through read_line(), which
 * counts them, so the handler knows the line it is called for. */
struct load_ctx {
    FILE *f;
    struct config *c;
    const char *path;
    int lineno;
    int err_line; /* first error's line, 0 when none */
    char err[512];
    int set_at[sizeof(settings) / sizeof(settings[0])]; /* line each setting was set on */
};

static char *read_line(char *str, int num, void *stream)
{
    struct load_ctx *x = stream;
    if (!fgets(str, num, x->f))
        return NULL;
    x->lineno++;
    size_t n = strlen(str);
    if (n == 0 || str[n - 1] == '\n')
        return str;
    /* The buffer filled up before the end of the line. A line longer than
     * inih's buffer would come back in pieces, the rest parsed as a line of
     * its own: swallow it and report the line instead. */
    int ch = fgetc(x->f);
    if (ch == EOF || ch == '\n')
        return str;
    while ((ch = fgetc(x->f)) != EOF && ch != '\n')
        ;
    const char *p = str + strspn(str, " \t");
    if (*p == '#' || *p == ';')
        return str; /* a long comment is harmless: its head is still a comment */
    if (!x->err_line) {
        x->err_line = x->lineno;
        snprintf(x->err, sizeof(x->err), "line longer than %d bytes", num - 1);
    }
    str[0] = '\0';
    return str;
}

static int on_setting(void *user, const char *section, const char *name, const char *value)
{
    struct load_ctx *x = user;
    if (x->err_line)
        return 1; /* keep the first error only */
    char msg[sizeof(x->err)];
    int rc = 0;
    if (section && section[0]) {
        char ex[200];
        excerpt(section, ex, sizeof(ex));
        snprintf(msg, sizeof(msg), "[%s]: sections are not used; write 'name = value' lines", ex);
        rc = -1;
    } else {
        const struct setting *st = find(name);
        /* "name = "quoted"" loses its quotes, so that an empty string can be written. */
        char buf[2048];
        size_t n = strlen(value);
        if (n >= 2 && value[0] == '"' && value[n - 1] == '"' && n - 2 < sizeof(buf)) {
            memcpy(buf, value + 1, n - 2);
            buf[n - 2] = '\0';
            value = buf;
        }
        if (st && x->set_at[st - settings]) {
            snprintf(msg, sizeof(msg), "%s: already set on line %d", st->name,
                     x->set_at[st - settings]);
            rc = -1;
        } else {
            rc = config_set(x->c, name, value, msg, sizeof(msg));
            if (rc == 0 && st)
                x->set_at[st - settings] = x->lineno;
        }
    }
    if (rc != 0) {
        x->err_line = x->lineno;
        memcpy(x->err, msg, sizeof(msg));
        return 0;
    }
    return 1;
}

int config_load_file(struct config *c, const char *path, char *err, size_t errlen)
{
    struct load_ctx *x = calloc(1, sizeof(*x));
    if (!x)
        return fail(err, errlen, "%s: out of memory", path);
    x->f = fopen(path, "r");
    if (!x->f) {
        int e = errno;
        free(x);
        return fail(err, errlen, "%s: %s", path, strerror(e));
    }
    /* Work on a copy: a file with an error changes nothing. */
    struct config tmp = *c;
    x->c = &tmp;
    x->path = path;
    int rc = ini_parse_stream(read_line, x, on_setting, x);
    int ret = 0;
    if (ferror(x->f)) {
        ret = fail(err, errlen, "%s: read error", path);
    } else if (rc < 0) {
        ret = fail(err, errlen, "%s: cannot parse (out of memory)", path);
    } else if (rc > 0 && (!x->err_line || rc < x->err_line)) {
        /* inih's own syntax errors (no '=', an unclosed '[') do not reach
         * the handler; they come back as the first bad line. */
        ret = fail(err, errlen, "%s:%d: expected 'name = value', a comment or a blank line", path,
                   rc);
    } else if (x->err_line) {
        ret = fail(err, errlen, "%s:%d: %s", path, x->err_line, x->err);
    }
    fclose(x->f);
    free(x);
    if (ret == 0)
        *c = tmp;
    return ret;
}

int config_reloadable(const char *name)
{
    const struct setting *st = find(name);
    return st ? st->reloadable : 0;
}

const char *config_help(const char *name)
{
    const struct setting *st = find(name);
    return st ? st->help : NULL;
}

const char *config_default(const char *name)
{
    const struct setting *st = find(name);
    return st ? st->def : NULL;
}

/* Copies the text of l2_source with the password of every URL that has
 * one (scheme://user:password@host or scheme://password@host) written as
 * ***, so that logs and diffs never show it. */
static void format_redacted(const char *v, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = v; *p && o + 1 < cap;) {
        const char *tok_end = p + strcspn(p, " \t");
        const char *scheme = strstr(p, "://");
        const char *auth = scheme && scheme < tok_end ? scheme + 3 : NULL;
        const char *at = NULL, *colon = NULL;
        if (auth) {
            const char *auth_end = auth + strcspn(auth, "/?# \t");
            for (const char *q = auth; q < auth_end; q++)
                if (*q == '@')
                    at = q;
            for (const char *q = auth; at && q < at && !colon; q++)
                if (*q == ':')
                    colon = q;
        }
        const char *hide_from = at ? (colon ? colon + 1 : auth) : NULL;
        for (; p < tok_end && o + 1 < cap; p++) {
            if (hide_from && p == hide_from) {
                for (const char *r = "***"; *r && o + 1 < cap; r++)
                    out[o++] = *r;
                /* An empty password starts at the '@' the loop goes on at. */
                hide_from = NULL;
                p = at - 1;
                continue;
            }
            out[o++] = *p;
        }
        for (; *p && (*p == ' ' || *p == '\t') && o + 1 < cap; p++)
            out[o++] = *p;
    }
    if (cap)
        out[o < cap ? o : cap - 1] = '\0';
}

static void format_one(const struct config *c, const struct setting *st, char *out, size_t cap)
{
    const char *field = (const char *)c + st->offset;
    uint64_t v;
    int e;
    switch (st->type) {
    case T_SIZE:
        memcpy(&v, field, sizeof(v));
        format_size(v, out, cap);
        return;
    case T_UINT:
        memcpy(&v, field, sizeof(v));
        snprintf(out, cap, "%llu", (unsigned long long)v);
        return;
    case T_ENUM:
        memcpy(&e, field, sizeof(e));
        for (int i = 0; st->choices[i]; i++) {
            if (i == e) {
                snprintf(out, cap, "%s", st->choices[i]);
                return;
            }
        }
        snprintf(out, cap, "%d", e);
        return;
    case T_STRING:
    case T_HOSTPORT:
    case T_CIDRS:
        if (strcmp(st->name, "l2_source") == 0)
            format_redacted(field, out, cap);
        else
            snprintf(out, cap, "%.*s", (int)st->size, field);
        return;
    }
}

int config_format(const struct config *c, const char *name, char *out, size_t cap)
{
    const struct setting *st = find(name);
    if (!st || cap == 0)
        return KVIDX_EINVAL;
    format_one(c, st, out, cap);
    return 0;
}

void config_diff(const struct config *a, const struct config *b,
                 void (*fn)(void *ctx, const char *name, const char *from, const char *to),
                 void *ctx)
{
    char from[2100], to[2100];
    for (size_t i = 0; i < N_SETTINGS; i++) {
        format_one(a, &settings[i], from, sizeof(from));
        format_one(b, &settings[i], to, sizeof(to));
        if (strcmp(from, to) != 0)
            fn(ctx, settings[i].name, from, to);
    }
}

const char *config_name(size_t i)
{
    return i < N_SETTINGS ? settings[i].name : NULL;
}
