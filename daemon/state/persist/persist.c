/*
 * Persistence of the key catalogue, the layout registry and the fleet
 * directory (fleet.c): open, stop and free, and the hooks the write
 * handlers call. The journal, the deferred answers, snapshots, restore and
 * the page-token secret live in the other files of this folder
 * (persist_int.h lists them); the formats are in kvidx/journal.h and
 * docs/persistence.md.
 *
 * Invariants: nothing in data_dir is read or changed before its lock is
 * held (restore truncates and deletes files, which must never happen
 * under a running daemon); every change the key store reports, and every
 * layout change, is encoded into the journal in the order it happened;
 * while the journal cannot be written (or has a gap), write requests are
 * refused before they change anything.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "state/keystore.h"
#include "state/layouts.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/err.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the hooks ---- */

static void on_change(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *before,
                      const kvidx_durable_t *after)
{
    struct persist *p = ctx;
    kvidx_jrec_t r;
    key_rec(&r, key, after);
    append_rec(p, &r);
    if (p->capturing > 0) {
        key_rec(&r, key, before);
        if (encode_rec(&p->capture, &r) != 0)
            p->capturing = -1; /* cannot undo this request: it is never deferred */
    }
}

void persist_layout_put(struct app *app, const char *model, size_t model_len, uint8_t world_size,
                        const char *json, size_t json_len)
{
    if (!app->persist)
        return;
    kvidx_jrec_t r;
    layout_rec(&r, model, model_len, world_size, json, json_len);
    append_rec(app->persist, &r);
}

void persist_layout_before(struct app *app, const char *model, size_t model_len, uint8_t world_size,
                           const char *old_json)
{
    struct persist *p = app->persist;
    if (!p || p->capturing <= 0)
        return;
    kvidx_jrec_t r;
    layout_rec(&r, model, model_len, world_size, old_json, old_json ? strlen(old_json) : 0);
    if (encode_rec(&p->capture, &r) != 0)
        p->capturing = -1;
}

void persist_layout_del(struct app *app, const char *model, size_t model_len, uint8_t world_size)
{
    if (!app->persist)
        return;
    kvidx_jrec_t r;
    layout_rec(&r, model, model_len, world_size, NULL, 0);
    append_rec(app->persist, &r);
}

int persist_refuse(const struct request *req, struct response *res)
{
    struct persist *p = req->app->persist;
    if (!p)
        return 0;
    buf_reset(&p->capture);
    p->capturing = p->policy == FSYNC_ALWAYS;
    p->req_epoch = p->gap_epoch;
    uv_mutex_lock(&p->mu);
    int failing = p->failing || p->gap || p->stalled;
    uv_mutex_unlock(&p->mu);
    if (!failing && group_open(p) == 0)
        return 0;
    res_problem(res, KVIDX_ESTORAGE, "the journal cannot be written; nothing was changed", NULL, 0);
    return 1;
}

int persist_ack(const struct request *req, struct response *res)
{
    struct persist *p = req->app->persist;
    if (p)
        group_close(p);
    if (!p || p->policy != FSYNC_ALWAYS)
        return 0;
    int capturing = p->capturing;
    p->capturing = 0;
    uv_mutex_lock(&p->mu);
    uint64_t durable = p->durable_seq;
    uv_mutex_unlock(&p->mu);
    /* A record of this request that could not be encoded (a gap opened)
     * leaves the journal short of it: the answer then waits for the
     * snapshot the gap sets off, which holds the whole state. */
    int gapped = p->gap_epoch != p->req_epoch;
    if ((p->appended_seq <= durable && !gapped) || res->status >= 300) {
        buf_reset(&p->capture);
        return 0;
    }
    if (waiter_defer(p, res, capturing) != 0) {
        /* The change is made and its records are on their way to the disk,
         * but the answer cannot wait for them: it is lost (the connection
         * closes), never a 503 that would say nothing changed. */
        res->lost = 1;
        return 0;
    }
    if (gapped)
        p->waiters->snap_epoch = p->gap_epoch; /* waiter_defer put it first */
    return HANDLER_ASYNC;
}

/* ---- open, stop, free ---- */

/* Takes data_dir/lock (a POSIX record lock over the whole file, exclusive,
 * not waiting): one kvidxd a directory. 0, or KVIDX_EINTERNAL (logged).
 * A record lock belongs to the process, not to the open file: a snapshot
 * child shares the descriptor from fork() until it closes it, and with
 * flock() it would hold the lock after its parent was killed until it
 * died too, so that a restart right after a kill -9 could be refused.
 * No other descriptor of the file is ever opened (closing one would drop
 * a record lock). */
static int lock_dir(struct persist *p)
{
    char path[PATHN];
    path_of(p->dir, LOCK_FILE, path, sizeof(path));
    /* O_NONBLOCK and the check: a FIFO in its place must not hang the
     * start (nor serve as the lock). */
    p->lock_fd = open(path, O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0600);
    if (p->lock_fd < 0) {
        log_error("refusing to start: cannot open %s: %s", path, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    struct why w;
    if (file_check_regular(p->lock_fd, path, NULL, &w) != 0) {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET; /* l_start and l_len 0: the whole file */
    if (fcntl(p->lock_fd, F_SETLK, &fl) != 0) {
        if (errno == EACCES || errno == EAGAIN)
            log_error("refusing to start: data_dir %s is in use by another kvidxd (%s is locked)",
                      p->dir, path);
        else
            log_error("refusing to start: cannot lock %s: %s", path, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    return 0;
}

/* Creates or checks data_dir and takes its lock. */
static int open_dir(struct persist *p)
{
    if (mkdir(p->dir, 0700) != 0 && errno != EEXIST) {
        log_error("refusing to start: cannot create data_dir %s: %s", p->dir, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    if (access(p->dir, R_OK | W_OK | X_OK) != 0) {
        log_error("refusing to start: data_dir %s is not usable: %s", p->dir, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    return lock_dir(p);
}

static struct persist *persist_new(struct app *app)
{
    struct persist *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->app = app;
    p->idx = app->keystore->idx;
    p->keyring = &app->keystore->keyring;
    p->layouts = app->layouts;
    p->fd = -1;
    p->lock_fd = -1;
    p->policy = app->cfg.fsync;
    snprintf(p->dir, sizeof(p->dir), "%s", app->cfg.data_dir);
    buf_init(&p->stage);
    buf_init(&p->capture);
    buf_init(&p->pending);
    return p;
}

/* Frees what persist_new and a failed start left (no thread, no handle). */
static void persist_discard(struct persist *p)
{
    if (p->fd >= 0)
        close(p->fd);
    if (p->lock_fd >= 0)
        close(p->lock_fd);
    buf_free(&p->stage);
    buf_free(&p->capture);
    buf_free(&p->pending);
    free(p);
}

static void persist_gauges(void *ctx, struct buf *out)
{
    const struct persist *p = ctx;
    metrics_single(out, "kvidx_restore_skipped_records", "gauge",
                   "Keys the last start skipped because they break the key rules.", p->skipped);
}

/* The loop's handles, the writer thread and the gauges. */
static int persist_start(struct app *app, struct persist *p)
{
    uv_mutex_init(&p->mu);
    uv_cond_init(&p->cv);
    uv_prepare_init(app->loop, &p->prepare);
    uv_async_init(app->loop, &p->async, on_async);
    uv_timer_init(app->loop, &p->everysec);
    uv_timer_init(app->loop, &p->reap);
    p->prepare.data = p->async.data = p->everysec.data = p->reap.data = p;
    p->handles_open = 1;
    p->async_open = 1;
    uv_prepare_start(&p->prepare, on_prepare);
    if (p->policy == FSYNC_EVERYSEC)
        uv_timer_start(&p->everysec, on_everysec, 1000, 1000);
    uv_timer_start(&p->reap, on_reap, 100, 100);
    app->persist = p;
    if (uv_thread_create(&p->thread, writer_main, p) != 0) {
        log_error("refusing to start: cannot start the journal writer thread");
        persist_stop(app);
        return KVIDX_EINTERNAL; /* persist_free after the loop closes the handles */
    }
    p->thread_started = 1;
    store_watch(p->idx, on_change, p);
    fleet_watch(app, p);
    if (metrics_register(app->metrics, persist_gauges, p) != 0)
        log_warn("metrics: no room for the persistence gauges");
    return 0;
}

int persist_open(struct app *app)
{
    if (!app->cfg.data_dir[0])
        return 0;
    struct persist *p = persist_new(app);
    if (!p)
        return KVIDX_ENOMEM;
    int rc = open_dir(p);
    if (rc == 0)
        rc = secret_load(p);
    if (rc == 0)
        rc = restore(p);
    if (rc != 0) {
        persist_discard(p);
        return rc;
    }
    return persist_start(app, p);
}

/* A start that fails after restore opened the new generation (a later
 * subsystem or the listener could not start) wrote nothing into it: it is
 * removed, or every failed start (a restart loop under memory pressure)
 * would leave one more journal for the next start to replay. The next start
 * gives its journal the same number: generations come from the snapshot's
 * and the remaining journals' numbers. Nothing is written before the daemon
 * is ready (restore reads, the loop has not run), so the file holds only
 * its header; the descriptor stays open for the writer thread. */
static void drop_unused_journal(const struct app *app, struct persist *p)
{
    if (app->ready || p->fd < 0 || p->journal_dropped)
        return;
    char name[64], path[PATHN];
    journal_name(p->cur_gen, name, sizeof(name));
    path_of(p->dir, name, path, sizeof(path));
    p->journal_dropped = 1;
    if (unlink(path) == 0)
        fsync_dir(p->dir, NULL);
}

void persist_stop(struct app *app)
{
    struct persist *p = app->persist;
    if (!p)
        return;
    drop_unused_journal(app, p);
    if (!p->handles_open)
        return;
    hand_over(p);
    p->handles_open = 0;
    uv_mutex_lock(&p->mu);
    p->async_open = 0;
    uv_mutex_unlock(&p->mu);
    uv_close((uv_handle_t *)&p->prepare, NULL);
    uv_close((uv_handle_t *)&p->async, NULL);
    uv_close((uv_handle_t *)&p->everysec, NULL);
    uv_close((uv_handle_t *)&p->reap, NULL);
}

/* The writer writes what is left, fsyncs and exits. */
static void writer_join(struct persist *p)
{
    uv_mutex_lock(&p->mu);
    p->stop = 1;
    uv_cond_signal(&p->cv);
    uv_mutex_unlock(&p->mu);
    uv_thread_join(&p->thread);
    if (p->failing || p->lost_bytes)
        log_error("shutdown: the journal could not be written (%s); the last changes are "
                  "lost (%zu bytes)",
                  p->fail_msg, p->lost_bytes);
}

void persist_free(struct app *app)
{
    struct persist *p = app->persist;
    if (!p)
        return;
    metrics_unregister(app->metrics, persist_gauges, p);
    if (app->keystore)
        store_watch(p->idx, NULL, NULL);
    fleet_watch(app, NULL);
    if (hand_over(p) != 0)
        log_error("shutdown: out of memory handing the last %zu journal bytes to the writer; "
                  "the last changes are lost",
                  p->stage.len);
    if (p->thread_started)
        writer_join(p);
    if (p->child > 0) {
        kill(p->child, SIGKILL);
        waitpid(p->child, NULL, 0);
        char tmp[PATHN];
        path_of(p->dir, SNAPSHOT_TMP, tmp, sizeof(tmp));
        unlink(tmp);
    }
    uv_mutex_destroy(&p->mu);
    uv_cond_destroy(&p->cv);
    persist_discard(p);
    app->persist = NULL;
}
