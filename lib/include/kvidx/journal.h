/*
 * On-disk formats of kvidx persistence (docs/persistence.md):
 * the append-only journal and the snapshot. Pure byte-buffer codecs: the
 * daemon (daemon/persist.c) does every read, write and fsync; this module
 * only encodes into caller buffers and decodes from them, so the readers can
 * be unit-tested at every byte offset and fuzzed.
 *
 * All integers are little-endian. Checksums are CRC32C (Castagnoli).
 *
 * Journal file (<data_dir>/journal-<generation, 16 hex>.kvj):
 *   header (32 B): "KVIDXJNL", u32 version, u32 flags (0), u64 generation,
 *                  u32 crc32c(bytes 0..23), u32 0
 *   records:       u32 len (payload bytes, 1..KVIDX_JREC_PAYLOAD_MAX),
 *                  u32 crc32c(len as 4 bytes LE || payload), payload
 * Version 2 adds the BEGIN and COMMIT markers around the records of one
 * request, so that a torn tail drops a request whole; version 3 adds KEYS,
 * the states of many keys of one namespace in one record. Version 1 and 2
 * journals are still read. Snapshots stay version 1.
 * Records are STATES, not operations: "key K now has tiers T and size S"
 * (tiers 0: K is gone), "layout (model, world_size) is J", "layout is
 * gone". Replaying a record twice, or a prefix of a journal, is therefore
 * always well defined and needs no LRU, pins or eviction.
 *
 * Snapshot file (<data_dir>/snapshot.kvs):
 *   header (32 B):  "KVIDXSNP", u32 version, u32 flags (0), u64 next
 *                   generation (the first journal NOT covered), u32
 *                   crc32c(bytes 0..23), u32 0
 *   records:        as in the journal (len, crc, payload); namespace records
 *                   (salt, model) precede the key records that use them,
 *                   keys in kvidx_key_cmp order (listing order)
 *   trailer (32 B): "KVIDXEND", u64 keys, u64 layouts, u32 crc32c(every byte
 *                   of the file before this field), u32 0
 * A snapshot is all or nothing: any mismatch refuses the whole file.
 */
#ifndef KVIDX_JOURNAL_H
#define KVIDX_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvidx/key.h"

#define KVIDX_JOURNAL_VERSION      3 /* written; 1 and 2 are still read */
#define KVIDX_SNAPSHOT_VERSION     1
#define KVIDX_JOURNAL_HEADER_LEN   32
#define KVIDX_SNAPSHOT_HEADER_LEN  32
#define KVIDX_SNAPSHOT_TRAILER_LEN 32
#define KVIDX_JREC_HDR_LEN         8
#define KVIDX_JREC_PAYLOAD_MAX     (1u << 20) /* a record's payload, bytes */
/* A DIR record's blob: the payload less its type byte. */
#define KVIDX_JREC_DIR_BLOB_MAX (KVIDX_JREC_PAYLOAD_MAX - 1)

/* Tier bits of a key state. 0 = the key is gone. */
#define KVIDX_STATE_L1 1u /* a ready, non-temporary L1 copy */
#define KVIDX_STATE_L2 2u

typedef enum {
    KVIDX_JREC_KEY = 1,        /* key state (journal and snapshot) */
    KVIDX_JREC_LAYOUT_PUT = 2, /* layout registered (blob = normalized JSON) */
    KVIDX_JREC_LAYOUT_DEL = 3, /* layout removed (journal only) */
    KVIDX_JREC_NS = 4,         /* snapshot only: namespace of the following keys */
    KVIDX_JREC_SKEY = 5,       /* snapshot only: key state within the namespace */
    KVIDX_JREC_DIR = 6,        /* the fleet directory: a change (journal) or a state record
                                  (snapshot); blob = kvidx/directory_codec.h's bytes */
    KVIDX_JREC_BEGIN = 7,      /* journal only: the records up to the next COMMIT are one
                                  request's, replayed all or none (payload: the type byte) */
    KVIDX_JREC_COMMIT = 8,     /* journal only: ends the group a BEGIN opened */
    KVIDX_JREC_KEYS = 9,       /* journal only: the states of 1 or more keys of one namespace
                                  (a store or delete batch) in one record */
} kvidx_jrec_type_t;

/* One decoded record. Pointers view the decoded buffer (or, for a snapshot
 * key, the reader) and stay valid while it does. */
typedef struct kvidx_jrec {
    kvidx_jrec_type_t type;
    /* KEY: the key; LAYOUT_*: key.model/model_len name the model; KEYS:
     * key.model and key.salt name the namespace (the rest of key is 0). */
    kvidx_key_t key;
    uint64_t size_bytes; /* KEY: 1..2^40, or 0 when tiers == 0 */
    uint8_t tiers;       /* KEY: KVIDX_STATE_* bits */
    uint8_t world_size;  /* LAYOUT_*: 1..255 */
    const uint8_t *blob; /* LAYOUT_PUT: the layout's normalized JSON; DIR: the blob;
                            KEYS: the packed states (read them with kvidx_jkeys_next) */
    size_t blob_len;
    uint32_t count; /* KEYS: the states in blob, 1 or more */
} kvidx_jrec_t;

/* CRC32C of n bytes, continuing from crc (start with 0). Uses the SSE4.2
 * instruction when the CPU has it, a table otherwise; same result. */
uint32_t kvidx_crc32c(uint32_t crc, const void *p, size_t n);

/* ---- journal ---- */

/* Writes the 32-byte header of journal `generation` into out. */
void kvidx_journal_header_encode(uint64_t generation, uint8_t out[KVIDX_JOURNAL_HEADER_LEN]);
/* Checks a journal header: 0 and *generation, or KVIDX_EINVAL (short,
 * bad magic, unknown version, bad checksum). */
int kvidx_journal_header_decode(const uint8_t *p, size_t n, uint64_t *generation);

/* Bytes the framed record of *r takes (header + payload); 0 when *r cannot
 * be encoded (bad type, field out of range). */
size_t kvidx_jrec_size(const kvidx_jrec_t *r);
/* Encodes *r, framed, into out[0..cap). 0 and *len; KVIDX_ENOBUFS when cap
 * is short (*len gets the size needed); KVIDX_EINVAL when *r is not
 * encodable. Types KEY, LAYOUT_PUT, LAYOUT_DEL, DIR (a blob of
 * 1..KVIDX_JREC_DIR_BLOB_MAX bytes), BEGIN, COMMIT and KEYS (blob and
 * count exactly as kvidx_journal_next hands them out: a record read is
 * encoded again to the same bytes); NS and SKEY are the snapshot writer's. */
int kvidx_jrec_encode(const kvidx_jrec_t *r, uint8_t *out, size_t cap, size_t *len);

/* ---- KEYS records, built one state at a time ----
 * Payload: type, model_len u8, salt_len u8, count u32, model, salt, then
 * count states of KVIDX_JKEYS_STATE_FIXED + hash_len bytes each (tiers,
 * hash_len, group u16, kv_rank u32, size u64, hash). A record is started
 * with one state, grown while the states that follow are KEY records of
 * the same namespace and the payload stays within KVIDX_JREC_PAYLOAD_MAX,
 * and closed. While it is open its length and count are always right but
 * its checksum is not written (it holds 0), so a reader takes it for a
 * corrupt record unless those bytes happen to check. Only a closed record
 * ever leaves the loop thread (the journal writer closes it first). */
#define KVIDX_JKEYS_FIXED       7
#define KVIDX_JKEYS_STATE_FIXED 16

/* Framed size of a KEYS record holding the one state of *r (a KEY
 * record); 0 when *r is not an encodable KEY record. */
size_t kvidx_jkeys_size(const kvidx_jrec_t *r);
/* Starts a KEYS record with the state of *r at out: 0 and *len (framed,
 * as kvidx_jkeys_size); KVIDX_ENOBUFS when cap is short; KVIDX_EINVAL when
 * *r is not an encodable KEY record. */
int kvidx_jkeys_begin(const kvidx_jrec_t *r, uint8_t *out, size_t cap, size_t *len);
/* The bytes kvidx_jkeys_add would append to the open KEYS record at rec
 * for *r; 0 when *r cannot join it (not an encodable KEY record, another
 * namespace, or the payload would pass KVIDX_JREC_PAYLOAD_MAX). */
size_t kvidx_jkeys_room(const uint8_t *rec, const kvidx_jrec_t *r);
/* Appends the state of *r to the open KEYS record at rec, whose buffer
 * must have kvidx_jkeys_room bytes free after the record, and updates its
 * length and count: the bytes appended, or 0 (nothing written) when *r
 * cannot join it. */
size_t kvidx_jkeys_add(uint8_t *rec, const kvidx_jrec_t *r);
/* Closes the KEYS record at rec: writes its checksum. */
void kvidx_jkeys_close(uint8_t *rec);
/* Reads the states of a decoded KEYS record *batch in order; *pos starts
 * at 0. 1 with *key a KEY record (the batch's namespace, views into the
 * batch's buffer); 0 after the last; KVIDX_EINVAL when the states are
 * malformed (never for a record kvidx_journal_next accepted). */
int kvidx_jkeys_next(const kvidx_jrec_t *batch, size_t *pos, kvidx_jrec_t *key);

/* Reads the record at buf[*off..len). Returns 1 with *rec filled and *off
 * advanced past it; 0 when *off == len (clean end); KVIDX_EINVAL when the
 * bytes at *off are not a whole valid record (torn write, bad checksum,
 * bad length, malformed or snapshot-only payload; for KEYS, a count of 0,
 * a count that does not match the states, or any malformed state): *off
 * is then left at the first byte of the bad record, which is where a
 * journal is truncated. */
int kvidx_journal_next(const uint8_t *buf, size_t len, size_t *off, kvidx_jrec_t *rec);

/* For a BEGIN record just read (off is the first byte after it): 1 and
 * *end, the first byte after its COMMIT, when every record up to that
 * COMMIT is whole and valid; 0 when the journal ends or a record is torn
 * or corrupt before one (a torn tail: nothing of the group is replayed);
 * 2 and *end, the first byte of that BEGIN, when another BEGIN comes first
 * (a group that was never closed, inside the journal: it is skipped and
 * the replay goes on at *end). */
int kvidx_journal_group_end(const uint8_t *buf, size_t len, size_t off, size_t *end);

/* ---- snapshot ---- */

typedef struct kvidx_snapshot_writer {
    uint32_t crc; /* of every byte produced so far */
    uint64_t keys, layouts;
    int has_ns;
    uint8_t model_len, salt_len;
    char model[KVIDX_MODEL_MAX];
    char salt[KVIDX_SALT_MAX];
} kvidx_snapshot_writer_t;

/* Largest number of bytes kvidx_snapshot_add produces for one key (a
 * namespace record and a key record). */
#define KVIDX_SNAPSHOT_KEY_MAX                                                                     \
    (2 * KVIDX_JREC_HDR_LEN + 3 + KVIDX_MODEL_MAX + KVIDX_SALT_MAX + 17 + KVIDX_HASH_MAX)

/* Starts a snapshot covering every journal before next_generation: writes
 * the header into out. */
void kvidx_snapshot_begin(kvidx_snapshot_writer_t *w, uint64_t next_generation,
                          uint8_t out[KVIDX_SNAPSHOT_HEADER_LEN]);
/* Adds a KEY (tiers != 0), LAYOUT_PUT or DIR record. Keys must come in
 * kvidx_key_cmp order (not checked); DIR records are not counted in the
 * trailer (the file checksum covers them). 0 and *len, KVIDX_ENOBUFS (cap short,
 * nothing consumed) or KVIDX_EINVAL (not encodable). */
int kvidx_snapshot_add(kvidx_snapshot_writer_t *w, const kvidx_jrec_t *r, uint8_t *out, size_t cap,
                       size_t *len);
/* Writes the trailer (counts and the whole-file checksum). */
void kvidx_snapshot_finish(kvidx_snapshot_writer_t *w, uint8_t out[KVIDX_SNAPSHOT_TRAILER_LEN]);

typedef struct kvidx_snapshot_reader {
    const uint8_t *buf;
    size_t end; /* first trailer byte */
    size_t off;
    uint64_t next_generation;
    uint64_t keys, layouts;   /* announced by the trailer */
    uint64_t nkeys, nlayouts; /* read so far */
    int has_ns;
    const char *model, *salt;
    uint8_t model_len, salt_len;
    int streaming; /* checksum computed while reading */
    uint32_t crc;  /* streaming: over buf[0..crc_off) */
    size_t crc_off;
    const char *why; /* static reason after kvidx_snapshot_next failed */
} kvidx_snapshot_reader_t;

/* Verifies a whole snapshot held in buf[0..len) (header, trailer, the
 * checksum over everything) and prepares *r to read it. 0, or KVIDX_EINVAL
 * with a static reason in *why (when why is not NULL). */
int kvidx_snapshot_open(kvidx_snapshot_reader_t *r, const uint8_t *buf, size_t len,
                        const char **why);
/* Like kvidx_snapshot_open, but the file checksum is computed as the
 * records are read (so a second thread can load while this one reads) and
 * compared at the end: kvidx_snapshot_next then says KVIDX_EINVAL instead
 * of 0 on a mismatch. Records handed out before the end are checked for
 * structure only: everything built from them must be thrown away unless
 * the reader ends with 0. */
int kvidx_snapshot_open_streaming(kvidx_snapshot_reader_t *r, const uint8_t *buf, size_t len,
                                  const char **why);
/* The next KEY, LAYOUT_PUT or DIR record: 1 and *rec; 0 at the end (the counts
 * matched the trailer); KVIDX_EINVAL, with a static reason in r->why, on
 * any malformed record, count mismatch or (streaming) checksum mismatch.
 * Both endings repeat if asked again. Keys carry their namespace in
 * rec->key. */
int kvidx_snapshot_next(kvidx_snapshot_reader_t *r, kvidx_jrec_t *rec);

#endif
