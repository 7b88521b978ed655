/*
 * The fleet directory as persistence sees it: its changes go to the
 * journal as DIR records (kvidx/directory_codec.h's blobs), its state to
 * the snapshot as DIR records after the keys, and both come back at
 * restore through one replayer.
 *
 * Invariants: a change is journaled on the loop thread, right after the
 * directory made it and in the order it was made, so that replaying the
 * journal on the snapshot before it gives the same directory (the gate
 * makes a batch replayed twice a duplicate); a change whose blobs cannot
 * all be staged opens a gap (writes refused until the next snapshot) and
 * stops there, so a batch is never journaled with entries missing from
 * its middle; a directory change cannot be undone, so a request that made
 * one keeps it when its fsync fails.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "state/fleet.h"
#include "util/context.h"
#include "util/log.h"

#include "kvidx/directory_codec.h"
#include "kvidx/err.h"

#include <string.h>

struct emit_ctx {
    struct persist *p;
    uint64_t epoch; /* p->gap_epoch before the change */
};

static int journal_blob(void *ctx, const uint8_t *blob, size_t len)
{
    struct emit_ctx *e = ctx;
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_DIR;
    r.blob = blob;
    r.blob_len = len;
    append_rec(e->p, &r);
    /* append_rec opened a gap: the rest of this change is not written. */
    return e->p->gap_epoch != e->epoch ? KVIDX_ENOMEM : 0;
}

static void on_fleet_change(void *ctx, const kvidx_dir_change_t *c)
{
    struct persist *p = ctx;
    if (c->type == KVIDX_DIR_CHG_HEARTBEAT)
        return; /* liveness starts again at restore */
    struct emit_ctx e = {p, p->gap_epoch};
    int rc = kvidx_dir_change_encode(c, KVIDX_JREC_DIR_BLOB_MAX, journal_blob, &e);
    if (rc != 0 && p->gap_epoch == e.epoch) {
        if (!p->gap)
            log_error("journal: cannot encode a fleet directory change (%s); refusing writes "
                      "until the next snapshot",
                      kvidx_err_title(rc));
        p->gap = 1;
        p->gap_epoch++;
    }
    if (p->capturing > 0)
        p->capturing = -1; /* cannot be undone: kept if its fsync fails */
}

void fleet_watch(struct app *app, struct persist *p)
{
    if (!app->fleet)
        return;
    app->fleet->journal = p ? on_fleet_change : NULL;
    app->fleet->journal_ctx = p;
}

struct rec_ctx {
    int (*add)(void *ctx, const kvidx_jrec_t *r);
    void *ctx;
};

static int add_blob(void *ctx, const uint8_t *blob, size_t len)
{
    struct rec_ctx *rc = ctx;
    kvidx_jrec_t r;
    memset(&r, 0, sizeof(r));
    r.type = KVIDX_JREC_DIR;
    r.blob = blob;
    r.blob_len = len;
    return rc->add(rc->ctx, &r);
}

static int add_record(void *ctx, const kvidx_dir_record_t *rec)
{
    return kvidx_dir_record_encode(rec, KVIDX_JREC_DIR_BLOB_MAX, add_blob, ctx);
}

int fleet_each_record(const kvidx_directory_t *d, int (*add)(void *ctx, const kvidx_jrec_t *r),
                      void *ctx)
{
    struct rec_ctx rc = {add, ctx};
    return kvidx_directory_dump(d, add_record, &rc);
}

int fleet_replay(struct persist *p, const uint8_t *blob, size_t len)
{
    if (!p->app->fleet || !p->dir_replay)
        return 0;
    return kvidx_dir_replay_blob(p->dir_replay, p->app->fleet->dir, blob, len);
}

void fleet_replay_end(struct persist *p)
{
    kvidx_dir_replay_t *rp = p->dir_replay;
    if (rp && kvidx_dir_replay_pending(rp)) {
        rp->open = 0;
        rp->dropped++;
        log_warn("restore: a fleet event batch at the end of a journal was incomplete (never "
                 "acknowledged); dropped");
    }
}
