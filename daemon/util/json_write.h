/*
 * A growable byte buffer and a small streaming JSON writer on top of it.
 *
 * Large answers (a 5000-entry key page, a 262144-key lookup) are written with
 * jw_* straight into the response buffer: no intermediate tree, escaping done
 * here once. cJSON stays for parsing and for nothing hot.
 *
 * Errors are sticky: after an allocation failure b->failed is set, further
 * appends are ignored, and the caller checks it once at the end.
 */
#ifndef KVIDXD_BUF_H
#define KVIDXD_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

struct buf {
    char *data; /* malloc'd; always NUL-terminated when len > 0 or cap > 0 */
    size_t len;
    size_t cap;
    int failed; /* an allocation failed; contents are incomplete */
};

void buf_init(struct buf *b);
void buf_free(struct buf *b);
void buf_reset(struct buf *b);                /* len = 0, keeps the memory */
int buf_reserve(struct buf *b, size_t extra); /* 0 or KVIDX_ENOMEM */
/* Gives back the memory past the bytes held when it is more than
 * max_slack bytes: cap becomes len + 1. Contents are kept; if the smaller
 * allocation fails the buffer stays as it was. A failed or empty buffer is
 * left alone. */
void buf_shrink(struct buf *b, size_t max_slack);
void buf_append(struct buf *b, const void *p, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_putc(struct buf *b, char c);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(struct buf *b, const char *fmt, va_list ap);
void buf_put_u64(struct buf *b, uint64_t v);
void buf_put_i64(struct buf *b, int64_t v);
/* Writers into memory the caller reserved: v in decimal (at most 20
 * bytes), the 2n lowercase hex digits of bytes[0..n). Both return the end
 * of what they wrote. */
char *jw_u64_at(char *p, uint64_t v);
char *jw_hex_at(char *p, const uint8_t *bytes, size_t n);

/* JSON writer. It tracks whether a comma is needed, up to JW_MAX_DEPTH. */
#define JW_MAX_DEPTH 32
struct jw {
    struct buf *b;
    int depth;
    unsigned char need_comma[JW_MAX_DEPTH + 1];
    unsigned char after_key;
};

void jw_init(struct jw *w, struct buf *b);
void jw_obj_begin(struct jw *w);
void jw_obj_end(struct jw *w);
void jw_arr_begin(struct jw *w);
void jw_arr_end(struct jw *w);
void jw_key(struct jw *w, const char *key); /* key is a trusted ASCII literal */
/* A JSON string of n bytes, escaped (", \, control characters as \u00XX,
 * invalid UTF-8 bytes as \ufffd so the output is always valid JSON). */
void jw_strn(struct jw *w, const char *s, size_t n);
void jw_str(struct jw *w, const char *s);
void jw_u64(struct jw *w, uint64_t v);
void jw_i64(struct jw *w, int64_t v);
void jw_bool(struct jw *w, int v);
void jw_null(struct jw *w);
void jw_raw(struct jw *w, const char *json, size_t n); /* an already-encoded value */
/* An array of every i < n (n < 2^32) with flags[i] & bit, in order: the
 * index lists of lookup and prefetch answers, written in one pass. */
void jw_indices(struct jw *w, const uint8_t *flags, size_t n, uint8_t bit);
/* An array of n numbers. */
void jw_u32s(struct jw *w, const uint32_t *v, size_t n);

#endif
