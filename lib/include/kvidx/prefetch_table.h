/*
 * The table of prefetch handles, their leases, the single-flight loads they
 * wait for and the load tasks that group those loads, on one index. Pure:
 * no I/O, no globals, no clock of its own. The caller passes the current
 * time (any monotonic clock in milliseconds, the same one in every call),
 * asks kvidx_pft_next_deadline when to come back and calls
 * kvidx_pft_advance then; the table never changes state between calls.
 *
 * What the table keeps:
 *   - handles, named by ids 1, 2, ... (after first_id) that are never
 *     reused. A handle is live (pending or completed) until its lease ends
 *     (expired) or it is released (DELETE, or a release of its last pin).
 *     An ended handle is remembered for the grace period, then forgotten:
 *     kvidx_pft_find answers KVIDX_EHANDLEEXPIRED for an expired handle
 *     during the grace period and KVIDX_ENOTFOUND after it;
 *   - loads: one per loading L1 copy that a handle reserved, found by (ref,
 *     generation) and shared by every handle that wants that copy
 *     (single-flight). Every waiting handle pins the copy before it turns
 *     ready, so nothing can evict it in between; a load whose waiters all
 *     went away drops its copy when it finishes;
 *   - tasks: the new loads of one submit, the unit a loader works on, with
 *     a deadline after which their open loads fail. Every load belongs to
 *     exactly one task; a task is forgotten when its last load finished.
 *
 * Pins are kept by each handle's ledger (kvidx/prefetch_handle.h) and given
 * back exactly once. Running out of memory is reported as KVIDX_ENOMEM with
 * nothing changed where a function can fail; where the work is already
 * under way (a load that cannot be recorded) it counts as a failed load.
 *
 * Events: the table tells its owner through the callbacks of
 * kvidx_pft_events_t, called in the middle of a table operation. A
 * callback must not call back into the table.
 */
#ifndef KVIDX_PREFETCH_TABLE_H
#define KVIDX_PREFETCH_TABLE_H

#include "kvidx/index.h"
#include "kvidx/key.h"
#include "kvidx/prefetch_handle.h"
#include "kvidx/prefetch_plan.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvidx_pft kvidx_pft_t;
struct kvidx_pft_load;

/* Cumulative figures the table counts (and reports through count()). */
typedef enum kvidx_pft_counter {
    KVIDX_PFT_PREFETCHES = 0,      /* handles created */
    KVIDX_PFT_LOADS = 1,           /* loads started */
    KVIDX_PFT_LOADS_COMPLETED = 2, /* loads finished with the bytes in L1 */
    KVIDX_PFT_LOAD_FAILURES = 3,   /* loads that failed, or could not start */
    KVIDX_PFT_EXPIRATIONS = 4,     /* leases that ran out */
    KVIDX_PFT_COUNTERS = 5
} kvidx_pft_counter_t;

/* Timer bookkeeping of a handle or a task (private). */
typedef struct kvidx_pft_timer {
    uint64_t at;
    size_t pos;
    int kind;
} kvidx_pft_timer_t;

/* Chain link of the table's hash maps (private). */
typedef struct kvidx_pft_link {
    uint64_t key;
    struct kvidx_pft_link *next;
} kvidx_pft_link_t;

/* A handle. Read-only for the caller except udata. */
typedef struct kvidx_pft_handle {
    uint64_t id;
    kvidx_pfh_t pfh; /* status, pins, plan and result */
    int is_ipc;      /* submitted in the ipc form */
    char *ext_id;    /* the caller's request id, or NULL */
    char *owner;     /* the caller's name of who made it (kvidx_pft_submit_t), or NULL */
    uint64_t submit_wall_ms;
    uint64_t expires_at; /* the lease end while live */
    uint64_t gone_at;    /* once ended: when the handle is forgotten */
    void *udata;         /* the owner's; the table never touches it */
    /* private */
    kvidx_pft_link_t link_;
    kvidx_pft_timer_t timer_;
    struct kvidx_pft_load **wait_; /* per key: the load it waits for */
} kvidx_pft_handle_t;

/* A task: the loads one submit started. Read-only for the caller. */
typedef struct kvidx_pft_task {
    uint64_t id;
    uint64_t created_wall_ms;
    uint64_t deadline; /* when its open loads fail */
    size_t n;          /* positions 0..n-1, one load each */
    size_t open;       /* loads not finished yet (> 0 while the task exists) */
    /* private */
    kvidx_pft_link_t link_;
    kvidx_pft_timer_t timer_;
    struct kvidx_pft_load **loads_; /* per position; NULL once finished */
    struct kvidx_pft_task *next_, *prev_;
} kvidx_pft_task_t;

typedef struct kvidx_pft_events {
    void *ctx;
    /* h left pending (completed), or ended (released or expired). */
    void (*changed)(void *ctx, kvidx_pft_handle_t *h);
    /* h is forgotten: it is freed when this returns. */
    void (*gone)(void *ctx, kvidx_pft_handle_t *h);
    /* A counter grew by d. */
    void (*count)(void *ctx, kvidx_pft_counter_t c, uint64_t d);
} kvidx_pft_events_t;

/* Creates a table on idx (borrowed: it must outlive the table). Handle ids
 * start after first_id. ev (copied; any callback may be NULL) may be NULL.
 * The grace period and the load timeout start at 0; see kvidx_pft_set_times.
 * Returns 0 or KVIDX_ENOMEM. */
int kvidx_pft_new(kvidx_pft_t **out, kvidx_index_t *idx, const kvidx_pft_events_t *ev,
                  uint64_t first_id);

/* Ends every handle as released and forgets it (gone), fails every load in
 * flight, then frees the table. Every pin goes back to the index. NULL is
 * fine. */
void kvidx_pft_free(kvidx_pft_t *t);

/* The same as kvidx_pft_free's first part, leaving an empty table that
 * still works. */
void kvidx_pft_shutdown(kvidx_pft_t *t);

/* How long an ended handle is remembered, and how long a task's loads may
 * take; used from the next handle that ends and the next task made. */
void kvidx_pft_set_times(kvidx_pft_t *t, uint64_t grace_ms, uint64_t load_timeout_ms);

typedef struct kvidx_pft_submit {
    const kvidx_key_t *keys; /* borrowed */
    size_t n;
    kvidx_prefetch_mode_t mode;
    kvidx_trim_policy_t policy;
    uint32_t extra;                /* extra readers (LOOKUP), 0..127 */
    const kvidx_fold_shape_t *ipc; /* the ipc form's shape, or NULL (copied) */
    const char *ext_id;            /* copied; NULL for none */
    const char *owner;             /* copied; NULL for none; the table never reads it */
    uint64_t lease_ms;
    int temporary;           /* LOOKUP's new L1 copies are temporary */
    uint64_t submit_wall_ms; /* reported back, not used */
} kvidx_pft_submit_t;

/* Creates a handle at time now: probes and plans its keys, pins LOOKUP's
 * planned L1 hits, makes WARM's hits permanent, then reserves an L1 copy
 * and starts a load for every planned L2 key (or joins the load in flight
 * for that copy). The new loads form one task (*task_id, 0 when none);
 * a key whose load cannot start is a failed load. The handle completes at
 * once when it waits for nothing. *out stays valid until the handle is
 * gone. Returns 0, KVIDX_EINVAL (bad mode, policy, extra or shape) or
 * KVIDX_ENOMEM; on error nothing changed. */
int kvidx_pft_submit(kvidx_pft_t *t, const kvidx_pft_submit_t *s, uint64_t now,
                     kvidx_pft_handle_t **out, uint64_t *task_id);

/* The handle named id: 0 with *out, KVIDX_EHANDLEEXPIRED with *out for an
 * expired handle still remembered, KVIDX_ENOTFOUND (and *out NULL) for an
 * id that names no handle, or no more. */
int kvidx_pft_find(const kvidx_pft_t *t, uint64_t id, kvidx_pft_handle_t **out);

/* Ends the live handle id as released at time now (every pin goes back,
 * loads are no longer waited for). Idempotent: 0 for any id from 1 to the
 * last one issued (the handle may be ended or forgotten already, or be from
 * before first_id), KVIDX_ENOTFOUND for 0 and ids not issued yet. */
int kvidx_pft_delete(kvidx_pft_t *t, uint64_t id, uint64_t now);

/* kvidx_pfh_release on h's ledger at time now; when the last pin went, h is
 * released. Same returns as kvidx_pfh_release. */
int kvidx_pft_release(kvidx_pft_t *t, kvidx_pft_handle_t *h, uint64_t now, const uint32_t *indices,
                      size_t n, size_t *bad);

/* Moves the lease end of live handle h to now + lease_ms. KVIDX_ECONFLICT
 * for a released handle, KVIDX_EHANDLEEXPIRED for an expired one. */
int kvidx_pft_extend(kvidx_pft_t *t, kvidx_pft_handle_t *h, uint64_t now, uint64_t lease_ms);

/* kvidx_pfh_refresh of h's ledger on the table's index: pins whose copy
 * was force-deleted are counted as lost. */
void kvidx_pft_refresh(const kvidx_pft_t *t, kvidx_pft_handle_t *h);

/* The earliest time at which kvidx_pft_advance has something to do: 0 with
 * *at, or KVIDX_ENOTFOUND when nothing waits for a time. */
int kvidx_pft_next_deadline(const kvidx_pft_t *t, uint64_t *at);

/* Does what is due at time now: ends live handles whose lease ran out
 * (expired), forgets ended handles whose grace period is over, fails the
 * open loads of tasks past their deadline. */
void kvidx_pft_advance(kvidx_pft_t *t, uint64_t now);

/* Tasks, oldest first. */
const kvidx_pft_task_t *kvidx_pft_task_first(const kvidx_pft_t *t);
const kvidx_pft_task_t *kvidx_pft_task_next(const kvidx_pft_task_t *task);
/* The task named id, or NULL (finished or never made). */
const kvidx_pft_task_t *kvidx_pft_task_find(const kvidx_pft_t *t, uint64_t id);
/* The key ref of the open load at position pos: 0, or KVIDX_ENOTFOUND when
 * pos is out of range or that load finished. */
int kvidx_pft_task_ref(const kvidx_pft_task_t *task, size_t pos, kvidx_ref_t *ref);

/* Finishes the open load at position pos of task task_id: ok says whether
 * the loader put the bytes in L1. Waiting handles pin the copy, then it
 * turns ready (or is dropped: failed, or nobody waits any more); handles
 * that wait for nothing more complete. The task is forgotten with its last
 * load. 0, or KVIDX_ENOTFOUND (no such task, or that load is not open). */
int kvidx_pft_task_finish(kvidx_pft_t *t, uint64_t task_id, size_t pos, int ok);

typedef struct kvidx_pft_stats {
    uint64_t handles;         /* remembered, any status */
    uint64_t handles_pending; /* waiting for loads */
    uint64_t pins;            /* held by handles, summed */
    uint64_t loads;           /* in flight */
    uint64_t tasks;           /* not finished */
    uint64_t counters[KVIDX_PFT_COUNTERS];
} kvidx_pft_stats_t;

/* Figures of the table (sums over its handles: not for a hot path). */
void kvidx_pft_stats(const kvidx_pft_t *t, kvidx_pft_stats_t *out);

/* Calls fn for every remembered handle, in no particular order. fn must not
 * change the table. */
void kvidx_pft_each(const kvidx_pft_t *t, void (*fn)(void *ctx, const kvidx_pft_handle_t *h),
                    void *ctx);

/* ---- the wire forms of the table's names ---- */

#define KVIDX_PFT_WAIT_MS_MAX 30000u

/* Reads a handle or task id at the start of s[0..n): canonical decimal, the
 * longest run of digits there, without a leading zero (other than "0"
 * itself), a sign or spaces, at most UINT64_MAX. 0 with *id and *used (the
 * digits read; may be NULL), or KVIDX_EINVAL. The caller decides what may
 * follow. */
int kvidx_pft_parse_id(const char *s, size_t n, uint64_t *id, size_t *used);

/* Reads the query string qs[0..n) of a long poll: the one parameter is
 * wait_ms, an integer 0..KVIDX_PFT_WAIT_MS_MAX, at most once. Names and
 * values are percent-decoded as form data. 0 with *given (1 when wait_ms was
 * there) and *ms, or KVIDX_EINVAL with *why (may be NULL) naming the
 * parameter ("query" for an unknown one: its bytes are the client's) and the
 * rule broken. */
int kvidx_pft_parse_wait(const char *qs, size_t n, int *given, uint64_t *ms, kvidx_reason_t *why);

#endif
