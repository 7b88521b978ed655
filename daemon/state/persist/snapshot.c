/*
 * Snapshots: the whole catalogue, the layout registry and the fleet
 * directory written to snapshot.kvs by a fork()ed child from its
 * copy-on-write image.
 *
 * When the journals since the last snapshot pass snapshot_journal_bytes
 * (or a gap must be closed), the loop asks the writer to rotate to a new
 * generation at the current position and fork()s; the child writes
 * snapshot.tmp, fsyncs it, renames it to snapshot.kvs, fsyncs the
 * directory and _exit()s. The parent reaps it on a timer and, on success,
 * asks the writer to delete the journals it covers; on failure the
 * journals stay and the snapshot is retried 10 s later.
 *
 * Invariants: a journal of generation g holds only changes made after
 * every change in generations < g; snapshot.kvs with next generation n
 * holds the state after every change in generations < n (possibly also a
 * prefix of n, after a retry: replaying it again is harmless, records are
 * idempotent states). snapshot.kvs is only replaced by a complete, fsynced
 * file, and a journal is only deleted once a durable snapshot covers it.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "util/context.h"
#include "state/fleet.h"
#include "state/layouts.h"
#include "util/log.h"

#include "kvidx/err.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define OUT_CAP       (1u << 20) /* bytes buffered between writes */
#define SNAP_RETRY_MS 10000

/* The snapshot being written: the encoder and its output buffer. */
struct snap_out {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t len;
    kvidx_snapshot_writer_t w;
    struct why why;
};

/* Makes room for need bytes, writing the buffer out when it is short. */
static int out_room(struct snap_out *o, size_t need)
{
    if (OUT_CAP - o->len >= need)
        return 0;
    int rc = write_all(o->fd, o->buf, o->len, o->path, &o->why);
    o->len = 0;
    return rc;
}

static int out_add(struct snap_out *o, const kvidx_jrec_t *r, size_t need)
{
    int rc = out_room(o, need);
    if (rc != 0)
        return rc;
    size_t n = 0;
    rc = kvidx_snapshot_add(&o->w, r, o->buf + o->len, OUT_CAP - o->len, &n);
    if (rc != 0) {
        snprintf(o->why.msg, sizeof(o->why.msg), "cannot encode a record for %s (%s)", o->path,
                 kvidx_err_name(rc));
        return rc;
    }
    o->len += n;
    return 0;
}

static int out_layouts(struct snap_out *o, const struct layouts *layouts)
{
    for (size_t i = 0;; i++) {
        const char *model, *json;
        size_t ml;
        uint8_t ws;
        if (layouts_at(layouts, i, &model, &ml, &ws, &json) != 0)
            return 0;
        kvidx_jrec_t r;
        layout_rec(&r, model, ml, ws, json, strlen(json));
        int rc = out_add(o, &r, kvidx_jrec_size(&r));
        if (rc != 0)
            return rc;
    }
}

static int out_key(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *st)
{
    kvidx_jrec_t r;
    key_rec(&r, key, st);
    return out_add(ctx, &r, KVIDX_SNAPSHOT_KEY_MAX);
}

static int out_dir(void *ctx, const kvidx_jrec_t *r)
{
    return out_add(ctx, r, kvidx_jrec_size(r));
}

/* Writes the snapshot body and trailer to o->fd and fsyncs it. */
static int out_all(struct snap_out *o, kvidx_index_t *idx, const struct layouts *layouts,
                   const kvidx_directory_t *fleet, uint64_t next_gen)
{
    kvidx_snapshot_begin(&o->w, next_gen, o->buf);
    o->len = KVIDX_SNAPSHOT_HEADER_LEN;
    int rc = out_layouts(o, layouts);
    if (rc == 0 && (rc = store_each_state(idx, out_key, o)) != 0 && !o->why.msg[0])
        snprintf(o->why.msg, sizeof(o->why.msg), "cannot walk the key store (%s)",
                 kvidx_err_title(rc));
    if (rc == 0 && fleet && (rc = fleet_each_record(fleet, out_dir, o)) != 0 && !o->why.msg[0])
        snprintf(o->why.msg, sizeof(o->why.msg), "cannot write the fleet directory (%s)",
                 kvidx_err_title(rc));
    if (rc == 0)
        rc = out_room(o, KVIDX_SNAPSHOT_TRAILER_LEN);
    if (rc != 0)
        return rc;
    kvidx_snapshot_finish(&o->w, o->buf + o->len);
    o->len += KVIDX_SNAPSHOT_TRAILER_LEN;
    rc = write_all(o->fd, o->buf, o->len, o->path, &o->why);
    if (rc == 0 && fsync(o->fd) != 0)
        rc = why_errno(&o->why, "fsync", o->path);
    return rc;
}

int persist_write_snapshot(kvidx_index_t *idx, const struct layouts *layouts, const char *dir,
                           uint64_t next_gen)
{
    return persist_write_snapshot_all(idx, layouts, NULL, dir, next_gen);
}

int persist_write_snapshot_all(kvidx_index_t *idx, const struct layouts *layouts,
                               const kvidx_directory_t *fleet, const char *dir, uint64_t next_gen)
{
    char tmp[PATHN], dst[PATHN];
    path_of(dir, SNAPSHOT_TMP, tmp, sizeof(tmp));
    path_of(dir, SNAPSHOT_FILE, dst, sizeof(dst));
    struct snap_out o = {.fd = -1, .path = tmp};
    int rc;
    o.buf = malloc(OUT_CAP);
    if (!o.buf) {
        snprintf(o.why.msg, sizeof(o.why.msg), "out of memory for the output buffer");
        rc = KVIDX_ENOMEM;
        goto out;
    }
    o.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (o.fd < 0) {
        rc = why_errno(&o.why, "create", tmp);
        goto out;
    }
    if ((rc = out_all(&o, idx, layouts, fleet, next_gen)) != 0)
        goto out;
    rc = close(o.fd);
    o.fd = -1;
    if (rc != 0) {
        rc = why_errno(&o.why, "close", tmp);
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, dst) != 0) {
        rc = why_errno(&o.why, "rename into place", dst);
        goto out;
    }
    rc = fsync_dir(dir, &o.why);
out:
    if (o.fd >= 0) {
        close(o.fd);
        unlink(tmp);
    }
    free(o.buf);
    if (rc != 0)
        log_error("snapshot: %s", o.why.msg);
    return rc;
}

/* The snapshot child: only writes files from its copy-on-write image of
 * the index and layouts, never touches the loop, and _exit()s. It dies
 * with its parent (a snapshot finishing after a restart could race the
 * new process's files) and closes every inherited descriptor (the
 * listening socket and the data_dir lock must not outlive the parent).
 * The loop's signal handlers are not its own: default dispositions,
 * nothing blocked. */
static void snapshot_child(struct persist *p, pid_t parent, uint64_t next)
{
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
    const kvidx_directory_t *fleet = p->app->fleet ? p->app->fleet->dir : NULL;
    _exit(persist_write_snapshot_all(p->idx, p->layouts, fleet, p->dir, next) ? 2 : 0);
}

/* The generation the next snapshot covers up to, asking the writer to
 * rotate there when it needs a new one: 0 and *next, or KVIDX_ECONFLICT
 * while an earlier rotation is still pending. */
static int snapshot_point(struct persist *p, uint64_t *next)
{
    uv_mutex_lock(&p->mu);
    if (p->rot_gen) {
        uv_mutex_unlock(&p->mu);
        return KVIDX_ECONFLICT;
    }
    if (p->snap_failed && !p->hole) {
        /* A retry: the generations below cur_gen are the failed
         * snapshot's, already closed. Snapshot "below cur_gen" without a
         * new generation: the image also holds a prefix of cur_gen, which
         * replay applies again on top (records are idempotent states).
         * Not after a lost fsync: cur_gen may hold the hole, and only a
         * rotation lets the snapshot delete it. */
        *next = p->cur_gen;
    } else {
        *next = p->cur_gen + 1;
        p->rot_seq = p->appended_seq;
        p->rot_gen = *next;
        uv_cond_signal(&p->cv);
    }
    uv_mutex_unlock(&p->mu);
    return 0;
}

void maybe_snapshot(struct persist *p)
{
    if (p->child > 0 || !p->handles_open || p->failing_seen ||
        (p->journal_bytes < p->app->cfg.snapshot_journal_bytes && !p->gap) ||
        uv_now(p->app->loop) < p->snap_retry_ms)
        return;
    /* Everything encoded so far goes to cur_gen; later changes to the next
     * generation. The child's image holds exactly the former. */
    uint64_t next;
    if (hand_over(p) != 0 || snapshot_point(p, &next) != 0)
        return;
    if (next > p->cur_gen)
        p->cur_gen = next;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        snapshot_child(p, parent, next);
    if (pid < 0) {
        log_warn("snapshot: fork failed (%s); retrying in 10 s", strerror(errno));
        p->snap_retry_ms = uv_now(p->app->loop) + SNAP_RETRY_MS;
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

static void snapshot_done(struct persist *p)
{
    log_info("snapshot: generation %llu written; deleting the journals it covers",
             (unsigned long long)p->child_gen);
    p->snap_failed = 0;
    /* Answers waiting for a snapshot (their journal had a gap) go now:
     * on_async collects them. */
    p->snap_epoch = p->child_epoch;
    uv_async_send(&p->async);
    if (p->gap && p->gap_epoch == p->child_epoch) {
        p->gap = 0;
        p->hole = 0; /* the snapshot rotated past it; its journals go now */
        log_info("journal: the snapshot holds every change; accepting writes again");
    }
    uv_mutex_lock(&p->mu);
    p->del_below = p->child_gen;
    uv_cond_signal(&p->cv);
    uv_mutex_unlock(&p->mu);
}

static void snapshot_failed(struct persist *p, pid_t r, int status)
{
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
    p->snap_retry_ms = uv_now(p->app->loop) + SNAP_RETRY_MS;
}

void on_reap(uv_timer_t *t)
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
    if (r > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        snapshot_done(p);
    else
        snapshot_failed(p, r, status);
}
