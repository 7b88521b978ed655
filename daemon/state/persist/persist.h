/*
 * Persistence: snapshot + append-only journal in data_dir, warm restart,
 * and the hooks the write handlers call. See docs/persistence.md for the
 * design and lib/include/kvidx/journal.h for the file formats; the files
 * of this folder and what each owns are listed in persist_int.h.
 */
#ifndef KVIDXD_PERSIST_H
#define KVIDXD_PERSIST_H

#include "net/http.h"

#include "kvidx/directory.h"
#include "kvidx/index.h"

#include <stddef.h>
#include <stdint.h>

struct app;
struct layouts;

/* When app->cfg.data_dir is set: creates it (0700), loads or creates the
 * page-token secret, loads the snapshot, replays the journals (truncating a
 * torn tail), opens a new journal generation and starts the writer thread.
 * Needs app->keystore and app->layouts. Logs and returns KVIDX_EINTERNAL on
 * anything that must stop the start (unreadable dir, corrupt snapshot).
 * Does nothing (0) without data_dir. */
int persist_open(struct app *app);
/* Shutdown, before the last uv_run: hands the last records to the writer
 * and closes the uv handles. */
void persist_stop(struct app *app);
/* After the loop: the writer flushes and fsyncs everything and exits; a
 * snapshot child still running is killed (the journals cover its data). */
void persist_free(struct app *app);

/* Write handlers call this first: when the journal cannot be written it
 * answers 503 storage_unavailable and returns 1 (the handler returns 0 and
 * changes nothing); otherwise returns 0. */
int persist_refuse(const struct request *req, struct response *res);
/* Write handlers return this after filling res: under fsync=always, when
 * journal records are not yet on disk, defers the answer until the fsync
 * that covers them (HANDLER_ASYNC), or turns it into 503 if that fails.
 * Otherwise returns 0 (send now). */
int persist_ack(const struct request *req, struct response *res);

/* Layout registry changes (api/layouts.c). */
void persist_layout_put(struct app *app, const char *model, size_t model_len, uint8_t world_size,
                        const char *json, size_t json_len);
void persist_layout_del(struct app *app, const char *model, size_t model_len, uint8_t world_size);
/* Before a layout handler changes (model, world_size): its current
 * normalized JSON, or NULL when it has none, so that a failed write can be
 * undone. */
void persist_layout_before(struct app *app, const char *model, size_t model_len, uint8_t world_size,
                           const char *old_json);

/* The snapshot code paths on their own (the daemon and bench_persist use
 * them). persist_write_snapshot writes dir/snapshot.tmp from idx and
 * layouts, fsyncs it, renames it to dir/snapshot.kvs and fsyncs dir: 0, or
 * KVIDX_ESTORAGE (a file operation failed), KVIDX_ENOMEM or KVIDX_EINVAL
 * (a record could not be encoded), the reason logged.
 * persist_load_snapshot loads path into idx and layouts, leaving out (and
 * counting) keys that break the key rules: 0 and *info; KVIDX_ENOTFOUND
 * when the file does not exist; or another KVIDX_E* code with a static reason in *why (the
 * index may then hold part of the snapshot). */
struct persist_snapshot_info {
    uint64_t next_gen;      /* the first journal generation it does not cover */
    uint64_t keys, layouts; /* loaded */
    uint64_t skipped;       /* keys left out: they break the key rules (logged) */
};
int persist_write_snapshot(kvidx_index_t *idx, const struct layouts *layouts, const char *dir,
                           uint64_t next_gen);
/* persist_write_snapshot with the fleet directory's state too (fleet may
 * be NULL). */
int persist_write_snapshot_all(kvidx_index_t *idx, const struct layouts *layouts,
                               const kvidx_directory_t *fleet, const char *dir, uint64_t next_gen);
int persist_load_snapshot(const char *path, kvidx_index_t *idx, struct layouts *layouts,
                          struct persist_snapshot_info *info, const char **why);

#endif
