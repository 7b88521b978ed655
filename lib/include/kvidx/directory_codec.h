/*
 * Bytes for the fleet directory's persistence: its changes (the journal)
 * and its state records (the snapshot), each as one or more blobs that the
 * daemon frames as journal records of type KVIDX_JREC_DIR (kvidx/journal.h
 * adds the length and the CRC). Pure codecs: no I/O.
 *
 * Blob layout (little-endian): a kind byte, then the kind's fields;
 * strings are a length (u16, or u32 for metadata) and bytes. An ingested
 * batch is one BATCH blob (the header, the verdict, the total entry count
 * and the first entries) followed by MORE blobs until every entry is
 * written, each blob at most max_blob bytes; a duplicate or stale batch is
 * written without entries (the gate's verdict depends on the header only).
 * Heartbeats are not written: liveness starts again at restore.
 *
 * Replaying the change blobs in order, on the state the first one
 * followed, with kvidx_dir_replay, gives the same directory; state blobs
 * go through kvidx_directory_load.
 */
#ifndef KVIDX_DIRECTORY_CODEC_H
#define KVIDX_DIRECTORY_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/directory.h"

/* Called with each blob; a nonzero return stops and is returned. The blob
 * is valid during the call. */
typedef int (*kvidx_dir_emit_fn)(void *ctx, const uint8_t *blob, size_t len);

/* Encodes one change as blobs of at most max_blob bytes (>= 4096).
 * KVIDX_DIR_CHG_HEARTBEAT writes nothing. Returns 0, emit's value,
 * KVIDX_ENOMEM (the scratch), or KVIDX_EINVAL (a field the format cannot
 * hold, e.g. max_blob too small). */
int kvidx_dir_change_encode(const kvidx_dir_change_t *c, size_t max_blob, kvidx_dir_emit_fn emit,
                            void *ctx);
/* Encodes one state record (kvidx_directory_dump's) as blobs: records
 * always fit one blob of max_blob bytes except bindings and keys with very
 * many placements, which are refused with KVIDX_EINVAL (max_blob of 1 MiB
 * holds 250,000 token ids or 20,000 placements of 32-byte names). */
int kvidx_dir_record_encode(const kvidx_dir_record_t *r, size_t max_blob, kvidx_dir_emit_fn emit,
                            void *ctx);

/* Replays blobs in journal order. A batch's blobs are gathered and the
 * batch is ingested when its last entry arrives; a registration's
 * liveness starts at now_ms (the restoring process's clock); state
 * records are loaded. */
typedef struct kvidx_dir_replay {
    kvidx_dir_batch_t batch; /* the batch being gathered */
    kvidx_dir_verdict_t verdict;
    uint64_t total, have; /* entries announced and gathered */
    kvidx_dir_entry_t *entries;
    size_t entries_cap;
    uint32_t *tokens;
    size_t tokens_len, tokens_cap;
    size_t *tok_off; /* each entry's first token in tokens */
    size_t tok_off_cap;
    uint8_t *strings; /* copies of the batch's and entries' strings */
    size_t strings_len, strings_cap;
    int open; /* a batch is being gathered */
    uint64_t now_ms;
    uint64_t batches, mismatches; /* replayed, and those whose verdict differed */
    uint64_t dropped;             /* batches whose blobs stopped before their end */
} kvidx_dir_replay_t;

void kvidx_dir_replay_init(kvidx_dir_replay_t *rp, uint64_t now_ms);
void kvidx_dir_replay_free(kvidx_dir_replay_t *rp);
/* Applies one blob. A batch still gathering when another kind of blob
 * comes is dropped and counted (the journal lost its end). Returns 0;
 * KVIDX_EINVAL (malformed, or the directory refused a record);
 * KVIDX_ENOMEM (the directory unchanged, and a batch's gathering as before
 * the blob: the blob can be replayed again); KVIDX_ECONFLICT (a state
 * record that conflicts with the state). */
int kvidx_dir_replay_blob(kvidx_dir_replay_t *rp, kvidx_directory_t *d, const uint8_t *blob,
                          size_t len);
/* 1 when a batch's blobs stopped before its last entry (a torn tail: the
 * batch was never acknowledged and is dropped). */
int kvidx_dir_replay_pending(const kvidx_dir_replay_t *rp);

#endif
