/*
 * Pure helpers of the Redis/Valkey source. Invariants: a key name is
 * accepted only when it is exactly what LMCache's adapter would write for
 * some valid ObjectKey under the configured prefix (the canonical parser
 * of lib/ decides the fields); every keyevent name the source subscribes
 * to has a kind other than REDIS_EV_IGNORE.
 */
#include "sources/redis_proto.h"

#include "kvidx/err.h"

#include <string.h>

int redis_key_parse(const char *prefix, size_t plen, const char *s, size_t n, kvidx_key_t *out)
{
    if (plen) {
        if (n <= plen || memcmp(s, prefix, plen) != 0 || s[plen] != '@')
            return KVIDX_EKEY;
        s += plen + 1;
        n -= plen + 1;
    }
    if (n >= KVIDX_KEY_STR_MAX || kvidx_key_parse_canonical(s, n, out, NULL) != 0)
        return KVIDX_EKEY;
    /* The parser is lenient where LMCache's writer is not ("0x" before the
     * rank, upper-case hex); two spellings of one key would be two Redis
     * keys for one index key, so only the exact spelling counts. */
    char buf[KVIDX_KEY_STR_MAX];
    size_t len = sizeof(buf);
    if (kvidx_key_encode_canonical(out, buf, &len) != 0 || len != n || memcmp(buf, s, n) != 0)
        return KVIDX_EKEY;
    return 0;
}

struct event_kind {
    const char *name;
    enum redis_event kind;
};

static const struct event_kind events[] = {
    {"set", REDIS_EV_CHANGED},         {"setrange", REDIS_EV_CHANGED},
    {"append", REDIS_EV_CHANGED},      {"incrby", REDIS_EV_CHANGED},
    {"incrbyfloat", REDIS_EV_CHANGED}, {"rename_to", REDIS_EV_CHANGED},
    {"move_to", REDIS_EV_CHANGED},     {"copy_to", REDIS_EV_CHANGED},
    {"restore", REDIS_EV_CHANGED},     {"del", REDIS_EV_GONE},
    {"expired", REDIS_EV_GONE},        {"evicted", REDIS_EV_GONE},
    {"rename_from", REDIS_EV_GONE},    {"move_from", REDIS_EV_GONE},
};

const char *const redis_event_names[] = {
    "set",     "setrange", "append",  "incrby",  "incrbyfloat", "rename_to", "move_to", "copy_to",
    "restore", "del",      "expired", "evicted", "rename_from", "move_from", NULL,
};

enum redis_event redis_event_kind(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++)
        if (strlen(events[i].name) == n && memcmp(events[i].name, name, n) == 0)
            return events[i].kind;
    return REDIS_EV_IGNORE;
}

static int has_class(const char *flags, char c)
{
    if (strchr(flags, c))
        return 1;
    /* 'A' is every class but 'n' (new key) and 'm' (key miss). */
    return c != 'E' && c != 'K' && strchr(flags, 'A') != NULL;
}

int redis_notify_missing(const char *flags, char *missing, size_t cap)
{
    static const char need[] = "Eg$xe";
    int n = 0;
    for (const char *p = need; *p; p++) {
        if (!has_class(flags, *p)) {
            if ((size_t)n + 1 < cap)
                missing[n] = *p;
            n++;
        }
    }
    if (cap)
        missing[(size_t)n < cap ? (size_t)n : cap - 1] = '\0';
    return n;
}

int redis_notify_merge(const char *flags, char *out, size_t cap)
{
    char miss[8];
    redis_notify_missing(flags, miss, sizeof(miss));
    size_t a = strlen(flags), b = strlen(miss);
    if (a + b + 1 > cap)
        return KVIDX_ENOBUFS;
    memcpy(out, flags, a);
    memcpy(out + a, miss, b + 1);
    return 0;
}

/* CRC16-CCITT (XModem), the checksum Redis Cluster uses for slots. */
static uint16_t crc16(const char *buf, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint16_t)(unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned redis_key_slot(const char *key, size_t n)
{
    const char *open = memchr(key, '{', n);
    if (open) {
        size_t off = (size_t)(open - key) + 1;
        const char *close = memchr(key + off, '}', n - off);
        if (close && close != key + off)
            return crc16(key + off, (size_t)(close - (key + off))) & 16383;
    }
    return crc16(key, n) & 16383;
}
