/*
 * The ObjectKey model of docs/keys.md: validation, the canonical and FS string
 * forms, kv_rank packing and the ipc-form expansion.
 *
 * A kvidx_key_t is a view: model_name and cache_salt point into memory the
 * caller owns (the parsed string, a JSON value, or a scratch buffer for the
 * FS form whose `-SEP-` has to be turned back into `/`). The hash is held in
 * binary. Functions here never allocate.
 */
#ifndef KVIDX_KEY_H
#define KVIDX_KEY_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_MODEL_MAX      255 /* bytes of model_name */
#define KVIDX_SALT_MAX       128 /* bytes of cache_salt */
#define KVIDX_HASH_MIN       1   /* bytes of chunk hash (2 hex digits) */
#define KVIDX_HASH_MAX       64  /* bytes of chunk hash (128 hex digits) */
#define KVIDX_GROUP_MAX      65535
#define KVIDX_RANK_FIELD_MAX 255

/* Upper bound of a canonical or FS string (model may grow by -SEP-). */
#define KVIDX_KEY_STR_MAX                                                                          \
    (KVIDX_MODEL_MAX * 5 + 1 + 10 + 1 + 4 + 1 + 2 * KVIDX_HASH_MAX + 1 + KVIDX_SALT_MAX + 5 + 1)

typedef struct kvidx_key {
    const char *model; /* model_name bytes, not necessarily NUL-terminated */
    const char *salt;  /* cache_salt bytes ("" allowed); may be NULL when salt_len == 0 */
    uint16_t model_len;
    uint8_t salt_len;
    uint8_t hash_len; /* bytes, KVIDX_HASH_MIN..KVIDX_HASH_MAX */
    uint16_t group;   /* object_group_id */
    uint32_t kv_rank;
    uint8_t hash[KVIDX_HASH_MAX];
} kvidx_key_t;

/* Why a key (or one field of it) was rejected: static strings, never request bytes. */
typedef struct kvidx_reason {
    const char *field; /* "chunk_hash_hex", "model_name", "kv_rank", ... or "key" */
    const char *rule;  /* e.g. "must be 2..128 hex digits, an even count" */
} kvidx_reason_t;

/* Value of one hex digit (either case), or -1. */
int kvidx_hex_value(unsigned char c);

/* ---- validation of single fields (docs/keys.md) ----
 * Each returns 0 or KVIDX_EKEY and, when why is not NULL, fills it. */
int kvidx_key_check_model(const char *s, size_t n, kvidx_reason_t *why);
int kvidx_key_check_salt(const char *s, size_t n, kvidx_reason_t *why);
/* Decodes 2..128 hex digits (either case, even count, nothing else) into
 * out[KVIDX_HASH_MAX]; *out_len gets the byte count. */
int kvidx_key_hash_from_hex(const char *hex, size_t n, uint8_t *out, uint8_t *out_len,
                            kvidx_reason_t *why);

/* ---- the JSON-independent validator ----
 * The daemon turns a JSON key object into these raw fields; the rules of
 * docs/keys.md are applied here, so they can be tested and fuzzed without JSON. */
typedef enum {
    KVIDX_FIELD_ABSENT = 0,
    KVIDX_FIELD_STRING,
    KVIDX_FIELD_NUMBER,
    KVIDX_FIELD_OTHER /* null, boolean, array or object */
} kvidx_field_kind_t;

typedef struct kvidx_field {
    kvidx_field_kind_t kind;
    const char *str; /* KVIDX_FIELD_STRING */
    size_t len;
    double num; /* KVIDX_FIELD_NUMBER */
} kvidx_field_t;

typedef struct kvidx_key_input {
    kvidx_field_t chunk_hash_hex;  /* required string */
    kvidx_field_t model_name;      /* required string */
    kvidx_field_t kv_rank;         /* required integral number */
    kvidx_field_t object_group_id; /* optional integral number, default 0 */
    kvidx_field_t cache_salt;      /* optional string, default "" */
    int has_unknown_member;        /* the object had a member not named above */
    /* Optional (NULL when unknown): a model name and a salt that passed
     * their checks in an earlier key of the same request. A field with the
     * same bytes is not checked again (a 1000-key request usually names
     * one model 1000 times). */
    const char *valid_model, *valid_salt;
    size_t valid_model_len, valid_salt_len;
} kvidx_key_input_t;

/* Validates in and fills *out (model and salt point into the input strings).
 * Returns 0 or KVIDX_EKEY with *why naming the field and rule. */
int kvidx_key_from_input(const kvidx_key_input_t *in, kvidx_key_t *out, kvidx_reason_t *why);

/* Integral-number rule of docs/keys.md for a JSON number: 0 when v is integral
 * and lo <= v <= hi, storing it in *out; KVIDX_EKEY otherwise (also for NaN
 * and for any v < 0, since *out is unsigned). */
int kvidx_key_integral(double v, double lo, double hi, uint64_t *out);

/* ---- comparison ---- */
/* 1 when all five fields are equal. */
int kvidx_key_equal(const kvidx_key_t *a, const kvidx_key_t *b);
/* Total order of docs/page_tokens.md: cache_salt, model_name (bytewise), kv_rank,
 * object_group_id, chunk hash bytes (a proper prefix sorts first). */
int kvidx_key_cmp(const kvidx_key_t *a, const kvidx_key_t *b);

/* ---- string forms (docs/keys.md) ----
 * Encoders write a NUL-terminated string into buf. On entry *size is the
 * buffer size; on success it becomes the string length (without NUL) and 0
 * is returned; when buf is too small, KVIDX_ENOBUFS is returned and *size is
 * the size needed including the NUL (buf may be NULL when *size is 0).
 * k must be a valid key; a hash_len outside 1..64 gives KVIDX_EINVAL. */
int kvidx_key_encode_canonical(const kvidx_key_t *k, char *buf, size_t *size);
int kvidx_key_encode_fs(const kvidx_key_t *k, char *buf, size_t *size);
/* Writes the lowercase hex of the hash (2*hash_len chars + NUL); same size rule. */
int kvidx_key_hash_to_hex(const kvidx_key_t *k, char *buf, size_t *size);

/* Parses a canonical string (4 or 5 fields, rank as 8 hex digits with or
 * without 0x). model and salt of *out point into s. Returns 0 or KVIDX_EKEY. */
int kvidx_key_parse_canonical(const char *s, size_t n, kvidx_key_t *out, kvidx_reason_t *why);
/* Parses an FS file name (4, 5 or legacy 3 fields, `.data` suffix). The model
 * name, with every `-SEP-` turned into `/`, is written to model_buf (at least
 * KVIDX_MODEL_MAX + 1 bytes) and *out->model points there; the salt points
 * into s. Returns 0 or KVIDX_EKEY. Note: a model name that itself contains
 * `-SEP-` does not survive the FS form (LMCache's adapter has the same flaw). */
int kvidx_key_parse_fs(const char *s, size_t n, kvidx_key_t *out, char *model_buf,
                       kvidx_reason_t *why);

/* ---- kv_rank (docs/keys.md) ---- */
/* Packs world_size<<24 | global_rank<<16 | local_world_size<<8 | local_rank.
 * Each input must be 0..255, else KVIDX_EINVAL with *why naming it. */
int kvidx_rank_pack(int64_t world_size, int64_t global_rank, int64_t local_world_size,
                    int64_t local_rank, uint32_t *out, kvidx_reason_t *why);
void kvidx_rank_unpack(uint32_t kv_rank, uint8_t *world_size, uint8_t *global_rank,
                       uint8_t *local_world_size, uint8_t *local_rank);
/* World size of a packed rank: its top byte (used to pick a layout). */
static inline uint8_t kvidx_rank_world_size(uint32_t kv_rank)
{
    return (uint8_t)(kv_rank >> 24);
}

/* ---- ipc-form expansion (docs/keys.md) ----
 * An ipc-form request names C chunk hashes, G object groups and R ranks
 * (R = world_size when worker_id is -1, else 1). Flat index of (group gi,
 * chunk c, rank r) is gi*(C*R) + c*R + r: group-major, then chunk, then rank. */
typedef struct kvidx_ipc {
    uint32_t world_size; /* 1..255 */
    int32_t worker_id;   /* -1 for null (every worker), else 0..world_size-1 */
    uint32_t num_chunks;
    uint32_t num_groups;
} kvidx_ipc_t;

/* Checks world_size (1..255) and worker_id (-1 or 0..world_size-1). */
int kvidx_ipc_check(const kvidx_ipc_t *ipc, kvidx_reason_t *why);
/* Number of ranks R per (group, chunk). */
uint32_t kvidx_ipc_num_ranks(const kvidx_ipc_t *ipc);
/* Total keys G*C*R, or 0 with KVIDX_ETOOMANYKEYS semantics left to the caller
 * when it would exceed UINT32_MAX (returned as UINT64 for that check). */
uint64_t kvidx_ipc_total(const kvidx_ipc_t *ipc);
/* The kv_rank of rank slot r: ComputeKVRank(ws, w, ws, w) with w = r when
 * worker_id is -1, else worker_id. */
uint32_t kvidx_ipc_rank(const kvidx_ipc_t *ipc, uint32_t r);
/* Decomposes a flat index into (group index, chunk, rank slot). */
void kvidx_ipc_split(const kvidx_ipc_t *ipc, uint64_t flat, uint32_t *gi, uint32_t *c, uint32_t *r);

#endif
