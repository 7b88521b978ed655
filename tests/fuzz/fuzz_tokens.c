/*
 * libFuzzer target for the tokens file parser (lib/tokens.c). The input is
 * the file's text. A refusal names a line of the file and a reason; an
 * accepted file is checked against a reading of its own: every line that
 * is not blank or a comment is one token, found again by kvidx_tokens_find
 * with that line's number and role, handed out by kvidx_tokens_at in file
 * order, and each salt's quota is the smallest quota_bytes of its tokens.
 * Any disagreement aborts.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static int blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    kvidx_tokens_t *t;
    unsigned err_line;
    const char *why;
    unsigned lines = 0;
    for (size_t i = 0; i < size; i++)
        lines += text[i] == '\n';
    lines += size > 0 && text[size - 1] != '\n';
    int rc = kvidx_tokens_parse(text, size, &t, &err_line, &why);
    if (rc != 0) {
        check(rc == KVIDX_EINVAL || rc == KVIDX_ENOMEM);
        check(t == NULL && why != NULL);
        check(rc != KVIDX_EINVAL || (err_line >= 1 && err_line <= lines));
        return 0;
    }
    size_t n = 0;
    unsigned lineno = 0;
    const char *p = text, *end = text + size;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *le = eol ? eol : end;
        lineno++;
        const char *s = p;
        while (s < le && blank(*s))
            s++;
        if (s < le && *s != '#') {
            const char *w = s;
            while (s < le && !blank(*s))
                s++;
            kvidx_principal_t pr, at;
            check(kvidx_tokens_find(t, w, (size_t)(s - w), &pr) == 0);
            check(pr.id == lineno);
            while (s < le && blank(*s))
                s++;
            const char *r = s;
            while (s < le && !blank(*s))
                s++;
            size_t rn = (size_t)(s - r);
            kvidx_role_t want = rn == 4 && !memcmp(r, "read", 4)    ? KVIDX_ROLE_READ
                                : rn == 5 && !memcmp(r, "write", 5) ? KVIDX_ROLE_WRITE
                                : rn == 5 && !memcmp(r, "admin", 5) ? KVIDX_ROLE_ADMIN
                                                                    : KVIDX_ROLE_NONE;
            check(pr.role == want);
            check(kvidx_tokens_at(t, n, &at) == 0 && at.id == lineno && at.role == pr.role);
            check(!pr.salt_bound || pr.salt_len == strlen(pr.salt));
            check(!pr.quota_bytes || pr.salt_bound);
            check(kvidx_principal_sees_salt(&pr, pr.salt, pr.salt_len));
            n++;
        }
        p = eol ? eol + 1 : end;
    }
    check(kvidx_tokens_count(t) == n);
    kvidx_principal_t x;
    check(kvidx_tokens_at(t, n, &x) == KVIDX_ENOTFOUND);
    /* Each salt's quota: the smallest one of the tokens bound to it. */
    for (size_t i = 0; i < n && n <= 64; i++) {
        kvidx_principal_t a, b;
        check(kvidx_tokens_at(t, i, &a) == 0);
        if (!a.salt_bound)
            continue;
        uint64_t want = 0;
        for (size_t j = 0; j < n; j++) {
            check(kvidx_tokens_at(t, j, &b) == 0);
            if (b.salt_bound && b.salt_len == a.salt_len &&
                memcmp(b.salt, a.salt, a.salt_len) == 0 && b.quota_bytes &&
                (!want || b.quota_bytes < want))
                want = b.quota_bytes;
        }
        check(kvidx_tokens_salt_quota(t, a.salt, a.salt_len) == want);
    }
    kvidx_tokens_free(t);
    return 0;
}
