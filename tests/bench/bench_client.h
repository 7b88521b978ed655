/*
 * The loopback HTTP client and the key naming shared by the benchmark
 * programs (bench_http, bench_lookup, bench_cpu, bench_fs_source,
 * bench_fleet): one keep-alive connection, blocking writes, responses read
 * by Content-Length; a growable string; the server process's CPU time and
 * resident bytes. Header-only because every tests/bench/bench_*.c is its
 * own program; include it once, after defining BENCH_NAME (used in error
 * messages).
 */
#ifndef KVIDX_BENCH_CLIENT_H
#define KVIDX_BENCH_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MODEL "meta-llama/Llama-3.1-8B"
#define RANK  0x01000100u

static void die(const char *m)
{
    fprintf(stderr, BENCH_NAME ": %s\n", m);
    exit(1);
}

/* A growable string; sput appends printf-style and dies on out-of-memory. */
struct str {
    char *p;
    size_t n, cap;
};

static inline void sput(struct str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void sput(struct str *s, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(s->p ? s->p + s->n : NULL, s->p ? s->cap - s->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0)
            die("vsnprintf");
        if (s->p && s->n + (size_t)k < s->cap) {
            s->n += (size_t)k;
            return;
        }
        s->cap = (s->cap + (size_t)k + 1) * 2;
        s->p = realloc(s->p, s->cap);
        if (!s->p)
            die("oom");
    }
}

/* The server's CPU time (utime + stime from /proc/PID/stat) in seconds;
 * dies when it cannot be read. */
static inline double server_cpu_s(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        die("cannot read the server's /proc/PID/stat");
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    if (!p)
        die("bad /proc/PID/stat");
    /* After the command: field 3 (state) ... utime is field 14, stime 15. */
    unsigned long long ut = 0, st = 0;
    p += 2;
    for (int field = 3; field < 14; field++) {
        p = strchr(p, ' ');
        if (!p)
            die("bad /proc/PID/stat");
        p++;
    }
    if (sscanf(p, "%llu %llu", &ut, &st) != 2)
        die("bad /proc/PID/stat");
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* The server's resident bytes (VmRSS of /proc/PID/status), or -1 when the
 * file cannot be opened. */
static inline long server_rss(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atol(line + 6);
    fclose(f);
    return kb * 1024;
}

/* "Authorization: Bearer $KVIDX_BENCH_TOKEN\r\n" when that variable is
 * set (a daemon with auth_tokens_file), else "": every request of the
 * programs carries it, so the same run measures with and without auth. */
static inline const char *auth_header(void)
{
    static char h[400];
    static int done;
    if (!done) {
        const char *t = getenv("KVIDX_BENCH_TOKEN");
        if (t && *t && strlen(t) < 300)
            snprintf(h, sizeof(h), "Authorization: Bearer %s\r\n", t);
        done = 1;
    }
    return h;
}

/* The 64 hex digits of key i's chunk hash: every program names the same
 * keys, so one can read what another loaded. */
static void key_hex(uint64_t i, char out[65])
{
    uint64_t x = i * 0x9e3779b97f4a7c15ULL + 0x243f6a8885a308d3ULL;
    for (int j = 0; j < 64; j++) {
        if (j % 16 == 0) {
            x += 0x9e3779b97f4a7c15ULL;
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            x = z ^ (z >> 31);
        }
        out[j] = "0123456789abcdef"[(x >> (4 * (j % 16))) & 15];
    }
    out[64] = 0;
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)))
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            die("write");
        p += w;
        n -= (size_t)w;
    }
}

static char *rb;
static size_t rlen, rcap;

static void fill(int fd)
{
    if (rcap - rlen < 65536) {
        rcap = rcap ? rcap * 2 : 1 << 20;
        rb = realloc(rb, rcap + 1);
        if (!rb)
            die("oom");
    }
    ssize_t r = read(fd, rb + rlen, rcap - rlen);
    if (r <= 0)
        die("read: connection closed");
    rlen += (size_t)r;
    rb[rlen] = 0;
}

/* One HTTP response (Content-Length, or none for 204); status; body in rb. */
static int http_read(int fd, const char **body, size_t *blen)
{
    rlen = 0;
    char *eoh;
    for (;;) {
        if (rlen && (eoh = strstr(rb, "\r\n\r\n")))
            break;
        fill(fd);
    }
    int status = atoi(rb + 9);
    const char *cl = strcasestr(rb, "\r\ncontent-length:");
    size_t len = 0;
    if (cl && cl < eoh)
        len = strtoull(cl + 17, NULL, 10);
    else if (status != 204)
        die("no content-length");
    size_t hdr = (size_t)(eoh - rb) + 4;
    while (rlen < hdr + len)
        fill(fd);
    *body = rb + hdr;
    *blen = len;
    return status;
}

#endif
