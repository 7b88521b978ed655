/*
 * What the Redis/Valkey source reads from a store, from the bytes on the
 * wire: the input after its first byte is fed to hiredis's reply reader,
 * in pieces whose size the first byte picks, and every reply it produces
 * goes through the source's parsers the way the replies' handlers use
 * them: a SCAN reply's key names (redis_key_parse under the prefix the
 * first byte picks, and redis_key_slot), a keyspace notification
 * ("message", "__keyevent@<db>__:<event>", key: redis_event_kind and the
 * key), a CONFIG GET of notify-keyspace-events (redis_notify_missing and
 * redis_notify_merge), and the l2_source URL parser on every string.
 *
 * Invariants: a parsed key obeys the key rules and points into the name;
 * a key's slot is below 16384 and is its {tag}'s slot when it has one;
 * flags merged with what is missing miss nothing; a parsed URL's shown
 * name shows a password as "***". Any breach aborts.
 */
#include "sources/redis_proto.h"
#include "sources/redis_url.h"

#include "kvidx/key.h"

#include <hiredis/hiredis.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static const char *const prefixes[] = {"", "lmcache", "a@b", "p"};

static void key_name(const char *prefix, const char *s, size_t n)
{
    kvidx_key_t k;
    size_t plen = strlen(prefix);
    if (redis_key_parse(prefix, plen, s, n, &k) == 0) {
        check(kvidx_key_check_model(k.model, k.model_len, NULL) == 0);
        check(kvidx_key_check_salt(k.salt, k.salt_len, NULL) == 0);
        check(k.hash_len >= KVIDX_HASH_MIN && k.hash_len <= KVIDX_HASH_MAX);
        check(k.model >= s && k.model + k.model_len <= s + n);
        check(!k.salt_len || (k.salt >= s && k.salt + k.salt_len <= s + n));
        check(plen == 0 || (n > plen && memcmp(s, prefix, plen) == 0 && s[plen] == '@'));
    }
    unsigned slot = redis_key_slot(s, n);
    check(slot < 16384);
    const char *open = memchr(s, '{', n);
    if (open) {
        const char *close = memchr(open + 1, '}', (size_t)(s + n - open - 1));
        if (close && close > open + 1)
            check(slot == redis_key_slot(open + 1, (size_t)(close - open - 1)));
    }
}

static void flags(const char *s, size_t n)
{
    char f[64], missing[16], merged[80];
    if (n >= sizeof(f))
        return;
    memcpy(f, s, n);
    f[n] = '\0';
    int m = redis_notify_missing(f, missing, sizeof(missing));
    check(m >= 0 && (size_t)m == strlen(missing));
    check(redis_notify_merge(f, merged, sizeof(merged)) == 0);
    check(redis_notify_missing(merged, missing, sizeof(missing)) == 0 && missing[0] == '\0');
}

static void url(const char *s, size_t n)
{
    static char buf[1024];
    static struct redis_url u;
    if (n >= sizeof(buf) || memchr(s, '\0', n))
        return;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char err[256];
    if (redis_url_parse(buf, &u, err, sizeof(err)) != 0)
        return;
    check(u.nseeds >= 1 && u.nseeds <= REDIS_SEEDS_MAX);
    for (size_t i = 0; i < u.nseeds; i++)
        check(u.seeds[i].port >= 1 && u.seeds[i].port <= 65535);
    check(u.prefix_len == strlen(u.prefix) && !memchr(u.prefix, '@', u.prefix_len));
    if (u.has_password)
        check(strstr(u.name, "***") != NULL);
    redis_url_wipe(&u);
}

static int is_str(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
}

static void reply(const redisReply *r, const char *prefix, int depth)
{
    if (is_str(r)) {
        key_name(prefix, r->str, r->len);
        url(r->str, r->len);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY)
        return;
    /* A keyspace notification. */
    if (r->elements >= 3 && is_str(r->element[0]) && is_str(r->element[1]) &&
        r->element[0]->len == 7 && memcmp(r->element[0]->str, "message", 7) == 0) {
        const redisReply *ch = r->element[1];
        const char *sep = memchr(ch->str, ':', ch->len);
        if (sep) {
            enum redis_event e = redis_event_kind(sep + 1, (size_t)(ch->str + ch->len - sep - 1));
            check(e == REDIS_EV_IGNORE || e == REDIS_EV_GONE || e == REDIS_EV_CHANGED);
        }
    }
    /* CONFIG GET notify-keyspace-events. */
    if (r->elements == 2 && is_str(r->element[0]) && is_str(r->element[1]))
        flags(r->element[1]->str, r->element[1]->len);
    if (depth < 4)
        for (size_t i = 0; i < r->elements; i++)
            reply(r->element[i], prefix, depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned plan = data[0];
    const char *prefix = prefixes[plan & 3];
    size_t step = (plan >> 2) ? (plan >> 2) : size;
    data++;
    size--;
    redisReader *rd = redisReaderCreate();
    if (!rd)
        return 0;
    for (size_t off = 0; off < size || off == 0;) {
        size_t n = size - off < step ? size - off : step;
        if (redisReaderFeed(rd, (const char *)data + off, n) != REDIS_OK)
            break;
        off += n;
        void *r = NULL;
        int ok;
        while ((ok = redisReaderGetReply(rd, &r)) == REDIS_OK && r) {
            reply(r, prefix, 0);
            freeReplyObject(r);
            r = NULL;
        }
        if (ok != REDIS_OK || size == 0)
            break;
    }
    redisReaderFree(rd);
    return 0;
}
