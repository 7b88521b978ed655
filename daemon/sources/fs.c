/*
 * The fs: source: the files of an LMCache FS L2 adapter directory, one key
 * per `<dir>/<FS file name>` (lib/key.c parses the names), sized by the
 * file's size. LMCache writes `<stem>.tmp`, or the final name under a
 * temporary subdirectory, and then renames it onto the final name; only
 * regular, non-empty files whose `.data` names parse, in <dir> itself,
 * count. Everything else is skipped and counted (names ending in .data
 * that do not parse, empty files, non-regular entries, sizes past 2^40) or
 * ignored (every other name: temporary files, subdirectories).
 *
 * A full scan runs on a thread of its own: getdents64 in 256 KiB reads and
 * fstatat, keys handed to the loop in batches of 4096 through a bounded
 * queue and a uv_async (the thread waits when four batches are pending, so
 * memory stays bounded however large the directory is). The loop applies a
 * scan as a resynchronisation of the key store (source_resync_begin, the
 * batches, source_resync_end), so a rescan replaces the source's keys in
 * one step. The inotify watch is set before the first scan starts and
 * stays: a rename onto a .data name, a closed write, a create, a modify,
 * an unlink or a rename away makes the loop look at that name again (one
 * fstatat, at the time the event is read), so a change is applied as the
 * file is then, whatever the order of events. A key an event touched
 * during a scan is the event's: the scan's older view of it is dropped.
 * An inotify queue overflow (or the test switch
 * l2_source_test_overflow_file) starts a full rescan; a watch that goes
 * away (the directory deleted, moved or unmounted) is set again on the
 * path and followed by a rescan, and while the path cannot be read the
 * source is failed, its keys stale but kept, retried with a backoff from
 * 100 ms up to l2_source_reconnect_max_ms.
 *
 * Invariants: at most one scan thread; the thread touches only the queue
 * (under mu), the cancel flag and its own descriptor, never the index; the
 * loop is the only user of the watch, the directory descriptor and the
 * sink. Two file names that parse to the same key (rank with and without
 * 0x, the legacy 3-field form) hold it together: a key goes only when the
 * spellings LMCache writes are all gone.
 */
#include "sources/fs.h"
#include "sources/fs_int.h"

#include "state/keystore.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const fs_skip_names[SKIP_N] = {"bad_name", "empty", "not_regular", "too_large"};

/* ---- the watch ---- */

/* Opens the directory and watches it. 0, or -1 with the reason in err
 * (the path cut to 160 bytes) and errno set. */
int fs_open_watch(struct fs_source *fs, char *err, size_t errlen)
{
    int fd = open(fs->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open directory %.160s: %s", fs->dir, strerror(e));
        errno = e;
        return -1;
    }
    int wd = inotify_add_watch(fs->ifd, fs->dir, FS_MASK);
    if (wd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot watch directory %.160s: %s", fs->dir, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (fs->dirfd >= 0)
        close(fs->dirfd);
    fs->dirfd = fd;
    fs->wd = wd;
    return 0;
}

static void on_retry(uv_timer_t *t)
{
    struct fs_source *fs = t->data;
    char why[SOURCE_ERROR_MAX];
    if (fs_open_watch(fs, why, sizeof(why)) == 0) {
        log_info("l2_source %s: the directory is back; rescanning", fs->base.name);
        fs_start_scan(fs);
        return;
    }
    fs_fail_and_retry(fs, why);
}

void fs_fail_and_retry(struct fs_source *fs, const char *why)
{
    source_set_state(&fs->base, SOURCE_FAILED, why);
    if (fs->stopped)
        return;
    /* Doubling waits with a little jitter, so that sources that failed
     * together do not retry in step. */
    uint64_t wait = fs->retry_ms + (uv_hrtime() % (fs->retry_ms / 4 + 1));
    fs->retry_ms = fs->retry_ms * 2 > fs->retry_max_ms ? fs->retry_max_ms : fs->retry_ms * 2;
    uv_timer_start(&fs->retry, on_retry, wait, 0);
}

static void watch_lost(struct fs_source *fs)
{
    fs->watch_lost++;
    if (fs->wd >= 0) {
        inotify_rm_watch(fs->ifd, fs->wd); /* may already be gone: IN_IGNORED */
        fs->wd = -1;
    }
    if (fs->dirfd >= 0) {
        close(fs->dirfd);
        fs->dirfd = -1;
    }
    log_warn("l2_source %s: the watch on %s went away (deleted, moved or unmounted)", fs->base.name,
             fs->dir);
    if (fs->scanning) {
        fs->rewatch_after = 1;
        atomic_store(&fs->cancel, 1);
        uv_mutex_lock(&fs->mu);
        uv_cond_broadcast(&fs->cv);
        uv_mutex_unlock(&fs->mu);
        return;
    }
    char why[SOURCE_ERROR_MAX];
    if (fs_open_watch(fs, why, sizeof(why)) != 0)
        fs_fail_and_retry(fs, why);
    else
        fs_start_scan(fs);
}

/* ---- events ---- */

static void flush_events(struct fs_source *fs)
{
    int rc = 0;
    if (fs->evput->n)
        rc = source_put(&fs->base, fs->evput->keys, fs->evput->sizes, fs->evput->n);
    if (fs->evdel->n)
        source_del(&fs->base, fs->evdel->keys, fs->evdel->n);
    fs_batch_reset(fs->evput);
    fs_batch_reset(fs->evdel);
    if (rc) {
        log_warn("l2_source %s: cannot apply changes (%s); rescanning", fs->base.name,
                 kvidx_err_title(rc));
        fs_start_scan(fs);
    }
}

/* Whether another spelling LMCache writes for key k (rank with or without
 * 0x, the legacy 3-field form of a group-0 unsalted key) is a file that
 * counts; *size gets its size. */
static int alias_present(struct fs_source *fs, const kvidx_key_t *k, const char *name,
                         uint64_t *size)
{
    char full[KVIDX_KEY_STR_MAX];
    size_t n = sizeof(full);
    if (kvidx_key_encode_fs(k, full, &n) != 0)
        return 0;
    const char *at = memchr(full, '@', n); /* after the model, which has none */
    if (!at || (size_t)(at - full) + 3 > n || memcmp(at + 1, "0x", 2) != 0)
        return 0;
    size_t m = (size_t)(at - full);
    char cand[4][KVIDX_KEY_STR_MAX];
    int nc = 0;
    snprintf(cand[nc++], sizeof(cand[0]), "%s", full);
    snprintf(cand[nc++], sizeof(cand[0]), "%.*s@%s", (int)m, full, at + 3);
    if (k->group == 0 && k->salt_len == 0) {
        /* model@0xRANK@0@HASH.data -> model@0xRANK@HASH.data */
        const char *grp = strstr(at + 1, "@0@");
        if (grp) {
            snprintf(cand[nc++], sizeof(cand[0]), "%.*s%s", (int)(grp - full), full, grp + 2);
            snprintf(cand[nc++], sizeof(cand[0]), "%.*s@%.*s%s", (int)m, full,
                     (int)(grp - (at + 3)), at + 3, grp + 2);
        }
    }
    for (int i = 0; i < nc; i++) {
        int why;
        if (strcmp(cand[i], name) != 0 && fs_stat_name(fs->dirfd, cand[i], size, &why))
            return 1;
    }
    return 0;
}

/* Looks at one name again, as it is on disk now. final: the event was a
 * rename onto it or a closed write, after which a skip is counted. */
static void event_name(struct fs_source *fs, const char *name, int final)
{
    size_t len = strlen(name);
    kvidx_key_t k;
    kvidx_reason_t why;
    char model[KVIDX_MODEL_MAX + 1];
    if (kvidx_key_parse_fs(name, len, &k, model, &why) != 0) {
        if (final) {
            fs->skipped[SKIP_BAD_NAME]++;
            fs_update_skipped(fs);
            log_debug("l2_source %s: skipping '%.80s': %s", fs->base.name, name, why.rule);
        }
        return;
    }
    if (fs->evput->n == FS_BATCH || fs->evdel->n == FS_BATCH)
        flush_events(fs);
    uint64_t size = 0;
    int skip;
    if (fs_stat_name(fs->dirfd, name, &size, &skip)) {
        fs_batch_add(fs->evput, &k, size);
    } else {
        if (final && skip >= 0) {
            fs->skipped[skip]++;
            fs_update_skipped(fs);
        }
        if (alias_present(fs, &k, name, &size))
            fs_batch_add(fs->evput, &k, size);
        else
            fs_batch_add(fs->evdel, &k, 1);
    }
    if (fs->scanning)
        fs_hashset_add(&fs->touched, kvidx_index_key_hash64(fs_idx(fs), &k));
}

static int ev_name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct ev_name *)a)->name, ((const struct ev_name *)b)->name);
}

/* One read's worth of events: the names, each looked at once. */
static void read_events(struct fs_source *fs, size_t n, int *overflow, int *lost)
{
    struct ev_name *names = fs->names;
    size_t nn = 0;
    for (size_t off = 0; off + sizeof(struct inotify_event) <= n;) {
        const struct inotify_event *ev = (const void *)(fs->evbuf + off);
        off += sizeof(*ev) + ev->len;
        fs->events++;
        if (ev->mask & IN_Q_OVERFLOW) {
            *overflow = 1;
            continue;
        }
        if (ev->wd != fs->wd)
            continue; /* a watch given up already */
        if (ev->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT)) {
            *lost = 1;
            continue;
        }
        if (!ev->len || !ev->name[0])
            continue;
        int final = (ev->mask & (IN_MOVED_TO | IN_CLOSE_WRITE)) != 0;
        if (fs->test_overflow[0] && strcmp(ev->name, fs->test_overflow) == 0) {
            *overflow |= final; /* once per file written or renamed in */
            continue;
        }
        if (!fs_is_data_name(ev->name, strlen(ev->name)) || nn == FS_EVENT_NAMES)
            continue;
        names[nn].name = ev->name;
        names[nn++].final = final;
    }
    qsort(names, nn, sizeof(names[0]), ev_name_cmp);
    for (size_t i = 0; i < nn;) {
        size_t j = i;
        int final = 0;
        for (; j < nn && strcmp(names[j].name, names[i].name) == 0; j++)
            final |= names[j].final;
        if (fs->dirfd >= 0)
            event_name(fs, names[i].name, final);
        i = j;
    }
    flush_events(fs);
}

static void on_inotify(uv_poll_t *h, int status, int events)
{
    struct fs_source *fs = h->data;
    (void)events;
    if (status < 0 || fs->stopped)
        return;
    int overflow = 0, lost = 0;
    for (int reads = 0; reads < FS_READS_MAX; reads++) {
        ssize_t n = read(fs->ifd, fs->evbuf, sizeof(fs->evbuf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        read_events(fs, (size_t)n, &overflow, &lost);
    }
    if (lost) {
        watch_lost(fs);
    } else if (overflow) {
        fs->overflows++;
        log_warn("l2_source %s: inotify queue overflow: changes were lost; full rescan",
                 fs->base.name);
        fs_start_scan(fs);
    }
}

/* ---- struct source_ops ---- */

static int fs_start(struct source *s)
{
    struct fs_source *fs = (struct fs_source *)s;
    fs->loop = s->app->loop;
    fs->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fs->ifd < 0) {
        log_error("l2_source %s: cannot create an inotify instance: %s", s->name, strerror(errno));
        return KVIDX_ESTORAGE;
    }
    char why[SOURCE_ERROR_MAX];
    if (fs_open_watch(fs, why, sizeof(why)) != 0) {
        log_error("l2_source %s: cannot use directory %s: %s", s->name, fs->dir, strerror(errno));
        return KVIDX_EINVAL;
    }
    if (uv_mutex_init(&fs->mu) != 0)
        return KVIDX_ENOMEM;
    if (uv_cond_init(&fs->cv) != 0) {
        uv_mutex_destroy(&fs->mu);
        return KVIDX_ENOMEM;
    }
    fs->sync_on = 1;
    uv_poll_init(fs->loop, &fs->poll, fs->ifd);
    uv_async_init(fs->loop, &fs->async, fs_on_async);
    uv_timer_init(fs->loop, &fs->retry);
    fs->poll.data = fs->async.data = fs->retry.data = fs;
    fs->handles_on = 1;
    uv_poll_start(&fs->poll, UV_READABLE, on_inotify);
    if (fs->test_overflow[0])
        log_warn("l2_source %s: test switch l2_source_test_overflow_file=%s is on", s->name,
                 fs->test_overflow);
    fs_start_scan(fs);
    return 0;
}

static void free_list(struct fs_batch *b)
{
    while (b) {
        struct fs_batch *next = b->next;
        free(b);
        b = next;
    }
}

static void release(struct fs_source *fs)
{
    free_list(fs->q);
    free_list(fs->spare);
    if (fs->sync_on) {
        uv_cond_destroy(&fs->cv);
        uv_mutex_destroy(&fs->mu);
    }
    free(fs->evput);
    free(fs->evdel);
    free(fs->touched.slot);
    free(fs);
}

static void on_closed(uv_handle_t *h)
{
    struct fs_source *fs = h->data;
    if (--fs->open_handles == 0 && fs->free_wanted)
        release(fs);
}

static void fs_stop(struct source *s)
{
    struct fs_source *fs = (struct fs_source *)s;
    if (fs->stopped)
        return;
    fs->stopped = 1;
    if (fs->thread_on) {
        atomic_store(&fs->cancel, 1);
        uv_mutex_lock(&fs->mu);
        uv_cond_broadcast(&fs->cv);
        uv_mutex_unlock(&fs->mu);
        uv_thread_join(&fs->thread);
        fs->thread_on = 0;
    }
    if (fs->handles_on) {
        fs->handles_on = 0;
        fs->open_handles = 3;
        uv_poll_stop(&fs->poll);
        uv_close((uv_handle_t *)&fs->poll, on_closed);
        uv_close((uv_handle_t *)&fs->async, on_closed);
        uv_close((uv_handle_t *)&fs->retry, on_closed);
    }
    if (fs->ifd >= 0)
        close(fs->ifd);
    if (fs->dirfd >= 0)
        close(fs->dirfd);
    fs->ifd = fs->dirfd = -1;
}

/* Frees at once, or in the last close callback when the loop has not run
 * since fs_stop (a start that failed half way). */
static void fs_free(struct source *s)
{
    struct fs_source *fs = (struct fs_source *)s;
    fs_stop(s);
    fs->free_wanted = 1;
    if (fs->open_handles == 0)
        release(fs);
}

static void fs_stats(const struct source *s, struct jw *w)
{
    const struct fs_source *fs = (const struct fs_source *)s;
    jw_key(w, "directory");
    jw_str(w, fs->dir);
    jw_key(w, "skipped_by_reason");
    jw_obj_begin(w);
    for (int r = 0; r < SKIP_N; r++) {
        jw_key(w, fs_skip_names[r]);
        jw_u64(w, fs->skipped[r]);
    }
    jw_obj_end(w);
    jw_key(w, "ignored");
    jw_u64(w, fs->ignored);
    jw_key(w, "inotify_overflows");
    jw_u64(w, fs->overflows);
    jw_key(w, "events");
    jw_u64(w, fs->events);
    jw_key(w, "watch_lost");
    jw_u64(w, fs->watch_lost);
}

static void fs_one(struct buf *out, const struct source *s, const char *name, const char *type,
                   const char *help, uint64_t v)
{
    buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s{", name, help, name, type, name);
    source_metric_labels(out, s);
    buf_printf(out, "} %llu\n", (unsigned long long)v);
}

static void fs_metrics(const struct source *s, struct buf *out)
{
    const struct fs_source *fs = (const struct fs_source *)s;
    buf_puts(out, "# HELP kvidx_fs_source_skipped_files Entries of the directory skipped, by "
                  "reason (last full scan and changes since).\n"
                  "# TYPE kvidx_fs_source_skipped_files gauge\n");
    for (int r = 0; r < SKIP_N; r++) {
        buf_puts(out, "kvidx_fs_source_skipped_files{");
        source_metric_labels(out, s);
        buf_printf(out, ",reason=\"%s\"} %llu\n", fs_skip_names[r],
                   (unsigned long long)fs->skipped[r]);
    }
    fs_one(out, s, "kvidx_fs_source_ignored_files", "gauge",
           "Entries whose names are not .data names (temporary files, subdirectories).",
           fs->ignored);
    fs_one(out, s, "kvidx_fs_source_inotify_overflows_total", "counter",
           "inotify queue overflows (each one a full rescan).", fs->overflows);
    fs_one(out, s, "kvidx_fs_source_events_total", "counter", "inotify events read.", fs->events);
    fs_one(out, s, "kvidx_fs_source_watch_lost_total", "counter",
           "Times the watched directory went away (deleted, moved, unmounted).", fs->watch_lost);
}

static const struct source_ops fs_ops = {
    .kind = "fs",
    .start = fs_start,
    .stop = fs_stop,
    .free = fs_free,
    .stats = fs_stats,
    .metrics = fs_metrics,
};

int fs_source_create(struct app *app, const char *spec, size_t len, struct source **out)
{
    *out = NULL;
    if (len < 4 || memcmp(spec, "fs:/", 4) != 0 || len >= SOURCE_NAME_MAX || len - 3 >= PATH_MAX) {
        log_error("l2_source: '%.*s' is not fs:/absolute/dir", (int)(len > 80 ? 80 : len), spec);
        return KVIDX_EINVAL;
    }
    struct fs_source *fs = calloc(1, sizeof(*fs));
    if (!fs)
        return KVIDX_ENOMEM;
    fs->evput = malloc(sizeof(*fs->evput));
    fs->evdel = malloc(sizeof(*fs->evdel));
    if (!fs->evput || !fs->evdel) {
        free(fs->evput);
        free(fs->evdel);
        free(fs);
        return KVIDX_ENOMEM;
    }
    fs_batch_reset(fs->evput);
    fs_batch_reset(fs->evdel);
    fs->base.ops = &fs_ops;
    fs->base.app = app;
    memcpy(fs->base.name, spec, len);
    fs->base.name[len] = '\0';
    memcpy(fs->dir, spec + 3, len - 3);
    fs->dir[len - 3] = '\0';
    fs->ifd = fs->wd = fs->dirfd = -1;
    atomic_init(&fs->cancel, 0);
    fs->retry_ms = FS_RETRY_MIN_MS;
    fs->retry_max_ms = app->cfg.l2_source_reconnect_max_ms;
    fs->scan_delay_ms = app->cfg.l2_source_test_scan_delay_ms;
    snprintf(fs->test_overflow, sizeof(fs->test_overflow), "%s",
             app->cfg.l2_source_test_overflow_file);
    *out = &fs->base;
    return 0;
}
