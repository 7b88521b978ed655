/*
 * Settings of docs/operations.md: one snake_case name per setting, usable as
 * `name = value` in the file and as `--set name=value`. config.c holds the
 * table (type, bounds, default, reloadable) that parses, validates, prints
 * and documents them.
 */
#ifndef KVIDXD_CONFIG_H
#define KVIDXD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };
enum log_format { LOG_TEXT = 0, LOG_JSON };
enum fsync_policy { FSYNC_ALWAYS = 0, FSYNC_EVERYSEC, FSYNC_NO };
enum loader_kind { LOADER_CATALOG = 0, LOADER_EXTERNAL };
enum retention { RETENTION_TEMPORARY = 0, RETENTION_RETAIN };

struct config {
    char listen[256];                 /* host:port */
    char auth_tokens_file[1024];      /* bearer tokens; "" = auth off */
    int allow_unauthenticated_remote; /* 1: a non-loopback listen may run without tokens */
    char ingest_allow_from[1024];     /* CIDRs whose fleet ingest needs no token */
    char data_dir[1024];
    enum fsync_policy fsync;
    uint64_t snapshot_journal_bytes; /* journal size that triggers a snapshot */
    enum log_level log_level;
    enum log_format log_format;
    uint64_t l1_capacity_bytes; /* 0 = unbounded */
    uint64_t l2_capacity_bytes;
    enum loader_kind loader;
    uint64_t load_timeout_ms;
    enum retention prefetch_retention;
    uint64_t default_lease_ms;
    uint64_t max_lease_ms;
    uint64_t handle_grace_ms;
    uint64_t page_token_ttl_s;
    uint64_t max_body_bytes;
    uint64_t max_total_body_bytes; /* request bodies held by all connections together */
    uint64_t max_keys_per_request;
    uint64_t max_header_bytes;
    uint64_t max_uri_bytes;
    uint64_t max_json_depth;
    uint64_t header_timeout_ms;
    uint64_t idle_timeout_ms;
    uint64_t max_connections;
    uint64_t max_conn_output_bytes;
    uint64_t shutdown_timeout_ms;
    uint64_t l2_source_rescan_s;            /* full rescans of a store that does not notify */
    int l2_source_configure;                /* 1: a source may turn on the store's notifications */
    uint64_t l2_source_reconnect_max_ms;    /* cap of a source's reconnect backoff */
    char l2_source[2048];                   /* space-separated sources: fs:/dir, redis://... */
    char l2_source_test_overflow_file[256]; /* tests only: this name in an fs: dir = overflow */
    uint64_t l2_source_test_scan_delay_ms;  /* tests only: pause before each scan batch */
    uint64_t instance_timeout_s;            /* fleet: an instance silent this long is dropped */
    uint64_t health_check_interval_s;       /* fleet: how often silent instances are looked for */
    uint64_t chunk_size;                    /* fleet: tokens per chunk of the tokens form */
    uint64_t directory_token_bytes;         /* fleet: cap on the token bindings' bytes, 0 = none */
};

/* Fills c with every default. */
void config_defaults(struct config *c);
/* Sets one setting from text. Returns 0, or KVIDX_EINVAL with a message
 * naming the setting in err (errlen bytes). Unknown names are errors. */
int config_set(struct config *c, const char *name, const char *value, char *err, size_t errlen);
/* Reads an ini-style file of `name = value` lines (inih). Same errors, the
 * message names the file, line and setting. */
int config_load_file(struct config *c, const char *path, char *err, size_t errlen);
/* Checks rules between settings (default_lease_ms <= max_lease_ms), to be
 * called once the file and every --set have been applied. Returns 0 or
 * KVIDX_EINVAL with a message naming the settings. */
int config_check(const struct config *c, char *err, size_t errlen);
/* 1 when the host of a "host:port" address is a loopback address
 * (127.0.0.0/8, ::1, or ::ffff:127.x.y.z). */
int config_is_loopback(const char *hostport);
/* 1 when the setting may change on SIGHUP. */
int config_reloadable(const char *name);
/* Calls fn for every setting whose value differs between a and b (name, old, new as text). */
void config_diff(const struct config *a, const struct config *b,
                 void (*fn)(void *ctx, const char *name, const char *from, const char *to),
                 void *ctx);
/* Writes the value of a setting as text. */
int config_format(const struct config *c, const char *name, char *out, size_t cap);
/* The one-line help and the default (as text) of a setting; NULL when unknown. */
const char *config_help(const char *name);
const char *config_default(const char *name);
/* Iterates the table: the name of setting i, or NULL past the end. */
const char *config_name(size_t i);

#endif
