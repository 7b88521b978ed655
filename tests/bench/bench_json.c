/*
 * JSON benchmark: a 1000-entry KeyListPage ({"entries":[{"key":{model_name,
 * kv_rank, object_group_id, chunk_hash_hex, cache_salt}, "size_bytes"}...],
 * "next_page_token": "..."}) built two ways, many times:
 *   - cJSON: build a tree, cJSON_PrintUnformatted, free (the "obvious" way);
 *   - jw:    the daemon's streaming writer (daemon/buf.h) into a reused buf.
 * Both outputs are checked byte-identical once. Prints "name value unit"
 * lines: the median over rounds of the per-entry cost.
 * Usage: bench_json [rounds] (default 200; each round builds one page).
 */
#include "bench_util.h"
#include "util/json_write.h"

#include <cjson/cJSON.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ENTRIES = 1000 };

struct ent {
    const char *model;
    uint64_t rank, group, size;
    char hex[65];
    const char *salt;
};

static struct ent ents[ENTRIES];
static const char token[] = "AQAAAAAAAAABAAAAZ2hpamtsbW5vcHFyc3R1dnd4eXo0NTY3ODkwYWJjZGVmZ2hpams";
static volatile size_t sink;

static void build_jw(struct buf *b)
{
    struct jw w;
    buf_reset(b);
    jw_init(&w, b);
    jw_obj_begin(&w);
    jw_key(&w, "entries");
    jw_arr_begin(&w);
    for (int i = 0; i < ENTRIES; i++) {
        const struct ent *e = &ents[i];
        jw_obj_begin(&w);
        jw_key(&w, "key");
        jw_obj_begin(&w);
        jw_key(&w, "model_name");
        jw_str(&w, e->model);
        jw_key(&w, "kv_rank");
        jw_u64(&w, e->rank);
        jw_key(&w, "object_group_id");
        jw_u64(&w, e->group);
        jw_key(&w, "chunk_hash_hex");
        jw_strn(&w, e->hex, 64);
        jw_key(&w, "cache_salt");
        jw_str(&w, e->salt);
        jw_obj_end(&w);
        jw_key(&w, "size_bytes");
        jw_u64(&w, e->size);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_key(&w, "next_page_token");
    jw_str(&w, token);
    jw_obj_end(&w);
}

static char *build_cjson(void)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "entries");
    for (int i = 0; i < ENTRIES; i++) {
        const struct ent *e = &ents[i];
        cJSON *o = cJSON_CreateObject();
        cJSON *k = cJSON_AddObjectToObject(o, "key");
        cJSON_AddStringToObject(k, "model_name", e->model);
        cJSON_AddNumberToObject(k, "kv_rank", (double)e->rank);
        cJSON_AddNumberToObject(k, "object_group_id", (double)e->group);
        cJSON_AddStringToObject(k, "chunk_hash_hex", e->hex);
        cJSON_AddStringToObject(k, "cache_salt", e->salt);
        cJSON_AddNumberToObject(o, "size_bytes", (double)e->size);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddStringToObject(root, "next_page_token", token);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    if (rounds < 1)
        rounds = 1;
    uint64_t r = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < ENTRIES; i++) {
        ents[i].model = "meta-llama/Llama-3.1-8B";
        ents[i].rank = 0x01000100;
        ents[i].group = 0;
        ents[i].size = 2u << 20;
        ents[i].salt = (i & 1) ? "alice" : "";
        for (int j = 0; j < 64; j++) {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            ents[i].hex[j] = "0123456789abcdef"[r & 15];
        }
        ents[i].hex[64] = 0;
    }

    struct buf b;
    buf_init(&b);
    build_jw(&b);
    char *c = build_cjson();
    if (b.failed || !c || strlen(c) != b.len || memcmp(c, b.data, b.len) != 0) {
        fprintf(stderr, "bench_json: outputs differ (jw %zu bytes, cJSON %zu bytes)\n", b.len,
                c ? strlen(c) : 0);
        return 1;
    }
    size_t page_bytes = b.len;
    free(c);

    double *tj = malloc(sizeof(double) * (size_t)rounds);
    double *tc = malloc(sizeof(double) * (size_t)rounds);
    if (!tj || !tc)
        return 1;
    for (int i = 0; i < rounds; i++) {
        double t0 = now();
        build_jw(&b);
        sink += b.len;
        double t1 = now();
        char *s = build_cjson();
        sink += strlen(s);
        free(s);
        double t2 = now();
        tj[i] = t1 - t0;
        tc[i] = t2 - t1;
    }
    qsort(tj, (size_t)rounds, sizeof(double), cmp);
    qsort(tc, (size_t)rounds, sizeof(double), cmp);
    double mj = tj[rounds / 2] * 1e6 / ENTRIES, mc = tc[rounds / 2] * 1e6 / ENTRIES;
    printf("page1000_bytes %zu bytes\n", page_bytes);
    printf("json_cjson_per_entry %.3f us\n", mc);
    printf("json_jw_per_entry %.3f us\n", mj);
    printf("json_cjson_over_jw %.2f x\n", mc / mj);
    buf_free(&b);
    free(tj);
    free(tc);
    return 0;
}
