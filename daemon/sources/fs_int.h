/*
 * Private header of the fs: source (sources/fs.c: the watch, events and
 * the source's ops; sources/fs_scan.c: the scan thread and the loop side
 * of a scan). fs.c's opening paragraph states what the source does and
 * the invariants these structures keep.
 */
#ifndef KVIDXD_SOURCES_FS_INT_H
#define KVIDXD_SOURCES_FS_INT_H

#include "state/sources.h"

#include "kvidx/index.h"
#include "kvidx/key.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/inotify.h>
#include <uv.h>

#define FS_BATCH        4096
#define FS_QUEUE_MAX    4
#define FS_DENTS_BYTES  (256 * 1024)
#define FS_EVENTS_BYTES (64 * 1024)
#define FS_EVENT_NAMES  (FS_EVENTS_BYTES / sizeof(struct inotify_event))
#define FS_READS_MAX    64 /* inotify reads per loop turn, so a flood cannot starve the loop */
#define FS_LOG_BAD      5  /* names that do not parse, logged at debug per scan */
#define FS_RETRY_MIN_MS 100
#define FS_MASK                                                                                    \
    (IN_CREATE | IN_CLOSE_WRITE | IN_MODIFY | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |            \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)

enum fs_skip { SKIP_BAD_NAME = 0, SKIP_EMPTY, SKIP_NOT_REGULAR, SKIP_TOO_LARGE, SKIP_N };
extern const char *const fs_skip_names[SKIP_N];

struct dirent64_rec { /* what getdents64 writes */
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Keys of one scan step (or of one round of events), with the model and
 * salt bytes they point to. */
struct fs_batch {
    struct fs_batch *next;
    size_t n;
    uint64_t skipped[SKIP_N], ignored;
    size_t nbad;
    char bad[FS_LOG_BAD][96]; /* the first names that did not parse, cut */
    const char *bad_why[FS_LOG_BAD];
    size_t arena_len;
    kvidx_key_t keys[FS_BATCH];
    uint64_t sizes[FS_BATCH];
    char arena[FS_BATCH * (KVIDX_MODEL_MAX + KVIDX_SALT_MAX)];
};

struct ev_name {
    const char *name;
    int final;
};

/* 64-bit key hashes (the index's keyed hash; 0 is stored as 1). */
struct hashset {
    uint64_t *slot;
    size_t cap, n;
};

struct fs_source {
    struct source base; /* first: the registry sees a struct source */
    char dir[PATH_MAX];
    uv_loop_t *loop;
    int ifd, wd, dirfd;
    uv_poll_t poll;
    uv_async_t async;
    uv_timer_t retry;
    int handles_on, sync_on, stopped;
    int open_handles, free_wanted; /* memory goes in the last close callback */
    uint64_t retry_ms, retry_max_ms;

    /* The scan thread and its queue (mu guards q, nq, spare, done, done_err). */
    uv_thread_t thread;
    int thread_on;
    uv_mutex_t mu;
    uv_cond_t cv;
    struct fs_batch *q, *q_tail, *spare;
    size_t nq;
    int done, done_err; /* the thread has finished; errno of a scan cut short, or 0 */
    atomic_int cancel;
    uint64_t scan_delay_ms;

    /* Loop side of a scan. */
    int scanning, scan_again, scan_rc, rewatch_after;
    uint64_t scan_skipped[SKIP_N], scan_ignored, bad_logged;
    struct hashset touched;

    /* What /v1/stats and /metrics show. */
    uint64_t skipped[SKIP_N], ignored, overflows, events, watch_lost;

    char test_overflow[256];
    struct fs_batch *evput, *evdel; /* events' puts and deletes */
    struct ev_name names[FS_EVENT_NAMES];
    char evbuf[FS_EVENTS_BYTES] __attribute__((aligned(8)));
};

/* ---- shared by fs.c and fs_scan.c ---- */

int fs_is_data_name(const char *name, size_t len);
/* Whether name in dirfd is a file that counts: 1 (and *size), else 0 with
 * the skip reason in *why, or -1 in *why when there is no such entry. */
int fs_stat_name(int dirfd, const char *name, uint64_t *size, int *why);
void fs_batch_reset(struct fs_batch *b);
/* Appends key k (its names copied into the batch, shared with the previous
 * key when equal, as the files of one model are). */
void fs_batch_add(struct fs_batch *b, const kvidx_key_t *k, uint64_t size);
void fs_hashset_clear(struct hashset *h);
void fs_hashset_add(struct hashset *h, uint64_t v);
int fs_hashset_has(const struct hashset *h, uint64_t v);
kvidx_index_t *fs_idx(const struct fs_source *fs);
void fs_update_skipped(struct fs_source *fs);

/* fs_scan.c: a full scan (a resynchronisation) on a thread; a scan asked
 * for while one runs follows it. */
void fs_start_scan(struct fs_source *fs);
/* The loop's end of the scan queue (fs->async). */
void fs_on_async(uv_async_t *h);

/* fs.c: the watch. */
int fs_open_watch(struct fs_source *fs, char *err, size_t errlen);
void fs_fail_and_retry(struct fs_source *fs, const char *why);

#endif
