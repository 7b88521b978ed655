/*
 * Settings table (daemon/config.c): defaults of docs/operations.md, size and integer
 * parsing, bounds, enums, addresses, error messages that name the setting,
 * the file format (inih: comments, sections rejected, file:line errors),
 * --set after the file, config_diff and the reloadable flags. Also checks
 * that conf/kvidxd.conf mentions every setting and loads cleanly.
 */
#include "util/config.h"

#include "kvidx/err.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONF_PATH KVIDX_VECTORS_DIR "/../../conf/kvidxd.conf"

static size_t n_settings(void)
{
    size_t n = 0;
    while (config_name(n))
        n++;
    return n;
}

/* ---- defaults ---- */

/* Criterion runs each parameter in a fresh process of a PIE binary, so
 * parameters hold arrays, not pointers into the parent's image. */
struct def_case {
    char name[32];
    char text[32];
};

ParameterizedTestParameters(config, defaults)
{
    static struct def_case cases[] = {
        {"listen", "127.0.0.1:8077"},
        {"data_dir", ""},
        {"fsync", "everysec"},
        {"log_level", "info"},
        {"log_format", "text"},
        {"l1_capacity_bytes", "0"},
        {"l2_capacity_bytes", "0"},
        {"loader", "catalog"},
        {"load_timeout_ms", "10000"},
        {"prefetch_retention", "temporary"},
        {"default_lease_ms", "30000"},
        {"max_lease_ms", "600000"},
        {"handle_grace_ms", "60000"},
        {"page_token_ttl_s", "3600"},
        {"max_body_bytes", "64MiB"},
        {"max_keys_per_request", "262144"},
        {"max_header_bytes", "16KiB"},
        {"max_uri_bytes", "8KiB"},
        {"max_json_depth", "32"},
        {"header_timeout_ms", "10000"},
        {"idle_timeout_ms", "60000"},
        {"max_connections", "10000"},
        {"max_conn_output_bytes", "64MiB"},
        {"shutdown_timeout_ms", "10000"},
        {"l2_source_rescan_s", "30"},
        {"l2_source_configure", "no"},
        {"l2_source_reconnect_max_ms", "5000"},
        {"l2_source", ""},
        {"l2_source_test_overflow_file", ""},
        {"l2_source_test_scan_delay_ms", "0"},
        {"instance_timeout_s", "30"},
        {"health_check_interval_s", "10"},
        {"chunk_size", "256"},
        {"directory_token_bytes", "256MiB"},
    };
    return cr_make_param_array(struct def_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct def_case *tc, config, defaults)
{
    struct config c;
    config_defaults(&c);
    char out[1100];
    cr_assert_eq(config_format(&c, tc->name, out, sizeof(out)), 0, "%s", tc->name);
    cr_assert_str_eq(out, tc->text, "%s", tc->name);
    cr_assert_str_eq(config_default(tc->name), tc->text);
}

Test(config, default_fields)
{
    struct config c;
    config_defaults(&c);
    cr_assert_str_eq(c.listen, "127.0.0.1:8077");
    cr_assert_str_eq(c.data_dir, "");
    cr_assert_eq(c.fsync, FSYNC_EVERYSEC);
    cr_assert_eq(c.log_level, LOG_INFO);
    cr_assert_eq(c.log_format, LOG_TEXT);
    cr_assert_eq(c.loader, LOADER_CATALOG);
    cr_assert_eq(c.prefetch_retention, RETENTION_TEMPORARY);
    cr_assert_eq(c.max_body_bytes, 64u << 20);
    cr_assert_eq(c.max_header_bytes, 16u << 10);
    cr_assert_eq(c.max_uri_bytes, 8u << 10);
    cr_assert_eq(c.max_conn_output_bytes, 64u << 20);
    cr_assert_eq(c.max_keys_per_request, 262144);
    cr_assert_eq(c.page_token_ttl_s, 3600);
    cr_assert_eq(config_check(&c, NULL, 0), 0);
}

/* Every row: has help, its default parses, and it is a field that
 * round-trips through format and set. */
Test(config, every_row_consistent)
{
    size_t n = n_settings();
    cr_assert_eq(n, 39, "one row per field of struct config");
    struct config c;
    config_defaults(&c);
    for (size_t i = 0; i < n; i++) {
        const char *name = config_name(i);
        cr_assert(config_help(name) && strlen(config_help(name)) > 10, "%s help", name);
        char err[256] = "", out[1100];
        struct config d = c;
        cr_assert_eq(config_set(&d, name, config_default(name), err, sizeof(err)), 0, "%s: %s",
                     name, err);
        cr_assert_eq(memcmp(&c, &d, sizeof(c)), 0, "%s", name);
        cr_assert_eq(config_format(&c, name, out, sizeof(out)), 0);
        cr_assert_eq(config_set(&d, name, out, err, sizeof(err)), 0, "%s: %s", name, err);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(config_name(j), name, "duplicate %s", name);
    }
    cr_assert_null(config_name(n));
}

/* ---- values ---- */

struct set_case {
    char name[32];
    char value[48];
    int ok;
    uint64_t expect;  /* for numeric settings when ok */
    char message[80]; /* substring of the error when !ok */
};

ParameterizedTestParameters(config, set_values)
{
    static struct set_case cases[] = {
        {"max_body_bytes", "1048576", 1, 1048576, ""},
        {"max_body_bytes", "2KiB", 1, 2048, ""},
        {"max_body_bytes", "3MiB", 1, 3u << 20, ""},
        {"max_body_bytes", "1GiB", 1, 1u << 30, ""},
        {"max_body_bytes", "4GiB", 1, 4ull << 30, ""},
        {"max_body_bytes", "16 MiB", 1, 16u << 20, ""},
        {"max_body_bytes", "1024", 1, 1024, ""},
        {"max_body_bytes", "1023", 0, 0, "max_body_bytes: '1023' is out of range 1KiB..4GiB"},
        {"max_body_bytes", "5GiB", 0, 0, "out of range"},
        {"max_body_bytes", "abc", 0, 0, "max_body_bytes: expected a size like 64MiB"},
        {"max_body_bytes", "64MB", 0, 0, "expected a size"},
        {"max_body_bytes", "64M", 0, 0, "expected a size"},
        {"max_body_bytes", "-1", 0, 0, "expected a size"},
        {"max_body_bytes", "", 0, 0, "expected a size"},
        {"max_body_bytes", "64 ", 0, 0, "expected a size"},
        {"max_body_bytes", "1.5MiB", 0, 0, "expected a size"},
        {"max_body_bytes", "99999999999999999999999", 0, 0, "expected a size"},
        {"l1_capacity_bytes", "18446744073709551615KiB", 0, 0, "expected a size"},
        {"l1_capacity_bytes", "0", 1, 0, ""},
        {"l1_capacity_bytes", "512GiB", 1, 512ull << 30, ""},
        {"max_keys_per_request", "1", 1, 1, ""},
        {"max_keys_per_request", "0", 0, 0, "max_keys_per_request: '0' is out of range 1.."},
        {"max_keys_per_request", "12x", 0, 0, "expected an unsigned integer"},
        {"max_keys_per_request", "+5", 0, 0, "expected an unsigned integer"},
        {"max_keys_per_request", " 5", 0, 0, "expected an unsigned integer"},
        {"max_keys_per_request", "1KiB", 0, 0, "expected an unsigned integer"},
        {"max_json_depth", "3", 0, 0, "out of range 4..1000"},
        {"max_json_depth", "1000", 1, 1000, ""},
        {"page_token_ttl_s", "60", 1, 60, ""},
        {"handle_grace_ms", "0", 1, 0, ""},
        {"header_timeout_ms", "99", 0, 0, "header_timeout_ms"},
        {"max_connections", "1000001", 0, 0, "out of range"},
        {"fsync", "always", 1, FSYNC_ALWAYS, ""},
        {"fsync", "no", 1, FSYNC_NO, ""},
        {"fsync", "sometimes", 0, 0, "fsync: expected one of always|everysec|no, got 'sometimes'"},
        {"fsync", "ALWAYS", 0, 0, "fsync: expected one of"},
        {"log_level", "debug", 1, LOG_DEBUG, ""},
        {"log_level", "error", 1, LOG_ERROR, ""},
        {"log_level", "verbose", 0, 0, "log_level: expected one of error|warn|info|debug"},
        {"log_format", "json", 1, LOG_JSON, ""},
        {"loader", "external", 1, LOADER_EXTERNAL, ""},
        {"prefetch_retention", "retain", 1, RETENTION_RETAIN, ""},
        {"listen", "0.0.0.0:0", 1, 0, ""},
        {"listen", "[::1]:8077", 1, 0, ""},
        {"listen", "127.0.0.1:65535", 1, 0, ""},
        {"listen", "127.0.0.1:65536", 0, 0, "listen: expected an address"},
        {"listen", "127.0.0.1", 0, 0, "listen: expected an address"},
        {"listen", ":8077", 0, 0, "listen"},
        {"listen", "::1:8077", 0, 0, "listen"},
        {"listen", "localhost:8077", 0, 0, "listen"},
        {"listen", "127.0.0.1:80a", 0, 0, "listen"},
        {"data_dir", "/var/lib/kvidxd", 1, 0, ""},
        {"nosuch", "1", 0, 0, "unknown setting 'nosuch'"},
        {"Max_Body_Bytes", "1", 0, 0, "unknown setting 'Max_Body_Bytes'"},
    };
    return cr_make_param_array(struct set_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct set_case *tc, config, set_values)
{
    struct config c, before;
    config_defaults(&c);
    before = c;
    char err[256] = "";
    int rc = config_set(&c, tc->name, tc->value, err, sizeof(err));
    if (!tc->ok) {
        cr_assert_eq(rc, KVIDX_EINVAL, "%s=%s accepted", tc->name, tc->value);
        cr_assert(strstr(err, tc->message), "message '%s' lacks '%s'", err, tc->message);
        cr_assert_eq(memcmp(&c, &before, sizeof(c)), 0, "a failed set changed the config");
        return;
    }
    cr_assert_eq(rc, 0, "%s=%s: %s", tc->name, tc->value, err);
    char out[1100];
    config_format(&c, tc->name, out, sizeof(out));
    if (strcmp(tc->name, "listen") == 0 || strcmp(tc->name, "data_dir") == 0) {
        cr_assert_str_eq(out, tc->value);
    } else if (strcmp(tc->name, "fsync") == 0) {
        cr_assert_eq((uint64_t)c.fsync, tc->expect);
    } else if (strcmp(tc->name, "log_level") == 0) {
        cr_assert_eq((uint64_t)c.log_level, tc->expect);
    } else if (strcmp(tc->name, "log_format") == 0) {
        cr_assert_eq((uint64_t)c.log_format, tc->expect);
    } else if (strcmp(tc->name, "loader") == 0) {
        cr_assert_eq((uint64_t)c.loader, tc->expect);
    } else if (strcmp(tc->name, "prefetch_retention") == 0) {
        cr_assert_eq((uint64_t)c.prefetch_retention, tc->expect);
    } else {
        /* Numeric: read back through the text form. */
        struct config d;
        config_defaults(&d);
        cr_assert_eq(config_set(&d, tc->name, out, err, sizeof(err)), 0);
        cr_assert_eq(memcmp(&c, &d, sizeof(c)), 0);
        if (strcmp(tc->name, "max_body_bytes") == 0)
            cr_assert_eq(c.max_body_bytes, tc->expect);
        else if (strcmp(tc->name, "l1_capacity_bytes") == 0)
            cr_assert_eq(c.l1_capacity_bytes, tc->expect);
        else if (strcmp(tc->name, "max_keys_per_request") == 0)
            cr_assert_eq(c.max_keys_per_request, tc->expect);
        else if (strcmp(tc->name, "max_json_depth") == 0)
            cr_assert_eq(c.max_json_depth, tc->expect);
        else if (strcmp(tc->name, "page_token_ttl_s") == 0)
            cr_assert_eq(c.page_token_ttl_s, tc->expect);
        else if (strcmp(tc->name, "handle_grace_ms") == 0)
            cr_assert_eq(c.handle_grace_ms, tc->expect);
    }
}

Test(config, format_sizes)
{
    struct config c;
    config_defaults(&c);
    char err[256], out[64];
    cr_assert_eq(config_set(&c, "max_body_bytes", "1536KiB", err, sizeof(err)), 0);
    config_format(&c, "max_body_bytes", out, sizeof(out));
    cr_assert_str_eq(out, "1536KiB");
    cr_assert_eq(config_set(&c, "max_body_bytes", "1025", err, sizeof(err)), 0);
    config_format(&c, "max_body_bytes", out, sizeof(out));
    cr_assert_str_eq(out, "1025");
    cr_assert_eq(config_set(&c, "l2_capacity_bytes", "2048GiB", err, sizeof(err)), 0);
    config_format(&c, "l2_capacity_bytes", out, sizeof(out));
    cr_assert_str_eq(out, "2TiB");
    cr_assert_eq(config_format(&c, "nosuch", out, sizeof(out)), KVIDX_EINVAL);
}

/* A huge or hostile value is never echoed whole or raw. */
Test(config, error_excerpt_bounded)
{
    char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    cr_assert_eq(config_set(&c, "max_body_bytes", big, err, sizeof(err)), KVIDX_EINVAL);
    cr_assert(strstr(err, "max_body_bytes"));
    cr_assert(strstr(err, "..."), "%s", err);
    cr_assert_lt(strlen(err), 200);
    cr_assert_eq(config_set(&c, "fsync", "a\nb\x1b", err, sizeof(err)), KVIDX_EINVAL);
    cr_assert_null(strchr(err, '\n'), "%s", err);
    cr_assert_null(strchr(err, '\x1b'));
    cr_assert_eq(config_set(&c, big, "1", err, sizeof(err)), KVIDX_EINVAL);
    cr_assert(strstr(err, "unknown setting"));
    cr_assert_lt(strlen(err), 200);
    /* data_dir longer than its field. */
    cr_assert_eq(config_set(&c, "data_dir", big, err, sizeof(err)), KVIDX_EINVAL);
    cr_assert(strstr(err, "data_dir: longer than 1023 bytes"), "%s", err);
    cr_assert_eq(config_set(&c, "x", "1", err, 8), KVIDX_EINVAL); /* truncated, no overflow */
    cr_assert_eq(strlen(err), 7);
}

Test(config, check_lease_order)
{
    struct config c;
    config_defaults(&c);
    char err[256] = "";
    cr_assert_eq(config_set(&c, "default_lease_ms", "700000", err, sizeof(err)), 0);
    cr_assert_eq(config_check(&c, err, sizeof(err)), KVIDX_EINVAL);
    cr_assert(strstr(err, "default_lease_ms") && strstr(err, "max_lease_ms"), "%s", err);
    cr_assert_eq(config_set(&c, "max_lease_ms", "700000", err, sizeof(err)), 0);
    cr_assert_eq(config_check(&c, err, sizeof(err)), 0);
}

/* Safe defaults: a non-loopback listen address needs tokens, or the
 * setting that says in as many words that it may run without them. */
Test(config, remote_listen_needs_auth_or_consent)
{
    static const struct {
        const char *listen;
        int loopback;
    } cases[] = {
        {"127.0.0.1:8077", 1}, {"127.255.0.9:1", 1},
        {"[::1]:8077", 1},     {"[::ffff:127.0.0.1]:80", 1},
        {"0.0.0.0:8077", 0},   {"10.1.2.3:80", 0},
        {"[::]:8077", 0},      {"[::ffff:10.0.0.1]:80", 0},
        {"[fe80::1]:80", 0},   {"128.0.0.1:80", 0},
    };
    char err[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_eq(config_is_loopback(cases[i].listen), cases[i].loopback, "%s", cases[i].listen);
        struct config c;
        config_defaults(&c);
        cr_assert_eq(config_set(&c, "listen", cases[i].listen, err, sizeof(err)), 0);
        err[0] = '\0';
        int rc = config_check(&c, err, sizeof(err));
        cr_assert_eq(rc, cases[i].loopback ? 0 : KVIDX_EINVAL, "%s", cases[i].listen);
        if (!cases[i].loopback) {
            cr_assert(strstr(err, "allow_unauthenticated_remote = yes"), "%s", err);
            cr_assert(strstr(err, "auth_tokens_file"), "%s", err);
        }
        struct config y = c, t = c;
        cr_assert_eq(config_set(&y, "allow_unauthenticated_remote", "yes", err, sizeof(err)), 0);
        cr_assert_eq(config_check(&y, err, sizeof(err)), 0, "%s", cases[i].listen);
        cr_assert_eq(config_set(&t, "auth_tokens_file", "/etc/kvidx/tokens", err, sizeof(err)), 0);
        cr_assert_eq(config_check(&t, err, sizeof(err)), 0, "%s", cases[i].listen);
    }
    struct config c;
    config_defaults(&c);
    cr_assert_eq(c.allow_unauthenticated_remote, 0);
    cr_assert_str_eq(c.auth_tokens_file, "");
    cr_assert_eq(config_set(&c, "allow_unauthenticated_remote", "true", err, sizeof(err)),
                 KVIDX_EINVAL);
}

Test(config, l2_source_checked_and_passwords_never_shown)
{
    struct config c;
    char err[256] = "";
    static const char *const bad[] = {
        "ftp://x", "fs:relative/dir", "fs:", "fs:/a nfs:/b", "redis:/host:6379", "FS:/srv/l2",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        config_defaults(&c);
        cr_assert_eq(config_set(&c, "l2_source", bad[i], err, sizeof(err)), 0);
        cr_assert_eq(config_check(&c, err, sizeof(err)), KVIDX_EINVAL, "%s", bad[i]);
        cr_assert(strstr(err, "l2_source"), "%s", err);
    }
    config_defaults(&c);
    cr_assert_eq(
        config_set(&c, "l2_source", "redis://u:hunter2@h:1 ftp://hunter2", err, sizeof(err)), 0);
    cr_assert_eq(config_check(&c, err, sizeof(err)), KVIDX_EINVAL);
    cr_assert_null(strstr(err, "hunter2"), "%s", err);
    char many[1024] = "";
    for (int i = 0; i < 17; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "fs:/d%d ", i);
    config_defaults(&c);
    cr_assert_eq(config_set(&c, "l2_source", many, err, sizeof(err)), 0);
    cr_assert_eq(config_check(&c, err, sizeof(err)), KVIDX_EINVAL, "17 sources");
    config_defaults(&c);
    cr_assert_eq(config_set(&c, "l2_source",
                            "  fs:/srv/l2 redis://user:hunter2@10.0.0.1:6379/0?prefix=p "
                            "redis://hunter3@h:1 redis+cluster://a:1,b:2",
                            err, sizeof(err)),
                 0);
    cr_assert_eq(config_check(&c, err, sizeof(err)), 0, "%s", err);
    char out[512];
    cr_assert_eq(config_format(&c, "l2_source", out, sizeof(out)), 0);
    cr_assert_str_eq(out, "  fs:/srv/l2 redis://user:***@10.0.0.1:6379/0?prefix=p "
                          "redis://***@h:1 redis+cluster://a:1,b:2");
    cr_assert_eq(config_set(&c, "l2_source_test_overflow_file", "a/b", err, sizeof(err)), 0);
    cr_assert_eq(config_check(&c, err, sizeof(err)), KVIDX_EINVAL);
}

/* ---- reloadable ---- */

Test(config, reloadable_flags)
{
    static const char *const fixed[] = {"listen",
                                        "auth_tokens_file",
                                        "allow_unauthenticated_remote",
                                        "data_dir",
                                        "fsync",
                                        "loader",
                                        "l1_capacity_bytes",
                                        "l2_capacity_bytes",
                                        "prefetch_retention",
                                        "l2_source_rescan_s",
                                        "l2_source_configure",
                                        "l2_source_reconnect_max_ms",
                                        "l2_source",
                                        "l2_source_test_overflow_file",
                                        "l2_source_test_scan_delay_ms",
                                        "health_check_interval_s",
                                        "chunk_size"};
    static const char *const reloadable[] = {"log_level",
                                             "log_format",
                                             "max_body_bytes",
                                             "max_total_body_bytes",
                                             "max_keys_per_request",
                                             "max_header_bytes",
                                             "max_uri_bytes",
                                             "max_json_depth",
                                             "header_timeout_ms",
                                             "idle_timeout_ms",
                                             "max_connections",
                                             "max_conn_output_bytes",
                                             "page_token_ttl_s",
                                             "default_lease_ms",
                                             "max_lease_ms",
                                             "handle_grace_ms",
                                             "load_timeout_ms",
                                             "shutdown_timeout_ms",
                                             "snapshot_journal_bytes",
                                             "instance_timeout_s",
                                             "directory_token_bytes",
                                             "ingest_allow_from"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        cr_assert_eq(config_reloadable(fixed[i]), 0, "%s", fixed[i]);
    for (size_t i = 0; i < sizeof(reloadable) / sizeof(reloadable[0]); i++)
        cr_assert_eq(config_reloadable(reloadable[i]), 1, "%s", reloadable[i]);
    cr_assert_eq(sizeof(fixed) / sizeof(fixed[0]) + sizeof(reloadable) / sizeof(reloadable[0]),
                 n_settings(), "every setting classified");
    cr_assert_eq(config_reloadable("nosuch"), 0);
}

/* ---- diff ---- */

struct diff_log {
    char text[1024];
    int n;
};

static void on_diff(void *ctx, const char *name, const char *from, const char *to)
{
    struct diff_log *d = ctx;
    size_t l = strlen(d->text);
    snprintf(d->text + l, sizeof(d->text) - l, "%s:%s->%s;", name, from, to);
    d->n++;
}

Test(config, diff)
{
    struct config a, b;
    config_defaults(&a);
    b = a;
    struct diff_log d = {"", 0};
    config_diff(&a, &b, on_diff, &d);
    cr_assert_eq(d.n, 0);
    char err[256];
    config_set(&b, "log_level", "debug", err, sizeof(err));
    config_set(&b, "max_body_bytes", "1MiB", err, sizeof(err));
    config_set(&b, "listen", "127.0.0.1:0", err, sizeof(err));
    config_diff(&a, &b, on_diff, &d);
    cr_assert_eq(d.n, 3);
    cr_assert_str_eq(d.text, "listen:127.0.0.1:8077->127.0.0.1:0;log_level:info->debug;"
                             "max_body_bytes:64MiB->1MiB;");
}

/* ---- files ---- */

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/kvidx-config-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    size_t n = strlen(text);
    cr_assert_eq(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path;
}

static int load_text(struct config *c, const char *text, char *err, size_t errlen)
{
    char *path = write_tmp(text);
    int rc = config_load_file(c, path, err, errlen);
    unlink(path);
    return rc;
}

Test(config, file_ok_with_comments)
{
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    const char *text = "# a comment\n"
                       "; another comment\n"
                       "\n"
                       "listen = 127.0.0.1:0\n"
                       "max_body_bytes = 1MiB\n"
                       "  # indented comment\n"
                       "log_format=json\n"
                       "data_dir = \"/tmp/kv dir\"\n"
                       "fsync = always ; inline comment\n";
    cr_assert_eq(load_text(&c, text, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(c.listen, "127.0.0.1:0");
    cr_assert_eq(c.max_body_bytes, 1u << 20);
    cr_assert_eq(c.log_format, LOG_JSON);
    cr_assert_str_eq(c.data_dir, "/tmp/kv dir");
    cr_assert_eq(c.fsync, FSYNC_ALWAYS);
    cr_assert_eq(c.max_keys_per_request, 262144, "untouched settings keep their value");
}

Test(config, file_empty_string)
{
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    config_set(&c, "data_dir", "/x", err, sizeof(err));
    cr_assert_eq(load_text(&c, "data_dir = \"\"\n", err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(c.data_dir, "");
    cr_assert_eq(load_text(&c, "data_dir =\n", err, sizeof(err)), 0, "%s", err);
}

struct file_case {
    char text[128];
    char message[64]; /* after "<path>:" */
};

ParameterizedTestParameters(config, file_errors)
{
    static struct file_case cases[] = {
        {"listen = 127.0.0.1:0\nmax_body_bytes = lots\n",
         ":2: max_body_bytes: expected a size like 64MiB"},
        {"# c\n\nnosuch = 1\n", ":3: unknown setting 'nosuch'"},
        {"[server]\nlisten = 127.0.0.1:0\n", ":2: [server]: sections are not used"},
        {"listen\n", ":1: expected 'name = value'"},
        {"max_body_bytes 1MiB\n", ":1: expected 'name = value'"},
        {"listen 127.0.0.1:0\n", ":1: unknown setting 'listen 127.0.0.1'"},
        {"log_level = info\nlog_level = debug\n", ":2: log_level: already set on line 1"},
        {"fsync = always # not a comment\n", ":1: fsync: expected one of"},
        {"max_connections = 0\n", ":1: max_connections: '0' is out of range"},
        {"log_level = debug\nbogus line\nfsync = wrong\n", ":2: expected 'name = value'"},
        {"fsync = wrong\nbogus line\n", ":1: fsync"},
    };
    return cr_make_param_array(struct file_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct file_case *tc, config, file_errors)
{
    struct config c, before;
    config_defaults(&c);
    before = c;
    char err[512] = "";
    char *path = write_tmp(tc->text);
    int rc = config_load_file(&c, path, err, sizeof(err));
    unlink(path);
    cr_assert_eq(rc, KVIDX_EINVAL, "accepted: %s", tc->text);
    cr_assert_eq(strncmp(err, path, strlen(path)), 0, "'%s' does not start with the path", err);
    cr_assert(strstr(err, tc->message), "'%s' lacks '%s'", err, tc->message);
    cr_assert_eq(memcmp(&c, &before, sizeof(c)), 0, "a bad file changed the config");
}

Test(config, file_long_line)
{
    struct config c;
    config_defaults(&c);
    char text[3000];
    snprintf(text, sizeof(text), "log_level = debug\ndata_dir = /");
    size_t l = strlen(text);
    memset(text + l, 'a', 2500);
    snprintf(text + l + 2500, sizeof(text) - l - 2500, "\nfsync = no\n");
    char err[512] = "";
    cr_assert_eq(load_text(&c, text, err, sizeof(err)), KVIDX_EINVAL);
    cr_assert(strstr(err, ":2: line longer than"), "%s", err);
    cr_assert_eq(c.log_level, LOG_INFO);
}

Test(config, file_missing)
{
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    cr_assert_eq(config_load_file(&c, "/nonexistent/kvidxd.conf", err, sizeof(err)), KVIDX_EINVAL);
    cr_assert(strstr(err, "/nonexistent/kvidxd.conf: No such file"), "%s", err);
}

/* The file is read first, then every --set: the command line wins. */
Test(config, command_line_wins)
{
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    cr_assert_eq(load_text(&c, "max_body_bytes = 1MiB\nlog_level = debug\n", err, sizeof(err)), 0);
    cr_assert_eq(config_set(&c, "max_body_bytes", "2MiB", err, sizeof(err)), 0);
    cr_assert_eq(c.max_body_bytes, 2u << 20);
    cr_assert_eq(c.log_level, LOG_DEBUG);
    /* The same --set twice: the last one wins. */
    cr_assert_eq(config_set(&c, "max_body_bytes", "3MiB", err, sizeof(err)), 0);
    cr_assert_eq(c.max_body_bytes, 3u << 20);
}

/* ---- the shipped conf/kvidxd.conf ---- */

Test(config, shipped_conf_names_every_setting)
{
    FILE *f = fopen(CONF_PATH, "r");
    cr_assert_not_null(f, "cannot open %s", CONF_PATH);
    static char text[65536];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    for (size_t i = 0; config_name(i); i++) {
        /* "name = default" at the start of a line, set or commented out. */
        char want[1200], commented[1200];
        const char *def = config_default(config_name(i));
        if (!*def)
            def = "\"\"";
        snprintf(want, sizeof(want), "\n%s = %s\n", config_name(i), def);
        snprintf(commented, sizeof(commented), "\n# %s = %s\n", config_name(i), def);
        cr_assert(strstr(text, want) || strstr(text, commented), "%s does not show '%s = %s'",
                  CONF_PATH, config_name(i), def);
    }
}

Test(config, shipped_conf_loads_as_defaults)
{
    struct config c, d;
    config_defaults(&c);
    config_defaults(&d);
    char err[512] = "";
    cr_assert_eq(config_load_file(&c, CONF_PATH, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(config_check(&c, err, sizeof(err)), 0, "%s", err);
    struct diff_log dl = {"", 0};
    config_diff(&d, &c, on_diff, &dl);
    cr_assert_eq(dl.n, 0, "the shipped file changes: %s", dl.text);
}

/* Every commented-out line, once uncommented, is a valid setting. */
Test(config, shipped_conf_uncommented_loads)
{
    FILE *f = fopen(CONF_PATH, "r");
    cr_assert_not_null(f);
    static char out[65536];
    size_t o = 0;
    int n = 0;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        const char *p = line;
        if (strncmp(line, "# ", 2) == 0) {
            for (size_t i = 0; config_name(i); i++) {
                size_t l = strlen(config_name(i));
                if (strncmp(line + 2, config_name(i), l) == 0 &&
                    strncmp(line + 2 + l, " = ", 3) == 0) {
                    p = line + 2;
                    n++;
                }
            }
        }
        size_t l = strlen(p);
        cr_assert_lt(o + l, sizeof(out));
        memcpy(out + o, p, l);
        o += l;
    }
    fclose(f);
    out[o] = '\0';
    cr_assert_eq((size_t)n, n_settings());
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    cr_assert_eq(load_text(&c, out, err, sizeof(err)), 0, "%s", err);
}

Test(config, file_long_comment_ok)
{
    char text[1200] = "# ";
    memset(text + 2, 'c', 1000);
    strcpy(text + 1002, "\nfsync = no\n");
    struct config c;
    config_defaults(&c);
    char err[512] = "";
    cr_assert_eq(load_text(&c, text, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(c.fsync, FSYNC_NO);
}
