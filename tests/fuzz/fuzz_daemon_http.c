/*
 * Arbitrary bytes through the socketless connection: llhttp parsing, the
 * limits, routing (the daemon's real route tables) and serialization. The
 * first byte picks how the rest is split into feeds, so incremental parsing
 * (pauses, resumes, pipelining) is exercised as well as whole buffers.
 * Small limits make the 413/414/431 paths reachable, and a bound on all
 * bodies below max_body_bytes the 503 one; the bodies' count must be back
 * at zero once the connection is freed. The data subsystems
 * are created fresh for every input so that no state carries over.
 */
#include "util/context.h"
#include "util/config.h"
#include "net/conn.h"
#include "util/metrics.h"
#include "app.h"

#include <uv.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static struct app app;
static uv_loop_t loop;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!app.metrics) {
        config_defaults(&app.cfg);
        app.cfg.max_body_bytes = 4096;
        app.cfg.max_total_body_bytes = 3072;
        app.cfg.max_header_bytes = 1024;
        app.cfg.max_uri_bytes = 256;
        app.metrics = metrics_new();
        app.ready = 1;
        uv_loop_init(&loop);
        app.loop = &loop;
    }
    if (size == 0)
        return 0;
    if (subsystems_init(&app) != 0)
        return 0;
    size_t step = (size_t)(data[0] % 17) + 1;
    int eof = data[0] & 0x80;
    data++;
    size--;
    struct conn_budget budget = {0};
    struct conn *c = conn_new_test_shared(&app, &budget);
    if (!c) {
        subsystems_stop(&app);
        uv_run(&loop, UV_RUN_NOWAIT);
        subsystems_free(&app);
        return 0;
    }
    if (step == 17) {
        conn_feed(c, (const char *)data, size);
    } else {
        for (size_t i = 0; i < size; i += step)
            if (conn_feed(c, (const char *)data + i, size - i < step ? size - i : step))
                break;
    }
    if (eof)
        conn_feed_eof(c);
    else if (!conn_test_closed(c))
        conn_test_fire_timer(c);
    /* Every answer starts with a status line. */
    struct buf *o = conn_test_output(c);
    if (o->len && memcmp(o->data, "HTTP/1.1 ", 9) != 0)
        __builtin_trap();
    conn_free_test(c);
    if (budget.body_bytes != 0)
        __builtin_trap();
    subsystems_stop(&app);
    uv_run(&loop, UV_RUN_NOWAIT); /* runs the close callbacks */
    subsystems_free(&app);
    return 0;
}
