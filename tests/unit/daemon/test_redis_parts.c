/*
 * The Redis/Valkey source's pure parts: the l2_source URLs (credentials
 * never in the shown name), LMCache's wire keys under a prefix, keyevent
 * kinds, the notify-keyspace-events check, cluster slots and the string
 * map (against a model, with deletion during a walk).
 */
#include "sources/redis_map.h"
#include "sources/redis_proto.h"
#include "sources/redis_url.h"

#include "kvidx/err.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- URLs ---- */

Test(redis_url, standalone_full)
{
    struct redis_url u;
    char err[256] = "";
    cr_assert_eq(
        redis_url_parse("redis://alice:s3cr%40t@127.0.0.1:6380/3?prefix=lmc", &u, err, sizeof(err)),
        0, "%s", err);
    cr_assert_eq(u.cluster, 0);
    cr_assert_eq(u.nseeds, 1);
    cr_assert_str_eq(u.seeds[0].host, "127.0.0.1");
    cr_assert_eq(u.seeds[0].port, 6380);
    cr_assert_str_eq(u.user, "alice");
    cr_assert_str_eq(u.password, "s3cr@t");
    cr_assert_eq(u.has_password, 1);
    cr_assert_eq(u.db, 3);
    cr_assert_str_eq(u.prefix, "lmc");
    cr_assert_eq(u.prefix_len, 3);
    cr_assert_str_eq(u.name, "redis://alice:***@127.0.0.1:6380/3?prefix=lmc");
    cr_assert_null(strstr(u.name, "s3cr"));
    redis_url_wipe(&u);
    cr_assert_eq(u.password[0], 0);
}

Test(redis_url, password_only_and_defaults)
{
    struct redis_url u;
    char err[256];
    cr_assert_eq(redis_url_parse("redis://hunter2@localhost", &u, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(u.password, "hunter2");
    cr_assert_str_eq(u.user, "");
    cr_assert_eq(u.seeds[0].port, 6379);
    cr_assert_eq(u.db, 0);
    cr_assert_eq(u.prefix_len, 0);
    cr_assert_str_eq(u.name, "redis://***@localhost");
    /* ':' and '@' may stay in a password ('/' and '?' are %-escaped). */
    cr_assert_eq(redis_url_parse("redis://u:a%2Fb%3Fc:d@e@[::1]:7000/0", &u, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_str_eq(u.password, "a/b?c:d@e");
    cr_assert_str_eq(u.seeds[0].host, "::1");
    cr_assert_eq(u.seeds[0].port, 7000);
    cr_assert_str_eq(u.name, "redis://u:***@[::1]:7000/0");
}

Test(redis_url, cluster_seeds)
{
    struct redis_url u;
    char err[256];
    cr_assert_eq(redis_url_parse("redis+cluster://127.0.0.1:7000,127.0.0.1:7001,h3:7002?prefix=p",
                                 &u, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(u.cluster, 1);
    cr_assert_eq(u.nseeds, 3);
    cr_assert_str_eq(u.seeds[2].host, "h3");
    cr_assert_eq(u.seeds[2].port, 7002);
    cr_assert_str_eq(u.prefix, "p");
    cr_assert_str_eq(u.name, "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,h3:7002?prefix=p");
}

Test(redis_url, rejected)
{
    static const char *const bad[] = {
        "http://h:1",
        "redis://",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:12x",
        "redis://h:1,h:2",
        "redis://h:1/x",
        "redis://h:1?prefix=a@b",
        "redis://h:1?prefix=",
        "redis://h:1?prefix=a&prefix=b",
        "redis://h:1?db=2",
        "redis://h:1?prefix=%zz",
        "redis://h%20:1",
        "redis://[::1:1",
        "redis+cluster://h:1/2",
        "redis://u:pw%4@h:1",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct redis_url u;
        char err[256] = "";
        cr_assert_eq(redis_url_parse(bad[i], &u, err, sizeof(err)), KVIDX_EINVAL, "%s", bad[i]);
        cr_assert(strlen(err) > 0, "%s", bad[i]);
        cr_assert_eq(u.nseeds, 0);
    }
}

Test(redis_url, errors_never_show_the_password)
{
    struct redis_url u;
    char err[256] = "";
    cr_assert_neq(redis_url_parse("redis://user:topsecret@h:99999", &u, err, sizeof(err)), 0);
    cr_assert_null(strstr(err, "topsecret"), "%s", err);
    cr_assert_eq(u.password[0], 0);
}

/* ---- wire keys ---- */

Test(redis_key, canonical_with_and_without_prefix)
{
    kvidx_key_t k;
    const char *s = "meta-llama/Llama-3.1-8B@02010201@1f@7448f262f9@alice";
    cr_assert_eq(redis_key_parse(NULL, 0, s, strlen(s), &k), 0);
    cr_assert_eq(k.kv_rank, 0x02010201u);
    cr_assert_eq(k.group, 0x1f);
    cr_assert_eq(k.hash_len, 5);
    cr_assert_eq(k.salt_len, 5);
    cr_assert_eq(k.model_len, strlen("meta-llama/Llama-3.1-8B"));
    const char *p = "lmc@m@00000000@0@abcd";
    cr_assert_eq(redis_key_parse("lmc", 3, p, strlen(p), &k), 0);
    cr_assert_eq(k.salt_len, 0);
    cr_assert_eq(k.hash_len, 2);
    /* Without the prefix configured, a prefixed key has a field too many. */
    cr_assert_eq(redis_key_parse(NULL, 0, p, strlen(p), &k), KVIDX_EKEY);
}

Test(redis_key, not_the_sources)
{
    static const char *const bad[] = {
        "other@m@00000000@0@abcd",   /* other prefix */
        "lmcx@m@00000000@0@abcd",    /* a longer prefix */
        "lmc@",                      /* nothing after it */
        "lmc@m@0x00000000@0@abcd",   /* 0x: not LMCache's spelling */
        "lmc@m@00000000@0@ABCD",     /* upper-case hex: not LMCache's spelling */
        "lmc@m@00000000@00@abcd",    /* padded group */
        "lmc@m@000000000@0@abcd",    /* 9 rank digits */
        "lmc@m@00000000@0@abc",      /* odd hash */
        "lmc@m@00000000@abcd",       /* 3 fields */
        "lmc@m@00000000@0@abcd@s@t", /* 6 fields */
        "session:1234",
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvidx_key_t k;
        cr_assert_eq(redis_key_parse("lmc", 3, bad[i], strlen(bad[i]), &k), KVIDX_EKEY, "%s",
                     bad[i]);
    }
}

/* ---- events and flags ---- */

Test(redis_events, kinds)
{
    cr_assert_eq(redis_event_kind("set", 3), REDIS_EV_CHANGED);
    cr_assert_eq(redis_event_kind("rename_to", 9), REDIS_EV_CHANGED);
    cr_assert_eq(redis_event_kind("restore", 7), REDIS_EV_CHANGED);
    cr_assert_eq(redis_event_kind("del", 3), REDIS_EV_GONE);
    cr_assert_eq(redis_event_kind("expired", 7), REDIS_EV_GONE);
    cr_assert_eq(redis_event_kind("evicted", 7), REDIS_EV_GONE);
    cr_assert_eq(redis_event_kind("rename_from", 11), REDIS_EV_GONE);
    cr_assert_eq(redis_event_kind("expire", 6), REDIS_EV_IGNORE);
    cr_assert_eq(redis_event_kind("se", 2), REDIS_EV_IGNORE);
    for (size_t i = 0; redis_event_names[i]; i++)
        cr_assert_neq(redis_event_kind(redis_event_names[i], strlen(redis_event_names[i])),
                      REDIS_EV_IGNORE, "%s", redis_event_names[i]);
}

Test(redis_events, notify_flags)
{
    char miss[8], merged[32];
    cr_assert_eq(redis_notify_missing("", miss, sizeof(miss)), 5);
    cr_assert_str_eq(miss, "Eg$xe");
    cr_assert_eq(redis_notify_missing("AKE", miss, sizeof(miss)), 0);
    cr_assert_str_eq(miss, "");
    cr_assert_eq(redis_notify_missing("Eg$xe", miss, sizeof(miss)), 0);
    cr_assert_eq(redis_notify_missing("KA", miss, sizeof(miss)), 1);
    cr_assert_str_eq(miss, "E");
    cr_assert_eq(redis_notify_missing("Ex", miss, sizeof(miss)), 3);
    cr_assert_str_eq(miss, "g$e");
    cr_assert_eq(redis_notify_merge("Kl", merged, sizeof(merged)), 0);
    cr_assert_str_eq(merged, "KlEg$xe");
    cr_assert_eq(redis_notify_missing(merged, miss, sizeof(miss)), 0);
    cr_assert_eq(redis_notify_merge("Kl", merged, 4), KVIDX_ENOBUFS);
}

Test(redis_slot, known_values)
{
    /* Values from the Redis Cluster specification and CLUSTER KEYSLOT. */
    cr_assert_eq(redis_key_slot("123456789", 9), 0x31c3 & 16383);
    cr_assert_eq(redis_key_slot("foo", 3), 12182);
    cr_assert_eq(redis_key_slot("{user1000}.following", 20), redis_key_slot("user1000", 8));
    cr_assert_eq(redis_key_slot("foo{}{bar}", 10), redis_key_slot("foo{}{bar}", 10));
    cr_assert_eq(redis_key_slot("{}x", 3), redis_key_slot("{}x", 3));
}

/* ---- the string map ---- */

Test(redis_map, against_a_model)
{
    struct rmap m;
    rmap_init(&m, 1);
    enum { N = 5000 };
    static int64_t model[N];
    for (int i = 0; i < N; i++)
        model[i] = -1;
    unsigned seed = 12345;
    for (int step = 0; step < 60000; step++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % N);
        char key[32];
        int len = snprintf(key, sizeof(key), "key:%d", k);
        if ((seed >> 4) % 3 == 0) {
            struct rmap_entry *e = rmap_get(&m, key, (size_t)len);
            cr_assert_eq(e != NULL, model[k] >= 0);
            if (e) {
                rmap_del(&m, e);
                model[k] = -1;
            }
        } else {
            int created;
            struct rmap_entry *e = rmap_put(&m, key, (size_t)len, &created);
            cr_assert_not_null(e);
            cr_assert_eq(created, model[k] < 0);
            if (!created)
                cr_assert_eq(e->a, (uint64_t)model[k]);
            e->a = (uint64_t)step;
            model[k] = step;
        }
    }
    size_t live = 0;
    for (int i = 0; i < N; i++)
        live += model[i] >= 0;
    cr_assert_eq(m.used, live);
    /* Delete every even key during a walk: every entry is visited once. */
    size_t seen = 0;
    for (size_t i = 0; i < m.cap; i++) {
        struct rmap_entry *e = &m.e[i];
        if (!rmap_live(e))
            continue;
        seen++;
        /* The map's copy of a key is its bytes only, without a NUL. */
        char kb[32];
        cr_assert_lt(e->len, sizeof(kb));
        memcpy(kb, e->key, e->len);
        kb[e->len] = '\0';
        int k = atoi(kb + 4);
        cr_assert_eq(e->a, (uint64_t)model[k]);
        if (k % 2 == 0) {
            rmap_del(&m, e);
            model[k] = -1;
        }
    }
    cr_assert_eq(seen, live);
    for (int i = 0; i < N; i++) {
        char key[32];
        int len = snprintf(key, sizeof(key), "key:%d", i);
        cr_assert_eq(rmap_get(&m, key, (size_t)len) != NULL, model[i] >= 0);
    }
    rmap_free(&m);
}
