/*
 * A main() for the fuzz targets without libFuzzer: runs the target once on
 * an empty input and once on every file named on the command line or found
 * in a directory named there (not recursively, in name order), so that a
 * plain build's tests replay the committed seeds, the inputs of past
 * findings among them. A target reports a finding by aborting; a path that
 * cannot be read is an error (exit status 1).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    int err = ferror(f) || !buf;
    fclose(f);
    if (err) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(buf);
        return 1;
    }
    /* An exact-size copy, so that a read past the input is caught. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *path, size_t *count)
{
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **m = realloc(names, cap * sizeof(*names));
            if (!m) {
                rc = 1;
                break;
            }
            names = m;
        }
        size_t l = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(l);
        if (!names[n]) {
            rc = 1;
            break;
        }
        snprintf(names[n++], l, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), by_name);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            rc = run_file(names[i]);
            ++*count;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    size_t count = 0;
    LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        int rc = S_ISDIR(st.st_mode) ? run_dir(argv[i], &count) : (count++, run_file(argv[i]));
        if (rc)
            return 1;
    }
    printf("%s: %zu inputs replayed\n", argv[0], count);
    return 0;
}
