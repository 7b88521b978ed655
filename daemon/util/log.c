/*
 * Logging to stderr, one line per message, in one of two formats:
 *
 *     2026-11-30T01:02:03.456Z info listening on 127.0.0.1:8077
 *     {"ts":"2026-11-30T01:02:03.456Z","level":"info","msg":"listening on 127.0.0.1:8077"}
 *
 * Invariants: a message is always exactly one line (text format escapes
 * control characters, json goes through the jw escaper, so a message that
 * carries client bytes cannot forge a second line); each line is handed to
 * the kernel in a single write() so lines from threads do not interleave.
 * The level and format are process-wide and set by log_setup() from the
 * loop thread (at start and on SIGHUP).
 */
#include "util/log.h"

#include "util/json_write.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum log_level cur_level = LOG_INFO;
static enum log_format cur_format = LOG_TEXT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void log_setup(enum log_level level, enum log_format format)
{
    cur_level = level;
    cur_format = format;
}

int log_enabled(enum log_level level)
{
    return level <= cur_level;
}

/* RFC 3339 UTC with milliseconds. */
static void timestamp(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));
}

/* Text lines keep printable bytes (UTF-8 included) and escape the rest. */
static void put_text(struct buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') {
            buf_append(b, "\\n", 2);
        } else if (c == '\r') {
            buf_append(b, "\\r", 2);
        } else if (c == '\t') {
            buf_append(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            buf_append(b, e, 4);
        } else {
            buf_putc(b, (char)c);
        }
    }
}

static void write_all(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to report it */
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Out of memory: the message still goes out, formatted on the stack and
 * cut at 400 bytes, with control bytes (and, for JSON, quotes and
 * backslashes) shown as '?', so the reason a daemon stops is never lost. */
static void write_fallback(const char *ts, int level, const char *fmt, va_list ap)
{
    char m[400], out[600];
    vsnprintf(m, sizeof(m), fmt, ap);
    for (char *c = m; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f ||
            (cur_format == LOG_JSON && (*c == '"' || *c == '\\')))
            *c = '?';
    int n;
    if (cur_format == LOG_JSON)
        n = snprintf(out, sizeof(out), "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"}\n", ts,
                     level_names[level], m);
    else
        n = snprintf(out, sizeof(out), "%s %s %s (out of memory)\n", ts, level_names[level], m);
    if (n > 0)
        write_all(out, (size_t)n < sizeof(out) ? (size_t)n : sizeof(out) - 1);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if (!log_enabled(level))
        return;
    if ((unsigned)level > LOG_DEBUG)
        level = LOG_ERROR;
    char ts[96]; /* room for any int year, to keep -Wformat-truncation quiet */
    timestamp(ts, sizeof(ts));

    struct buf msg, line;
    buf_init(&msg);
    buf_init(&line);
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    const char *m = msg.data ? msg.data : "";

    if (cur_format == LOG_JSON) {
        struct jw w;
        jw_init(&w, &line);
        jw_obj_begin(&w);
        jw_key(&w, "ts");
        jw_str(&w, ts);
        jw_key(&w, "level");
        jw_str(&w, level_names[level]);
        jw_key(&w, "msg");
        jw_strn(&w, m, msg.len);
        jw_obj_end(&w);
    } else {
        buf_puts(&line, ts);
        buf_putc(&line, ' ');
        buf_puts(&line, level_names[level]);
        buf_putc(&line, ' ');
        put_text(&line, m, msg.len);
    }
    buf_putc(&line, '\n');
    if (line.failed || msg.failed)
        write_fallback(ts, level, fmt, again);
    else
        write_all(line.data, line.len);
    va_end(again);
    buf_free(&msg);
    buf_free(&line);
}
