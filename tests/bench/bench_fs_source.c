/*
 * The fs: L2 source (l2_source = fs:<dir>) against a real directory on
 * tmpfs, for tests/bench/run.sh:
 *
 *   bench_fs_source KVIDXD NFILES RENAMES
 *
 * Creates NFILES files named as LMCache's FS L2 adapter names them (sparse,
 * 2 MiB each, so tmpfs holds only their inodes) in a fresh directory under
 * /dev/shm (or /tmp), then measures, in the same run:
 *   - `find DIR -name '*.data' -printf '%s\n' | wc -l` (the reference: the
 *     same getdents and stat work in one process), best of two;
 *   - a kvidxd started on the directory until /readyz answers 200 (its first
 *     full scan, process start included), and the scan time it reports;
 *   - the daemon's resident memory per indexed file (against a daemon on an
 *     empty directory);
 *   - RENAMES files written LMCache's way (a .tmp file renamed onto the
 *     final name), each timed from rename() until GET /v1/keys/{canonical}
 *     answers 200 (polled on one keep-alive connection): p50 and p99.
 * Prints "name value unit" lines; removes the directory and stops every
 * process it started, by PID.
 */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

#define BENCH_NAME "bench_fs_source"
#include "bench_client.h"

#define FILE_SIZE (2u << 20)

static char dir[512];

static void fs_name(uint64_t i, char *out, size_t cap)
{
    char hex[65];
    key_hex(i, hex);
    snprintf(out, cap, "%s/meta-llama-SEP-Llama-3.1-8B@0x%08x@0@%s.data", dir, RANK, hex);
}

static void canonical(uint64_t i, char *out, size_t cap)
{
    char hex[65];
    key_hex(i, hex);
    snprintf(out, cap, MODEL "@%08x@0@%s", RANK, hex);
}

static void make_file(const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, FILE_SIZE) != 0)
        die("cannot create a file");
    close(fd);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        die("no free port");
    close(fd);
    return ntohs(a.sin_port);
}

static long rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* One request on a fresh connection: the status (0 when it cannot connect). */
static int get_once(int port, const char *path, char *body, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    char req[512];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    send_all(fd, req, (size_t)n);
    const char *b;
    size_t bl;
    int st = http_read(fd, &b, &bl);
    if (body && cap) {
        size_t m = bl < cap - 1 ? bl : cap - 1;
        memcpy(body, b, m);
        body[m] = 0;
    }
    close(fd);
    return st;
}

static pid_t start_daemon(const char *kvidxd, const char *source_dir, int port)
{
    char listen[64], source[600];
    snprintf(listen, sizeof(listen), "listen=127.0.0.1:%d", port);
    snprintf(source, sizeof(source), "l2_source=fs:%s", source_dir);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1);
        execl(kvidxd, kvidxd, "--set", listen, "--set", source, "--set", "log_level=warn",
              (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        die("fork");
    return pid;
}

/* Seconds from now until /readyz answers 200 (polled every 2 ms). */
static double wait_ready(int port, pid_t pid, double t0)
{
    for (;;) {
        if (get_once(port, "/readyz", NULL, 0) == 200)
            return now() - t0;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            die("kvidxd exited before it was ready");
        if (now() - t0 > 600)
            die("kvidxd not ready after 600 s");
        usleep(2000);
    }
}

static void stop_daemon(pid_t pid)
{
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
}

static double run_find(void)
{
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "find '%s' -name '*.data' -printf '%%s\\n' | wc -l", dir);
    double t0 = now();
    FILE *p = popen(cmd, "r");
    long n = -1;
    if (!p || fscanf(p, "%ld", &n) != 1)
        die("find failed");
    pclose(p);
    double t = now() - t0;
    fprintf(stderr, "   find saw %ld files in %.3f s\n", n, t);
    return t;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void cleanup(long nfiles, long renames)
{
    char path[700];
    for (long i = 0; i < nfiles + renames; i++) {
        fs_name((uint64_t)i, path, sizeof(path));
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/x.tmp", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s.empty", dir);
    rmdir(path);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc != 4)
        die("usage: bench_fs_source KVIDXD NFILES RENAMES");
    const char *kvidxd = argv[1];
    long nfiles = atol(argv[2]), renames = atol(argv[3]);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof(dir), "%s/kvidx-bench-fs.XXXXXX", base);
    if (!mkdtemp(dir))
        die("mkdtemp");
    char path[700], empty[600];
    snprintf(empty, sizeof(empty), "%s.empty", dir);
    if (mkdir(empty, 0755))
        die("mkdir");

    double t0 = now();
    for (long i = 0; i < nfiles; i++) {
        fs_name((uint64_t)i, path, sizeof(path));
        make_file(path);
    }
    fprintf(stderr, "   created %ld files in %s in %.1f s\n", nfiles, dir, now() - t0);

    double tf = run_find();
    double tf2 = run_find();
    tf = tf2 < tf ? tf2 : tf;

    /* Baseline memory: a daemon on an empty directory. */
    int port = free_port();
    pid_t pid = start_daemon(kvidxd, empty, port);
    wait_ready(port, pid, now());
    long rss0 = rss_of(pid);
    stop_daemon(pid);

    port = free_port();
    t0 = now();
    pid = start_daemon(kvidxd, dir, port);
    double ts = wait_ready(port, pid, t0);
    long rss1 = rss_of(pid);
    char stats[4096] = "";
    get_once(port, "/v1/stats", stats, sizeof(stats));
    const char *sd = strstr(stats, "\"scan_duration_ms\":");
    const char *keys = strstr(stats, "\"sources\"");
    keys = keys ? strstr(keys, "\"keys\":") : NULL;
    long scan_ms = sd ? atol(sd + 19) : -1, indexed = keys ? atol(keys + 7) : -1;
    if (indexed != nfiles)
        fprintf(stderr, "   WARNING: the daemon indexed %ld of %ld files\n", indexed, nfiles);

    /* rename() -> visible in GET. */
    double *lat = malloc((size_t)(renames ? renames : 1) * sizeof(*lat));
    int fd = dial(port);
    char tmp[700], canon[256], req[512];
    snprintf(tmp, sizeof(tmp), "%s/x.tmp", dir);
    long polls = 0;
    for (long r = 0; r < renames; r++) {
        uint64_t i = (uint64_t)(nfiles + r);
        fs_name(i, path, sizeof(path));
        canonical(i, canon, sizeof(canon));
        make_file(tmp);
        int n = snprintf(req, sizeof(req), "GET /v1/keys/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                         canon);
        double s = now();
        if (rename(tmp, path))
            die("rename");
        for (;;) {
            send_all(fd, req, (size_t)n);
            const char *b;
            size_t bl;
            polls++;
            if (http_read(fd, &b, &bl) == 200)
                break;
            if (now() - s > 10)
                die("a renamed file did not appear within 10 s");
        }
        lat[r] = now() - s;
    }
    close(fd);
    stop_daemon(pid);
    cleanup(nfiles, renames);

    qsort(lat, (size_t)renames, sizeof(*lat), cmp_double);
    double p50 = renames ? lat[renames / 2] : 0, p99 = renames ? lat[(renames * 99) / 100] : 0;
    printf("fs_files %ld files\n", nfiles);
    printf("fs_find_seconds %.3f s\n", tf);
    printf("fs_scan_to_ready_seconds %.3f s\n", ts);
    printf("fs_scan_server_seconds %.3f s\n", scan_ms / 1000.0);
    printf("fs_scan_files_per_s %.0f files/s\n", (double)nfiles / ts);
    printf("fs_find_files_per_s %.0f files/s\n", (double)nfiles / tf);
    printf("fs_scan_over_find %.2f x\n", ts / tf);
    printf("fs_rss_bytes_per_file %.1f bytes\n",
           rss0 > 0 && rss1 > 0 ? (double)(rss1 - rss0) / (double)nfiles : -1.0);
    printf("fs_rename_visible_p50_ms %.3f ms\n", p50 * 1000);
    printf("fs_rename_visible_p99_ms %.3f ms\n", p99 * 1000);
    printf("fs_rename_visible_max_ms %.3f ms\n", renames ? lat[renames - 1] * 1000 : 0);
    printf("fs_rename_polls_per_rename %.1f polls\n", renames ? (double)polls / renames : 0);
    free(lat);
    return 0;
}
