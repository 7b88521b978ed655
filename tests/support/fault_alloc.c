/*
 * A failing allocator for the test build kvidxd_faults; never part of
 * kvidxd. The executable is linked with --wrap=malloc,calloc,realloc so that
 * every allocation of the daemon's own code (and of libkvidx, linked in
 * statically) comes here; cJSON and libuv are shared libraries, so they are
 * pointed here through their allocator hooks, and libkvidx through
 * kvidx_set_allocator as well (which also covers its huge-page path). All
 * of it is set up in a constructor, before main() and before libuv or cJSON
 * allocate anything, so kvidxd's own main() stays unchanged.
 *
 * Control: KVIDX_FAULT_ALLOC="after=N,every=M,count=K,armed=A". While
 * armed, allocations are numbered from 1; number N+1 fails, then every Mth
 * after it (M=1: all of them), until K have failed in this armed window
 * (K=0: no limit); then the window stops failing by itself. armed=0 starts
 * disarmed (the default is armed). SIGUSR2 toggles arming; arming restarts
 * the numbering and the window's failure count. Each toggle, and reaching
 * the limit, writes one line to stderr with the totals:
 *   fault_alloc: disarmed allocations=123 failed=45
 * so a test can both synchronise on the signal and quote the figures.
 *
 * Invariants: a failing call returns NULL and touches nothing (realloc
 * keeps the old block); a passing call is exactly the libc (or sanitizer)
 * allocator, reached through __real_* so ASan still sees every block; the
 * state is atomics only, because the thread pool allocates too and the
 * signal handler writes it.
 */
#include "kvidx/alloc.h"

#include <cjson/cJSON.h>
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static unsigned long cfg_after, cfg_every = 1, cfg_count;
static atomic_int armed;
static atomic_ulong window_calls, window_failed;
static atomic_ulong total_calls, total_failed;

/* Writes "fault_alloc: <what> allocations=<n> failed=<m>\n" with write(2)
 * only: it runs in the signal handler and inside malloc. */
static void report(const char *what)
{
    char line[160];
    size_t len = 0;
    const char *parts[] = {"fault_alloc: ", what, " allocations=", NULL, " failed=", NULL, "\n"};
    unsigned long nums[] = {atomic_load(&total_calls), atomic_load(&total_failed)};
    int num = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (parts[i]) {
            size_t l = strlen(parts[i]);
            memcpy(line + len, parts[i], l);
            len += l;
            continue;
        }
        char digits[24];
        size_t d = 0;
        unsigned long v = nums[num++];
        do {
            digits[d++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (d)
            line[len++] = digits[--d];
    }
    ssize_t w = write(2, line, len);
    (void)w;
}

/* 1 when this allocation is to fail. */
static int should_fail(void)
{
    if (!atomic_load_explicit(&armed, memory_order_relaxed))
        return 0;
    atomic_fetch_add(&total_calls, 1);
    unsigned long i = atomic_fetch_add(&window_calls, 1) + 1;
    if (i <= cfg_after || (i - cfg_after - 1) % cfg_every != 0)
        return 0;
    unsigned long f = atomic_fetch_add(&window_failed, 1);
    if (cfg_count && f >= cfg_count) {
        atomic_fetch_sub(&window_failed, 1);
        return 0;
    }
    atomic_fetch_add(&total_failed, 1);
    if (cfg_count && f + 1 == cfg_count) {
        atomic_store(&armed, 0);
        report("limit");
    }
    return 1;
}

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    /* realloc(p, 0) frees: failing it would leak nothing but is not an
     * allocation either. */
    if (n == 0 && p)
        return __real_realloc(p, n);
    return should_fail() ? NULL : __real_realloc(p, n);
}

static void *hook_malloc(void *ctx, size_t n)
{
    (void)ctx;
    return __wrap_malloc(n);
}

static void *hook_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    return __wrap_realloc(p, n);
}

static void hook_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void on_usr2(int sig)
{
    (void)sig;
    if (atomic_load(&armed)) {
        atomic_store(&armed, 0);
        report("disarmed");
    } else {
        atomic_store(&window_calls, 0);
        atomic_store(&window_failed, 0);
        atomic_store(&armed, 1);
        report("armed");
    }
}

/* An abort (a failed assertion, or a library that gives up on a failed
 * allocation) prints where it happened, so that a test log shows it. */
static void on_abrt(int sig)
{
    void *frames[64];
    int n = backtrace(frames, 64);
    static const char head[] = "fault_alloc: abort; backtrace:\n";
    ssize_t w = write(2, head, sizeof(head) - 1);
    (void)w;
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static unsigned long field(const char *spec, const char *name, unsigned long dflt)
{
    size_t l = strlen(name);
    for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, name, l) == 0 && p[l] == '=')
            return strtoul(p + l + 1, NULL, 10);
    }
    return dflt;
}

__attribute__((constructor)) static void fault_alloc_init(void)
{
    static const kvidx_allocator_t lib_hook = {hook_malloc, hook_realloc, hook_free, NULL};
    cJSON_Hooks json_hooks = {__wrap_malloc, free};
    const char *spec = getenv("KVIDX_FAULT_ALLOC");

    uv_replace_allocator(__wrap_malloc, __wrap_realloc, __wrap_calloc, free);
    cJSON_InitHooks(&json_hooks);
    kvidx_set_allocator(&lib_hook);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr2;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    void *frame;
    (void)backtrace(&frame, 1); /* loads the unwinder now, not in the handler */
    sa.sa_handler = on_abrt;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGABRT, &sa, NULL);

    if (!spec)
        return;
    cfg_after = field(spec, "after", 0);
    cfg_every = field(spec, "every", 1);
    if (cfg_every == 0)
        cfg_every = 1;
    cfg_count = field(spec, "count", 0);
    atomic_store(&armed, field(spec, "armed", 1) != 0);
}
