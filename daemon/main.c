/*
 * kvidxd: command line, configuration, signals, systemd notifications, and
 * the one libuv loop everything runs on.
 *
 *     kvidxd [-c FILE] [--set NAME=VALUE]... [--check-config] [--version] [--help]
 *
 * Configuration is built the same way at start and on SIGHUP: defaults,
 * then the file (-c), then every --set in order (the command line wins),
 * then the cross-setting checks. A reload applies only the settings
 * config_reloadable() allows and logs the rest as needing a restart.
 *
 * Shutdown (SIGTERM/SIGINT): stop accepting, /readyz answers 503, tell
 * systemd STOPPING=1, let in-flight requests finish within
 * shutdown_timeout_ms, close every handle, and exit 0 only when
 * uv_loop_close() succeeds (no handle leaked). A second signal closes the
 * remaining connections at once.
 */
#include "util/context.h"
#include "util/json_write.h"
#include "util/config.h"
#include "kvidx/err.h"
#include "util/log.h"
#include "util/memtrim.h"
#include "util/metrics.h"
#include "util/sd_notify.h"
#include "net/server.h"
#include "state/auth.h"
#include "app.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS 256

struct opts {
    const char *config_path;
    const char *sets[MAX_SETS];
    size_t nsets;
    int check_only;
    int exit_now; /* --help or --version: done */
};

struct daemon {
    struct app app;
    struct opts opts;
    uv_loop_t loop;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_poll_t fd_table; /* closed at once: see server_grow_fd_table */
    uv_timer_t watchdog;
    int watchdog_on;
    struct memtrim memtrim; /* allocator hygiene: util/memtrim.c */
    int stopping;
    int handles_closed;
    char bound[128];
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvidxd [-c FILE] [--set NAME=VALUE]... [--check-config] [--version] "
               "[--help]\n"
               "\n"
               "  -c, --config FILE   read settings from FILE (name = value lines)\n"
               "  --set NAME=VALUE    set one setting; wins over the file\n"
               "  --check-config      validate the configuration and exit (0 when valid)\n"
               "  --version           print the version and exit\n"
               "  --help              this text and the list of settings\n"
               "\n"
               "settings (default):\n");
    for (size_t i = 0; config_name(i); i++) {
        const char *name = config_name(i);
        const char *def = config_default(name);
        const char *help = config_help(name);
        fprintf(f, "  %-24s %s%s%s%s\n", name, help ? help : "", help ? " (" : "(",
                def && *def ? def : "\"\"", ")");
    }
}

/* 0, or KVIDX_EINVAL (the reason is printed). --help and --version print
 * and set o->exit_now. */
static int parse_args(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0) {
            if (++i >= argc) {
                fprintf(stderr, "kvidxd: %s needs a file name\n", a);
                return KVIDX_EINVAL;
            }
            o->config_path = argv[i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            o->config_path = a + 9;
        } else if (strcmp(a, "--set") == 0 || strcmp(a, "-s") == 0) {
            if (++i >= argc) {
                fprintf(stderr, "kvidxd: --set needs NAME=VALUE\n");
                return KVIDX_EINVAL;
            }
            if (o->nsets == MAX_SETS) {
                fprintf(stderr, "kvidxd: too many --set options\n");
                return KVIDX_EINVAL;
            }
            o->sets[o->nsets++] = argv[i];
        } else if (strncmp(a, "--set=", 6) == 0) {
            if (o->nsets == MAX_SETS) {
                fprintf(stderr, "kvidxd: too many --set options\n");
                return KVIDX_EINVAL;
            }
            o->sets[o->nsets++] = a + 6;
        } else if (strcmp(a, "--check-config") == 0) {
            o->check_only = 1;
        } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            printf("kvidxd %s\n", KVIDX_VERSION);
            o->exit_now = 1;
            return 0;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            o->exit_now = 1;
            return 0;
        } else {
            fprintf(stderr, "kvidxd: unknown argument '%s' (try --help)\n", a);
            return KVIDX_EINVAL;
        }
    }
    return 0;
}

/* Defaults → file → --set → checks. 0, or KVIDX_EINVAL with the reason in err. */
static int build_config(const struct opts *o, struct config *c, char *err, size_t errlen)
{
    config_defaults(c);
    if (o->config_path && config_load_file(c, o->config_path, err, errlen) < 0)
        return KVIDX_EINVAL;
    for (size_t i = 0; i < o->nsets; i++) {
        char name[128];
        const char *eq = strchr(o->sets[i], '=');
        size_t nl = eq ? (size_t)(eq - o->sets[i]) : 0;
        if (!eq || nl == 0 || nl >= sizeof(name)) {
            snprintf(err, errlen, "--set '%s': expected NAME=VALUE", o->sets[i]);
            return KVIDX_EINVAL;
        }
        memcpy(name, o->sets[i], nl);
        name[nl] = '\0';
        if (config_set(c, name, eq + 1, err, errlen) < 0)
            return KVIDX_EINVAL;
    }
    return config_check(c, err, errlen) < 0 ? KVIDX_EINVAL : 0;
}

static void list_nondefault(void *ctx, const char *name, const char *from, const char *to)
{
    struct buf *b = ctx;
    (void)from;
    buf_printf(b, " %s=%s", name, to);
}

struct reload_ctx {
    struct config *live;
    int applied, skipped;
};

static void apply_reload(void *ctxp, const char *name, const char *from, const char *to)
{
    struct reload_ctx *ctx = ctxp;
    char err[256];
    if (!config_reloadable(name)) {
        log_warn("reload: %s changed (%s -> %s) but needs a restart; keeping %s", name, from, to,
                 from);
        ctx->skipped++;
        return;
    }
    if (config_set(ctx->live, name, to, err, sizeof(err)) < 0) {
        log_error("reload: %s", err);
        return;
    }
    log_info("reload: %s %s -> %s", name, from, to);
    ctx->applied++;
}

static void reload(struct daemon *d)
{
    struct config next;
    char err[512] = "";
    if (build_config(&d->opts, &next, err, sizeof(err)) < 0) {
        log_error("reload failed, keeping the current settings: %s", err);
        return;
    }
    struct reload_ctx ctx = {&d->app.cfg, 0, 0};
    config_diff(&d->app.cfg, &next, apply_reload, &ctx);
    log_setup(d->app.cfg.log_level, d->app.cfg.log_format);
    subsystems_reload(&d->app);
    log_info("reload: %d setting(s) applied, %d need a restart", ctx.applied, ctx.skipped);
}

static void close_any(uv_handle_t *h, void *arg)
{
    int *n = arg;
    if (!uv_is_closing(h)) {
        (*n)++;
        uv_close(h, NULL);
    }
}

/* The one daemon instance (main.c only; lib/ has no globals). */
static struct daemon daemon_g;

static void stop_everything(struct daemon *d)
{
    if (d->handles_closed)
        return;
    d->handles_closed = 1;
    subsystems_stop(&d->app);
    uv_close((uv_handle_t *)&d->sig_term, NULL);
    uv_close((uv_handle_t *)&d->sig_int, NULL);
    uv_close((uv_handle_t *)&d->sig_hup, NULL);
    if (d->watchdog_on)
        uv_close((uv_handle_t *)&d->watchdog, NULL);
    memtrim_close(&d->memtrim);
}

static void on_drained(struct server *s)
{
    server_close(s);
    stop_everything(&daemon_g);
}

static void begin_shutdown(struct daemon *d, const char *why)
{
    if (d->stopping) {
        log_warn("%s again: closing every connection now", why);
        if (d->app.server)
            server_close(d->app.server);
        stop_everything(d);
        return;
    }
    d->stopping = 1;
    d->app.draining = 1;
    log_info("%s: draining (up to %llu ms)", why,
             (unsigned long long)d->app.cfg.shutdown_timeout_ms);
    sd_notify_send("STOPPING=1");
    if (d->app.server)
        server_drain(d->app.server, d->app.cfg.shutdown_timeout_ms, on_drained);
    /* The signal handles stay open until the drain ends (on_drained) so
     * that a second signal can cut it short. */
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct daemon *d = h->data;
    if (signum == SIGHUP) {
        log_info("SIGHUP: reloading the configuration");
        reload(d);
        return;
    }
    begin_shutdown(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    sd_notify_send("WATCHDOG=1");
}

/* Arguments and configuration. Returns -1 to go on, else the exit status. */
static int configure(struct daemon *d, int argc, char **argv)
{
    char err[1024] = "";
    if (parse_args(argc, argv, &d->opts) != 0)
        return 2;
    if (d->opts.exit_now)
        return 0;
    if (build_config(&d->opts, &d->app.cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvidxd: invalid configuration: %s\n", err);
        return 2;
    }
    if (d->opts.check_only) {
        /* The tokens file is part of the configuration: its errors are
         * logged (line number, never a token). */
        if (d->app.cfg.auth_tokens_file[0] && auth_check_file(d->app.cfg.auth_tokens_file) != 0) {
            fprintf(stderr, "kvidxd: invalid configuration: auth_tokens_file %s cannot be used\n",
                    d->app.cfg.auth_tokens_file);
            return 2;
        }
        printf("kvidxd: configuration ok\n");
        return 0;
    }
    if (d->opts.config_path)
        snprintf(d->app.config_path, sizeof(d->app.config_path), "%s", d->opts.config_path);
    return -1;
}

/* Closes whatever is open after a failed start (subsystems when started). */
static void abandon(struct daemon *d, int subsystems_up)
{
    int left = 0;
    if (subsystems_up)
        subsystems_stop(&d->app);
    uv_walk(&d->loop, close_any, &left);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    uv_loop_close(&d->loop);
    if (subsystems_up)
        subsystems_free(&d->app);
    metrics_free(d->app.metrics);
}

/* The loop, the subsystems and the listener. Returns -1 when serving, else
 * the exit status (everything closed). */
static int start(struct daemon *d)
{
    if (uv_loop_init(&d->loop) != 0) {
        log_error("cannot initialize the event loop");
        return 1;
    }
    server_grow_fd_table(&d->loop, d->app.cfg.max_connections, &d->fd_table);
    d->app.loop = &d->loop;
    d->app.started_ms = app_now_ms(&d->app);
    d->app.metrics = metrics_new();
    if (!d->app.metrics) {
        log_error("out of memory");
        return 1;
    }
    int rc = subsystems_init(&d->app);
    if (rc < 0) {
        log_error("cannot start: %s", kvidx_err_title(rc));
        abandon(d, 0);
        return d->app.exit_status ? d->app.exit_status : 1;
    }
    struct server *srv = NULL;
    rc = server_start(&d->app, &srv, d->bound, sizeof(d->bound));
    if (rc < 0) {
        /* server_start logs what the address or the socket refused; only
         * running out of memory is left to say here. */
        if (rc == KVIDX_ENOMEM)
            log_error("cannot start the listener: %s", kvidx_err_title(rc));
        abandon(d, 1);
        return 1;
    }
    /* config_check refused a non-loopback listen without auth; a socket
     * from systemd is held to the same rule, on the address it has. */
    if (!d->app.cfg.auth_tokens_file[0] && !d->app.cfg.allow_unauthenticated_remote &&
        !config_is_loopback(d->bound)) {
        log_error("listening on %s, not a loopback address, with auth off: set auth_tokens_file "
                  "to require bearer tokens, or allow_unauthenticated_remote = yes to serve every "
                  "client without them",
                  d->bound);
        server_close(srv);
        abandon(d, 1);
        return 2;
    }
    return -1;
}

/* Ready: the summary line, signals, the watchdog and READY=1. */
static void announce(struct daemon *d)
{
    d->app.ready = 1;
    /* Signals first: the summary line below tells a supervisor (or a test)
     * that the daemon is up, and a SIGHUP or SIGTERM sent the moment it
     * appears must reach on_signal, not the default action. */
    uv_signal_init(&d->loop, &d->sig_term);
    uv_signal_init(&d->loop, &d->sig_int);
    uv_signal_init(&d->loop, &d->sig_hup);
    d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
    uv_signal_start(&d->sig_term, on_signal, SIGTERM);
    uv_signal_start(&d->sig_int, on_signal, SIGINT);
    uv_signal_start(&d->sig_hup, on_signal, SIGHUP);

    /* One summary line: version, the address really bound, and every
     * setting that differs from its default. */
    struct config defaults;
    struct buf changed;
    buf_init(&changed);
    config_defaults(&defaults);
    config_diff(&defaults, &d->app.cfg, list_nondefault, &changed);
    log_info("kvidxd %s listening on %s%s; settings not at their default:%s", KVIDX_VERSION,
             d->bound, sd_listen_fds() > 0 ? " (socket activation)" : "",
             changed.len ? changed.data : " none");
    buf_free(&changed);

    uint64_t wd = sd_watchdog_usec();
    if (wd > 0) {
        uint64_t every_ms = wd / 2000 ? wd / 2000 : 1;
        uv_timer_init(&d->loop, &d->watchdog);
        d->watchdog_on = 1;
        uv_timer_start(&d->watchdog, on_watchdog, every_ms, every_ms);
    }

    /* Free heap pages go back to the kernel once a second when they pile
     * up (util/memtrim.c); a failure only costs resident memory. */
    if (memtrim_start(&d->memtrim, &d->loop) != 0)
        log_warn("memtrim: the timer cannot be started; free memory stays resident");

    char status[192];
    snprintf(status, sizeof(status), "READY=1\nSTATUS=listening on %s", d->bound);
    sd_notify_send(status);
}

/* After the loop: every handle must be closed; 0 on a clean shutdown. */
static int finish(struct daemon *d)
{
    /* Everything is closed by now; a straggler is a bug, reported. */
    int left = 0;
    uv_walk(&d->loop, close_any, &left);
    if (left)
        log_warn("shutdown: %d handle(s) were still open", left);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&d->loop);
    subsystems_free(&d->app);
    metrics_free(d->app.metrics);
    if (rc != 0) {
        log_error("shutdown: the event loop still had open handles (%s)", uv_strerror(rc));
        return 1;
    }
    log_info("stopped");
    return 0;
}

int main(int argc, char **argv)
{
    struct daemon *d = &daemon_g;
    int status = configure(d, argc, argv);
    if (status >= 0)
        return status;
    log_setup(d->app.cfg.log_level, d->app.cfg.log_format);
    signal(SIGPIPE, SIG_IGN);
    /* A file-size limit must fail the write (EFBIG → 503), not kill us. */
    signal(SIGXFSZ, SIG_IGN);
    /* Before the first thread (journal writer, fs scan, libuv's pool). */
    memtrim_setup();
    status = start(d);
    if (status >= 0)
        return status;
    announce(d);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    return finish(d);
}
