/*
 * Index benchmark: resident memory per key for 10M L2 keys of one model
 * (32-, 16- and 8-byte hashes, each measured in a fresh child process),
 * put throughput in batches of 1000, and the cost of a 1000-entry page at
 * the start versus after 9M keys. Prints "name value unit" lines.
 * Usage: bench_index [keys] (default 10000000).
 */
#include "bench_util.h"
#include "kvidx/err.h"
#include "kvidx/index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { BATCH = 1000 };

static kvidx_index_t *load(size_t nkeys, uint8_t hash_len, double *secs)
{
    kvidx_index_t *idx = bench_new_index();
    static kvidx_put_t items[BATCH];
    for (size_t i = 0; i < BATCH; i++) {
        memset(&items[i].key, 0, sizeof(items[i].key));
        items[i].key.model = "meta-llama/Llama-3.1-8B";
        items[i].key.model_len = (uint16_t)strlen(items[i].key.model);
        items[i].key.kv_rank = 0x01000100;
        items[i].key.hash_len = hash_len;
        items[i].size_bytes = 2 << 20;
    }
    double t0 = now();
    for (size_t done = 0; done < nkeys; done += BATCH) {
        size_t n = nkeys - done < BATCH ? nkeys - done : BATCH;
        for (size_t i = 0; i < n; i++)
            for (uint8_t b = 0; b < hash_len; b += 8) {
                uint64_t x = rnd();
                memcpy(items[i].key.hash + b, &x, hash_len - b < 8 ? hash_len - b : 8);
            }
        int rc = kvidx_index_put_batch(idx, KVIDX_TIER_L2, items, n, NULL);
        if (rc) {
            fprintf(stderr, "put: %s\n", kvidx_err_name(rc));
            exit(1);
        }
    }
    *secs = now() - t0;
    return idx;
}

static double page_time(kvidx_index_t *idx, const kvidx_key_t *after, int reps)
{
    static kvidx_ref_t refs[BATCH];
    kvidx_key_buf_t resume;
    size_t n;
    int more;
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        kvidx_index_list(idx, NULL, after, BATCH, 10 * BATCH + 1000, refs, &n, &resume, &more,
                         NULL);
        /* What a handler does with each entry: fetch its key and info. */
        for (size_t i = 0; i < n; i++) {
            kvidx_key_t k;
            kvidx_entry_info_t info;
            kvidx_index_key(idx, refs[i], &k);
            kvidx_index_info(idx, refs[i], &info);
        }
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

static void measure(size_t nkeys, uint8_t hash_len, int full)
{
    long before = rss_bytes();
    double secs;
    kvidx_index_t *idx = load(nkeys, hash_len, &secs);
    long after = rss_bytes();
    printf("rss_per_key_hash%u %.1f bytes\n", hash_len, (double)(after - before) / (double)nkeys);
    if (!full) {
        kvidx_index_free(idx);
        return;
    }
    printf("put_rate_batch1000_hash%u %.0f keys/s\n", hash_len, (double)nkeys / secs);

    /* Find the key at position 0.9 * nkeys by listing. */
    static kvidx_ref_t refs[BATCH];
    kvidx_key_buf_t resume, at;
    size_t n, skipped = 0, target = nkeys / 10 * 9;
    int more = 1, have = 0;
    while (more && skipped < target) {
        size_t want = target - skipped < BATCH ? target - skipped : BATCH;
        kvidx_index_list(idx, NULL, have ? &resume.key : NULL, want, 10 * BATCH + 1000, refs, &n,
                         &resume, &more, NULL);
        skipped += n;
        have = 1;
        if (n) {
            kvidx_key_t k;
            kvidx_index_key(idx, refs[n - 1], &k);
            kvidx_key_buf_set(&at, &k);
        }
    }
    double t_start = page_time(idx, NULL, 200);
    double t_deep = page_time(idx, &at.key, 200);
    printf("page1000_start %.1f us\n", t_start * 1e6);
    printf("page1000_after_%zu %.1f us\n", skipped, t_deep * 1e6);
    printf("page1000_ratio %.2f x\n", t_deep / t_start);

    /* Lookups of present keys. */
    double t0 = now();
    size_t found = 0;
    rng = 0x243f6a8885a308d3ULL;
    kvidx_key_t k;
    memset(&k, 0, sizeof(k));
    k.model = "meta-llama/Llama-3.1-8B";
    k.model_len = (uint16_t)strlen(k.model);
    k.kv_rank = 0x01000100;
    k.hash_len = hash_len;
    for (size_t i = 0; i < 1000000; i++) {
        for (uint8_t b = 0; b < hash_len; b += 8) {
            uint64_t x = rnd();
            memcpy(k.hash + b, &x, hash_len - b < 8 ? hash_len - b : 8);
        }
        kvidx_ref_t ref;
        found += kvidx_index_find(idx, &k, &ref) == 0;
    }
    printf("find_rate %.0f keys/s\n", 1e6 / (now() - t0));
    if (found != 1000000)
        fprintf(stderr, "find: only %zu found\n", found);
    kvidx_index_free(idx);
}

int main(int argc, char **argv)
{
    size_t nkeys = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 10000000;
    static const uint8_t lens[] = {32, 16, 8};
    for (int i = 0; i < 3; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            measure(nkeys, lens[i], i == 0);
            fflush(stdout);
            _exit(0);
        }
        int st;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            return 1;
    }
    return 0;
}
