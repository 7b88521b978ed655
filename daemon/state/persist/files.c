/*
 * The data_dir file helpers persistence shares: names of journals, whole
 * writes, atomic replacement, reading a file, listing and deleting
 * journals.
 *
 * Invariants: a file is only ever created under a temporary name and
 * renamed into place after it is complete and fsynced, followed by an
 * fsync of the directory, so a crash leaves either the old file or the
 * new one (and a *.tmp that the next start removes). Nothing here opens
 * a file in a way that can block: a FIFO, directory or device named like
 * one of ours is refused, not waited on. The helpers log nothing; their
 * callers decide what a failure means.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "kvidx/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int why_errno(struct why *w, const char *op, const char *path)
{
    int e = errno;
    if (w)
        snprintf(w->msg, sizeof(w->msg), "cannot %s %s: %s", op, path, strerror(e));
    if (e == ENOENT)
        return KVIDX_ENOTFOUND;
    if (e == ENOMEM)
        return KVIDX_ENOMEM;
    return KVIDX_ESTORAGE;
}

void path_of(const char *dir, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

void journal_name(uint64_t gen, char *out, size_t cap)
{
    snprintf(out, cap, "journal-%016llx.kvj", (unsigned long long)gen);
}

int journal_name_parse(const char *name, uint64_t *gen)
{
    unsigned long long g;
    char again[64];
    if (sscanf(name, "journal-%16llx.kvj", &g) != 1)
        return 0;
    journal_name(g, again, sizeof(again));
    if (strcmp(again, name) != 0)
        return 0;
    *gen = g;
    return 1;
}

int fsync_dir(const char *dir, struct why *w)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return why_errno(w, "open the directory", dir);
    int rc = fsync(fd) == 0 ? 0 : why_errno(w, "fsync the directory", dir);
    close(fd);
    return rc;
}

int write_all(int fd, const void *data, size_t n, const char *path, struct why *w)
{
    const char *s = data;
    while (n) {
        ssize_t r = write(fd, s, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return why_errno(w, "write", path);
        }
        s += r;
        n -= (size_t)r;
    }
    return 0;
}

static const char *file_kind(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISCHR(m) || S_ISBLK(m))
        return "a device";
    return "not a plain file";
}

int file_check_regular(int fd, const char *path, size_t *size, struct why *w)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return why_errno(w, "stat", path);
    if (!S_ISREG(st.st_mode)) {
        if (w)
            snprintf(w->msg, sizeof(w->msg), "%s is not a regular file (it is %s)", path,
                     file_kind(st.st_mode));
        return KVIDX_EINVAL;
    }
    if (size)
        *size = (size_t)st.st_size;
    return 0;
}

int file_open_regular(const char *path, int *fd, size_t *size, struct why *w)
{
    /* O_NONBLOCK: open() of a FIFO with no writer waits for one forever;
     * for a regular file the flag changes nothing. */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0)
        return why_errno(w, "open", path);
    int rc = file_check_regular(f, path, size, w);
    if (rc != 0) {
        close(f);
        return rc;
    }
    *fd = f;
    return 0;
}

int file_read(const char *path, uint8_t **out, size_t *len, struct why *w)
{
    int fd = -1;
    size_t n = 0;
    int rc = file_open_regular(path, &fd, &n, w);
    if (rc != 0)
        return rc;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        errno = ENOMEM;
        rc = why_errno(w, "allocate memory to read", path);
        goto out;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = why_errno(w, "read", path);
            free(b);
            goto out;
        }
        if (r == 0) /* it shrank since fstat: what is there is what was read */
            break;
        got += (size_t)r;
    }
    *out = b;
    *len = got;
out:
    close(fd);
    return rc;
}

int write_atomic(const char *dir, const char *name, const void *data, size_t n, mode_t mode,
                 struct why *w)
{
    char tmp[PATHN], dst[PATHN];
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, name);
    path_of(dir, name, dst, sizeof(dst));
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return why_errno(w, "create", tmp);
    int rc = write_all(fd, data, n, tmp, w);
    if (rc == 0 && fsync(fd) != 0)
        rc = why_errno(w, "fsync", tmp);
    close(fd);
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    if (rename(tmp, dst) != 0)
        return why_errno(w, "rename into place", dst);
    return fsync_dir(dir, w);
}

int journal_create(const char *dir, uint64_t gen, int *fd, struct why *w)
{
    char name[64], path[PATHN];
    uint8_t hdr[KVIDX_JOURNAL_HEADER_LEN];
    journal_name(gen, name, sizeof(name));
    kvidx_journal_header_encode(gen, hdr);
    int rc = write_atomic(dir, name, hdr, sizeof(hdr), 0600, w);
    if (rc != 0)
        return rc;
    path_of(dir, name, path, sizeof(path));
    *fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    return *fd >= 0 ? 0 : why_errno(w, "open for appending", path);
}

void journals_delete_below(const char *dir, uint64_t below)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t g;
        if (journal_name_parse(e->d_name, &g) && g < below) {
            char path[PATHN];
            path_of(dir, e->d_name, path, sizeof(path));
            unlink(path);
        }
    }
    closedir(d);
    fsync_dir(dir, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int journals_list(const char *dir, uint64_t **gens, size_t *n, struct why *w)
{
    *gens = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return why_errno(w, "list", dir);
    size_t cap = 16;
    uint64_t *g = malloc(cap * sizeof(*g));
    int rc = 0;
    struct dirent *e;
    while (g && (e = readdir(d))) {
        uint64_t gen;
        if (!journal_name_parse(e->d_name, &gen))
            continue;
        if (*n == cap) {
            uint64_t *ng = realloc(g, 2 * cap * sizeof(*g));
            if (!ng) {
                free(g);
                g = NULL;
                break;
            }
            g = ng;
            cap *= 2;
        }
        g[(*n)++] = gen;
    }
    closedir(d);
    if (!g) {
        errno = ENOMEM;
        *n = 0;
        return why_errno(w, "allocate memory to list", dir);
    }
    qsort(g, *n, sizeof(*g), cmp_u64);
    *gens = g;
    return rc;
}

void remove_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    int removed = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".tmp") == 0) {
            char path[PATHN];
            path_of(dir, e->d_name, path, sizeof(path));
            if (unlink(path) == 0)
                removed++;
        }
    }
    closedir(d);
    if (removed)
        fsync_dir(dir, NULL);
}
