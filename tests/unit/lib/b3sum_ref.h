/*
 * Test helper: the `b3sum` tool (Debian package b3sum, installed by
 * `scripts/deps.sh test`) as a BLAKE3 reference independent of lib/blake3.c.
 *
 * Inputs are written to files in a fresh temporary directory and hashed by
 * b3sum in batches (one process per up to B3SUM_BATCH files). A missing or
 * failing b3sum fails the calling test with a message naming the package;
 * it never skips.
 */
#ifndef KVIDX_TEST_B3SUM_REF_H
#define KVIDX_TEST_B3SUM_REF_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define B3SUM_BATCH 256

static inline void b3sum_require(void)
{
    FILE *p = popen("b3sum --version 2>/dev/null", "r");
    cr_assert(p != NULL, "cannot run a shell for b3sum");
    char line[128] = "";
    char *got = fgets(line, sizeof(line), p);
    int st = pclose(p);
    cr_assert(got != NULL && st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                  strncmp(line, "b3sum", 5) == 0,
              "b3sum is missing: it is the reference these tests compare against; install "
              "the Debian package b3sum (scripts/deps.sh test, or apt-get install b3sum)");
}

static inline int b3sum_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Decodes 2*n lowercase hex digits at hex into out; 0 on success. */
static inline int b3sum_unhex(const char *hex, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = b3sum_hexval(hex[2 * i]), lo = b3sum_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* outs[i*out_len ..] = the first out_len output bytes of b3sum for
 * inputs[i] (lens[i] bytes), for i < count. */
static inline void b3sum_many(const uint8_t *const *inputs, const size_t *lens, size_t count,
                              size_t out_len, uint8_t *outs)
{
    b3sum_require();
    char dir[] = "/tmp/kvidx-b3sum-XXXXXX";
    cr_assert(mkdtemp(dir) != NULL, "mkdtemp failed");
    size_t cmd_cap = 64 + B3SUM_BATCH * (sizeof(dir) + 24);
    char *cmd = malloc(cmd_cap);
    size_t line_cap = 2 * out_len + 64;
    char *line = malloc(line_cap);
    cr_assert(cmd != NULL && line != NULL);
    for (size_t first = 0; first < count; first += B3SUM_BATCH) {
        size_t n = count - first < B3SUM_BATCH ? count - first : B3SUM_BATCH;
        int used = snprintf(cmd, cmd_cap, "b3sum --no-names --length %zu", out_len);
        for (size_t i = 0; i < n; i++) {
            char path[sizeof(dir) + 24];
            snprintf(path, sizeof(path), "%s/%zu", dir, first + i);
            FILE *f = fopen(path, "wb");
            cr_assert(f != NULL, "cannot create %s", path);
            cr_assert(lens[first + i] == 0 ||
                      fwrite(inputs[first + i], 1, lens[first + i], f) == lens[first + i]);
            cr_assert(fclose(f) == 0);
            used += snprintf(cmd + used, cmd_cap - (size_t)used, " %s", path);
        }
        FILE *p = popen(cmd, "r");
        cr_assert(p != NULL, "cannot run b3sum");
        for (size_t i = 0; i < n; i++) {
            cr_assert(fgets(line, (int)line_cap, p) != NULL, "b3sum printed %zu of %zu lines", i,
                      n);
            cr_assert(strlen(line) == 2 * out_len + 1 && line[2 * out_len] == '\n' &&
                          b3sum_unhex(line, out_len, outs + (first + i) * out_len) == 0,
                      "unexpected b3sum output line: %s", line);
        }
        int st = pclose(p);
        cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "b3sum failed");
        for (size_t i = 0; i < n; i++) {
            char path[sizeof(dir) + 24];
            snprintf(path, sizeof(path), "%s/%zu", dir, first + i);
            unlink(path);
        }
    }
    rmdir(dir);
    free(line);
    free(cmd);
}

/* The first out_len output bytes of b3sum for len bytes at data. */
static inline void b3sum_one(const void *data, size_t len, size_t out_len, uint8_t *out)
{
    const uint8_t *in = data;
    b3sum_many(&in, &len, 1, out_len, out);
}

#endif
