/*
 * The full scan of an fs: source (fs.c states the whole design): a thread
 * reads the directory with getdents64 in 256 KiB steps and fstatat, parses
 * the .data names into keys, and hands them to the loop in batches of 4096
 * through a queue of at most four (so its memory stays bounded however
 * large the directory); the loop applies them as one resynchronisation of
 * the source's keys. Keys an inotify event looked at during the scan are
 * the event's: the batch's older view of them is dropped.
 *
 * Invariants: at most one scan thread (fs->scanning); the thread uses only
 * the queue and done flag (under fs->mu), the cancel flag and descriptors
 * of its own, never the index or the sink; the loop learns that the
 * thread ended (fs->done) only after every batch it queued, and joins it
 * before another scan can start.
 */
#include "sources/fs_int.h"

#include "state/keystore.h"
#include "util/context.h"
#include "util/log.h"

#include "kvidx/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- small helpers ---- */

int fs_is_data_name(const char *name, size_t len)
{
    return len > 5 && memcmp(name + len - 5, ".data", 5) == 0;
}

/* Whether name is a file that counts: 1 (and *size), else 0 with the
 * skip reason in *why, or -1 in *why when there is no such entry. */
int fs_stat_name(int dirfd, const char *name, uint64_t *size, int *why)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        *why = -1;
        return 0;
    }
    if (!S_ISREG(st.st_mode))
        *why = SKIP_NOT_REGULAR;
    else if (st.st_size <= 0)
        *why = SKIP_EMPTY;
    else if ((uint64_t)st.st_size > KVIDX_SIZE_MAX)
        *why = SKIP_TOO_LARGE;
    else {
        *size = (uint64_t)st.st_size;
        return 1;
    }
    return 0;
}

void fs_batch_reset(struct fs_batch *b)
{
    b->next = NULL;
    b->n = 0;
    memset(b->skipped, 0, sizeof(b->skipped));
    b->ignored = 0;
    b->nbad = 0;
    b->arena_len = 0;
}

/* Appends key k (its names copied into the batch, shared with the previous
 * key when equal, as the files of one model are). */
void fs_batch_add(struct fs_batch *b, const kvidx_key_t *k, uint64_t size)
{
    kvidx_key_t *o = &b->keys[b->n];
    const kvidx_key_t *prev = b->n ? &b->keys[b->n - 1] : NULL;
    *o = *k;
    if (prev && prev->model_len == k->model_len && memcmp(prev->model, k->model, k->model_len) == 0)
        o->model = prev->model;
    else {
        memcpy(b->arena + b->arena_len, k->model, k->model_len);
        o->model = b->arena + b->arena_len;
        b->arena_len += k->model_len;
    }
    if (!k->salt_len)
        o->salt = "";
    else if (prev && prev->salt_len == k->salt_len && memcmp(prev->salt, k->salt, k->salt_len) == 0)
        o->salt = prev->salt;
    else {
        memcpy(b->arena + b->arena_len, k->salt, k->salt_len);
        o->salt = b->arena + b->arena_len;
        b->arena_len += k->salt_len;
    }
    b->sizes[b->n++] = size;
}

static void note_bad(struct fs_batch *b, const char *name, const char *why)
{
    if (b->nbad == FS_LOG_BAD)
        return;
    snprintf(b->bad[b->nbad], sizeof(b->bad[0]), "%s", name);
    b->bad_why[b->nbad++] = why;
}

void fs_hashset_clear(struct hashset *h)
{
    if (h->n)
        memset(h->slot, 0, h->cap * sizeof(*h->slot));
    h->n = 0;
}

void fs_hashset_add(struct hashset *h, uint64_t v)
{
    v = v ? v : 1;
    if ((h->n + 1) * 2 > h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 1024;
        uint64_t *s = calloc(cap, sizeof(*s));
        if (!s)
            return; /* a key left out only lets an older scan view of it in */
        for (size_t i = 0; i < h->cap; i++) {
            if (!h->slot[i])
                continue;
            size_t j = (size_t)h->slot[i] & (cap - 1);
            while (s[j])
                j = (j + 1) & (cap - 1);
            s[j] = h->slot[i];
        }
        free(h->slot);
        h->slot = s;
        h->cap = cap;
    }
    size_t j = (size_t)v & (h->cap - 1);
    while (h->slot[j] && h->slot[j] != v)
        j = (j + 1) & (h->cap - 1);
    if (!h->slot[j]) {
        h->slot[j] = v;
        h->n++;
    }
}

int fs_hashset_has(const struct hashset *h, uint64_t v)
{
    v = v ? v : 1;
    if (!h->n)
        return 0;
    for (size_t j = (size_t)v & (h->cap - 1); h->slot[j]; j = (j + 1) & (h->cap - 1))
        if (h->slot[j] == v)
            return 1;
    return 0;
}

kvidx_index_t *fs_idx(const struct fs_source *fs)
{
    return fs->base.app->keystore->idx;
}

/* ---- the scan thread ---- */

/* A spare batch, or a new one; NULL when out of memory. */
static struct fs_batch *batch_get(struct fs_source *fs)
{
    uv_mutex_lock(&fs->mu);
    struct fs_batch *b = fs->spare;
    if (b)
        fs->spare = b->next;
    uv_mutex_unlock(&fs->mu);
    if (!b)
        b = malloc(sizeof(*b));
    if (b)
        fs_batch_reset(b);
    return b;
}

/* Queues b for the loop; waits while the queue is full (the last batch of
 * a scan, last = 1, does not wait: the queue holds one more). Returns 0,
 * or -1 when the scan is cancelled (b went back to the spares). */
static int batch_push(struct fs_source *fs, struct fs_batch *b, int last)
{
    for (uint64_t left = fs->scan_delay_ms; left && !atomic_load(&fs->cancel);) {
        uint64_t step = left < 10 ? left : 10;
        uv_sleep((unsigned)step);
        left -= step;
    }
    uv_mutex_lock(&fs->mu);
    while (!last && fs->nq >= FS_QUEUE_MAX && !atomic_load(&fs->cancel))
        uv_cond_wait(&fs->cv, &fs->mu);
    if (atomic_load(&fs->cancel)) {
        b->next = fs->spare;
        fs->spare = b;
        uv_mutex_unlock(&fs->mu);
        return -1;
    }
    if (fs->q_tail)
        fs->q_tail->next = b;
    else
        fs->q = b;
    fs->q_tail = b;
    fs->nq++;
    uv_mutex_unlock(&fs->mu);
    uv_async_send(&fs->async);
    return 0;
}

/* One directory entry into batch b. */
static void scan_entry(int fd, const struct dirent64_rec *d, struct fs_batch *b, char *model)
{
    const char *name = d->d_name;
    size_t len = strlen(name);
    if (!fs_is_data_name(name, len)) {
        if (strcmp(name, ".") != 0 && strcmp(name, "..") != 0)
            b->ignored++;
        return;
    }
    if (d->d_type != DT_UNKNOWN && d->d_type != DT_REG) {
        b->skipped[SKIP_NOT_REGULAR]++;
        return;
    }
    kvidx_key_t k;
    kvidx_reason_t why;
    if (kvidx_key_parse_fs(name, len, &k, model, &why) != 0) {
        b->skipped[SKIP_BAD_NAME]++;
        note_bad(b, name, why.rule);
        return;
    }
    uint64_t size;
    int skip;
    if (fs_stat_name(fd, name, &size, &skip))
        fs_batch_add(b, &k, size);
    else if (skip >= 0)
        b->skipped[skip]++;
    /* skip < 0: removed since getdents returned it; an event says so. */
}

static void scan_main(void *arg)
{
    struct fs_source *fs = arg;
    char model[KVIDX_MODEL_MAX + 1];
    int err = 0;
    struct fs_batch *b = batch_get(fs);
    /* b is NULL only when out of memory; then so is the scan. */
    char *dents = malloc(FS_DENTS_BYTES);
    int fd = open(fs->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!b || !dents) {
        err = ENOMEM;
    } else if (fd < 0) {
        err = errno;
    } else {
        while (!atomic_load(&fs->cancel)) {
            long nr = syscall(SYS_getdents64, fd, dents, FS_DENTS_BYTES);
            if (nr < 0 && errno == EINTR)
                continue;
            if (nr <= 0) {
                err = nr < 0 ? errno : 0;
                break;
            }
            for (long off = 0; off < nr && !atomic_load(&fs->cancel);) {
                const struct dirent64_rec *d = (const void *)(dents + off);
                off += d->d_reclen;
                scan_entry(fd, d, b, model);
                if (b->n < FS_BATCH)
                    continue;
                if (batch_push(fs, b, 0) != 0) {
                    b = NULL;
                    break;
                }
                if (!(b = batch_get(fs))) {
                    err = ENOMEM;
                    break;
                }
            }
            if (!b)
                break;
        }
    }
    if (fd >= 0)
        close(fd);
    free(dents);
    if (b && batch_push(fs, b, 1) != 0)
        b = NULL;
    /* The end, after the last batch: the loop joins this thread. */
    uv_mutex_lock(&fs->mu);
    fs->done = 1;
    fs->done_err = err;
    uv_mutex_unlock(&fs->mu);
    uv_async_send(&fs->async);
}

/* ---- the loop side of a scan ---- */

void fs_start_scan(struct fs_source *fs)
{
    if (fs->stopped)
        return;
    if (fs->scanning) {
        fs->scan_again = 1;
        return;
    }
    source_resync_begin(&fs->base);
    fs_hashset_clear(&fs->touched);
    fs->scan_rc = 0;
    fs->scan_again = 0;
    fs->rewatch_after = 0;
    memset(fs->scan_skipped, 0, sizeof(fs->scan_skipped));
    fs->scan_ignored = 0;
    fs->bad_logged = 0;
    fs->done = 0;
    fs->done_err = 0;
    atomic_store(&fs->cancel, 0);
    source_set_state(&fs->base, fs->base.resyncs ? SOURCE_RESCANNING : SOURCE_SCANNING, NULL);
    if (uv_thread_create(&fs->thread, scan_main, fs) != 0) {
        source_resync_abort(&fs->base);
        fs_fail_and_retry(fs, "cannot start a scan thread");
        return;
    }
    fs->thread_on = 1;
    fs->scanning = 1;
}

static void apply_scan_batch(struct fs_source *fs, struct fs_batch *b)
{
    for (int r = 0; r < SKIP_N; r++)
        fs->scan_skipped[r] += b->skipped[r];
    fs->scan_ignored += b->ignored;
    for (size_t i = 0; i < b->nbad && fs->bad_logged < FS_LOG_BAD; i++, fs->bad_logged++)
        log_debug("l2_source %s: skipping '%s': %s", fs->base.name, b->bad[i], b->bad_why[i]);
    if (fs->scan_rc || !b->n)
        return;
    size_t n = b->n;
    if (fs->touched.n) {
        /* Keys an event looked at since the scan began are the event's. */
        kvidx_index_t *idx = fs_idx(fs);
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            if (fs_hashset_has(&fs->touched, kvidx_index_key_hash64(idx, &b->keys[i])))
                continue;
            b->keys[o] = b->keys[i];
            b->sizes[o++] = b->sizes[i];
        }
        n = o;
    }
    if (n)
        fs->scan_rc = source_put(&fs->base, b->keys, b->sizes, n);
}

void fs_update_skipped(struct fs_source *fs)
{
    uint64_t total = 0;
    for (int r = 0; r < SKIP_N; r++)
        total += fs->skipped[r];
    fs->base.skipped = total;
}

static void finish_scan(struct fs_source *fs, int err)
{
    if (fs->thread_on) {
        uv_thread_join(&fs->thread);
        fs->thread_on = 0;
    }
    fs->scanning = 0;
    if (fs->stopped)
        return;
    if (fs->rewatch_after) {
        /* The watch went away during the scan: its result is of a directory
         * that may not be the one at the path any more. */
        source_resync_abort(&fs->base);
        fs->rewatch_after = 0;
        char why[SOURCE_ERROR_MAX];
        if (fs_open_watch(fs, why, sizeof(why)) != 0)
            fs_fail_and_retry(fs, why);
        else
            fs_start_scan(fs);
        return;
    }
    if (err || fs->scan_rc) {
        source_resync_abort(&fs->base);
        char why[SOURCE_ERROR_MAX];
        if (err)
            snprintf(why, sizeof(why), "cannot read directory %.160s: %s", fs->dir, strerror(err));
        else
            snprintf(why, sizeof(why), "cannot index the scan: %s", kvidx_err_title(fs->scan_rc));
        fs_fail_and_retry(fs, why);
        return;
    }
    memcpy(fs->skipped, fs->scan_skipped, sizeof(fs->skipped));
    fs->ignored = fs->scan_ignored;
    fs_update_skipped(fs);
    source_resync_end(&fs->base);
    fs_hashset_clear(&fs->touched);
    fs->retry_ms = FS_RETRY_MIN_MS;
    if (fs->scan_again) {
        fs_start_scan(fs);
        return;
    }
    source_set_state(&fs->base, SOURCE_LIVE, NULL);
}

void fs_on_async(uv_async_t *h)
{
    struct fs_source *fs = h->data;
    uv_mutex_lock(&fs->mu);
    struct fs_batch *q = fs->q;
    fs->q = fs->q_tail = NULL;
    fs->nq = 0;
    int done = fs->done, err = fs->done_err;
    fs->done = 0;
    uv_cond_broadcast(&fs->cv);
    uv_mutex_unlock(&fs->mu);
    while (q) {
        struct fs_batch *b = q;
        q = b->next;
        if (!fs->stopped)
            apply_scan_batch(fs, b);
        uv_mutex_lock(&fs->mu);
        b->next = fs->spare;
        fs->spare = b;
        uv_mutex_unlock(&fs->mu);
    }
    /* done was read with the queue: every batch before it is applied. */
    if (done && fs->scanning)
        finish_scan(fs, err);
}
