/*
 * File names of an fs: source (LMCache's FS L2 adapter directory) through
 * the real source: the scan thread's getdents64 and fstatat, the name
 * parser, the batches, the loop side of a resynchronisation, and the
 * inotify path with its alias look-ups. The input's first byte is a plan,
 * the rest up to six names separated by '/' or NUL (the two bytes a file
 * name cannot hold). Bits 0..5: name i is created after the first scan
 * (so that an event reports it) instead of before; bit 6: after that, the
 * first name made before the scan is removed again (an unlink event);
 * bit 7: the first name is an empty file (skipped as empty).
 *
 * Once the scan has ended and the events have been read, the source must
 * hold exactly the keys of the non-empty files whose names end in .data
 * and parse (two spellings of one key count once), each found in the
 * index, and the index must pass its consistency check. Every file is
 * removed before the next input. Each input costs a fresh inotify instance,
 * whose close the kernel makes slow: expect tens of inputs a second.
 */
#include "app.h"
#include "state/keystore.h"
#include "state/sources.h"
#include "util/config.h"
#include "util/context.h"
#include "util/log.h"
#include "util/metrics.h"

#include "kvidx/index.h"
#include "kvidx/key.h"

#include <uv.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAMES 6

static struct app app;
static uv_loop_t loop;
static char dir[256];
static int dirfd_ = -1;

static void check(int ok)
{
    if (!ok)
        abort();
}

struct name {
    char s[256];
    int made, empty, after;
};

static int make_file(struct name *n)
{
    int fd = openat(dirfd_, n->s, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return 0;
    if (!n->empty)
        check(write(fd, "x", 1) == 1);
    close(fd);
    n->made = 1;
    return 1;
}

static void remove_dir(void)
{
    rmdir(dir);
}

static void turn(void)
{
    for (int i = 0; i < 4; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!app.metrics) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/kvidx-fuzz-fs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        check(mkdtemp(dir) != NULL);
        atexit(remove_dir);
        dirfd_ = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        check(dirfd_ >= 0);
        config_defaults(&app.cfg);
        log_setup(getenv("KVIDX_FUZZ_TRACE") ? LOG_DEBUG : LOG_ERROR, LOG_TEXT);
        snprintf(app.cfg.l2_source, sizeof(app.cfg.l2_source), "fs:%s", dir);
        app.metrics = metrics_new();
        app.ready = 1;
        uv_loop_init(&loop);
        app.loop = &loop;
    }
    if (size == 0)
        return 0;
    unsigned plan = data[0];
    static struct name names[NAMES];
    size_t nn = 0;
    for (size_t i = 1; i <= size && nn < NAMES;) {
        size_t j = i;
        while (j < size && data[j] != '/' && data[j] != '\0')
            j++;
        size_t len = j - i;
        if (len >= 1 && len <= 255) {
            struct name *n = &names[nn];
            memset(n, 0, sizeof(*n));
            memcpy(n->s, data + i, len);
            if (strcmp(n->s, ".") != 0 && strcmp(n->s, "..") != 0) {
                n->after = (plan >> nn) & 1;
                n->empty = nn == 0 && (plan & 0x80);
                nn++;
            }
        }
        i = j + 1;
    }
    for (size_t i = 0; i < nn; i++)
        if (!names[i].after)
            make_file(&names[i]);

    check(subsystems_init(&app) == 0);
    /* The first scan: the thread hands its batches over through an async. */
    for (int i = 0; i < 1000 && !sources_ready(&app); i++)
        uv_run(&loop, UV_RUN_ONCE);
    check(sources_ready(&app));
    for (size_t i = 0; i < nn; i++)
        if (names[i].after)
            make_file(&names[i]);
    if (plan & 0x40) {
        for (size_t i = 0; i < nn; i++) {
            if (names[i].made && !names[i].after) {
                check(unlinkat(dirfd_, names[i].s, 0) == 0);
                names[i].made = 0;
                break;
            }
        }
    }
    turn();

    /* What the directory now holds, as keys. */
    kvidx_index_t *idx = app.keystore->idx;
    check(kvidx_index_check(idx) == 0);
    kvidx_key_t keys[NAMES];
    static char models[NAMES][KVIDX_MODEL_MAX + 1];
    size_t nk = 0;
    for (size_t i = 0; i < nn; i++) {
        const struct name *n = &names[i];
        size_t len = strlen(n->s);
        if (!n->made || n->empty || len <= 5 || memcmp(n->s + len - 5, ".data", 5) != 0)
            continue;
        kvidx_key_t k;
        if (kvidx_key_parse_fs(n->s, len, &k, models[nk], NULL) != 0)
            continue;
        int dup = 0;
        for (size_t j = 0; j < nk; j++)
            dup |= kvidx_key_equal(&keys[j], &k);
        if (dup)
            continue;
        keys[nk++] = k;
        kvidx_ref_t ref;
        check(kvidx_index_find(idx, &k, &ref) == 0);
    }
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    check(st.l2_source_keys == nk);

    subsystems_stop(&app);
    uv_run(&loop, UV_RUN_DEFAULT); /* the close callbacks, the scan thread's end */
    subsystems_free(&app);
    for (size_t i = 0; i < nn; i++)
        if (names[i].made)
            unlinkat(dirfd_, names[i].s, 0);
    return 0;
}
