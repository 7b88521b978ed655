/*
 * Persistence figures, in one run:
 *  - restore: an index of N keys (default 10M; argv[1] or KVIDX_BENCH_KEYS)
 *    is written as a snapshot with the daemon's own code
 *    (persist_write_snapshot), then loaded into a fresh index with
 *    persist_load_snapshot, the path kvidxd takes at start (target <= 3 s
 *    for 10M keys);
 *  - journal append throughput under each fsync policy (always: write +
 *    fdatasync per group of 64 records, as a busy group commit; everysec:
 *    writes, fdatasync once a second; no: writes only), each beside a plain
 *    sequential write of the same bytes in 1 MiB blocks ("dd") in the same
 *    run and directory, with one final fsync.
 * Prints "name value unit" lines. Uses KVIDX_BENCH_DIR (default /tmp).
 */
#include "bench_util.h"
#include "state/layouts.h"
#include "state/persist/persist.h"

#include "kvidx/err.h"
#include "kvidx/index.h"
#include "kvidx/journal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void fill_key(kvidx_key_t *k)
{
    memset(k, 0, sizeof(*k));
    k->model = "meta-llama/Llama-3.1-8B";
    k->model_len = (uint16_t)strlen(k->model);
    k->kv_rank = 0x01000100;
    k->hash_len = 32;
    for (int b = 0; b < 32; b += 8) {
        uint64_t x = rnd();
        memcpy(k->hash + b, &x, 8);
    }
}

static void bench_restore(const char *dir, size_t nkeys)
{
    /* Filled with the bulk loader in key order (hash = big-endian counter,
     * then random bytes) to keep the run short; one key in 8 has L1. */
    kvidx_index_t *idx = bench_new_index();
    enum { B = 65536 };
    static kvidx_load_t items[B];
    double tf = now();
    for (size_t done = 0; done < nkeys; done += B) {
        size_t n = nkeys - done < B ? nkeys - done : B;
        for (size_t i = 0; i < n; i++) {
            fill_key(&items[i].key);
            uint64_t c = done + i;
            for (int b = 0; b < 8; b++)
                items[i].key.hash[b] = (uint8_t)(c >> (56 - 8 * b));
            items[i].size_bytes = 2 << 20;
            items[i].tiers = (c % 8 == 0 ? KVIDX_DURABLE_L1 : 0) | KVIDX_DURABLE_L2;
        }
        if (kvidx_index_load(idx, items, n, NULL))
            exit(1);
    }
    printf("bulk_load_seconds %.3f s\n", now() - tf);
    struct layouts *l = layouts_new();
    double t0 = now();
    int rc = persist_write_snapshot(idx, l, dir, 1);
    if (rc != 0) {
        fprintf(stderr, "persist_write_snapshot: %s\n", kvidx_err_name(rc));
        exit(1);
    }
    double t1 = now();
    /* What the loop pays to start a snapshot: the fork() of a process
     * holding this index (the child exits at once). */
    double f0 = now();
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    double f1 = now();
    if (pid > 0)
        waitpid(pid, NULL, 0);
    kvidx_index_free(idx);
    layouts_free(l);
    char path[1200];
    snprintf(path, sizeof(path), "%s/snapshot.kvs", dir);
    FILE *f = fopen(path, "rb");
    long size = 0;
    if (f && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (f)
        fclose(f);

    /* The reader alone (read, checksum, decode), to split the figure. */
    {
        double r0 = now();
        FILE *rf = fopen(path, "rb");
        uint8_t *buf = malloc((size_t)size);
        if (!rf || !buf || fread(buf, 1, (size_t)size, rf) != (size_t)size)
            exit(1);
        fclose(rf);
        kvidx_snapshot_reader_t rd;
        kvidx_jrec_t rec;
        size_t seen = 0;
        if (kvidx_snapshot_open(&rd, buf, (size_t)size, NULL) != 0)
            exit(1);
        while (kvidx_snapshot_next(&rd, &rec) == 1)
            seen++;
        printf("snapshot_read_decode_seconds %.3f s\n", now() - r0);
        free(buf);
        if (seen != nkeys)
            exit(1);
    }
    printf("snapshot_fork_ms %.2f ms\n", (f1 - f0) * 1e3);
    printf("snapshot_keys %zu keys\n", nkeys);
    printf("snapshot_bytes %ld bytes\n", size);
    printf("snapshot_write_seconds %.3f s\n", t1 - t0);
    fflush(stdout);
    /* The restore runs in a fresh process, as at kvidxd's start: this one
     * has just freed an index of the same size, whose pages a restore here
     * would reuse without the first-touch cost a starting daemon pays. */
    pid = fork();
    if (pid == 0) {
        setenv("KVIDX_BENCH_RESTORE_ONLY", "1", 1);
        setenv("KVIDX_BENCH_DIR", dir, 1);
        execl("/proc/self/exe", "bench_persist", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "restore in a fresh process failed\n");
        exit(1);
    }
    if (!getenv("KVIDX_BENCH_KEEP"))
        unlink(path);
}

/* Encodes n journal records of realistic keys into one buffer. */
static uint8_t *make_records(size_t n, size_t *len, size_t **offs)
{
    size_t cap = n * 96;
    uint8_t *b = malloc(cap);
    *offs = malloc((n + 1) * sizeof(**offs));
    if (!b || !*offs)
        exit(1);
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        kvidx_jrec_t r;
        memset(&r, 0, sizeof(r));
        r.type = KVIDX_JREC_KEY;
        fill_key(&r.key);
        r.tiers = KVIDX_STATE_L2;
        r.size_bytes = 2 << 20;
        size_t w = 0;
        (*offs)[i] = *len;
        if (kvidx_jrec_encode(&r, b + *len, cap - *len, &w))
            exit(1);
        *len += w;
    }
    (*offs)[n] = *len;
    return b;
}

static int open_new(const char *path)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    return fd;
}

static void wr(int fd, const void *p, size_t n)
{
    const char *s = p;
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w <= 0) {
            perror("write");
            exit(1);
        }
        s += w;
        n -= (size_t)w;
    }
}

/* Plain sequential write of len bytes in 1 MiB blocks and one fsync. */
static double dd(const char *path, const uint8_t *b, size_t len)
{
    int fd = open_new(path);
    double t0 = now();
    for (size_t off = 0; off < len; off += 1 << 20)
        wr(fd, b + off, len - off < (1 << 20) ? len - off : (1 << 20));
    fdatasync(fd);
    double t = now() - t0;
    close(fd);
    unlink(path);
    return t;
}

static void bench_journal(const char *dir)
{
    char path[1200], ddpath[1200];
    snprintf(path, sizeof(path), "%s/bench-journal.kvj", dir);
    snprintf(ddpath, sizeof(ddpath), "%s/bench-dd.bin", dir);
    static const char *const names[] = {"always", "everysec", "no"};
    size_t nrec = 1000000;
    size_t len;
    size_t *offs;
    uint8_t *b = make_records(nrec, &len, &offs);
    printf("journal_record_bytes %.1f bytes\n", (double)len / (double)nrec);
    for (int policy = 0; policy < 3; policy++) {
        const size_t group = 64;
        /* always: stop after ~4 s (fsync-bound); the others write it all. */
        double budget = policy == 0 ? 4.0 : 1e9;
        int fd = open_new(path);
        double t0 = now(), last_sync = t0;
        size_t i = 0, syncs = 0;
        while (i < nrec && now() - t0 < budget) {
            size_t j = i + group < nrec ? i + group : nrec;
            wr(fd, b + offs[i], offs[j] - offs[i]);
            i = j;
            if (policy == 0 || (policy == 1 && now() - last_sync >= 1.0)) {
                fdatasync(fd);
                syncs++;
                last_sync = now();
            }
        }
        if (policy != 2) {
            fdatasync(fd);
            syncs++;
        }
        double t = now() - t0;
        close(fd);
        unlink(path);
        size_t bytes = offs[i];
        double tdd = dd(ddpath, b, bytes);
        printf("journal_%s_MBps %.1f MB/s\n", names[policy], (double)bytes / t / 1e6);
        printf("journal_%s_records_per_s %.0f records/s\n", names[policy], (double)i / t);
        printf("journal_%s_fsyncs %zu fsyncs\n", names[policy], syncs);
        printf("journal_%s_dd_MBps %.1f MB/s\n", names[policy], (double)bytes / tdd / 1e6);
    }
    free(b);
    free(offs);
}

int main(int argc, char **argv)
{
    const char *dir = getenv("KVIDX_BENCH_DIR");
    const char *nk = argc > 1 ? argv[1] : getenv("KVIDX_BENCH_KEYS");
    size_t nkeys = nk ? (size_t)strtoull(nk, NULL, 10) : 10000000;
    if (!dir || !*dir)
        dir = "/tmp";
    if (getenv("KVIDX_BENCH_RESTORE_ONLY")) {
        /* Profiling aid: load an existing dir/snapshot.kvs and exit. */
        char path[1200];
        snprintf(path, sizeof(path), "%s/snapshot.kvs", dir);
        kvidx_index_t *idx = bench_new_index();
        struct layouts *l = layouts_new();
        struct persist_snapshot_info info;
        const char *why = NULL;
        double t0 = now();
        int rc = persist_load_snapshot(path, idx, l, &info, &why);
        uint64_t k = info.keys;
        double t1 = now();
        if (rc != 0) {
            fprintf(stderr, "restore failed: %d %s\n", rc, why ? why : "");
            return 1;
        }
        printf("snapshot_restore_seconds %.3f s (%llu keys, fresh process)\n", t1 - t0,
               (unsigned long long)k);
        printf("snapshot_restore_rate %.2f Mkeys/s\n", (double)k / (t1 - t0) / 1e6);
        printf("restored_rss_bytes_per_key %.1f B/key\n", (double)rss_bytes() / (double)k);
        return 0;
    }
    bench_journal(dir);
    bench_restore(dir, nkeys);
    return 0;
}
