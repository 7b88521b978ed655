/*
 * The journal: records encoded on the loop thread, written by one writer
 * thread.
 *
 * Loop side: each change is encoded as a STATE record (kvidx/journal.h)
 * at the end of `stage`; consecutive key changes of one namespace share a
 * KEYS record, which stays open (no checksum yet) while it grows and is
 * closed before anything else is staged after it and before the stage
 * leaves the loop thread. The records of one write request are framed by
 * BEGIN and COMMIT (a request that made fewer than two changes has no
 * frame), so that a replay takes a request whole or not at all. A
 * uv_prepare handle moves the stage to `pending` once per loop turn and
 * wakes the writer (usually a buffer swap, no copy).
 *
 * Writer thread: appends pending to the current journal with write() and,
 * under fsync=always, fdatasync()s before it reports the new durable
 * position through a uv_async (group commit: one fsync covers every
 * request of the turns it took). Under everysec a 1 s timer asks for an
 * fsync; under no the kernel decides. fsync never runs on the loop thread.
 * On request it rotates to a new generation at an exact position and
 * deletes the journals a finished snapshot covers.
 *
 * Positions are byte counts over the life of the process (`seq`): a
 * request's records end at appended_seq when its handler returns; it is
 * durable once durable_seq reaches that point.
 *
 * Failure: when write or fsync fails the writer truncates the journal back
 * to the last good length, reports `failing`, and retries the same bytes
 * every second until it succeeds; then it reports the journal writable
 * again. Nothing encoded is ever dropped while the process lives, and a
 * position never counts bytes that were not encoded.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "util/log.h"

#include "kvidx/err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Attempts at writing what is left, at shutdown, while the journal fails. */
#define STOP_ATTEMPTS 3

/* ---- loop side ---- */

void key_rec(kvidx_jrec_t *r, const kvidx_key_t *key, const kvidx_durable_t *st)
{
    memset(r, 0, sizeof(*r));
    r->type = KVIDX_JREC_KEY;
    r->key = *key;
    r->size_bytes = st->size_bytes;
    r->tiers = (uint8_t)st->tiers;
}

void layout_rec(kvidx_jrec_t *r, const char *model, size_t model_len, uint8_t world_size,
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

int encode_rec(struct buf *b, const kvidx_jrec_t *r)
{
    size_t n = kvidx_jrec_size(r), len = 0;
    if (!n)
        return KVIDX_EINVAL;
    if (buf_reserve(b, n) != 0)
        return KVIDX_ENOMEM;
    kvidx_jrec_encode(r, (uint8_t *)b->data + b->len, n, &len);
    b->len += len;
    return 0;
}

/* The framed size of a BEGIN or COMMIT. */
#define MARKER_LEN (KVIDX_JREC_HDR_LEN + 1)

/* Writes the open KEYS record's checksum: it is whole from now on. */
static void keys_close(struct persist *p)
{
    if (!p->keys_open)
        return;
    kvidx_jkeys_close((uint8_t *)p->stage.data + p->keys_at);
    p->keys_open = 0;
}

/* The most bytes a state adds to a KEYS record. */
#define STATE_MAX (KVIDX_JKEYS_STATE_FIXED + KVIDX_HASH_MAX)

/* Stages the KEY record *r: into the open KEYS record when it can join
 * it, else as a new KEYS record, left open. Makes room for extra bytes
 * more. 0, or KVIDX_EINVAL / KVIDX_ENOMEM with nothing staged (an open
 * record stays open and whole). */
static int stage_key(struct persist *p, const kvidx_jrec_t *r, size_t extra)
{
    struct buf *b = &p->stage;
    if (p->keys_open) {
        /* Room for the largest state first, so that the namespace is
         * checked once a key (the stage grows by doubling: this reaches
         * its next size at most a state earlier than the exact size). */
        if (buf_reserve(b, STATE_MAX + extra) != 0)
            return KVIDX_ENOMEM;
        size_t n = kvidx_jkeys_add((uint8_t *)b->data + p->keys_at, r);
        if (n) {
            b->len += n;
            return 0;
        }
        keys_close(p);
    }
    size_t n = kvidx_jkeys_size(r), len = 0;
    if (!n)
        return KVIDX_EINVAL;
    if (buf_reserve(b, n + extra) != 0)
        return KVIDX_ENOMEM;
    kvidx_jkeys_begin(r, (uint8_t *)b->data + b->len, n, &len);
    p->keys_open = 1;
    p->keys_at = b->len;
    b->len += len;
    return 0;
}

void append_rec(struct persist *p, const kvidx_jrec_t *r)
{
    size_t before = p->stage.len;
    /* Inside a group each record also makes room for the COMMIT, so that
     * closing the group can never fail: a group without its COMMIT would
     * read as a torn tail at restore. */
    int grouped = p->group_open && r->type != KVIDX_JREC_COMMIT;
    int rc;
    if (r->type == KVIDX_JREC_KEY) {
        rc = stage_key(p, r, grouped ? MARKER_LEN : 0);
    } else {
        keys_close(p);
        size_t need = kvidx_jrec_size(r);
        rc = grouped && need && buf_reserve(&p->stage, need + MARKER_LEN) != 0
                 ? KVIDX_ENOMEM
                 : encode_rec(&p->stage, r);
    }
    if (rc != 0) {
        /* The journal misses this change. Refuse writes
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
    p->appended_seq += p->stage.len - before;
    p->journal_bytes += p->stage.len - before;
    if (p->group_open && r->type != KVIDX_JREC_BEGIN && r->type != KVIDX_JREC_COMMIT)
        p->group_recs++;
}

static void marker_rec(kvidx_jrec_t *r, kvidx_jrec_type_t type)
{
    memset(r, 0, sizeof(*r));
    r->type = type;
}

int group_open(struct persist *p)
{
    group_close(p);
    kvidx_jrec_t r;
    marker_rec(&r, KVIDX_JREC_BEGIN);
    size_t at = p->stage.len;
    /* The BEGIN with room for the COMMIT after it. */
    if (buf_reserve(&p->stage, 2 * MARKER_LEN) != 0) {
        p->stage.failed = 0; /* nothing was written: the stage is intact */
        return KVIDX_ENOMEM;
    }
    append_rec(p, &r);
    if (p->stage.len == at)
        return KVIDX_ENOMEM;
    p->group_open = 1;
    p->group_at = at;
    p->group_recs = 0;
    return 0;
}

void group_close(struct persist *p)
{
    if (!p->group_open)
        return;
    keys_close(p);
    p->group_open = 0;
    if (p->group_recs >= 2) {
        kvidx_jrec_t r;
        marker_rec(&r, KVIDX_JREC_COMMIT);
        append_rec(p, &r); /* cannot fail: every record of the group made room */
        return;
    }
    /* No record, or one (whole by itself): the BEGIN goes back out. */
    size_t n = MARKER_LEN;
    char *at = p->stage.data + p->group_at;
    memmove(at, at + n, p->stage.len - p->group_at - n);
    p->stage.len -= n;
    p->appended_seq -= n;
    p->journal_bytes -= n;
}

/* Out of memory: the bytes stay in the stage (nothing is dropped,
 * positions stay right), writes are refused while it lasts (p->stalled)
 * and the next loop turn tries again (the reap timer turns the loop at
 * least every 100 ms). */
int hand_over(struct persist *p)
{
    group_close(p);
    keys_close(p); /* one staged outside a group */
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
        rc = KVIDX_ENOMEM;
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
        return rc;
    }
    buf_reset(&p->stage);
    if (p->stalled)
        log_info("journal: records handed to the writer again; accepting writes");
    p->stalled = 0;
    return 0;
}

void on_prepare(uv_prepare_t *h)
{
    struct persist *p = h->data;
    /* Handlers are synchronous: no request is being handled now (one that
     * answered an error without persist_ack left its capture on). */
    p->capturing = 0;
    hand_over(p);
}

void on_everysec(uv_timer_t *t)
{
    struct persist *p = t->data;
    uv_mutex_lock(&p->mu);
    p->sync_req = 1;
    uv_cond_signal(&p->cv);
    uv_mutex_unlock(&p->mu);
}

/* ---- the writer thread ---- */

/* After persist_stop the async handle is closed (and the loop may be
 * gone), so nothing is sent. */
void notify_loop(struct persist *p)
{
    if (p->async_open)
        uv_async_send(&p->async);
}

/* Reports the journal failing; mu held. The first message is kept. */
static void fail_locked(struct persist *p, const char *msg)
{
    if (!p->failing)
        snprintf(p->fail_msg, sizeof(p->fail_msg), "%s", msg);
    p->failing = 1;
    notify_loop(p);
}

static void writer_fail(struct persist *p, const char *msg)
{
    uv_mutex_lock(&p->mu);
    fail_locked(p, msg);
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

/* Takes pending into work, up to the rotation point if one is set; mu
 * held, work empty. Out of memory (a partial take needs a copy): the bytes
 * stay in pending and the positions where they are; the journal counts as
 * failing and the take is retried in a second. */
static int take_pending(struct persist *p, struct buf *work, uint64_t *work_end)
{
    size_t take = p->pending.len;
    if (p->rot_gen && p->rot_seq >= p->pending_start && p->rot_seq - p->pending_start < take)
        take = (size_t)(p->rot_seq - p->pending_start);
    if (!take)
        return 0;
    if (take == p->pending.len) {
        /* All of it: swap the buffers (work is empty), no copy. */
        struct buf t = *work;
        *work = p->pending;
        p->pending = t;
    } else if (buf_reserve(work, take) == 0) {
        buf_append(work, p->pending.data, take);
        memmove(p->pending.data, p->pending.data + take, p->pending.len - take);
        p->pending.len -= take;
    } else {
        buf_reset(work);
        fail_locked(p, "journal buffer: out of memory");
        return KVIDX_ENOMEM;
    }
    p->pending_start += take;
    *work_end = p->pending_start;
    return 0;
}

/* Writes work (and fdatasyncs when asked): 0 and work emptied, or
 * KVIDX_ESTORAGE with the journal back at its last good length and work
 * kept for the next attempt. */
static int write_work(struct persist *p, struct buf *work, int want_sync)
{
    struct why w;
    char name[64];
    journal_name(p->wgen, name, sizeof(name));
    if (work->len) {
        int rc = write_all(p->fd, work->data, work->len, name, &w);
        if (rc == 0 && want_sync && fdatasync(p->fd) != 0) {
            sync_failed(p);
            rc = why_errno(&w, "fdatasync", name);
        }
        if (rc != 0) {
            writer_fail(p, w.msg);
            if (ftruncate(p->fd, p->good_len) != 0)
                (void)0; /* the retry's write fails the same way */
            return KVIDX_ESTORAGE;
        }
        p->good_len += (off_t)work->len;
        buf_reset(work);
    } else if (want_sync && p->fd >= 0 && fdatasync(p->fd) != 0) {
        sync_failed(p);
        why_errno(&w, "fdatasync", name);
        writer_fail(p, w.msg);
        return KVIDX_ESTORAGE;
    }
    return 0;
}

/* Closes the current journal and goes on in generation p->rot_gen. */
static int rotate(struct persist *p)
{
    uv_mutex_lock(&p->mu);
    uint64_t gen = p->rot_gen;
    uv_mutex_unlock(&p->mu);
    struct why w;
    int nfd = -1;
    if (journal_create(p->dir, gen, &nfd, &w) != 0) {
        writer_fail(p, w.msg);
        return KVIDX_ESTORAGE;
    }
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
    return 0;
}

static void delete_covered(struct persist *p, uint64_t below)
{
    journals_delete_below(p->dir, below);
    uv_mutex_lock(&p->mu);
    if (p->del_below == below)
        p->del_below = 0;
    uv_mutex_unlock(&p->mu);
}

/* 1 when the writer has something to do; mu held. */
static int writer_has_work(const struct persist *p, const struct buf *work)
{
    return p->stop || p->pending.len || work->len || p->sync_req || p->failing ||
           (p->rot_gen && p->pending_start == p->rot_seq) ||
           (p->del_below && p->wgen >= p->del_below);
}

void writer_main(void *arg)
{
    struct persist *p = arg;
    struct buf work;
    buf_init(&work);
    uint64_t work_end = 0; /* seq after work's bytes */
    int stop_fails = 0;    /* failed attempts since shutdown began */
    uv_mutex_lock(&p->mu);
    for (;;) {
        while (!writer_has_work(p, &work))
            uv_cond_wait(&p->cv, &p->mu);
        if (p->failing) /* retry once a second (a tenth at shutdown) */
            uv_cond_timedwait(&p->cv, &p->mu, p->stop ? 100000000ull : 1000000000ull);
        int ok = 1;
        if (!work.len && p->pending.len)
            ok = take_pending(p, &work, &work_end) == 0;
        int want_sync = p->policy == FSYNC_ALWAYS || p->sync_req || p->stop || p->failing;
        p->sync_req = 0;
        int rot = p->rot_gen && p->pending_start == p->rot_seq && !work.len;
        int stopping = p->stop;
        uint64_t del = p->del_below;
        uv_mutex_unlock(&p->mu);

        if (ok)
            ok = write_work(p, &work, want_sync) == 0;
        if (ok && rot)
            ok = rotate(p) == 0;
        if (ok && del && p->wgen >= del)
            delete_covered(p, del);

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
