/*
 * Persistence of the key catalogue and the layout registry (issue #6).
 *
 * Writing: the index's change callback and the layout handlers encode one
 * STATE record per change (kvidx/journal.h) into `stage`, on the loop
 * thread. A uv_prepare handle moves the stage to `pending` once per loop
 * turn and wakes the writer thread, which appends pending to the current
 * journal with write() and, under fsync=always, fdatasync()s before it
 * reports the new durable position through a uv_async (group commit: one
 * fsync for every request of the turns it covers). Under everysec a 1 s
 * timer asks the writer for an fsync; under no the kernel decides. fsync
 * never runs on the loop thread.
 *
 * Positions are byte counts over the life of the process (`seq`): a
 * request's records end at appended_seq when its handler returns; its
 * answer is sent once durable_seq reaches that point.
 *
 * Failure: when write or fsync fails the writer truncates the journal back
 * to the last good length, reports `failing`, and retries the same bytes
 * every second until it succeeds. While failing, persist_refuse answers 503
 * storage_unavailable to new writes (so they change nothing), and answers
 * already waiting are turned into 503 (their change stays in memory and is
 * written when the journal recovers: see docs/persistence.md).
 *
 * Snapshot: when the journals since the last snapshot pass
 * snapshot_journal_bytes, the loop asks the writer to rotate to a new
 * generation at the current position and fork()s; the child walks its
 * copy-on-write image of the index, writes snapshot.tmp, fsyncs, renames it
 * to snapshot.kvs, fsyncs the directory and _exit()s. The parent reaps it
 * on a timer and asks the writer to delete the journals it covers.
 *
 * Invariant: a journal of generation g holds only changes made after every
 * change in generations < g; snapshot.kvs with next generation n holds the
 * state after every change in generations < n. Restore = snapshot, then
 * journals >= n in order; records are idempotent states, so overlap is
 * harmless.
 */
#include "state/persist/persist.h"

#include "util/context.h"
#include "util/json_write.h"
#include "state/keystore.h"
#include "state/layouts.h"
#include "util/log.h"

#include "kvidx/err.h"
#include "kvidx/journal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SECRET_FILE   "page_token.secret"
#define SNAPSHOT_FILE "snapshot.kvs"
#define SNAPSHOT_TMP  "snapshot.tmp"
#define LOCK_FILE     "lock"
#define SECRET_MAGIC  "KVIDXSEC"
#define SECRET_LEN    (8 + 4 + KVIDX_TOKEN_SECRET_LEN)
_Static_assert(KVIDX_STATE_L1 == KVIDX_DURABLE_L1 && KVIDX_STATE_L2 == KVIDX_DURABLE_L2,
               "journal tier bits are the index's durable tier bits");

#define PATHN 1400 /* data_dir (< 1024) + "/" + a file name */
/* Attempts at writing what is left, at shutdown, while the journal fails. */
#define STOP_ATTEMPTS 3

struct waiter {
    struct persist *p;
    struct response *res;
    uint64_t seq;
    struct buf undo; /* KEY records of the states before this request */
    int ready;       /* on p->ready (being answered), not on p->waiters */
    int keep;        /* cannot be undone: on failure its change stays, answered as is */
    struct waiter *prev, *next;
};

struct persist {
    struct app *app;
    char dir[1024];
    enum fsync_policy policy;

    /* loop thread only */
    struct buf stage;
    struct buf capture; /* undo records of the request being handled */
    int capturing;
    uint64_t appended_seq;  /* end of everything encoded so far */
    uint64_t journal_bytes; /* since the last snapshot, incl. files kept at start */
    struct waiter *waiters;
    /* Answers on_async is sending. Answering one can close its connection
     * and cancel others: waiter_cancel then unlinks them from here. */
    struct waiter *ready;
    int stalled; /* stage could not be handed to the writer (out of memory) */
    int failing_seen;
    uv_prepare_t prepare;
    uv_async_t async;
    uv_timer_t everysec;
    uv_timer_t reap;
    int handles_open;
    pid_t child;
    uint64_t child_gen;
    uint64_t snap_retry_ms;
    int gap;              /* a change could not be journaled (out of memory), or a hole */
    int hole;             /* a lost fsync may have left a hole in the current journal: the
                             next snapshot must rotate (a retry too), so that it goes */
    uint64_t gap_epoch;   /* counts such changes */
    uint64_t child_epoch; /* gap_epoch when the running snapshot forked */
    /* loop time before which no snapshot starts */ /* next generation of the snapshot being
                                                       written */
    uint64_t cur_gen;                               /* generation new records go to */

    /* shared, under mu */
    uv_mutex_t mu;
    uv_cond_t cv;
    uv_thread_t thread;
    int thread_started;
    struct buf pending;
    uint64_t pending_start; /* seq of pending.data[0] */
    uint64_t durable_seq;
    int failing;
    char fail_msg[256];
    int sync_req;
    int stop;
    int async_open;            /* the loop may be woken */
    size_t lost_bytes;         /* left unwritten when the writer gave up at shutdown */
    uint64_t rot_seq, rot_gen; /* rotate to rot_gen at rot_seq (rot_gen 0: none) */
    uint64_t del_below;        /* delete journals below this generation */
    int sync_lost; /* an fdatasync failed under everysec/no: bytes written before it may be
                      missing on disk, a hole later records would sit behind */

    int lock_fd;     /* data_dir/lock, flock'ed for the life of the process */
    int snap_failed; /* the last snapshot failed: retry without a new rotation */

    /* writer thread only */
    int fd;
    uint64_t wgen;
    off_t good_len;
};

/* ---- small file helpers (start-up, writer thread, snapshot child) ---- */

static void path_of(const struct persist *p, char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", p->dir, name);
}

static void journal_name(uint64_t gen, char *out, size_t cap)
{
    snprintf(out, cap, "journal-%016llx.kvj", (unsigned long long)gen);
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int write_all(int fd, const void *data, size_t n)
{
    const char *s = data;
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads a whole file into *out (malloc'd). 0, or -1 with errno. */
static int read_file(const char *path, uint8_t **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        close(fd);
        errno = ENOMEM;
        return -1;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *out = b;
    *len = got;
    return 0;
}

/* Writes name atomically: name.tmp (mode), fsync, rename, fsync dir. */
static int write_atomic(const struct persist *p, const char *name, const void *data, size_t n,
                        mode_t mode)
{
    char tmp[PATHN], dst[PATHN];
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", p->dir, name);
    path_of(p, dst, sizeof(dst), name);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return -1;
    if (write_all(fd, data, n) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
        return -1;
    }
    close(fd);
    if (rename(tmp, dst) != 0)
        return -1;
    return fsync_dir(p->dir);
}

/* Creates journal `gen` atomically with its header; returns an fd open for
 * appending, or -1. */
static int journal_create(const struct persist *p, uint64_t gen)
{
    char name[64], path[PATHN];
    uint8_t hdr[KVIDX_JOURNAL_HEADER_LEN];
    journal_name(gen, name, sizeof(name));
    kvidx_journal_header_encode(gen, hdr);
    if (write_atomic(p, name, hdr, sizeof(hdr), 0600) != 0)
        return -1;
    path_of(p, path, sizeof(path), name);
    return open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
}

/* ---- the writer thread ---- */

/* Wakes the loop; mu held. After persist_stop the async handle is closed
 * (and the loop may be gone), so nothing is sent. */
static void notify_loop(struct persist *p)
{
    if (p->async_open)
        uv_async_send(&p->async);
}

static void writer_fail(struct persist *p, const char *what)
{
    uv_mutex_lock(&p->mu);
    if (!p->failing)
        snprintf(p->fail_msg, sizeof(p->fail_msg), "%s: %s", what, strerror(errno));
    p->failing = 1;
    notify_loop(p);
    uv_mutex_unlock(&p->mu);
}

/* An fdatasync failed. Linux then drops the failed pages' dirty state: the
 * bytes written since the last good sync may never reach the disk while
 * the file goes on growing after them, and a replay would stop at that
 * hole and drop everything behind it. Under always nothing unsynced came
 * before (every write is synced, and a failed one is truncated and written
 * again). Otherwise the loop refuses writes until a snapshot, with a
 * rotation, holds the whole state and the journal with the hole is
 * deleted. */
static void sync_failed(struct persist *p)
{
    if (p->policy == FSYNC_ALWAYS)
        return;
    uv_mutex_lock(&p->mu);
    p->sync_lost = 1;
    uv_mutex_unlock(&p->mu);
}

static void delete_below(struct persist *p, uint64_t below)
{
    DIR *d = opendir(p->dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long g;
        char tail[8];
        if (sscanf(e->d_name, "journal-%16llx.%4s", &g, tail) == 2 && strcmp(tail, "kvj") == 0 &&
            g < below) {
            char path[PATHN];
            path_of(p, path, sizeof(path), e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    fsync_dir(p->dir);
}

static void writer_main(void *arg)
{
    struct persist *p = arg;
    struct buf work;
    buf_init(&work);
    uint64_t work_end = 0; /* seq after work's bytes */
    int stop_fails = 0;    /* failed attempts since shutdown began */
    uv_mutex_lock(&p->mu);
    for (;;) {
        int oom = 0;
        while (!p->stop && !p->pending.len && !work.len && !p->sync_req && !p->failing &&
               !(p->rot_gen && p->pending_start == p->rot_seq) &&
               !(p->del_below && p->wgen >= p->del_below))
            uv_cond_wait(&p->cv, &p->mu);
        if (p->failing) /* retry once a second (a tenth at shutdown) */
            uv_cond_timedwait(&p->cv, &p->mu, p->stop ? 100000000ull : 1000000000ull);
        /* Take pending up to the rotation point, if any. */
        if (!work.len && p->pending.len) {
            size_t take = p->pending.len;
            if (p->rot_gen && p->rot_seq >= p->pending_start &&
                p->rot_seq - p->pending_start < take)
                take = (size_t)(p->rot_seq - p->pending_start);
            if (take == p->pending.len) {
                /* All of it: swap the buffers (work is empty), no copy. */
                struct buf t = work;
                work = p->pending;
                p->pending = t;
                p->pending_start += take;
                work_end = p->pending_start;
            } else if (take && buf_reserve(&work, take) == 0) {
                buf_append(&work, p->pending.data, take);
                memmove(p->pending.data, p->pending.data + take, p->pending.len - take);
                p->pending.len -= take;
                p->pending_start += take;
                work_end = p->pending_start;
            } else if (take) {
                /* Out of memory: the bytes stay in pending and the
                 * positions where they are; fail and retry in a second. */
                buf_reset(&work);
                errno = ENOMEM;
                if (!p->failing)
                    snprintf(p->fail_msg, sizeof(p->fail_msg), "journal buffer: %s",
                             strerror(ENOMEM));
                p->failing = 1;
                oom = 1;
                notify_loop(p);
            }
        }
        int want_sync = p->policy == FSYNC_ALWAYS || p->sync_req || p->stop || p->failing;
        p->sync_req = 0;
        int rotate = p->rot_gen && p->pending_start == p->rot_seq && !work.len;
        int stopping = p->stop;
        uint64_t del = p->del_below;
        uv_mutex_unlock(&p->mu);

        int ok = !oom;
        if (work.len) {
            int wrote = write_all(p->fd, work.data, work.len) == 0;
            if (!wrote || (want_sync && fdatasync(p->fd) != 0)) {
                /* Back to the last good length; the same bytes are
                 * written again on the next attempt. */
                if (wrote)
                    sync_failed(p);
                writer_fail(p, "journal write");
                if (ftruncate(p->fd, p->good_len) != 0)
                    (void)0; /* the retry's write fails the same way */
                ok = 0;
            } else {
                p->good_len += (off_t)work.len;
                buf_reset(&work);
            }
        } else if (want_sync && p->fd >= 0 && fdatasync(p->fd) != 0) {
            sync_failed(p);
            writer_fail(p, "journal fsync");
            ok = 0;
        }
        if (ok && rotate) {
            uint64_t gen;
            uv_mutex_lock(&p->mu);
            gen = p->rot_gen;
            uv_mutex_unlock(&p->mu);
            int nfd = journal_create(p, gen);
            if (nfd < 0) {
                writer_fail(p, "journal rotation");
                ok = 0;
            } else {
                if (fdatasync(p->fd) != 0)
                    sync_failed(p); /* under always everything in it was synced */
                close(p->fd);
                p->fd = nfd;
                p->wgen = gen;
                p->good_len = KVIDX_JOURNAL_HEADER_LEN;
                uv_mutex_lock(&p->mu);
                if (p->rot_gen == gen)
                    p->rot_gen = 0;
                uv_mutex_unlock(&p->mu);
            }
        }
        if (ok && del && p->wgen >= del) {
            delete_below(p, del);
            uv_mutex_lock(&p->mu);
            if (p->del_below == del)
                p->del_below = 0;
            uv_mutex_unlock(&p->mu);
        }
        uv_mutex_lock(&p->mu);
        if (ok && !work.len) {
            if (p->durable_seq < work_end)
                p->durable_seq = work_end;
            if (p->failing)
                log_info("journal: writing again after an error");
            p->failing = 0;
        }
        notify_loop(p);
        /* Shutdown: done once everything is written; on errors, a bounded
         * number of attempts whatever is left (pending may hold records,
         * e.g. an undo's, that can never go before work), then give up:
         * persist_free logs that the last changes are lost. */
        if (stopping && ok && !work.len && !p->pending.len)
            break;
        if (stopping && !ok && ++stop_fails >= STOP_ATTEMPTS) {
            p->lost_bytes = work.len + p->pending.len;
            break;
        }
    }
    uv_mutex_unlock(&p->mu);
    buf_free(&work);
}

/* ---- loop side ---- */

static int apply_state(kvidx_index_t *idx, const kvidx_key_t *k, uint64_t size, unsigned tiers,
                       int force);

/* Moves the stage to pending. Out of memory: the bytes stay in the stage
 * (nothing is dropped, positions stay right), writes are refused while it
 * lasts (p->stalled) and the next loop turn tries again (the reap timer
 * turns the loop at least every 100 ms). 0, or -1 when they stayed. */
static int hand_over(struct persist *p)
{
    if (!p->stage.len) {
        p->stalled = 0;
        return 0;
    }
    uv_mutex_lock(&p->mu);
    int rc = 0;
    if (!p->pending.len) {
        /* The usual case: swap the buffers, no copy, no allocation. */
        struct buf t = p->pending;
        p->pending = p->stage;
        p->stage = t;
    } else if (buf_reserve(&p->pending, p->stage.len) == 0) {
        buf_append(&p->pending, p->stage.data, p->stage.len);
    } else {
        p->pending.failed = 0; /* its bytes are intact; retry later */
        rc = -1;
    }
    if (!rc)
        uv_cond_signal(&p->cv);
    uv_mutex_unlock(&p->mu);
    if (rc) {
        if (!p->stalled)
            log_error("journal: out of memory handing %zu bytes to the writer; refusing writes "
                      "until it succeeds",
                      p->stage.len);
        p->stalled = 1;
        return -1;
    }
    buf_reset(&p->stage);
    if (p->stalled)
        log_info("journal: records handed to the writer again; accepting writes");
    p->stalled = 0;
    return 0;
}

static void append_rec(struct persist *p, const kvidx_jrec_t *r)
{
    size_t n = kvidx_jrec_size(r);
    if (!n || buf_reserve(&p->stage, n) != 0) {
        /* Out of memory: the journal misses this change. Refuse writes
         * (storage_unavailable) until a snapshot, which holds the whole
         * state, has closed the gap. */
        if (!p->gap)
            log_error("journal: out of memory encoding a record; refusing writes until the "
                      "next snapshot");
        p->gap = 1;
        p->gap_epoch++;
        p->stage.failed = 0; /* the stage's bytes are intact: later records go on */
        return;
    }
    size_t len = 0;
    kvidx_jrec_encode(r, (uint8_t *)p->stage.data + p->stage.len, n, &len);
    p->stage.len += len;
    p->appended_seq += len;
    p->journal_bytes += len;
}

/* Encodes a KEY record of key in state *st at the end of b. 0 or -1. */
/* The record "key is now in state st". */
static void key_rec(kvidx_jrec_t *r, const kvidx_key_t *key, const kvidx_durable_t *st)
{
    memset(r, 0, sizeof(*r));
    r->type = KVIDX_JREC_KEY;
    r->key = *key;
    r->size_bytes = st->size_bytes;
    r->tiers = (uint8_t)st->tiers;
}

/* The record "layout (model, world_size) is json", or "is gone" when json
 * is NULL. */
static void layout_rec(kvidx_jrec_t *r, const char *model, size_t model_len, uint8_t world_size,
                       const char *json, size_t json_len)
{
    memset(r, 0, sizeof(*r));
    r->type = json ? KVIDX_JREC_LAYOUT_PUT : KVIDX_JREC_LAYOUT_DEL;
    r->key.model = model;
    r->key.model_len = (uint16_t)model_len;
    r->world_size = world_size;
    r->blob = (const uint8_t *)json;
    r->blob_len = json ? json_len : 0;
}

/* Appends one encoded record to b. 0, or -1 when it cannot be encoded or
 * the buffer cannot grow. */
static int encode_rec(struct buf *b, const kvidx_jrec_t *r)
{
    size_t n = kvidx_jrec_size(r), len = 0;
    if (!n || buf_reserve(b, n) != 0)
        return -1;
    kvidx_jrec_encode(r, (uint8_t *)b->data + b->len, n, &len);
    b->len += len;
    return 0;
}

static int encode_state(struct buf *b, const kvidx_key_t *key, const kvidx_durable_t *st)
{
    kvidx_jrec_t r;
    key_rec(&r, key, st);
    return encode_rec(b, &r);
}

static void on_change(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *before,
                      const kvidx_durable_t *after)
{
    struct persist *p = ctx;
    kvidx_jrec_t r;
    key_rec(&r, key, after);
    append_rec(p, &r);
    if (p->capturing && encode_state(&p->capture, key, before) != 0)
        p->capturing = -1; /* cannot undo this request: it is never deferred */
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

static void waiter_unlink(struct waiter *w)
{
    struct persist *p = w->p;
    if (w->prev)
        w->prev->next = w->next;
    else if (w->ready)
        p->ready = w->next;
    else
        p->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}

static void waiter_free(struct waiter *w)
{
    buf_free(&w->undo);
    free(w);
}

static void waiter_cancel(void *arg)
{
    struct waiter *w = arg;
    waiter_unlink(w);
    waiter_free(w);
}

/* 1 when a key the request changed now has a pinned or loading L1 copy:
 * an undo would have to delete or resize it, which only a forced delete
 * may do (SPEC §2), so the request is not undone at all. */
static int undo_blocked(struct persist *p, const struct waiter *w)
{
    const uint8_t *b = (const uint8_t *)w->undo.data;
    kvidx_index_t *idx = p->app->keystore->idx;
    size_t off = 0;
    kvidx_jrec_t rec;
    while (kvidx_journal_next(b, w->undo.len, &off, &rec) == 1) {
        kvidx_ref_t ref;
        kvidx_entry_info_t info;
        if (rec.type != KVIDX_JREC_KEY || kvidx_index_find(idx, &rec.key, &ref) != 0 ||
            kvidx_index_info(idx, ref, &info) != 0)
            continue;
        if (info.l1_state == KVIDX_L1_LOADING || info.pins > 0)
            return 1;
    }
    return 0;
}

/* Puts back the states a failed request replaced, newest first. The index
 * reports the restored states as changes, so compensating records follow
 * the failed ones in the journal once it can be written again. A request
 * that cannot be undone (no undo log, or a pinned copy in the way) keeps
 * its change, which is journaled when the disk recovers: w->keep, and it
 * is answered as it was (not 503). */
static void waiter_undo(struct persist *p, struct waiter *w)
{
    if (w->keep || undo_blocked(p, w)) {
        w->keep = 1;
        return;
    }
    const uint8_t *b = (const uint8_t *)w->undo.data;
    size_t n = 0, cap = 0, off = 0;
    size_t *at = NULL;
    kvidx_jrec_t rec;
    while (kvidx_journal_next(b, w->undo.len, &off, &rec) == 1) {
        if (n == cap) {
            size_t *na = realloc(at, (cap = cap ? 2 * cap : 64) * sizeof(*at));
            if (!na) {
                free(at);
                w->keep = 1; /* cannot walk it backwards: leave it all */
                return;
            }
            at = na;
        }
        at[n++] = off;
    }
    for (size_t i = n; i-- > 0;) {
        off = i ? at[i - 1] : 0;
        if (kvidx_journal_next(b, w->undo.len, &off, &rec) != 1)
            continue;
        if (rec.type == KVIDX_JREC_KEY) {
            if (apply_state(p->app->keystore->idx, &rec.key, rec.size_bytes, rec.tiers, 0) != 0)
                log_warn("journal: could not restore a key after a failed write");
        } else if (rec.type == KVIDX_JREC_LAYOUT_PUT) {
            layouts_restore(p->app->layouts, (const char *)rec.blob, rec.blob_len);
            persist_layout_put(p->app, rec.key.model, rec.key.model_len, rec.world_size,
                               (const char *)rec.blob, rec.blob_len);
        } else if (rec.type == KVIDX_JREC_LAYOUT_DEL) {
            layouts_forget(p->app->layouts, rec.key.model, rec.key.model_len, rec.world_size);
            persist_layout_del(p->app, rec.key.model, rec.key.model_len, rec.world_size);
        }
    }
    free(at);
}

int persist_refuse(const struct request *req, struct response *res)
{
    struct persist *p = req->app->persist;
    if (!p)
        return 0;
    buf_reset(&p->capture);
    p->capturing = p->policy == FSYNC_ALWAYS;
    uv_mutex_lock(&p->mu);
    int failing = p->failing || p->gap || p->stalled;
    uv_mutex_unlock(&p->mu);
    if (!failing)
        return 0;
    res_problem(res, KVIDX_ESTORAGE, "the journal cannot be written; nothing was changed", NULL, 0);
    return 1;
}

int persist_ack(const struct request *req, struct response *res)
{
    struct persist *p = req->app->persist;
    if (!p || p->policy != FSYNC_ALWAYS)
        return 0;
    int capturing = p->capturing;
    p->capturing = 0;
    uv_mutex_lock(&p->mu);
    uint64_t durable = p->durable_seq;
    uv_mutex_unlock(&p->mu);
    if (p->appended_seq <= durable || res->status >= 300) {
        buf_reset(&p->capture);
        return 0;
    }
    struct waiter *w = calloc(1, sizeof(*w));
    if (!w) {
        buf_reset(&res->body);
        res->extra_len = 0;
        return res_problem(res, KVIDX_ENOMEM, "out of memory", NULL, 0);
    }
    w->p = p;
    w->res = res;
    w->seq = p->appended_seq;
    /* The waiter takes the undo records. Without them (capture failed) the
     * request cannot be undone: on failure it keeps its change. */
    w->undo = p->capture;
    buf_init(&p->capture);
    if (capturing < 0) {
        buf_reset(&w->undo);
        w->keep = 1;
    }
    w->next = p->waiters;
    if (p->waiters)
        p->waiters->prev = w;
    p->waiters = w;
    res_defer(res, w, waiter_cancel);
    return HANDLER_ASYNC;
}

static void on_prepare(uv_prepare_t *h)
{
    struct persist *p = h->data;
    /* Handlers are synchronous: no request is being handled now (one that
     * answered an error without persist_ack left its capture on). */
    p->capturing = 0;
    hand_over(p);
}

static void maybe_snapshot(struct persist *p);

static void on_async(uv_async_t *h)
{
    struct persist *p = h->data;
    uv_mutex_lock(&p->mu);
    uint64_t durable = p->durable_seq;
    int failing = p->failing, sync_lost = p->sync_lost;
    p->sync_lost = 0;
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", p->fail_msg);
    uv_mutex_unlock(&p->mu);
    if (sync_lost) {
        log_error("journal: an fsync failed after its records were written; they may be "
                  "missing on disk. Refusing writes until the next snapshot holds every change");
        p->gap = 1;
        p->hole = 1;
        p->gap_epoch++;
    }
    if (failing && !p->failing_seen)
        log_error("journal: %s; writes answer 503 storage_unavailable until it recovers", msg);
    p->failing_seen = failing;
    /* Undo failed requests newest first (the list is newest first). */
    if (failing) {
        for (struct waiter *w = p->waiters; w; w = w->next)
            if (w->seq > durable)
                waiter_undo(p, w);
    }
    /* Move the answers to send to p->ready first: completing one may run
     * pipelined requests that add waiters. Completing one may also close
     * its connection, which cancels the answers still waiting on it:
     * waiter_cancel then takes them off p->ready, so the loop only ever
     * reads the head of that list, never a saved pointer. */
    for (struct waiter *w = p->waiters, *next; w; w = next) {
        next = w->next;
        if (w->seq <= durable || failing) {
            waiter_unlink(w);
            w->ready = 1;
            w->next = p->ready; /* the list is newest first: p->ready oldest first */
            if (p->ready)
                p->ready->prev = w;
            p->ready = w;
        }
    }
    while (p->ready) {
        struct waiter *w = p->ready;
        waiter_unlink(w);
        if (w->seq > durable && !w->keep) {
            buf_reset(&w->res->body);
            w->res->extra_len = 0;
            res_problem(w->res, KVIDX_ESTORAGE,
                        "the journal could not be written; nothing was changed", NULL, 0);
        }
        struct response *res = w->res;
        waiter_free(w);
        /* The waiter is gone: the server must not cancel it again. */
        res->cancel = NULL;
        res->waiter = NULL;
        res_complete(res);
    }
    maybe_snapshot(p);
}

static void on_everysec(uv_timer_t *t)
{
    struct persist *p = t->data;
    uv_mutex_lock(&p->mu);
    p->sync_req = 1;
    uv_cond_signal(&p->cv);
    uv_mutex_unlock(&p->mu);
}

/* ---- snapshot (fork) ---- */

int persist_write_snapshot(kvidx_index_t *idx, const struct layouts *layouts, const char *dir,
                           uint64_t next_gen)
{
    char tmp[PATHN], dst[PATHN];
    snprintf(tmp, sizeof(tmp), "%s/%s", dir, SNAPSHOT_TMP);
    snprintf(dst, sizeof(dst), "%s/%s", dir, SNAPSHOT_FILE);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t cap = 1 << 20;
    uint8_t *out = malloc(cap);
    kvidx_ref_t *refs = malloc(4096 * sizeof(*refs));
    kvidx_key_buf_t *resume = malloc(sizeof(*resume));
    int rc = -1;
    if (!out || !refs || !resume)
        goto out;
    size_t len = 0;
    kvidx_snapshot_writer_t w;
    kvidx_snapshot_begin(&w, next_gen, out);
    len = KVIDX_SNAPSHOT_HEADER_LEN;
    for (size_t i = 0;; i++) {
        const char *model, *json;
        size_t ml;
        uint8_t ws;
        if (layouts_at(layouts, i, &model, &ml, &ws, &json) != 0)
            break;
        kvidx_jrec_t r;
        memset(&r, 0, sizeof(r));
        r.type = KVIDX_JREC_LAYOUT_PUT;
        r.key.model = model;
        r.key.model_len = (uint16_t)ml;
        r.world_size = ws;
        r.blob = (const uint8_t *)json;
        r.blob_len = strlen(json);
        size_t n = 0;
        if (cap - len < kvidx_jrec_size(&r)) {
            if (write_all(fd, out, len) != 0)
                goto out;
            len = 0;
        }
        if (kvidx_snapshot_add(&w, &r, out + len, cap - len, &n) != 0)
            goto out;
        len += n;
    }
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    f.tier = KVIDX_TIER_ALL;
    const kvidx_key_t *after = NULL;
    for (;;) {
        size_t count = 0;
        int more = 0;
        if (kvidx_index_list(idx, &f, after, 4096, 1u << 30, refs, &count, resume, &more, NULL) !=
            0)
            goto out;
        for (size_t i = 0; i < count; i++) {
            kvidx_jrec_t r;
            kvidx_entry_info_t info;
            memset(&r, 0, sizeof(r));
            if (kvidx_index_key(idx, refs[i], &r.key) != 0 ||
                kvidx_index_info(idx, refs[i], &info) != 0)
                continue;
            r.type = KVIDX_JREC_KEY;
            r.tiers = info.l2 ? KVIDX_STATE_L2 : 0;
            if (info.l1_state == KVIDX_L1_READY && !info.temporary)
                r.tiers |= KVIDX_STATE_L1;
            if (!r.tiers)
                continue;
            r.size_bytes = info.size_bytes;
            if (cap - len < KVIDX_SNAPSHOT_KEY_MAX) {
                if (write_all(fd, out, len) != 0)
                    goto out;
                len = 0;
            }
            size_t n = 0;
            if (kvidx_snapshot_add(&w, &r, out + len, cap - len, &n) != 0)
                goto out;
            len += n;
        }
        if (!more)
            break;
        after = &resume->key;
    }
    kvidx_snapshot_finish(&w, out + len);
    len += KVIDX_SNAPSHOT_TRAILER_LEN;
    if (write_all(fd, out, len) != 0 || fsync(fd) != 0)
        goto out;
    if (close(fd) != 0) {
        fd = -1;
        goto out;
    }
    fd = -1;
    if (rename(tmp, dst) != 0 || fsync_dir(dir) != 0)
        goto out;
    rc = 0;
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(out);
    free(refs);
    free(resume);
    return rc;
}

static void maybe_snapshot(struct persist *p)
{
    if (p->child > 0 || !p->handles_open || p->failing_seen ||
        (p->journal_bytes < p->app->cfg.snapshot_journal_bytes && !p->gap) ||
        uv_now(p->app->loop) < p->snap_retry_ms)
        return;
    /* Everything encoded so far goes to cur_gen; later changes to the next
     * generation. The child's image holds exactly the former. */
    if (hand_over(p) != 0)
        return;
    uint64_t next = p->cur_gen + 1;
    uv_mutex_lock(&p->mu);
    if (p->rot_gen) { /* a previous rotation is still pending */
        uv_mutex_unlock(&p->mu);
        return;
    }
    if (p->snap_failed && !p->hole) {
        /* A retry: the generations below cur_gen are the failed
         * snapshot's, already closed. Snapshot "below cur_gen" without a
         * new generation: the image also holds a prefix of cur_gen, which
         * replay applies again on top (records are idempotent states).
         * Not after a lost fsync: cur_gen may hold the hole, and only a
         * rotation lets the snapshot delete it. */
        next = p->cur_gen;
    } else {
        p->rot_seq = p->appended_seq;
        p->rot_gen = next;
        uv_cond_signal(&p->cv);
    }
    uv_mutex_unlock(&p->mu);
    p->cur_gen = next > p->cur_gen ? next : p->cur_gen;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* The child: only writes files from its copy-on-write image of the
         * index and layouts, never touches the loop, and _exit()s. It dies
         * with its parent (a snapshot finishing after a restart could race
         * the new process's files) and closes every inherited descriptor
         * (the listening socket must not outlive the parent). The loop's
         * signal handlers are not its own: default dispositions, nothing
         * blocked. */
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        for (int sig = 1; sig < NSIG; sig++)
            if (sig != SIGKILL && sig != SIGSTOP)
                signal(sig, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(3);
        if (close_range(3, ~0u, 0) != 0) {
            long max = sysconf(_SC_OPEN_MAX);
            if (max < 0 || max > 1 << 20)
                max = 1 << 20;
            for (int fd = 3; fd < max; fd++)
                close(fd);
        }
        _exit(persist_write_snapshot(p->app->keystore->idx, p->app->layouts, p->dir, next) ? 2 : 0);
    }
    if (pid < 0) {
        log_warn("snapshot: fork failed (%s); retrying in 10 s", strerror(errno));
        p->snap_retry_ms = uv_now(p->app->loop) + 10000;
        p->snap_failed = 1; /* the rotation is done: the retry needs none */
        return;
    }
    p->child = pid;
    p->child_gen = next;
    p->child_epoch = p->gap_epoch;
    p->journal_bytes = 0;
    log_info("snapshot: writing generation %llu in the background (pid %d)",
             (unsigned long long)next, (int)pid);
}

static void on_reap(uv_timer_t *t)
{
    struct persist *p = t->data;
    if (p->child <= 0) {
        maybe_snapshot(p);
        return;
    }
    int status = 0;
    pid_t r = waitpid(p->child, &status, WNOHANG);
    if (r == 0)
        return;
    p->child = 0;
    if (r > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        log_info("snapshot: generation %llu written; deleting the journals it covers",
                 (unsigned long long)p->child_gen);
        p->snap_failed = 0;
        if (p->gap && p->gap_epoch == p->child_epoch) {
            p->gap = 0;
            p->hole = 0; /* the snapshot rotated past it; its journals go now */
            log_info("journal: the snapshot holds every change; accepting writes again");
        }
        uv_mutex_lock(&p->mu);
        p->del_below = p->child_gen;
        uv_cond_signal(&p->cv);
        uv_mutex_unlock(&p->mu);
    } else {
        if (r > 0 && WIFSIGNALED(status))
            log_error("snapshot: the writer was killed by signal %d; the journals are kept, "
                      "retrying in 10 s",
                      WTERMSIG(status));
        else
            log_error("snapshot: the writer failed (exit status %d); the journals are kept, "
                      "retrying in 10 s",
                      r > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        p->snap_failed = 1;
        p->journal_bytes += p->app->cfg.snapshot_journal_bytes; /* still due */
        p->snap_retry_ms = uv_now(p->app->loop) + 10000;
    }
}

/* ---- restore ---- */

static int secret_load(struct persist *p)
{
    char path[PATHN];
    path_of(p, path, sizeof(path), SECRET_FILE);
    kvidx_token_secret_t s;
    uint8_t *data = NULL;
    size_t n = 0;
    struct keystore *ks = p->app->keystore;
    if (read_file(path, &data, &n) == 0) {
        int ok = n == SECRET_LEN && memcmp(data, SECRET_MAGIC, 8) == 0;
        if (ok) {
            s.id = (uint32_t)data[8] | (uint32_t)data[9] << 8 | (uint32_t)data[10] << 16 |
                   (uint32_t)data[11] << 24;
            memcpy(s.secret, data + 12, KVIDX_TOKEN_SECRET_LEN);
        }
        sodium_memzero(data, n);
        free(data);
        if (!ok) {
            log_error("refusing to start: %s is not a kvidx page-token secret (%zu bytes)", path,
                      n);
            return KVIDX_EINTERNAL;
        }
        log_info("page tokens: using the secret in %s", path);
    } else if (errno == ENOENT) {
        uint8_t buf[SECRET_LEN];
        if (kvidx_token_secret_generate(&s) != 0)
            return KVIDX_EINTERNAL;
        memcpy(buf, SECRET_MAGIC, 8);
        for (int i = 0; i < 4; i++)
            buf[8 + i] = (uint8_t)(s.id >> (8 * i));
        memcpy(buf + 12, s.secret, KVIDX_TOKEN_SECRET_LEN);
        int rc = write_atomic(p, SECRET_FILE, buf, sizeof(buf), 0600);
        sodium_memzero(buf, sizeof(buf));
        if (rc != 0) {
            log_error("refusing to start: cannot write %s: %s", path, strerror(errno));
            return KVIDX_EINTERNAL;
        }
        log_info("page tokens: created a new secret in %s", path);
    } else {
        log_error("refusing to start: cannot read %s: %s", path, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    kvidx_token_keyring_clear(&ks->keyring);
    int rc = kvidx_token_keyring_rotate(&ks->keyring, &s);
    sodium_memzero(&s, sizeof(s));
    return rc;
}

/* Makes the key's durable state what a record says. Replay forces (there
 * are no pins at start); an undo does not (SPEC §2: a pinned copy is only
 * deleted by a forced delete). */
static int apply_state(kvidx_index_t *idx, const kvidx_key_t *k, uint64_t size, unsigned tiers,
                       int force)
{
    kvidx_del_outcome_t o;
    if (!(tiers & KVIDX_STATE_L1))
        kvidx_index_delete(idx, k, KVIDX_TIER_L1, force, &o);
    if (!(tiers & KVIDX_STATE_L2))
        kvidx_index_delete(idx, k, KVIDX_TIER_L2, force, &o);
    kvidx_put_t it = {*k, size};
    int rc = 0;
    if (tiers & KVIDX_STATE_L2)
        rc = kvidx_index_put_batch(idx, KVIDX_TIER_L2, &it, 1, NULL);
    if (!rc && (tiers & KVIDX_STATE_L1))
        rc = kvidx_index_put_batch(idx, KVIDX_TIER_L1, &it, 1, NULL);
    return rc;
}

/* ---- snapshot restore ---- */

/* The restore is a two-stage pipeline: a reader thread decodes records into
 * batches while the calling thread loads the previous batch into the index
 * (decoding is about a third of a restore). A layout record ends a batch,
 * so records reach the index and the layouts in file order. */
#define BATCH          16384
#define JOURNALS_MERGE 8 /* journals replayed at a start that make a snapshot due */
#define NBUF           4

typedef struct load_buf {
    kvidx_load_t *items;
    size_t n;
    int layout; /* lrec, a layout record, follows the items */
    kvidx_jrec_t lrec;
} load_buf_t;

typedef struct load_pipe {
    uv_mutex_t mu;
    uv_cond_t cv;
    load_buf_t buf[NBUF];
    size_t produced, consumed; /* batches, ever */
    int eof;                   /* no batch after `produced`; bad if < 0 */
    int stop;                  /* the loader gave up: the reader stops */
    kvidx_snapshot_reader_t r;
} load_pipe_t;

/* Decodes the next batch: 1 if it holds something, 0 at a clean end, <0
 * on a malformed record or counts that do not match the trailer. */
static int fill_batch(kvidx_snapshot_reader_t *r, load_buf_t *b)
{
    b->n = 0;
    b->layout = 0;
    kvidx_jrec_t rec;
    while (b->n < BATCH) {
        int got = kvidx_snapshot_next(r, &rec);
        if (got < 0)
            return got;
        if (got == 0)
            return b->n > 0;
        if (rec.type == KVIDX_JREC_LAYOUT_PUT) {
            b->lrec = rec;
            b->layout = 1;
            return 1;
        }
        kvidx_load_t *it = &b->items[b->n++];
        it->key = rec.key;
        it->size_bytes = rec.size_bytes;
        it->tiers = rec.tiers; /* KVIDX_STATE_* == KVIDX_DURABLE_* */
    }
    return 1;
}

static void reader_main(void *arg)
{
    load_pipe_t *lp = arg;
    uv_mutex_lock(&lp->mu);
    for (;;) {
        while (lp->produced - lp->consumed == NBUF && !lp->stop)
            uv_cond_wait(&lp->cv, &lp->mu);
        if (lp->stop)
            break;
        load_buf_t *b = &lp->buf[lp->produced % NBUF];
        uv_mutex_unlock(&lp->mu);
        int got = fill_batch(&lp->r, b);
        uv_mutex_lock(&lp->mu);
        if (got > 0)
            lp->produced++;
        else
            lp->eof = got < 0 ? -1 : 1;
        uv_cond_broadcast(&lp->cv);
        if (got <= 0)
            break;
    }
    uv_mutex_unlock(&lp->mu);
}

/* Puts one decoded batch into the index and the layouts. */
static int load_batch(kvidx_index_t *idx, struct layouts *layouts, const load_buf_t *b,
                      const char **why)
{
    int rc = b->n ? kvidx_index_load(idx, b->items, b->n, NULL) : 0;
    if (rc == KVIDX_ENOMEM) {
        *why = "out of memory";
        return rc;
    }
    if (rc != 0) {
        *why = "the index refused a key (duplicate, capacity or a bad key)";
        return KVIDX_EINVAL;
    }
    if (b->layout && layouts_restore(layouts, (const char *)b->lrec.blob, b->lrec.blob_len) != 0) {
        *why = "a layout record does not parse";
        return KVIDX_EINVAL;
    }
    return 0;
}

/* Runs the pipeline; without a reader thread (thread creation failed), the
 * same stages alternate on this thread. */
static int load_records(load_pipe_t *lp, kvidx_index_t *idx, struct layouts *layouts,
                        const char **why)
{
    uv_thread_t th;
    if (uv_mutex_init(&lp->mu) != 0)
        return KVIDX_ENOMEM;
    if (uv_cond_init(&lp->cv) != 0) {
        uv_mutex_destroy(&lp->mu);
        return KVIDX_ENOMEM;
    }
    int threaded = uv_thread_create(&th, reader_main, lp) == 0;
    int rc = 0;
    for (;;) {
        if (!threaded) {
            int got = fill_batch(&lp->r, &lp->buf[0]);
            if (got < 0) {
                *why = lp->r.why;
                rc = KVIDX_EINVAL;
            } else if (got > 0) {
                rc = load_batch(idx, layouts, &lp->buf[0], why);
            }
            if (got <= 0 || rc)
                break;
            continue;
        }
        uv_mutex_lock(&lp->mu);
        while (lp->consumed == lp->produced && !lp->eof)
            uv_cond_wait(&lp->cv, &lp->mu);
        int have = lp->consumed != lp->produced, eof = lp->eof;
        uv_mutex_unlock(&lp->mu);
        if (!have) {
            if (eof < 0) {
                *why = lp->r.why;
                rc = KVIDX_EINVAL;
            }
            break;
        }
        rc = load_batch(idx, layouts, &lp->buf[lp->consumed % NBUF], why);
        uv_mutex_lock(&lp->mu);
        lp->consumed++;
        if (rc)
            lp->stop = 1;
        uv_cond_broadcast(&lp->cv);
        uv_mutex_unlock(&lp->mu);
        if (rc)
            break;
    }
    if (threaded)
        uv_thread_join(&th);
    uv_cond_destroy(&lp->cv);
    uv_mutex_destroy(&lp->mu);
    return rc;
}

int persist_load_snapshot(const char *path, kvidx_index_t *idx, struct layouts *layouts,
                          uint64_t *next_gen, uint64_t *nkeys, uint64_t *nlayouts, const char **why)
{
    *next_gen = 0;
    *nkeys = *nlayouts = 0;
    *why = NULL;
    /* mmap, not read: the pages come straight from the page cache, which
     * for a multi-GB snapshot saves a copy and most of the page faults. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        *why = strerror(errno);
        return KVIDX_EINTERNAL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *why = strerror(errno);
        close(fd);
        return KVIDX_EINTERNAL;
    }
    size_t len = (size_t)st.st_size;
    const uint8_t *data = NULL;
    if (len) {
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (m == MAP_FAILED) {
            *why = strerror(errno);
            close(fd);
            return KVIDX_EINTERNAL;
        }
        madvise(m, len, MADV_SEQUENTIAL);
        data = m;
    }
    close(fd);
    load_pipe_t *lp = calloc(1, sizeof(*lp));
    int rc = 0;
    for (int i = 0; lp && i < NBUF; i++) {
        lp->buf[i].items = malloc(BATCH * sizeof(kvidx_load_t));
        if (!lp->buf[i].items)
            rc = KVIDX_ENOMEM;
    }
    if (!lp || rc) {
        *why = "out of memory";
        rc = KVIDX_ENOMEM;
        goto out;
    }
    /* Streaming: the reader thread checksums the file as it decodes; on a
     * mismatch at the end the restore fails and the daemon refuses to
     * start, so the keys already loaded are never used. */
    if (kvidx_snapshot_open_streaming(&lp->r, data, len, why) != 0) {
        rc = KVIDX_EINVAL;
        goto out;
    }
    if (kvidx_index_reserve(idx, lp->r.keys) != 0) {
        *why = "out of memory for the announced number of keys";
        rc = KVIDX_ENOMEM;
        goto out;
    }
    rc = load_records(lp, idx, layouts, why);
    if (rc == KVIDX_ENOMEM && !*why)
        *why = "out of memory";
    /* A damaged file can fail the load before its checksum is known: say
     * which it was. */
    kvidx_snapshot_reader_t whole;
    const char *damaged = NULL;
    if (rc && kvidx_snapshot_open(&whole, data, len, &damaged) != 0)
        *why = damaged;
    if (rc)
        goto out;
    *next_gen = lp->r.next_generation;
    *nkeys = lp->r.nkeys;
    *nlayouts = lp->r.nlayouts;
out:
    for (int i = 0; lp && i < NBUF; i++)
        free(lp->buf[i].items);
    free(lp);
    if (len)
        munmap((void *)data, len);
    return rc;
}

static int snapshot_load(struct persist *p, uint64_t *next_gen, uint64_t *nkeys, uint64_t *nlayouts)
{
    char path[PATHN];
    path_of(p, path, sizeof(path), SNAPSHOT_FILE);
    const char *why = NULL;
    int rc = persist_load_snapshot(path, p->app->keystore->idx, p->app->layouts, next_gen, nkeys,
                                   nlayouts, &why);
    if (rc == 1)
        return 0;
    if (rc == 0)
        return 0;
    log_error("refusing to start: the snapshot %s is not usable: %s. Move it away to start "
              "from the journals alone (keys it held would be lost).",
              path, why ? why : kvidx_err_title(rc));
    return KVIDX_EINTERNAL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Lists the journal generations in the directory, sorted. */
static int list_journals(struct persist *p, uint64_t **gens, size_t *n)
{
    DIR *d = opendir(p->dir);
    if (!d)
        return -1;
    size_t cap = 16;
    *n = 0;
    *gens = malloc(cap * sizeof(**gens));
    struct dirent *e;
    while (*gens && (e = readdir(d))) {
        unsigned long long g;
        char name[64];
        if (sscanf(e->d_name, "journal-%16llx.kvj", &g) != 1)
            continue;
        journal_name(g, name, sizeof(name));
        if (strcmp(name, e->d_name) != 0)
            continue;
        if (*n == cap) {
            uint64_t *ng = realloc(*gens, 2 * cap * sizeof(**gens));
            if (!ng)
                break;
            *gens = ng;
            cap *= 2;
        }
        (*gens)[(*n)++] = g;
    }
    closedir(d);
    if (!*gens)
        return -1;
    qsort(*gens, *n, sizeof(**gens), cmp_u64);
    return 0;
}

/* Replays one journal; truncates a torn or corrupt tail. Adds its records
 * to *nrec and its kept length to *bytes. */
static int journal_replay(struct persist *p, uint64_t gen, uint64_t *nrec, uint64_t *bytes)
{
    char name[64], path[PATHN];
    journal_name(gen, name, sizeof(name));
    path_of(p, path, sizeof(path), name);
    uint8_t *data = NULL;
    size_t len = 0;
    if (read_file(path, &data, &len) != 0) {
        log_error("refusing to start: cannot read %s: %s", path, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    uint64_t hg = 0;
    size_t off = KVIDX_JOURNAL_HEADER_LEN;
    if (kvidx_journal_header_decode(data, len, &hg) != 0 || hg != gen) {
        /* Journals are created atomically (temp, fsync, rename), so a bad
         * header is damage, not a torn write: the file holds nothing we
         * can trust. */
        log_warn("journal %s: bad header; ignoring its %zu bytes (renamed to .bad)", path, len);
        char bad[PATHN + 8];
        snprintf(bad, sizeof(bad), "%s.bad", path);
        if (rename(path, bad) != 0 || fsync_dir(p->dir) != 0)
            log_warn("journal %s: cannot set it aside: %s (ignored again at the next start)", path,
                     strerror(errno));
        free(data);
        return 0;
    }
    kvidx_index_t *idx = p->app->keystore->idx;
    kvidx_jrec_t rec;
    int rc;
    while ((rc = kvidx_journal_next(data, len, &off, &rec)) == 1) {
        if (rec.type == KVIDX_JREC_KEY) {
            if (apply_state(idx, &rec.key, rec.size_bytes, rec.tiers, 1) != 0)
                log_warn("journal %s: a record at byte %zu could not be applied (capacity?)", path,
                         off);
        } else if (rec.type == KVIDX_JREC_LAYOUT_PUT) {
            if (layouts_restore(p->app->layouts, (const char *)rec.blob, rec.blob_len) != 0)
                log_warn("journal %s: a layout record at byte %zu does not parse", path, off);
        } else if (rec.type == KVIDX_JREC_LAYOUT_DEL) {
            layouts_forget(p->app->layouts, rec.key.model, rec.key.model_len, rec.world_size);
        }
        (*nrec)++;
    }
    if (rc < 0) {
        log_warn("journal %s: torn or corrupt record at byte %zu of %zu; truncating it there "
                 "(the %zu bytes after it are dropped)",
                 path, off, len, len - off);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)off) != 0 || fsync(fd) != 0 || fsync_dir(p->dir) != 0) {
            log_error("refusing to start: cannot truncate %s: %s", path, strerror(errno));
            if (fd >= 0)
                close(fd);
            free(data);
            return KVIDX_EINTERNAL;
        }
        close(fd);
    }
    *bytes += off;
    free(data);
    return 0;
}

/* Removes every *.tmp in the directory (start only, under the lock). */
static void remove_tmp_files(struct persist *p)
{
    DIR *d = opendir(p->dir);
    if (!d)
        return;
    struct dirent *e;
    int removed = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".tmp") == 0) {
            char path[PATHN];
            path_of(p, path, sizeof(path), e->d_name);
            if (unlink(path) == 0)
                removed++;
        }
    }
    closedir(d);
    if (removed)
        fsync_dir(p->dir);
}

/* Takes data_dir/lock (flock, exclusive, not waiting): one kvidxd a
 * directory. 0, or KVIDX_EINTERNAL (logged). */
static int lock_dir(struct persist *p)
{
    char path[PATHN];
    path_of(p, path, sizeof(path), LOCK_FILE);
    p->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (p->lock_fd < 0) {
        log_error("refusing to start: cannot open %s: %s", path, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    if (flock(p->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            log_error("refusing to start: data_dir %s is in use by another kvidxd (%s is locked)",
                      p->dir, path);
        else
            log_error("refusing to start: cannot lock %s: %s", path, strerror(errno));
        return KVIDX_EINTERNAL;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int persist_open(struct app *app)
{
    if (!app->cfg.data_dir[0])
        return 0;
    struct persist *p = calloc(1, sizeof(*p));
    if (!p)
        return KVIDX_ENOMEM;
    p->app = app;
    p->fd = -1;
    p->lock_fd = -1;
    p->policy = app->cfg.fsync;
    snprintf(p->dir, sizeof(p->dir), "%s", app->cfg.data_dir);
    buf_init(&p->stage);
    buf_init(&p->capture);
    buf_init(&p->pending);
    double t0 = now_s();
    uint64_t *gens = NULL;
    size_t ngens = 0;
    int rc = KVIDX_EINTERNAL;

    if (mkdir(p->dir, 0700) != 0 && errno != EEXIST) {
        log_error("refusing to start: cannot create data_dir %s: %s", p->dir, strerror(errno));
        goto fail;
    }
    if (access(p->dir, R_OK | W_OK | X_OK) != 0) {
        log_error("refusing to start: data_dir %s is not usable: %s", p->dir, strerror(errno));
        goto fail;
    }
    /* Nothing in the directory is read or changed before the lock is held:
     * restore truncates torn tails and deletes files, which must never
     * happen under a running daemon. */
    if ((rc = lock_dir(p)) != 0)
        goto fail;
    if ((rc = secret_load(p)) != 0)
        goto fail;
    uint64_t next_gen = 0, nkeys = 0, nlayouts = 0;
    if ((rc = snapshot_load(p, &next_gen, &nkeys, &nlayouts)) != 0)
        goto fail;
    double t1 = now_s();
    if (list_journals(p, &gens, &ngens) != 0) {
        log_error("refusing to start: cannot list data_dir %s: %s", p->dir, strerror(errno));
        rc = KVIDX_EINTERNAL;
        goto fail;
    }
    uint64_t nrec = 0, max_gen = next_gen ? next_gen - 1 : 0;
    size_t replayed = 0;
    for (size_t i = 0; i < ngens; i++) {
        if (gens[i] > max_gen)
            max_gen = gens[i];
        if (gens[i] < next_gen)
            continue;
        if ((rc = journal_replay(p, gens[i], &nrec, &p->journal_bytes)) != 0)
            goto fail;
        replayed++;
    }
    remove_tmp_files(p); /* files whose writing a crash interrupted */
    p->cur_gen = max_gen + 1;
    p->wgen = p->cur_gen;
    p->fd = journal_create(p, p->cur_gen);
    if (p->fd < 0) {
        log_error("refusing to start: cannot create a journal in %s: %s", p->dir, strerror(errno));
        rc = KVIDX_EINTERNAL;
        goto fail;
    }
    p->good_len = KVIDX_JOURNAL_HEADER_LEN;
    if (next_gen)
        delete_below(p, next_gen);
    /* Every start opens a new generation: restarts with few writes in
     * between would pile up small journals, each replayed at every start.
     * Past JOURNALS_MERGE of them, the first snapshot is due at once. */
    if (replayed >= JOURNALS_MERGE && p->journal_bytes < app->cfg.snapshot_journal_bytes) {
        log_info("%zu journals since the last snapshot: snapshotting to merge them", replayed);
        p->journal_bytes = app->cfg.snapshot_journal_bytes;
    }
    kvidx_index_stats_t st;
    kvidx_index_stats(app->keystore->idx, &st);
    double t2 = now_s();
    log_info("restored from %s: snapshot %llu keys, %llu layouts in %.3f s; %llu journal "
             "records from %zu journal(s) in %.3f s; now %llu keys; journal generation %llu, "
             "fsync=%s",
             p->dir, (unsigned long long)nkeys, (unsigned long long)nlayouts, t1 - t0,
             (unsigned long long)nrec, replayed, t2 - t1, (unsigned long long)st.keys,
             (unsigned long long)p->cur_gen,
             p->policy == FSYNC_ALWAYS     ? "always"
             : p->policy == FSYNC_EVERYSEC ? "everysec"
                                           : "no");
    free(gens);
    gens = NULL;

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
    if (uv_thread_create(&p->thread, writer_main, p) != 0) {
        log_error("refusing to start: cannot start the journal writer thread");
        app->persist = p;
        persist_stop(app);
        return KVIDX_EINTERNAL; /* persist_free after the loop closes the handles */
    }
    p->thread_started = 1;
    kvidx_index_set_change_cb(app->keystore->idx, on_change, p);
    app->persist = p;
    return 0;

fail:
    free(gens);
    if (p->fd >= 0)
        close(p->fd);
    if (p->lock_fd >= 0)
        close(p->lock_fd);
    buf_free(&p->stage);
    buf_free(&p->pending);
    free(p);
    return rc ? rc : KVIDX_EINTERNAL;
}

void persist_stop(struct app *app)
{
    struct persist *p = app->persist;
    if (!p || !p->handles_open)
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

void persist_free(struct app *app)
{
    struct persist *p = app->persist;
    if (!p)
        return;
    if (app->keystore)
        kvidx_index_set_change_cb(app->keystore->idx, NULL, NULL);
    if (hand_over(p) != 0)
        log_error("shutdown: out of memory handing the last %zu journal bytes to the writer; "
                  "the last changes are lost",
                  p->stage.len);
    if (p->thread_started) {
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
    if (p->child > 0) {
        kill(p->child, SIGKILL);
        waitpid(p->child, NULL, 0);
        char tmp[PATHN];
        path_of(p, tmp, sizeof(tmp), SNAPSHOT_TMP);
        unlink(tmp);
    }
    if (p->fd >= 0)
        close(p->fd);
    if (p->lock_fd >= 0)
        close(p->lock_fd); /* releases the lock */
    uv_mutex_destroy(&p->mu);
    uv_cond_destroy(&p->cv);
    buf_free(&p->stage);
    buf_free(&p->capture);
    buf_free(&p->pending);
    free(p);
    app->persist = NULL;
}
