/*
 * Private to daemon/state/persist/: the state its files share, the
 * data_dir file helpers, and the key store as persistence sees it.
 *
 *   persist.c         open, stop, free; the hooks the write handlers call
 *   journal_writer.c  loop side of the journal (stage, hand-over) and the
 *                     writer thread (group commit, fsync policy, failure
 *                     and retry, rotation, deleting covered journals)
 *   ack.c             answers deferred until their records are durable,
 *                     and the undo of requests whose records failed
 *   snapshot.c        the fork()ed copy-on-write snapshot and its reaping
 *   restore.c         start: the checks of data_dir's files, snapshot
 *                     load, journal replay, torn tails
 *   secret.c          the page-token secret file
 *   files.c           file helpers shared by the above
 *   fleet.c           the fleet directory's journal records, snapshot records and replay
 *   store.c           the key store interface below
 *
 * Threads: fields of struct persist are grouped by who may touch them: the
 * loop thread, anyone holding mu, or the writer thread. The snapshot child
 * reads only its copy-on-write image and writes only its own files.
 *
 * Errors: every fallible function returns 0 or a negative KVIDX_E* code
 * (predicates say 1 or 0). File helpers that fail describe the failure
 * (operation, file, the system's reason) in a struct why for the caller
 * to log or keep; they log nothing.
 */
#ifndef KVIDXD_PERSIST_INT_H
#define KVIDXD_PERSIST_INT_H

#include "net/http.h"

#include "util/config.h"
#include "util/json_write.h"

#include "kvidx/directory.h"
#include "kvidx/index.h"
#include "kvidx/journal.h"
#include "kvidx/key.h"
#include "kvidx/page_token.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define SECRET_FILE   "page_token.secret"
#define SNAPSHOT_FILE "snapshot.kvs"
#define SNAPSHOT_TMP  "snapshot.tmp"
#define LOCK_FILE     "lock"

/* Journal generations, and a snapshot's next generation, stay below
 * GEN_LIMIT: a start refuses a data_dir holding one at or above it. From
 * below it, one new generation per start and per snapshot can never reach
 * the end of the 64-bit range, so generations never wrap and their order
 * is the order of the changes. */
#define GEN_LIMIT (UINT64_C(1) << 62)

#define PATHN   1400 /* data_dir (< 1024) + "/" + a file name */
#define WHY_LEN (PATHN + 200)

/* One write request whose answer waits for the fsync of its records
 * (fsync=always). On p->waiters (newest first) until the writer reports
 * them durable or failing, then on p->ready while on_async answers it. */
struct waiter {
    struct persist *p;
    struct response *res;
    uint64_t seq;    /* appended_seq after its last record */
    struct buf undo; /* KEY and layout records of the states before this request */
    int ready;       /* on p->ready (being answered), not on p->waiters */
    int keep;        /* cannot be undone: on failure its change stays, answered as is */
    /* Not 0: a record of this request could not be encoded (a gap), so
     * the journal alone does not hold it; answered once a snapshot forked
     * at a gap_epoch of at least this much is written. */
    uint64_t snap_epoch;
    struct waiter *prev, *next;
};

struct persist {
    struct app *app;
    kvidx_index_t *idx;             /* the key store, seen through the store_* functions */
    kvidx_token_keyring_t *keyring; /* the key store's page-token secrets */
    struct layouts *layouts;
    char dir[1024];
    enum fsync_policy policy;
    int lock_fd; /* data_dir/lock, record-locked for the life of the process */

    /* ---- loop thread only ---- */
    struct buf stage;       /* records encoded this loop turn */
    struct buf capture;     /* undo records of the request being handled */
    int capturing;          /* 1: capturing; -1: the capture failed; 0: off */
    uint64_t appended_seq;  /* end of everything encoded so far */
    uint64_t journal_bytes; /* since the last snapshot, incl. files kept at start */
    /* The request's group (group_open, group_close): its BEGIN sits at
     * stage offset group_at, group_recs changes were appended since (the
     * key changes of one KEYS record count one each). */
    int group_open;
    size_t group_at;
    uint64_t group_recs;
    /* An open KEYS record at stage offset keys_at (keys_open): key changes
     * of its namespace join it while it has room; closed (its checksum
     * written) by the next record of another kind or namespace, by
     * group_close and by hand_over. */
    int keys_open;
    size_t keys_at;
    /* A failed start removed its new, empty journal (drop_unused_journal:
     * before the daemon is ready, so no rotation can be pending and fd is
     * still the one restore opened). */
    int journal_dropped;
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
    pid_t child;            /* the snapshot process, or 0 */
    uint64_t child_gen;     /* next generation of the snapshot being written */
    uint64_t snap_retry_ms; /* loop time before which no snapshot starts */
    int snap_failed;        /* the last snapshot failed: retry without a new rotation */
    int gap;                /* a change could not be journaled (out of memory), or a hole */
    int hole;               /* a lost fsync may have left a hole in the current journal: the
                               next snapshot must rotate (a retry too), so that it goes */
    uint64_t gap_epoch;     /* counts such changes */
    uint64_t child_epoch;   /* gap_epoch when the running snapshot forked */
    uint64_t snap_epoch;    /* child_epoch of the last snapshot written */
    uint64_t req_epoch;     /* gap_epoch when the request being handled began */
    uint64_t cur_gen;       /* generation new records go to */
    uint64_t skipped;       /* keys restore skipped for breaking the key rules */
    struct kvidx_dir_replay *dir_replay; /* restore only: the fleet directory's replayer */
    uint64_t dir_bad;                    /* fleet directory records restore could not apply */

    /* ---- shared, under mu ---- */
    uv_mutex_t mu;
    uv_cond_t cv;
    uv_thread_t thread;
    int thread_started;
    struct buf pending;
    uint64_t pending_start; /* seq of pending.data[0] */
    uint64_t durable_seq;
    int failing;
    char fail_msg[WHY_LEN];
    int sync_req;
    int stop;
    int async_open;            /* the loop may be woken */
    size_t lost_bytes;         /* left unwritten when the writer gave up at shutdown */
    uint64_t rot_seq, rot_gen; /* rotate to rot_gen at rot_seq (rot_gen 0: none) */
    uint64_t del_below;        /* delete journals below this generation */
    int sync_lost; /* an fdatasync failed under everysec/no: bytes written before it may be
                      missing on disk, a hole later records would sit behind */

    /* ---- writer thread only (set up by restore before it starts) ---- */
    int fd;
    uint64_t wgen;
    off_t good_len;
};

/* ---- files.c ---- */

/* A failed file operation, described where it failed. */
struct why {
    char msg[WHY_LEN];
};

/* Formats "cannot <op> <path>: <strerror(errno)>" into w and maps errno:
 * KVIDX_ENOTFOUND (ENOENT), KVIDX_ENOMEM, else KVIDX_ESTORAGE. */
int why_errno(struct why *w, const char *op, const char *path);

void path_of(const char *dir, const char *name, char *out, size_t cap);
void journal_name(uint64_t gen, char *out, size_t cap);
/* 1 and *gen when name is exactly journal_name(*gen), else 0. */
int journal_name_parse(const char *name, uint64_t *gen);
/* fsync()s the directory dir. */
int fsync_dir(const char *dir, struct why *w);
/* write()s all n bytes, retrying short writes and EINTR. */
int write_all(int fd, const void *data, size_t n, const char *path, struct why *w);
/* KVIDX_EINVAL unless the open fd is a regular file; *size (when not
 * NULL) gets its size. */
int file_check_regular(int fd, const char *path, size_t *size, struct why *w);
/* Opens path read-only without ever blocking (open() of a FIFO would wait
 * for a writer), and only when it is a regular file: 0 and *fd, *size;
 * KVIDX_ENOTFOUND when it does not exist; KVIDX_EINVAL when it is not a
 * regular file; KVIDX_ESTORAGE. */
int file_open_regular(const char *path, int *fd, size_t *size, struct why *w);
/* Reads a whole regular file into *out (malloc'd; the caller frees it).
 * Errors as file_open_regular, and KVIDX_ENOMEM. */
int file_read(const char *path, uint8_t **out, size_t *len, struct why *w);
/* Writes dir/name atomically: name.tmp (mode, O_EXCL), fsync, rename,
 * fsync of dir. */
int write_atomic(const char *dir, const char *name, const void *data, size_t n, mode_t mode,
                 struct why *w);
/* Creates journal gen atomically with its header: 0 and *fd open for
 * appending. */
int journal_create(const char *dir, uint64_t gen, int *fd, struct why *w);
/* Unlinks every journal below generation below, then fsyncs dir; best
 * effort (a journal left behind is deleted at the next chance). */
void journals_delete_below(const char *dir, uint64_t below);
/* The journal generations in dir, sorted (*gens malloc'd). */
int journals_list(const char *dir, uint64_t **gens, size_t *n, struct why *w);
/* Removes every *.tmp in dir (start only, under the lock). */
void remove_tmp_files(const char *dir);

/* ---- store.c: the key store as persistence sees it ----
 * Records out: the durable state of every key, in listing order (what a
 * snapshot holds). Records in: one state at a time (journal replay, undo)
 * or a batch (snapshot restore, through the bulk loader). Persistence
 * uses nothing else of the key store. */

/* Called for each key with a durable state; a non-zero return stops the
 * walk and is returned by store_each_state. */
typedef int (*store_state_fn)(void *ctx, const kvidx_key_t *key, const kvidx_durable_t *st);
int store_each_state(kvidx_index_t *idx, store_state_fn fn, void *ctx);
/* Makes the key's durable state *st (tiers 0: gone). force: also over a
 * pinned or loading L1 copy (replay; there are no pins at start). */
int store_apply(kvidx_index_t *idx, const kvidx_key_t *key, const kvidx_durable_t *st, int force);
/* Sizes the store for nkeys more keys (before store_load). */
int store_reserve(kvidx_index_t *idx, uint64_t nkeys);
/* Loads a batch of states in listing order into an empty region of the
 * store (kvidx_index_load). KVIDX_ENOMEM, or KVIDX_EINVAL when it refuses
 * a key. */
int store_load(kvidx_index_t *idx, const kvidx_load_t *items, size_t n);
/* 1 when the key has a pinned or loading L1 copy (only a forced change
 * may touch it), else 0. */
int store_held(kvidx_index_t *idx, const kvidx_key_t *key);
/* Reports every durable change to cb (NULL: stop). */
void store_watch(kvidx_index_t *idx, kvidx_change_cb cb, void *ctx);
uint64_t store_count(kvidx_index_t *idx);

/* The key rules (kvidx_key_check_model, kvidx_key_check_salt) for keys
 * read back from disk: the index takes any bytes, but a key a request
 * could not name breaks listings (it cannot be encoded in an answer) and
 * can never be looked up or deleted. The last namespace that passed is
 * remembered, so the keys of one namespace are checked once. */
struct key_rules {
    int have;
    uint16_t model_len;
    uint8_t salt_len;
    char model[KVIDX_MODEL_MAX];
    char salt[KVIDX_SALT_MAX];
};
/* 0 when key passes, else KVIDX_EKEY with *why naming the field and rule. */
int store_key_check(struct key_rules *c, const kvidx_key_t *key, kvidx_reason_t *why);

/* ---- fleet.c: the fleet directory as persistence sees it ---- */
/* Installs (p) or removes (NULL) the journal hook of app->fleet. */
void fleet_watch(struct app *app, struct persist *p);
/* Writes the directory's state as DIR records through add (the snapshot's
 * writer): 0 or add's error. */
int fleet_each_record(const kvidx_directory_t *d, int (*add)(void *ctx, const kvidx_jrec_t *r),
                      void *ctx);
/* Applies one DIR record at restore (snapshot or journal): 0, or a
 * KVIDX_E* code (the caller decides whether that stops the start). */
int fleet_replay(struct persist *p, const uint8_t *blob, size_t len);
/* After each journal: a batch whose records stopped early is dropped. */
void fleet_replay_end(struct persist *p);

/* ---- secret.c ---- */
/* Reads data_dir's page-token secret, or creates it, and makes it the
 * key store's current page-token secret. Logs and returns
 * KVIDX_EINTERNAL when the start must stop. */
int secret_load(struct persist *p);

/* ---- restore.c ---- */
/* Loads the snapshot, replays the journals, removes temp files, creates
 * the journal new records go to (p->fd, p->cur_gen) and deletes the
 * journals the snapshot covers. Logs and returns KVIDX_EINTERNAL when the
 * start must stop. */
int restore(struct persist *p);

/* ---- journal_writer.c ---- */
void writer_main(void *arg);
/* Moves the stage to pending and wakes the writer (loop thread): 0, or
 * KVIDX_ENOMEM when the bytes stayed in the stage (writes are refused
 * until a later turn manages it). */
int hand_over(struct persist *p);
/* Encodes *r at the end of the stage (loop thread); out of memory opens a
 * gap (writes refused until a snapshot). A KEY record joins the open KEYS
 * record when it can, else starts a new one (left open for the next). */
void append_rec(struct persist *p, const kvidx_jrec_t *r);
/* A request's records are framed by BEGIN and COMMIT so that a torn tail
 * drops the request whole (loop thread). group_open closes a group still
 * open first; group_close writes the COMMIT, or, for a group of no record
 * or of one (a record is whole by itself), takes the BEGIN back out. Every
 * record appended inside a group reserves room for the COMMIT as well, so
 * that closing a group never fails. A record that cannot be encoded inside
 * a group opens a gap as anywhere else, and the COMMIT then seals what was
 * written (the gap's snapshot restores the whole state). Both
 * are no-ops when there is nothing to do; hand_over closes an open group,
 * so a group never spans two hand-overs (nor a rotation). A group counts
 * key changes, not records: a batch of two or more keys is framed even
 * when its states share one KEYS record. */
int group_open(struct persist *p); /* 0, or KVIDX_ENOMEM (nothing written) */
void group_close(struct persist *p);
/* Appends the framed *r to b: 0, KVIDX_EINVAL or KVIDX_ENOMEM. */
int encode_rec(struct buf *b, const kvidx_jrec_t *r);
void key_rec(kvidx_jrec_t *r, const kvidx_key_t *key, const kvidx_durable_t *st);
void layout_rec(kvidx_jrec_t *r, const char *model, size_t model_len, uint8_t world_size,
                const char *json, size_t json_len);
void on_prepare(uv_prepare_t *h);
void on_everysec(uv_timer_t *t);
/* Wakes the loop; mu held. */
void notify_loop(struct persist *p);

/* ---- ack.c ---- */
/* Defers res until the records encoded so far are durable; the waiter
 * takes p->capture as the request's undo log (capturing < 0: the capture
 * failed, the request cannot be undone). 0 or KVIDX_ENOMEM. */
int waiter_defer(struct persist *p, struct response *res, int capturing);
/* The writer reported progress or failure: answers what it covers. */
void on_async(uv_async_t *h);

/* ---- snapshot.c ---- */
/* Starts a snapshot when one is due and none runs (loop thread). */
void maybe_snapshot(struct persist *p);
void on_reap(uv_timer_t *t);

#endif
