/*
 * Start-up: load snapshot.kvs, replay the journals it does not cover, and
 * open the journal generation new records go to.
 *
 * The snapshot is loaded by a two-stage pipeline: a reader thread decodes
 * and checksums records into batches while the calling thread bulk-loads
 * the previous batch into the key store. A layout record ends a batch, so
 * records reach the store and the layouts in file order.
 *
 * Invariants: a snapshot is used whole or not at all: any failed check
 * (header, trailer, a record, the counts, the checksum computed while
 * reading) stops the start, and the keys loaded by then are never served.
 * Journals are replayed in generation order, each record applied as the
 * state it names (a KEYS record: each of its states, in order); a torn or
 * corrupt record ends its journal, which is truncated there (and fsynced)
 * so that later appends never sit behind garbage. A journal with a
 * damaged header is set aside as .bad. Nothing is deleted or truncated on
 * the word of a file that cannot be right: a generation at the end of its
 * range, a snapshot claiming journals it cannot cover, or anything but a
 * regular file under one of our names stops the start instead. A key that breaks the key rules is
 * skipped and counted (no request could name it), the rest of its file
 * applied.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "state/layouts.h"
#include "util/context.h"
#include "util/log.h"

#include "kvidx/directory_codec.h"
#include "kvidx/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define BATCH          16384
#define NBUF           4
#define JOURNALS_MERGE 8  /* journals replayed at a start that make a snapshot due */
#define SKIP_LOG_MAX   10 /* records of keys breaking the rules logged one by one, per file */

/* A key that breaks the key rules, skipped: logged (the first few records
 * of a file; nth numbers them), counted by the caller. bytes from..to
 * hold its record(s); a KEYS record is one entry for all its keys. */
static void log_skipped(const char *what, const char *path, size_t from, size_t to,
                        const kvidx_reason_t *why, uint64_t nth)
{
    if (nth > SKIP_LOG_MAX)
        return;
    log_warn("%s %s: the key at bytes %zu..%zu breaks the key rules (%s %s); skipped%s", what, path,
             from, to, why->field, why->rule,
             nth == SKIP_LOG_MAX ? " (further ones in this file are counted, not logged)" : "");
}

/* ---- the snapshot pipeline ---- */

typedef struct load_buf {
    kvidx_load_t *items;
    size_t n;
    int layout; /* lrec, a layout or fleet directory record, follows the items */
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
    /* the decoding stage's own */
    const char *path;
    struct persist *p; /* for the fleet directory's records; NULL: they are skipped */
    struct key_rules rules;
    uint64_t skipped; /* keys that break the key rules, left out */
} load_pipe_t;

/* Decodes the next batch: 1 if it holds something, 0 at a clean end, <0
 * on a malformed record or counts that do not match the trailer. Keys that
 * break the key rules are left out (and counted). */
static int fill_batch(load_pipe_t *lp, load_buf_t *b)
{
    kvidx_snapshot_reader_t *r = &lp->r;
    b->n = 0;
    b->layout = 0;
    kvidx_jrec_t rec;
    while (b->n < BATCH) {
        size_t at = r->off;
        int got = kvidx_snapshot_next(r, &rec);
        if (got < 0)
            return got;
        if (got == 0)
            return b->n > 0;
        if (rec.type == KVIDX_JREC_LAYOUT_PUT || rec.type == KVIDX_JREC_DIR) {
            b->lrec = rec;
            b->layout = 1;
            return 1;
        }
        kvidx_reason_t why;
        if (store_key_check(&lp->rules, &rec.key, &why) != 0) {
            log_skipped("snapshot", lp->path, at, r->off, &why, ++lp->skipped);
            continue;
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
        int got = fill_batch(lp, b);
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

/* Puts one decoded batch into the store, the layouts and the fleet
 * directory. */
static int load_batch(load_pipe_t *lp, kvidx_index_t *idx, struct layouts *layouts,
                      const load_buf_t *b, const char **why)
{
    int rc = store_load(idx, b->items, b->n);
    if (rc == KVIDX_ENOMEM) {
        *why = "out of memory";
        return rc;
    }
    if (rc != 0) {
        *why = "the index refused a key (duplicate, capacity or a bad key)";
        return KVIDX_EINVAL;
    }
    if (b->layout && b->lrec.type == KVIDX_JREC_DIR) {
        if (lp->p && fleet_replay(lp->p, b->lrec.blob, b->lrec.blob_len) != 0) {
            *why = "a fleet directory record does not load";
            return KVIDX_EINVAL;
        }
        return 0;
    }
    if (b->layout && layouts_restore(layouts, (const char *)b->lrec.blob, b->lrec.blob_len) != 0) {
        *why = "a layout record does not parse";
        return KVIDX_EINVAL;
    }
    return 0;
}

/* Both stages on this thread, alternating (no reader thread). */
static int load_unthreaded(load_pipe_t *lp, kvidx_index_t *idx, struct layouts *layouts,
                           const char **why)
{
    for (;;) {
        int got = fill_batch(lp, &lp->buf[0]);
        if (got < 0) {
            *why = lp->r.why;
            return KVIDX_EINVAL;
        }
        if (got == 0)
            return 0;
        int rc = load_batch(lp, idx, layouts, &lp->buf[0], why);
        if (rc != 0)
            return rc;
    }
}

/* The loading stage, while reader_main decodes. */
static int load_threaded(load_pipe_t *lp, kvidx_index_t *idx, struct layouts *layouts,
                         const char **why)
{
    for (;;) {
        uv_mutex_lock(&lp->mu);
        while (lp->consumed == lp->produced && !lp->eof)
            uv_cond_wait(&lp->cv, &lp->mu);
        int have = lp->consumed != lp->produced, eof = lp->eof;
        uv_mutex_unlock(&lp->mu);
        if (!have) {
            if (eof < 0) {
                *why = lp->r.why;
                return KVIDX_EINVAL;
            }
            return 0;
        }
        int rc = load_batch(lp, idx, layouts, &lp->buf[lp->consumed % NBUF], why);
        uv_mutex_lock(&lp->mu);
        lp->consumed++;
        if (rc)
            lp->stop = 1;
        uv_cond_broadcast(&lp->cv);
        uv_mutex_unlock(&lp->mu);
        if (rc)
            return rc;
    }
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
    int rc;
    if (uv_thread_create(&th, reader_main, lp) == 0) {
        rc = load_threaded(lp, idx, layouts, why);
        uv_thread_join(&th);
    } else {
        rc = load_unthreaded(lp, idx, layouts, why);
    }
    uv_cond_destroy(&lp->cv);
    uv_mutex_destroy(&lp->mu);
    return rc;
}

/* Maps path: 0 and *data, *len (munmap it when len > 0); KVIDX_ENOTFOUND
 * when it does not exist; KVIDX_EINTERNAL with *why. mmap, not read: the
 * pages come straight from the page cache, which for a multi-GB snapshot
 * saves a copy and most of the page faults. */
static int map_file(const char *path, const uint8_t **data, size_t *len, const char **why)
{
    *data = NULL;
    *len = 0;
    int fd = -1;
    size_t n = 0;
    int rc = file_open_regular(path, &fd, &n, NULL);
    if (rc == KVIDX_ENOTFOUND)
        return rc;
    if (rc == KVIDX_EINVAL) {
        *why = "it is not a regular file (a FIFO, a directory or a device)";
        return KVIDX_EINTERNAL;
    }
    if (rc != 0) {
        *why = strerror(errno);
        return KVIDX_EINTERNAL;
    }
    if (n) {
        void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (m == MAP_FAILED) {
            *why = strerror(errno);
            close(fd);
            return KVIDX_EINTERNAL;
        }
        madvise(m, n, MADV_SEQUENTIAL);
        *data = m;
    }
    close(fd);
    *len = n;
    return 0;
}

static load_pipe_t *pipe_new(void)
{
    load_pipe_t *lp = calloc(1, sizeof(*lp));
    for (int i = 0; lp && i < NBUF; i++) {
        lp->buf[i].items = malloc(BATCH * sizeof(kvidx_load_t));
        if (!lp->buf[i].items) {
            for (int j = 0; j < i; j++)
                free(lp->buf[j].items);
            free(lp);
            lp = NULL;
        }
    }
    return lp;
}

static void pipe_free(load_pipe_t *lp)
{
    for (int i = 0; lp && i < NBUF; i++)
        free(lp->buf[i].items);
    free(lp);
}

static int load_snapshot(struct persist *p, const char *path, kvidx_index_t *idx,
                         struct layouts *layouts, struct persist_snapshot_info *info,
                         const char **why);

int persist_load_snapshot(const char *path, kvidx_index_t *idx, struct layouts *layouts,
                          struct persist_snapshot_info *info, const char **why)
{
    return load_snapshot(NULL, path, idx, layouts, info, why);
}

static int load_snapshot(struct persist *p, const char *path, kvidx_index_t *idx,
                         struct layouts *layouts, struct persist_snapshot_info *info,
                         const char **why)
{
    memset(info, 0, sizeof(*info));
    *why = NULL;
    const uint8_t *data;
    size_t len;
    int rc = map_file(path, &data, &len, why);
    if (rc != 0)
        return rc;
    load_pipe_t *lp = pipe_new();
    if (!lp) {
        *why = "out of memory";
        rc = KVIDX_ENOMEM;
        goto out;
    }
    lp->path = path;
    lp->p = p;
    /* Streaming: the reader thread checksums the file as it decodes; on a
     * mismatch at the end the restore fails and the daemon refuses to
     * start, so the keys already loaded are never used. */
    if (kvidx_snapshot_open_streaming(&lp->r, data, len, why) != 0) {
        rc = KVIDX_EINVAL;
        goto out;
    }
    if (store_reserve(idx, lp->r.keys) != 0) {
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
    info->next_gen = lp->r.next_generation;
    info->keys = lp->r.nkeys - lp->skipped;
    info->layouts = lp->r.nlayouts;
    info->skipped = lp->skipped;
out:
    pipe_free(lp);
    if (len)
        munmap((void *)data, len);
    return rc;
}

/* ---- start-up ---- */

/* What restore found, for its log lines. */
struct restore_counts {
    struct persist_snapshot_info snap;
    uint64_t nrec;    /* key states and other changes replayed from journals */
    uint64_t skipped; /* journal keys skipped for breaking the key rules */
    size_t replayed;  /* journals replayed */
};

static int snapshot_load(struct persist *p, struct restore_counts *c)
{
    char path[PATHN];
    path_of(p->dir, SNAPSHOT_FILE, path, sizeof(path));
    const char *why = NULL;
    int rc = load_snapshot(p, path, p->idx, p->layouts, &c->snap, &why);
    if (rc == 0 || rc == KVIDX_ENOTFOUND)
        return 0;
    /* Running out of memory is no proof that the file is damaged: no
     * advice to move it away, which could lose its keys for nothing. */
    if (rc == KVIDX_ENOMEM) {
        log_error("refusing to start: loading the snapshot %s: %s; the file is left as it is", path,
                  why ? why : "out of memory");
        return KVIDX_ENOMEM;
    }
    log_error("refusing to start: the snapshot %s is not usable: %s. Move it away to start "
              "from the journals alone (keys it held would be lost).",
              path, why ? why : kvidx_err_title(rc));
    return KVIDX_EINTERNAL;
}

/* Journals are created atomically (temp, fsync, rename), so a bad header
 * is damage, not a torn write: the file holds nothing we can trust. */
static void set_aside(struct persist *p, const char *path, size_t len)
{
    log_warn("journal %s: bad header; ignoring its %zu bytes (renamed to .bad)", path, len);
    char bad[PATHN + 8];
    struct why w;
    snprintf(bad, sizeof(bad), "%s.bad", path);
    if (rename(path, bad) != 0)
        log_warn("journal %s: cannot set it aside: %s (ignored again at the next start)", path,
                 strerror(errno));
    else if (fsync_dir(p->dir, &w) != 0)
        log_warn("journal %s: %s (ignored again at the next start)", path, w.msg);
}

/* Cuts a journal at its first torn or corrupt record. */
static int truncate_tail(struct persist *p, const char *path, size_t off, size_t len)
{
    log_warn("journal %s: torn or corrupt record at byte %zu of %zu; truncating it there "
             "(the %zu bytes after it are dropped)",
             path, off, len, len - off);
    struct why w;
    int rc = 0;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        rc = why_errno(&w, "open for truncation", path);
    else if (ftruncate(fd, (off_t)off) != 0)
        rc = why_errno(&w, "truncate", path);
    else if (fsync(fd) != 0)
        rc = why_errno(&w, "fsync", path);
    if (fd >= 0)
        close(fd);
    if (rc == 0)
        rc = fsync_dir(p->dir, &w);
    if (rc != 0) {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    return 0;
}

/* Applies one key state read from the record at byte at. */
static void replay_key(struct persist *p, const char *path, const kvidx_jrec_t *rec, size_t at)
{
    kvidx_durable_t st = {rec->size_bytes, rec->tiers};
    if (store_apply(p->idx, &rec->key, &st, 1) != 0)
        log_warn("journal %s: a record at byte %zu could not be applied (capacity?)", path, at);
}

/* The keys of one journal skipped for breaking the key rules, and the
 * records they were in (what log_skipped numbers). */
struct skips {
    uint64_t keys;
    uint64_t records;
};

/* Applies one journal record; at is its first byte, for messages. Adds
 * the states it applied (1 for a record other than KEY or KEYS) to
 * *applied; the keys that break the key rules are skipped and counted in
 * *sk. 0, or -1 when out of memory. */
static int replay_rec(struct persist *p, const char *path, const kvidx_jrec_t *rec, size_t at,
                      size_t end, struct key_rules *rules, struct skips *sk, uint64_t *applied)
{
    kvidx_reason_t why;
    if ((rec->type == KVIDX_JREC_KEY || rec->type == KVIDX_JREC_KEYS) &&
        store_key_check(rules, &rec->key, &why) != 0) {
        /* A KEYS record's keys share its namespace: all of them go. */
        log_skipped("journal", path, at, end, &why, ++sk->records);
        sk->keys += rec->type == KVIDX_JREC_KEYS ? rec->count : 1;
        return 0;
    }
    if (rec->type == KVIDX_JREC_KEYS) {
        /* The reader checked every state of the record: none fails here. */
        kvidx_jrec_t k;
        size_t pos = 0;
        while (kvidx_jkeys_next(rec, &pos, &k) == 1) {
            replay_key(p, path, &k, at);
            ++*applied;
        }
        return 0;
    }
    ++*applied;
    if (rec->type == KVIDX_JREC_KEY) {
        replay_key(p, path, rec, at);
    } else if (rec->type == KVIDX_JREC_LAYOUT_PUT) {
        if (layouts_restore(p->layouts, (const char *)rec->blob, rec->blob_len) != 0)
            log_warn("journal %s: a layout record at byte %zu does not parse", path, at);
    } else if (rec->type == KVIDX_JREC_LAYOUT_DEL) {
        layouts_forget(p->layouts, rec->key.model, rec->key.model_len, rec->world_size);
    } else if (rec->type == KVIDX_JREC_DIR) {
        int rc = fleet_replay(p, rec->blob, rec->blob_len);
        if (rc == KVIDX_ENOMEM)
            return -1;
        if (rc != 0 && ++p->dir_bad <= 10)
            log_warn("journal %s: a fleet directory record at byte %zu could not be applied "
                     "(%s)",
                     path, at, kvidx_err_title(rc));
    }
    return 0;
}

/* Replays one journal; truncates a torn or corrupt tail. Adds its records
 * to c->nrec (those skipped to c->skipped) and its kept length to
 * p->journal_bytes. */
static int journal_replay(struct persist *p, uint64_t gen, struct restore_counts *c)
{
    char name[64], path[PATHN];
    journal_name(gen, name, sizeof(name));
    path_of(p->dir, name, path, sizeof(path));
    uint8_t *data = NULL;
    size_t len = 0;
    struct why w;
    if (file_read(path, &data, &len, &w) != 0) {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    uint64_t hg = 0;
    size_t off = KVIDX_JOURNAL_HEADER_LEN;
    int rc = 0;
    if (kvidx_journal_header_decode(data, len, &hg) != 0 || hg != gen) {
        set_aside(p, path, len);
        goto out;
    }
    kvidx_jrec_t rec;
    struct key_rules rules = {0};
    struct skips sk = {0, 0};
    size_t at = off, group_end;
    int got;
    while ((got = kvidx_journal_next(data, len, &off, &rec)) == 1) {
        int g =
            rec.type == KVIDX_JREC_BEGIN ? kvidx_journal_group_end(data, len, off, &group_end) : 1;
        if (g == 0) {
            /* A request whose COMMIT never made it: a torn tail, dropped
             * whole from its BEGIN on. */
            off = at;
            got = KVIDX_EINVAL;
            break;
        }
        if (g == 2) {
            /* A group never closed, followed by more: the writer cannot
             * leave one (closing a group cannot fail), so it is damage;
             * the group is skipped whole and the records after it kept. */
            log_warn("journal %s: a request's records at bytes %zu..%zu have no end mark; "
                     "skipped",
                     path, at, group_end);
            off = at = group_end;
            continue;
        }
        if (rec.type == KVIDX_JREC_BEGIN || rec.type == KVIDX_JREC_COMMIT) {
            at = off;
            continue;
        }
        if (replay_rec(p, path, &rec, at, off, &rules, &sk, &c->nrec) != 0) {
            log_error("refusing to start: out of memory replaying %s", path);
            rc = KVIDX_EINTERNAL;
            goto out;
        }
        at = off;
    }
    fleet_replay_end(p);
    c->skipped += sk.keys;
    if (got < 0 && (rc = truncate_tail(p, path, off, len)) != 0)
        goto out;
    p->journal_bytes += off;
out:
    free(data);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Refuses a data_dir whose generations could wrap, or whose snapshot
 * claims to cover journals it cannot have been written with: the journals
 * below its next generation would be deleted on its word. A snapshot with
 * next generation n is written after journal n was created (by the
 * rotation) and that journal is only deleted under a later snapshot, so n
 * is at most one past the newest journal; more is refused. With no journal
 * at all (a snapshot copied alone) there is nothing to delete. */
static int check_generations(const struct persist *p, uint64_t next_gen, const uint64_t *gens,
                             size_t n)
{
    char name[64];
    if (n && gens[n - 1] >= GEN_LIMIT) {
        journal_name(gens[n - 1], name, sizeof(name));
        log_error("refusing to start: journal %s/%s has generation %016llx, at the end of the "
                  "generation range (generations must stay below %016llx, so that they never "
                  "wrap). Move the file away if it does not belong in data_dir.",
                  p->dir, name, (unsigned long long)gens[n - 1], (unsigned long long)GEN_LIMIT);
        return KVIDX_EINTERNAL;
    }
    if (next_gen >= GEN_LIMIT) {
        log_error("refusing to start: the snapshot %s/%s names next generation %016llx, at the "
                  "end of the generation range (generations must stay below %016llx). Nothing "
                  "was deleted; move the snapshot away to start from the journals alone.",
                  p->dir, SNAPSHOT_FILE, (unsigned long long)next_gen,
                  (unsigned long long)GEN_LIMIT);
        return KVIDX_EINTERNAL;
    }
    if (next_gen && n && next_gen > gens[n - 1] + 1) {
        journal_name(gens[n - 1], name, sizeof(name));
        log_error("refusing to start: the snapshot %s/%s says it covers every journal below "
                  "generation %016llx, but the newest journal is %s: the snapshot was not "
                  "written with these journals. Nothing was deleted; move the snapshot or the "
                  "journals away.",
                  p->dir, SNAPSHOT_FILE, (unsigned long long)next_gen, name);
        return KVIDX_EINTERNAL;
    }
    return 0;
}

/* Replays the journals the snapshot does not cover, in order; *max_gen
 * gets the newest generation seen (or the snapshot's last). */
static int replay_all(struct persist *p, struct restore_counts *c, uint64_t *max_gen)
{
    uint64_t *gens = NULL;
    size_t ngens = 0;
    struct why w;
    if (journals_list(p->dir, &gens, &ngens, &w) != 0) {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    int rc = check_generations(p, c->snap.next_gen, gens, ngens);
    *max_gen = c->snap.next_gen ? c->snap.next_gen - 1 : 0;
    for (size_t i = 0; rc == 0 && i < ngens; i++) {
        if (gens[i] > *max_gen)
            *max_gen = gens[i];
        if (gens[i] < c->snap.next_gen)
            continue;
        if ((rc = journal_replay(p, gens[i], c)) != 0)
            break;
        c->replayed++;
    }
    free(gens);
    return rc;
}

static const char *policy_name(enum fsync_policy f)
{
    return f == FSYNC_ALWAYS ? "always" : f == FSYNC_EVERYSEC ? "everysec" : "no";
}

int restore(struct persist *p)
{
    struct restore_counts c = {0};
    double t0 = now_s();
    kvidx_dir_replay_t rp;
    kvidx_dir_replay_init(&rp, app_now_ms(p->app));
    p->dir_replay = &rp;
    int rc = snapshot_load(p, &c);
    double t1 = now_s();
    uint64_t max_gen = 0;
    if (rc == 0)
        rc = replay_all(p, &c, &max_gen);
    p->dir_replay = NULL;
    kvidx_dir_replay_free(&rp);
    if (rc != 0)
        return rc;
    if (p->dir_bad)
        log_warn("restore: %llu fleet directory records could not be applied",
                 (unsigned long long)p->dir_bad);
    remove_tmp_files(p->dir); /* files whose writing a crash interrupted */
    p->cur_gen = max_gen + 1;
    p->wgen = p->cur_gen;
    struct why w;
    if (journal_create(p->dir, p->cur_gen, &p->fd, &w) != 0) {
        log_error("refusing to start: %s", w.msg);
        return KVIDX_EINTERNAL;
    }
    p->good_len = KVIDX_JOURNAL_HEADER_LEN;
    p->skipped = c.snap.skipped + c.skipped;
    if (p->skipped)
        log_warn("restore: skipped %llu keys that break the key rules (%llu in the "
                 "snapshot, %llu in journals); no request can name such a key, so nothing a "
                 "client can reach is lost. They leave the disk with the next snapshot.",
                 (unsigned long long)p->skipped, (unsigned long long)c.snap.skipped,
                 (unsigned long long)c.skipped);
    if (c.snap.next_gen)
        journals_delete_below(p->dir, c.snap.next_gen);
    /* Every start opens a new generation: restarts with few writes in
     * between would pile up small journals, each replayed at every start.
     * Past JOURNALS_MERGE of them, the first snapshot is due at once. */
    uint64_t due = p->app->cfg.snapshot_journal_bytes;
    if (c.replayed >= JOURNALS_MERGE && p->journal_bytes < due) {
        log_info("%zu journals since the last snapshot: snapshotting to merge them", c.replayed);
        p->journal_bytes = due;
    }
    log_info("restored from %s: snapshot %llu keys, %llu layouts in %.3f s; %llu journal "
             "changes from %zu journal(s) in %.3f s; now %llu keys; journal generation %llu, "
             "fsync=%s",
             p->dir, (unsigned long long)c.snap.keys, (unsigned long long)c.snap.layouts, t1 - t0,
             (unsigned long long)c.nrec, c.replayed, now_s() - t1,
             (unsigned long long)store_count(p->idx), (unsigned long long)p->cur_gen,
             policy_name(p->policy));
    return 0;
}
