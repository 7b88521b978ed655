/*
 * What the Redis/Valkey source reads from the store, as plain functions
 * (no I/O, no hiredis): LMCache's wire keys, keyspace event names, the
 * notify-keyspace-events flags the source needs, and a cluster key's slot.
 */
#ifndef KVIDXD_REDIS_PROTO_H
#define KVIDXD_REDIS_PROTO_H

#include "kvidx/key.h"

#include <stddef.h>
#include <stdint.h>

/* Parses a Redis key name as LMCache's Valkey adapter writes it:
 * "<prefix>@<canonical>" with a prefix (plen > 0), "<canonical>" without.
 * The canonical part is "<model>@<kv_rank 8 hex>@<group hex>@<hash hex>
 * [@<salt>]". out's model and salt point into s. 0, or KVIDX_EKEY for a
 * name that is not one of the source's keys (other prefix, other
 * application's key, bad field). */
int redis_key_parse(const char *prefix, size_t plen, const char *s, size_t n, kvidx_key_t *out);

/* What a keyevent notification means for the key it names. */
enum redis_event {
    REDIS_EV_IGNORE = 0, /* no change of existence or size (expire, persist, ...) */
    REDIS_EV_GONE,    /* the key left the database: del, expired, evicted, rename_from, move_from */
    REDIS_EV_CHANGED, /* the key was written or arrived: ask its size again */
};
enum redis_event redis_event_kind(const char *name, size_t n);

/* The keyevent names the source subscribes to, NULL-terminated. */
extern const char *const redis_event_names[];

/* The notify-keyspace-events classes the source needs: keyevent ('E'),
 * generic ('g': del, rename, move, copy, restore), string ('$': set,
 * setrange, append, incrby), expired ('x') and evicted ('e'); 'A' stands
 * for g$lshzxet. Writes the missing flag letters into missing (at least 8
 * bytes; "" when nothing is missing) and returns how many are missing. */
int redis_notify_missing(const char *flags, char *missing, size_t cap);
/* flags with the missing letters appended (for CONFIG SET); cap >= strlen(flags) + 8.
 * 0, or KVIDX_ENOBUFS. */
int redis_notify_merge(const char *flags, char *out, size_t cap);

/* The cluster hash slot of a key (CRC16 of the key, or of its {tag}, mod 16384). */
unsigned redis_key_slot(const char *key, size_t n);

#endif
