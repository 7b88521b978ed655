/*
 * Tests of the key model (lib/key.c): every case of keys.jsonl, names.jsonl,
 * kv_rank.jsonl and expand.jsonl, then one test per rule of docs/keys.md-1.3
 * and the choices docs/keys.md makes where the contract is silent.
 *
 * Vector tests loop over all lines and name the file and line in every
 * failure message; expected values always come from the vector, never from
 * the code under test.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/key.h"
#include "vectors.h"

/* ---- helpers ---- */

/* cJSON stores strings NUL-terminated, so "a\u0000b" would silently become
 * "a". keys.jsonl is therefore read here with every \u0000 escape replaced
 * by \ufdd0 (a noncharacter, checked absent from the file), and
 * field_from_json turns its UTF-8 bytes back into one NUL. */
#define NUL_STAND_IN "\xef\xb7\x90"

static cJSON **load_nul_safe(const char *file, size_t *count)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", KVIDX_VECTORS_DIR, file);
    FILE *f = fopen(path, "r");
    cr_assert(f != NULL, "cannot open %s", path);
    cJSON **items = NULL;
    size_t n = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (len == 1 && line[0] == '\n')
            continue;
        cr_assert(strstr(line, "ufdd0") == NULL && strstr(line, "uFDD0") == NULL &&
                      strstr(line, NUL_STAND_IN) == NULL,
                  "%s line %zu uses the NUL stand-in U+FDD0", file, n + 1);
        for (char *p = line; (p = strstr(p, "\\u0000")) != NULL; p += 6)
            memcpy(p, "\\ufdd0", 6);
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        cr_assert(j != NULL, "%s line %zu does not parse", file, n + 1);
        items = realloc(items, (n + 1) * sizeof(*items));
        cr_assert(items != NULL);
        items[n++] = j;
    }
    free(line);
    fclose(f);
    cr_assert(n > 0, "%s is empty", file);
    *count = n;
    return items;
}

/* Both loaders hand over their arrays; freeing them keeps LeakSanitizer
 * quiet in the sanitizer build. */
static void free_lines(cJSON **lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cJSON_Delete(lines[i]);
    free(lines);
}

/* Storage for the strings of one converted key object. */
typedef struct {
    char str[5][1024];
    kvidx_key_input_t in;
} input_buf_t;

static void field_from_json(const cJSON *obj, const char *name, kvidx_field_t *f, char *store)
{
    memset(f, 0, sizeof(*f));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (v == NULL) {
        f->kind = KVIDX_FIELD_ABSENT;
    } else if (cJSON_IsString(v)) {
        f->kind = KVIDX_FIELD_STRING;
        size_t n = 0;
        for (const char *p = v->valuestring; *p;) {
            cr_assert(n < 1023, "string member %s too long for the test buffer", name);
            if (strncmp(p, NUL_STAND_IN, 3) == 0) {
                store[n++] = '\0';
                p += 3;
            } else {
                store[n++] = *p++;
            }
        }
        store[n] = '\0';
        f->str = store;
        f->len = n;
    } else if (cJSON_IsNumber(v)) {
        f->kind = KVIDX_FIELD_NUMBER;
        f->num = v->valuedouble;
    } else {
        f->kind = KVIDX_FIELD_OTHER;
    }
}

/* What the daemon's JSON layer does: one kvidx_field_t per known member,
 * and a flag for any other member. */
static void input_from_json(const cJSON *obj, input_buf_t *b)
{
    static const char *const known[] = {"chunk_hash_hex", "model_name", "kv_rank",
                                        "object_group_id", "cache_salt"};
    memset(b, 0, sizeof(*b));
    field_from_json(obj, "chunk_hash_hex", &b->in.chunk_hash_hex, b->str[0]);
    field_from_json(obj, "model_name", &b->in.model_name, b->str[1]);
    field_from_json(obj, "kv_rank", &b->in.kv_rank, b->str[2]);
    field_from_json(obj, "object_group_id", &b->in.object_group_id, b->str[3]);
    field_from_json(obj, "cache_salt", &b->in.cache_salt, b->str[4]);
    const cJSON *m;
    cJSON_ArrayForEach(m, obj)
    {
        int found = 0;
        for (size_t i = 0; i < 5; i++)
            found |= strcmp(m->string, known[i]) == 0;
        if (!found)
            b->in.has_unknown_member = 1;
    }
}

static const char *json_str(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    cr_assert(cJSON_IsString(v), "vector member %s is not a string", name);
    return v->valuestring;
}

static double json_num(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    cr_assert(cJSON_IsNumber(v), "vector member %s is not a number", name);
    return v->valuedouble;
}

static int json_true(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    cr_assert(cJSON_IsBool(v), "vector member %s is not a boolean", name);
    return cJSON_IsTrue(v);
}

/* Compares all five fields of k with a vector's normalized "key" object. */
static void expect_key(const kvidx_key_t *k, const cJSON *want, const char *where)
{
    const char *model = json_str(want, "model_name");
    const char *salt = json_str(want, "cache_salt");
    const char *hash = json_str(want, "chunk_hash_hex");
    cr_expect(k->model_len == strlen(model) && memcmp(k->model, model, k->model_len) == 0,
              "%s: model_name is '%.*s', want '%s'", where, (int)k->model_len, k->model, model);
    cr_expect(k->salt_len == strlen(salt) &&
                  (k->salt_len == 0 || memcmp(k->salt, salt, k->salt_len) == 0),
              "%s: cache_salt is '%.*s', want '%s'", where, (int)k->salt_len,
              k->salt ? k->salt : "", salt);
    cr_expect(k->kv_rank == (uint32_t)json_num(want, "kv_rank"), "%s: kv_rank is %u, want %.0f",
              where, k->kv_rank, json_num(want, "kv_rank"));
    cr_expect(k->group == (uint16_t)json_num(want, "object_group_id"),
              "%s: object_group_id is %u, want %.0f", where, k->group,
              json_num(want, "object_group_id"));
    char hex[2 * KVIDX_HASH_MAX + 1];
    size_t size = sizeof(hex);
    cr_expect(kvidx_key_hash_to_hex(k, hex, &size) == 0, "%s: hash_to_hex failed", where);
    cr_expect_str_eq(hex, hash, "%s: chunk_hash_hex is %s, want %s", where, hex, hash);
    cr_expect(size == strlen(hash), "%s: hash_to_hex size %zu", where, size);
}

static void expect_encodes(const kvidx_key_t *k, int fs, const char *want, const char *where)
{
    char buf[KVIDX_KEY_STR_MAX];
    size_t size = sizeof(buf);
    int rc = fs ? kvidx_key_encode_fs(k, buf, &size) : kvidx_key_encode_canonical(k, buf, &size);
    cr_expect(rc == 0, "%s: encode %s returned %d", where, fs ? "fs" : "canonical", rc);
    if (rc != 0)
        return;
    cr_expect_str_eq(buf, want, "%s: %s form is '%s', want '%s'", where, fs ? "fs" : "canonical",
                     buf, want);
    cr_expect(size == strlen(want), "%s: reported length %zu, want %zu", where, size, strlen(want));
}

static int make_key(const char *model, uint32_t rank, uint16_t group, const char *hex,
                    const char *salt, kvidx_key_t *k)
{
    memset(k, 0, sizeof(*k));
    k->model = model;
    k->model_len = (uint16_t)strlen(model);
    k->salt = salt;
    k->salt_len = (uint8_t)strlen(salt);
    k->kv_rank = rank;
    k->group = group;
    return kvidx_key_hash_from_hex(hex, strlen(hex), k->hash, &k->hash_len, NULL);
}

/* ---- golden vectors ---- */

/* The field a keys.jsonl "reason" names ("kv_rank", "model_name type",
 * "missing kv_rank", "unknown member chunk_hash" -> "key"). */
static void reason_field(const char *reason, char *out, size_t n)
{
    if (strncmp(reason, "unknown member", 14) == 0) {
        snprintf(out, n, "key");
        return;
    }
    if (strncmp(reason, "missing ", 8) == 0)
        reason += 8;
    size_t len = strcspn(reason, " ");
    snprintf(out, n, "%.*s", (int)len, reason);
}

Test(vectors, keys)
{
    size_t n;
    cJSON **lines = load_nul_safe("keys.jsonl", &n);
    size_t valid = 0, invalid = 0;
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof(where), "keys.jsonl line %zu", i + 1);
        input_buf_t b;
        input_from_json(cJSON_GetObjectItemCaseSensitive(lines[i], "input"), &b);
        kvidx_key_t k;
        kvidx_reason_t why = {NULL, NULL};
        int rc = kvidx_key_from_input(&b.in, &k, &why);
        if (!json_true(lines[i], "valid")) {
            invalid++;
            cr_expect(rc == KVIDX_EKEY, "%s: accepted an invalid key (rc %d)", where, rc);
            cr_expect(why.field != NULL && why.rule != NULL, "%s: no reason given", where);
            char field[64];
            reason_field(json_str(lines[i], "reason"), field, sizeof(field));
            if (why.field)
                cr_expect_str_eq(why.field, field, "%s: rejected for %s (%s), want %s", where,
                                 why.field, why.rule, field);
            continue;
        }
        valid++;
        cr_expect(rc == 0, "%s: rejected (%s: %s)", where, why.field ? why.field : "?",
                  why.rule ? why.rule : "?");
        if (rc != 0)
            continue;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(lines[i], "key");
        expect_key(&k, want, where);
        const char *canonical = json_str(lines[i], "canonical");
        const char *fs_name = json_str(lines[i], "fs_name");
        expect_encodes(&k, 0, canonical, where);
        expect_encodes(&k, 1, fs_name, where);

        kvidx_key_t back;
        cr_expect(kvidx_key_parse_canonical(canonical, strlen(canonical), &back, &why) == 0,
                  "%s: canonical does not parse back", where);
        cr_expect(kvidx_key_equal(&back, &k), "%s: canonical parses to another key", where);
        expect_key(&back, want, where);
        char model_buf[KVIDX_MODEL_MAX + 1];
        cr_expect(kvidx_key_parse_fs(fs_name, strlen(fs_name), &back, model_buf, &why) == 0,
                  "%s: fs_name does not parse back", where);
        cr_expect(kvidx_key_equal(&back, &k), "%s: fs_name parses to another key", where);
        expect_key(&back, want, where);

        /* The normalized key is itself a valid input naming the same key. */
        input_buf_t nb;
        input_from_json(want, &nb);
        cr_expect(kvidx_key_from_input(&nb.in, &back, &why) == 0 && kvidx_key_equal(&back, &k),
                  "%s: the normalized key does not validate to the same key", where);
    }
    cr_expect(valid > 0 && invalid > 0, "keys.jsonl: %zu valid, %zu invalid", valid, invalid);
    free_lines(lines, n);
}

Test(vectors, names)
{
    size_t n;
    cJSON **lines = vectors_load("names.jsonl", &n);
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof(where), "names.jsonl line %zu", i + 1);
        const char *form = json_str(lines[i], "form");
        const char *text = json_str(lines[i], "text");
        int fs = strcmp(form, "fs") == 0;
        cr_assert(fs || strcmp(form, "canonical") == 0, "%s: unknown form %s", where, form);
        kvidx_key_t k;
        kvidx_reason_t why = {NULL, NULL};
        char model_buf[KVIDX_MODEL_MAX + 1];
        int rc = fs ? kvidx_key_parse_fs(text, strlen(text), &k, model_buf, &why)
                    : kvidx_key_parse_canonical(text, strlen(text), &k, &why);
        if (!json_true(lines[i], "valid")) {
            cr_expect(rc == KVIDX_EKEY, "%s: accepted '%s' (rc %d)", where, text, rc);
            cr_expect(why.field != NULL && why.rule != NULL, "%s: no reason given", where);
            continue;
        }
        cr_expect(rc == 0, "%s: rejected '%s' (%s: %s)", where, text, why.field ? why.field : "?",
                  why.rule ? why.rule : "?");
        if (rc != 0)
            continue;
        expect_key(&k, cJSON_GetObjectItemCaseSensitive(lines[i], "key"), where);

        /* Re-encoding gives the text back wherever it is in the encoder's
         * own spelling: canonical without "0x", FS unless legacy 3-field. */
        size_t ats = 0;
        for (const char *p = text; *p; p++)
            ats += *p == '@';
        if (!fs) {
            char want[KVIDX_KEY_STR_MAX];
            const char *x = strstr(text, "@0x");
            if (x)
                snprintf(want, sizeof(want), "%.*s@%s", (int)(x - text), text, x + 3);
            else
                snprintf(want, sizeof(want), "%s", text);
            expect_encodes(&k, 0, want, where);
        } else if (ats >= 3) {
            expect_encodes(&k, 1, text, where);
        }
    }
    free_lines(lines, n);
}

Test(vectors, kv_rank)
{
    size_t n;
    cJSON **lines = vectors_load("kv_rank.jsonl", &n);
    static const char *const names[4] = {"world_size", "global_rank", "local_world_size",
                                         "local_rank"};
    for (size_t i = 0; i < n; i++) {
        double v[4];
        for (int j = 0; j < 4; j++)
            v[j] = json_num(lines[i], names[j]);
        uint32_t out = 0;
        kvidx_reason_t why = {NULL, NULL};
        int rc =
            kvidx_rank_pack((int64_t)v[0], (int64_t)v[1], (int64_t)v[2], (int64_t)v[3], &out, &why);
        if (!json_true(lines[i], "valid")) {
            cr_expect(rc == KVIDX_EINVAL, "kv_rank.jsonl line %zu: accepted (rc %d)", i + 1, rc);
            const char *bad = NULL;
            for (int j = 0; j < 4 && !bad; j++)
                if (v[j] < 0 || v[j] > 255)
                    bad = names[j];
            cr_expect(why.field && bad && strcmp(why.field, bad) == 0,
                      "kv_rank.jsonl line %zu: reason names %s, want %s", i + 1,
                      why.field ? why.field : "nothing", bad ? bad : "?");
            continue;
        }
        cr_expect(rc == 0, "kv_rank.jsonl line %zu: rejected (rc %d)", i + 1, rc);
        uint32_t want = (uint32_t)json_num(lines[i], "kv_rank");
        cr_expect(out == want, "kv_rank.jsonl line %zu: packed %u, want %u", i + 1, out, want);
        uint8_t u[4];
        kvidx_rank_unpack(want, &u[0], &u[1], &u[2], &u[3]);
        for (int j = 0; j < 4; j++)
            cr_expect(u[j] == (uint8_t)v[j], "kv_rank.jsonl line %zu: unpacked %s %u, want %.0f",
                      i + 1, names[j], u[j], v[j]);
        cr_expect(kvidx_rank_world_size(want) == (uint8_t)v[0],
                  "kv_rank.jsonl line %zu: kvidx_rank_world_size", i + 1);
    }
    free_lines(lines, n);
}

Test(vectors, expand)
{
    size_t n;
    cJSON **lines = vectors_load("expand.jsonl", &n);
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof(where), "expand.jsonl line %zu", i + 1);
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(lines[i], "request");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(lines[i], "canonical_keys");
        const cJSON *hashes = cJSON_GetObjectItemCaseSensitive(req, "chunk_hashes");
        const cJSON *groups = cJSON_GetObjectItemCaseSensitive(req, "object_group_ids");
        const cJSON *worker = cJSON_GetObjectItemCaseSensitive(req, "worker_id");
        cr_assert(cJSON_IsArray(want) && cJSON_IsArray(hashes), "%s: malformed vector", where);

        kvidx_ipc_t ipc = {
            .world_size = (uint32_t)json_num(req, "world_size"),
            .worker_id = cJSON_IsNull(worker) ? -1 : (int32_t)worker->valuedouble,
            .num_chunks = (uint32_t)cJSON_GetArraySize(hashes),
            .num_groups = groups ? (uint32_t)cJSON_GetArraySize(groups) : 1,
        };
        cr_expect(kvidx_ipc_check(&ipc, NULL) == 0, "%s: ipc_check rejects", where);
        uint32_t ranks = kvidx_ipc_num_ranks(&ipc);
        cr_expect(ranks == (cJSON_IsNull(worker) ? ipc.world_size : 1), "%s: %u ranks", where,
                  ranks);
        uint64_t total = kvidx_ipc_total(&ipc);
        cr_expect(total == (uint64_t)cJSON_GetArraySize(want), "%s: %llu keys, want %d", where,
                  (unsigned long long)total, cJSON_GetArraySize(want));

        const char *model = json_str(req, "model_name");
        const char *salt = json_str(req, "cache_salt");
        for (uint64_t f = 0; f < total && f < (uint64_t)cJSON_GetArraySize(want); f++) {
            uint32_t gi, c, r;
            kvidx_ipc_split(&ipc, f, &gi, &c, &r);
            cr_expect((uint64_t)gi * ipc.num_chunks * ranks + (uint64_t)c * ranks + r == f &&
                          gi < ipc.num_groups && c < ipc.num_chunks && r < ranks,
                      "%s: split(%llu) = (%u, %u, %u)", where, (unsigned long long)f, gi, c, r);
            uint16_t group =
                groups ? (uint16_t)cJSON_GetArrayItem(groups, (int)gi)->valuedouble : 0;
            kvidx_key_t k;
            cr_assert(make_key(model, kvidx_ipc_rank(&ipc, r), group,
                               cJSON_GetArrayItem(hashes, (int)c)->valuestring, salt, &k) == 0,
                      "%s: bad chunk hash", where);
            char at[96];
            snprintf(at, sizeof(at), "%s key %llu", where, (unsigned long long)f);
            expect_encodes(&k, 0, cJSON_GetArrayItem(want, (int)f)->valuestring, at);
        }
    }
    free_lines(lines, n);
}

/* ---- docs/keys.md rules, one at a time ---- */

/* A valid input to start from: "00ff", "m", rank 16777472. */
static void base_input(kvidx_key_input_t *in)
{
    memset(in, 0, sizeof(*in));
    in->chunk_hash_hex = (kvidx_field_t){KVIDX_FIELD_STRING, "00ff", 4, 0};
    in->model_name = (kvidx_field_t){KVIDX_FIELD_STRING, "m", 1, 0};
    in->kv_rank = (kvidx_field_t){KVIDX_FIELD_NUMBER, NULL, 0, 16777472};
}

static kvidx_field_t num(double v)
{
    return (kvidx_field_t){KVIDX_FIELD_NUMBER, NULL, 0, v};
}

static kvidx_field_t str(const char *s, size_t n)
{
    return (kvidx_field_t){KVIDX_FIELD_STRING, s, n, 0};
}

static void expect_rejected(const kvidx_key_input_t *in, const char *field, const char *what)
{
    kvidx_key_t k;
    kvidx_reason_t why = {NULL, NULL};
    int rc = kvidx_key_from_input(in, &k, &why);
    cr_expect(rc == KVIDX_EKEY, "%s: accepted (rc %d)", what, rc);
    cr_expect(why.field && strcmp(why.field, field) == 0, "%s: reason names %s, want %s", what,
              why.field ? why.field : "nothing", field);
    cr_expect(why.rule && *why.rule, "%s: empty rule", what);
}

static kvidx_key_t expect_accepted(const kvidx_key_input_t *in, const char *what)
{
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    kvidx_reason_t why = {NULL, NULL};
    int rc = kvidx_key_from_input(in, &k, &why);
    cr_expect(rc == 0, "%s: rejected (%s: %s)", what, why.field ? why.field : "?",
              why.rule ? why.rule : "?");
    return k;
}

Test(rules, integral_numbers)
{
    kvidx_key_input_t in;
    base_input(&in);
    /* The JSON spellings 2, 2.0 and 2e0 as cJSON reads them. */
    static const char *const two[] = {"2", "2.0", "2e0", "0.2e1"};
    for (size_t i = 0; i < 4; i++) {
        cJSON *j = cJSON_Parse(two[i]);
        cr_assert(j != NULL);
        in.kv_rank = num(j->valuedouble);
        in.object_group_id = num(j->valuedouble);
        kvidx_key_t k = expect_accepted(&in, two[i]);
        cr_expect(k.kv_rank == 2 && k.group == 2, "%s: got rank %u group %u", two[i], k.kv_rank,
                  k.group);
        cJSON_Delete(j);
    }
    base_input(&in);
    in.kv_rank = num(4294967295.0);
    cr_expect(expect_accepted(&in, "rank 4294967295").kv_rank == 4294967295u);
    in.kv_rank = num(0);
    cr_expect(expect_accepted(&in, "rank 0").kv_rank == 0);
    in.kv_rank = num(-0.0);
    cr_expect(expect_accepted(&in, "rank -0").kv_rank == 0);

    const struct {
        double v;
        const char *what;
    } bad_rank[] = {{1.5, "1.5"},
                    {4294967296.0, "4294967296"},
                    {4294967295.5, "4294967295.5"},
                    {-1, "-1"},
                    {-0.5, "-0.5"},
                    {1e300, "1e300"},
                    {NAN, "NaN"},
                    {INFINITY, "inf"},
                    {-INFINITY, "-inf"},
                    {0x1p-1074, "denormal"}};
    for (size_t i = 0; i < sizeof(bad_rank) / sizeof(bad_rank[0]); i++) {
        base_input(&in);
        in.kv_rank = num(bad_rank[i].v);
        expect_rejected(&in, "kv_rank", bad_rank[i].what);
    }
    base_input(&in);
    in.kv_rank = str("1", 1);
    expect_rejected(&in, "kv_rank", "rank as string");
    in.kv_rank.kind = KVIDX_FIELD_OTHER; /* true, false, null, [], {} */
    expect_rejected(&in, "kv_rank", "rank as boolean");
    in.kv_rank.kind = KVIDX_FIELD_ABSENT;
    expect_rejected(&in, "kv_rank", "rank missing");

    const double bad_group[] = {65536, -1, 2.5, NAN, INFINITY};
    for (size_t i = 0; i < 5; i++) {
        base_input(&in);
        in.object_group_id = num(bad_group[i]);
        expect_rejected(&in, "object_group_id", "bad group");
    }
    base_input(&in);
    in.object_group_id = num(65535);
    cr_expect(expect_accepted(&in, "group 65535").group == 65535);
    in.object_group_id.kind = KVIDX_FIELD_OTHER;
    expect_rejected(&in, "object_group_id", "group null");
    in.object_group_id = str("1", 1);
    expect_rejected(&in, "object_group_id", "group as string");
}

Test(rules, kvidx_key_integral)
{
    uint64_t out = 7;
    cr_expect(kvidx_key_integral(2.0, 0, 10, &out) == 0 && out == 2);
    cr_expect(kvidx_key_integral(10.0, 0, 10, &out) == 0 && out == 10);
    out = 7;
    cr_expect(kvidx_key_integral(11.0, 0, 10, &out) == KVIDX_EKEY && out == 7);
    cr_expect(kvidx_key_integral(1.25, 0, 10, &out) == KVIDX_EKEY && out == 7);
    cr_expect(kvidx_key_integral(NAN, 0, 10, &out) == KVIDX_EKEY && out == 7);
    cr_expect(kvidx_key_integral(-1.0, -5, 10, &out) == KVIDX_EKEY && out == 7);
    cr_expect(kvidx_key_integral(3.0, 4, 10, &out) == KVIDX_EKEY && out == 7);
}

Test(rules, members)
{
    kvidx_key_input_t in;
    base_input(&in);
    kvidx_key_t k = expect_accepted(&in, "base");
    cr_expect(k.group == 0 && k.salt_len == 0 && k.salt != NULL, "defaults: group %u salt_len %u",
              k.group, k.salt_len);
    in.has_unknown_member = 1;
    expect_rejected(&in, "key", "unknown member");
    base_input(&in);
    in.chunk_hash_hex.kind = KVIDX_FIELD_ABSENT;
    expect_rejected(&in, "chunk_hash_hex", "missing hash");
    in.chunk_hash_hex = num(255);
    expect_rejected(&in, "chunk_hash_hex", "hash as number");
    base_input(&in);
    in.model_name.kind = KVIDX_FIELD_ABSENT;
    expect_rejected(&in, "model_name", "missing model");
    in.model_name.kind = KVIDX_FIELD_OTHER;
    expect_rejected(&in, "model_name", "null model");
    base_input(&in);
    in.cache_salt = num(1);
    expect_rejected(&in, "cache_salt", "salt as number");
    in.cache_salt.kind = KVIDX_FIELD_OTHER;
    expect_rejected(&in, "cache_salt", "salt null");
    in.cache_salt = str("", 0);
    k = expect_accepted(&in, "empty salt");
    cr_expect(k.salt_len == 0);
}

Test(rules, chunk_hash_hex)
{
    char hex[131];
    memset(hex, 'a', sizeof(hex));
    uint8_t out[KVIDX_HASH_MAX];
    uint8_t len = 0;
    kvidx_reason_t why;
    cr_expect(kvidx_key_hash_from_hex(hex, 128, out, &len, &why) == 0 && len == 64, "128 digits");
    cr_expect(kvidx_key_hash_from_hex(hex, 129, out, &len, &why) == KVIDX_EKEY, "129 digits");
    cr_expect(kvidx_key_hash_from_hex(hex, 130, out, &len, &why) == KVIDX_EKEY, "130 digits");
    cr_expect(kvidx_key_hash_from_hex(hex, 2, out, &len, &why) == 0 && len == 1, "2 digits");
    cr_expect(kvidx_key_hash_from_hex(hex, 1, out, &len, &why) == KVIDX_EKEY, "1 digit");
    cr_expect(kvidx_key_hash_from_hex(hex, 0, out, &len, &why) == KVIDX_EKEY, "empty");
    cr_expect(kvidx_key_hash_from_hex("0ff", 3, out, &len, &why) == KVIDX_EKEY, "odd");
    cr_expect(strcmp(why.field, "chunk_hash_hex") == 0);
    const char *const bad[] = {"00 ff", " 00ff", "00ff ", "0g", "0x00", "00\0f", "+1", "\xc3\xa9"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t n = i == 5 ? 4 : strlen(bad[i]);
        cr_expect(kvidx_key_hash_from_hex(bad[i], n, out, &len, &why) == KVIDX_EKEY,
                  "accepted bad hash #%zu", i);
    }
    cr_expect(kvidx_key_hash_from_hex("0AfF9b", 6, out, &len, &why) == 0 && len == 3 &&
              out[0] == 0x0a && out[1] == 0xff && out[2] == 0x9b);

    /* Uppercase input normalizes to lowercase output. */
    kvidx_key_input_t in;
    base_input(&in);
    in.chunk_hash_hex = str("ABCDEF0123", 10);
    kvidx_key_t k = expect_accepted(&in, "uppercase hash");
    char buf[16];
    size_t size = sizeof(buf);
    cr_expect(kvidx_key_hash_to_hex(&k, buf, &size) == 0 && size == 10);
    cr_expect_str_eq(buf, "abcdef0123");
    in.chunk_hash_hex = str("00 ff", 5);
    expect_rejected(&in, "chunk_hash_hex", "space");
}

/* Every byte value at every position of a 26-digit hash (the decoder's
 * 16-digit SSE2 step, its 8-digit word step and the 2-digit tail):
 * accepted exactly when it is a hex digit, and then decoded to the value
 * of that digit. */
Test(rules, chunk_hash_hex_every_byte_everywhere)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t pos = 0; pos < 26; pos++) {
        for (unsigned c = 0; c < 256; c++) {
            char hex[26];
            for (size_t i = 0; i < sizeof(hex); i++)
                hex[i] = digits[(i * 7 + 3) % 16];
            hex[pos] = (char)c;
            int want = (c >= '0' && c <= '9')   ? (int)(c - '0')
                       : (c >= 'a' && c <= 'f') ? (int)(c - 'a' + 10)
                       : (c >= 'A' && c <= 'F') ? (int)(c - 'A' + 10)
                                                : -1;
            uint8_t out[13];
            uint8_t len = 0;
            kvidx_reason_t why;
            int rc = kvidx_key_hash_from_hex(hex, sizeof(hex), out, &len, &why);
            if (want < 0) {
                cr_assert_eq(rc, KVIDX_EKEY, "byte 0x%02x at %zu accepted", c, pos);
                continue;
            }
            cr_assert_eq(rc, 0, "byte 0x%02x at %zu refused", c, pos);
            cr_assert_eq(len, 13);
            for (size_t i = 0; i < 26; i++) {
                int d = i == pos ? want : (int)((i * 7 + 3) % 16);
                int got = i % 2 ? out[i / 2] & 0xf : out[i / 2] >> 4;
                cr_assert_eq(got, d, "digit %zu with byte 0x%02x at %zu", i, c, pos);
            }
        }
    }
}

/* A model name or salt is checked again unless its bytes are those the
 * caller vouches for: a bad name after a good one is still refused. */
Test(rules, checks_skipped_only_for_the_same_bytes)
{
    kvidx_key_input_t in;
    base_input(&in);
    in.valid_model = "good/model";
    in.valid_model_len = 10;
    in.model_name = str("good/mode\xff", 10);
    expect_rejected(&in, "model_name", "bad byte after a vouched-for name");
    in.model_name = str("good/model", 10);
    expect_accepted(&in, "the vouched-for bytes");
    in.valid_salt = "s";
    in.valid_salt_len = 1;
    in.cache_salt = str("\xff", 1);
    expect_rejected(&in, "cache_salt", "bad salt after a vouched-for one");
}

Test(rules, model_name)
{
    kvidx_reason_t why;
    const struct {
        const char *s;
        size_t n;
        int ok;
    } cases[] = {
        {"m", 1, 1},
        {"org/model-v1.2_x", 16, 1},
        {"a\x7f", 2, 1},            /* DEL is not < 0x20 */
        {"\xd0\xbc\xc3\xbc", 4, 1}, /* Cyrillic and Latin */
        {"\xf0\x9f\x98\x80", 4, 1}, /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", 4, 1}, /* U+10FFFF */
        {"\xef\xbf\xbf", 3, 1},     /* U+FFFF */
        {"", 0, 0},
        {"a@b", 3, 0},
        {"a\nb", 3, 0},
        {"a\tb", 3, 0},
        {"\x1f", 1, 0},
        {"a\0b", 3, 0},
        {"\xc0\x80", 2, 0},         /* overlong NUL */
        {"\xc1\xbf", 2, 0},         /* overlong */
        {"\xe0\x80\xaf", 3, 0},     /* overlong '/' */
        {"\xf0\x80\x80\xaf", 4, 0}, /* overlong '/' */
        {"\xed\xa0\x80", 3, 0},     /* U+D800 surrogate */
        {"\xed\xbf\xbf", 3, 0},     /* U+DFFF surrogate */
        {"\xf4\x90\x80\x80", 4, 0}, /* U+110000 */
        {"\xf8\x88\x80\x80\x80", 5, 0},
        {"\x80", 1, 0},      /* stray continuation */
        {"\xe2\x82", 2, 0},  /* truncated */
        {"\xe2\x82x", 3, 0}, /* bad continuation */
        {"\xff", 1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        why.field = NULL;
        int rc = kvidx_key_check_model(cases[i].s, cases[i].n, &why);
        cr_expect(cases[i].ok ? rc == 0 : rc == KVIDX_EKEY, "model case #%zu: rc %d", i, rc);
        if (!cases[i].ok)
            cr_expect(why.field && strcmp(why.field, "model_name") == 0, "model case #%zu", i);
    }
    char long_model[257];
    memset(long_model, 'x', sizeof(long_model));
    cr_expect(kvidx_key_check_model(long_model, 255, NULL) == 0, "255 bytes");
    cr_expect(kvidx_key_check_model(long_model, 256, NULL) == KVIDX_EKEY, "256 bytes");

    kvidx_key_input_t in;
    base_input(&in);
    in.model_name = str("a\x01", 2);
    expect_rejected(&in, "model_name", "model with control char");
    in.model_name = str("a\xed\xa0\x80", 4);
    expect_rejected(&in, "model_name", "model with surrogate");
}

Test(rules, cache_salt)
{
    const struct {
        const char *s;
        size_t n;
        int ok;
    } cases[] = {
        {"", 0, 1},
        {"alice", 5, 1},
        {"a.b_c-d", 7, 1},
        {"\xc3\xbcn\xc3\xaf", 5, 1},
        {"a\x01"
         "b",
         3, 1}, /* control characters other than NUL: docs/keys.md */
        {"a\nb", 3, 1},
        {"a/b", 3, 0},
        {"a@b", 3, 0},
        {"a\\b", 3, 0},
        {"a\0b", 3, 0},
        {"\xc0\xaf", 2, 0}, /* overlong '/' */
        {"\xed\xa0\x80", 3, 0},
        {"\xff", 1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvidx_reason_t why = {NULL, NULL};
        int rc = kvidx_key_check_salt(cases[i].s, cases[i].n, &why);
        cr_expect(cases[i].ok ? rc == 0 : rc == KVIDX_EKEY, "salt case #%zu: rc %d", i, rc);
        if (!cases[i].ok)
            cr_expect(why.field && strcmp(why.field, "cache_salt") == 0, "salt case #%zu", i);
    }
    char salt[129];
    memset(salt, 's', sizeof(salt));
    cr_expect(kvidx_key_check_salt(salt, 128, NULL) == 0, "128 bytes");
    cr_expect(kvidx_key_check_salt(salt, 129, NULL) == KVIDX_EKEY, "129 bytes");

    kvidx_key_input_t in;
    base_input(&in);
    in.cache_salt = str("a/b", 3);
    expect_rejected(&in, "cache_salt", "salt with '/'");
    in.cache_salt = str(salt, 128);
    kvidx_key_t k = expect_accepted(&in, "128-byte salt");
    cr_expect(k.salt_len == 128 && k.salt == salt);
}

/* ---- string forms ---- */

Test(forms, encoder_size_protocol)
{
    kvidx_key_t k;
    cr_assert(make_key("org/m", 0x02010201, 0xab, "00ff", "s", &k) == 0);
    static const char canonical[] = "org/m@02010201@ab@00ff@s";
    static const char fs[] = "org-SEP-m@0x02010201@ab@00ff@s.data";
    const struct {
        int (*enc)(const kvidx_key_t *, char *, size_t *);
        const char *want;
    } cases[] = {{kvidx_key_encode_canonical, canonical},
                 {kvidx_key_encode_fs, fs},
                 {kvidx_key_hash_to_hex, "00ff"}};
    for (size_t i = 0; i < 3; i++) {
        size_t len = strlen(cases[i].want);
        size_t size = 0;
        cr_expect(cases[i].enc(&k, NULL, &size) == KVIDX_ENOBUFS && size == len + 1,
                  "encoder %zu: size query gave %zu, want %zu", i, size, len + 1);
        char buf[64];
        memset(buf, '#', sizeof(buf));
        size = len; /* one short: no room for the NUL */
        cr_expect(cases[i].enc(&k, buf, &size) == KVIDX_ENOBUFS && size == len + 1,
                  "encoder %zu: short buffer gave size %zu", i, size);
        cr_expect(buf[0] == '#', "encoder %zu wrote into a short buffer", i);
        size = len + 1;
        cr_expect(cases[i].enc(&k, buf, &size) == 0 && size == len, "encoder %zu: exact fit", i);
        cr_expect_str_eq(buf, cases[i].want);
        cr_expect(buf[len + 1] == '#', "encoder %zu wrote past the NUL", i);
    }
}

Test(forms, canonical_parser_rules)
{
    const struct {
        const char *s;
        int ok;
        uint32_t rank;
        uint16_t group;
        const char *field; /* for rejections */
    } cases[] = {
        {"m@01000100@0@00ff", 1, 0x01000100, 0, NULL},
        {"m@0x01000100@0@00ff", 1, 0x01000100, 0, NULL},
        {"m@0A0B0C0D@FF@00FF", 1, 0x0a0b0c0d, 0xff, NULL}, /* either case, like the hash */
        {"m@01000100@ffff@00ff@s", 1, 0x01000100, 0xffff, NULL},
        {"m@ffffffff@0@00ff", 1, 0xffffffff, 0, NULL},
        {"m@01000100@00@00ff", 0, 0, 0, "object_group_id"}, /* leading zero */
        {"m@01000100@0ff@00ff", 0, 0, 0, "object_group_id"},
        {"m@01000100@@00ff", 0, 0, 0, "object_group_id"},
        {"m@01000100@10000@00ff", 0, 0, 0, "object_group_id"},
        {"m@01000100@g@00ff", 0, 0, 0, "object_group_id"},
        {"m@1000100@0@00ff", 0, 0, 0, "kv_rank"}, /* 7 digits */
        {"m@1ffffffff@0@00ff", 0, 0, 0, "kv_rank"},
        {"m@0X01000100@0@00ff", 0, 0, 0, "kv_rank"},
        {"m@0x1000100@0@00ff", 0, 0, 0, "kv_rank"},
        {"m@-1000100@0@00ff", 0, 0, 0, "kv_rank"},
        {"m@01000100@0@0ff", 0, 0, 0, "chunk_hash_hex"},
        {"m@01000100@0@", 0, 0, 0, "chunk_hash_hex"},
        {"m@01000100@0@00ff@", 0, 0, 0, "cache_salt"},
        {"m@01000100@0@00ff@a/b", 0, 0, 0, "cache_salt"},
        {"@01000100@0@00ff", 0, 0, 0, "model_name"},
        {"a\nb@01000100@0@00ff", 0, 0, 0, "model_name"},
        {"m@01000100@0", 0, 0, 0, "key"},
        {"m@01000100@0@00ff@s@x", 0, 0, 0, "key"},
        {"", 0, 0, 0, "key"},
        {"m@01000100@0@00ff.data", 0, 0, 0, "chunk_hash_hex"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvidx_key_t k;
        kvidx_reason_t why = {NULL, NULL};
        int rc = kvidx_key_parse_canonical(cases[i].s, strlen(cases[i].s), &k, &why);
        if (cases[i].ok) {
            cr_expect(rc == 0, "'%s' rejected (%s: %s)", cases[i].s, why.field, why.rule);
            if (rc == 0)
                cr_expect(k.kv_rank == cases[i].rank && k.group == cases[i].group,
                          "'%s': rank %08x group %x", cases[i].s, k.kv_rank, k.group);
        } else {
            cr_expect(rc == KVIDX_EKEY, "'%s' accepted", cases[i].s);
            cr_expect(why.field && strcmp(why.field, cases[i].field) == 0,
                      "'%s' rejected for %s, want %s", cases[i].s, why.field ? why.field : "-",
                      cases[i].field);
        }
    }
    /* The parsed view points into the input. */
    const char *s = "org/m@01000100@0@00ff@salt";
    kvidx_key_t k;
    cr_assert(kvidx_key_parse_canonical(s, strlen(s), &k, NULL) == 0);
    cr_expect(k.model == s && k.model_len == 5 && k.salt == s + 22 && k.salt_len == 4);
    /* Only n bytes are read: a longer buffer is cut where the caller says. */
    cr_expect(kvidx_key_parse_canonical(s, 21, &k, NULL) == 0 && k.salt_len == 0 &&
              k.hash_len == 2);
}

Test(forms, fs_parser_rules)
{
    const struct {
        const char *s;
        int ok;
        const char *model;
        uint16_t group;
        const char *salt;
        const char *field;
    } cases[] = {
        {"a-SEP-b@0x01000100@1@00ff@s.data", 1, "a/b", 1, "s", NULL},
        {"a-SEP-b@01000100@1@00ff.data", 1, "a/b", 1, "", NULL},
        {"a-SEP-b@0x01000100@00ff.data", 1, "a/b", 0, "", NULL}, /* legacy */
        {"a-SEP-b@01000100@00ff.data", 1, "a/b", 0, "", NULL},
        {"-SEP--SEP-@0x01000100@0@00ff.data", 1, "//", 0, "", NULL},
        {"a-SEP@0x01000100@0@00ff.data", 1, "a-SEP", 0, "", NULL},
        {"m@0x01000100@0@00ff@x.data.data", 1, "m", 0, "x.data", NULL},
        {"a/b@0x01000100@0@00ff.data", 0, NULL, 0, NULL, "model_name"},
        {"m@0x01000100@0@00ff", 0, NULL, 0, NULL, "key"},
        {"m@0x01000100@0@00ff.dat", 0, NULL, 0, NULL, "key"},
        {"m@0x01000100.data", 0, NULL, 0, NULL, "key"},
        {"m@@0@00ff.data", 0, NULL, 0, NULL, "kv_rank"},
        {"m@0x01000100@0@00ff@.data", 0, NULL, 0, NULL, "cache_salt"},
        {"m@0x01000100@0@00ff@s@t.data", 0, NULL, 0, NULL, "key"},
        {".data", 0, NULL, 0, NULL, "key"},
        {"@0x01000100@0@00ff.data", 0, NULL, 0, NULL, "model_name"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvidx_key_t k;
        char model_buf[KVIDX_MODEL_MAX + 1];
        kvidx_reason_t why = {NULL, NULL};
        int rc = kvidx_key_parse_fs(cases[i].s, strlen(cases[i].s), &k, model_buf, &why);
        if (cases[i].ok) {
            cr_expect(rc == 0, "'%s' rejected (%s: %s)", cases[i].s, why.field, why.rule);
            if (rc != 0)
                continue;
            cr_expect(k.model == model_buf && k.model_len == strlen(cases[i].model) &&
                          memcmp(k.model, cases[i].model, k.model_len) == 0 &&
                          model_buf[k.model_len] == '\0',
                      "'%s': model '%.*s'", cases[i].s, (int)k.model_len, k.model);
            cr_expect(k.group == cases[i].group && k.kv_rank == 0x01000100 &&
                          k.salt_len == strlen(cases[i].salt) &&
                          memcmp(k.salt, cases[i].salt, k.salt_len) == 0,
                      "'%s': group %u salt '%.*s'", cases[i].s, k.group, (int)k.salt_len, k.salt);
        } else {
            cr_expect(rc == KVIDX_EKEY, "'%s' accepted", cases[i].s);
            cr_expect(why.field && strcmp(why.field, cases[i].field) == 0,
                      "'%s' rejected for %s, want %s", cases[i].s, why.field ? why.field : "-",
                      cases[i].field);
        }
    }
}

Test(forms, longest_keys_round_trip)
{
    /* A 255-byte model of '/' is 1275 bytes in the FS form: the longest. */
    char model[KVIDX_MODEL_MAX + 1];
    memset(model, '/', KVIDX_MODEL_MAX);
    model[KVIDX_MODEL_MAX] = '\0';
    char hash[2 * KVIDX_HASH_MAX + 1];
    memset(hash, 'f', 2 * KVIDX_HASH_MAX);
    hash[2 * KVIDX_HASH_MAX] = '\0';
    char salt[KVIDX_SALT_MAX + 1];
    memset(salt, 's', KVIDX_SALT_MAX);
    salt[KVIDX_SALT_MAX] = '\0';
    kvidx_key_t k, back;
    cr_assert(make_key(model, 0xffffffff, 0xffff, hash, salt, &k) == 0);
    char buf[KVIDX_KEY_STR_MAX];
    size_t size = sizeof(buf);
    cr_expect(kvidx_key_encode_fs(&k, buf, &size) == 0 && size + 1 == KVIDX_KEY_STR_MAX,
              "fs length %zu, KVIDX_KEY_STR_MAX %d", size, KVIDX_KEY_STR_MAX);
    char model_buf[KVIDX_MODEL_MAX + 1];
    cr_expect(kvidx_key_parse_fs(buf, size, &back, model_buf, NULL) == 0 &&
              kvidx_key_equal(&back, &k));
    size = sizeof(buf);
    cr_expect(kvidx_key_encode_canonical(&k, buf, &size) == 0);
    cr_expect(kvidx_key_parse_canonical(buf, size, &back, NULL) == 0 && kvidx_key_equal(&back, &k));

    /* One more -SEP- and the decoded model is 256 bytes. */
    char fs[KVIDX_KEY_STR_MAX + 8];
    char *p = fs;
    for (int i = 0; i < 256; i++)
        p += sprintf(p, "-SEP-");
    sprintf(p, "@0x01000100@0@00.data");
    kvidx_reason_t why = {NULL, NULL};
    cr_expect(kvidx_key_parse_fs(fs, strlen(fs), &back, model_buf, &why) == KVIDX_EKEY &&
              why.field && strcmp(why.field, "model_name") == 0);
}

Test(forms, sep_in_model_is_lossy_in_fs_form)
{
    /* Documented flaw shared with LMCache: the FS form of "a-SEP-b" reads
     * back as "a/b"; the canonical form keeps it. */
    kvidx_key_t k, back;
    cr_assert(make_key("a-SEP-b", 1, 0, "00", "", &k) == 0);
    char buf[KVIDX_KEY_STR_MAX], model_buf[KVIDX_MODEL_MAX + 1];
    size_t size = sizeof(buf);
    cr_assert(kvidx_key_encode_fs(&k, buf, &size) == 0);
    cr_expect(kvidx_key_parse_fs(buf, size, &back, model_buf, NULL) == 0);
    cr_expect(back.model_len == 3 && memcmp(back.model, "a/b", 3) == 0);
    size = sizeof(buf);
    cr_assert(kvidx_key_encode_canonical(&k, buf, &size) == 0);
    cr_expect(kvidx_key_parse_canonical(buf, size, &back, NULL) == 0 && kvidx_key_equal(&back, &k));
}

/* ---- comparison ---- */

Test(order, field_precedence)
{
    /* Each pair differs in a more significant field in one direction and in
     * every less significant field in the other, so only the precedence of
     * docs/page_tokens.md can give the expected sign. */
    kvidx_key_t a, b;
    cr_assert(make_key("z", 9, 9, "ff", "a", &a) == 0);
    cr_assert(make_key("a", 1, 1, "00", "b", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0 && kvidx_key_cmp(&b, &a) > 0, "salt first");
    cr_assert(make_key("a", 9, 9, "ff", "s", &a) == 0);
    cr_assert(make_key("b", 1, 1, "00", "s", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0 && kvidx_key_cmp(&b, &a) > 0, "model second");
    cr_assert(make_key("m", 1, 9, "ff", "", &a) == 0);
    cr_assert(make_key("m", 2, 1, "00", "", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0 && kvidx_key_cmp(&b, &a) > 0, "rank third");
    cr_assert(make_key("m", 0x80000000u, 0, "00", "", &a) == 0);
    cr_assert(make_key("m", 0x7fffffffu, 0, "00", "", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) > 0, "rank compares unsigned");
    cr_assert(make_key("m", 1, 1, "ff", "", &a) == 0);
    cr_assert(make_key("m", 1, 2, "00", "", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0 && kvidx_key_cmp(&b, &a) > 0, "group fourth");
    cr_assert(make_key("m", 1, 1, "00ff", "", &a) == 0);
    cr_assert(make_key("m", 1, 1, "00ff00", "", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0 && kvidx_key_cmp(&b, &a) > 0, "prefix hash first");
    cr_assert(make_key("m", 1, 1, "01", "", &a) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) > 0, "hash bytes before length");
    cr_assert(make_key("ab", 1, 1, "00", "", &a) == 0);
    cr_assert(make_key("abc", 1, 1, "00", "", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0, "prefix model first");
    cr_assert(make_key("\xc3\xbc", 1, 1, "00", "", &a) == 0);
    cr_assert(make_key("z", 1, 1, "00", "", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) > 0, "bytes compare unsigned");
    cr_assert(make_key("m", 1, 1, "00", "", &a) == 0);
    cr_assert(make_key("m", 1, 1, "00", "s", &b) == 0);
    cr_expect(kvidx_key_cmp(&a, &b) < 0, "empty salt first");
    b.salt = NULL;
    b.salt_len = 0;
    cr_expect(kvidx_key_cmp(&a, &b) == 0 && kvidx_key_equal(&a, &b), "NULL salt equals empty");
}

Test(order, total_order_over_vectors)
{
    size_t n;
    cJSON **lines = load_nul_safe("keys.jsonl", &n);
    kvidx_key_t *keys = calloc(n, sizeof(*keys));
    input_buf_t *bufs = calloc(n, sizeof(*bufs));
    cr_assert(keys && bufs);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!json_true(lines[i], "valid"))
            continue;
        input_from_json(cJSON_GetObjectItemCaseSensitive(lines[i], "input"), &bufs[m]);
        cr_assert(kvidx_key_from_input(&bufs[m].in, &keys[m], NULL) == 0, "line %zu", i + 1);
        m++;
    }
    for (size_t i = 0; i < m; i++) {
        cr_expect(kvidx_key_cmp(&keys[i], &keys[i]) == 0 && kvidx_key_equal(&keys[i], &keys[i]));
        for (size_t j = 0; j < m; j++) {
            int ij = kvidx_key_cmp(&keys[i], &keys[j]);
            int ji = kvidx_key_cmp(&keys[j], &keys[i]);
            cr_expect((ij > 0) - (ij < 0) == -((ji > 0) - (ji < 0)), "antisymmetry %zu %zu", i, j);
            cr_expect((ij == 0) == kvidx_key_equal(&keys[i], &keys[j]), "equal vs cmp %zu %zu", i,
                      j);
            for (size_t l = 0; l < m; l++)
                if (ij < 0 && kvidx_key_cmp(&keys[j], &keys[l]) < 0)
                    cr_expect(kvidx_key_cmp(&keys[i], &keys[l]) < 0, "transitivity %zu %zu %zu", i,
                              j, l);
        }
    }
    free(keys);
    free(bufs);
    free_lines(lines, n);
}

Test(order, equal_checks_every_field)
{
    kvidx_key_t a, b;
    cr_assert(make_key("m", 1, 2, "0011", "s", &a) == 0);
    b = a;
    cr_expect(kvidx_key_equal(&a, &b));
    b.kv_rank = 3;
    cr_expect(!kvidx_key_equal(&a, &b), "kv_rank");
    b = a;
    b.group = 3;
    cr_expect(!kvidx_key_equal(&a, &b), "group");
    b = a;
    b.hash[1] ^= 1;
    cr_expect(!kvidx_key_equal(&a, &b), "hash byte");
    b = a;
    b.hash_len = 1;
    cr_expect(!kvidx_key_equal(&a, &b), "hash length");
    b = a;
    b.model = "n";
    cr_expect(!kvidx_key_equal(&a, &b), "model");
    b = a;
    b.salt = "t";
    cr_expect(!kvidx_key_equal(&a, &b), "salt");
    b = a;
    b.salt_len = 0;
    cr_expect(!kvidx_key_equal(&a, &b), "salt length");
    /* Bytes after hash_len are not part of the key. */
    b = a;
    b.hash[5] = 0x55;
    cr_expect(kvidx_key_equal(&a, &b) && kvidx_key_cmp(&a, &b) == 0, "hash tail ignored");
}

/* ---- kv_rank and ipc ---- */

Test(rank, pack_limits)
{
    uint32_t out = 0;
    kvidx_reason_t why = {NULL, NULL};
    cr_expect(kvidx_rank_pack(0, 0, 0, 0, &out, &why) == 0 && out == 0);
    cr_expect(kvidx_rank_pack(8, 5, 4, 1, &out, &why) == 0 && out == 0x08050401);
    cr_expect(kvidx_rank_pack(1, 0, 256, 0, &out, &why) == KVIDX_EINVAL &&
              strcmp(why.field, "local_world_size") == 0);
    cr_expect(kvidx_rank_pack(1, 0, 1, -1, &out, &why) == KVIDX_EINVAL &&
              strcmp(why.field, "local_rank") == 0);
    cr_expect(kvidx_rank_pack(INT64_MAX, 0, 1, 0, &out, &why) == KVIDX_EINVAL &&
              strcmp(why.field, "world_size") == 0);
    cr_expect(kvidx_rank_pack(1, INT64_MIN, 1, 0, &out, &why) == KVIDX_EINVAL &&
              strcmp(why.field, "global_rank") == 0);
}

Test(rank, ipc)
{
    kvidx_reason_t why = {NULL, NULL};
    kvidx_ipc_t ipc = {.world_size = 0, .worker_id = -1, .num_chunks = 1, .num_groups = 1};
    cr_expect(kvidx_ipc_check(&ipc, &why) == KVIDX_EINVAL && strcmp(why.field, "world_size") == 0);
    ipc.world_size = 256;
    cr_expect(kvidx_ipc_check(&ipc, &why) == KVIDX_EINVAL && strcmp(why.field, "world_size") == 0);
    ipc.world_size = 255;
    cr_expect(kvidx_ipc_check(&ipc, &why) == 0);
    ipc.worker_id = 255;
    cr_expect(kvidx_ipc_check(&ipc, &why) == KVIDX_EINVAL && strcmp(why.field, "worker_id") == 0);
    ipc.worker_id = -2;
    cr_expect(kvidx_ipc_check(&ipc, &why) == KVIDX_EINVAL && strcmp(why.field, "worker_id") == 0);
    ipc.worker_id = 254;
    cr_expect(kvidx_ipc_check(&ipc, &why) == 0);
    cr_expect(kvidx_ipc_num_ranks(&ipc) == 1);
    cr_expect(kvidx_ipc_rank(&ipc, 0) == 0xfffefffe);

    ipc = (kvidx_ipc_t){.world_size = 4, .worker_id = -1, .num_chunks = 3, .num_groups = 2};
    cr_expect(kvidx_ipc_total(&ipc) == 24);
    for (uint32_t r = 0; r < 4; r++) {
        uint32_t want;
        cr_assert(kvidx_rank_pack(4, r, 4, r, &want, NULL) == 0);
        cr_expect(kvidx_ipc_rank(&ipc, r) == want, "rank slot %u", r);
    }
    uint32_t gi, c, r;
    kvidx_ipc_split(&ipc, 23, &gi, &c, &r);
    cr_expect(gi == 1 && c == 2 && r == 3, "split(23) = %u %u %u", gi, c, r);
    kvidx_ipc_split(&ipc, 13, &gi, &c, &r);
    cr_expect(gi == 1 && c == 0 && r == 1, "split(13) = %u %u %u", gi, c, r);

    ipc.num_chunks = 0;
    cr_expect(kvidx_ipc_total(&ipc) == 0);
    ipc = (kvidx_ipc_t){
        .world_size = 255, .worker_id = -1, .num_chunks = UINT32_MAX, .num_groups = UINT32_MAX};
    cr_expect(kvidx_ipc_total(&ipc) == UINT64_MAX, "saturates instead of wrapping");
    ipc.num_groups = 1;
    cr_expect(kvidx_ipc_total(&ipc) == (uint64_t)UINT32_MAX * 255);
}
