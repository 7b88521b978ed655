/*
 * The loopback HTTP client and the key naming shared by the benchmark
 * programs (bench_http, bench_lookup, bench_cpu, bench_fs_source,
 * bench_fleet): one keep-alive connection, blocking writes, responses read
 * by Content-Length. Header-only because every
 * tests/bench/bench_*.c is its own program; include it once, after
 * defining BENCH_NAME (used in error messages).
 */
#ifndef KVIDX_BENCH_CLIENT_H
#define KVIDX_BENCH_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
